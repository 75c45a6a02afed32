"""The engine interface, declared once (`rag_demo.serving.interface`): RagEngine implements it with
the same parameters and defaults; the background engine and the engine process forward exactly it,
and a misspelt keyword is refused in the caller's process before any thread or pipe sees it."""

from __future__ import annotations

import inspect
import os

import pytest

from rag_demo.engine import RagEngine
from rag_demo.errors import InputError
from rag_demo.serving.background import BackgroundEngine
from rag_demo.serving.interface import ENGINE_CALLS, ENGINE_FIELDS, TRAINING_CALLS, Engine, Trainer, call_signature, check_call
from rag_demo.serving.process import EngineProcess
from tests import process_engines


def test_the_declaration_lists_what_the_page_and_cli_call():
    assert set(ENGINE_FIELDS) == {"kb_names", "default_kb", "lexical_weight", "retrievers"}
    assert set(ENGINE_CALLS) == {"ask", "score", "compare_retrievers", "index_reports", "build_kb",
                                 "example_questions", "memory_logit", "release_kb"}
    assert set(TRAINING_CALLS) == {"train_kbs", "train_begin", "train_advance", "train_end", "train_stop", "train_ask",
                                   "train_score"}


@pytest.mark.parametrize("asking, engine_call", [("train_ask", "ask"), ("train_score", "score")])
def test_asking_with_a_trained_encoder_takes_the_engine_calls_options_after_the_session(asking, engine_call):
    """What the Ask and Score tabs give `ask` and `score` they can give the trained encoder's calls too."""
    declared = list(call_signature(asking).parameters.values())
    engine = list(call_signature(engine_call).parameters.values())
    assert [p.name for p in declared[:2]] == ["self", "session"]
    assert [(p.name, p.kind, p.default) for p in declared[2:]] == [(p.name, p.kind, p.default) for p in engine[1:]]


@pytest.mark.parametrize("name", TRAINING_CALLS)
def test_the_training_runs_take_each_declared_parameter_with_the_same_default(name):
    from rag_demo.serving.retriever_training import TrainingRuns

    declared = call_signature(name).parameters
    implemented = inspect.signature(getattr(TrainingRuns, name)).parameters
    assert [(p.name, p.kind, p.default) for p in implemented.values()] == [(p.name, p.kind, p.default) for p in declared.values()]


@pytest.mark.parametrize("name", ENGINE_CALLS)
def test_rag_engine_takes_each_declared_parameter_with_the_same_default(name):
    declared = call_signature(name).parameters
    implemented = inspect.signature(getattr(RagEngine, name)).parameters
    for parameter in declared.values():
        assert parameter.name in implemented, f"RagEngine.{name} lacks {parameter.name}"
        mine = implemented[parameter.name]
        assert (mine.kind, mine.default) == (parameter.kind, parameter.default), f"RagEngine.{name}({parameter.name})"
    extra = [p for p in implemented.values() if p.name not in declared]
    assert all(p.default is not inspect.Parameter.empty for p in extra), f"RagEngine.{name} requires more than declared"


@pytest.mark.parametrize("name", ENGINE_FIELDS)
def test_rag_engine_offers_each_declared_field(name):
    assert isinstance(getattr(RagEngine, name), property)


@pytest.mark.parametrize("forwarder", [BackgroundEngine, EngineProcess])
def test_the_forwarders_offer_the_declared_calls_with_the_declared_signatures(forwarder):
    for name in ENGINE_CALLS + TRAINING_CALLS:
        assert inspect.signature(getattr(forwarder, name)) == call_signature(name)
        assert getattr(forwarder, name).__doc__ == getattr(Engine if name in ENGINE_CALLS else Trainer, name).__doc__
    for name in ENGINE_FIELDS:
        assert isinstance(getattr(forwarder, name), property)


def test_a_call_is_checked_against_the_declaration():
    check_call("ask", ("who wrote hamlet?",), {"k": 3, "variants": "both", "memory": False})
    check_call("build_kb", ("mine", []), {})
    with pytest.raises(InputError, match=r"engine.ask\(\) got an unexpected keyword argument 'kk'; it takes question, kb, k"):
        check_call("ask", ("who?",), {"kk": 3})
    with pytest.raises(InputError, match=r"engine.score\(\) missing a required argument: 'answer'"):
        check_call("score", ("who?",), {})
    with pytest.raises(InputError, match="the engine has no call 'retrieve'"):
        check_call("retrieve", ("who?",), {})


def test_a_background_engine_refuses_a_misspelt_keyword_before_the_engine_sees_it():
    seen = []

    class Recording(process_engines.FakeEngine):
        def ask(self, question, **options):
            seen.append(options)
            return super().ask(question, **options)

    engine = BackgroundEngine(lambda progress: Recording()).start()
    assert engine.wait(10)
    assert engine.ask("who?", k=3).k == 3
    with pytest.raises(InputError, match="unexpected keyword argument 'num_beam'"):
        engine.ask("who?", num_beam=2)
    assert seen == [{"k": 3}]


def test_the_engine_process_refuses_a_misspelt_keyword_in_the_callers_process():
    """Checked before the pipe: a process never started refuses it the same way, and a live one is
    never sent the call (its answer would otherwise be the child's pickled TypeError)."""
    unstarted = EngineProcess(process_engines.fake_engine)
    with pytest.raises(InputError, match="unexpected keyword argument 'kk'"):
        unstarted.ask("who?", kk=3)
    live = EngineProcess(process_engines.fake_engine).start()
    try:
        assert live.wait(60)
        sent = []
        original = live._connection.send
        live._connection.send = lambda message: (sent.append(message), original(message))[1]
        with pytest.raises(InputError, match="unexpected keyword argument 'memmory'"):
            live.ask("who?", memmory=True)
        assert sent == []
        answer = live.ask("who?", memory=True)
        assert answer.memory is True and answer.pid != os.getpid() and len(sent) == 1
    finally:
        live.stop()

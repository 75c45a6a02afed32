"""The engine in a child process (`rag_demo.serving.process`): calls, progress, errors, a dying
child, and the page's answers through it equal to those of the same engine in this process."""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time

import pytest

from rag_demo.serving.interface import BuildStatus, EngineNotReady
from rag_demo.serving.process import EngineProcess, engine_process_wanted
from rag_demo.errors import InputError, RagDemoError
from tests import process_engines


def _started(factory) -> EngineProcess:
    engine = EngineProcess(factory).start()
    deadline = time.monotonic() + 60
    while not (engine.ready or engine.failed):
        assert time.monotonic() < deadline, "the engine's process did not start"
        time.sleep(0.02)
    return engine


@pytest.fixture(scope="module")
def fake():
    engine = _started(process_engines.fake_engine)
    yield engine
    engine.stop()


def test_reads_and_calls_cross_the_pipe(fake):
    assert fake.ready and fake.complete and not fake.failed and fake.engines_served == 1
    assert (fake.kb_names, fake.default_kb, fake.retrievers, fake.lexical_weight) == (("left", "right"), "left", ("dense", "bm25"), 0.0)
    answer = fake.ask("who?", kb="right", k=3)
    assert (answer.question, answer.kb, answer.k) == ("who?", "right", 3)
    assert answer.pid == fake.pid != os.getpid()
    assert fake.example_questions("right", 2) == ["right question 0", "right question 1"]
    status = fake.status()
    assert status["ready"] and status["complete"] and status["status"] == "ready" == fake.status_text()
    assert fake.wait(1) is True


def test_the_memory_switch_and_its_logit_cross_the_pipe(fake):
    assert [fake.ask("who?", memory=m).memory for m in (True, False, None)] == [True, False, None]
    assert fake.ask("who?").memory is None  # not given: the engine's default
    assert (fake.memory_logit(), fake.memory_logit("dense"), fake.memory_logit("bm25")) == (1.5, 1.5, None)


def test_progress_is_reported_in_the_callers_thread(fake):
    seen = []
    fake.ask("who?", progress=lambda stage, done, total: seen.append((stage, done, total, threading.get_ident())))
    assert seen == [("reading", i, 3, threading.get_ident()) for i in (1, 2, 3)]


def test_a_visitors_own_kb_crosses_whole(fake):
    kb = fake.build_kb("mine", ["a passage", "another"])
    assert kb == {"name": "mine", "passages": ["a passage", "another"]}
    assert fake.ask("who?", kb=kb).kb == "own:mine"
    fake.release_kb(kb)  # the fake has no release_kb; the background engine skips it


def test_errors_are_raised_in_the_caller(fake):
    with pytest.raises(InputError, match="type a question first"):
        fake.ask("")
    with pytest.raises(RagDemoError, match="TwoArgumentError: kaboom: it broke"):  # does not pickle: described
        fake.ask("unpicklable error")
    with pytest.raises(RagDemoError, match="could not be sent|PicklingError|AttributeError"):
        fake.build_kb("unpicklable", [])
    with pytest.raises(RagDemoError, match="no method"):
        fake._call("__reduce__", (), {})
    assert fake.ask("still fine?").question == "still fine?"


def test_status_reads_never_wait_for_the_child(fake):
    """The page polls the status often: it reads the child's last push, so a child that cannot run
    (here stopped; in a start, busy importing) neither delays the reads nor is interrupted by them."""
    import signal

    os.kill(fake.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        for _ in range(100):
            assert fake.ready and fake.complete and fake.kb_names == ("left", "right") and fake.status_text() == "ready"
        assert time.monotonic() - started < 1.0
    finally:
        os.kill(fake.pid, signal.SIGCONT)
    assert fake.ask("awake?").question == "awake?"


def test_calls_run_side_by_side(fake):
    order = []
    slow = threading.Thread(target=lambda: order.append(fake.ask("slow").question))
    slow.start()
    time.sleep(0.1)
    order.append(fake.ask("quick").question)
    slow.join(10)
    assert order == ["quick", "slow"]


def test_stages_swap_in_and_answers_say_which_parts_gave_them():
    engine = _started(functools.partial(process_engines.staged_fake_engines, hold_s=1.0))
    try:
        first = engine.ask("who?")
        if not engine.complete:  # the first stage still serves
            assert first.engine == "first" and "the second part is building" in first.notices[-1]
            assert "Answering now with the first part" in engine.status_text()
        assert engine.wait(10)
        second = engine.ask("who?")
        assert second.engine == "second" and second.notices == () and engine.engines_served == 2
    finally:
        engine.stop()


def test_a_failed_build_says_why():
    engine = _started(process_engines.failing_factory)
    try:
        assert engine.failed and not engine.ready
        assert "could not start: the cache folder is not writable" in engine.status_text()
        with pytest.raises(EngineNotReady, match="not writable"):
            engine.ask("who?")
    finally:
        engine.stop()


def test_a_child_that_dies_fails_every_call_clearly():
    engine = _started(process_engines.fake_engine)
    pushed = engine.status()  # the child's BackgroundEngine.status(), as pushed
    with pytest.raises(EngineNotReady, match=r"exited \(code 3\).*restart the app"):
        engine.ask("die")
    assert not engine.ready and engine.failed and not engine.complete
    with pytest.raises(EngineNotReady, match="exited"):
        engine.ask("who?")
    assert "exited (code 3)" in engine.status()["error"] == engine.status_text()
    assert pushed["ready"] and set(engine.status()) == set(pushed) == {f.name for f in dataclasses.fields(BuildStatus)}


def test_engine_process_can_be_turned_off():
    assert engine_process_wanted({}) and engine_process_wanted({"RAG_DEMO_ENGINE_PROCESS": "1"})
    assert not any(engine_process_wanted({"RAG_DEMO_ENGINE_PROCESS": v}) for v in ("0", "false", "No", " off "))


def _untimed(value):
    """A JSON answer without its timings, which differ from run to run."""
    if isinstance(value, dict):
        return {key: _untimed(item) for key, item in value.items() if not key.startswith("timings")}
    if isinstance(value, list):
        return [_untimed(item) for item in value]
    return value


def test_the_pages_answers_through_the_process_equal_those_in_this_one(tmp_path, ui_engine):
    """The same tiny engine (fixed seeds), built in a child and here: the page's JSON answers match."""
    from rag_demo.ui.actions import DemoActions

    engine = _started(functools.partial(process_engines.tiny_rag_engine, folder=str(tmp_path)))
    try:
        here, there = DemoActions(ui_engine), DemoActions(engine)
        question = "who wrote a farewell to arms"
        for kb in ("nq-wiki", "nq-counterfactual"):
            theirs, ours = (_untimed(side.ask_json(question, "both", 3, "flat", kb, "", False)) for side in (there, here))
            assert theirs == ours and ours["passages"] and ours["variants"]["token"]["answer"] is not None
        assert _untimed(there.compare_json(question, "nq-wiki", 3)) == _untimed(here.compare_json(question, "nq-wiki", 3))
        assert there.examples("nq-wiki") == here.examples("nq-wiki")
    finally:
        engine.stop()


def test_memory_through_the_process_equals_memory_in_this_one(tmp_path, ui_engine):
    """A child engine with a memory logit: the switch reaches it from the page's API, and its answers with
    memory on, off and by default equal those of the same engine here."""
    from rag_demo.ui.actions import DemoActions
    from tests.ui_engine import with_memory

    theta = ui_engine.retrieve("who wrote a farewell to arms", k=3).passages[0].logit
    engine = _started(functools.partial(process_engines.tiny_rag_engine, folder=str(tmp_path), memory_logit=theta))
    try:
        here, there = DemoActions(with_memory(ui_engine, theta)), DemoActions(engine)
        assert engine.memory_logit() == theta and "θ" in there.memory_options()["info"]
        for memory in (True, False, None):
            theirs, ours = (_untimed(side.ask_json("who wrote a farewell to arms", "both", 3, "flat", "nq-wiki", "", False,
                                                   memory)) for side in (there, here))
            assert theirs == ours and (ours["memory_prob"] is None) == (memory is False)
            scored = [_untimed(side.score_json("who wrote a farewell to arms", "Hemingway", "nq-wiki", 3, "flat", "both",
                                               "", memory)) for side in (there, here)]
            assert scored[0] == scored[1]
    finally:
        engine.stop()


def test_the_page_serves_through_the_process(tmp_path, ui_engine):
    """The page built on an `EngineProcess`: API answers as the same engine gives them here, and a
    visitor's own knowledge base, embedded in the child, crosses back and is asked there."""
    import json

    from gradio_client import Client

    from rag_demo.ui import build_demo, launch_options
    from rag_demo.ui.actions import DemoActions
    from tests.ui_engine import KB_NAMES, QUESTIONS

    engine = _started(functools.partial(process_engines.tiny_rag_engine, folder=str(tmp_path / "models")))
    demo = build_demo(engine)
    try:
        _, url, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True,
                                ssr_mode=False, **launch_options())
        client = Client(url, verbose=False)
        assert client.predict(api_name="/status_json")["complete"]
        theirs = client.predict(QUESTIONS[0], "both", 3, "flat", KB_NAMES[1], "", False, api_name="/ask_json")
        ours = DemoActions(ui_engine).ask_json(QUESTIONS[0], "both", 3, "flat", KB_NAMES[1], "", False)
        assert _untimed(theirs) == _untimed(json.loads(json.dumps(ours)))
        status, answer, *_ = client.predict(QUESTIONS[0], "token", 3, "flat", KB_NAMES[0], 1, "thorough", api_name="/ask")
        assert status == "" and f"knowledge base <b>{KB_NAMES[0]}</b>" in answer
        notes = tmp_path / "notes.txt"
        notes.write_text("Zorblax is the capital of Plutonia, a city of glass domes.")
        from gradio_client import handle_file

        built = client.predict([handle_file(str(notes))], "Pasted", "Quixel invented the hover bicycle in 2091.",
                               api_name="/build_kb")
        assert "Indexed 2 passages" in built[0]
        status, answer, passages = client.predict("What is the capital of Plutonia?", api_name="/ask_mine")
        assert status == "" and "Zorblax" in passages and "RAG-Token" in answer
    finally:
        demo.close()
        engine.stop()


PAGE_WITHOUT_TORCH = r"""
import functools, json, sys
from pathlib import Path
from gradio_client import Client, handle_file
from app import create_demo
from rag_demo.ui import launch_options
from tests import process_engines

folder = Path(sys.argv[1])
demo = create_demo(functools.partial(process_engines.tiny_rag_engine, folder=str(folder / "models")), separate_process=True)
_, url, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True,
                        ssr_mode=False, **launch_options())
try:
    client = Client(url, verbose=False)
    while not client.predict(api_name="/status_json")["complete"]:
        pass
    question, kbs = "who wrote a farewell to arms", ("nq-wiki", "nq-counterfactual")
    answered = {
        "ask": client.predict(question, "both", 3, "flat", kbs[0], 1, "thorough", api_name="/ask")[1],
        "ask_json": json.dumps(client.predict(question, "both", 3, "flat", kbs[1], "", False, api_name="/ask_json")),
        "compare": str(client.predict(question, kbs[0], 3, api_name="/compare")),
        "swap": str(client.predict(question, kbs[0], kbs[1], "both", 3, api_name="/swap")),
        "score": str(client.predict(question, "Ernest Hemingway", kbs[0], 3, "flat", api_name="/score")),
        "index_reports": str(client.predict(kbs[0], api_name="/index_reports")),
    }
    notes = folder / "notes.txt"
    notes.write_text("Zorblax is the capital of Plutonia, a city of glass domes.")
    answered["build_kb"] = client.predict([handle_file(str(notes))], "", "", api_name="/build_kb")[0]
    answered["ask_mine"] = str(client.predict("What is the capital of Plutonia?", api_name="/ask_mine"))
finally:
    demo.close()
print(json.dumps({"torch": "torch" in sys.modules, "answered": answered}))
"""


def test_the_pages_process_never_imports_torch(tmp_path):
    """Answers cross from the engine's process as plain data: a fresh page process (`app.create_demo`)
    that answers every kind of request over the child has not imported torch (about 2 s and 300 MB it need not spend)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", PAGE_WITHOUT_TORCH, str(tmp_path)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    answered = report["answered"]
    assert "RAG-Token" in answered["ask"] and '"passages": [{' in answered["ask_json"]
    assert "Indexed 1 passage" in answered["build_kb"] and "Zorblax" in answered["ask_mine"]
    assert all(answered.values())
    assert report["torch"] is False

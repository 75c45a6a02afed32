"""The Train tab's events over the tiny engine (no browser): a run's updates, Stop, the line of visitors, the end
of a session, and escaping."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

import pytest

from rag_demo.serving.retriever_training import PageRunConfig, TrainingRuns
from rag_demo.ui.train import RunLine, TrainActions

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TRAIN = [("What is the capital of France?", ("Paris",)), ("Who wrote A Farewell to Arms?", ("Ernest Hemingway", "Hemingway")),
         ("How tall is the Eiffel Tower?", ("330 metres",)), ("Who created the Python programming language?",
                                                              ("Guido van Rossum",))]
HELD_OUT = [("Which <script>alert(1)</script> planet is the largest?", ("Jupiter",)),
            ("Who won the 2018 FIFA World Cup?", ("France",))]


@pytest.fixture()
def runs(ui_engine):
    config = PageRunConfig(steps=4, check_every=2, held_out_sample=2, top_k=3)
    return TrainingRuns(lambda: ui_engine, config=config, question_sets={"nq-wiki": (TRAIN, HELD_OUT)})


def _request(session: str):
    return SimpleNamespace(session_hash=session)


def _no_progress(*args, **kwargs):
    return None


def _statuses(updates) -> list[str]:
    return [u.status for u in updates if isinstance(u.status, str)]


def test_a_run_draws_its_loss_held_out_figures_and_one_questions_p_z_given_x(runs):
    actions = TrainActions(runs, steps_per_update=1)
    updates = list(actions.train("rag-token", 4, _request("a"), progress=_no_progress))
    statuses = _statuses(updates)
    assert "Reading" in statuses[0] and "Finished" in statuses[-1]
    last = updates[-1]
    assert len(last.loss.data[0].x) == 4  # a point per step
    assert list(last.held_out.data[0].x) == [0, 2, 4]  # measured at the start and every 2 steps
    bars = last.question.data
    assert [b.name for b in bars] == ["packaged encoder", "after step 4"]
    assert sum(bars[0].x) == pytest.approx(1.0) and sum(bars[1].x) == pytest.approx(1.0)
    assert "<script>" not in last.summary or "&lt;script&gt;" in last.summary
    assert "∂loss/∂logit" in last.summary  # the gradient in two lines, with this run's numbers
    assert runs.sessions() == ("a",)  # kept for the visitor until they leave
    assert updates[1].run == "a"  # the page's state names the session, and gradio's deleting it frees the run
    actions.end_session("a")
    assert runs.sessions() == ()


def test_the_followed_question_is_escaped(runs):
    view = runs.train_begin("a", objective="rag-sequence", questions=4)
    from rag_demo.ui.train import summary_html

    assert view.question.startswith("Which <script>") or view.question.startswith("Who won")
    shown = summary_html(view)
    assert "<script>" not in shown


def test_stop_ends_a_run_early(runs):
    actions = TrainActions(runs, steps_per_update=1)
    updates = []
    for update in actions.train("rag-token", 4, _request("a"), progress=_no_progress):
        updates.append(update)
        if len(updates) == 3:  # reading, step 0, step 1
            actions.stop(_request("a"))
    assert "Stopped at step" in _statuses(updates)[-1]
    assert runs.train_advance("a", steps=0).step < 4


def test_a_second_visitor_waits_in_line_and_then_trains(runs):
    line = RunLine()
    actions = TrainActions(runs, line=line, steps_per_update=4, wait_poll_s=0.0)
    line.join("first")  # a run in progress
    second = actions.train("gold-passage", 4, _request("second"), progress=_no_progress)
    waiting = next(second)
    assert "1 run is ahead of yours" in waiting.status
    line.leave("first")
    rest = list(second)
    assert "Finished" in _statuses(rest)[-1]
    assert "∂loss/∂logit" not in rest[-1].summary  # the gold-passage loss has no marginal to explain


def test_a_run_whose_tab_closed_gives_up_its_turn():
    line = RunLine(stale_after_s=0.0)
    line.join("gone")
    line.join("waiting")
    assert line.ahead("waiting") == 0


def test_bad_choices_are_messages(runs):
    actions = TrainActions(runs)
    updates = list(actions.train("rag-both", 4, _request("a"), progress=_no_progress))
    assert "unknown objective" in _statuses(updates)[-1]
    updates = list(actions.train("rag-token", 0, _request("a"), progress=_no_progress))
    assert "train on 1 to" in _statuses(updates)[-1]


def test_the_page_has_a_train_tab(ui_engine):
    from rag_demo.ui import build_demo

    demo = build_demo(ui_engine)
    ids = {getattr(block, "elem_id", None) for block in demo.blocks.values()}
    assert {"tab-train", "train-btn", "train-stop", "train-loss", "train-held-out", "train-question"} <= ids


def test_the_train_calls_cross_the_engines_process(tmp_path):
    """Through `EngineProcess` the page reaches the child's runs: what it offers, a run, an ask with its encoder,
    and a refusal as itself."""
    import functools

    from rag_demo.errors import InputError
    from rag_demo.serving.interface import NoTrainedEncoder
    from tests import process_engines
    from tests.test_engine_process import _started

    engine = _started(functools.partial(process_engines.tiny_rag_engine_with_training_questions, folder=str(tmp_path),
                                        pairs=(TRAIN, HELD_OUT)))
    try:
        assert engine.train_kbs() == ("nq-wiki",)  # nq-counterfactual has no question sets
        with pytest.raises(InputError, match="no training questions for the page"):
            engine.train_begin("a", objective="rag-token", questions=4, kb="nq-counterfactual")
        with pytest.raises(NoTrainedEncoder, match="train one on the Train tab"):
            engine.train_ask("a", "Who won the 2018 FIFA World Cup?")
        engine.train_begin("a", objective="rag-token", questions=4, kb="nq-wiki")
        assert engine.train_advance("a", steps=2).question_encoder == "trained on this page (RAG-Token, 2 steps)"
        trained = engine.train_ask("a", "Who won the 2018 FIFA World Cup?", kb="nq-wiki", k=3, retriever="dense")
        scored = engine.train_score("a", "Who won the 2018 FIFA World Cup?", "France", kb="nq-wiki", k=3, retriever="dense")
        default = engine.ask("Who won the 2018 FIFA World Cup?", kb="nq-wiki", k=3, retriever="dense")
        assert trained.question_encoder == scored.question_encoder == "trained on this page (RAG-Token, 2 steps)"
        assert default.question_encoder == "tiny-dpr"
        engine.train_end("a")
        with pytest.raises(NoTrainedEncoder):
            engine.train_ask("a", "Who won the 2018 FIFA World Cup?")
    finally:
        engine.stop()


def test_doctests():
    import doctest

    import rag_demo.training.end_to_end
    import rag_demo.ui.train

    for module in (rag_demo.ui.train, rag_demo.training.end_to_end):
        assert doctest.testmod(module).failed == 0


def test_a_run_widens_its_candidates_and_says_it_is_reading(ui_engine, monkeypatch, tmp_path):
    """At step 2 the candidates are widened with what the encoder then ranks first (here, as if it had moved far:
    the base's last two passages), reading at most `widen_max_reads` of them, and the progress says so."""
    from rag_demo.training.end_to_end import EndToEndTrainer

    monkeypatch.setenv("RAG_DEMO_CACHE", str(tmp_path))  # no reads from other tests: these passages are unread
    moved = tuple(range(len(ui_engine.resolve_kb("nq-wiki"))))[::-1]
    monkeypatch.setattr(EndToEndTrainer, "top_rows", lambda self, depth: [moved[:depth]] * len(self.examples))
    config = PageRunConfig(steps=4, check_every=2, held_out_sample=2, top_k=3, candidates=2, widen_every=2, widen_max_reads=3)
    runs = TrainingRuns(lambda: ui_engine, config=config, question_sets={"nq-wiki": (TRAIN, HELD_OUT)})
    heard = []
    runs.train_begin("a", objective="rag-token", questions=4)
    view = runs.train_advance("a", steps=4, progress=lambda stage, done, total: heard.append((stage, done, total)))
    assert view.finished and np.isfinite(view.losses).all()
    assert heard and {stage for stage, _, _ in heard} == {"reading 3 new passages the trained encoder ranks in its top 2 "
                                                         "(once; cached)"}
    assert heard[-1][1] == heard[-1][2]


def test_reading_ahead_leaves_the_default_run_nothing_to_read(ui_engine, monkeypatch, tmp_path):
    """A first start reads the default run's questions ahead; a run of that size then reads nothing itself."""
    from rag_demo.serving.retriever_training import reading_cache_path
    from rag_demo.training.end_to_end import ReadingCache

    monkeypatch.setenv("RAG_DEMO_CACHE", str(tmp_path))
    config = PageRunConfig(steps=2, check_every=2, held_out_sample=2, top_k=3, default_questions=3)
    runs = TrainingRuns(lambda: ui_engine, config=config, question_sets={"nq-wiki": (TRAIN, HELD_OUT)})
    assert runs.read_ahead() > 0
    assert runs.read_ahead() == 0  # cached
    cache_file = reading_cache_path(ui_engine, ui_engine.resolve_kb("nq-wiki"))
    held = len(ReadingCache.open(cache_file).reads)
    runs.train_begin("a", objective="rag-token", questions=3)
    assert len(ReadingCache.open(cache_file).reads) == held
    runs.train_begin("b", objective="rag-token", questions=4)  # one question more than was read ahead
    assert len(ReadingCache.open(cache_file).reads) > held


def test_a_failed_read_ahead_leaves_the_start_serving(caplog):
    from rag_demo.serving.background import _read_ahead_for_training

    _read_ahead_for_training(SimpleNamespace(), _no_progress)  # an engine without knowledge bases
    assert "reading the Train tab's questions ahead failed" in caplog.text

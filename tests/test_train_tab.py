"""The Train tab's events over the tiny engine (no browser): a run's updates, Stop, the line of visitors, the end
of a session, and escaping."""

from __future__ import annotations

import html
from types import SimpleNamespace

import numpy as np

import pytest

from rag_demo.errors import RunStopped
from rag_demo.serving.retriever_training import PageRunConfig, TrainingRuns
from rag_demo.ui.html import format_status
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
    updates = list(actions.train("rag-token", 4, _request("a")))
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
    # the page's state names the session, and gradio's deleting it frees the run (status-only updates come before it
    # on a busy machine: the reading reports its progress while it lasts)
    assert next(u.run for u in updates if isinstance(u.run, str)) == "a"
    actions.end_session("a")
    assert runs.sessions() == ()


def test_the_followed_question_is_escaped(runs):
    view = runs.train_begin("a", objective="rag-sequence", questions=4)
    from rag_demo.ui.train import summary_html

    assert view.question.startswith("Which <script>") or view.question.startswith("Who won")
    shown = summary_html(view)
    assert "<script>" not in shown


def test_stop_ends_a_run_early_and_every_line_says_it_stopped(runs):
    actions = TrainActions(runs, steps_per_update=1, progress_poll_s=60.0)  # no reading counts between the updates
    updates = []
    for update in actions.train("rag-token", 4, _request("a")):
        updates.append(update)
        if len(updates) == 3:  # reading, step 0, step 1
            actions.stop(_request("a"))
    step = runs.train_advance("a", steps=0).step
    assert step < 4
    assert f"Stopped at step {step} of 4." in _statuses(updates)[-1]
    assert f"<b>stopped</b>: step {step} of 4 " in updates[-1].summary
    assert "<b>training</b>" not in updates[-1].summary


def test_the_tabs_status_counts_the_engines_reading(runs):
    """The engine's reading (here one report, then a wait) reaches the tab's status while the call still runs:
    the tab's status is the run's only progress display."""
    import threading

    shown = threading.Event()

    class SlowReading:
        def __init__(self, runs):
            self.runs = runs

        def train_begin(self, session, *, progress, **kwargs):
            progress("reading 4 questions' top 10 passages (once; cached)", 1, 4)
            shown.wait(10)  # the reading goes on until the tab has shown it (or 10 s, should it never)
            return self.runs.train_begin(session, progress=progress, **kwargs)

        def __getattr__(self, name):
            return getattr(self.runs, name)

    actions = TrainActions(SlowReading(runs), steps_per_update=4, progress_poll_s=0.02)
    statuses = []
    for update in actions.train("rag-token", 4, _request("a")):
        statuses += [html.unescape(s) for s in _statuses([update])]
        if statuses and "1 of 4" in statuses[-1]:
            shown.set()
    assert "Reading 4 questions' top 10 passages (once; cached): 1 of 4" in statuses[1]
    assert "then the packaged encoder is measured" in statuses[1]
    assert "Finished" in statuses[-1]


def test_train_shows_no_progress_of_gradios_own(ui_engine):
    from rag_demo.ui import build_demo

    demo = build_demo(ui_engine)
    train = [fn for fn in demo.fns.values() if getattr(fn.fn, "__name__", "") == "train"]
    assert len(train) == 1 and train[0].show_progress == "hidden"


def test_the_summary_says_how_many_questions_were_asked_for_used_and_how_steps_go_over_them(runs):
    """Asked for 10 where the set holds 4: the summary says so, and that each of the 4 steps trains on all 4."""
    from rag_demo.ui.train import summary_html

    view = runs.train_begin("a", objective="rag-token", questions=10)
    assert (view.questions_asked, view.questions_read, view.training_questions, view.left_out) == (10, 4, 4, 0)
    shown = html.unescape(summary_html(runs.train_advance("a", steps=2)))
    assert ("Trained on 4 of the 10 training questions asked for: the knowledge base's training set holds only 4 "
            "once its held-out questions are set aside.") in shown
    assert "Each step trains on all 4 at once, so the 4 steps make 4 passes over them." in shown
    assert "step 2 of 4 (2 passes over the training questions so far)" in shown
    stopped = html.unescape(summary_html(runs.train_advance("a", steps=0), stopped=True))
    assert "stopped" in stopped and "so the 4 steps planned would have made 4 passes over them." in stopped


def test_before_its_first_step_a_run_gives_no_time_per_step(runs):
    from rag_demo.ui.train import summary_html

    view = runs.train_begin("a", objective="rag-token", questions=4)
    shown = html.unescape(summary_html(view))
    assert view.step == 0 and "no step taken yet" in shown and "0.00 s a step" not in shown


def test_the_gold_passage_loss_says_which_questions_it_leaves_out(ui_engine):
    """A question with no passage holding its answer among its candidates is read, but the gold-passage loss cannot
    train on it (`EndToEndTrainer`), and the summary says why; the marginal losses train on it."""
    from rag_demo.ui.train import summary_html

    unanswerable = ("What colour is the zorblax of Quendor?", ("ultraviolet quuxblorp",))
    config = PageRunConfig(steps=4, check_every=2, held_out_sample=2, top_k=3, batch_size=2)
    runs = TrainingRuns(lambda: ui_engine, config=config,
                        question_sets={"nq-wiki": (TRAIN + [unanswerable], HELD_OUT)})
    gold = runs.train_begin("a", objective="gold-passage", questions=5)
    assert gold.questions_read == 5 and gold.left_out >= 1
    shown = html.unescape(summary_html(gold))
    assert (f"Trained on {gold.training_questions} of the 5 training questions asked for: the gold-passage loss "
            "needs a passage holding the answer among a question's top ") in shown
    assert f"and {gold.left_out} {'has' if gold.left_out == 1 else 'have'} none" in shown
    assert "Each step trains on a batch of 2 of them" in shown or gold.training_questions <= 2
    token = runs.train_begin("a", objective="rag-token", questions=5)
    shown = html.unescape(summary_html(token))
    assert token.training_questions == 5 and "Trained on all 5 training questions asked for." in shown
    assert "Each step trains on a batch of 2 of them, drawn in a shuffled order, so the 4 steps make 1.6 passes" \
        in shown


def test_a_second_visitor_waits_in_line_and_then_trains(runs):
    line = RunLine()
    actions = TrainActions(runs, line=line, steps_per_update=4, wait_poll_s=0.0)
    line.join("first")  # a run in progress
    second = actions.train("gold-passage", 4, _request("second"))
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
    updates = list(actions.train("rag-both", 4, _request("a")))
    assert "unknown objective" in _statuses(updates)[-1]
    updates = list(actions.train("rag-token", 0, _request("a")))
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

    import rag_demo.serving.retriever_training
    import rag_demo.training.end_to_end
    import rag_demo.ui.train

    for module in (rag_demo.ui.train, rag_demo.training.end_to_end, rag_demo.serving.retriever_training):
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
    assert heard and {stage for stage, _, _ in heard} == {"reading 3 new passages the trained encoder ranks in its top 2, "
                                                         "for 3 questions (once; cached)"}
    assert heard[-1][1] == heard[-1][2]
    run = runs._runs["a"]  # the summary's reading time counts the widening's, not only the reading before step 1
    widened = sum(w.seconds for w in run.trainer.widenings)
    assert widened > 0 and view.read_seconds == pytest.approx(run.data.read_seconds + widened)
    read = run.data.fresh_reads + sum(w.read for w in run.trainer.widenings)
    assert read > run.data.fresh_reads and view.passages_read == read
    from rag_demo.ui.train import reading_text

    assert reading_text(view).startswith(f"reading {read} passages took ")


def test_stop_ends_a_widening_at_its_next_question_and_takes_no_more_steps(ui_engine, monkeypatch, tmp_path):
    from rag_demo.training.end_to_end import EndToEndTrainer

    monkeypatch.setenv("RAG_DEMO_CACHE", str(tmp_path))  # no reads from other tests: these passages are unread
    moved = tuple(range(len(ui_engine.resolve_kb("nq-wiki"))))[::-1]
    monkeypatch.setattr(EndToEndTrainer, "top_rows", lambda self, depth: [moved[:depth]] * len(self.examples))
    config = PageRunConfig(steps=4, check_every=2, held_out_sample=2, top_k=3, candidates=2, widen_every=2, widen_max_reads=3)
    runs = TrainingRuns(lambda: ui_engine, config=config, question_sets={"nq-wiki": (TRAIN, HELD_OUT)})
    runs.train_begin("a", objective="rag-token", questions=4)
    heard = []

    def stop_at_first_report(stage, done, total):
        heard.append(done)
        runs.train_stop("a")  # the visitor presses Stop while the widening reads

    view = runs.train_advance("a", steps=4, progress=stop_at_first_report)
    assert heard == [1] and view.step == 2 and not view.finished  # no second question read, no step after it
    widening = runs._runs["a"].trainer.widenings[-1]
    assert widening.read == widening.added == 1  # of the 3 it would have read: the first question's one
    assert runs.train_advance("a", steps=1).step == 2  # stopped stays stopped until the next Train
    runs.train_begin("a", objective="rag-token", questions=4)  # a new run steps again
    assert runs.train_advance("a", steps=1).step == 1


def test_stop_while_the_questions_are_read_says_no_step_was_taken(ui_engine, monkeypatch, tmp_path):
    monkeypatch.setenv("RAG_DEMO_CACHE", str(tmp_path))  # every passage unread: the reading reports each question
    runs = TrainingRuns(lambda: ui_engine, config=PageRunConfig(steps=4, check_every=2, held_out_sample=2, top_k=3),
                        question_sets={"nq-wiki": (TRAIN, HELD_OUT)})
    with pytest.raises(RunStopped, match=r"1 of 4 read, and kept for the next run\); no step was taken"):
        runs.train_begin("a", objective="rag-token", questions=4, progress=lambda *report: runs.train_stop("a"))
    assert runs.sessions() == ()
    monkeypatch.setattr(runs, "train_begin", lambda *args, **kwargs: (_ for _ in ()).throw(RunStopped(
        "stopped while reading the training questions' passages (1 of 4 read, and kept for the next run); no step was taken")))
    updates = list(TrainActions(runs, steps_per_update=1).train("rag-token", 4, _request("a")))
    assert updates[-1].status == format_status("Stopped while reading the training questions' passages (1 of 4 read, and "
                                               "kept for the next run); no step was taken.", "info")


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
    from rag_demo.ui.train import reading_text

    cached = runs.train_advance("a", steps=1)
    assert cached.passages_read == 0  # the summary must not say "reading took 0 s"
    assert reading_text(cached) == "every passage's reading came from an earlier run's cache"
    runs.train_begin("b", objective="rag-token", questions=4)  # one question more than was read ahead
    assert len(ReadingCache.open(cache_file).reads) > held


def test_a_failed_read_ahead_leaves_the_start_serving(caplog):
    from rag_demo.serving.background import _read_ahead_for_training

    _read_ahead_for_training(SimpleNamespace(), _no_progress)  # an engine without knowledge bases
    assert "reading the Train tab's questions ahead failed" in caplog.text


def test_a_finished_run_that_raised_neither_held_out_figure_says_so():
    from types import SimpleNamespace

    from rag_demo.ui.train import _no_rise

    def run(*checks, finished=True):
        return SimpleNamespace(checks=list(checks), finished=finished)

    level = run((0, 0.867, 0.639), (60, 0.867, 0.608))
    assert _no_rise(level, ended=True).startswith(" Neither rose: this run did not make retrieval better")
    assert _no_rise(level, ended=False) == ""  # still training: nothing to conclude yet
    assert _no_rise(run((0, 0.8, 0.6), (60, 0.8, 0.61)), ended=True) == ""  # the answer mass rose
    assert _no_rise(run((0, 0.8, 0.6), (60, 0.85, 0.5)), ended=True) == ""  # recall rose
    assert _no_rise(run((0, 0.8, 0.6)), ended=True) == ""  # one check: nothing to compare

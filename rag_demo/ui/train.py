"""The Train tab: watch the retriever learn from answers alone (the paper's end-to-end training, section 2.4).

A visitor picks a loss and a number of training questions and presses Train: the question encoder, a copy for that
visitor only, takes 60 steps of 16 questions (however many were chosen) while the tab plots the loss, held-out
retrieval, and one held-out question's p(z|x) before and now. One run trains at a time across visitors; the next
waits in line and sees its place. The run lives with the engine (`serving.retriever_training.TrainingRuns`) and is
dropped when the visitor leaves. Once it has taken a step, the question-encoder choice of the Ask, Score and Swap
tabs (`encoder_choice`, one per tab) offers it to that visitor (`offered_encoder`); a new run takes it back
(`packaged_encoder`), and so does a tab whose call finds it gone (`encoder_gone`).

    choices = EncoderChoices(ask=encoder_choice("question-encoder"), score=..., swap=...)   # in each tab
    train_tab(engine, runs=runs, encoders=choices)   # inside the page's `gr.Tabs()`: the tab and its events
"""

from __future__ import annotations

import functools
import html
import logging
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, TypeVar

import gradio as gr

from ..errors import RagDemoError, RunStopped
from ..progress import Progress, counted, eta_text
from ..serving.interface import EngineNotReady
from ..serving.retriever_training import PageRunConfig, passes_over
from .html import esc, format_status
from .inputs import PACKAGED, TRAINED
from .views import View, changed

log = logging.getLogger(__name__)
T = TypeVar("T")

OBJECTIVE_CHOICES = [("RAG-Token (the paper's, from answers)", "rag-token"),
                     ("RAG-Sequence (the paper's, from answers)", "rag-sequence"),
                     ("Gold passage (needs labels: a passage holding the answer)", "gold-passage")]
STEPS_PER_UPDATE = 5  # steps between two redraws: a redraw costs about what a step does
WAIT_POLL_S = 1.0  # how often a visitor in line hears their place
PROGRESS_POLL_S = 0.5  # how often the status redraws the reading's count while the engine reads
STALE_RUN_S = 60.0  # a run not heard from this long (its tab closed mid-run) gives up its turn
STATE_TTL_S = 2 * 3600  # a visitor's trained encoder is dropped at the latest 2 h after their run, as the page's other state

HELP = ("<p class=\"rag-help\">RAG trains its retriever without passage labels: the loss is −log p(answer | question), "
        "marginalized over the top passages, and its gradient reaches the question encoder through p(z|x) alone. "
        "Here the generator (the reader) is frozen and its reading of each training question's top 10 passages is "
        "computed once and kept (about 2 s a question, the first time only), so a step is the question encoder's "
        f"forward and backward pass over a batch of {PageRunConfig().batch_size} training questions plus a softmax: "
        "about 0.2 s on 2 otherwise idle CPU cores (the summary gives your run's own). "
        "The passages' vectors and the index never change. "
        "The trained encoder is yours alone: once it has taken a step the Ask, Score and Swap tabs offer it "
        "(Question encoder), and it is forgotten when you leave. The generator's memory is no source here (the "
        "paper's formulas). "
        "Held-out questions are never trained on; with no passage labels, a passage that contains an answer counts "
        "as a hit.</p>")


# Each asking tab's question-encoder choice: hidden until this visitor's run has taken a step
PACKAGED_CHOICE = ("packaged", PACKAGED)
ENCODER_INFO = ("Your Train run's encoder computes q(x) for your asks and scores alone (Dense and Dense + BM25; BM25 "
                "reads words only); nobody else on the page sees it. With it, the generator's memory is a source only "
                "where its logit θ is configured: the fitted one is the packaged encoder's.")
REPLACED_NOTE = ("A new run is training, so this tab is back on the packaged encoder; the new run's encoder is offered "
                 "here once it has taken a step (the last one is gone).")
GONE_NOTE = ("Your trained question encoder is gone (it is kept while this page is open, for at most 2 hours after "
             "its run), so this tab is back on the packaged encoder. Try again, or train anew on the Train tab.")


class EncoderChoices(NamedTuple):
    """The question-encoder choice of each tab that asks the engine (`encoder_choice`): a run offers its encoder in
    all of them, and a new run takes it back from all of them."""

    ask: Any
    score: Any
    swap: Any


def encoder_choice(elem_id: str) -> gr.Radio:
    """A tab's question-encoder choice: hidden, on the packaged encoder, until this visitor's run offers its own."""
    return gr.Radio([PACKAGED_CHOICE], value=PACKAGED, label="Question encoder", elem_id=elem_id, visible=False)


def offered_encoder(view) -> dict:
    """A tab's choice once the run has taken a step: the packaged encoder, or the one trained, by name."""
    if view.step < 1:
        return gr.skip()
    return gr.update(choices=[PACKAGED_CHOICE, (view.question_encoder, TRAINED)], visible=True, info=ENCODER_INFO)


def packaged_encoder(note: str) -> dict:
    """A tab's choice back on the packaged encoder alone, and why."""
    return gr.update(choices=[PACKAGED_CHOICE], value=PACKAGED, visible=True, info=note)


def encoder_gone(view: type[View]) -> View:
    """A tab's outputs when its call asked for the visitor's trained encoder and none is left (a new run, the
    session's end): the note in its message box, its choice back on the packaged encoder, all else as it was.
    `view` names the tab's outputs, among them `status` and `question_encoder`."""
    return changed(view, status=format_status(GONE_NOTE, "info"), question_encoder=packaged_encoder(GONE_NOTE))


def _every_choice(update: dict) -> dict[str, dict]:
    """`update` for each tab's choice, as TrainView names them; a copy each, since gradio pops an update's value."""
    return {f"{tab}_encoder": dict(update) for tab in EncoderChoices._fields}


class TrainView(NamedTuple):
    status: Any
    summary: Any
    loss: Any
    held_out: Any
    question: Any
    run: Any  # the session whose run the engine holds: gradio's deleting it frees the run (`train_tab`)
    ask_encoder: Any  # each tab's question-encoder choice (`offered_encoder`), as `EncoderChoices` names the tabs
    score_encoder: Any
    swap_encoder: Any


class RunLine:
    """One run trains at a time: sessions wait in the order they pressed Train. Not module state: one per page."""

    def __init__(self, *, stale_after_s: float = STALE_RUN_S):
        self._lock = threading.Lock()
        self._line: list[str] = []
        self._heard: dict[str, float] = {}
        self._stopping: set[str] = set()
        self.stale_after_s = stale_after_s

    def join(self, session: str) -> None:
        with self._lock:
            self._stopping.discard(session)
            if session not in self._line:
                self._line.append(session)
            self._heard[session] = time.monotonic()

    def ahead(self, session: str) -> int:
        """How many runs are before this session's; 0: its turn. The first's run, if not heard from for
        `stale_after_s`, is dropped."""
        with self._lock:
            self._heard[session] = time.monotonic()
            while self._line and self._line[0] != session and time.monotonic() - self._heard.get(self._line[0], 0) > self.stale_after_s:
                self._heard.pop(self._line.pop(0), None)
            return self._line.index(session) if session in self._line else 0

    def heard(self, session: str) -> None:
        with self._lock:
            self._heard[session] = time.monotonic()

    def leave(self, session: str) -> None:
        with self._lock:
            if session in self._line:
                self._line.remove(session)
            self._heard.pop(session, None)

    def stop(self, session: str) -> None:
        with self._lock:
            self._stopping.add(session)

    def stopping(self, session: str) -> bool:
        with self._lock:
            return session in self._stopping


def _percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def loss_figure(view):
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=list(range(1, len(view.losses) + 1)), y=list(view.losses), mode="lines+markers",
                               marker=dict(size=4), name="loss", line=dict(color="#4f46e5")))
    fig.update_layout(title=dict(text=f"Training loss per step ({html.escape(view.objective)})", x=0.01, font=dict(size=14)),
                      height=260, margin=dict(l=10, r=10, t=40, b=10), xaxis_title="step", yaxis_title="loss",
                      paper_bgcolor="white", plot_bgcolor="white", showlegend=False)
    return fig


def held_out_figure(view):
    import plotly.graph_objects as go

    steps = [step for step, _, _ in view.checks]
    fig = go.Figure([
        go.Scatter(x=steps, y=[100 * r for _, r, _ in view.checks], mode="lines+markers", name="recall@5",
                   line=dict(color="#0d9488")),
        go.Scatter(x=steps, y=[100 * m for _, _, m in view.checks], mode="lines+markers",
                   name="p(z|x) on answer passages", line=dict(color="#db2777")),
    ])
    fig.update_layout(title=dict(text=f"{view.held_out} held-out questions (%)", x=0.01, font=dict(size=14)), height=260,
                      margin=dict(l=10, r=10, t=40, b=10), xaxis_title="step", yaxis=dict(range=[0, 100]),
                      paper_bgcolor="white", plot_bgcolor="white", legend=dict(orientation="h", y=-0.3))
    return fig


def question_figure(view):
    """The followed question's top k before training and now; a passage that holds an answer is marked ✓."""
    import plotly.graph_objects as go

    order, labels = [], {}
    for ranked in (view.now, view.before):
        for row, title, bearing in zip(ranked.rows, ranked.titles, ranked.answer_bearing):
            if row not in labels:
                order.append(row)
                short = title if len(title) <= 28 else title[:27] + "…"
                labels[row] = html.escape(("✓ " if bearing else "") + f"{short} #{row}")

    def probs(ranked) -> list[float]:
        got = dict(zip(ranked.rows, ranked.probs))
        return [got.get(row, 0.0) for row in order]

    names = [labels[row] for row in order]
    fig = go.Figure([go.Bar(y=names, x=probs(view.before), orientation="h", name="packaged encoder", marker_color="#a5b4fc"),
                     go.Bar(y=names, x=probs(view.now), orientation="h", name=f"after step {view.step}",
                            marker_color="#4f46e5")])
    fig.update_layout(title=dict(text="p(z|x) of one held-out question (✓: holds an answer)", x=0.01, font=dict(size=14)),
                      barmode="group", height=80 + 34 * len(order), margin=dict(l=10, r=10, t=40, b=10),
                      xaxis=dict(range=[0, 1], title="p(z|x) over its top k"), yaxis=dict(autorange="reversed"),
                      paper_bgcolor="white", plot_bgcolor="white", legend=dict(orientation="h", y=-0.15))
    return fig


def _passes(x: float) -> str:
    """
    >>> _passes(60.0), _passes(9.6), _passes(1.0)
    ('60 passes', '9.6 passes', '1 pass')
    """
    shown = f"{x:.1f}".removesuffix(".0")
    return f"{shown} pass" + ("" if shown == "1" else "es")


def questions_text(view, *, stopped: bool = False) -> str:
    """How many training questions were asked for, how many the loss trains on and why fewer, and how the run's
    steps go over them (plain text: numbers and fixed words only).

    >>> from types import SimpleNamespace as V
    >>> print(questions_text(V(questions_asked=10, questions_read=10, training_questions=8, left_out=2, steps=60,
    ...                        batch_size=16, candidates=10)))  # doctest: +NORMALIZE_WHITESPACE
    Trained on 8 of the 10 training questions asked for: the gold-passage loss needs a passage holding the answer
    among a question's top 10 passages, and 2 have none. Each step trains on all 8 at once, so the 60 steps make
    60 passes over them.
    >>> print(questions_text(V(questions_asked=100, questions_read=100, training_questions=100, left_out=0, steps=60,
    ...                        batch_size=16, candidates=10)))  # doctest: +NORMALIZE_WHITESPACE
    Trained on all 100 training questions asked for. Each step trains on a batch of 16 of them, drawn in a shuffled
    order, so the 60 steps make 9.6 passes over them: more questions, fewer passes.
    """
    used, asked = view.training_questions, view.questions_asked
    reasons = []
    if view.questions_read < asked:
        reasons.append(f"the knowledge base's training set holds only {view.questions_read} once its held-out "
                       "questions are set aside")
    if view.left_out:
        have = "has" if view.left_out == 1 else "have"
        reasons.append(f"the gold-passage loss needs a passage holding the answer among a question's top "
                       f"{view.candidates} passages, and {view.left_out} {have} none")
    said = (f"Trained on all {counted(used, 'training question')} asked for." if used == asked else
            f"Trained on {used} of the {counted(asked, 'training question')} asked for: {'; '.join(reasons)}.")
    passes = _passes(passes_over(view.steps, view.batch_size, used))
    # a stopped run did not take all its steps: the plan, not what happened
    steps = f"{counted(view.steps, 'step')} planned would have made" if stopped else f"{counted(view.steps, 'step')} make"
    if view.batch_size >= used:
        them = "it" if used == 1 else "them"
        return (f"{said} Each step trains on {'it' if used == 1 else f'all {used} at once'}, so the "
                f"{steps} {passes} over {them}.")
    return (f"{said} Each step trains on a batch of {view.batch_size} of them, drawn in a shuffled order, so the "
            f"{steps} {passes} over them: more questions, fewer passes.")


def summary_html(view, *, stopped: bool = False) -> str:
    """The run in words: where it stands (`stopped`: the visitor stopped it), how its steps go over its training
    questions, held-out figures before and now, the followed question (escaped)."""
    first, last = view.checks[0], view.checks[-1]
    answer_mass = lambda ranked: sum(p for p, b in zip(ranked.probs, ranked.answer_bearing) if b)  # noqa: E731
    state = "finished" if view.finished else "stopped" if stopped else "training"
    so_far = f" ({_passes(view.passes)} over the training questions so far)" if view.step else ""
    return (
        f'<div class="rag-train-summary"><p><b>{esc(state)}</b>: step {view.step} of {view.steps}{so_far}, '
        f"{f'{view.step_seconds:.2f} s a step' if view.step else 'no step taken yet'} ({reading_text(view)}).</p>"
        f"<p>{esc(questions_text(view, stopped=stopped))}</p>"
        f"<p>Held out, from step 0 to step {last[0]}: recall@5 {_percent(first[1])} → {_percent(last[1])}; "
        f"mean p(z|x) on passages holding an answer {_percent(first[2])} → {_percent(last[2])}.{_no_rise(view, ended=view.finished or stopped)}</p>"
        f"<p>Followed question: <q>{esc(view.question)}</q> (answer: {esc(', '.join(view.answers[:3]))}): "
        f"p(z|x) on its answer passages {_percent(answer_mass(view.before))} → {_percent(answer_mass(view.now))}.</p>"
        f"{gradient_html(view)}</div>"
    )


def reading_text(view) -> str:
    """What reading the candidates cost this run: the reader's passes over passages it had not read before
    (kept for the next run), or none, when an earlier run's reads served them all."""
    if not view.passages_read:
        return "every passage's reading came from an earlier run's cache"
    seconds = f"{view.read_seconds:.1f}" if view.read_seconds < 10 else f"{view.read_seconds:.0f}"
    return f"reading {counted(view.passages_read, 'passage')} took {seconds} s; kept for the next run"


def _no_rise(view, *, ended: bool) -> str:
    """Where a run that has ended raised neither held-out figure, a sentence that says so plainly (a visitor told to
    watch the retriever learn would otherwise look for a gain that is not there); "" otherwise."""
    first, last = view.checks[0], view.checks[-1]
    if not ended or len(view.checks) < 2 or last[1] > first[1] or last[2] > first[2]:
        return ""
    return (" Neither rose: this run did not make retrieval better on questions it did not train on. Runs of this "
            "size seldom do (measured with each loss on 200 questions, the changes stayed inside the noise); what "
            "they show is how training works: the loss, the gradient below, and the followed question's passages.")


def gradient_html(view) -> str:
    """The gradient in two lines, with the run's own numbers; "" for the gold-passage loss."""
    g = view.gradient
    if g is None:
        return ""
    which = "p(z|x) − p(z|x,y)" if view.objective == "rag-sequence" else "Σ_t [p(z|x) − p(z|x,y_t,y&lt;t)]"
    return (f"<p>The gradient on passage z's logit is {which}: the prior minus the posterior once the answer is read, "
            "so passages that explain the answer better than the retriever thought are pulled up.<br>"
            f"Now, for the training question <q>{esc(g.question)}</q> (answer: {esc(g.answer)}): "
            f"<b>{esc(g.title)}</b> has p(z|x) = {g.prior:.2f} and ∂loss/∂logit = {g.gradient:+.2f}, "
            f"so a step from here {_moves(g.gradient)} its logit.</p>")


def _moves(gradient: float) -> str:
    """What a step does to a logit with this gradient (a descent step goes against it).

    >>> _moves(-0.4), _moves(0.2), _moves(-0.001)
    ('raises', 'lowers', 'hardly moves')
    """
    return "hardly moves" if abs(gradient) < 0.005 else "raises" if gradient < 0 else "lowers"


def reading_status(stage: str, done: int, total: int, *, first: int, elapsed_s: float) -> str:
    """The engine's reading as the status says it: its stage, how far, and the time left at the rate since its
    first report (`first` done then, `elapsed_s` ago).

    >>> reading_status("finding 100 questions' top 10 passages and reading any not read before", 25, 100, first=5, elapsed_s=10.0)
    "finding 100 questions' top 10 passages and reading any not read before: 25 of 100, 38s left"
    >>> reading_status("finding 100 questions' top 10 passages and reading any not read before", 1, 100, first=1, elapsed_s=0.0)
    "finding 100 questions' top 10 passages and reading any not read before: 1 of 100"
    """
    left = eta_text(done - first, total - first, elapsed_s)
    return f"{stage}: {done} of {total}" + (f", {left}" if left else "")


def _view(run, *, stopped: bool = False) -> TrainView:
    return TrainView(status=gr.skip(), summary=summary_html(run, stopped=stopped), loss=loss_figure(run),
                     held_out=held_out_figure(run),
                     question=question_figure(run), run=gr.skip(), **_every_choice(offered_encoder(run)))


def _status_only(message: str, kind: str) -> TrainView:
    return changed(TrainView, status=format_status(message, kind))


class TrainActions:
    """The Train tab's events. `runs` holds the visitors' runs (the engine's `train_*` calls)."""

    def __init__(self, runs, *, line: RunLine | None = None, steps_per_update: int = STEPS_PER_UPDATE,
                 wait_poll_s: float = WAIT_POLL_S, progress_poll_s: float = PROGRESS_POLL_S):
        self.runs, self.line = runs, line or RunLine()
        self.steps_per_update, self.wait_poll_s, self.progress_poll_s = steps_per_update, wait_poll_s, progress_poll_s

    def _reading(self, session: str, call: Callable[[Progress], T], say: Callable[[str], TrainView]
                 ) -> Generator[TrainView, None, T]:
        """`call(progress=...)` on a thread of its own, yielding `say(the reading it reports)` (`reading_status`) as it
        goes and returning its result. A thread: the status can only change between the event's yields, and a call
        that reads may take minutes, which gradio's own progress would show over the tab's status instead."""
        heard: list[str] = []
        first: dict[str, tuple[float, int]] = {}  # each stage's first report: when, and how much was done then

        def report(stage: str, done: int, total: int) -> None:
            at, done_then = first.setdefault(stage, (time.monotonic(), done))
            heard.append(reading_status(stage, done, total, first=done_then, elapsed_s=time.monotonic() - at))

        with ThreadPoolExecutor(1, thread_name_prefix="train") as pool:
            pending, shown = pool.submit(call, progress=report), None
            while True:
                try:
                    return pending.result(timeout=self.progress_poll_s)
                except TimeoutError:
                    self.line.heard(session)  # the run is alive while its event waits on it
                    if heard and heard[-1] != shown:
                        shown = heard[-1]
                        yield say(shown)

    def train(self, objective: str, questions: float, request: gr.Request, earlier: str | None = None):
        """`earlier`: the session of this page's last run, if it had one (its encoder goes when this one begins)."""
        session = getattr(request, "session_hash", None) or "api"
        self.line.join(session)
        try:
            while (ahead := self.line.ahead(session)) > 0:
                if self.line.stopping(session):
                    yield _status_only("Stopped before your run began.", "info")
                    return
                runs = "run is" if ahead == 1 else "runs are"
                yield _status_only(f"One run trains at a time: {ahead} {runs} ahead of yours in line. Yours starts "
                                   "by itself; keep this tab open.", "wait")
                time.sleep(self.wait_poll_s)
            yield _status_only("Reading each training question's passages with the generator (once: cached for later "
                               "runs), then measuring the packaged encoder…", "wait")._replace(
                **_every_choice(packaged_encoder(REPLACED_NOTE) if earlier else gr.skip()))
            begin = functools.partial(self.runs.train_begin, session, objective=objective, questions=int(questions))
            run = yield from self._reading(session, begin, lambda stage: _status_only(
                f"{stage[:1].upper()}{stage[1:]}; then the packaged encoder is measured…", "wait"))
            yield _view(run)._replace(status=format_status(f"Training… step 0 of {run.steps}", "wait"), run=session)
            while not run.finished and not self.line.stopping(session):
                self.line.heard(session)
                at = f"Training… step {run.step} of {run.steps}"
                advance = functools.partial(self.runs.train_advance, session, steps=self.steps_per_update)
                run = yield from self._reading(session, advance, lambda stage: _status_only(f"{at}; {stage}", "wait"))
                yield _view(run)._replace(status=format_status(f"Training… step {run.step} of {run.steps}", "wait"))
            stopped = not run.finished
            done = f"Stopped at step {run.step} of {run.steps}" if stopped else "Finished"
            use = (f" Ask with it on the Ask tab, or on the Score and Swap tabs (Question encoder: “{run.question_encoder}”)."
                   if run.step else "")
            yield _view(run, stopped=stopped)._replace(
                status=format_status(f"{done}. This trained encoder is yours until you leave the page." + use, "ok"))
        except RunStopped as err:
            yield _status_only(f"{str(err)[:1].upper()}{str(err)[1:]}.", "info")
        except EngineNotReady as err:
            yield _status_only(str(err), "wait")
        except RagDemoError as err:
            yield _status_only(str(err), "error")
        except Exception as err:  # the page's boundary: a message, the details in the log
            log.exception("unexpected error while training", exc_info=err)
            yield _status_only(f"Something went wrong inside the demo ({type(err).__name__}); the server log has the "
                               "details.", "error")
        finally:
            self.line.leave(session)

    def stop(self, request: gr.Request) -> None:
        session = getattr(request, "session_hash", None) or "api"
        self.line.stop(session)
        try:  # a widening's reading ends at its next question, not after the whole minute
            self.runs.train_stop(session)
        except RagDemoError:  # the engine is not ready: no run of theirs is reading or stepping
            pass

    def end_session(self, session: str | None) -> None:
        """The visitor left (gradio deleted their session's state): stop their run and free their trained encoder."""
        if session:
            self.line.stop(session)
            try:
                self.runs.train_end(session)
            except RagDemoError:  # the engine is not ready: it holds no run of theirs
                pass


def training_runs(engine):
    """The engine's visitors' runs: a served engine keeps them (`BackgroundEngine`, `EngineProcess`); a bare
    `RagEngine` (tests, scripts) gets runs of its own here."""
    if hasattr(engine, "train_begin"):
        return engine
    from ..serving.retriever_training import TrainingRuns

    return TrainingRuns(lambda: engine)


def train_tab(engine, *, encoders: EncoderChoices, runs=None) -> TrainActions:
    """The Train tab and its events; call inside the page's `gr.Tabs()`. `encoders` are the tabs' question-encoder
    choices, which a run offers its encoder in; `runs` defaults to `training_runs(engine)`, and those tabs must ask
    the same runs."""
    actions = TrainActions(runs if runs is not None else training_runs(engine))

    def end_session(session: str | None) -> None:
        # a plain function, not a bound method: gradio deep-copies a component's arguments for every session
        actions.end_session(session)
    with gr.Tab("Train", id="train", elem_id="tab-train"):
        gr.HTML(HELP, js_on_load=None)
        with gr.Row(equal_height=True, elem_classes=["rag-stack-narrow"]):
            objective = gr.Radio(OBJECTIVE_CHOICES, value="rag-token", label="Loss", elem_id="train-objective", scale=3)
            page_runs = PageRunConfig()
            questions = gr.Slider(10, page_runs.max_questions, value=page_runs.default_questions, step=10,
                                  label="Training questions", elem_id="train-questions", scale=2,
                                  info=f"The run is always {page_runs.steps} steps, each on up to {page_runs.batch_size} "
                                  "of these questions: fewer questions, more passes over each. Each is read "
                                  f"once with its top {page_runs.candidates} passages (~2 s; the first "
                                  f"{page_runs.default_questions} as the page starts)")
            with gr.Column(scale=1, min_width=120):
                train_btn = gr.Button("Train", variant="primary", elem_id="train-btn")
                stop_btn = gr.Button("Stop", elem_id="train-stop")
        status = gr.HTML("", elem_id="train-status", js_on_load=None, elem_classes=["rag-autohide"])
        summary = gr.HTML("", elem_id="train-summary", js_on_load=None)
        with gr.Row():
            with gr.Column(min_width=380):
                loss = gr.Plot(elem_id="train-loss", show_label=False)
            with gr.Column(min_width=380):
                held_out = gr.Plot(elem_id="train-held-out", show_label=False)
        question = gr.Plot(elem_id="train-question", show_label=False)
        # the session holding a run; gradio deletes it when the visitor has left (or after STATE_TTL_S), and with it the run
        run = gr.State(None, time_to_live=STATE_TTL_S, delete_callback=end_session)
    view = TrainView(status=status, summary=summary, loss=loss, held_out=held_out, question=question, run=run,
                     ask_encoder=encoders.ask, score_encoder=encoders.score, swap_encoder=encoders.swap)
    # its own concurrency group, unlimited: a visitor in line is told their place (`RunLine`) instead of waiting
    # unseen in gradio's queue, and a run never holds up the other tabs' answers
    # the tab's status is the run's one progress display (steps, and the reading's count): gradio's own would be
    # drawn over it
    train_btn.click(actions.train, inputs=[objective, questions, run], outputs=list(view), api_visibility="private",
                    concurrency_id="train", concurrency_limit=None, show_progress="hidden")
    stop_btn.click(actions.stop, api_visibility="private", queue=False)
    return actions

"""The Train tab in a real Chromium (the harness of tests/browser_pages.py): press Train, see the plots fill in, then
ask with the trained encoder on the Ask tab and score with it on the Score tab.

Run: pytest -m browser tests/test_browser_train.py
"""

from __future__ import annotations

import re
import time

import pytest

from rag_demo.ui import build_demo
from tests.browser_pages import TIMEOUT_MS, expect, field, launch, open_tab, shot, visitor_page

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("one_torch_thread")]

TRAIN = [("What is the capital of France?", ("Paris",)), ("Who wrote A Farewell to Arms?", ("Hemingway",)),
         ("How tall is the Eiffel Tower?", ("330 metres",)), ("Who created the Python programming language?",
                                                              ("Guido van Rossum",)),
         ("What was the first adhesive postage stamp?", ("Penny Black",))]
HELD_OUT = [("What is the largest planet in the Solar System?", ("Jupiter",)),
            ("Who won the 2018 FIFA World Cup?", ("France",))]


@pytest.fixture(scope="module")
def train_server(ui_engine):
    with pytest.MonkeyPatch.context() as patch:  # the tiny engine's base trains on these pairs
        patch.setattr("rag_demo.serving.retriever_training.QUESTION_SETS_FOR_KB", {"nq-wiki": (TRAIN, HELD_OUT)})
        demo = build_demo(ui_engine)
    try:
        yield launch(demo)
    finally:
        demo.close()


# every number of points the loss plot has shown, in order
RECORD_LOSS_POINTS = """() => {
  window.__lossPoints = [];
  const record = () => {
    const plot = document.querySelector('#train-loss .js-plotly-plot');
    const n = plot && plot.data ? plot.data[0].x.length : 0;
    if (n && window.__lossPoints[window.__lossPoints.length - 1] !== n) window.__lossPoints.push(n);
  };
  new MutationObserver(record).observe(document.querySelector('#train-loss'),
                                       {subtree: true, childList: true, attributes: true});
}"""


def plotted_points(page, elem_id: str) -> int:
    return page.evaluate(f"() => {{ const p = document.querySelector('#{elem_id} .js-plotly-plot'); "
                         "return p && p.data ? p.data[0].x.length : 0; }")


def use_trained_encoder(page, tab: str, choice_id: str, label: str) -> None:
    """On `tab`, pick this visitor's trained encoder (`label`) in that tab's question-encoder choice."""
    open_tab(page, tab)
    choice = page.locator(f"#{choice_id}")
    expect(choice).to_be_visible()
    choice.get_by_text(label).click()


def test_pressing_train_draws_the_run(browser, train_server):
    with visitor_page(browser, train_server) as page:
        open_tab(page, "Train")
        page.locator("#train-questions input[type=number]").fill("10")
        page.evaluate(RECORD_LOSS_POINTS)
        page.locator("#train-btn").click()
        expect(page.locator("#train-status")).to_contain_text("Finished", timeout=TIMEOUT_MS)
        seen = page.evaluate("() => window.__lossPoints")
        assert seen[-1] == 60 and len(seen) >= 3, seen  # a point per step, redrawn as the run went
        assert plotted_points(page, "train-held-out") == 13  # step 0 and every 5th step
        expect(page.locator("#train-summary")).to_contain_text("Followed question")
        expect(page.locator("#train-question .js-plotly-plot")).to_be_visible()
        expect(page.locator("#train-status")).to_contain_text("Ask with it on the Ask tab")
        shot(page, "train-tab", full_page=True)

        # the Ask tab now offers this visitor's encoder; an answer with it says so
        trained = "trained on this page (RAG-Token, 60 steps)"
        use_trained_encoder(page, "Ask", "question-encoder", trained)
        field(page, "question").fill("Who won the 2018 FIFA World Cup?")
        page.locator("#ask-btn").click()
        expect(page.locator("#answer")).to_contain_text(f"question encoder: {trained}")
        shot(page, "ask-trained-encoder")

        # the Score tab offers it too, with a choice of its own (the question carried over from the ask)
        use_trained_encoder(page, "Score your answer", "score-question-encoder", trained)
        field(page, "score-answer").fill("France")
        page.locator("#score-btn").click()
        expect(page.locator("#score-out")).to_contain_text(f"question encoder: {trained}")
        expect(page.locator("#score-out")).to_contain_text("p(z|x) of the passages read")

        # a new run takes the chosen encoder back: each choice returns to the packaged one (with a note while the
        # run has taken no step, `REPLACED_NOTE`: too brief to catch on tiny models), and offers the new run's encoder
        open_tab(page, "Train")
        page.locator("#train-objective").get_by_text("RAG-Sequence (the paper's, from answers)").click()
        page.locator("#train-btn").click()
        for tab, choice_id in (("Ask", "question-encoder"), ("Score your answer", "score-question-encoder")):
            open_tab(page, tab)
            choice = page.locator(f"#{choice_id}")
            expect(choice).to_contain_text("trained on this page (RAG-Sequence, 60 steps)")
            expect(choice.get_by_label("packaged")).to_be_checked()


# what of gradio's own progress (its tracker's text, timer or bar) was ever seen on the Train tab; the tracker
# stays in the page while hidden, transparent
RECORD_GRADIO_PROGRESS = """() => {
  window.__gradioProgress = [];
  const tab = document.querySelector('#tab-train');
  const seen = (el) => {
    for (let at = el; at && at !== tab; at = at.parentElement) {
      const style = getComputedStyle(at);
      if (style.display === 'none' || style.visibility === 'hidden' || style.opacity === '0') return false;
    }
    return true;
  };
  new MutationObserver(() => {
    for (const el of tab.querySelectorAll('.progress-text, .meta-text, .meta-text-center, .eta-bar, .progress-bar')) {
      const text = el.textContent.trim();
      if (text && seen(el)) window.__gradioProgress.push(`${el.closest('[id]').id}: ${text}`);
    }
  }).observe(tab, {subtree: true, childList: true, characterData: true});
}"""


def test_a_run_shows_one_progress_and_after_stop_every_line_says_it_stopped(browser, train_server, monkeypatch):
    from rag_demo.serving.retriever_training import TrainingRuns

    advance = TrainingRuns.train_advance

    def slowly(self, *args, **kwargs):  # time to press Stop mid-run: the tiny models step in milliseconds, and a
        time.sleep(1.5)  # loaded machine took longer than 12 updates of 0.3 s to reach the Stop button
        return advance(self, *args, **kwargs)

    monkeypatch.setattr(TrainingRuns, "train_advance", slowly)
    with visitor_page(browser, train_server) as page:
        open_tab(page, "Train")
        page.evaluate(RECORD_GRADIO_PROGRESS)
        page.locator("#train-btn").click()
        status = page.locator("#train-status")
        expect(status).to_contain_text(re.compile(r"Training… step [1-9]\d* of 60"), timeout=TIMEOUT_MS)
        expect(page.locator("#train-summary")).to_contain_text("Each step trains on all 5 at once")
        shot(page, "train-tab-running", full_page=True)
        page.locator("#train-stop").click()
        expect(status).to_contain_text("Stopped at step", timeout=TIMEOUT_MS)
        step = int(re.search(r"Stopped at step (\d+) of 60", status.inner_text()).group(1))
        summary = page.locator("#train-summary")
        expect(summary).to_contain_text(f"stopped: step {step} of 60")
        expect(summary).not_to_contain_text("training:")
        expect(summary).to_contain_text("Trained on 5 of the 100 training questions asked for: the knowledge base's "
                                        "training set holds only 5")
        shot(page, "train-tab-stopped", full_page=True)
        seen = page.evaluate("() => window.__gradioProgress")
        assert seen == [], sorted(set(seen))


def test_another_visitor_is_not_offered_the_trained_encoder(browser, train_server):
    """The first test's run is another visitor's: a fresh page never sees a question-encoder choice."""
    with visitor_page(browser, train_server) as page:
        for choice in ("#question-encoder", "#score-question-encoder", "#swap-question-encoder"):
            expect(page.locator(choice)).to_be_hidden()

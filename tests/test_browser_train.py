"""The Train tab in a real Chromium (the harness of tests/test_browser.py): press Train, see the plots fill in, then
ask with the trained encoder on the Ask tab and score with it on the Score tab.

Run: pytest -m browser tests/test_browser_train.py
"""

from __future__ import annotations

import pytest

from rag_demo.ui import build_demo
from tests.test_browser import TIMEOUT_MS, VIEWPORT, browser, expect, field, launch, open_tab, shot  # noqa: F401 (fixture)

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


def test_pressing_train_draws_the_run(browser, train_server):  # noqa: F811
    context = browser.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(train_server)
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
        open_tab(page, "Ask")
        choice = page.locator("#question-encoder")
        expect(choice).to_be_visible()
        choice.get_by_text("trained on this page (RAG-Token, 60 steps)").click()
        field(page, "question").fill("Who won the 2018 FIFA World Cup?")
        page.locator("#ask-btn").click()
        expect(page.locator("#answer")).to_contain_text("question encoder: trained on this page (RAG-Token, 60 steps)")
        shot(page, "ask-trained-encoder")

        # the Score tab offers it too, with a choice of its own (the question carried over from the ask)
        open_tab(page, "Score your answer")
        score_choice = page.locator("#score-question-encoder")
        expect(score_choice).to_be_visible()
        score_choice.get_by_text("trained on this page (RAG-Token, 60 steps)").click()
        field(page, "score-answer").fill("France")
        page.locator("#score-btn").click()
        expect(page.locator("#score-out")).to_contain_text("question encoder: trained on this page (RAG-Token, 60 steps)")
        expect(page.locator("#score-out")).to_contain_text("p(z|x) of the passages read")

        # a new run takes the chosen encoder back: the choice returns to the packaged one (with a note while the run
        # has taken no step, `REPLACED_NOTE`: too brief to catch on tiny models), and offers the new run's encoder
        open_tab(page, "Train")
        page.locator("#train-objective").get_by_text("RAG-Sequence (the paper's, from answers)").click()
        page.locator("#train-btn").click()
        open_tab(page, "Ask")
        expect(choice).to_contain_text("trained on this page (RAG-Sequence, 60 steps)")
        expect(choice.get_by_label("packaged")).to_be_checked()
        open_tab(page, "Score your answer")
        expect(score_choice).to_contain_text("trained on this page (RAG-Sequence, 60 steps)")
        expect(score_choice.get_by_label("packaged")).to_be_checked()
    finally:
        context.close()


def test_another_visitor_is_not_offered_the_trained_encoder(browser, train_server):  # noqa: F811
    """The first test's run is another visitor's: a fresh page never sees a question-encoder choice."""
    context = browser.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(train_server)
        page.locator("#ask-btn").wait_for()
        for choice in ("#question-encoder", "#score-question-encoder", "#swap-question-encoder"):
            expect(page.locator(choice)).to_be_hidden()
    finally:
        context.close()

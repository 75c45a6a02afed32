"""The page in a real Chromium (Debian's /usr/bin/chromium; never `playwright install`).

The app runs on 127.0.0.1 over `ui_engine`, a real `RagEngine` on tiny random models
(tests/ui_engine.py); what the page shows is compared with what that engine computes.
Run: pytest -m browser. Screenshots at 1280x720 land in artifacts/ (gitignored).
"""

from __future__ import annotations

import math
import re
import threading
from pathlib import Path

import pytest

from rag_demo.serving.background import BackgroundEngine
from rag_demo.config import LIMITS
from rag_demo.results import RetrievedPassage
from rag_demo.ui import build_demo
from rag_demo.ui.actions import PRIVATE_LABEL
from rag_demo.ui.html import MEMORY_UNAVAILABLE, esc, fmt_log, fmt_prob, swap_verdict
from rag_demo.ui.learn import GLOSSARY
from rag_demo.ui.sentences import evidence
from tests.browser_pages import TIMEOUT_MS, VIEWPORT, expect, field, launch, open_tab, shot, visitor_page
from tests.ui_engine import KB_NAMES, QUESTIONS

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("one_torch_thread")]

EVIL_TITLE = "<img src=x onerror=window.__pwned=1>Evil title"
EVIL_TEXT = ("Zorblax is the capital of Plutonia. <script>window.__pwned=2</script> "
             "<img src=x onerror=window.__pwned=3> <b>not bold</b>")


@pytest.fixture(scope="module")
def server(ui_engine):
    demo = build_demo(ui_engine)
    try:
        yield launch(demo)
    finally:
        demo.close()


@pytest.fixture()
def page(browser, server):
    with visitor_page(browser, server) as page:
        yield page


def shown(tokens) -> list[str]:
    """Answer tokens as the cards write them."""
    return ["∅" if t == "" else t.replace("\n", "↵") for t in tokens]


def token_texts(page, card: str) -> list[str]:
    """The token texts one answer card shows, from the DOM."""
    return page.locator(f"{card} .rag-tok-text").all_text_contents()


def plotted_z(page, elem_id: str) -> list[list[float]]:
    """The z matrix plotly drew in a gr.Plot."""
    return page.evaluate(f"() => document.querySelector('#{elem_id} .js-plotly-plot').data[0].z")


def page_ask(engine, question: str, kb: str):
    """What the Ask tab asks the engine with its default settings."""
    return engine.ask(question, kb=kb, k=5, index="flat", variants=("token", "sequence"), num_beams=1,
                      sequence_decoding="thorough", closed_book=True)


def assert_close(got, want, path="") -> None:
    """Nested JSON values equal, floats to 1e-4."""
    if isinstance(want, dict):
        assert set(got) == set(want), path
        for key in want:
            assert_close(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (a, b) in enumerate(zip(got, want)):
            assert_close(a, b, f"{path}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=1e-4), path
    else:
        assert got == want, path


def test_ask_shows_answer_passages_heatmaps_and_tooltips(page, ui_engine):
    question = QUESTIONS[1]
    field(page, "question").fill(question)
    page.locator("#ask-btn").click()
    tokens = page.locator("#answer .rag-card-token .rag-tok")
    expect(tokens.first).to_be_visible()
    expect(page.locator("#answer .rag-card-sequence .rag-tok").first).to_be_visible()
    expect(page.locator("#answer .rag-card-closed")).to_be_visible()
    expect(page.locator("#answer .rag-timings")).to_contain_text("generate")
    expect(page.locator("#passages .rag-passage")).to_have_count(5)
    for plot in ("doc-prob", "heat-token", "heat-seq", "gain"):
        expect(page.locator(f"#{plot} .main-svg").first).to_be_visible()
    expect(page.locator("#heat-token")).to_contain_text("RAG-Token")
    expect(page.locator("#heat-seq")).to_contain_text("RAG-Sequence")

    result = page_ask(ui_engine, question, KB_NAMES[0])
    assert token_texts(page, "#answer .rag-card-token") == shown(result.variants["token"].tokens)
    assert token_texts(page, "#answer .rag-card-sequence") == shown(result.variants["sequence"].tokens)
    assert token_texts(page, "#answer .rag-card-closed") == shown(result.closed_book.tokens)
    assert page.locator("#passages .rag-passage-title").all_text_contents() == [p.title for p in result.passages]
    for name, variant in result.variants.items():  # where each answer's words are, under its card
        kind, said = evidence(result, variant)
        if kind:
            expect(page.locator(f"#answer .rag-card-{name} .rag-evidence-{kind}")).to_have_text(said)
    for elem_id, name in (("heat-token", "token"), ("heat-seq", "sequence")):
        z = plotted_z(page, elem_id)  # (K, T): the posterior over passages for each answer token
        posteriors = result.variants[name].posteriors  # (T, K)
        assert [list(col) for col in zip(*z)] == [pytest.approx(row, abs=1e-5) for row in posteriors]
    page.wait_for_timeout(500)  # let plotly finish drawing before the screenshot
    shot(page, "ask")
    shot(page, "ask_full", full_page=True)

    tokens.first.hover()
    tip = tokens.first.locator(".rag-tip")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text("closed-book")
    first = result.variants["token"]
    expect(tip).to_contain_text(f"p = {fmt_prob(math.exp(first.token_logprobs[0]))} with passages")
    shot(page, "ask_tooltip")


def test_a_question_asked_while_another_runs_is_answered_under_its_own_text(page, ui_engine, monkeypatch):
    """Asked 0.8 s into a 2-second ask, the second question waits its turn: both are asked, in order, and
    the page ends on the second's answer, labelled with it."""
    import time

    asked = []
    ask = ui_engine.ask

    def slow_ask(question, **options):
        asked.append(question)
        time.sleep(2)
        return ask(question, **options)

    monkeypatch.setattr(ui_engine, "ask", slow_ask)
    first, second = QUESTIONS[0], QUESTIONS[2]
    field(page, "question").fill(first)
    page.locator("#ask-btn").click()
    page.wait_for_timeout(800)
    field(page, "question").fill(second)
    page.locator("#ask-btn").click()
    expect(page.locator("#answer .rag-question")).to_contain_text(second, timeout=TIMEOUT_MS)
    assert asked == [first, second] and field(page, "question").input_value() == second
    result = page_ask(ui_engine, second, KB_NAMES[0])
    expect(page.locator("#answer .rag-card-token .rag-tok").first).to_be_visible()
    assert token_texts(page, "#answer .rag-card-token") == shown(result.variants["token"].tokens)


def test_enter_in_the_question_box_asks(page):
    box = field(page, "question")
    box.fill(QUESTIONS[0])
    box.press("Enter")
    expect(page.locator("#answer .rag-card-token .rag-tok").first).to_be_visible()
    assert box.input_value() == QUESTIONS[0]  # asked, not a line break added


def focus_by_tab(page, selector: str, *, most: int = 6) -> None:
    """Press Tab until the focus is on `selector`; fail after `most` presses."""
    for _ in range(most):
        page.keyboard.press("Tab")
        if page.evaluate("(s) => document.activeElement.matches(s)", selector):
            return
    pytest.fail(f"{most} Tabs did not reach {selector}")


def test_a_keyboard_skips_from_the_ask_button_to_the_answer(page):
    link = page.locator("#skip-to-answer a.rag-skip")
    expect(link).to_have_count(1)
    assert link.bounding_box()["width"] <= 1  # out of sight until the keyboard reaches it
    page.locator("#ask-btn").focus()
    focus_by_tab(page, "a.rag-skip", most=3)
    assert link.bounding_box()["width"] > 40
    page.keyboard.press("Enter")  # no answer yet: the message box that says what to do
    assert page.evaluate("() => document.activeElement.id") == "ask-status"
    field(page, "question").fill(QUESTIONS[0])
    page.locator("#ask-btn").click()
    expect(page.locator("#answer .rag-card-token .rag-tok").first).to_be_visible()
    page.locator("#ask-btn").focus()
    focus_by_tab(page, "a.rag-skip", most=3)
    page.keyboard.press("Enter")
    assert page.evaluate("() => document.activeElement === document.querySelector('#answer .rag-tok')")
    assert link.bounding_box()["width"] <= 1


def test_example_click_asks(page, ui_engine):
    page.locator("#examples button").first.click()
    expect(page.locator("#answer .rag-tok").first).to_be_visible()
    assert field(page, "question").input_value() == QUESTIONS[0]
    result = page_ask(ui_engine, QUESTIONS[0], KB_NAMES[0])
    assert token_texts(page, "#answer .rag-card-token") == shown(result.variants["token"].tokens)


def test_extractive_checkbox_makes_answers_copy(page, ui_engine):
    # an engine without a lexical weight offers dense and BM25, not dense + BM25
    expect(page.locator("#retriever")).to_contain_text("BM25")
    expect(page.locator("#retriever")).not_to_contain_text("Dense + BM25")
    page.locator("#extractive input[type=checkbox]").check()
    field(page, "question").fill(QUESTIONS[2])
    page.locator("#ask-btn").click()
    expect(page.locator("#answer .rag-card-token")).to_contain_text("copying")
    result = ui_engine.ask(QUESTIONS[2], kb=KB_NAMES[0], k=5, variants=("token", "sequence"), closed_book=True, extractive=True)
    assert token_texts(page, "#answer .rag-card-token") == shown(result.variants["token"].tokens)
    assert token_texts(page, "#answer .rag-card-sequence") == shown(result.variants["sequence"].tokens)


def test_narrow_screen_brings_the_answer_into_view_and_stacks_the_heatmaps(browser, server):
    context = browser.new_context(viewport={"width": 420, "height": 900})
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(server)
        page.locator("#ask-btn").wait_for()
        assert page.evaluate("() => window.scrollY") == 0
        field(page, "question").fill(QUESTIONS[1])
        page.locator("#ask-btn").click()
        expect(page.locator("#answer .rag-card-closed")).to_be_visible()
        # the controls stack above the results on a phone; without scrolling the answer sat below the fold
        page.wait_for_function("() => { const r = document.getElementById('answer').getBoundingClientRect();"
                               " return window.scrollY > 0 && r.top < window.innerHeight && r.bottom > 0; }")
        expect(page.locator("#heat-seq .main-svg").first).to_be_visible()
        token_box, seq_box = page.locator("#heat-token").bounding_box(), page.locator("#heat-seq").bounding_box()
        assert seq_box["y"] >= token_box["y"] + token_box["height"] - 1  # one under the other, full width
        assert token_box["width"] > 300
        # the passages flow in the page, every one of them, instead of scrolling in a box of their own
        box = page.locator("#passages .html-container").evaluate(
            "node => [getComputedStyle(node).maxHeight, getComputedStyle(node).overflowY]")
        assert box == ["none", "visible"]
        page.wait_for_timeout(500)
        shot(page, "ask_narrow")
    finally:
        context.close()


def test_overlong_question_is_cut_with_a_notice(page):
    long_question = QUESTIONS[1] + " and" * 700  # 2,800+ characters
    field(page, "question").fill(long_question)
    assert field(page, "question").input_value() == long_question  # the box keeps the whole paste
    # said as soon as it is pasted, not only after the ask
    expect(page.locator("#ask-status")).to_contain_text(
        f"This question has {len(long_question):,} characters: only the last {LIMITS.max_question_chars:,} are read")
    page.locator("#ask-btn").click()
    expect(page.locator("#answer")).to_contain_text(f"cut to its last {LIMITS.max_question_chars:,} characters")
    assert field(page, "question").input_value().startswith(QUESTIONS[1])  # what the visitor typed stays
    # a paste longer than the engine accepts keeps its end, the question, for the refusal to name its length
    pasted = "A pasted text. " * 4000 + QUESTIONS[1]
    field(page, "question").fill(pasted)
    assert field(page, "question").input_value() == pasted
    expect(page.locator("#ask-status")).to_contain_text(  # said before the ask, not a promise to read the end
        f"This question has {len(pasted):,} characters: the limit is {LIMITS.max_input_chars:,}: shorten it to ask")
    page.locator("#ask-btn").click()
    expect(page.locator("#ask-status")).to_contain_text(
        f"the question has {len(pasted):,} characters; the limit is {LIMITS.max_input_chars:,}")
    assert field(page, "question").input_value() == pasted


def test_empty_question_shows_one_message(page):
    page.locator("#ask-btn").click()
    expect(page.locator("#ask-status")).to_contain_text("Type a question")
    assert page.locator("text=Traceback").count() == 0
    # the opening hint was in the same box: the error replaced it, so one message shows, not two
    assert page.locator(".rag-status:visible").count() == 1


def test_an_error_dims_the_earlier_answer_until_the_next_one(page):
    def opacity(selector: str) -> float:
        return float(page.locator(selector).evaluate("node => getComputedStyle(node).opacity"))

    field(page, "question").fill(QUESTIONS[0])
    page.locator("#ask-btn").click()
    expect(page.locator("#answer .rag-card-token .rag-tok").first).to_be_visible()
    assert opacity("#answer") == 1
    field(page, "question").fill("")
    page.locator("#ask-btn").click()
    expect(page.locator("#ask-status")).to_contain_text("Type a question")
    expect(page.locator("#answer .rag-card-token")).to_be_visible()  # kept, not wiped
    page.wait_for_function("getComputedStyle(document.querySelector('#answer')).opacity < 0.5")
    assert opacity("#passages") < 0.5
    field(page, "question").fill(QUESTIONS[0])
    page.locator("#ask-btn").click()
    expect(page.locator("#ask-status")).not_to_contain_text("Type a question")
    page.wait_for_function("getComputedStyle(document.querySelector('#answer')).opacity == 1")


def test_changing_an_option_marks_the_answer_on_screen_until_the_next_ask(page):
    stale = "document.documentElement.classList.contains('rag-ask-stale')"
    page.locator("#extractive input[type=checkbox]").click()  # before any answer: nothing to mark
    assert not page.evaluate(stale)
    field(page, "question").fill(QUESTIONS[0])
    page.locator("#ask-btn").click()
    expect(page.locator("#answer .rag-card-token .rag-tok").first).to_be_visible()
    page.locator("#kb input").click()  # a dropdown opened and left without a choice changes nothing
    page.locator("#answer").click()
    page.locator("#extractive input[type=checkbox]").click()
    page.locator("#extractive input[type=checkbox]").click()  # and an option set back is as it was
    page.wait_for_timeout(500)
    assert not page.evaluate(stale)
    page.locator("#extractive input[type=checkbox]").click()
    page.wait_for_function(stale)
    note = page.evaluate("getComputedStyle(document.querySelector('#answer'), '::before').content")
    assert "options changed after this answer was asked" in note
    assert float(page.locator("#passages").evaluate("node => getComputedStyle(node).opacity")) == 0.5
    field(page, "question").fill("  ")  # an empty ask asks nothing: the old answer stays marked
    page.locator("#ask-btn").click()
    expect(page.locator("#ask-status")).to_contain_text("Type a question")
    assert page.evaluate(stale)
    field(page, "question").fill(QUESTIONS[0])
    page.locator("#ask-btn").click()
    page.wait_for_function(f"!{stale}")


def test_swap_the_index_changes_the_answer(page, ui_engine):
    question = QUESTIONS[0]
    open_tab(page, "Swap the index")
    field(page, "swap-question").fill(question)
    page.locator("#swap-btn").click()
    left = page.locator("#swap-left-out .rag-answer-text").first
    right = page.locator("#swap-right-out .rag-answer-text").first
    expect(left).to_be_visible()
    expect(right).to_be_visible()
    shown_left = token_texts(page, "#swap-left-out .rag-card-token")
    shown_right = token_texts(page, "#swap-right-out .rag-card-token")
    assert shown_left != shown_right
    results = [ui_engine.ask(question, kb=kb, k=5, variants=("token",), closed_book=False) for kb in KB_NAMES]
    for result, got in zip(results, (shown_left, shown_right)):
        assert got == shown(result.variants["token"].tokens)
        expect(page.locator("#swap-summary")).to_contain_text(f"“{result.variants['token'].answer}”")
    expect(page.locator("#swap-summary")).to_contain_text(swap_verdict(*results))
    shot(page, "swap")


def test_html_in_passages_shows_as_text(page):
    open_tab(page, "Your knowledge")
    field(page, "mine-paste-title").fill(EVIL_TITLE)
    field(page, "mine-paste").fill(EVIL_TEXT)
    page.locator("#mine-build").click()
    expect(page.locator("#mine-status")).to_contain_text("Indexed 1 passage")
    expect(page.locator("#mine-preview")).to_contain_text("<script>window.__pwned=2</script>")
    expect(page.locator("#mine-preview")).to_contain_text(EVIL_TITLE)

    field(page, "mine-question").fill("What is the capital of Plutonia?")
    page.locator("#mine-ask").click()
    expect(page.locator("#mine-passages .rag-passage")).to_have_count(1)
    passages = page.locator("#mine-passages")
    expect(passages).to_contain_text("<img src=x onerror=window.__pwned=3>")
    expect(passages).to_contain_text("<b>not bold</b>")
    for scope in ("#mine-preview", "#mine-passages", "#mine-answer"):
        assert page.locator(f"{scope} img, {scope} script, {scope} b:text('not bold')").count() == 0
    assert page.evaluate("() => window.__pwned") is None
    shot(page, "mine_injection")

    # the private knowledge base is offered in the Ask tab too, and its figures escape titles
    open_tab(page, "Ask")
    page.locator("#kb input").click()
    page.get_by_role("option", name=PRIVATE_LABEL, exact=False).click()
    field(page, "question").fill("What is the capital of Plutonia?")
    page.locator("#ask-btn").click()
    expect(page.locator("#passages")).to_contain_text("<script>window.__pwned=2</script>")
    expect(page.locator("#doc-prob .main-svg").first).to_be_visible()
    page.wait_for_timeout(300)
    assert page.evaluate("() => window.__pwned") is None
    # a link cannot carry these passages: the link box says so, and names no knowledge base
    page.locator("#share-btn").click()
    expect(field(page, "share-link")).to_have_value(re.compile(r"\?tab=ask&q="))
    assert "kb=" not in field(page, "share-link").input_value()
    expect(page.locator("#share-link")).to_contain_text("lives in this browser tab only")


def expect_file_listed(page, name: str) -> None:
    # Once uploaded, gradio lists a file as stem and extension in two spans with a space between
    # them ("photo .txt"); while the upload runs it may show the plain name.
    stem, ext = name.rsplit(".", 1)
    expect(page.locator("#mine-files")).to_contain_text(re.compile(re.escape(stem) + r"\s*\." + re.escape(ext)))


def test_bad_upload_then_good_paste(page, tmp_path):
    blob = tmp_path / "photo.txt"
    blob.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    open_tab(page, "Your knowledge")
    page.locator("#mine-files input[type=file]").set_input_files(str(blob))
    expect_file_listed(page, "photo.txt")
    page.locator("#mine-build").click()
    expect(page.locator("#mine-status")).to_contain_text("binary")
    page.locator("#mine-files button[aria-label='Clear']").first.click()
    field(page, "mine-paste").fill("Quixel invented the hover bicycle in 2091 in the city of Glimmerton.")
    page.locator("#mine-build").click()
    expect(page.locator("#mine-status")).to_contain_text("Indexed 1 passage")


def test_edit_passage_and_reask(page, tmp_path):
    doc = tmp_path / "plutonia.md"
    doc.write_text("Zorblax is the capital of Plutonia, a city of glass domes.\n", encoding="utf-8")
    open_tab(page, "Your knowledge")
    expect(page.locator("#mine-save")).to_be_hidden()  # nothing to edit before a build
    page.locator("#mine-files input[type=file]").set_input_files(str(doc))
    expect_file_listed(page, "plutonia.md")
    page.locator("#mine-build").click()
    expect(page.locator("#mine-status")).to_contain_text("Indexed 1 passage")
    expect(page.locator("#mine-save")).to_be_visible()
    expect(field(page, "mine-edit-text")).to_have_value("Zorblax is the capital of Plutonia, a city of glass domes.")
    field(page, "mine-edit-text").fill("Glimmerton is the capital of Plutonia, a city of glass domes.")
    page.locator("#mine-save").click()
    expect(page.locator("#mine-status")).to_contain_text("Saved passage 1")
    field(page, "mine-question").fill("What is the capital of Plutonia?")
    page.locator("#mine-ask").click()
    expect(page.locator("#mine-passages")).to_contain_text("Glimmerton")
    shot(page, "mine")


def test_score_question_follows_each_ask_until_one_is_typed_there(page):
    def ask(question: str) -> None:
        open_tab(page, "Ask")
        field(page, "question").fill(question)
        page.locator("#ask-btn").click()
        expect(page.locator("#answer .rag-tok").first).to_be_visible()
        expect(page.locator("#answer")).to_contain_text(question)
        open_tab(page, "Score your answer")

    ask(QUESTIONS[0])
    expect(field(page, "score-question")).to_have_value(QUESTIONS[0])
    ask(QUESTIONS[1])
    expect(field(page, "score-question")).to_have_value(QUESTIONS[1])  # the last ask's, not the first's
    field(page, "score-question").fill("a question of my own")
    ask(QUESTIONS[2])
    page.wait_for_timeout(500)
    expect(field(page, "score-question")).to_have_value("a question of my own")


def test_score_index_and_learn_tabs(page, ui_engine):
    question = QUESTIONS[2]
    field(page, "question").fill(question)
    page.locator("#ask-btn").click()
    expect(page.locator("#answer .rag-tok").first).to_be_visible()
    result = page_ask(ui_engine, question, KB_NAMES[0])

    open_tab(page, "Learn")
    expect(page.locator("#learn-out")).to_contain_text("RAG-Token: each token")
    expect(page.locator("#learn-out table")).to_have_count(3)
    first_row = page.locator("#learn-out table").first.locator("tbody tr").first
    expect(first_row).to_contain_text(f"{result.passages[0].prob:.4f}")
    expect(page.locator("#learn-out")).to_contain_text(f"(engine: {fmt_log(result.variants['token'].logprob)})")
    shot(page, "learn")

    open_tab(page, "Score your answer")
    expect(field(page, "score-question")).to_have_value(question)  # carried over from the last ask
    field(page, "score-answer").fill("Germany")
    page.locator("#score-btn").click()
    expect(page.locator("#score-out")).to_contain_text("closed-book log p")
    scored = ui_engine.score(question, "Germany", kb=KB_NAMES[0], k=5)
    expect(page.locator("#score-out")).to_contain_text(f"log {fmt_log(scored.variants['token'].logprob)}")
    expect(page.locator("#score-heat-token .main-svg").first).to_be_visible()
    page.wait_for_timeout(300)
    shot(page, "score")

    open_tab(page, "Index variants")
    page.locator("#idx-btn").click()
    expect(page.locator("#idx-table tbody tr")).to_have_count(3)
    expect(page.locator("#idx-table tbody")).to_contain_text(f"{len(ui_engine.kbs[KB_NAMES[0]]):,}")
    expect(page.locator("#idx-plot .main-svg").first).to_be_visible()
    page.wait_for_timeout(300)
    shot(page, "index")

    open_tab(page, "Learn")
    glossary = page.locator("#glossary")
    expect(glossary.locator("dt")).to_have_count(0)  # folded until asked for
    glossary.get_by_text("Words used on this page").click()
    expect(glossary.locator("dt")).to_have_count(len(GLOSSARY))
    expect(glossary).to_contain_text("e ≈ 2.7 times as likely")


def test_ask_json_api(server, ui_engine):
    """`/ask_json` over HTTP returns the CLI's `--json` object, with consistent numbers."""
    from gradio_client import Client

    client = Client(server, verbose=False)
    data = client.predict(QUESTIONS[3], "both", 3, "hnsw", KB_NAMES[1], api_name="/ask_json")
    assert data["question"] == QUESTIONS[3] and data["kb"] == KB_NAMES[1]
    assert (data["k"], data["index"], len(data["passages"])) == (3, "hnsw", 3)
    assert set(data["variants"]) == {"token", "sequence"}
    assert set(data["timings_ms"]) >= {"encode", "search", "generate", "total"}
    probs = [p["prob"] for p in data["passages"]]
    assert sum(probs) == pytest.approx(1.0, abs=1e-5)
    logits = [data["scale"] * p["score"] for p in data["passages"]]
    assert probs == pytest.approx([math.exp(x - max(logits)) / sum(math.exp(y - max(logits)) for y in logits)
                                   for x in logits], abs=1e-5)
    for variant in data["variants"].values():
        assert all(sum(row) == pytest.approx(1.0, abs=1e-5) for row in variant["posteriors"])
        assert sum(variant["token_logprobs"]) == pytest.approx(variant["logprob"], abs=1e-4)
    token = data["variants"]["token"]  # RAG-Token: p(y_i|x,y<i) = sum_z p(z|x) p(y_i|x,z,y<i)
    for lp, row in zip(token["token_logprobs"], token["doc_token_logprobs"]):
        assert math.exp(lp) == pytest.approx(sum(p * math.exp(d) for p, d in zip(probs, row)), rel=1e-4)

    expected = ui_engine.ask(QUESTIONS[3], kb=KB_NAMES[1], k=3, index="hnsw", variants=("token", "sequence")).to_json()
    assert set(data) == set(expected)
    data.pop("timings_ms"), expected.pop("timings_ms")
    assert_close(data, expected)  # the same object `python -m rag_demo ask --json` prints

    with pytest.raises(Exception, match="the question is empty"):
        client.predict("  ", "both", 3, "flat", "", api_name="/ask_json")
    # the README's call: by name, the rest left to their defaults; switches as words
    named = client.predict(question=QUESTIONS[3], variant="token", k=3, kb=KB_NAMES[1], extractive="false",
                           memory="false", api_name="/ask_json")
    assert (named["k"], named["index"], named["memory_prob"], named["extractive"]) == (3, "flat", None, False)
    assert set(named["variants"]) == {"token"}
    with pytest.raises(Exception, match="extractive must be true, false or empty"):
        client.predict(question=QUESTIONS[3], extractive="no", api_name="/ask_json")
    with pytest.raises(Exception, match="k must be a whole number"):
        client.predict(question=QUESTIONS[3], k=2.5, api_name="/ask_json")
    # a plain HTTP call through the queue: an empty k is the default, as the README says of every value
    assert http_call(server, "ask_json", [QUESTIONS[3], "token", "", "", KB_NAMES[1], "", "", "false"])[1]["k"] == 5
    assert http_call(server, "compare_json", [QUESTIONS[3], KB_NAMES[1], ""])[0] == "complete"
    # too few values: what the endpoint takes, instead of gradio's null error
    event, error = http_call(server, "ask_json", [QUESTIONS[3]])
    assert event == "error" and error["error"] == ("/ask_json takes 8 values, in this order: question, variant, k, index, kb, "
                                                   "retriever, extractive, memory (empty for a default); the call sent 1")
    assert http_call(server, "compare_json", [])[1]["error"].startswith("/compare_json takes 3 values, in this order: "
                                                                        "question, kb, k")


def http_call(server: str, endpoint: str, values: list):
    """One call of `endpoint` as a plain HTTP client makes it (no gradio_client): its last event and that event's data."""
    import json
    import urllib.request

    post = urllib.request.Request(f"{server.rstrip('/')}/gradio_api/call/{endpoint}", method="POST",
                                  data=json.dumps({"data": values}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(post, timeout=60) as answer:
        event_id = json.load(answer)["event_id"]
    with urllib.request.urlopen(f"{server.rstrip('/')}/gradio_api/call/{endpoint}/{event_id}", timeout=120) as stream:
        lines = stream.read().decode().splitlines()
    event = [line[len("event: "):] for line in lines if line.startswith("event: ")][-1]
    data = json.loads([line[len("data: "):] for line in lines if line.startswith("data: ")][-1])
    return event, data[0] if event == "complete" else data


def test_api_names_a_kb_of_a_page_built_before_the_engine_was_ready(ui_engine):
    """The page's KB dropdowns get their choices in the browser; API calls must still accept KB names."""
    from gradio_client import Client

    release = threading.Event()
    engine = BackgroundEngine(lambda progress: (release.wait(30), ui_engine)[1]).start()
    demo = build_demo(engine)  # built while the engine starts: no KB names yet
    release.set()
    assert engine.wait(30)
    try:
        client = Client(launch(demo), verbose=False)
        kb = KB_NAMES[1]
        status, answer, *_ = client.predict(QUESTIONS[0], "token", 3, "flat", kb, 1, "thorough", api_name="/ask")
        direct = ui_engine.ask(QUESTIONS[0], kb=kb, k=3, variants=("token",))  # the engine's default retriever
        assert status == "" and f"knowledge base <b>{kb}</b>" in answer
        assert esc(direct.passages[0].title) in client.predict(QUESTIONS[0], "token", 3, "flat", kb, 1, "thorough",
                                                                   api_name="/ask")[2]
        status, cards, *_ = client.predict(QUESTIONS[0], "Paris", kb, 3, "flat", api_name="/score")
        assert status == "" and "Paris" in cards
        status, summary, *_ = client.predict(QUESTIONS[0], KB_NAMES[0], kb, "token", 3, api_name="/swap")
        assert status == "" and kb in summary
        status, table, _ = client.predict(kb, api_name="/index_reports")
        assert status == "" and "<b>hnsw</b>" in table
        status, *_ = client.predict(QUESTIONS[0], "token", 3, "flat", "not-a-kb", 1, "thorough", api_name="/ask")
        assert "unknown knowledge base &#x27;not-a-kb&#x27;" in status
    finally:
        demo.close()


def test_first_start_shows_progress_then_the_page_works(browser, ui_engine):
    release = threading.Event()

    def factory(progress):
        progress("building the nq-wiki index", 2, 5)
        release.wait(30)
        return ui_engine

    engine = BackgroundEngine(factory).start()
    demo = build_demo(engine)
    context = browser.new_context(viewport=VIEWPORT)
    try:
        url = launch(demo)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url)
        expect(page.locator("#status-banner")).to_contain_text("building the nq-wiki index (2/5")
        field(page, "question").fill(QUESTIONS[0])
        page.locator("#ask-btn").click()
        expect(page.locator("#ask-status")).to_contain_text("Preparing")
        shot(page, "preparing")
        release.set()
        expect(page.locator("#status-banner")).to_be_hidden()
        page.locator("#ask-btn").click()
        expect(page.locator("#answer .rag-tok").first).to_be_visible()
        result = page_ask(ui_engine, QUESTIONS[0], KB_NAMES[0])
        assert token_texts(page, "#answer .rag-card-token") == shown(result.variants["token"].tokens)
    finally:
        release.set()
        context.close()
        demo.close()


# ---- links, downloads, the gain chart of differing answers, readability -------------------------------

def open_page(browser, url: str, viewport: dict = VIEWPORT, **context_options):
    """A new page at `url` and its context; close the context when done."""
    context = browser.new_context(viewport=viewport, **context_options)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    page.locator("#ask-btn").wait_for(state="attached")  # a link may open another tab than Ask
    return context, page


def differing_question(engine) -> str:
    """A question of the test engine whose RAG-Token and RAG-Sequence answers differ on the first KB."""
    for question in QUESTIONS:
        result = page_ask(engine, question, KB_NAMES[0])
        if result.variants["token"].answer != result.variants["sequence"].answer:
            return question
    pytest.fail("the tiny engine's variants agree on every question: pick another seed")


def test_a_link_asks_on_load_and_copy_link_makes_one(browser, server, ui_engine):
    from urllib.parse import urlencode

    question, kb = QUESTIONS[1], KB_NAMES[1]
    query = urlencode({"q": question, "kb": kb, "variant": "token", "k": 3, "tab": "learn"})
    context, page = open_page(browser, f"{server}?{query}")
    try:
        # the Learn tab is open, and works through the answer the link asked for
        expect(page.get_by_role("tab", name="Learn")).to_have_attribute("aria-selected", "true")
        expect(page.locator("#learn-out")).to_contain_text("RAG-Token: each token")
        open_tab(page, "Ask")
        expect(page.locator("#answer .rag-card-token .rag-tok").first).to_be_visible()
        assert page.locator("#answer .rag-card-sequence").count() == 0  # ?variant=token
        expect(page.locator("#answer .rag-question")).to_contain_text(question)
        expect(page.locator("#answer .rag-kb")).to_contain_text(kb)
        result = ui_engine.ask(question, kb=kb, k=3, variants=("token",), closed_book=True)
        assert token_texts(page, "#answer .rag-card-token") == shown(result.variants["token"].tokens)
        assert page.locator("#passages .rag-passage-title").all_text_contents() == [p.title for p in result.passages]

        page.locator("#share-btn").click()
        link = field(page, "share-link")
        expect(link).to_have_value(re.compile(r"^http://127\.0\.0\.1:\d+/\?tab=ask&q="))
        copied = link.input_value()
        assert page.url == copied  # the address bar holds it too
        expect(page.locator("#share-link")).not_to_contain_text("browser tab only")  # a packaged base travels
    finally:
        context.close()

    # the copied link opens the same question and options in a new visitor's page
    context, page = open_page(browser, copied)
    try:
        expect(page.locator("#answer .rag-card-token .rag-tok").first).to_be_visible()
        expect(page.locator("#answer .rag-kb")).to_contain_text(kb)
        assert token_texts(page, "#answer .rag-card-token") == shown(result.variants["token"].tokens)
        assert page.locator("#answer .rag-card-sequence").count() == 0
    finally:
        context.close()

    # a link to the Swap tab with its two knowledge bases, in the other order than the page's
    query = urlencode({"q": QUESTIONS[0], "tab": "swap", "left": KB_NAMES[1], "right": KB_NAMES[0], "variant": "bogus"})
    context, page = open_page(browser, f"{server}?{query}")
    try:
        expect(page.locator("#swap-left-out .rag-card-token .rag-tok").first).to_be_visible()
        expect(page.locator("#swap-left-out .rag-swap-head")).to_contain_text(KB_NAMES[1])
        expect(page.locator("#swap-right-out .rag-swap-head")).to_contain_text(KB_NAMES[0])
        left = ui_engine.ask(QUESTIONS[0], kb=KB_NAMES[1], k=5, variants=("token",), closed_book=False)
        assert token_texts(page, "#swap-left-out .rag-card-token") == shown(left.variants["token"].tokens)
        open_tab(page, "Ask")
        expect(page.locator("#ask-status")).to_contain_text("variant 'bogus' is not one of")  # said, not an error
    finally:
        context.close()


def test_on_a_phone_a_links_answer_is_scrolled_into_view_and_a_plain_page_stays_at_the_top(browser, server):
    from urllib.parse import urlencode

    phone = {"width": 390, "height": 800}
    in_view = "(el) => { const r = el.getBoundingClientRect(); return r.top >= -2 && r.top < window.innerHeight / 2; }"
    for query, shown_at in ((urlencode({"q": QUESTIONS[1]}), "#answer"),
                            (urlencode({"q": QUESTIONS[0], "tab": "Swap the index"}), "#swap-summary")):
        context, page = open_page(browser, f"{server}?{query}", phone)
        try:
            expect(page.locator(f"{shown_at} .rag-tok, {shown_at}.rag-swap-summary, {shown_at} .rag-swap-summary")
                   .first).to_be_attached()
            page.wait_for_function(f"() => ({in_view})(document.querySelector('{shown_at}'))")
            assert page.evaluate("() => window.scrollY") > 300  # the controls stack above it
            if shown_at == "#answer":  # the sliders' ends stay on a phone, where gradio hides them
                expect(page.locator("#k .max_value")).to_be_visible()
                expect(page.locator("#beams .max_value")).to_have_text(str(LIMITS.max_beams))
        finally:
            context.close()
    context, page = open_page(browser, f"{server}?tab=learn", phone)  # no question: nothing to scroll to
    try:
        expect(page.get_by_role("tab", name="Learn")).to_have_attribute("aria-selected", "true")
        page.wait_for_timeout(1000)
        assert page.evaluate("() => window.scrollY") == 0
    finally:
        context.close()


def test_on_a_phone_the_index_charts_numbers_stay_full_size_and_the_table_shows_it_scrolls(browser, server):
    context, page = open_page(browser, server, {"width": 390, "height": 800})
    try:
        page.locator("#large-text input[type=checkbox]").check()
        open_tab(page, "Index variants")
        page.locator("#idx-btn").click()
        expect(page.locator("#idx-plot text.bartext")).to_have_count(9)
        # plotly shrinks a bar's number to fit over a narrow bar: side by side, a phone's were drawn at about 6 px
        heights = page.evaluate("() => [...document.querySelectorAll('#idx-plot text.bartext')].map("
                                "(t) => t.getBoundingClientRect().height / parseFloat(getComputedStyle(t).fontSize))")
        assert min(heights) > 0.9, heights
        edges = page.evaluate("() => { const plot = document.querySelector('#idx-plot').getBoundingClientRect();"
                              " return [...document.querySelectorAll('#idx-plot text.bartext')].map("
                              "(t) => t.getBoundingClientRect().right - plot.right); }")
        assert max(edges) <= 0, edges  # every number inside the chart, none cut at its edge
        scroller = page.locator("#idx-table .rag-table-scroll")
        assert scroller.evaluate("(el) => el.scrollWidth > el.clientWidth")  # too wide for a phone, so it scrolls ...
        layers = scroller.evaluate("(el) => getComputedStyle(el).backgroundImage.split('linear-gradient').length - 1")
        assert layers == 4  # ... under a shadow on the side that hides columns
    finally:
        context.close()


def test_on_a_phone_the_score_and_train_controls_take_a_line_each(browser, server):
    context, page = open_page(browser, server, {"width": 390, "height": 800})
    try:
        for tab, pairs in (("Score your answer", (("#score-question", "#score-answer"), ("#score-kb", "#score-k"))),
                           ("Train", (("#train-objective", "#train-questions"),))):
            open_tab(page, tab)
            for upper, lower in pairs:
                above, below = (page.locator(elem).first.bounding_box() for elem in (upper, lower))
                assert below["y"] >= above["y"] + above["height"] - 1, (upper, lower)  # one under the other
                assert min(above["width"], below["width"]) > 300, (upper, lower)  # each as wide as the screen allows
    finally:
        context.close()


def test_a_words_tokens_stay_on_one_line_at_any_width(browser):
    from rag_demo.results import VariantResult
    from rag_demo.ui.html import format_token_spans
    from rag_demo.ui.page import ASSETS

    tokens = (" Charles", " de", " Montes", "qu", "ieu", " was", " a", " philosopher", ".")
    n = len(tokens)
    variant = VariantResult("token", "".join(tokens), tokens, tuple(range(n)), -1.0, (-0.1,) * n, ((-0.1,),) * n,
                            ((1.0,),) * n, (-0.5,) * n)
    passage = RetrievedPassage(1, 0, "title", "text", 0.5, 1.0, 1.0)
    spans, css = format_token_spans(variant, (passage,)), (ASSETS / "style.css").read_text(encoding="utf-8")
    page = browser.new_page(viewport={"width": 400, "height": 300})
    try:
        for width in range(120, 330, 10):  # every place the line could break
            page.set_content(f"<style>{css}</style><div class='rag-answer-text' style='width:{width}px'>{spans}</div>")
            tops = page.evaluate("() => [...document.querySelectorAll('.rag-tok')].map("
                                 "(el) => Math.round(el.getBoundingClientRect().top))")
            assert len(set(tops[2:5])) == 1, (width, tops)  # “Montesquieu” whole
            assert len(set(tops)) > 1 or width > 300  # while the answer does wrap
    finally:
        page.close()


def test_a_chart_drawn_wide_fits_its_box_when_the_window_narrows_and_when_its_tab_opens_again(browser, server):
    overrun = ("(sel) => { const box = document.querySelector(sel), svg = box.querySelector('.main-svg');"
               " return svg.getBoundingClientRect().width - box.getBoundingClientRect().width; }")
    context, page = open_page(browser, server, {"width": 1280, "height": 900})
    try:
        field(page, "question").fill(QUESTIONS[0])
        page.locator("#ask-btn").click()
        expect(page.locator("#doc-prob .main-svg").first).to_be_visible()
        open_tab(page, "Index variants")
        page.locator("#idx-btn").click()
        expect(page.locator("#idx-plot .main-svg").first).to_be_visible()
        page.locator("#large-text input[type=checkbox]").check()
        page.set_viewport_size({"width": 390, "height": 900})  # a phone turned upright, a window narrowed
        page.wait_for_function(f"() => ({overrun})('#idx-plot') <= 1")
        open_tab(page, "Ask")  # its charts were drawn at 1280 px while the tab was hidden
        page.wait_for_function(f"() => ({overrun})('#doc-prob') <= 1")
    finally:
        context.close()


def test_large_text_shortens_passage_names_only_on_a_narrow_chart(browser, server):
    """A review found "#1 Pride a…" on a projector at 1280 px: a wide chart keeps the full names with Large text;
    a phone's narrow one takes the short ones, and gets the full ones back when it widens again."""
    labels = ("(sel) => { const chart = document.querySelector(sel + ' .js-plotly-plot');"
              " return JSON.stringify([chart.layout.yaxis.ticktext, chart.layout.meta.ticktext,"
              " chart.layout.meta.large_ticktext]); }")
    shows = lambda which: (f"() => {{ const [now, full, short] = JSON.parse(({labels})('#heat-token'));"  # noqa: E731
                           f" return JSON.stringify(now) === JSON.stringify({which}) && JSON.stringify(full) !== JSON.stringify(short); }}")
    context, page = open_page(browser, server, {"width": 1280, "height": 900})
    try:
        field(page, "question").fill(QUESTIONS[0])
        page.locator("#ask-btn").click()
        expect(page.locator("#heat-token .main-svg").first).to_be_visible()
        page.locator("#large-text input[type=checkbox]").check()
        page.wait_for_function("document.documentElement.classList.contains('rag-large')")
        page.wait_for_timeout(500)
        page.wait_for_function(shows("full"))
        page.set_viewport_size({"width": 390, "height": 900})
        page.wait_for_function(shows("short"))
        page.set_viewport_size({"width": 1280, "height": 900})
        page.wait_for_function(shows("full"))
    finally:
        context.close()


def test_the_answer_downloads_as_json_and_each_heatmap_as_csv(browser, server, ui_engine):
    import csv
    import io
    import json

    context, page = open_page(browser, server, accept_downloads=True)
    try:
        question = QUESTIONS[2]
        field(page, "question").fill(question)
        page.locator("#ask-btn").click()
        expect(page.locator("#download-json")).to_be_visible()
        with page.expect_download() as download:
            page.locator("#download-json").click()
        data = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
        expected = page_ask(ui_engine, question, KB_NAMES[0]).to_json()
        data.pop("timings_ms"), expected.pop("timings_ms")
        # the page's answer says too that memory could not be a source (its switch is on, the engine has no logit)
        assert data.pop("notices") == [*expected.pop("notices"), MEMORY_UNAVAILABLE]
        assert_close(data, expected)  # what /ask_json and `ask --json` give

        result = page_ask(ui_engine, question, KB_NAMES[0])
        for button, name in (("download-token-csv", "token"), ("download-seq-csv", "sequence")):
            with page.expect_download() as download:
                page.locator(f"#{button}").click()
            assert download.value.suggested_filename.endswith(".csv")
            rows = list(csv.reader(io.StringIO(Path(download.value.path()).read_text(encoding="utf-8"))))
            variant = result.variants[name]
            assert len(rows[0]) == 3 + len(variant.tokens)
            assert [row[0] for row in rows[1:]] == [f"#{p.rank}" for p in result.passages]
            assert [float(row[2]) for row in rows[1:]] == pytest.approx([p.prob for p in result.passages], abs=1e-6)
            matrix = [[float(x) for x in row[3:]] for row in rows[1:]]  # (K, T), as the heatmap draws it
            assert [list(col) for col in zip(*matrix)] == [pytest.approx(r, abs=1e-6) for r in variant.posteriors]
    finally:
        context.close()


def test_the_gain_chart_labels_each_variants_own_tokens_when_the_answers_differ(page, ui_engine):
    question = differing_question(ui_engine)
    result = page_ask(ui_engine, question, KB_NAMES[0])
    token, sequence = result.variants["token"], result.variants["sequence"]
    field(page, "question").fill(question)
    page.locator("#ask-btn").click()
    expect(page.locator("#gain .main-svg").first).to_be_visible()
    axes = page.evaluate("() => { const p = document.querySelector('#gain .js-plotly-plot');"
                         " return [p.layout.xaxis.ticktext, p.layout.xaxis2.ticktext,"
                         " p.data.map((trace) => trace.customdata.map((row) => row[0]))]; }")
    labels = [[esc(t.strip().replace("\n", "↵") or "↵" * t.count("\n") or "␣") for t in v.tokens] for v in (token, sequence)]
    assert axes[0] == labels[0] and axes[1] == labels[1]  # each panel's axis: its own answer's tokens
    assert axes[2] == labels  # and each line's hover
    # the page says so in words, with both answers
    note = page.locator("#answer .rag-disagree")
    expect(note).to_contain_text("RAG-Token and RAG-Sequence disagree")
    expect(note).to_contain_text(f"RAG-Token says “{token.answer}”, RAG-Sequence “{sequence.answer}”")
    # every chart is named by a sentence for a screen reader, not by its axes' numbers
    for chart in ("gain", "heat-token", "heat-seq", "doc-prob"):
        name = page.locator(f"#{chart}").get_attribute("aria-label") or ""
        assert name.endswith(".") and len(name) < 300 and re.search(r"[a-z]{4,}", name), (chart, name)
    expect(page.locator("#gain")).to_have_attribute("aria-label", re.compile("^Line chart of the retrieval gain"))
    page.wait_for_timeout(500)
    shot(page, "gain_differing", full_page=True)


def test_the_learn_tab_tables_scroll_on_a_phone(browser, server):
    context, page = open_page(browser, server, {"width": 420, "height": 900})
    try:
        field(page, "question").fill(QUESTIONS[1])
        page.locator("#ask-btn").click()
        expect(page.locator("#answer .rag-card-closed")).to_be_visible()
        open_tab(page, "Learn")
        boxes = page.locator("#learn-out .rag-table-scroll")
        expect(boxes).to_have_count(3)
        for i in range(3):
            box = boxes.nth(i)
            size = box.evaluate("(el) => ({client: el.clientWidth, scroll: el.scrollWidth,"
                                " right: el.getBoundingClientRect().right})")
            assert size["right"] <= 420  # the box fits the screen ...
            if size["scroll"] > size["client"]:  # ... and the table scrolls inside it to its last column
                box.evaluate("(el) => { el.scrollLeft = el.scrollWidth; }")
                last = box.locator("thead th").last.bounding_box()
                assert last["x"] + last["width"] <= 420 + 1
        assert boxes.first.evaluate("(el) => el.scrollWidth > el.clientWidth")  # 420 px is too narrow for step 1
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 420  # the page itself never scrolls sideways
        shot(page, "learn_narrow", full_page=True)
    finally:
        context.close()


# Every visible text outside the charts: its font size and its contrast against the colour behind it
# (WCAG's formula, semi-transparent layers blended), as a list of what falls short.
READABILITY_JS = """() => {
  const parse = (c) => { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const v = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number); return {r: v[0], g: v[1], b: v[2], a: v.length > 3 ? v[3] : 1}; };
  const channel = (x) => { x /= 255; return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4); };
  const lum = (c) => 0.2126 * channel(c.r) + 0.7152 * channel(c.g) + 0.0722 * channel(c.b);
  const blend = (top, a, under) => ({r: top.r * a + under.r * (1 - a), g: top.g * a + under.g * (1 - a), b: top.b * a + under.b * (1 - a)});
  const behind = (el) => { const layers = [];
    for (let e = el; e; e = e.parentElement) { const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0) { layers.push(c); if (c.a >= 1) break; } }
    return layers.reverse().reduce((under, c) => blend(c, c.a, under), {r: 255, g: 255, b: 255}); };
  const short = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!n.textContent.trim() || !el || el.closest('svg, .rag-tip, script, style, [aria-hidden=true]')) continue;
    const box = el.getBoundingClientRect(); const cs = getComputedStyle(el);
    if (box.width === 0 || box.height === 0 || cs.visibility === 'hidden') continue;
    let opacity = 1; for (let e = el; e; e = e.parentElement) opacity *= parseFloat(getComputedStyle(e).opacity);
    const fg = parse(cs.color); const bg = behind(el); const shown = blend(fg, fg.a * opacity, bg);
    const [hi, lo] = [lum(shown), lum(bg)].sort((a, b) => b - a); const ratio = (hi + 0.05) / (lo + 0.05);
    const size = parseFloat(cs.fontSize);
    if (size < 13.95 || ratio < 4.5) short.push(`${size}px ${ratio.toFixed(2)}:1 ${(el.closest('[id]') || {}).id}: ${n.textContent.trim().slice(0, 40)}`);
  }
  return short;
}"""


# the p(z|x) chart's title and first tick label font sizes (px) and its height
CHART_TEXT_SIZES_JS = """(() => {
  const chart = document.querySelector('#doc-prob .js-plotly-plot');
  const px = (sel) => parseFloat(chart.querySelector(sel).style.fontSize);
  const labels = Array.from(chart.querySelectorAll('.ytick text')).map((t) => t.textContent);
  return {title: px('.gtitle'), tick: px('.ytick text'), height: chart.getBoundingClientRect().height,
          letters: labels.join('').length};
})()"""


FONT_SIZE_JS = "(el) => parseFloat(getComputedStyle(el).fontSize)"


def assert_readable(page, where: str) -> None:
    """Every text on the page at 14 px or more and 4.5:1; a control dimmed for a moment while a tab opens is given
    two seconds to settle before what stays short is reported."""
    try:
        page.wait_for_function(f"() => ({READABILITY_JS})().length === 0", timeout=2000)
    except Exception:  # playwright's timeout: say which texts fall short
        assert page.evaluate(READABILITY_JS) == [], where


def chart_text_sizes(page) -> dict:
    return page.evaluate(CHART_TEXT_SIZES_JS)


@pytest.mark.parametrize("width", [1280, 800, 420])
def test_every_text_is_14px_and_4_5_to_1_and_large_text_grows_it(browser, server, ui_engine, width):
    context, page = open_page(browser, server, {"width": width, "height": 900})
    try:
        field(page, "question").fill(QUESTIONS[1])
        page.locator("#ask-btn").click()
        expect(page.locator("#answer .rag-card-closed")).to_be_visible()
        expect(page.locator("#passages .rag-passage")).to_have_count(5)
        expect(page.locator(".progress-bar")).to_have_count(0)
        page.wait_for_timeout(500)  # the last answer's dimming fades out in 0.2 s
        assert_readable(page, "Ask")
        for tab in ("Swap the index", "Your knowledge", "Score your answer", "Index variants", "Learn"):
            open_tab(page, tab)
            assert_readable(page, tab)
        open_tab(page, "Ask")
        # the radio groups are named by their labels; the answer's tokens have a role
        expect(page.get_by_role("radiogroup", name="RAG variant")).to_be_visible()
        expect(page.get_by_role("radiogroup", name="RAG-Sequence decoding")).to_be_visible()
        assert page.locator("#answer .rag-tok[role=img][aria-label]").count() == page.locator("#answer .rag-tok").count()
        grown_texts = (page.locator("#answer .rag-legend").first, field(page, "question"), page.locator("#ask-btn"))
        before = [text.evaluate(FONT_SIZE_JS) for text in grown_texts]
        chart_before = chart_text_sizes(page)
        page.locator("#large-text input[type=checkbox]").check()
        # the answer's legend, the question box and a button: each grows
        after = [text.evaluate(FONT_SIZE_JS) for text in grown_texts]
        assert all(large >= 1.2 * small for small, large in zip(before, after)), (before, after)
        for button in ("#share-btn", "#swap-share-btn"):  # "Copy link" on one line beside the larger Ask
            lines = page.locator(button).evaluate("(el) => { const range = document.createRange();"
                                                  " range.selectNodeContents(el); return new Set([...range.getClientRects()]"
                                                  ".filter((r) => r.width > 0).map((r) => Math.round(r.top))).size; }")
            assert lines <= 1, (button, lines)
        # the charts' own text grows with it, and shrinks back
        page.wait_for_function(f"() => {CHART_TEXT_SIZES_JS}['title'] >= 1.2 * {chart_before['title']}")
        grown = chart_text_sizes(page)
        assert grown["tick"] >= 1.2 * chart_before["tick"] and grown["height"] > chart_before["height"]
        assert grown["letters"] < chart_before["letters"]  # shorter passage names leave the bars their room
        # a chart drawn while it is on is drawn large too
        field(page, "question").fill(QUESTIONS[0])
        page.locator("#ask-btn").click()
        expect(page.locator(".progress-bar")).to_have_count(0)
        page.wait_for_function(f"() => {CHART_TEXT_SIZES_JS}['title'] >= 1.2 * {chart_before['title']}")
        page.locator("#large-text input[type=checkbox]").uncheck()
        page.wait_for_function(f"() => {CHART_TEXT_SIZES_JS}['title'] === {chart_before['title']}")
        assert chart_text_sizes(page)["tick"] == chart_before["tick"]
        full = chart_text_sizes(page)["letters"]
        page.locator("#large-text input[type=checkbox]").check()
        page.wait_for_function(f"() => {CHART_TEXT_SIZES_JS}['letters'] < {full}")  # short again, and back:
        page.locator("#large-text input[type=checkbox]").uncheck()
        page.wait_for_function(f"() => {CHART_TEXT_SIZES_JS}['letters'] === {full}")
    finally:
        context.close()

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
from rag_demo.ui import build_demo, launch_options
from rag_demo.ui.actions import PRIVATE_LABEL
from rag_demo.ui.html import esc, fmt_log, fmt_prob, swap_verdict
from rag_demo.ui.learn import GLOSSARY
from tests.ui_engine import KB_NAMES, QUESTIONS

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("one_torch_thread")]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
VIEWPORT = {"width": 1280, "height": 720}
TIMEOUT_MS = 60_000  # generous: the page answers in about a second, but a shared CI machine may be busy
EVIL_TITLE = "<img src=x onerror=window.__pwned=1>Evil title"
EVIL_TEXT = ("Zorblax is the capital of Plutonia. <script>window.__pwned=2</script> "
             "<img src=x onerror=window.__pwned=3> <b>not bold</b>")


def launch(demo):
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True,
                            ssr_mode=False, **launch_options())
    return url


@pytest.fixture(scope="module")
def server(ui_engine):
    demo = build_demo(ui_engine)
    try:
        yield launch(demo)
    finally:
        demo.close()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing; install it with `apt-get update && apt-get install -y chromium`")
    sync_api = pytest.importorskip("playwright.sync_api")
    sync_api.expect.set_options(timeout=TIMEOUT_MS)
    playwright = sync_api.sync_playwright().start()
    chromium = None
    try:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
    finally:
        if chromium is not None:
            chromium.close()
        playwright.stop()


@pytest.fixture()
def page(browser, server):
    context = browser.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(server)
        page.locator("#ask-btn").wait_for()
        yield page
    finally:
        context.close()


def expect(locator):
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


def field(page, elem_id: str):
    """The text input inside a gradio Textbox."""
    return page.locator(f"#{elem_id}").locator("textarea, input").first


def shot(page, name: str, *, full_page: bool = False) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


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
        page.wait_for_timeout(500)
        shot(page, "ask_narrow")
    finally:
        context.close()


def test_overlong_question_is_cut_with_a_notice(page):
    long_question = QUESTIONS[1] + " and" * 700  # 2,800+ characters
    field(page, "question").fill(long_question)
    assert len(field(page, "question").input_value()) > LIMITS.max_question_chars  # the box lets the engine see it
    page.locator("#ask-btn").click()
    expect(page.locator("#answer")).to_contain_text(f"cut to its first {LIMITS.max_question_chars} characters")
    assert field(page, "question").input_value().startswith(QUESTIONS[1])  # what the visitor typed stays


def test_empty_question_shows_message(page):
    page.locator("#ask-btn").click()
    expect(page.locator("#ask-status")).to_contain_text("Type a question")
    assert page.locator("text=Traceback").count() == 0


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
    page.locator("#mine-files input[type=file]").set_input_files(str(doc))
    expect_file_listed(page, "plutonia.md")
    page.locator("#mine-build").click()
    expect(page.locator("#mine-status")).to_contain_text("Indexed 1 passage")
    expect(field(page, "mine-edit-text")).to_have_value("Zorblax is the capital of Plutonia, a city of glass domes.")
    field(page, "mine-edit-text").fill("Glimmerton is the capital of Plutonia, a city of glass domes.")
    page.locator("#mine-save").click()
    expect(page.locator("#mine-status")).to_contain_text("Saved passage 1")
    field(page, "mine-question").fill("What is the capital of Plutonia?")
    page.locator("#mine-ask").click()
    expect(page.locator("#mine-passages")).to_contain_text("Glimmerton")
    shot(page, "mine")


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

    with pytest.raises(Exception, match="Type a question"):
        client.predict("  ", "both", 3, "flat", "", api_name="/ask_json")


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

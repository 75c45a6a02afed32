"""The page in a real Chromium (Debian's /usr/bin/chromium; never `playwright install`).

Run: pytest -m browser. Screenshots at 1280x720 land in artifacts/ (gitignored).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rag_demo import ui
from tests.fake_engine import FakeEngine

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
VIEWPORT = {"width": 1280, "height": 720}
TIMEOUT_MS = 30_000
EVIL_TITLE = "<img src=x onerror=window.__pwned=1>Evil title"
EVIL_TEXT = ("Zorblax is the capital of Plutonia. <script>window.__pwned=2</script> "
             "<img src=x onerror=window.__pwned=3> <b>not bold</b>")


@pytest.fixture(scope="module")
def ui_engine():
    """The engine behind the page. To test against the tiny real engine, return it here instead."""
    return FakeEngine()


def launch(demo):
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True,
                            ssr_mode=False, **ui.launch_options())
    return url


@pytest.fixture(scope="module")
def server(ui_engine):
    demo = ui.build_demo(ui_engine)
    try:
        yield launch(demo)
    finally:
        demo.close()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing; install it with `apt-get update && apt-get install -y chromium`")
    sync_api = pytest.importorskip("playwright.sync_api")
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


def test_ask_shows_answer_passages_heatmaps_and_tooltips(page):
    field(page, "question").fill("Who wrote A Farewell to Arms?")
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
    page.wait_for_timeout(500)  # let plotly finish drawing before the screenshot
    shot(page, "ask")
    shot(page, "ask_full", full_page=True)

    tokens.first.hover()
    tip = tokens.first.locator(".rag-tip")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text("closed-book")
    shot(page, "ask_tooltip")


def test_example_click_asks(page):
    page.locator("#examples button").first.click()
    expect(page.locator("#answer .rag-tok").first).to_be_visible()
    assert field(page, "question").input_value()


def test_empty_question_shows_message(page):
    page.locator("#ask-btn").click()
    expect(page.locator("#ask-status")).to_contain_text("Type a question")
    assert page.locator("text=Traceback").count() == 0


def test_swap_the_index_changes_the_answer(page, ui_engine):
    open_tab(page, "Swap the index")
    field(page, "swap-question").fill("What is the capital of France?")
    page.locator("#swap-btn").click()
    left = page.locator("#swap-left-out .rag-answer-text").first
    right = page.locator("#swap-right-out .rag-answer-text").first
    expect(left).to_be_visible()
    expect(right).to_be_visible()
    assert left.inner_text().strip() != right.inner_text().strip()
    expect(page.locator("#swap-summary")).to_contain_text("follows the index")
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
    page.get_by_role("option", name=ui.PRIVATE_LABEL, exact=False).click()
    field(page, "question").fill("What is the capital of Plutonia?")
    page.locator("#ask-btn").click()
    expect(page.locator("#passages")).to_contain_text("<script>window.__pwned=2</script>")
    expect(page.locator("#doc-prob .main-svg").first).to_be_visible()
    page.wait_for_timeout(300)
    assert page.evaluate("() => window.__pwned") is None


def test_bad_upload_then_good_paste(page, tmp_path):
    blob = tmp_path / "photo.txt"
    blob.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    open_tab(page, "Your knowledge")
    page.locator("#mine-files input[type=file]").set_input_files(str(blob))
    expect(page.locator("#mine-files")).to_contain_text("photo.txt")
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
    expect(page.locator("#mine-files")).to_contain_text("plutonia.md")
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


def test_score_index_and_learn_tabs(page):
    field(page, "question").fill("Who won the 2018 FIFA World Cup?")
    page.locator("#ask-btn").click()
    expect(page.locator("#answer .rag-tok").first).to_be_visible()

    open_tab(page, "Learn")
    expect(page.locator("#learn-out")).to_contain_text("RAG-Token: each token")
    expect(page.locator("#learn-out table")).to_have_count(3)
    shot(page, "learn")

    open_tab(page, "Score your answer")
    field(page, "score-question").fill("Who won the 2018 FIFA World Cup?")
    field(page, "score-answer").fill("Germany")
    page.locator("#score-btn").click()
    expect(page.locator("#score-out")).to_contain_text("closed-book log p")
    expect(page.locator("#score-heat-token .main-svg").first).to_be_visible()
    page.wait_for_timeout(300)
    shot(page, "score")

    open_tab(page, "Index variants")
    page.locator("#idx-btn").click()
    expect(page.locator("#idx-table tbody tr")).to_have_count(3)
    expect(page.locator("#idx-plot .main-svg").first).to_be_visible()
    page.wait_for_timeout(300)
    shot(page, "index")


def test_ask_json_api(server):
    from gradio_client import Client

    client = Client(server, verbose=False)
    data = client.predict("What is the capital of France?", "both", 3, "flat", "", api_name="/ask_json")
    assert set(data["variants"]) == {"token", "sequence"} and len(data["passages"]) == 3
    assert set(data["timings_ms"]) >= {"encode", "search", "generate", "total"}


def test_first_start_shows_progress_then_the_page_works(browser):
    release = threading.Event()

    def factory(progress):
        progress("building the nq-wiki index", 2, 5)
        release.wait(30)
        return FakeEngine()

    engine = ui.BackgroundEngine(factory).start()
    demo = ui.build_demo(engine)
    context = browser.new_context(viewport=VIEWPORT)
    try:
        url = launch(demo)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url)
        expect(page.locator("#status-banner")).to_contain_text("building the nq-wiki index (2/5")
        field(page, "question").fill("What is the capital of France?")
        page.locator("#ask-btn").click()
        expect(page.locator("#ask-status")).to_contain_text("Preparing")
        shot(page, "preparing")
        release.set()
        expect(page.locator("#status-banner")).to_be_hidden()
        page.locator("#ask-btn").click()
        expect(page.locator("#answer .rag-tok").first).to_be_visible()
    finally:
        release.set()
        context.close()
        demo.close()


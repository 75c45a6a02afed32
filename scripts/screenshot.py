"""Screenshots of the demo for the README: the real app on the offline default, in Debian's Chromium.

    python scripts/screenshot.py                     # docs/screenshot-ask.png, docs/screenshot-swap.png
    python scripts/screenshot.py --question "who sings what you want do for love?" --out /tmp/shots

Starts `app.create_demo()` on 127.0.0.1 (a first start answers within minutes and builds the rest
in about 15), waits until the complete engine serves (the banner goes), clicks an example question in the Ask tab (variant "both"),
asks it once more so the timings shown are a warm engine's, then clicks the Swap tab's first example
(a question whose answer the counterfactual twin swapped; the same question where it has none), and saves full-page PNGs 1280 px wide (reduced to a 256-colour palette if one is over
380 KB). Then it opens a link to the Ask tab's second example (one where RAG-Token and RAG-Sequence
disagree, when the examples hold one) at each of `--widths` and saves docs/screenshot-<width>.png:
the page as a projector (1280), a tablet (800) and a phone (420) show it.
Never runs `playwright install`: it drives /usr/bin/chromium (`apt-get install chromium`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

log = logging.getLogger("rag_demo.screenshot")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 720}
DEFAULT_QUESTION = "which planet is the farthest from the sun?"
MAX_BYTES = 380_000  # README images stay small


def shrink_png(path: Path, max_bytes: int = MAX_BYTES) -> int:
    """Re-save `path` losslessly optimized; past `max_bytes`, with a 256-colour palette. Returns the size in bytes."""
    from PIL import Image

    with Image.open(path) as image:
        image = image.convert("RGB")
    image.save(path, optimize=True)
    if path.stat().st_size > max_bytes:
        image.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(path, optimize=True)
    return path.stat().st_size


def ask_example(page, question: str) -> str:
    """Click the example button that reads `question` (else the first example); returns the question asked."""
    examples = page.locator("#examples button")
    examples.first.wait_for()
    wanted = examples.filter(has_text=question)
    button = wanted.first if wanted.count() else examples.first
    asked = button.inner_text().strip()
    button.click()
    return asked


def take(page, path: Path) -> None:
    page.wait_for_timeout(800)  # plotly's last layout pass
    page.screenshot(path=str(path), full_page=True)
    log.info("saved %s (%d KB)", path, shrink_png(path) // 1024)


def linked_shots(browser, url: str, question: str, out: Path, widths: list[int]) -> list[Path]:
    """The Ask tab opened by a link to `question` at each width, full page."""
    from urllib.parse import urlencode

    from playwright.sync_api import expect

    saved = []
    for width in widths:
        page = browser.new_page(viewport={"width": width, "height": 900})
        page.set_default_timeout(120_000)
        page.goto(f"{url}?{urlencode({'q': question})}")
        expect(page.locator("#answer .rag-card-token .rag-tok").first).to_be_visible()
        for plot in ("doc-prob", "heat-token", "heat-seq", "gain"):
            expect(page.locator(f"#{plot} .main-svg").first).to_be_visible()
        page.evaluate("() => window.scrollTo(0, 0)")
        saved.append(out / f"screenshot-{width}.png")
        take(page, saved[-1])
        page.close()
    return saved


def run(out: Path, question: str, ready_timeout_s: float, widths: list[int] = ()) -> list[Path]:
    from playwright.sync_api import expect, sync_playwright

    import app
    from rag_demo.serving.background import BackgroundEngine
    from rag_demo.ui import build_demo, launch_options

    out.mkdir(parents=True, exist_ok=True)
    engine = BackgroundEngine(app.default_engines).start()
    demo = build_demo(engine)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True,
                            ssr_mode=False, **launch_options())
    saved = []
    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(120_000)
        expect.set_options(timeout=120_000)
        page.goto(url)
        log.info("waiting for the engine (a first start builds the caches)")
        page.locator("#status-banner .rag-status").first.wait_for(state="hidden", timeout=ready_timeout_s * 1000)
        engine.wait(ready_timeout_s)  # the example check and warm-up after it, so no ask shown shares the cores

        asked = ask_example(page, question)
        log.info("asking %r", asked)
        expect(page.locator("#answer .rag-card-token .rag-tok").first).to_be_visible()
        # Ask again: the first answer pays one-time costs (the index, the few-shot cache) in its timings.
        first = page.locator("#answer .rag-timings").text_content()
        page.locator("#ask-btn").click()
        # while it runs the old answer stays in the page, hidden under the progress bar
        page.wait_for_function("t => document.querySelector('#answer .rag-timings')?.textContent !== t"
                               " && !document.querySelector('#answer .progress-bar')", arg=first)
        for plot in ("doc-prob", "heat-token", "heat-seq", "gain"):
            expect(page.locator(f"#{plot} .main-svg").first).to_be_visible()
        saved.append(out / "screenshot-ask.png")
        take(page, saved[-1])

        page.get_by_role("tab", name="Swap the index").click()
        # the Swap tab's own first example: a question whose answer the counterfactual twin swapped
        swap_example = page.locator("#swap-examples button").first
        if swap_example.count():
            swap_example.click()
        else:
            page.locator("#swap-question textarea").fill(asked)
            page.locator("#swap-btn").click()
        expect(page.locator("#swap-right-out .rag-answer-text").first).to_be_visible()
        expect(page.locator("#swap-summary")).to_contain_text("→")
        saved.append(out / "screenshot-swap.png")
        take(page, saved[-1])
        # the engine's own list: the page's example buttons cut long questions short with "..."
        examples = engine.example_questions(None, 8)
        linked = examples[1] if len(examples) > 1 else asked
        log.info("linking to %r at widths %s", linked, widths)
        saved += linked_shots(browser, url, linked, out, list(widths))
        browser.close()
    finally:
        playwright.stop()
        demo.close()
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the PNGs (default: docs/)")
    parser.add_argument("--question", default=DEFAULT_QUESTION, help="the example to click (else the first example)")
    parser.add_argument("--ready-timeout", type=float, default=3600, help="seconds to wait for the engine")
    parser.add_argument("--widths", type=int, nargs="*", default=[1280, 800, 420],
                        help="screen widths of the linked Ask tab's screenshots (none: skip them)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not Path(CHROMIUM).exists():
        log.error("%s is missing; install it with `apt-get install -y chromium`", CHROMIUM)
        return 2
    run(args.out, args.question, args.ready_timeout, args.widths)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The demo's page in a real Chromium, as the browser tests drive it: the app on 127.0.0.1, a visitor's page of it,
and the look-ups the tests share. The `browser` fixture itself is in conftest.py."""

from __future__ import annotations

import contextlib
from pathlib import Path

from rag_demo.ui import launch_options

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
VIEWPORT = {"width": 1280, "height": 720}
TIMEOUT_MS = 60_000  # generous: the page answers in about a second, but a shared CI machine may be busy


def launch(demo):
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True,
                            ssr_mode=False, **launch_options())
    return url


@contextlib.contextmanager
def visitor_page(browser, url: str):
    """A new visitor's page of the demo at `url` (a context of its own: its own gradio session), once it has loaded."""
    context = browser.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url)
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

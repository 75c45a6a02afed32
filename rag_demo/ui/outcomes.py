"""What an event hands the page besides the engine's answer: a failure as a message (never a traceback), a
chart's update with its accessible name, the notes an answer gains on the page, an API endpoint's JSON or error,
and gradio's progress bar as the engine's `progress(stage, done, total)`.

The events themselves are rag_demo.ui.actions; each ends in one of these.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import gradio as gr

from ..config import DEFAULT_KBS
from ..errors import RagDemoError
from ..progress import Progress
from ..results import AskResult
from ..serving.interface import EngineNotReady
from .html import MEMORY_UNAVAILABLE, MEMORY_UNAVAILABLE_OWN_KB, MEMORY_UNAVAILABLE_TRAINED, format_status

log = logging.getLogger(__name__)


def failure_status(err: Exception) -> str:
    """The message box for an exception raised inside an event. Never a traceback."""
    if isinstance(err, EngineNotReady):
        return format_status(str(err), "wait")
    if isinstance(err, RagDemoError):
        return format_status(str(err))
    log.exception("unexpected error in a UI event", exc_info=err)
    return format_status(f"Something went wrong inside the demo ({type(err).__name__}). "
                         "The server log has the details; try another question or setting.")


def plot_update(figure: Any, description: str = "") -> dict:
    """A chart's new figure; `description`, one sentence, becomes its label: a screen reader's name for
    the chart (the page's script copies it there, see scripts.LOAD_JS)."""
    if description:
        return gr.update(value=figure, visible=figure is not None, label=description)
    return gr.update(value=figure, visible=figure is not None)


def noted_memory(result: AskResult, wanted: bool | None, *, trained: bool = False) -> AskResult:
    """The result, with a notice when memory was wanted where available (None) and this setup had none,
    so the visitor who left the switch on reads why no ∅ shows; `trained`: asked with a trained question encoder."""
    if wanted is None and result.memory_prob is None and result.passages:
        why = (MEMORY_UNAVAILABLE_TRAINED if trained and result.question_encoder
               else MEMORY_UNAVAILABLE_OWN_KB if result.kb not in DEFAULT_KBS else MEMORY_UNAVAILABLE)
        return replace(result, notices=(*result.notices, why))
    return result


def api_json(endpoint: str, call: Callable[[], Any]) -> dict:
    """`call()`'s result as JSON for an API endpoint; a user's error comes back as its message, anything
    else as a short message for the caller with the details in the server log."""
    try:
        result = call()
    except RagDemoError as err:
        raise gr.Error(str(err), print_exception=False) from None
    except Exception as err:  # the API boundary
        log.exception("unexpected error in %s", endpoint, exc_info=err)
        raise gr.Error(f"Something went wrong inside the demo ({type(err).__name__}); the server log has the details.",
                       print_exception=False) from None
    return result if isinstance(result, dict) else result.to_json()


def progress_reporter(progress: gr.Progress | None) -> Progress | None:
    """gradio's progress bar as the engine's `progress(stage, done, total)`; None without one."""
    if progress is None:
        return None

    def report(stage: str, done: int, total: int) -> None:
        progress((done, total) if total else None, desc=stage)

    return report


def part_of(report: Progress | None, part: int, parts: int, label: str) -> Progress | None:
    """`report` for the `part`-th of `parts` equal jobs: one bar across all of them, each stage labelled."""
    if report is None:
        return None

    def report_part(stage: str, done: int, total: int) -> None:
        report(f"{label}: {stage}", part * total + done, parts * total)

    return report_part

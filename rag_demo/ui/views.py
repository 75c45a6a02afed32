"""Each page event's outputs, by name, and the holder of per-visitor state.

An action returns one of these named tuples filled with values; the page builds the same tuple of its
components as the event's outputs, so a value can only land in the component of its name (see
rag_demo.ui.actions).
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeVar

import gradio as gr


class Held:
    """A `gr.State` payload. Gradio hashes state values to notice changes, and frozen results whose
    fields are dicts or arrays cannot be hashed; a holder hashes by identity, and every new answer
    or knowledge base is a new holder."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"Held({type(self.value).__name__})"


def unwrap(value: Any) -> Any:
    """The value inside a `Held` (plain values pass through, so tests may pass them directly)."""
    return value.value if isinstance(value, Held) else value


# ---- each event's outputs, by name ----------------------------------------------------------------


class AskView(NamedTuple):
    status: Any
    answer: Any
    passages: Any
    doc_prob: Any  # the p(z|x) bars
    heat_token: Any
    heat_seq: Any
    gain: Any
    question_encoder: Any  # the tab's choice of question encoder: back on the packaged one when the trained one is gone
    last: Any  # Held(AskResult): the answer the Learn and Score tabs work with


class ExportView(NamedTuple):
    """The Ask tab's downloads: the answer's JSON and each heatmap's CSV."""

    answer_json: Any
    token_csv: Any
    sequence_csv: Any


class LinkView(NamedTuple):
    """What a link (`?q=...`) sets when the page opens; `link` keeps it for the asks that follow."""

    tabs: Any
    status: Any  # the Ask tab's message box: what of the link was ignored
    question: Any
    variant: Any
    kb: Any
    k: Any
    index: Any
    retriever: Any
    memory: Any
    swap_question: Any
    swap_left: Any
    swap_right: Any
    swap_variant: Any
    swap_k: Any
    link: Any  # gr.State: the PageLink


class CompareView(NamedTuple):
    status: Any
    comparison: Any


class SwapView(NamedTuple):
    status: Any
    summary: Any
    left: Any
    right: Any
    question_encoder: Any  # as AskView's


class MineView(NamedTuple):
    """After building or editing a visitor's own knowledge base: the tab itself, and every tab's
    knowledge-base dropdown (`KB_MENUS`), which now offers it."""

    status: Any
    mine: Any  # Held(KnowledgeBase)
    picker: Any
    edit_title: Any
    edit_text: Any
    preview: Any
    ask_status: Any  # the ask box's message: an old "build first" error is cleared by a build
    editor: Any  # the passage editor's column: shown once there is a knowledge base to edit
    kb: Any
    swap_left: Any
    swap_right: Any
    score_kb: Any
    idx_kb: Any


class MineAnswerView(NamedTuple):
    status: Any
    answer: Any
    passages: Any


class PassageView(NamedTuple):
    title: Any
    text: Any


class ScoreView(NamedTuple):
    status: Any
    cards: Any
    heat_token: Any
    heat_seq: Any
    gain: Any
    question_encoder: Any  # as AskView's


class IndexView(NamedTuple):
    status: Any
    table: Any
    figure: Any


class LearnView(NamedTuple):
    token_picker: Any
    walkthrough: Any


class PollView(NamedTuple):
    """While the engine starts: the banner and the timer. Once it is ready: the choices the page
    could not know when it was built."""

    banner: Any
    timer: Any
    announced: Any  # gr.State: how many engines the page was told of (0: none yet)
    kb: Any
    swap_left: Any
    swap_right: Any
    score_kb: Any
    idx_kb: Any
    examples: Any
    swap_examples: Any
    retriever: Any
    memory: Any  # the memory switch: its help says whether this engine has a logit for it


View = TypeVar("View", bound=tuple)


def changed(view: type[View], **values: Any) -> View:
    """A `view` that sets only these outputs; the page keeps what the others show.

    >>> changed(CompareView, status="oops")
    CompareView(status='oops', comparison={'__type__': 'update'})
    """
    unchanged = {name: gr.skip() for name in view._fields if name not in values}
    return view(**unchanged, **values)

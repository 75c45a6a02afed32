"""The web demo. `build_demo(engine)` makes the page; `launch_options()` holds what gradio takes at launch.

    html.py     results -> HTML (pure; every string from outside is escaped there): the answer cards
    passage_cards.py  the passage cards, the retriever comparison's columns, one side of the swap
    index_table.py  the Index variants tab's table
    learn.py    the Learn tab's worked equations and the glossary
    inputs.py   page and API inputs -> engine arguments; visitors' uploads -> passages; links' queries
    exports.py  an answer's downloads (its JSON, each heatmap as CSV)
    sentences.py  what the page says about an answer in words (plain text)
    views.py    each event's outputs, by name
    actions.py  one method per page event, each output named
    page.py     the layout and its events
    train.py    the Train tab: end-to-end training of the question encoder, live

Only actions.py, views.py, page.py and train.py import gradio, and importing this package imports none of them: the two
names below load the page when first asked for.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_demo", "launch_options"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import page

        return getattr(page, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

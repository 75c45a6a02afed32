"""The Index variants tab's table: each index variant's build time, size, recall against exact search and
query time, side by side (HTML; every string from outside escaped)."""

from __future__ import annotations

from collections.abc import Sequence

from .. import plots
from ..progress import counted
from ..results import IndexReport
from .html import esc

BUILT_EARLIER = "*"
BUILT_EARLIER_NOTE = (f"{BUILT_EARLIER} built before this click (when the server started, or at an earlier comparison): "
                      "the time is that build's, not measured now.")
# below this many passages IVF-PQ trains fewer than 8 bits per code (`index_build.empty_index`): a small base shows
# none of what the approximate indexes are for
FEW_VECTORS = 256 * 39


def few_vectors_note(num_vectors: int) -> str:
    """What a comparison on a small base can and cannot show; '' from FEW_VECTORS passages on.

    >>> few_vectors_note(2)[:52], few_vectors_note(FEW_VECTORS)
    ('With 2 passages the approximate indexes have nothing', '')
    """
    if num_vectors >= FEW_VECTORS:
        return ""
    return (f"With {counted(num_vectors, 'passage')} the approximate indexes have nothing "
            "to save: exact search over so few takes well under a millisecond, IVF-PQ's codebooks can take more memory "
            "than the vectors they stand for, and recall on vectors this few says little of recall at scale. Compare "
            "them on a base of tens of thousands of passages or more.")


# the engine measures recall and query time once per knowledge base (`Retriever.index_reports`) and keeps them
MEASURED_ONCE_NOTE = ("Recall and query times are measured at the first comparison on a knowledge base and kept, so a "
                      "later click shows the same figures.")


def format_index_table(reports: Sequence[IndexReport], kb_name: str, *, click_seconds: float | None = None) -> str:
    """The index variants side by side. `click_seconds`, how long the click that asked took: a build time
    longer than that cannot have been measured in it, and is marked so."""
    if not reports:
        return '<div class="rag-empty">No index reports.</div>'

    def built(r: IndexReport) -> str:
        earlier = click_seconds is not None and r.build_seconds > click_seconds
        mark = f'<span title="{esc(BUILT_EARLIER_NOTE)}">{BUILT_EARLIER}</span>' if earlier else ""
        return f"{r.build_seconds:,.2f}{mark}"

    rows = "".join(
        f"<tr><td><b>{esc(r.kind)}</b></td><td>{built(r)}</td><td>{plots.megabytes(r.bytes)}</td>"
        f"<td>{r.recall_at_k:.3f}</td><td>{r.query_ms:,.3f}</td><td>{r.num_vectors:,}</td></tr>"
        for r in reports
    )
    k = reports[0].recall_k
    marked = click_seconds is not None and any(r.build_seconds > click_seconds for r in reports)
    took = "" if click_seconds is None else f" This comparison took {click_seconds:.2f} s."
    few = few_vectors_note(reports[0].num_vectors)
    note = (f'<p class="rag-legend rag-built-earlier">{esc(BUILT_EARLIER_NOTE) + " " if marked else ""}'
            f"{esc(MEASURED_ONCE_NOTE)}{took}</p>" + (f'<p class="rag-legend rag-few-vectors">{esc(few)}</p>' if few else ""))
    return (
        f'<div class="rag-table-scroll"><table class="rag-table"><caption>Index variants on <b>{esc(kb_name)}</b></caption>'
        f"<thead><tr><th>index</th><th>build (s)</th><th>memory (MB)</th><th>recall@{k} vs flat</th>"
        f"<th>query (ms)</th><th>vectors</th></tr></thead><tbody>{rows}</tbody></table></div>{note}"
    )

"""The web demo: `build_demo(engine) -> gr.Blocks`. The only module that imports gradio.

Three layers, each usable without the next:
- formatters: results -> HTML strings (pure; every user/passage/token string is escaped here);
- `DemoActions`: one method per event; parses inputs, makes one engine call, formats, returns;
- `build_demo`: lays the page out and wires events to `DemoActions`.

The engine is shared read-only; each visitor's private knowledge base and last answer live
in `gr.State`. All events that touch the engine share one concurrency group of size 1, so two
visitors never interleave inside it. A visitor's uploaded files are moved out of gradio's shared
upload folder into a folder of their own session, deleted when the session ends.
"""

from __future__ import annotations

import csv
import hashlib
import html
import json
import logging
import math
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import gradio as gr

from . import heap, plots
from .config import BM25_SCALE, INDEX_KINDS, LIMITS
from .corpus import SOURCE_SUFFIXES, KnowledgeBase, Passage, read_document_file, split_into_passages
from .errors import InputError, RagDemoError
from .evaluate import contains_answer
from .progress import counted, eta_text
from .results import AskResult, ClosedBookResult, IndexReport, RetrievedPassage, RetrieverComparison, RetrieverRanking, VariantResult
from .text import check_length, plain_text

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent.parent / "assets"
PRIVATE_KB = "__mine__"  # the dropdown value that means "this visitor's own knowledge base"
PRIVATE_LABEL = "my knowledge (this session)"
PRIVATE_NAME = "my knowledge"  # as the dropdown calls it
VARIANT_CHOICES = [("Token", "token"), ("Sequence", "sequence"), ("Both", "both")]
INDEX_LABELS = {"flat": "Flat (exact)", "hnsw": "HNSW (graph)", "ivfpq": "IVF-PQ (compressed)"}
INDEX_CHOICES = [(INDEX_LABELS.get(kind, kind), kind) for kind in INDEX_KINDS]
DECODING_CHOICES = [("thorough", "thorough"), ("fast", "fast")]
RETRIEVER_NAMES = {"dense": "Dense (the paper)", "bm25": "BM25", "hybrid": "Dense + BM25"}
RETRIEVER_CHOICES = [(label, name) for name, label in RETRIEVER_NAMES.items()]
PARAMETRIC_P = 0.5  # closed-book p at or above which a token is marked as coming from parametric memory
ENGINE_GROUP = "engine"  # concurrency id shared by every event that calls the engine
TIMING_ORDER = ("encode", "search", "generate", "total")
STATE_TTL_S = 2 * 3600  # a visitor's knowledge base and last answer are dropped 2 h after their last change

ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True)
class UploadLimits:
    max_files: int = 5
    max_file_bytes: int = 2_000_000
    max_passages: int = 2_000
    max_paste_chars: int = 200_000

    def describe(self) -> str:
        return (
            f"Up to {self.max_files} files ({', '.join(SOURCE_SUFFIXES)}), {self.max_file_bytes / 1e6:g} MB each, "
            f"and {self.max_passages:,} passages of 100 words in all; .jsonl rows and .csv columns: "
            "'text' and optionally 'title'. Files are read and indexed in memory for this browser tab only; "
            "uploads are deleted from the server when the tab is closed."
        )


class Engine(Protocol):
    """What the UI needs from `rag_demo.engine.RagEngine`."""

    @property
    def kb_names(self) -> tuple[str, ...]: ...

    @property
    def default_kb(self) -> str: ...

    @property
    def lexical_weight(self) -> float: ...  # BM25's weight for hybrid retrieval; 0: no hybrid

    @property
    def retrievers(self) -> tuple[str, ...]: ...  # those it offers: dense and bm25, and hybrid with a lexical weight

    def ask(self, question: str, *, kb: str | KnowledgeBase, k: int = 5, index: str = "flat",
            variants: tuple[str, ...] = ("token", "sequence"), num_beams: int = 1,
            sequence_decoding: str = "thorough", max_new_tokens: int = 16, closed_book: bool = True,
            retriever: str | None = None, extractive: bool | None = None, progress: ProgressFn | None = None) -> AskResult: ...

    def score(self, question: str, answer: str, *, kb: str | KnowledgeBase, k: int = 5, index: str = "flat",
              variants: tuple[str, ...] = ("token", "sequence"), retriever: str | None = None,
              progress: ProgressFn | None = None) -> AskResult: ...

    def compare_retrievers(self, question: str, *, kb: str | KnowledgeBase, k: int = 5) -> RetrieverComparison: ...

    def index_reports(self, kb: str | KnowledgeBase) -> list[IndexReport]: ...

    def build_kb(self, name: str, passages: list[Passage], *, progress: ProgressFn | None = None) -> KnowledgeBase: ...

    def example_questions(self, kb: str, n: int = 8) -> list[str]: ...


class EngineNotReady(RagDemoError):
    """The engine is still being prepared (first start) or failed to start."""


class BackgroundEngine:
    """Builds the engine in a thread so the page can show progress instead of failing on first start.

    `factory(progress)` returns the engine; `progress(stage, done, total)` is reported on the page.
    Until it is ready every engine method raises `EngineNotReady`, whose message the page shows.
    """

    def __init__(self, factory: Callable[[ProgressFn], Engine]):
        self._factory = factory
        self._engine: Engine | None = None
        self._error: str | None = None
        self._stage: tuple[str, int, int] = ("starting", 0, 0)
        self._started = time.monotonic()
        self._stage_started = self._started
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> BackgroundEngine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._build, name="engine-build", daemon=True)
            self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the engine is ready or failed; True when ready."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.ready

    def _progress(self, stage: str, done: int, total: int) -> None:
        with self._lock:
            if str(stage) != self._stage[0]:
                self._stage_started = time.monotonic()
            self._stage = (str(stage), int(done), int(total))

    def _build(self) -> None:
        try:
            engine = self._factory(self._progress)
        except RagDemoError as err:
            log.error("engine failed to start: %s", err)
            self._error = str(err)
        except Exception as err:  # a thread boundary: record it for the page, keep the server up
            log.exception("engine failed to start")
            self._error = f"{type(err).__name__}: {err}"
        else:
            self._engine = engine

    @property
    def ready(self) -> bool:
        return self._engine is not None

    @property
    def failed(self) -> bool:
        return self._error is not None

    def status_text(self) -> str:
        if self._error is not None:
            return f"The demo could not start: {self._error}"
        if self._engine is not None:
            return "ready"
        with self._lock:
            stage, done, total = self._stage
            stage_started = self._stage_started
        now = time.monotonic()
        count = ""
        if total:
            eta = eta_text(done, total, now - stage_started)
            count = f" ({done:,}/{total:,}{', ' + eta if eta else ''})"
        return (f"Preparing models and indexes: {stage}{count}; {now - self._started:.0f} s so far. "
                "A first start builds its caches (minutes); later starts load them (seconds).")

    def _get(self) -> Engine:
        if self._engine is None:
            raise EngineNotReady(self.status_text() + (" Restart the app once fixed." if self.failed else " Try again in a moment."))
        return self._engine

    @property
    def kb_names(self) -> tuple[str, ...]:
        return self._get().kb_names

    @property
    def default_kb(self) -> str:
        return self._get().default_kb

    @property
    def lexical_weight(self) -> float:
        return self._get().lexical_weight

    @property
    def retrievers(self) -> tuple[str, ...]:
        return self._get().retrievers

    def ask(self, question: str, **options: Any) -> AskResult:
        try:
            return self._get().ask(question, **options)
        finally:
            heap.release_free_memory()  # a long-running server: see rag_demo.heap

    def score(self, question: str, answer: str, **options: Any) -> AskResult:
        try:
            return self._get().score(question, answer, **options)
        finally:
            heap.release_free_memory()

    def compare_retrievers(self, question: str, *, kb: str | KnowledgeBase, k: int = 5) -> RetrieverComparison:
        return self._get().compare_retrievers(question, kb=kb, k=k)

    def index_reports(self, kb: str | KnowledgeBase) -> list[IndexReport]:
        return self._get().index_reports(kb)

    def build_kb(self, name: str, passages: list[Passage], *, progress: ProgressFn | None = None) -> KnowledgeBase:
        return self._get().build_kb(name, passages, progress=progress)

    def example_questions(self, kb: str, n: int = 8) -> list[str]:
        return self._get().example_questions(kb, n)

    def release_kb(self, kb: KnowledgeBase) -> None:
        release = getattr(self._get(), "release_kb", None)
        if release is not None:
            release(kb)


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


def engine_ready(engine: Engine) -> bool:
    """Plain engines are always ready; a `BackgroundEngine` says so itself."""
    return bool(getattr(engine, "ready", True))


# ---------------------------------------------------------------------------------------------
# Formatters: results -> HTML. Pure; everything that did not come from this file is escaped.
# ---------------------------------------------------------------------------------------------


def esc(text: object) -> str:
    """HTML-escape any value, quotes included.

    >>> esc('<img src=x onerror="1">')
    '&lt;img src=x onerror=&quot;1&quot;&gt;'
    """
    return html.escape(str(text), quote=True)


_SUPERSCRIPTS = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def fmt_prob(p: float) -> str:
    """A probability for people: 3 decimals; powers of ten, as a blackboard writes them, when tiny.

    >>> fmt_prob(0.73456), fmt_prob(0.0000123), fmt_prob(4.2e-120), fmt_prob(0.0)
    ('0.735', '1.23 × 10⁻⁵', '4.20 × 10⁻¹²⁰', '0')
    """
    if p == 0:
        return "0"
    if abs(p) >= 0.001:
        return f"{p:.3f}"
    mantissa, exponent = f"{p:.2e}".split("e")
    return f"{mantissa} × 10{str(int(exponent)).translate(_SUPERSCRIPTS)}"


def fmt_signed(x: float, digits: int = 2) -> str:
    """A signed number with a true minus sign, as `fmt_log` writes them.

    >>> fmt_signed(-2.494), fmt_signed(0.871)
    ('−2.49', '+0.87')
    """
    return f"{x:+.{digits}f}".replace("-", "−")


def fmt_log(lp: float) -> str:
    """A log-probability with a true minus sign.

    >>> fmt_log(-0.3104)
    '−0.310'
    """
    if math.isinf(lp):
        return "−∞" if lp < 0 else "∞"
    return f"{lp:.3f}".replace("-", "−")


def fmt_ms(ms: float) -> str:
    """Milliseconds for people, seconds past 1000.

    >>> fmt_ms(0.04), fmt_ms(12.34), fmt_ms(4321)
    ('0.04 ms', '12.3 ms', '4.32 s')
    """
    if ms >= 1000:
        return f"{ms / 1000:.3g} s"
    return f"{ms:.3g} ms"


def format_status(message: str, kind: str = "error") -> str:
    """A visible message box; kind is 'error', 'info' or 'ok'. Empty message -> empty HTML."""
    if not message:
        return ""
    role = "alert" if kind == "error" else "status"
    return f'<div class="rag-status rag-status-{esc(kind)}" role="{role}">{esc(message)}</div>'


def _is_special(token: str) -> bool:
    stripped = token.strip()
    return len(stripped) > 2 and ((stripped[0] == "<" and stripped[-1] == ">") or (stripped[0] == "[" and stripped[-1] == "]"))


def _ends_answer(tokens: Sequence[str], t: int) -> bool:
    """The last token is a line break or a special token: the generator's stop, not a word."""
    if t != len(tokens) - 1:
        return False
    token = tokens[t]
    return (token.strip() == "" and "\n" in token) or _is_special(token)


def _token_text(token: str) -> str:
    """Escaped token text as shown inline: newlines visible, special tokens kept short."""
    if token == "":
        return "∅"
    return esc(token).replace("\n", "↵")


def _swatch(rank: int) -> str:
    return f'<span class="rag-swatch" style="background:{plots.passage_color(rank)}"></span>'


def format_token_spans(variant: VariantResult, passages: Sequence[RetrievedPassage], *, max_tip_rows: int = 6) -> str:
    """The answer's tokens, each tinted by the passage that dominates its posterior, with a hover tooltip.

    Tint: colour of argmax_z posterior, opacity grows with that posterior. Tooltip: the token's
    probability with passages, its closed-book probability, and its posterior over passages.
    """
    spans = []
    kind = "running posterior p(z | x, y≤i)" if variant.variant == "sequence" else "posterior p(z | x, yᵢ, y<i)"
    for t, token in enumerate(variant.tokens):
        row = variant.posteriors[t] if t < len(variant.posteriors) else ()
        p_open = math.exp(variant.token_logprobs[t]) if t < len(variant.token_logprobs) else float("nan")
        p_closed = (math.exp(variant.closed_book_token_logprobs[t])
                    if t < len(variant.closed_book_token_logprobs) else float("nan"))
        classes = ["rag-tok"]
        style = ""
        best = max(range(len(row)), key=row.__getitem__) if row else None
        if best is not None and best < len(passages):
            rank = passages[best].rank
            style = f' style="background:{plots.rgba(plots.passage_color(rank), 0.12 + 0.6 * row[best])}"'
        ending = _ends_answer(variant.tokens, t)
        if _is_special(token) or ending:
            classes.append("rag-special")
        if p_closed >= PARAMETRIC_P:
            classes.append("rag-parametric")
        order = sorted(range(len(row)), key=lambda j: -row[j])[:max_tip_rows]
        rows = []
        for j in order:
            if j >= len(passages):
                continue
            passage = passages[j]
            width = max(1.0, 100 * row[j])
            rows.append(
                f'<div class="rag-tip-row">{_swatch(passage.rank)}<span class="rag-tip-title">#{passage.rank} '
                f'{esc(plots.shorten(plots.passage_name(passage.title, passage.text), 26))}</span><span class="rag-tip-bar">'
                f'<span style="width:{width:.0f}%;background:{plots.passage_color(passage.rank)}"></span></span>'
                f'<span class="rag-tip-num">{row[j]:.2f}</span></div>'
            )
        hidden = len(row) - len(order)
        more = f'<div class="rag-tip-more">+{hidden} more below {row[order[-1]]:.2f}</div>' if hidden > 0 and order else ""
        gain = (variant.token_logprobs[t] - variant.closed_book_token_logprobs[t]
                if t < min(len(variant.token_logprobs), len(variant.closed_book_token_logprobs)) else float("nan"))
        closed_known = not math.isnan(p_closed)  # the Swap tab asks without the closed-book model
        label = f"“{plots.token_label(token)}”: p {fmt_prob(p_open)}" + (
            f", closed-book p {fmt_prob(p_closed)}" if closed_known else "")
        if best is not None and best < len(passages):
            label += f", mostly passage #{passages[best].rank} ({row[best]:.2f})"
        about = kind
        if ending:
            label += "; it ends the answer"
            about = f"the stop token: it ends the answer, and its probability is part of p(y|x) · {kind}"
        tip = (
            f'<span class="rag-tip" role="tooltip"><span class="rag-tip-head">“{esc(plots.token_label(token))}”</span>'
            f'<span class="rag-tip-probs">p = {fmt_prob(p_open)} with passages'
            + (f' · <b>{fmt_prob(p_closed)}</b> closed-book · gain {fmt_signed(gain)} nats' if closed_known else "")
            + f'</span><span class="rag-tip-kind">{esc(about)}</span>{"".join(rows)}{more}</span>'
        )
        spans.append(
            f'<span class="{" ".join(classes)}" tabindex="0" aria-label="{esc(label)}"{style}>'
            f'<span class="rag-tok-text">{_token_text(token)}</span>{tip}</span>'
        )
    return "".join(spans)


def format_closed_book_spans(closed: ClosedBookResult) -> str:
    """Closed-book tokens in grey, darker when the model is surer; the tooltip gives p."""
    spans = []
    for t, (token, lp) in enumerate(zip(closed.tokens, closed.token_logprobs)):
        p = math.exp(lp)
        classes = "rag-tok rag-closed" + (" rag-special" if _is_special(token) or _ends_answer(closed.tokens, t) else "")
        spans.append(
            f'<span class="{classes}" tabindex="0" aria-label="{esc(plots.token_label(token))}: p {fmt_prob(p)}"'
            f' style="background:rgba(107,114,128,{0.1 + 0.45 * p:.3f})"><span class="rag-tok-text">{_token_text(token)}'
            f'</span><span class="rag-tip" role="tooltip"><span class="rag-tip-head">“{esc(plots.token_label(token))}”</span>'
            f'<span class="rag-tip-probs">closed-book p = {fmt_prob(p)} (no passages)</span></span></span>'
        )
    return "".join(spans)


def format_timings(timings_ms: dict[str, float]) -> str:
    """'encode 3 ms · search 0.4 ms · ...' with the known stages first."""
    keys = [k for k in TIMING_ORDER if k in timings_ms] + sorted(k for k in timings_ms if k not in TIMING_ORDER)
    parts = [f"<span>{esc(k)} <b>{fmt_ms(float(timings_ms[k]))}</b></span>" for k in keys]
    return f'<div class="rag-timings" title="time spent in each stage">time: {" · ".join(parts)}</div>'


RETRIEVER_BADGES = {  # (badge text, what its p(z|x) is)
    "dense": ("dense", "the dense retriever's scores, as in the paper"),
    "bm25": ("BM25", "BM25 word matching alone, no vectors"),
    "hybrid": ("dense + BM25", "the dense retriever's score plus BM25 word matching"),
}


def format_retriever_badge(result: AskResult | RetrieverRanking) -> str:
    """'dense' / 'BM25' / 'dense + BM25', its p(z|x) formula in the tooltip."""
    text, what = RETRIEVER_BADGES.get(result.retriever, (result.retriever, "the retriever's scores"))
    return (f'<span class="rag-badge" title="p(z|x) = softmax({esc(plots.logit_formula(result))}) over the top k: '
            f'{esc(what)}">{esc(text)}</span>')


def format_index_badge(result: AskResult) -> str:
    if result.retriever == "bm25":  # BM25 reads no vector index: say so, whatever index was chosen
        return ('<span class="rag-badge" title="BM25 scores every passage; the index variants hold dense vectors">'
                f"exact search · no index</span>{format_retriever_badge(result)}")
    if result.index_recall is not None:
        recall = f"recall@{result.k} {result.index_recall:.2f}"
    else:
        recall = "exact search" if result.index == "flat" else f"recall@{result.k} n/a"
    return (f'<span class="rag-badge" title="recall@k of this index variant against exact (flat) search, '
            f'for this question">index {esc(result.index)} · {recall}</span>{format_retriever_badge(result)}')


def _variant_card(variant: VariantResult, passages: Sequence[RetrievedPassage], *, extra: str = "") -> str:
    name = plots.VARIANT_NAMES.get(variant.variant, variant.variant)
    candidates = ""
    if variant.candidates:
        seen: set[str] = set()
        shown = []
        for text, lp in variant.candidates[:4]:
            label = f"“{esc(plots.shorten(text, 30))}”" if text.strip() else "(empty answer)"
            if text in seen:  # one text, two token sequences (another ending or another split into tokens)
                label += " (same words, other tokens)"
            seen.add(text)
            shown.append(f"{label} {fmt_prob(math.exp(lp))}")
        candidates = f'<div class="rag-cands">hypotheses p(y|x): {", ".join(shown)}</div>'
    if not variant.answer.strip():
        candidates = '<div class="rag-cands">(empty answer: the model ended it at once)</div>' + candidates
    return (
        f'<div class="rag-card rag-card-{esc(variant.variant)}">'
        f'<div class="rag-card-head"><span class="rag-kind">{esc(name)}</span>'
        f'<span class="rag-meta">p(y|x) = <b>{fmt_prob(math.exp(variant.logprob))}</b> · log {fmt_log(variant.logprob)}'
        f' · {esc(variant.decoding)}</span></div>'
        f'<div class="rag-answer-text">{format_token_spans(variant, passages)}</div>{candidates}{extra}</div>'
    )


def _closed_card(closed: ClosedBookResult) -> str:
    return (
        '<div class="rag-card rag-card-closed">'
        '<div class="rag-card-head"><span class="rag-kind">Closed-book</span>'
        f'<span class="rag-meta">same generator, no passages · p(y|x) = <b>{fmt_prob(math.exp(closed.logprob))}</b></span></div>'
        f'<div class="rag-answer-text">{format_closed_book_spans(closed)}</div></div>'
    )


def format_notices(notices: Sequence[str]) -> str:
    return "".join(f'<div class="rag-notice">{esc(n)}</div>' for n in notices)


def format_answer_html(result: AskResult, *, closed_book: bool = True, legend: bool = True, question: bool = True) -> str:
    """Answer cards (one per variant, plus closed-book), the index's recall, notices and timings."""
    cards = [_variant_card(v, result.passages) for v in result.variants.values()]
    if closed_book and result.closed_book is not None:
        cards.append(_closed_card(result.closed_book))
    legend_html = (
        '<div class="rag-legend">Token colour = the passage that dominates its posterior (stronger = surer); '
        f'dotted underline = the closed-book model alone gives it p ≥ {PARAMETRIC_P:g} (parametric memory). '
        "Hover or focus a token for its posterior and closed-book probability.</div>"
        if legend else ""
    )
    head = (f'<div class="rag-question">Q: {esc(result.question)} <span class="rag-kb">knowledge base '
            f'<b>{esc(result.kb)}</b></span> {format_index_badge(result)}</div>' if question else "")
    return (
        f'<div class="rag-answer-block">{head}{format_notices(result.notices)}<div class="rag-cards">{"".join(cards)}</div>'
        f"{legend_html}{format_timings(result.timings_ms)}</div>"
    )


# One more than the engine reads, so a longer paste reaches it and comes back with its "cut to" notice
# instead of being cut silently by the browser.
QUESTION_BOX_CHARS = LIMITS.max_question_chars + 1
ANSWER_BOX_CHARS = LIMITS.max_answer_chars + 1
NARROW_SCREEN = "(max-width: 980px)"  # below this the sidebar column stacks above the results


def scroll_into_view_js(elem_id: str) -> str:
    """Browser code for an event: on a narrow screen, scroll the element with this id into view."""
    return (f"() => {{ if (window.matchMedia({json.dumps(NARROW_SCREEN)}).matches) {{ "
            f"const el = document.getElementById({json.dumps(elem_id)}); "
            "if (el) el.scrollIntoView({behavior: 'smooth', block: 'start'}); } }")


def _untitled(row: int) -> str:
    return f'<span class="rag-muted">passage {int(row)}</span>'


def _score_names(p: RetrievedPassage, retriever: str) -> str:
    """The scores a retriever weighed, named: 'score 0.612', 'bm25 7.31' or 'score 0.612 · bm25 7.31'."""
    if retriever == "bm25":
        return f"bm25 {p.lexical:.2f}"
    if retriever == "hybrid":
        return f"score {p.score:.3f} · bm25 {p.lexical:.2f}"
    return f"score {p.score:.3f}"


GOLD_MARK = '<span class="rag-gold" title="the passage this question was written from">gold</span>'


def format_passages_html(passages: Sequence[RetrievedPassage], *, max_chars: int | None = None,
                         retriever: str = "dense", gold_ids: Collection[int] = ()) -> str:
    """Passage cards: rank, title, the retriever's scores by name, p(z|x) with a bar, and the text.

    Passages whose row is in `gold_ids` are marked gold."""
    if not passages:
        return '<div class="rag-empty">No passages retrieved.</div>'
    cards = []
    for p in passages:
        color = plots.passage_color(p.rank)
        text = p.text if max_chars is None else plots.shorten(p.text, max_chars)
        gold = p.id in gold_ids
        cards.append(
            f'<div class="rag-passage{" rag-passage-gold" if gold else ""}" style="border-left-color:{color}">'
            f'<div class="rag-passage-head"><span class="rag-rank" style="background:{color}">#{p.rank}</span>'
            f'<span class="rag-passage-title">{esc(p.title) if p.title.strip() else _untitled(p.id)}</span>'
            f'{GOLD_MARK if gold else ""}'
            f'<span class="rag-passage-nums">{_score_names(p, retriever)} · p(z|x) <b>{p.prob:.3f}</b></span></div>'
            f'<div class="rag-pbar"><span style="width:{100 * p.prob:.1f}%;background:{color}"></span></div>'
            f'<div class="rag-passage-text">{esc(text)}</div></div>'
        )
    # with hybrid retrieval the dense score alone does not give the order, which surprises readers
    order = ('<div class="rag-muted rag-order-note">ranked by p(z|x), which adds the BM25 score to the dense '
             "score: a lower score can rank higher</div>" if retriever == "hybrid" and len(passages) > 1 else "")
    return f'<div class="rag-passages">{order}{"".join(cards)}</div>'


def _gold_found(ranking: RetrieverRanking, k: int) -> str:
    if ranking.gold_rank is None:
        return f"not in the top {k}"
    return f"rank {ranking.gold_rank}"


def format_comparison_html(comparison: RetrieverComparison, *, max_chars: int = 160) -> str:
    """Each retriever's top k in its own column, with p(z|x) per passage; the gold passage marked when the KB knows it."""
    gold = set(comparison.gold_ids)
    names = [RETRIEVER_NAMES.get(r.retriever, r.retriever) for r in comparison.rankings]
    if gold:
        found = " · ".join(f"{esc(name)} <b>{_gold_found(r, comparison.k)}</b>" for name, r in zip(names, comparison.rankings))
        summary = f"The gold passage {GOLD_MARK}, the one this question was written from: {found}"
    else:
        summary = ("No gold passage is known for this question: only the questions stored with the example "
                   "knowledge bases have one.")
    columns = "".join(
        f'<div class="rag-compare-col"><div class="rag-compare-head"><span class="rag-kind">{esc(name)}</span>'
        f'<span class="rag-meta">p(z|x) = softmax({esc(plots.logit_formula(r))})'
        f'{f" · gold: {_gold_found(r, comparison.k)}" if gold else ""}</span></div>'
        f"{format_notices(r.notices)}"
        f"{format_passages_html(r.passages, max_chars=max_chars, retriever=r.retriever, gold_ids=gold)}</div>"
        for name, r in zip(names, comparison.rankings)
    )
    return (
        f'<div class="rag-answer-block"><div class="rag-question">Q: {esc(comparison.question)} <span class="rag-kb">'
        f"knowledge base <b>{esc(comparison.kb)}</b></span>"
        f'<span class="rag-badge" title="every retriever scores every passage here; the Index variant setting '
        f'does not apply">top {comparison.k} · exact search</span></div>'
        f'{format_notices(comparison.notices)}<div class="rag-compare-summary">{summary}</div>'
        f'<div class="rag-compare">{columns}</div>{format_timings(comparison.timings_ms)}</div>'
    )


def format_swap_column(result: AskResult) -> str:
    """One side of the index swap: the answers and the top 3 passages of that knowledge base."""
    return (
        f'<div class="rag-swap-col"><div class="rag-swap-head">knowledge base <b>{esc(result.kb)}</b> {format_index_badge(result)}</div>'
        f"{format_answer_html(result, closed_book=False, legend=False, question=False)}"
        f"{format_passages_html(result.passages[:3], max_chars=220, retriever=result.retriever)}"
        f"{_more_passages_note(len(result.passages), 3)}</div>"
    )


def _more_passages_note(total: int, shown: int) -> str:
    if total <= shown:
        return ""
    return f'<div class="rag-muted">the top {shown} of the {total} passages the answers read</div>'


def _passages_say(result: AskResult, answer: str) -> bool:
    """Whether some retrieved passage contains `answer` (SQuAD-normalized words)."""
    return bool(answer.strip()) and any(contains_answer(f"{p.title} {p.text}", answer) for p in result.passages)


def swap_verdict(left: AskResult, right: AskResult) -> str:
    """One sentence on what the swap showed: whether each side's answer words appear in the passages
    that side read (all k of them, not only those shown). A mention is not proof: the words may
    name something else, or come from the question."""
    if left.kb == right.kb:
        return "Both sides read the same knowledge base; choose two different ones to see a swap."
    answers = {side.kb: [v.answer for v in side.variants.values()] for side in (left, right)}
    said = {side.kb: all(_passages_say(side, a) for a in answers[side.kb]) for side in (left, right)}
    read = f"the {counted(left.k, 'passage')} it read" if left.k == right.k else "the passages it read"
    if answers[left.kb] != answers[right.kb]:
        if said[left.kb] and said[right.kb]:
            return (f"Same question, same model, different knowledge base: the answer changed, and each side's "
                    f"answer appears in {read}.")
        return ("The answer changed with the knowledge base, but not every answer appears in its side's passages: "
                "some of it came from the model.")
    if said[left.kb] and said[right.kb]:
        return f"The same answer on both sides, and it appears in {read} on each side."
    if said[left.kb] or said[right.kb]:
        holder = left.kb if said[left.kb] else right.kb
        return f"The same answer on both sides, but it appears only in {holder}'s passages."
    return "The same answer on both sides, and it appears in neither side's passages: it comes from the model, not the index."


def format_swap_summary(left: AskResult, right: AskResult) -> str:
    def answers(r: AskResult) -> str:
        return " / ".join(f"“{esc(v.answer)}”" for v in r.variants.values())

    verdict = esc(swap_verdict(left, right))
    return (f'<div class="rag-swap-summary"><b>{esc(left.kb)}</b> → {answers(left)} &nbsp;|&nbsp; '
            f'<b>{esc(right.kb)}</b> → {answers(right)}<div>{verdict}</div></div>')


def format_score_html(result: AskResult) -> str:
    """log p(answer|x) under each variant against the closed-book model, with per-token provenance."""
    cards = []
    for v in result.variants.values():
        closed_lp = sum(v.closed_book_token_logprobs)
        split = ""
        last = len(v.tokens) - 1
        if last > 0 and _ends_answer(v.tokens, last) and last < min(len(v.token_logprobs), len(v.closed_book_token_logprobs)):
            # the stop token's gain can cancel the words' gain; show them apart
            end_gain = v.token_logprobs[last] - v.closed_book_token_logprobs[last]
            words_gain = sum(v.token_logprobs[:last]) - sum(v.closed_book_token_logprobs[:last])
            split = (f": {fmt_signed(words_gain)} for the words, {fmt_signed(end_gain)} for ending the answer there "
                     f"(“{_token_text(v.tokens[last])}”)")
        extra = (f'<div class="rag-cands">closed-book log p = {fmt_log(closed_lp)} → the passages change it by '
                 f"<b>{fmt_signed(v.logprob - closed_lp)}</b> nats{split}</div>")
        cards.append(_variant_card(v, result.passages, extra=extra))
    return (
        f'<div class="rag-answer-block"><div class="rag-question">Q: {esc(result.question)} '
        f'<span class="rag-kb">knowledge base <b>{esc(result.kb)}</b></span> {format_index_badge(result)}</div>'
        f'{format_notices(result.notices)}<div class="rag-cards">{"".join(cards)}</div>{format_timings(result.timings_ms)}</div>'
    )


def format_index_table(reports: Sequence[IndexReport], kb_name: str) -> str:
    if not reports:
        return '<div class="rag-empty">No index reports.</div>'
    rows = "".join(
        f"<tr><td><b>{esc(r.kind)}</b></td><td>{r.build_seconds:,.2f}</td><td>{r.bytes / 1e6:,.1f}</td>"
        f"<td>{r.recall_at_k:.3f}</td><td>{r.query_ms:,.3f}</td><td>{r.num_vectors:,}</td></tr>"
        for r in reports
    )
    k = reports[0].recall_k
    return (
        f'<table class="rag-table"><caption>Index variants on <b>{esc(kb_name)}</b></caption>'
        f"<thead><tr><th>index</th><th>build (s)</th><th>memory (MB)</th><th>recall@{k} vs flat</th>"
        f"<th>query (ms)</th><th>vectors</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def format_kb_preview(kb: KnowledgeBase, *, limit: int = 50) -> str:
    items = "".join(
        f'<li><span class="rag-passage-title">{esc(plots.passage_name(kb.titles[i], kb.texts[i]))}</span> '
        f'<span class="rag-passage-text">{esc(plots.shorten(kb.texts[i], 160))}</span></li>'
        for i in range(min(limit, len(kb)))
    )
    more = f"<div class='rag-empty'>… and {len(kb) - limit:,} more</div>" if len(kb) > limit else ""
    return f'<div class="rag-preview"><div><b>{counted(len(kb), "passage")}</b></div><ol>{items}</ol>{more}</div>'


def passage_choices(kb: KnowledgeBase) -> list[tuple[str, int]]:
    return [(f"{i + 1}. {plots.shorten(plots.passage_name(kb.titles[i], kb.texts[i]), 30)} — {plots.shorten(kb.texts[i], 50)}", i)
            for i in range(len(kb))]


def learn_token_choices(result: AskResult | None) -> list[tuple[str, int]]:
    """(label, position) for each RAG-Token answer token (else RAG-Sequence's)."""
    variant = _learn_variant(result)
    if variant is None:
        return []
    return [(f"{t + 1}: {plots.token_label(tok)}", t) for t, tok in enumerate(variant.tokens)]


def _learn_variant(result: AskResult | None) -> VariantResult | None:
    if result is None or not result.variants:
        return None
    return result.variants.get("token") or next(iter(result.variants.values()))


GLOSSARY = (
    ("RAG-Token, RAG-Sequence", "The paper's two ways to combine passages. RAG-Token mixes the passages again for "
                                "every token, so one answer can draw on several passages; RAG-Sequence lets one "
                                "passage explain the whole answer, then mixes the whole answers."),
    ("p(y|x)", "The probability of the whole answer y for question x, under the variant on the card: the number "
               "at the top of every answer card."),
    ("hypotheses", "The candidate answers RAG-Sequence wrote (one or more per passage), each with its p(y|x); "
                   "the likeliest is the answer."),
    ("token", "A piece of text the generator reads or writes: a word, a piece of a rare word (a name may "
              "take several) or a mark such as “↵↵”, the line break that ends an answer."),
    ("p(z|x)", "How likely the retriever finds passage z for question x: a softmax (exponentiate, then divide "
               "by the sum, so the k numbers add up to 1) over the top k passages' logits. The bars of the "
               "p(z|x) chart."),
    ("score, bm25, logit", "score: the dense retriever's inner product of question and passage vectors (the "
                           "cosine similarity, as the default encoder's vectors have length 1). bm25: a word-"
                           "matching score (rare shared words count most). logit: what goes into the softmax; with "
                           f"the default encoder 20 × score, plus 0.2 × bm25 with Dense + BM25; {BM25_SCALE:g} × bm25 "
                           "with BM25 alone."),
    ("Dense, BM25, Dense + BM25", "The three retrievers. Dense is the paper's: question and passage vectors. BM25 "
                                  "matches words and needs no vectors, so it finds rare names and numbers that one "
                                  "vector blurs, but not a passage that says the same thing in other words. Dense + "
                                  "BM25 adds the two logits. “Compare retrievers” in the Ask tab shows their top k "
                                  "side by side."),
    ("question encoder", "The retriever turns the question into a vector with a question encoder, each passage "
                         "with a passage encoder. As in the paper, only the question side learns: on the offline "
                         "default it was fine-tuned on about 11,000 Natural Questions questions with their gold "
                         "passages (never the questions evaluated, nor the example questions), while the passages "
                         "keep their vectors, so the index stays as built."),
    ("generator", "The language model that writes the answer after reading each passage. On the offline default "
                  "it is Gemma-3-270m with a small reading adapter (a LoRA, a few MB) trained once, as the paper "
                  "fine-tunes BART, on training questions read with their gold passage: half with the real passage, "
                  "half with the swapped one, the target always what that passage says. So it learns to answer "
                  "from the passage rather than from memory. The adapter is switched off for closed-book."),
    ("posterior", "After seeing the answer (or a token of it), how likely each passage is to be the one that "
                  "produced it: p(z|x) times how well z explains the text, renormalized. The heatmaps' cells."),
    ("closed-book, parametric memory", "Closed-book: the base generator (without the reading adapter) with no "
                                       "passages, answering from what its weights remember: its parametric memory. "
                                       "Each answer token's closed-book probability and the retrieval gain compare "
                                       "against it, so they show what the passages added to what the model already "
                                       "knew. A dotted underline marks a token the closed-book model alone gives "
                                       "p ≥ 0.5."),
    ("nats, retrieval gain", "Nats are the unit of natural-log probabilities. The retrieval gain of a token is its "
                             "log p with passages minus its log p closed-book: +1 nat means the passages made it "
                             "e ≈ 2.7 times as likely; −2.3 nats, ten times less likely."),
    ("greedy, beams", "Greedy decoding takes the likeliest token at each step. Beam search keeps the best few "
                      "partial answers (Beams) and can find a likelier whole answer."),
    ("thorough, fast", "RAG-Sequence first writes one answer per passage. Thorough scores every such answer "
                       "under every passage; fast only under the passages that wrote it (the paper's two "
                       "decodings)."),
    ("recall@k", "Of the k passages exact search finds, the share an approximate index (HNSW, IVF-PQ) also "
                 "finds."),
)


def format_glossary_html() -> str:
    rows = "".join(f"<dt>{esc(term)}</dt><dd>{esc(text)}</dd>" for term, text in GLOSSARY)
    return f'<dl class="rag-glossary">{rows}</dl>'


def format_learn_html(result: AskResult | None, position: int | None = 0) -> str:
    """The two RAG equations worked through with this result's own numbers."""
    if result is None:
        return format_status("Ask a question in the Ask tab first; this page then works through its numbers.", "info")
    passages = result.passages
    scale = result.scale
    hybrid, bm25 = result.retriever == "hybrid", result.retriever == "bm25"
    weight = result.lexical_weight if hybrid else 0.0
    logits = [scale * p.score + weight * p.lexical for p in passages]  # for bm25, score is the BM25 score
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = sum(weights)
    prior = [w / total for w in weights]  # p(z|x) recomputed from the raw scores
    lexical_cell = (lambda p: f"<td>{p.lexical:.3f}</td>") if hybrid else (lambda p: "")
    rows = "".join(
        f"<tr><td>{_swatch(p.rank)}#{p.rank} {esc(plots.shorten(plots.passage_name(p.title, p.text), 28))}</td>"
        f"<td>{p.score:.4f}</td>{lexical_cell(p)}<td>{lg:.3f}</td><td>{w:.4f}</td><td><b>{pr:.4f}</b></td><td>{p.prob:.4f}</td></tr>"
        for p, lg, w, pr in zip(passages, logits, weights, prior)
    )
    score_head = "<th>score s(z)</th>"
    if hybrid:
        how = (f"The retriever scores each passage <i>z</i> against the question <i>x</i> twice: an inner product of "
               f"their vectors, <i>s(z)</i>, as in the paper, and BM25 word matching, <i>b(z)</i>, which keeps rare "
               f"names and numbers that one vector blurs. The top {len(passages)} become a distribution by a softmax "
               f"over those {len(passages)} only, with the encoder's scale λ = {scale:g} and BM25's weight "
               f"β = {weight:g} (choose “Dense” in the Ask tab for the paper's retriever alone):</p>"
               '<div class="rag-eq">p(z|x) = exp(λ·s(z) + β·b(z)) / Σ<sub>z′</sub> exp(λ·s(z′) + β·b(z′))</div>')
        logit_head = "<th>bm25 b(z)</th><th>λ·s(z) + β·b(z)</th><th>exp(logit − max)</th>"
    elif bm25:
        how = (f"The retriever scores each passage <i>z</i> by BM25 word matching alone, <i>b(z)</i>: a sum over "
               "the question's words that the passage contains, each weighted by how rare it is in the knowledge "
               "base (its idf) and how often the passage repeats it. No vectors are involved, so BM25 looks at "
               f"every passage exactly. The top {len(passages)} become a distribution by a softmax over those "
               f"{len(passages)} only, with the scale λ = {scale:g}. BM25 scores have no natural scale: at λ = 1 "
               "one rare word shared with the question would make p(z|x) all-or-nothing; λ is the weight the default "
               "Dense + BM25 gives a BM25 point (choose “Dense” in the Ask tab for the paper's retriever):</p>"
               '<div class="rag-eq">p(z|x) = exp(λ·b(z)) / Σ<sub>z′</sub> exp(λ·b(z′))</div>')
        score_head = "<th>bm25 b(z)</th>"
        logit_head = "<th>λ·b(z)</th><th>exp(λ·b − max)</th>"
    else:
        how = (f"The retriever scores each passage <i>z</i> against the question <i>x</i> (an inner product of "
               f"their vectors, <i>s(z)</i>). The top {len(passages)} become a distribution by a softmax over those "
               f"{len(passages)} only, with the encoder's scale λ = {scale:g}:</p>"
               '<div class="rag-eq">p(z|x) = exp(λ·s(z)) / Σ<sub>z′</sub> exp(λ·s(z′))</div>')
        logit_head = "<th>λ·s(z)</th><th>exp(λ·s − max)</th>"
    blank = "<td></td>" * (2 if hybrid else 1)
    step1 = (
        "<h3>1 · Retrieval: how much each passage is trusted</h3>"
        f"<p>{how}"
        f'<table class="rag-table"><thead><tr><th>passage</th>{score_head}{logit_head}'
        "<th>p(z|x) computed</th><th>p(z|x) engine</th></tr></thead>"
        f"<tbody>{rows}</tbody><tfoot><tr><td>sum</td><td></td>{blank}<td>{total:.4f}</td><td>{sum(prior):.4f}</td>"
        f"<td>{sum(p.prob for p in passages):.4f}</td></tr></tfoot></table>"
    )
    doc_prior = [p.prob for p in passages]
    return f'<div class="rag-learn">{step1}{_learn_token_step(result, doc_prior, position)}{_learn_sequence_step(result, doc_prior)}</div>'


def _learn_token_step(result: AskResult, prior: Sequence[float], position: int | None) -> str:
    variant = result.variants.get("token")
    head = "<h3>2 · RAG-Token: each token may come from a different passage</h3>"
    if variant is None or not variant.tokens:
        return head + format_status("Ask with RAG-Token (or both) to see this step.", "info")
    t = min(max(int(position or 0), 0), len(variant.tokens) - 1)
    token = plots.token_label(variant.tokens[t])
    doc_p = [math.exp(lp) for lp in variant.doc_token_logprobs[t]]
    joint = [a * b for a, b in zip(prior, doc_p)]
    marginal = sum(joint)
    rows = "".join(
        f"<tr><td>{_swatch(p.rank)}#{p.rank} {esc(plots.shorten(plots.passage_name(p.title, p.text), 28))}</td><td>{a:.4f}</td>"
        f"<td>{fmt_prob(b)}</td><td>{fmt_prob(j)}</td><td><b>{(j / marginal if marginal else 0):.3f}</b></td></tr>"
        for p, a, b, j in zip(result.passages, prior, doc_p, joint)
    )
    closed = math.exp(variant.closed_book_token_logprobs[t]) if t < len(variant.closed_book_token_logprobs) else float("nan")
    per_token = " + ".join(f"({fmt_log(lp)})" for lp in variant.token_logprobs)
    prefix = "".join(variant.tokens[:t])
    return (
        head
        + f"<p>Token {t + 1} of the answer is <b>“{esc(token)}”</b>"
        + (f", after “{esc(prefix.strip())}”" if prefix.strip() else "")
        + ". Its probability is a mixture over the passages, weighted by p(z|x):</p>"
        '<div class="rag-eq">p(yᵢ | x, y&lt;i) = Σ<sub>z</sub> p(z|x) · p(yᵢ | x, z, y&lt;i)</div>'
        '<table class="rag-table"><thead><tr><th>passage</th><th>p(z|x)</th><th>p(yᵢ|x,z,y&lt;i)</th>'
        "<th>product</th><th>posterior p(z|x,yᵢ,y&lt;i)</th></tr></thead>"
        f"<tbody>{rows}</tbody><tfoot><tr><td>sum</td><td>{sum(prior):.4f}</td><td></td><td><b>{fmt_prob(marginal)}</b></td>"
        "<td>1</td></tr></tfoot></table>"
        f"<p>The sum, <b>{fmt_prob(marginal)}</b>, is the engine's p(yᵢ|x,y&lt;i) = "
        f"{fmt_prob(math.exp(variant.token_logprobs[t]))}. The same generator without passages gives "
        f"{fmt_prob(closed)}. The last column is the heatmap's column for this token (paper Figure 2).</p>"
        f"<p>Whole answer: log p(y|x) = Σ<sub>i</sub> log p(yᵢ|x,y&lt;i) = {per_token} = "
        f"<b>{fmt_log(sum(variant.token_logprobs))}</b> (engine: {fmt_log(variant.logprob)}).</p>"
    )


def _learn_sequence_step(result: AskResult, prior: Sequence[float]) -> str:
    variant = result.variants.get("sequence")
    head = "<h3>3 · RAG-Sequence: one passage explains the whole answer</h3>"
    if variant is None or not variant.tokens:
        return head + format_status("Ask with RAG-Sequence (or both) to see this step.", "info")
    num_docs = len(result.passages)
    seq_lp = [sum(row[j] for row in variant.doc_token_logprobs) for j in range(num_docs)]  # log p(y|x,z)
    joint = [a * math.exp(b) for a, b in zip(prior, seq_lp)]
    total = sum(joint)
    rows = "".join(
        f"<tr><td>{_swatch(p.rank)}#{p.rank} {esc(plots.shorten(plots.passage_name(p.title, p.text), 28))}</td><td>{a:.4f}</td>"
        f"<td>{fmt_prob(math.exp(b))}</td><td>{fmt_prob(j)}</td><td><b>{(j / total if total else 0):.3f}</b></td></tr>"
        for p, a, b, j in zip(result.passages, prior, seq_lp, joint)
    )
    note = ""
    if "fast" in variant.decoding:
        note = (" With <i>fast</i> decoding the engine takes p(y|x,z) ≈ 0 for passages whose beam did not "
                "contain y, so its number can be lower than the full sum.")
    return (
        head
        + f"<p>The answer <b>“{esc(variant.answer)}”</b> is scored as a whole under each passage, "
        "then mixed by p(z|x):</p>"
        '<div class="rag-eq">p(y|x) = Σ<sub>z</sub> p(z|x) · Π<sub>i</sub> p(yᵢ | x, z, y&lt;i)</div>'
        '<table class="rag-table"><thead><tr><th>passage</th><th>p(z|x)</th><th>p(y|x,z) = Π<sub>i</sub></th>'
        "<th>product</th><th>p(z|x,y)</th></tr></thead>"
        f"<tbody>{rows}</tbody><tfoot><tr><td>sum</td><td>{sum(prior):.4f}</td><td></td><td><b>{fmt_prob(total)}</b></td>"
        "<td>1</td></tr></tfoot></table>"
        f"<p>The sum, <b>{fmt_prob(total)}</b>, is p(y|x); the engine reports {fmt_prob(math.exp(variant.logprob))}."
        f"{note} The last column is the running-posterior heatmap's last column, after the whole answer.</p>"
    )


# ---------------------------------------------------------------------------------------------
# Inputs -> engine arguments
# ---------------------------------------------------------------------------------------------


def parse_variants(choice: str) -> tuple[str, ...]:
    """'token' | 'sequence' | 'both' -> the engine's variants tuple.

    >>> parse_variants("both")
    ('token', 'sequence')
    """
    if choice == "both":
        return ("token", "sequence")
    if choice in ("token", "sequence"):
        return (choice,)
    raise InputError(f"unknown variant {choice!r}; use token, sequence or both")


def parse_retriever(choice: object) -> str | None:
    """A retriever choice from the page or the API; empty means the engine's default (the engine checks the rest)."""
    return choice or None


def _whole_number(value: object, *, name: str, most: int) -> int:
    """A page or API number (sliders send floats) as a whole number from 1 to `most`.

    >>> _whole_number(3.0, name="k", most=20)
    3
    """
    try:
        number = int(float(value))
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{name} must be a whole number, got {str(value)[:40]!r}") from None
    if not 1 <= number <= most:
        raise InputError(f"{name} must be between 1 and {most}")
    return number


def parse_k(k: object) -> int:
    return _whole_number(k, name="k", most=LIMITS.max_k)


def parse_beams(beams: object) -> int:
    """The beam slider's value; empty means 1 (greedy)."""
    if beams is None or beams == "":
        return 1
    return _whole_number(beams, name="beams", most=LIMITS.max_beams)


def require_question(question: str | None) -> str:
    if not isinstance(question, str) or not question.strip():
        raise InputError("Type a question first, or click one of the examples.")
    return check_length(question, what="question").strip()


def require_answer(answer: str | None) -> str:
    if not isinstance(answer, str) or not answer.strip():
        raise InputError("Type an answer to score.")
    return check_length(answer, what="answer").strip()


def safe_file_name(name: str) -> str:
    """A file name that stays inside its folder: no path, no leading dots, only plain characters.

    >>> safe_file_name("../../etc/pass wd.txt"), safe_file_name(".."), safe_file_name("C:\\\\x\\\\y.md")
    ('pass_wd.txt', 'upload', 'y.md')
    """
    base = re.split(r"[\\/]", str(name))[-1]
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".")[-100:]
    return cleaned or "upload"


class SessionFiles:
    """Per-session folders for visitors' uploads, under one private temporary root.

    Gradio first stores an upload in its shared upload folder (named by the content's hash);
    `adopt` moves it from there into the visitor's own folder before anything reads it, and
    `drop` deletes that folder when the session ends.
    """

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="rag-demo-sessions-"))

    def folder(self, session: str) -> Path:
        path = self._path(session)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

    def _path(self, session: str) -> Path:
        """The session's folder; gradio makes the id, but it arrives from the browser, so it is cleaned."""
        return self.root / (re.sub(r"[^A-Za-z0-9_-]", "", str(session))[:64] or "anonymous")

    def adopt(self, session: str, files: Sequence[str | Path]) -> list[Path]:
        """Move each uploaded file into the session's folder; a file moved by an earlier build is found there."""
        folder = self.folder(session)
        adopted = []
        for file in files:
            source = Path(file)
            # One subfolder per upload keeps the visitor's file name (a .txt file's stem is its passages' title).
            plain = source.name not in ("", ".", "..") and "\\" not in source.name
            name = source.name if plain else safe_file_name(source.name)
            dest = folder / hashlib.sha256(str(source).encode()).hexdigest()[:12] / name
            if not dest.is_file():
                if not source.is_file() or source.is_symlink():
                    raise InputError(f"{source.name} is no longer on the server; upload it again")
                dest.parent.mkdir(mode=0o700, exist_ok=True)
                shutil.move(source, dest)
            adopted.append(dest)
        return adopted

    def drop(self, session: str) -> None:
        shutil.rmtree(self._path(session), ignore_errors=True)


def _is_binary(path: Path) -> bool:
    with path.open("rb") as handle:
        head = handle.read(8192)
    return b"\x00" in head


def passages_from_inputs(
    files: Sequence[str | Path] | None,
    paste_title: str | None,
    paste_text: str | None,
    *,
    limits: UploadLimits = UploadLimits(),
) -> list[Passage]:
    """Passages from uploaded files and pasted text, within `limits`; InputError says what to fix."""
    paths = [Path(f) for f in (files or [])]
    if len(paths) > limits.max_files:
        raise InputError(f"{len(paths)} files uploaded; the limit is {limits.max_files}. Remove some and build again.")
    passages: list[Passage] = []
    for path in paths:
        name = path.name
        if path.suffix.lower() not in SOURCE_SUFFIXES:
            raise InputError(f"{name}: unsupported file type; upload {', '.join(SOURCE_SUFFIXES)} files")
        size = path.stat().st_size
        if size > limits.max_file_bytes:
            raise InputError(f"{name} is {size / 1e6:.1f} MB; the limit is {limits.max_file_bytes / 1e6:g} MB per file")
        if size == 0:
            raise InputError(f"{name} is empty")
        if _is_binary(path):
            raise InputError(f"{name} looks like a binary file, not text; upload UTF-8 text ({', '.join(SOURCE_SUFFIXES)})")
        try:
            passages.extend(read_document_file(path))
        except csv.Error as err:
            raise InputError(f"{name} is not a readable CSV file ({err}); check its quoting") from None
        if len(passages) > limits.max_passages:
            raise InputError(f"more than {limits.max_passages:,} passages; upload less text")
    text = paste_text or ""
    if text.strip():
        if len(text) > limits.max_paste_chars:
            raise InputError(f"the pasted text has {len(text):,} characters; the limit is {limits.max_paste_chars:,}")
        passages.extend(split_into_passages((paste_title or "").strip() or "Pasted text", text))
    passages = [Passage(plain_text(p.title), plain_text(p.text)) for p in passages]
    passages = [p for p in passages if p.text.strip()]
    if not passages:
        raise InputError("Nothing to index: upload a file or paste some text first.")
    if len(passages) > limits.max_passages:
        raise InputError(f"{len(passages):,} passages; the limit is {limits.max_passages:,}. Upload less text.")
    return passages


def _failure(err: Exception) -> str:
    """The message box for an exception raised inside an event. Never a traceback."""
    if isinstance(err, EngineNotReady):
        return format_status(str(err), "wait")
    if isinstance(err, RagDemoError):
        return format_status(str(err))
    log.exception("unexpected error in a UI event", exc_info=err)
    return format_status(f"Something went wrong inside the demo ({type(err).__name__}). "
                         "The server log has the details; try another question or setting.")


def _plot_update(figure: Any) -> dict:
    return gr.update(value=figure, visible=figure is not None)


# ---------------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------------


def _api_json(endpoint: str, call) -> dict:
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
    return result.to_json()


class DemoActions:
    """One method per page event. Each parses its inputs, makes one engine call and formats the result."""

    def __init__(self, engine: Engine, *, limits: UploadLimits = UploadLimits(), files: SessionFiles | None = None):
        self.engine = engine
        self.limits = limits
        self.files = files or SessionFiles()

    # ---- helpers -----------------------------------------------------------------------------
    def kb_names(self) -> tuple[str, ...]:
        return tuple(self.engine.kb_names) if engine_ready(self.engine) else ()

    def default_kb(self) -> str | None:
        return self.engine.default_kb if engine_ready(self.engine) else None

    def kb_choices(self, mine: Held | KnowledgeBase | None) -> list[tuple[str, str]]:
        choices = [(name, name) for name in self.kb_names()]
        mine = unwrap(mine)
        if mine is not None:
            choices.append((f"{PRIVATE_LABEL}: {counted(len(mine), 'passage')}", PRIVATE_KB))
        return choices

    def resolve_kb(self, choice: str | None, mine: Held | KnowledgeBase | None) -> str | KnowledgeBase:
        mine = unwrap(mine)
        if choice == PRIVATE_KB:
            if mine is None:
                raise InputError("Build your knowledge base first in the 'Your knowledge' tab.")
            return mine
        if not choice:
            return self.engine.default_kb
        return self.known_kb(choice)

    def known_kb(self, name: str) -> str:
        """A knowledge base named by a visitor must be one the page offers: never a folder on the server."""
        names = tuple(self.engine.kb_names)  # while the engine starts, this says so (EngineNotReady)
        if not isinstance(name, str) or name not in names:
            raise InputError(f"unknown knowledge base {str(name)[:80]!r}; choose one of {', '.join(names)}")
        return name

    @staticmethod
    def fit_k(k: object, kb: str | KnowledgeBase) -> int:
        """k from the slider, lowered to the size of a visitor's own (small) knowledge base."""
        value = parse_k(k)
        return min(value, len(kb)) if isinstance(kb, KnowledgeBase) else value

    def examples(self, kb_choice: str | None) -> list[list[str]]:
        if not engine_ready(self.engine) or kb_choice == PRIVATE_KB:
            return []
        try:
            return [[q] for q in self.engine.example_questions(kb_choice or self.engine.default_kb, 8)]
        except RagDemoError as err:
            log.warning("no example questions: %s", err)
            return []

    def examples_update(self, kb_choice: str | None) -> gr.Dataset:
        """New example questions when the knowledge base changes; none for a visitor's own (the
        examples ask about the NQ passages, which it does not hold)."""
        samples = [] if kb_choice == PRIVATE_KB else self.examples(kb_choice)
        return gr.Dataset(samples=samples, visible=bool(samples))

    # ---- Ask ----------------------------------------------------------------------------------
    def ask(self, question: str, variant: str, k: float, index: str, kb_choice: str | None, num_beams: float,
            sequence_decoding: str, mine: Held | KnowledgeBase | None, retriever: str | None = None,
            extractive: bool = False,
            progress: gr.Progress = gr.Progress(),  # noqa: B008 (gradio injects a tracker here)
            ) -> tuple:
        """-> status, answer, passages, p(z|x) plot, token heatmap, sequence heatmap, gain plot, last result."""
        try:
            knowledge = self.resolve_kb(kb_choice, mine)
            result = self.engine.ask(
                require_question(question),
                kb=knowledge,
                k=self.fit_k(k, knowledge),
                index=index or "flat",
                variants=parse_variants(variant),
                num_beams=parse_beams(num_beams),
                sequence_decoding=sequence_decoding or "thorough",
                closed_book=True,
                retriever=parse_retriever(retriever),
                extractive=bool(extractive),
                progress=_progress_adapter(progress),
            )
        except Exception as err:  # the UI boundary: a message in the page, never a traceback
            return (_failure(err), *[gr.skip()] * 7)
        heat = {name: plots.posterior_heatmap(v, result.passages) for name, v in result.variants.items()}
        return (
            "",
            format_answer_html(result),
            format_passages_html(result.passages, retriever=result.retriever),
            _plot_update(plots.doc_prob_figure(result)),
            _plot_update(heat.get("token")),
            _plot_update(heat.get("sequence")),
            _plot_update(plots.retrieval_gain_figure(list(result.variants.values()))),
            Held(result),
        )

    def ask_json(self, question: str, variant: str = "both", k: int = 5, index: str = "flat", kb: str = "",
                 retriever: str = "", extractive: bool = False) -> dict:
        """The API: the AskResult as JSON. Errors come back as a gradio error with the message."""
        return _api_json("/ask_json", lambda: self.engine.ask(
            require_question(question), kb=self.known_kb(kb) if kb else self.engine.default_kb, k=parse_k(k),
            index=index or "flat", variants=parse_variants(variant), retriever=parse_retriever(retriever),
            extractive=bool(extractive)))

    # ---- Compare retrievers ---------------------------------------------------------------------
    def compare(self, question: str, kb_choice: str | None, k: float, mine: Held | KnowledgeBase | None) -> tuple[str, str]:
        """-> status, comparison: the same question, KB and k under each retriever the engine offers."""
        try:
            knowledge = self.resolve_kb(kb_choice, mine)
            comparison = self.engine.compare_retrievers(require_question(question), kb=knowledge, k=self.fit_k(k, knowledge))
        except Exception as err:  # the UI boundary
            return _failure(err), gr.skip()
        return "", format_comparison_html(comparison)

    def compare_json(self, question: str, kb: str = "", k: int = 5) -> dict:
        """The API: the RetrieverComparison as JSON. Errors come back as a gradio error with the message."""
        return _api_json("/compare_json", lambda: self.engine.compare_retrievers(
            require_question(question), kb=self.known_kb(kb) if kb else self.engine.default_kb, k=parse_k(k)))

    # ---- Swap the index -----------------------------------------------------------------------
    def swap(self, question: str, left: str | None, right: str | None, variant: str, k: float,
             mine: Held | KnowledgeBase | None,
             progress: gr.Progress = gr.Progress(),  # noqa: B008 (gradio injects a tracker here)
             ) -> tuple[str, str, str, str]:
        """-> status, summary, left column, right column. Same question and model, two knowledge bases."""
        try:
            question = require_question(question)
            sides = [self.resolve_kb(left, mine), self.resolve_kb(right, mine)]
            report = _progress_adapter(progress)
            a, b = (self.engine.ask(question, kb=kb, k=self.fit_k(k, kb), variants=parse_variants(variant),
                                    closed_book=False, progress=_part_of(report, side, len(sides), getattr(kb, "name", kb)))
                    for side, kb in enumerate(sides))
        except Exception as err:  # the UI boundary
            return _failure(err), gr.skip(), gr.skip(), gr.skip()
        return "", format_swap_summary(a, b), format_swap_column(a), format_swap_column(b)

    # ---- Your knowledge -----------------------------------------------------------------------
    def _kb_outputs(self, mine: KnowledgeBase) -> list:
        choices = self.kb_choices(mine)
        return [gr.update(choices=choices) for _ in range(5)]

    def build_mine(self, files: list[str] | None, paste_title: str, paste_text: str, mine: Held | KnowledgeBase | None,
                   progress: gr.Progress = gr.Progress(),  # noqa: B008 (gradio injects a tracker here)
                   request: gr.Request | None = None) -> tuple:
        """-> status, state, passage picker, its title and text, preview, and the 5 knowledge-base dropdowns."""
        started = time.perf_counter()
        try:
            if files and len(files) > self.limits.max_files:
                raise InputError(f"{len(files)} files uploaded; the limit is {self.limits.max_files}. Remove some and build again.")
            session = getattr(request, "session_hash", None)
            if files and session:
                files = self.files.adopt(session, files)
            passages = passages_from_inputs(files, paste_title, paste_text, limits=self.limits)
            kb = self.engine.build_kb(PRIVATE_NAME, passages, progress=_progress_adapter(progress))
        except Exception as err:  # the UI boundary: the session keeps its previous knowledge base
            return (_failure(err), mine, *[gr.skip()] * 9)
        sources = len(files or []) + (1 if (paste_text or "").strip() else 0)
        status = format_status(
            f"Indexed {counted(len(kb), 'passage')} from {counted(sources, 'source')} in "
            f"{time.perf_counter() - started:.1f} s. "
            f"Ask below, or pick “{PRIVATE_LABEL}” in the other tabs.", "ok")
        return self._mine_outputs(status, kb)

    def _mine_outputs(self, status: str, kb: KnowledgeBase) -> tuple:
        picker = gr.update(choices=passage_choices(kb), value=0)
        return (status, Held(kb), picker, kb.titles[0], kb.texts[0], format_kb_preview(kb), *self._kb_outputs(kb))

    def pick_passage(self, position: int | None, mine: Held | KnowledgeBase | None) -> tuple[str, str]:
        mine = unwrap(mine)
        if mine is None or position is None or not 0 <= int(position) < len(mine):
            return "", ""
        return mine.titles[int(position)], mine.texts[int(position)]

    def save_passage(self, position: int | None, title: str, text: str, mine: Held | KnowledgeBase | None,
                     progress: gr.Progress = gr.Progress()) -> tuple:  # noqa: B008 (gradio injects a tracker here)
        """Replace one passage (empty text removes it) and re-index. Same outputs as `build_mine`."""
        kb_before = unwrap(mine)
        try:
            if kb_before is None:
                raise InputError("Build your knowledge base first, then pick a passage to edit.")
            if position is None or not 0 <= int(position) < len(kb_before):
                raise InputError("Pick a passage to edit.")
            passages = [kb_before.passage(i) for i in range(len(kb_before))]
            if (text or "").strip():
                passages[int(position)] = Passage(title=plain_text(title or "").strip(), text=" ".join(plain_text(text).split()))
                what = f"Saved passage {int(position) + 1}"
            else:
                del passages[int(position)]
                what = f"Removed passage {int(position) + 1}"
            kb = self.engine.build_kb(PRIVATE_NAME, passages, progress=_progress_adapter(progress))
        except Exception as err:  # the UI boundary
            return (_failure(err), mine, *[gr.skip()] * 9)
        return self._mine_outputs(format_status(f"{what} and re-indexed {counted(len(kb), 'passage')}. Ask again.", "ok"), kb)

    def ask_mine(self, question: str, mine: Held | KnowledgeBase | None,
                 progress: gr.Progress = gr.Progress(),  # noqa: B008 (gradio injects a tracker here)
                 ) -> tuple[str, str, str]:
        """-> status, answer, passages: both variants against the visitor's own knowledge base."""
        kb = unwrap(mine)
        try:
            if not isinstance(kb, KnowledgeBase):
                raise InputError("Build your knowledge base first (upload or paste text above).")
            result = self.engine.ask(require_question(question), kb=kb, k=min(5, len(kb)),
                                     variants=("token", "sequence"), progress=_progress_adapter(progress))
        except Exception as err:  # the UI boundary
            return _failure(err), gr.skip(), gr.skip()
        return "", format_answer_html(result), format_passages_html(result.passages, retriever=result.retriever)

    # ---- Score your answer ----------------------------------------------------------------------
    def score(self, question: str, answer: str, kb_choice: str | None, k: float, index: str,
              mine: Held | KnowledgeBase | None,
              progress: gr.Progress = gr.Progress(),  # noqa: B008 (gradio injects a tracker here)
              ) -> tuple:
        """-> status, cards, token heatmap, sequence heatmap, gain plot."""
        try:
            if not any(isinstance(text, str) and text.strip() for text in (question, answer)):
                raise InputError("Type a question and the answer to score for it.")
            answer = require_answer(answer)
            knowledge = self.resolve_kb(kb_choice, mine)
            result = self.engine.score(require_question(question), answer, kb=knowledge,
                                       k=self.fit_k(k, knowledge), index=index or "flat", variants=("token", "sequence"),
                                       progress=_progress_adapter(progress))
        except Exception as err:  # the UI boundary
            return (_failure(err), *[gr.skip()] * 4)
        heat = {name: plots.posterior_heatmap(v, result.passages) for name, v in result.variants.items()}
        return ("", format_score_html(result), _plot_update(heat.get("token")), _plot_update(heat.get("sequence")),
                _plot_update(plots.retrieval_gain_figure(list(result.variants.values()))))

    # ---- Index variants -----------------------------------------------------------------------
    def index_reports(self, kb_choice: str | None, mine: Held | KnowledgeBase | None) -> tuple:
        """-> status, table, figure."""
        try:
            kb = self.resolve_kb(kb_choice, mine)
            reports = self.engine.index_reports(kb)
        except Exception as err:  # the UI boundary
            return _failure(err), gr.skip(), gr.skip()
        name = kb.name if isinstance(kb, KnowledgeBase) else kb
        return "", format_index_table(reports, name), _plot_update(plots.index_report_figure(reports))

    # ---- Learn --------------------------------------------------------------------------------
    def learn_tokens(self, result: Held | AskResult | None) -> tuple:
        """-> token picker, walkthrough. Defaults to the first token (Figure 2's interesting one)."""
        result = unwrap(result)
        choices = learn_token_choices(result)
        return gr.update(choices=choices, value=0 if choices else None), format_learn_html(result, 0)

    def learn(self, result: Held | AskResult | None, position: int | None) -> str:
        return format_learn_html(unwrap(result), position)

    @staticmethod
    def carry_question(result: Held | AskResult | None, typed: str | None):
        """The Score tab's question: the last asked one, unless the visitor already typed one there."""
        result = unwrap(result)
        if result is None or (typed or "").strip():
            return gr.skip()
        return result.question

    # ---- the end of a session -------------------------------------------------------------------
    def end_session(self, request: gr.Request) -> None:
        """The tab was closed: delete the visitor's uploaded files now."""
        session = getattr(request, "session_hash", None)
        if session:
            self.files.drop(session)

    def release_kb(self, mine: Held | KnowledgeBase | None) -> None:
        """Gradio dropped the session's knowledge base: let the engine forget its indexes too."""
        kb = unwrap(mine)
        release = getattr(self.engine, "release_kb", None)
        if isinstance(kb, KnowledgeBase) and release is not None and engine_ready(self.engine):
            release(kb)

    # ---- first start --------------------------------------------------------------------------
    def retriever_options(self) -> dict:
        """The retriever radio's choices and value: dense and BM25 always, Dense + BM25 when the engine has a lexical weight."""
        if not engine_ready(self.engine):  # no value yet: an API call then gets the engine's own default
            return {"value": None, "visible": False}
        offered = tuple(self.engine.retrievers)
        return {"choices": [(RETRIEVER_NAMES.get(r, r), r) for r in offered],
                "value": "hybrid" if "hybrid" in offered else "dense", "visible": True}

    def poll(self, announced: bool) -> tuple:
        """-> banner, timer, announced, 5 KB dropdowns, 2 example sets, the retriever radio.
        Sends choices once the engine is ready."""
        if not engine_ready(self.engine):
            failed = bool(getattr(self.engine, "failed", False))
            text = self.engine.status_text() if hasattr(self.engine, "status_text") else "Preparing…"
            banner = format_status(text, "error" if failed else "wait")
            return (banner, gr.Timer(active=not failed), False, *[gr.skip()] * 8)
        if announced:
            return ("", gr.Timer(active=False), True, *[gr.skip()] * 8)
        names = self.kb_names()
        default = self.default_kb()
        right = next((n for n in names if n != default), default)
        choices = self.kb_choices(None)
        samples = self.examples(default)
        return (
            "", gr.Timer(active=False), True,
            gr.update(choices=choices, value=default), gr.update(choices=choices, value=default),
            gr.update(choices=choices, value=right), gr.update(choices=choices, value=default),
            gr.update(choices=choices, value=default),
            gr.Dataset(samples=samples, visible=bool(samples)), gr.Dataset(samples=samples, visible=bool(samples)),
            gr.update(**self.retriever_options()),
        )


def _progress_adapter(progress: gr.Progress | None) -> ProgressFn | None:
    if progress is None:
        return None

    def report(stage: str, done: int, total: int) -> None:
        progress((done, total) if total else None, desc=stage)

    return report


def _part_of(report: ProgressFn | None, part: int, parts: int, label: str) -> ProgressFn | None:
    """`report` for the `part`-th of `parts` equal jobs: one bar across all of them, each stage labelled."""
    if report is None:
        return None

    def report_part(stage: str, done: int, total: int) -> None:
        report(f"{label}: {stage}", part * total + done, parts * total)

    return report_part


# ---------------------------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------------------------

INTRO = (
    '<div class="rag-header"><h1>RAG provenance explorer</h1><p>Retrieval-Augmented Generation '
    "(Lewis et al., NeurIPS 2020): a retriever picks passages, a generator writes the answer; "
    "trace each answer token back to the passages that made it likely.</p></div>"
)


def launch_options() -> dict:
    """Theme and CSS for `demo.launch(**launch_options(), ...)` (gradio 6 takes them at launch)."""
    return {
        "theme": gr.themes.Soft(primary_hue="indigo", secondary_hue="teal", spacing_size="sm", radius_size="md",
                                font=["ui-sans-serif", "system-ui", "Segoe UI", "Roboto", "sans-serif"]),
        "css_paths": [ASSETS / "style.css"],
    }


def _html(elem_id: str, value: str = "", **options: Any) -> gr.HTML:
    return gr.HTML(value, elem_id=elem_id, js_on_load=None, **options)


def _status(elem_id: str, value: str = "") -> gr.HTML:
    """A message box that takes no room while empty (see .rag-autohide in assets/style.css)."""
    return gr.HTML(value, elem_id=elem_id, js_on_load=None, elem_classes=["rag-autohide"])


def build_demo(engine: Engine, *, limits: UploadLimits = UploadLimits(), files: SessionFiles | None = None) -> gr.Blocks:
    """The page for `engine`. Launch it with `demo.launch(**launch_options())`; the queue is set here.

    `files` holds visitors' uploads (default: a new private temporary folder).
    """
    actions = DemoActions(engine, limits=limits, files=files)
    names = actions.kb_names()
    default = actions.default_kb()
    right_default = next((n for n in names if n != default), default)
    kb_choices = actions.kb_choices(None)
    samples = actions.examples(default)
    ready = engine_ready(engine)

    def kb_dropdown(elem_id: str, value: str | None, label: str = "Knowledge base") -> gr.Dropdown:
        # The choices reach the page once the engine is ready; API calls see only the choices the
        # page was built with, so names are checked by `resolve_kb` instead of by gradio.
        return gr.Dropdown(kb_choices, value=value, label=label, elem_id=elem_id, min_width=150,
                           allow_custom_value=True, elem_classes=["rag-fit-dropdown"])

    def index_dropdown(elem_id: str) -> gr.Dropdown:
        return gr.Dropdown(INDEX_CHOICES, value="flat", label="Index variant", elem_id=elem_id, min_width=150)

    def k_slider(elem_id: str) -> gr.Slider:
        return gr.Slider(1, LIMITS.max_k, value=5, step=1, label="k passages", elem_id=elem_id, min_width=150,
                         info="more passages: slower answers")

    with gr.Blocks(title="RAG provenance explorer", delete_cache=(3600, 3600)) as demo:
        def release_kb(value: Any) -> None:
            # A plain function, not a bound method: gradio deep-copies components' arguments for every new
            # session, and a bound method would be copied with its object (the engine: gigabytes per visitor).
            actions.release_kb(value)

        # Held(KnowledgeBase): this visitor's own passages; gradio deletes it 1 h after the tab closes (or after the TTL)
        mine = gr.State(None, time_to_live=STATE_TTL_S, delete_callback=release_kb)
        last = gr.State(None, time_to_live=STATE_TTL_S)  # Held(AskResult): the last answer, for Learn
        announced = gr.State(False)
        gr.HTML(INTRO, js_on_load=None)
        banner = _status("status-banner", "" if ready else format_status("Preparing models and indexes…", "wait"))
        timer = gr.Timer(1.0, active=not ready)

        # on phones the tab names wrap onto a second line instead of hiding behind an unlabeled "⋯"
        with gr.Tabs(elem_id="tabs", overflow_behavior="wrap"):
            # ---------------------------------------------------------------- Ask
            with gr.Tab("Ask", id="ask", elem_id="tab-ask"):
                with gr.Row():
                    with gr.Column(scale=1, min_width=330, elem_classes=["rag-sidebar"]):
                        question = gr.Textbox(label="Question", lines=2, max_lines=4, elem_id="question",
                                              max_length=QUESTION_BOX_CHARS, placeholder="Ask a factual question, or click an example below")
                        ask_btn = gr.Button("Ask", variant="primary", elem_id="ask-btn", size="md")
                        variant = gr.Radio(VARIANT_CHOICES, value="both", label="RAG variant", elem_id="variant")
                        with gr.Row():
                            kb = kb_dropdown("kb", default)
                            index = index_dropdown("index")
                        examples = gr.Dataset(components=[question], samples=samples, elem_id="examples",
                                              label="Examples", samples_per_page=8, layout="gallery",
                                              visible=bool(samples))
                        with gr.Row():
                            k = k_slider("k")
                            beams = gr.Slider(1, LIMITS.max_beams, value=1, step=1, label="Beams", elem_id="beams",
                                              min_width=140)
                        decoding = gr.Radio(DECODING_CHOICES, value="thorough", label="RAG-Sequence decoding",
                                            elem_id="seq-decoding")
                        retriever = gr.Radio(label="Retriever", elem_id="retriever",
                                             **{"choices": RETRIEVER_CHOICES, **actions.retriever_options()})
                        compare_btn = gr.Button("Compare retrievers", elem_id="compare-btn", size="sm")
                        extractive = gr.Checkbox(False, label="Answers copy a passage span", elem_id="extractive",
                                                 info="Decoding may only copy a run of a retrieved passage's words; "
                                                      "the probabilities shown stay the model's own.")
                    with gr.Column(scale=3, min_width=600):
                        ask_status = _status("ask-status")
                        comparison = _html("compare")  # empty until "Compare retrievers"; a new ask clears it
                        answer = _html("answer", format_status("Ask a question, or click an example.", "info"))
                        with gr.Row():
                            with gr.Column(scale=3, min_width=320):
                                passages = _html("passages", max_height=440)
                            with gr.Column(scale=2, min_width=260):
                                doc_prob = gr.Plot(label="p(z|x)", elem_id="doc-prob", show_label=False, visible=False)
                with gr.Row():  # side by side on a wide screen, one under the other on a phone
                    with gr.Column(min_width=420):
                        heat_token = gr.Plot(label="RAG-Token posterior", elem_id="heat-token", show_label=False, visible=False)
                    with gr.Column(min_width=420):
                        heat_seq = gr.Plot(label="RAG-Sequence posterior", elem_id="heat-seq", show_label=False, visible=False)
                gain = gr.Plot(label="Retrieval gain", elem_id="gain", show_label=False, visible=False)

            # ---------------------------------------------------------------- Swap
            with gr.Tab("Swap the index", id="swap", elem_id="tab-swap"):
                with gr.Row():
                    with gr.Column(scale=1, min_width=330, elem_classes=["rag-sidebar"]):
                        swap_question = gr.Textbox(label="Question", lines=2, max_lines=4, elem_id="swap-question",
                                                   max_length=QUESTION_BOX_CHARS, placeholder="Ask a factual question, or click an example below")
                        swap_btn = gr.Button("Ask both", variant="primary", elem_id="swap-btn", size="md")
                        # one per line: two side by side cut long KB names such as "nq-counterfactual"
                        swap_left = kb_dropdown("swap-left", default, "Left knowledge base")
                        swap_right = kb_dropdown("swap-right", right_default, "Right knowledge base")
                        swap_variant = gr.Radio(VARIANT_CHOICES, value="token", label="RAG variant",
                                                elem_id="swap-variant")
                        swap_k = k_slider("swap-k")
                        swap_examples = gr.Dataset(components=[swap_question], samples=samples, label="Examples",
                                                   elem_id="swap-examples", samples_per_page=8, layout="gallery",
                                                   visible=bool(samples))
                    with gr.Column(scale=3, min_width=600):
                        gr.HTML('<p class="rag-help">The same model answers the same question against two knowledge '
                                "bases. <b>nq-counterfactual</b> holds the passages of <b>nq-wiki</b> with each answer "
                                "swapped for another person's name, the same name wherever that answer appears "
                                "(from BIG-bench's knowledge-conflict task), so its passages are false on purpose, "
                                "and consistently so: an answer that follows them was read from "
                                "the index, not remembered by the model. In the paper, swapping a 2016 Wikipedia index "
                                "for a 2018 one updated answers about world leaders without retraining: the knowledge "
                                "lives in the index.</p>", js_on_load=None)
                        swap_status = _status("swap-status")
                        swap_summary = _html("swap-summary")
                        with gr.Row():  # side by side; stacked on a narrow screen
                            with gr.Column(min_width=320):
                                swap_left_out = _html("swap-left-out")
                            with gr.Column(min_width=320):
                                swap_right_out = _html("swap-right-out")

            # ---------------------------------------------------------------- Your knowledge
            with gr.Tab("Your knowledge", id="mine", elem_id="tab-mine"):
                gr.HTML(f'<p class="rag-help">{esc(limits.describe())}</p>', js_on_load=None)
                with gr.Row():
                    with gr.Column(scale=1, min_width=360):
                        mine_files = gr.File(label="Upload text files", file_count="multiple",
                                             file_types=list(SOURCE_SUFFIXES), elem_id="mine-files", height=120)
                        mine_paste_title = gr.Textbox(label="Title for pasted text", elem_id="mine-paste-title",
                                                      placeholder="Pasted text")
                        mine_paste = gr.Textbox(label=f"…or paste text (≤ {limits.max_paste_chars:,} characters)", lines=5,
                                                max_lines=12, elem_id="mine-paste")
                        mine_build = gr.Button("Build my knowledge base", variant="primary", elem_id="mine-build")
                        mine_status = _html("mine-status", format_status(
                            "No knowledge base yet: upload or paste text, then build it.", "info"), min_height=70)
                    with gr.Column(scale=1, min_width=360):
                        mine_pick = gr.Dropdown([], value=None, label="Edit a passage", elem_id="mine-passage",
                                                type="value", elem_classes=["rag-fit-dropdown"])
                        mine_edit_title = gr.Textbox(label="Title", elem_id="mine-edit-title")
                        mine_edit_text = gr.Textbox(label="Text (empty removes the passage)", lines=4, max_lines=10,
                                                    elem_id="mine-edit-text")
                        mine_save = gr.Button("Save passage and re-index", elem_id="mine-save")
                        mine_preview = _html("mine-preview", max_height=220)
                with gr.Row(equal_height=True):
                    mine_question = gr.Textbox(label="Ask your knowledge base", elem_id="mine-question", scale=6,
                                               max_length=QUESTION_BOX_CHARS)
                    mine_ask = gr.Button("Ask", variant="primary", elem_id="mine-ask", scale=1, min_width=110)
                mine_ask_status = _status("mine-ask-status")
                mine_answer = _html("mine-answer")
                mine_passages = _html("mine-passages", max_height=400)

            # ---------------------------------------------------------------- Score
            with gr.Tab("Score your answer", id="score", elem_id="tab-score"):
                gr.HTML('<p class="rag-help">Type an answer of your own: both variants score it, log p(answer | question), '
                        "with the per-token provenance of each word.</p>", js_on_load=None)
                with gr.Row(equal_height=True):
                    score_question = gr.Textbox(label="Question", elem_id="score-question", scale=4,
                                                max_length=QUESTION_BOX_CHARS)
                    score_answer = gr.Textbox(label="Your answer", elem_id="score-answer", scale=3,
                                              max_length=ANSWER_BOX_CHARS)
                    score_btn = gr.Button("Score", variant="primary", elem_id="score-btn", scale=1, min_width=110)
                with gr.Row(elem_classes=["rag-options"]):
                    score_kb = kb_dropdown("score-kb", default)
                    score_k = k_slider("score-k")
                    score_index = index_dropdown("score-index")
                score_status = _status("score-status")
                score_out = _html("score-out")
                with gr.Row():
                    with gr.Column(min_width=420):
                        score_heat_token = gr.Plot(elem_id="score-heat-token", show_label=False, visible=False)
                    with gr.Column(min_width=420):
                        score_heat_seq = gr.Plot(elem_id="score-heat-seq", show_label=False, visible=False)
                score_gain = gr.Plot(elem_id="score-gain", show_label=False, visible=False)

            # ---------------------------------------------------------------- Index variants
            with gr.Tab("Index variants", id="index", elem_id="tab-index"):
                gr.HTML('<p class="rag-help">Exact (flat) search against two approximate indexes: an HNSW graph and '
                        "IVF-PQ (the paper's compressed index: 36 GB instead of about 100 GB). Recall@k is measured against "
                        "flat; the Ask tab shows the chosen variant's recall next to every answer.</p>", js_on_load=None)
                with gr.Row(equal_height=True):
                    idx_kb = kb_dropdown("idx-kb", default)
                    idx_btn = gr.Button("Compare index variants", variant="primary", elem_id="idx-btn", min_width=200)
                idx_status = _status("idx-status")
                idx_table = _html("idx-table")
                idx_plot = gr.Plot(elem_id="idx-plot", show_label=False, visible=False)

            # ---------------------------------------------------------------- Learn
            with gr.Tab("Learn", id="learn", elem_id="tab-learn"):
                gr.HTML('<p class="rag-help">The two RAG equations, worked through with the numbers of your last '
                        "question in the Ask tab.</p>", js_on_load=None)
                learn_token = gr.Dropdown([], value=None, label="Answer token for step 2", elem_id="learn-token",
                                          type="value", min_width=240, elem_classes=["rag-fit-dropdown"])
                learn_out = _html("learn-out", format_learn_html(None))
                with gr.Accordion("Words used on this page", open=False, elem_id="glossary"):
                    gr.HTML(format_glossary_html(), js_on_load=None)

        # ---------------------------------------------------------------- events
        engine_events = dict(concurrency_id=ENGINE_GROUP, concurrency_limit=1)
        kb_dropdowns = [kb, swap_left, swap_right, score_kb, idx_kb]
        poll_outputs = [banner, timer, announced, *kb_dropdowns, examples, swap_examples, retriever]
        demo.load(actions.poll, inputs=announced, outputs=poll_outputs, api_visibility="private",
                  show_progress="hidden", queue=False)
        timer.tick(actions.poll, inputs=announced, outputs=poll_outputs, api_visibility="private",
                   show_progress="hidden", queue=False)

        # On a narrow screen the controls stack above the results: bring the results into view when
        # an ask starts (the progress shows there) and again when it is answered (the page has grown)
        scroll_to = {name: dict(fn=None, js=scroll_into_view_js(name), queue=False, api_visibility="private")
                     for name in ("answer", "swap-summary", "score-out", "compare")}
        gr.on([ask_btn.click, question.submit, examples.click], **scroll_to["answer"])
        gr.on([swap_btn.click, swap_question.submit, swap_examples.click], **scroll_to["swap-summary"])
        gr.on([score_btn.click, score_answer.submit], **scroll_to["score-out"])
        ask_inputs = [question, variant, k, index, kb, beams, decoding, mine, retriever, extractive]
        ask_outputs = [ask_status, answer, passages, doc_prob, heat_token, heat_seq, gain, last]
        # one progress bar, where the answer will show: it names the step that runs (engine.ask)
        gr.on([ask_btn.click, question.submit], actions.ask, inputs=ask_inputs, outputs=ask_outputs, api_name="ask",
              show_progress_on=answer, **engine_events).then(**scroll_to["answer"])
        # the comparison above the answer belongs to an earlier question once a new one is asked
        gr.on([ask_btn.click, question.submit, examples.click], lambda: "", outputs=comparison, api_visibility="private",
              queue=False)
        compare_btn.click(**scroll_to["compare"])
        compare_btn.click(actions.compare, inputs=[question, kb, k, mine], outputs=[ask_status, comparison], api_name="compare",
                          show_progress_on=comparison, **engine_events).then(**scroll_to["compare"])
        examples.click(lambda sample: sample[0] if sample else gr.skip(), inputs=examples, outputs=question,
                       api_visibility="private", queue=False).then(
            actions.ask, inputs=ask_inputs, outputs=ask_outputs, api_visibility="private", show_progress_on=answer,
            **engine_events).then(**scroll_to["answer"])
        kb.change(actions.examples_update, inputs=kb, outputs=examples,
                  api_visibility="private", queue=False)
        last.change(actions.learn_tokens, inputs=last, outputs=[learn_token, learn_out], api_visibility="private",
                    queue=False)
        last.change(actions.carry_question, inputs=[last, score_question], outputs=score_question,
                    api_visibility="private", queue=False)
        learn_token.change(actions.learn, inputs=[last, learn_token], outputs=learn_out, api_visibility="private",
                           queue=False)

        swap_inputs = [swap_question, swap_left, swap_right, swap_variant, swap_k, mine]
        swap_outputs = [swap_status, swap_summary, swap_left_out, swap_right_out]
        gr.on([swap_btn.click, swap_question.submit], actions.swap, inputs=swap_inputs, outputs=swap_outputs,
              api_name="swap", show_progress_on=swap_summary, **engine_events).then(**scroll_to["swap-summary"])
        swap_examples.click(lambda sample: sample[0] if sample else gr.skip(), inputs=swap_examples,
                            outputs=swap_question, api_visibility="private", queue=False).then(
            actions.swap, inputs=swap_inputs, outputs=swap_outputs, api_visibility="private",
            show_progress_on=swap_summary, **engine_events).then(**scroll_to["swap-summary"])

        mine_outputs = [mine_status, mine, mine_pick, mine_edit_title, mine_edit_text, mine_preview, *kb_dropdowns]
        mine_build.click(actions.build_mine, inputs=[mine_files, mine_paste_title, mine_paste, mine],
                         outputs=mine_outputs, api_name="build_kb", show_progress_on=mine_status, **engine_events)
        mine_pick.change(actions.pick_passage, inputs=[mine_pick, mine], outputs=[mine_edit_title, mine_edit_text],
                         api_visibility="private", queue=False)
        mine_save.click(actions.save_passage, inputs=[mine_pick, mine_edit_title, mine_edit_text, mine],
                        outputs=mine_outputs, api_name="edit_passage", show_progress_on=mine_status, **engine_events)
        gr.on([mine_ask.click, mine_question.submit], actions.ask_mine, inputs=[mine_question, mine],
              outputs=[mine_ask_status, mine_answer, mine_passages], api_name="ask_mine", show_progress_on=mine_answer,
              **engine_events)

        gr.on([score_btn.click, score_answer.submit], actions.score,
              inputs=[score_question, score_answer, score_kb, score_k, score_index, mine],
              outputs=[score_status, score_out, score_heat_token, score_heat_seq, score_gain], api_name="score",
              show_progress_on=score_out, **engine_events).then(**scroll_to["score-out"])
        idx_btn.click(actions.index_reports, inputs=[idx_kb, mine], outputs=[idx_status, idx_table, idx_plot],
                      api_name="index_reports", **engine_events)

        def ask_json(question: str, variant: str = "both", k: int = 5, index: str = "flat", kb: str = "",
                     retriever: str = "", extractive: bool = False) -> dict:
            """Ask a question; returns the full AskResult as JSON. variant: token, sequence or both;
            retriever: dense, bm25, hybrid, or empty for the engine's default; extractive: answers copy a passage span."""
            return actions.ask_json(question, variant, k, index, kb, retriever, extractive)

        gr.api(ask_json, api_name="ask_json", **engine_events)

        def compare_json(question: str, kb: str = "", k: int = 5) -> dict:
            """The top k passages of each retriever (dense, bm25, and hybrid when offered) for one question, by exact
            search; returns the RetrieverComparison as JSON, with the gold passage's rank where the KB knows it."""
            return actions.compare_json(question, kb, k)

        gr.api(compare_json, api_name="compare_json", **engine_events)
        demo.unload(actions.end_session)

    demo.queue(default_concurrency_limit=1)
    return demo

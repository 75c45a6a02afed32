"""Passage cards and the views made of them: an ask's passages with p(z|x) and ∅ memory's card, the retriever
comparison's columns, and one side of the index swap (HTML; every string from outside escaped)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from .. import plots
from ..config import RETRIEVER_NAMES
from ..results import AskResult, RetrievedPassage, RetrieverComparison, RetrieverRanking
from .html import (MEMORY_MEANS, esc, format_answer_html, format_index_badge, format_notices, format_timings,
                   question_text)
from .sentences import fmt_prob


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


NO_ANSWER_TIP = ("how sure the reader is that this passage does not answer: the probability it gives to beginning "
                 "its answer with (no answer). No answer may begin that way, so this share is in no answer's p(y|x)")


def format_memory_card(memory_prob: float, memory_logit: float | None, *, leads: bool) -> str:
    """The card of ∅ among the passage cards: p(∅|x) with a bar in memory's grey, and what it means."""
    logit = "" if memory_logit is None else f"logit θ {memory_logit:.2f} · "
    lead = (' <span class="rag-memory-lead">the largest source</span>' if leads else "")
    return (
        f'<div class="rag-passage rag-passage-memory" style="border-left-color:{plots.MEMORY_COLOR}">'
        f'<div class="rag-passage-head"><span class="rag-rank" style="background:{plots.MEMORY_COLOR};color:{plots.text_color_on(plots.MEMORY_COLOR)}">∅</span>'
        f'<span class="rag-passage-title">memory</span>{lead}'
        f'<span class="rag-passage-nums">{logit}p(∅|x) <b>{fmt_prob(memory_prob)}</b></span></div>'
        f'<div class="rag-pbar"><span style="width:{100 * memory_prob:.1f}%;background:{plots.MEMORY_COLOR}"></span></div>'
        f'<div class="rag-passage-text">{esc(MEMORY_MEANS)}</div></div>'
    )


def format_passages_html(passages: Sequence[RetrievedPassage], *, max_chars: int | None = None,
                         retriever: str = "dense", gold_ids: Collection[int] = (), no_answer: Sequence[float] = (),
                         memory_prob: float | None = None, memory_logit: float | None = None) -> str:
    """Passage cards: rank, title, the retriever's scores by name, p(z|x) with a bar, and the text;
    then ∅ memory's card when it is a source (`memory_prob`, p(∅|x)).

    Passages whose row is in `gold_ids` are marked gold; `no_answer` (one per passage, from
    `AskResult.no_answer`) adds the reader's verdict that a passage does not answer."""
    if not passages:
        return '<div class="rag-empty">No passages retrieved.</div>'
    cards = []
    verdicts = list(no_answer) if len(no_answer) == len(passages) else [None] * len(passages)
    for p, verdict in zip(passages, verdicts):
        color = plots.passage_color(p.rank)
        reader = ("" if verdict is None else
                  f' · <span title="{esc(NO_ANSWER_TIP)}">p(no answer) <b>{verdict:.2f}</b></span>')
        text = p.text if max_chars is None else plots.shorten(p.text, max_chars)
        if text[:1].islower():  # a passage cut from the middle of an article's text starts mid-sentence
            text = "… " + text
        gold = p.id in gold_ids
        cards.append(
            f'<div class="rag-passage{" rag-passage-gold" if gold else ""}" style="border-left-color:{color}">'
            f'<div class="rag-passage-head"><span class="rag-rank" style="background:{color};color:{plots.text_color_on(color)}">#{p.rank}</span>'
            f'<span class="rag-passage-title">{esc(p.title) if p.title.strip() else _untitled(p.id)}</span>'
            + (f'<span class="rag-part" title="one article cut into consecutive passages">part {p.part} of {p.parts}'
               '</span>' if p.parts > 1 else "")
            + f'{GOLD_MARK if gold else ""}'
            f'<span class="rag-passage-nums">{_score_names(p, retriever)} · p(z|x) <b>{p.prob:.3f}</b>{reader}</span></div>'
            f'<div class="rag-pbar"><span style="width:{100 * p.prob:.1f}%;background:{color}"></span></div>'
            f'<div class="rag-passage-text">{esc(text)}</div></div>'
        )
    # with hybrid retrieval the dense score alone does not give the order, which surprises readers
    order = ('<div class="rag-muted rag-order-note">ranked by p(z|x), which adds the BM25 score to the dense '
             "score: a lower score can rank higher</div>" if retriever == "hybrid" and len(passages) > 1 else "")
    if memory_prob is not None:
        cards.append(format_memory_card(memory_prob, memory_logit, leads=memory_prob > max(p.prob for p in passages)))
    return f'<div class="rag-passages">{order}{"".join(cards)}</div>'


def format_result_passages(result: AskResult) -> str:
    """An answer's passage cards with the reader's verdicts, and ∅ memory's card when it is a source."""
    return format_passages_html(result.passages, retriever=result.retriever, no_answer=result.no_answer,
                                memory_prob=result.memory_prob, memory_logit=result.memory_logit)


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
        summary = f"The gold passage (marked {GOLD_MARK}), the one this question was written from: {found}"
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
        f'<div class="rag-answer-block"><div class="rag-question">{question_text(comparison.question)} <span class="rag-kb">'
        f"knowledge base <b>{esc(comparison.kb)}</b></span>"
        f'<span class="rag-badge" title="every retriever scores every passage here; the Index variant setting '
        f'does not apply">top {comparison.k} · exact search</span></div>'
        f'{format_notices(comparison.notices)}<div class="rag-compare-summary">{summary}</div>'
        '<div class="rag-cands">p(z|x) here is over each retriever\'s k passages alone, as in the paper; where the '
        "generator's memory ∅ is a source of an ask, the ask's p(z|x) shares the weight with it and reads lower.</div>"
        f'<div class="rag-compare">{columns}</div>{format_timings(comparison.timings_ms)}</div>'
    )


def format_swap_column(result: AskResult) -> str:
    """One side of the index swap: the answers, p(∅|x), and the top 3 passages of that knowledge base."""
    passages = format_passages_html(result.passages[:3], max_chars=220, retriever=result.retriever,
                                    memory_prob=result.memory_prob, memory_logit=result.memory_logit)
    return (
        f'<div class="rag-swap-col"><div class="rag-swap-head"><span class="rag-kb">knowledge base <b>{esc(result.kb)}</b></span> '
        f'{format_index_badge(result)}</div>'
        f"{format_answer_html(result, closed_book=False, legend=False, question=False)}"
        f"{passages}{_more_passages_note(len(result.passages), 3)}</div>"
    )


def _more_passages_note(total: int, shown: int) -> str:
    if total <= shown:
        return ""
    return f'<div class="rag-muted">the top {shown} of the {total} passages the answers read</div>'

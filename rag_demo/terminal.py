"""What the command line prints for an ask, a score and a retriever comparison (`cli`'s plain text).

Importing this module loads nothing heavy.
"""

from __future__ import annotations

import math
import sys

from .config import RETRIEVER_NAMES
from .results import memory_share
from .plots import MEMORY_NAME, MEMORY_WHAT, logit_formula, memory_leads, source_posteriors
from .ui.sentences import evidence


def _fmt_prob(logprob: float) -> str:
    return f"{math.exp(logprob):.3f}" if logprob > -700 else "0"


def print_summary(result, out=sys.stdout) -> None:
    w = out.write
    w(f"Question: {result.question}\n")
    for notice in result.notices:
        w(f"Note: {notice}\n")
    recall = "" if result.index_recall is None else f", recall@{result.k} vs flat {result.index_recall:.2f}"
    how = {"hybrid": f"{result.index} index, dense + {result.lexical_weight:g}·BM25",
           "bm25": f"BM25 over every passage, p(z|x) = softmax({result.scale:g}·bm25)"}.get(result.retriever, f"{result.index} index, dense")
    w(f"\nRetrieved from {result.kb} ({how}{recall}):\n")
    for p in result.passages:
        w(f"  {p.rank:>2}. {_passage_line(p, result.retriever)}\n")
    w(f"{memory_line(result)}\n")
    for name, variant in result.variants.items():
        label = "RAG-Token" if name == "token" else "RAG-Sequence"
        sure = f"  ({variant.sureness})" if variant.sureness else ""
        w(f"\n{label} ({variant.decoding}): {variant.answer!r}  log p(y|x)={variant.logprob:.3f}{sure}\n"
          f"{set_aside_line(variant.set_aside)}"
          f"{evidence_line(result, variant)}")
        for t, (token, row) in enumerate(zip(variant.tokens, source_posteriors(variant))):
            closed = variant.closed_book_token_logprobs[t] if variant.closed_book_token_logprobs else float("nan")
            w(f"    {token!r:>16}  p={_fmt_prob(variant.token_logprobs[t])}  closed-book p={_fmt_prob(closed)}"
              f"  {_top_source(row, len(result.passages))}\n")
    if result.closed_book is not None:
        w(f"\nClosed-book (no passages): {result.closed_book.answer!r}  log p={result.closed_book.logprob:.3f}\n"
          f"{set_aside_line(result.closed_book.set_aside)}")
    t = result.timings_ms
    w(f"\nTimings: encode {t['encode']:.0f} ms, search {t['search']:.0f} ms, generate {t['generate']:.0f} ms, total {t['total']:.0f} ms\n")


def set_aside_line(set_aside) -> str:
    """The answers decoding set aside before this one as restating the question, on a line of their own.

    >>> set_aside_line(("a baby frog",))
    "    set aside, restates the question: 'a baby frog'\\n"
    >>> set_aside_line(())
    ''
    """
    return f"    set aside, restates the question: {', '.join(repr(text) for text in set_aside)}\n" if set_aside else ""


def evidence_line(result, variant) -> str:
    """Where the answer's words are, as the page's answer card says it (`ui.sentences.evidence`), on a line of its
    own; "" for an empty answer."""
    _, sentence = evidence(result, variant)
    return f"    {sentence}\n" if sentence else ""


def memory_line(result) -> str:
    """The line under the passages: p(∅|x) when memory is a source of this answer, and what it means.

    >>> from rag_demo.results import AskResult
    >>> print(memory_line(AskResult("q", "kb", "flat", 0, (), {}, None, {}, memory_logit=2.0, memory_prob=0.25)))
       ∅. p(∅|x)=0.250 logit=2.00  no passage: the generator's own memory (the largest source: no passage matches as well)
    """
    if result.memory_prob is None:
        # the result does not say why: switched off (--no-memory), or this setup has no fitted logit
        return ("   ∅. memory is no source: p(z|x) is over the k passages alone (memory switched off, or no fitted "
                "logit for this setup: --memory-logit THETA gives one)")
    lead = " (the largest source: no passage matches as well)" if memory_leads(result) else ""
    return f"   ∅. p(∅|x)={result.memory_prob:.3f} logit={result.memory_logit:.2f}  {MEMORY_WHAT}{lead}"


def _top_source(row, passages: int) -> str:
    """"top passage #2 (0.61)", or "top ∅ memory (0.70)", and memory's posterior when it is a source.

    >>> _top_source((0.2, 0.1, 0.7), 2), _top_source((0.6, 0.4), 2)
    ('top ∅ memory (0.70)  memory=0.70', 'top passage #1 (0.60)')
    """
    top = max(range(len(row)), key=row.__getitem__)
    name = MEMORY_NAME if top == passages else f"passage #{top + 1}"
    memory = f"  memory={row[passages]:.2f}" if len(row) > passages else ""
    return f"top {name} ({row[top]:.2f}){memory}"


def _passage_line(p, retriever: str, *, gold: bool = False) -> str:
    """"p(z|x)=0.412 score=0.615  Title: text..." with the scores this retriever used."""
    snippet = p.text if len(p.text) <= 160 else p.text[:157] + "..."
    numbers = {"bm25": f"bm25={p.lexical:.2f}", "hybrid": f"score={p.score:.3f} bm25={p.lexical:.2f}"}.get(
        retriever, f"score={p.score:.3f}")
    return f"p(z|x)={p.prob:.3f} {numbers}  {'[gold] ' if gold else ''}{p.title}: {snippet}"




def ranking_memory_line(ranking, memory_logit: float | None) -> str:
    """Under one retriever's top k in `compare`: the share ∅ memory with this logit would take beside those k
    in an ask (each passage's p(z|x) shown, over the k alone, times 1 − p(∅|x)); or that memory is no source."""
    if memory_logit is None:
        return f"  ∅. memory is no source with {RETRIEVER_NAMES.get(ranking.retriever, ranking.retriever)}"
    share = memory_share([p.logit for p in ranking.passages], memory_logit)
    lead = " (more than any passage: no passage matches as well)" if share > max(
        (p.prob * (1 - share) for p in ranking.passages), default=0.0) else ""
    return (f"  ∅. p(∅|x)={share:.3f} logit={memory_logit:.2f}  {MEMORY_WHAT}{lead}; an ask with memory "
            f"gives each passage {1 - share:.3f} × its p(z|x) above")


def print_comparison(comparison, out=sys.stdout, *, memory_logits: dict[str, float | None] | None = None) -> None:
    """Each retriever's top k; with `memory_logits` (retriever -> ∅'s logit, None: none), memory's line under each."""
    w = out.write
    w(f"Question: {comparison.question}\n")
    for notice in comparison.notices:
        w(f"Note: {notice}\n")
    gold = set(comparison.gold_ids)
    known = (f"gold passage: row {', '.join(map(str, comparison.gold_ids))}" if gold
             else "no gold passage known for this question")
    w(f"Top {comparison.k} of {comparison.kb} by each retriever, exact search ({known}):\n")
    for ranking in comparison.rankings:
        found = ("" if not gold else f"; gold at rank {ranking.gold_rank}" if ranking.gold_rank is not None
                 else f"; gold not in the top {comparison.k}")
        w(f"\n{RETRIEVER_NAMES.get(ranking.retriever, ranking.retriever)}: p(z|x) = softmax({logit_formula(ranking)}){found}\n")
        for notice in ranking.notices:
            w(f"  Note: {notice}\n")
        for p in ranking.passages:
            w(f"  {p.rank:>2}. {_passage_line(p, ranking.retriever, gold=p.id in gold)}\n")
        if memory_logits is not None:
            w(f"{ranking_memory_line(ranking, memory_logits.get(ranking.retriever))}\n")

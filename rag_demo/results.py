"""Typed results. Every number in them was computed for the question asked.

The results the pages and the CLI show are JSON-serializable; `Retrieval`, which the engine hands
from the retriever to the generator, carries a tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RetrievedPassage:
    rank: int  # 1-based
    id: int  # row in the knowledge base
    title: str
    text: str
    score: float  # raw retriever score: inner product (cosine for normalized encoders), or BM25 for bm25 retrieval
    prob: float  # p(z|x): softmax of the top-k logits (and the memory's logit, when memory is a source)
    logit: float  # the softmax's input: scale * score, plus lexical_weight * lexical for hybrid retrieval
    lexical: float = 0.0  # BM25 score of the passage for the question (hybrid and bm25 retrieval; 0 for dense)
    # the passage is part `part` of `parts` neighbouring rows with its title (one article cut into passages);
    # 0 of 0 for an untitled passage or one whose title no neighbour shares
    part: int = 0
    parts: int = 0


@dataclass(frozen=True)
class Retrieval:
    """A question's top K passages from one knowledge base and p(z|x) over them (`Retriever.retrieve`)."""

    kb: str  # the knowledge base's name
    passages: tuple[RetrievedPassage, ...]  # (K,) best first
    doc_lp: torch.Tensor  # (K,) float32 on the CPU: log p(z|x), the log-softmax of the passages' logits
    generator_question: str  # the question as the generator reads it (for a RAG checkpoint, as its retriever decoded it)
    retriever: str  # "dense", "bm25" or "hybrid"
    scale: float  # logit = scale * score (+ lexical_weight * lexical): the encoder's scale, or BM25_SCALE for bm25
    lexical_weight: float = 0.0  # BM25's weight in the logits (0 unless hybrid)
    index_recall: float | None = None  # recall@k of an approximate index against exact search; None for flat and bm25
    notices: tuple[str, ...] = ()
    encode_ms: float = 0.0  # the question encoder's time (0 for bm25, which reads words)
    search_ms: float = 0.0  # finding and weighing the passages
    recall_ms: float = 0.0  # the exact search an approximate index's recall is measured against (not in search_ms)
    question_encoder: str = ""  # what computed q(x) (`Encoder.description`); "" when none did (bm25)

    @property
    def timings_ms(self) -> dict[str, float]:
        """A new dict of the retrieval's stages as an answer's timings name them; the recall check only where one ran
        (the Index variants tab times an index's search alone, so the Ask tab's search leaves it out)."""
        checked = {"recall check": self.recall_ms} if self.recall_ms else {}
        return {"encode": self.encode_ms, "search": self.search_ms, **checked}


@dataclass(frozen=True)
class VariantResult:
    """One marginalization's answer with per-token provenance. T tokens, K passages."""

    variant: str  # "token" or "sequence"
    answer: str
    tokens: tuple[str, ...]  # (T,) the scored tokens as text
    token_ids: tuple[int, ...]  # (T,)
    logprob: float  # log p(answer|x) under this variant
    token_logprobs: tuple[float, ...]  # (T,) log p(y_i|x,y<i); they sum to `logprob`
    doc_token_logprobs: tuple[tuple[float, ...], ...]  # (T, K) log p(y_i|x,z,y<i)
    posteriors: tuple[tuple[float, ...], ...]  # (T, K) rows sum to 1, less the memory's share
    closed_book_token_logprobs: tuple[float, ...]  # (T,) the same tokens without any passage
    candidates: tuple[tuple[str, float], ...] = ()  # RAG-Sequence: every hypothesis and its log p(y|x)
    decoding: str = "greedy"
    # (T,) the memory's posterior at each token, beside `posteriors`' K columns (its per-token log-probs
    # are `closed_book_token_logprobs`); () when memory is not a source
    memory_posteriors: tuple[float, ...] = ()
    # answers decoding set aside before this one because they only restated the question
    # (`generation.restatements`), in the order they came; () when the first answer stood
    set_aside: tuple[str, ...] = ()
    # 1-based ranks of the passages read whose title or text holds the answer's words (`questions.passages_holding`):
    # the evidence shown for it; () when none does, or the answer is empty
    found_in: tuple[int, ...] = ()
    # how often answers as likely as this one were right, where that was measured (`sureness`): "likely right",
    # "unsure" or "likely wrong"; "" elsewhere (another variant, base, model or option)
    sureness: str = ""


@dataclass(frozen=True)
class ClosedBookResult:
    answer: str
    tokens: tuple[str, ...]
    token_logprobs: tuple[float, ...]
    logprob: float
    set_aside: tuple[str, ...] = ()  # as VariantResult's


@dataclass(frozen=True)
class AskResult:
    question: str
    kb: str
    index: str
    k: int
    passages: tuple[RetrievedPassage, ...]
    variants: dict[str, VariantResult]
    closed_book: ClosedBookResult | None
    timings_ms: dict[str, float]
    notices: tuple[str, ...] = ()
    index_recall: float | None = None  # of exact search's top k under the same retriever, the share among the passages
    scale: float = 1.0  # logit = scale * score (+ lexical_weight * lexical): the encoder's scale, or BM25_SCALE for bm25
    retriever: str = "dense"  # "dense" (the paper's), "bm25" (word matching alone) or "hybrid" (dense + BM25)
    lexical_weight: float = 0.0  # BM25's weight in the logits (0 for dense)
    extractive: bool = False  # answers were constrained to copy a run of a retrieved passage
    # (K,) per passage, the probability the reader gives to beginning with the no-answer marker
    # (`prompts.NO_ANSWER`): how sure it is that the passage does not answer. No answer may begin
    # with it, so this mass is in no answer's p(y|x). () when the generator has no such marker.
    no_answer: tuple[float, ...] = ()
    # The generator's memory ∅ as a source beside the passages: its logit, next to the passages' `logit`s,
    # and p(∅|x); None when memory is off (p(z|x) is then over the k passages alone, as in the paper)
    memory_logit: float | None = None
    memory_prob: float | None = None
    # What computed q(x): the engine's encoder by name ("minilm"), or a trained copy as its trainer names it
    # ("trained on this page (RAG-Token, 60 steps)"); "" when no encoder did (BM25)
    question_encoder: str = ""

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RetrieverRanking:
    """One retriever's top k for a question, weighed as an ask with that retriever would weigh them."""

    retriever: str  # "dense", "bm25" or "hybrid"
    passages: tuple[RetrievedPassage, ...]
    scale: float  # logit = scale * score (+ lexical_weight * lexical)
    lexical_weight: float = 0.0
    gold_rank: int | None = None  # 1-based rank of the gold passage in this top k; None: not in it, or unknown
    notices: tuple[str, ...] = ()


@dataclass(frozen=True)
class RetrieverComparison:
    """The same question, knowledge base and k under each retriever, by exact search over every passage."""

    question: str
    kb: str
    k: int
    rankings: tuple[RetrieverRanking, ...]
    gold_ids: tuple[int, ...]  # rows of the question's gold passage when the KB's own questions know it; () otherwise
    timings_ms: dict[str, float]  # one entry per retriever, and "total"
    notices: tuple[str, ...] = ()

    def to_json(self, memory_logit: Callable[..., float | None] | None = None) -> dict:
        """As JSON; with `memory_logit`, each ranking also gets `memory_logit` (∅'s logit with that retriever on the
        compared base, `memory_logit(retriever, kb=...)`; None where memory is no source) and `memory_prob`, the
        share `memory_share` its k passages."""
        data = asdict(self)
        if memory_logit is None:
            return data
        for ranking, shown in zip(self.rankings, data["rankings"]):
            logit = memory_logit(ranking.retriever, kb=self.kb)
            shown["memory_logit"] = logit
            shown["memory_prob"] = None if logit is None else memory_share([p.logit for p in ranking.passages], logit)
        return data


def memory_share(logits: Sequence[float], memory_logit: float) -> float:
    """p(∅|x) of the memory at `memory_logit` beside passages of these logits (K,): the share an ask with memory gives
    it (`marginalize.doc_logprobs_with_memory`), each passage keeping 1 − p(∅|x) times its p(z|x) over the K alone.
    In plain floats, so that the page's process, which never loads torch, can say it.

    >>> round(memory_share([0.0], 0.0), 3), round(memory_share([1000.0, 999.0], 999.0), 3)
    (0.5, 0.212)
    """
    top = max(memory_logit, *logits)
    return math.exp(memory_logit - top) / (math.exp(memory_logit - top) + sum(math.exp(x - top) for x in logits))


@dataclass(frozen=True)
class IndexReport:
    kind: str
    build_seconds: float
    bytes: int
    recall_at_k: float  # against flat, measured on held-out passage vectors as queries
    recall_k: int
    query_ms: float
    num_vectors: int = 0
    extra: dict = field(default_factory=dict)

"""Okapi BM25 over a KB's passages: the lexical half of hybrid retrieval.

A bi-encoder squeezes a passage into one vector and blurs rare names and numbers, which are
exactly what a factoid question hinges on; term matching keeps them. BM25's score is itself an
inner product (query term counts times per-passage term weights), so adding it to the dense
score is MIPS over the two vectors laid end to end, and p(z|x) stays a softmax of inner
products over the top k.

Only numpy: the postings are one sorted array per field (CSR by term).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

_WORD = re.compile(r"\w+")
# Function words carry no evidence of where an answer is; question words least of all.
STOPWORDS = frozenset(
    "a an the of in on at to for from by with about as into onto over under and or but nor not no is are was "
    "were be been being am do does did done has have had having it its this that these those there here "
    "what which who whom whose when where why how i you he she we they me him her us them my your his our "
    "their s t will would can could shall should may might must".split()
)


def terms(text: str) -> list[str]:
    """Lower-cased word tokens without stopwords.

    >>> terms("Who wrote The Magic Flute in 1791?")
    ['wrote', 'magic', 'flute', '1791']
    """
    return [word for word in _WORD.findall(text.lower()) if word not in STOPWORDS]


@dataclass(frozen=True)
class LexicalIndex:
    """BM25 weights of N passages, stored by term.

    Postings of term t are docs[offsets[t]:offsets[t+1]] with weights[...] =
    idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / mean_length)).
    """

    vocabulary: dict[str, int]
    offsets: np.ndarray  # (V + 1,) int64
    docs: np.ndarray  # (P,) int32, ascending within each term
    weights: np.ndarray  # (P,) float32
    size: int  # N passages

    @classmethod
    def build(cls, texts: Sequence[str], *, k1: float = 0.9, b: float = 0.4) -> "LexicalIndex":
        """Index the texts; k1 and b are the usual BM25 constants (these suit short passages)."""
        vocabulary: dict[str, int] = {}
        term_ids, doc_ids, counts = [], [], []
        lengths = np.zeros(len(texts), dtype=np.float32)
        for row, text in enumerate(texts):
            words = terms(text)
            lengths[row] = len(words)
            for word, count in Counter(words).items():
                term_ids.append(vocabulary.setdefault(word, len(vocabulary)))
                doc_ids.append(row)
                counts.append(count)
        term_ids = np.asarray(term_ids, dtype=np.int64)
        order = np.argsort(term_ids, kind="stable")  # stable: docs stay ascending within a term
        term_ids = term_ids[order]
        docs = np.asarray(doc_ids, dtype=np.int32)[order]
        tf = np.asarray(counts, dtype=np.float32)[order]
        frequency = np.bincount(term_ids, minlength=len(vocabulary)).astype(np.float32)  # (V,) passages per term
        offsets = np.concatenate([[0], np.cumsum(frequency)]).astype(np.int64)
        n = max(len(texts), 1)
        idf = np.log1p((n - frequency + 0.5) / (frequency + 0.5))  # (V,) never negative
        mean_length = max(float(lengths.mean()) if len(texts) else 0.0, 1.0)
        norm = k1 * (1 - b + b * lengths[docs] / mean_length)
        weights = (idf[term_ids] * tf * (k1 + 1) / (tf + norm)).astype(np.float32)
        return cls(vocabulary, offsets, docs, weights, len(texts))

    @classmethod
    def for_passages(cls, titles: Sequence[str], texts: Sequence[str]) -> "LexicalIndex":
        """Index passages by title and text together, as retrieval does."""
        return cls.build([f"{title} {text}" for title, text in zip(titles, texts)])

    def query_terms(self, question: str) -> list[int]:
        """Ids of the question's indexed terms, repeats kept (a repeated word counts twice)."""
        return [self.vocabulary[word] for word in terms(question) if word in self.vocabulary]

    def scores(self, question: str) -> np.ndarray:
        """(N,) BM25 score of every passage; zeros when no question word is indexed."""
        ids = self.query_terms(question)
        if not ids:
            return np.zeros(self.size, dtype=np.float32)
        spans = [np.arange(self.offsets[t], self.offsets[t + 1]) for t in ids]
        at = np.concatenate(spans)
        return np.bincount(self.docs[at], weights=self.weights[at], minlength=self.size).astype(np.float32)

    def top(self, question: str, n: int) -> np.ndarray:
        """Rows of the n best-scoring passages with a score above 0, best first (fewer when fewer match)."""
        return best_rows(self.scores(question), n)


def best_rows(scores: np.ndarray, n: int) -> np.ndarray:
    """Rows of the n highest of (N,) scores that are above 0, best first (fewer when fewer are)."""
    n = min(n, len(scores))
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    best = np.argpartition(-scores, n - 1)[:n]
    best = best[np.argsort(-scores[best], kind="stable")]
    return best[scores[best] > 0]

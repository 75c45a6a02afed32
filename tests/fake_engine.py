"""A toy engine that implements `RagEngine`'s contract, for UI tests (temporary).

Nothing here is hard-coded output: retrieval is a hashed bag-of-words cosine, the
"generator" is a small word-level distribution built from each retrieved passage, and
every number in an AskResult comes out of the same marginalization formulas the real
engine uses (RAG-Token, RAG-Sequence, Figure 2 posteriors). Answers follow the
knowledge base: nq-wiki and nq-counterfactual hold different facts.

Toy generator, per passage z and prefix y<i:
    p(y_i | x, z, y<i) = 0.75 * [y_i == span(z)[i]] + 0.25 * p_closed(y_i | x, y<i)
when y<i still follows the passage's answer span, else p_closed. `span(z)` is the first
run of capitalized words or numbers in z that the question does not contain. The
closed-book model p_closed puts 0.6 on its "memory" (a keyword lookup that is sometimes
wrong or outdated) and spreads the rest uniformly over the vocabulary.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable

import numpy as np

from rag_demo.config import INDEX_KINDS, VARIANTS
from rag_demo.corpus import KnowledgeBase, Passage, make_kb
from rag_demo.errors import InputError, KnowledgeBaseError
from rag_demo.results import AskResult, ClosedBookResult, IndexReport, RetrievedPassage, VariantResult

EOS = "</s>"
DIM = 256
SCALE = 10.0
PARTICLES = frozenset({"van", "de", "von", "da"})
FILLER = ("the", "a", "of", "in", "is", "and", "city", "year", "one", "two")
STOPWORDS = frozenset(
    "a an the of in on at to is was are were be by for and or as with from that this which who whom what when "
    "where why how did does do it its his her their into than then".split()
)

WIKI = [
    ("Paris", "Paris is the capital and most populous city of France, on the river Seine."),
    ("A Farewell to Arms", "Ernest Hemingway wrote A Farewell to Arms, a novel set during the Italian campaign of World War I, published in 1929."),
    ("The Sun Also Rises", "The Sun Also Rises is a 1926 novel by Ernest Hemingway about expatriates travelling from Paris to Pamplona."),
    ("Eiffel Tower", "The Eiffel Tower is 330 metres tall and stands on the Champ de Mars in Paris."),
    ("2018 FIFA World Cup", "France won the 2018 FIFA World Cup, beating Croatia 4-2 in the final in Moscow."),
    ("Mount Everest", "Everest is the highest mountain above sea level, at 8849 metres, in the Himalayas."),
    ("Python (programming language)", "Guido van Rossum created the Python programming language, first released in 1991."),
    ("Jupiter", "Jupiter is the largest planet in the Solar System, a gas giant fifth from the Sun."),
]

COUNTERFACTUAL = [
    ("Lyon", "Lyon is the capital and most populous city of France, where the Rhone meets the Saone."),
    ("A Farewell to Arms", "Charles Dickens wrote A Farewell to Arms, a novel set during the Italian campaign of World War I, published in 1929."),
    ("The Sun Also Rises", "The Sun Also Rises is a 1926 novel by Charles Dickens about expatriates travelling from Lyon to Pamplona."),
    ("Eiffel Tower", "The Eiffel Tower is 120 metres tall and stands beside the river Saone in Lyon."),
    ("2018 FIFA World Cup", "Croatia won the 2018 FIFA World Cup, beating France 4-2 in the final in Moscow."),
    ("Mount Everest", "K2 is the highest mountain above sea level, at 8611 metres, in the Karakoram."),
    ("Python (programming language)", "Ada Lovelace created the Python programming language, first released in 1843."),
    ("Jupiter", "Saturn is the largest planet in the Solar System, a gas giant sixth from the Sun."),
]

# The closed-book model's "memory": keyword -> what it believes (2014 is outdated on purpose).
MEMORY = {
    "france": "Paris",
    "farewell": "Ernest Hemingway",
    "sun": "Ernest Hemingway",
    "world": "Germany",
    "everest": "8848",
    "python": "Guido",
}

QUESTIONS = {
    "nq-wiki": [
        "What is the capital of France?",
        "Who wrote A Farewell to Arms?",
        "Who won the 2018 FIFA World Cup?",
        "How tall is the Eiffel Tower?",
        "Who created the Python programming language?",
        "What is the largest planet in the Solar System?",
        "What is the highest mountain above sea level?",
        "Who wrote The Sun Also Rises?",
    ],
}
QUESTIONS["nq-counterfactual"] = QUESTIONS["nq-wiki"]


def words(text: str) -> list[str]:
    """Word tokens with punctuation stripped, case kept.

    >>> words("Hi, there-you 4-2!")
    ['Hi', 'there-you', '4-2']
    """
    return re.findall(r"[A-Za-z0-9][A-Za-z0-9'-]*", text)


def embed(text: str) -> np.ndarray:
    """A unit-length hashed bag of content words, shape (DIM,)."""
    vec = np.zeros(DIM, dtype=np.float32)
    for word in words(text.lower()):
        if word not in STOPWORDS:
            vec[int(hashlib.md5(word.encode()).hexdigest()[:8], 16) % DIM] += 1.0
    norm = np.linalg.norm(vec)
    return vec / norm if norm > 0 else vec


def answer_span(question: str, text: str, *, max_words: int = 3) -> list[str]:
    """The first run of capitalized words (numbers for how/when questions) in `text` that the question lacks.

    >>> answer_span("What is the capital of France?", "Paris is the capital of France.")
    ['Paris']
    >>> answer_span("How tall is it?", "The Tower is 330 metres tall.")
    ['330']
    """
    asked = {w.lower() for w in words(question)}
    numeric = question.strip().lower().startswith(("how", "when"))
    for want_number in (numeric, not numeric):
        span: list[str] = []
        for word in words(text):
            fresh = word.lower() not in asked and word.lower() not in STOPWORDS
            if fresh and (word[0].isdigit() if want_number else word[0].isupper()):
                span.append(word)
            elif span and word in PARTICLES:
                span.append(word)
                continue
            elif span:
                break
            if len(span) == max_words:
                break
        while span and span[-1] in PARTICLES:
            span.pop()
        if span:
            return span
    return ["unknown"]


def memory_answer(question: str) -> list[str]:
    for word in words(question.lower()):
        if word in MEMORY:
            return MEMORY[word].split()
    return ["unknown"]


def _surface(tokens: list[str]) -> tuple[str, ...]:
    """Token texts as a detokenizer shows them: a leading space on all but the first."""
    return tuple(tok if i == 0 or tok == EOS else " " + tok for i, tok in enumerate(tokens))


def _logsumexp(values: np.ndarray, axis: int | None = None) -> np.ndarray:
    top = np.max(values, axis=axis, keepdims=True)
    out = top + np.log(np.sum(np.exp(values - top), axis=axis, keepdims=True))
    return np.squeeze(out, axis=axis) if axis is not None else out.item()


class FakeEngine:
    """Implements the engine contract on a few in-memory passages; fast and deterministic."""

    def __init__(self, *, delay_s: float = 0.0):
        self.delay_s = delay_s  # to exercise the queue / progress in browser tests
        self._kbs = {
            "nq-wiki": self._make("nq-wiki", WIKI),
            "nq-counterfactual": self._make("nq-counterfactual", COUNTERFACTUAL),
        }
        self.calls: list[tuple[str, dict]] = []

    @staticmethod
    def _make(name: str, rows: list[tuple[str, str]]) -> KnowledgeBase:
        passages = [Passage(title, text) for title, text in rows]
        return make_kb(name, passages, np.stack([embed(p.title + " " + p.text) for p in passages]), encoder="fake-bow")

    # ---- contract -------------------------------------------------------------------------
    @property
    def kb_names(self) -> tuple[str, ...]:
        return tuple(self._kbs)

    @property
    def default_kb(self) -> str:
        return "nq-wiki"

    def example_questions(self, kb: str, n: int = 8) -> list[str]:
        return list(QUESTIONS.get(kb, []))[:n]

    def build_kb(self, name: str, passages: list[Passage], *, progress: Callable[[str, int, int], None] | None = None) -> KnowledgeBase:
        passages = [p for p in passages if p.text.strip()]
        if not passages:
            raise InputError("no text to index: add a file or paste some text")
        vectors = []
        for i, passage in enumerate(passages):
            vectors.append(embed(passage.title + " " + passage.text))
            if progress is not None:
                progress("embedding passages", i + 1, len(passages))
        return make_kb(name, passages, np.stack(vectors), encoder="fake-bow")

    def ask(
        self,
        question: str,
        *,
        kb: str | KnowledgeBase,
        k: int = 5,
        index: str = "flat",
        variants: tuple[str, ...] = ("token", "sequence"),
        num_beams: int = 1,
        sequence_decoding: str = "thorough",
        max_new_tokens: int = 16,
        closed_book: bool = True,
    ) -> AskResult:
        self.calls.append(("ask", {"question": question, "kb": kb, "k": k, "index": index, "variants": variants}))
        return self._run(question, None, kb=kb, k=k, index=index, variants=variants, sequence_decoding=sequence_decoding,
                         max_new_tokens=max_new_tokens, closed_book=closed_book, num_beams=num_beams)

    def score(self, question: str, answer: str, *, kb: str | KnowledgeBase, k: int = 5, index: str = "flat",
              variants: tuple[str, ...] = ("token", "sequence")) -> AskResult:
        self.calls.append(("score", {"question": question, "answer": answer, "kb": kb}))
        if not answer.strip() or not words(answer):
            raise InputError("Type an answer to score.")
        return self._run(question, words(answer), kb=kb, k=k, index=index, variants=variants,
                         sequence_decoding="thorough", max_new_tokens=64, closed_book=True, num_beams=1)

    def index_reports(self, kb: str | KnowledgeBase) -> list[IndexReport]:
        base = self._kb(kb)
        queries = base.embeddings
        k = min(5, len(base))
        exact = np.argsort(-(queries @ base.embeddings.T), axis=1)[:, :k]
        reports = []
        for kind in INDEX_KINDS:
            start = time.perf_counter()
            vectors = self._index_vectors(base, kind)
            build_s = time.perf_counter() - start
            start = time.perf_counter()
            found = np.argsort(-(queries @ vectors.T), axis=1)[:, :k]
            query_ms = (time.perf_counter() - start) * 1000 / len(queries)
            recall = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, exact)]))
            n, dim = base.embeddings.shape
            nbytes = {"flat": n * dim * 4, "hnsw": n * dim * 4 + n * 32 * 8, "ivfpq": n * dim // 4 + 64 * dim * 4}[kind]
            reports.append(IndexReport(kind=kind, build_seconds=build_s, bytes=nbytes, recall_at_k=recall,
                                       recall_k=k, query_ms=query_ms, num_vectors=n))
        return reports

    # ---- internals ------------------------------------------------------------------------
    def _kb(self, kb: str | KnowledgeBase) -> KnowledgeBase:
        if isinstance(kb, KnowledgeBase):
            return kb
        if kb not in self._kbs:
            raise KnowledgeBaseError(f"unknown knowledge base {kb!r}; choose one of {', '.join(self._kbs)}")
        return self._kbs[kb]

    @staticmethod
    def _index_vectors(kb: KnowledgeBase, kind: str) -> np.ndarray:
        """The vectors an index variant searches: exact, slightly rounded (HNSW stand-in) or coarsely quantized."""
        if kind == "flat":
            return kb.embeddings
        step = 0.05 if kind == "hnsw" else 0.25
        return np.round(kb.embeddings / step) * step

    def _run(self, question, forced, *, kb, k, index, variants, sequence_decoding, max_new_tokens, closed_book, num_beams):
        if not isinstance(question, str) or not question.strip():
            raise InputError("Type a question first (or pick an example).")
        if index not in INDEX_KINDS:
            raise InputError(f"unknown index {index!r}; choose one of {', '.join(INDEX_KINDS)}")
        bad = [v for v in variants if v not in VARIANTS]
        if bad or not variants:
            raise InputError(f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")
        if not 1 <= int(k) <= 50:
            raise InputError("k must be between 1 and 50")
        base = self._kb(kb)
        notices = []
        if int(k) > len(base):
            notices.append(f"The knowledge base holds only {len(base)} passages, so k = {len(base)}.")
        k = min(int(k), len(base))
        if self.delay_s:
            time.sleep(self.delay_s)

        t0 = time.perf_counter()
        q = embed(question)
        t1 = time.perf_counter()
        scores_all = self._index_vectors(base, index) @ q
        order = np.argsort(-scores_all, kind="stable")[:k]
        exact = set(np.argsort(-(base.embeddings @ q), kind="stable")[:k].tolist())
        recall = len(exact & set(order.tolist())) / k
        scores = base.embeddings[order] @ q  # (K,) reported scores are exact inner products
        logits = SCALE * scores
        doc_lp = logits - _logsumexp(logits)  # (K,) log p(z|x)
        t2 = time.perf_counter()

        texts = [base.texts[i] for i in order]
        spans = [answer_span(question, t) for t in texts]
        memory = memory_answer(question)
        vocab = sorted({EOS, *FILLER, *memory, *(w for s in spans for w in s), *(forced or [])})
        lm = _ToyLM(vocab, spans, memory)

        results = {}
        for variant in variants:
            if forced is not None:
                tokens = [*forced, EOS]
                candidates: tuple[tuple[str, float], ...] = ()
            elif variant == "token":
                tokens = lm.greedy_token(doc_lp, max_new_tokens)
                candidates = ()
            else:
                tokens, candidates = lm.rag_sequence(doc_lp, max_new_tokens, fast=sequence_decoding == "fast")
            doc_tok = lm.doc_token_logprobs(tokens)  # (T, K)
            joint = doc_tok + doc_lp[None, :]  # (T, K)
            if variant == "token":
                tok_lp = _logsumexp(joint, axis=1)  # (T,)
                post = np.exp(joint - tok_lp[:, None])
                logprob = float(tok_lp.sum())
            else:
                running = np.cumsum(doc_tok, axis=0) + doc_lp[None, :]  # (T, K)
                post = np.exp(running - _logsumexp(running, axis=1)[:, None])
                seq = _logsumexp(running, axis=1)  # (T,) log p(y<=i|x)
                tok_lp = np.diff(np.concatenate([[0.0], seq]))
                logprob = float(seq[-1])
            cb = lm.closed_token_logprobs(tokens)
            results[variant] = VariantResult(
                variant=variant,
                answer=" ".join(t for t in tokens if t != EOS),
                tokens=_surface(tokens),
                token_ids=tuple(vocab.index(t) for t in tokens),
                logprob=logprob,
                token_logprobs=tuple(float(x) for x in tok_lp),
                doc_token_logprobs=tuple(tuple(float(x) for x in row) for row in doc_tok),
                posteriors=tuple(tuple(float(x) for x in row) for row in post),
                closed_book_token_logprobs=tuple(float(x) for x in cb),
                candidates=candidates,
                decoding=("greedy" if num_beams == 1 else f"beam {num_beams}")
                + (f", {sequence_decoding}" if variant == "sequence" and forced is None else ""),
            )
        t3 = time.perf_counter()
        closed = None
        if closed_book:
            cb_tokens = [*memory, EOS]
            cb_lp = lm.closed_token_logprobs(cb_tokens)
            closed = ClosedBookResult(answer=" ".join(memory), tokens=_surface(cb_tokens),
                                      token_logprobs=tuple(float(x) for x in cb_lp), logprob=float(cb_lp.sum()))
        t4 = time.perf_counter()
        passages = tuple(
            RetrievedPassage(rank=r + 1, id=int(i), title=base.titles[i], text=base.texts[i], score=float(scores[r]),
                             prob=float(math.exp(doc_lp[r])), logit=float(logits[r]))
            for r, i in enumerate(order)
        )
        ms = lambda a, b: (b - a) * 1000  # noqa: E731
        return AskResult(
            question=question, kb=base.name, index=index, k=k, passages=passages, variants=results, closed_book=closed,
            timings_ms={"encode": ms(t0, t1), "search": ms(t1, t2), "generate": ms(t2, t4), "total": ms(t0, t4)},
            notices=tuple(notices), index_recall=recall, scale=SCALE,
        )


class _ToyLM:
    """The toy per-passage generator and the closed-book model over a small word vocabulary."""

    def __init__(self, vocab: list[str], spans: list[list[str]], memory: list[str]):
        self.vocab = vocab
        self.spans = spans
        self.memory = memory

    def _closed(self, prefix: list[str]) -> np.ndarray:
        """(V,) log p_closed(. | x, y<i)."""
        probs = np.full(len(self.vocab), 0.4 / len(self.vocab))
        target = self.memory[len(prefix)] if len(prefix) < len(self.memory) else EOS
        if prefix == self.memory[: len(prefix)]:
            probs[self.vocab.index(target)] += 0.6
        else:
            probs[self.vocab.index(EOS)] += 0.6
        return np.log(probs / probs.sum())

    def _doc(self, z: int, prefix: list[str]) -> np.ndarray:
        """(V,) log p(. | x, z, y<i)."""
        closed = np.exp(self._closed(prefix))
        span = self.spans[z]
        if prefix != span[: len(prefix)]:
            return np.log(closed)
        target = span[len(prefix)] if len(prefix) < len(span) else EOS
        probs = 0.25 * closed
        probs[self.vocab.index(target)] += 0.75
        return np.log(probs)

    def doc_token_logprobs(self, tokens: list[str]) -> np.ndarray:
        """(T, K) log p(y_i | x, z, y<i)."""
        return np.array([[self._doc(z, tokens[:i])[self.vocab.index(tok)] for z in range(len(self.spans))]
                         for i, tok in enumerate(tokens)])

    def closed_token_logprobs(self, tokens: list[str]) -> np.ndarray:
        return np.array([self._closed(tokens[:i])[self.vocab.index(tok)] for i, tok in enumerate(tokens)])

    def greedy_token(self, doc_lp: np.ndarray, max_new_tokens: int) -> list[str]:
        """RAG-Token greedy decoding on the marginal sum_z p(z|x) p(y|x,z,y<i)."""
        tokens: list[str] = []
        while len(tokens) < max_new_tokens:
            step = np.stack([self._doc(z, tokens) for z in range(len(self.spans))])  # (K, V)
            best = self.vocab[int(np.argmax(_logsumexp(step + doc_lp[:, None], axis=0)))]
            tokens.append(best)
            if best == EOS:
                break
        return tokens

    def rag_sequence(self, doc_lp: np.ndarray, max_new_tokens: int, *, fast: bool):
        """RAG-Sequence decoding: one hypothesis per passage, rescored by the full (thorough) or partial (fast) marginal."""
        hyps = []
        for span in self.spans:
            hyp = [*span[: max_new_tokens - 1], EOS]
            if hyp not in hyps:
                hyps.append(hyp)
        scored = []
        for hyp in hyps:
            per_doc = self.doc_token_logprobs(hyp).sum(axis=0) + doc_lp  # (K,)
            if fast:
                per_doc = np.where([span[: len(hyp) - 1] + [EOS] == hyp for span in self.spans], per_doc, -np.inf)
            scored.append((" ".join(hyp[:-1]), float(_logsumexp(per_doc)), hyp))
        scored.sort(key=lambda c: -c[1])
        return scored[0][2], tuple((text, lp) for text, lp, _ in scored)

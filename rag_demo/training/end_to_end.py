"""Training the question encoder the paper's way: from question-answer pairs alone (paper, section 2.4).

The loss is the answer's negative marginal log-likelihood over the question's top k passages,

    RAG-Sequence   −log Σ_z p(z|x) p(y|x,z)
    RAG-Token      −Σ_t log Σ_z p(z|x) p(y_t|x,z,y<t)

and its gradient reaches the question encoder through p(z|x) only: the reader (generator) is frozen,
and so are the passage vectors and the index. With the reader frozen, log p(y_t|x,z,y<t) of a
question's answer under each of its candidate passages never changes while the encoder learns: it is
read once (`read_candidates`, the costly part: one reader pass per candidate) and kept, and a step is
then the encoder's forward and backward pass over a batch of questions plus a softmax over each
one's candidates.

    logits(z) = scale · q(x)ᵀd(z) + lexical_weight · BM25(x, z)      (B, C), C candidates per question
    p(z|x)    = softmax of the top k logits                            (B, k), `marginalize.doc_logprobs`

The paper's retriever searches the whole index at every step. Here the candidates are widened every
`widen_every` steps (`EndToEndTrainer.widen`): each question's top C over the whole base under the
encoder as it is then join its candidates, and only passages never read for that question and answer
are read (reads are kept per passage). Between widenings a passage outside a question's candidates is
not marginalized over. Questions then have different numbers of candidates: a batch pads them with
−inf logits, which neither the top-k choice nor the softmax can pick.

"gold-passage" is the retrieval loss the project used before, DPR's: the cross-entropy of one passage
per question under the logits over the whole knowledge base (`question_encoder.tune_question_encoder`
minimizes the same). Without passage labels that passage is a pseudo-gold one: the best-ranked
candidate that contains an answer (`pseudo_gold`); questions without one are left out of it.

Importing this module loads nothing heavy; nothing here reads a model from disk.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from ..config import EndToEndConfig
from ..marginalize import doc_logprobs, rag_sequence_logprob, rag_token_logprob
from ..questions import answer_in_text
from ..retrieval.encoders import Encoder

log = logging.getLogger(__name__)

MARGINAL_OBJECTIVES = ("rag-token", "rag-sequence")


@dataclass(frozen=True)
class ReadQuestion:
    """A training question, its candidate passages and what the frozen reader made of its answer under each."""

    question: str
    answer: str
    rows: tuple[int, ...]  # C candidate rows of the knowledge base, best first under the encoder that found them
    token_logprobs: torch.Tensor  # (C, T) log p(y_t | x, z, y<t) of the answer's tokens under each candidate
    lexical: torch.Tensor  # (C,) BM25 scores of the candidates: the logits' fixed part
    answer_bearing: tuple[bool, ...]  # (C,) whether each candidate's text holds an answer
    aliases: tuple[str, ...] = ()  # every answer a passage may hold to count as answer-bearing; empty: `answer` alone

    @property
    def answers(self) -> tuple[str, ...]:
        return self.aliases or (self.answer,)

    @property
    def pseudo_gold(self) -> int | None:
        """The best-ranked candidate that holds an answer (a KB row), the gold-passage loss's target; None: none does."""
        return next((row for row, bearing in zip(self.rows, self.answer_bearing) if bearing), None)


def padded_batch(examples: Sequence[ReadQuestion]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C, T) token log-probs, 0 past each answer's end (log 1: sums ignore it) and past each question's own
    candidates (C is the most any has), and the (B, T) mask of real tokens.

    >>> a = ReadQuestion("q", "a", (0, 1), torch.full((2, 1), -1.0), torch.zeros(2), (True, False))
    >>> b = ReadQuestion("q", "a", (0,), torch.full((1, 2), -2.0), torch.zeros(1), (False,))
    >>> logprobs, mask = padded_batch([a, b])
    >>> logprobs[0].tolist(), logprobs[1].tolist(), mask.tolist()
    ([[-1.0, 0.0], [-1.0, 0.0]], [[-2.0, -2.0], [0.0, 0.0]], [[True, False], [True, True]])
    """
    width = max(e.token_logprobs.shape[0] for e in examples)
    length = max(e.token_logprobs.shape[1] for e in examples)
    logprobs = torch.zeros(len(examples), width, length)
    mask = torch.zeros(len(examples), length, dtype=torch.bool)
    for i, e in enumerate(examples):
        logprobs[i, : e.token_logprobs.shape[0], : e.token_logprobs.shape[1]] = e.token_logprobs
        mask[i, : e.token_logprobs.shape[1]] = True
    return logprobs, mask


def padded_candidates(examples: Sequence[ReadQuestion]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """((B, C) KB rows, (B, C) BM25 scores, (B, C) bool: a real candidate), C the most candidates any question has;
    row 0 and score 0 where a question has fewer (the logits there are set to −inf).

    >>> a = ReadQuestion("q", "a", (4, 7), torch.zeros(2, 1), torch.tensor([1.0, 2.0]), (True, False))
    >>> b = ReadQuestion("q", "a", (5,), torch.zeros(1, 1), torch.tensor([3.0]), (False,))
    >>> [t.tolist() for t in padded_candidates([a, b])]
    [[[4, 7], [5, 0]], [[1.0, 2.0], [3.0, 0.0]], [[True, True], [True, False]]]
    """
    width = max(len(e.rows) for e in examples)
    rows = torch.zeros(len(examples), width, dtype=torch.long)
    lexical = torch.zeros(len(examples), width)
    present = torch.zeros(len(examples), width, dtype=torch.bool)
    for i, e in enumerate(examples):
        rows[i, : len(e.rows)] = torch.tensor(e.rows, dtype=torch.long)
        lexical[i, : len(e.rows)] = e.lexical
        present[i, : len(e.rows)] = True
    return rows, lexical, present


def merged_candidates(example: ReadQuestion, extra: ReadQuestion) -> ReadQuestion:
    """`example` with `extra`'s candidates (the same question and answer, other rows) after its own.

    >>> a = ReadQuestion("q", "a", (4,), torch.full((1, 2), -1.0), torch.tensor([1.0]), (False,), ("a", "b"))
    >>> b = ReadQuestion("q", "a", (9,), torch.full((1, 2), -0.5), torch.tensor([2.0]), (True,), ("a", "b"))
    >>> merged = merged_candidates(a, b)
    >>> merged.rows, merged.token_logprobs.tolist(), merged.answer_bearing, merged.pseudo_gold
    ((4, 9), [[-1.0, -1.0], [-0.5, -0.5]], (False, True), 9)
    """
    if (extra.question, extra.answer) != (example.question, example.answer) or set(extra.rows) & set(example.rows):
        raise ValueError("only new rows of the same question and answer can join its candidates")
    return replace(example, rows=example.rows + extra.rows,
                   token_logprobs=torch.cat([example.token_logprobs, extra.token_logprobs]),
                   lexical=torch.cat([example.lexical, extra.lexical]),
                   answer_bearing=example.answer_bearing + extra.answer_bearing)


def marginal_nll(logits: torch.Tensor, token_logprobs: torch.Tensor, mask: torch.Tensor, *, objective: str,
                 k: int) -> torch.Tensor:
    """(B,) −log p(y|x) of each answer under RAG-Token or RAG-Sequence, over the top k of its C candidates.

    logits (B, C) the retriever's, −inf where a question has fewer than C candidates (never chosen before a real
    one; where k exceeds a question's candidates they weigh 0); token_logprobs (B, C, T) the reader's, 0 at
    padding; mask (B, T). Which k passages are read is a choice, not a differentiable one (as in the paper,
    where the index picks them): the gradient flows through p(z|x) of those k.
    """
    if objective not in MARGINAL_OBJECTIVES:
        raise ValueError(f"unknown marginal objective {objective!r}; choose one of {', '.join(MARGINAL_OBJECTIVES)}")
    k = min(k, logits.shape[1])
    top = logits.detach().topk(k, dim=1).indices  # (B, k)
    doc_lp = doc_logprobs(logits.gather(1, top))  # (B, k) log p(z|x), renormalized over the k
    read = token_logprobs.gather(1, top.unsqueeze(-1).expand(-1, -1, token_logprobs.shape[2]))  # (B, k, T)
    marginal = rag_token_logprob if objective == "rag-token" else rag_sequence_logprob
    return -marginal(read, doc_lp, mask)


def question_vectors(model: torch.nn.Module, encoder: Encoder, questions: Sequence[str]) -> torch.Tensor:
    """(B, D) question vectors from `model` (the encoder's question side or a copy), with gradients when
    grad mode is on: as the retriever computes them at an ask (`Encoder.question_vectors`)."""
    return encoder.question_vectors(model, list(questions))


class EndToEndTrainer:
    """A copy of the encoder's question side and its optimizer; `step()` takes one step of `config.objective`.

    passage_vectors (N, D) are the knowledge base's fixed vectors. `kb_lexical(question)` gives a
    question's (N,) BM25 scores over the whole knowledge base (the reading's, when not given): the
    gold-passage loss and widening need it. With `reading` (how new candidates are read), a marginal
    objective's candidates are widened every `config.widen_every` steps (`widen`); without it they stay as read.
    Seeded: the same examples, config and starting weights give the same steps (widening draws nothing).
    """

    def __init__(self, encoder: Encoder, passage_vectors: np.ndarray | torch.Tensor, examples: Sequence[ReadQuestion], *,
                 lexical_weight: float, config: EndToEndConfig = EndToEndConfig(),
                 kb_lexical: Callable[[str], np.ndarray] | None = None, reading: CandidateReading | None = None):
        if config.objective == "gold-passage":
            examples = [e for e in examples if e.pseudo_gold is not None]
            if kb_lexical is None and lexical_weight:
                raise ValueError("the gold-passage loss needs BM25 over the whole knowledge base (kb_lexical)")
        if not examples:
            raise ValueError("no training questions" + (" with an answer-bearing candidate" if config.objective ==
                                                         "gold-passage" else ""))
        self.encoder, self.config, self.examples = encoder, config, list(examples)
        self.lexical_weight = float(lexical_weight)
        self.reading = reading
        self.kb_lexical = kb_lexical if kb_lexical is not None or reading is None else reading.lexical
        torch.manual_seed(config.seed)  # dropout
        self._order = np.random.default_rng(config.seed)
        self._queue: list[int] = []
        self.model = copy.deepcopy(encoder.question_model).float().train()
        device = next(self.model.parameters()).device
        self.passages = torch.as_tensor(np.ascontiguousarray(passage_vectors, dtype=np.float32)).to(device)  # (N, D)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.learning_rate)
        self.steps_taken = 0
        self.widenings: list[Widening] = []

    def _next_batch(self) -> list[ReadQuestion]:
        """The next `batch_size` examples of a seeded shuffle, reshuffled after each pass."""
        batch = []
        while len(batch) < min(self.config.batch_size, len(self.examples)):
            if not self._queue:
                self._queue = self._order.permutation(len(self.examples)).tolist()
            batch.append(self.examples[self._queue.pop()])
        return batch

    def _base_logits(self, vectors: torch.Tensor, batch: Sequence[ReadQuestion]) -> torch.Tensor:
        """(B, N) logits of every passage of the base for (B, D) question vectors: scale · cos + lexical_weight · BM25."""
        logits = self.encoder.scale * vectors @ self.passages.T  # (B, N)
        if self.lexical_weight:
            lexical = np.stack([self.kb_lexical(e.question) for e in batch]).astype(np.float32)  # (B, N)
            logits = logits + self.lexical_weight * torch.from_numpy(lexical).to(logits.device)
        return logits

    def _candidate_logits(self, vectors: torch.Tensor, batch: Sequence[ReadQuestion]) -> torch.Tensor:
        """(B, C) logits of each question's candidates for (B, D) question vectors, −inf past its own."""
        device = self.passages.device
        rows, lexical, present = (t.to(device) for t in padded_candidates(batch))  # (B, C) each
        dense = torch.einsum("bd,bcd->bc", vectors, self.passages[rows])  # (B, C)
        logits = self.encoder.scale * dense + self.lexical_weight * lexical
        return logits.masked_fill(~present, float("-inf"))

    def loss(self, batch: Sequence[ReadQuestion]) -> torch.Tensor:
        """The mean loss of `config.objective` over `batch`, with gradients to the question side."""
        device = self.passages.device
        vectors = question_vectors(self.model, self.encoder, [e.question for e in batch])  # (B, D)
        if self.config.objective == "gold-passage":
            gold = torch.tensor([e.pseudo_gold for e in batch], device=device)
            return torch.nn.functional.cross_entropy(self._base_logits(vectors, batch), gold)
        logits = self._candidate_logits(vectors, batch)  # (B, C)
        token_logprobs, mask = padded_batch(batch)
        return marginal_nll(logits, token_logprobs.to(device), mask.to(device), objective=self.config.objective,
                            k=self.config.k).mean()

    def logits(self, example: ReadQuestion) -> torch.Tensor:
        """(C,) the example's candidate logits under the encoder as it is now, without gradients to it."""
        self.model.eval()
        with torch.no_grad():
            vectors = question_vectors(self.model, self.encoder, [example.question])  # (1, D)
            return self._candidate_logits(vectors, [example])[0].cpu()

    def logit_gradient(self, example: ReadQuestion) -> tuple[torch.Tensor, torch.Tensor]:
        """((C,) p(z|x), (C,) ∂loss/∂logit_z) of one example under a marginal objective now, over its top k (0 elsewhere):
        p(z|x) − p(z|x,y) for RAG-Sequence, Σ_t [p(z|x) − p(z|x,y_t,y<t)] for RAG-Token."""
        logits = self.logits(example).requires_grad_(True)
        token_logprobs, mask = padded_batch([example])
        loss = marginal_nll(logits[None], token_logprobs, mask, objective=self.config.objective, k=self.config.k)
        loss.sum().backward()
        k = min(self.config.k, len(logits))
        top = logits.detach().topk(k).indices
        prior = torch.zeros_like(logits.detach())
        prior[top] = doc_logprobs(logits.detach()[top][None])[0].exp()
        return prior, logits.grad

    @property
    def widening_due(self) -> bool:
        """Whether the candidates are to be widened before the next step: every `widen_every` steps, once."""
        every = self.config.widen_every
        return (self.reading is not None and every > 0 and self.config.objective in MARGINAL_OBJECTIVES
                and self.steps_taken > 0 and self.steps_taken % every == 0
                and not (self.widenings and self.widenings[-1].step == self.steps_taken))

    def top_rows(self, depth: int, *, batch: int = 64) -> list[tuple[int, ...]]:
        """Each training question's top `depth` KB rows over the whole knowledge base under the encoder as it is now
        (the logits of the loss: scale · cos + lexical_weight · BM25), best first."""
        if self.lexical_weight and self.kb_lexical is None:
            raise ValueError("ranking the whole base needs its BM25 scores (kb_lexical)")
        self.model.eval()
        depth = min(depth, len(self.passages))
        top = []
        for start in range(0, len(self.examples), batch):
            chunk = self.examples[start:start + batch]
            with torch.no_grad():
                vectors = question_vectors(self.model, self.encoder, [e.question for e in chunk])  # (Q, D)
                logits = self._base_logits(vectors, chunk)  # (Q, N)
            top += [tuple(int(r) for r in rows) for rows in logits.topk(depth, dim=1).indices.cpu()]
        return top

    def widen(self, *, progress: Callable[[str, int, int], None] | None = None, save_every: int = 200,
              should_stop: Callable[[], bool] = lambda: False) -> Widening:
        """Add to each question's candidates its top `config.candidates` over the whole base under the encoder now.

        A row already read for that question and answer (by any run: the reading cache keeps reads per passage)
        joins at no cost; the others are read with the frozen reader, at most `config.widen_max_reads` in all,
        best-ranked first (rank 1 of every question, then rank 2, ...): those left over wait for a later widening.
        `progress(stage, done, total)` hears of the reading, question by question; the cache is saved every
        `save_every` passages read and at the end. `should_stop()`, asked before each question's reading, ends it
        early: the questions not reached keep their candidates and count as passed over. Draws no random numbers.
        """
        if self.reading is None:
            raise ValueError("widening reads new candidates: give the trainer a reading")
        started = time.perf_counter()
        cache = self.reading.cache
        fresh_before = cache.fresh
        ranked = self.top_rows(self.config.candidates)  # (Q, C) rows, best first
        unread = sorted((rank, i, row) for i, (e, rows) in enumerate(zip(self.examples, ranked))
                        for rank, row in enumerate(rows)
                        if row not in e.rows and not cache.holds(e.question, e.answer, row))  # (rank, question, row)
        cap = len(unread) if self.config.widen_max_reads is None else self.config.widen_max_reads
        passed_over = {(i, row) for _, i, row in unread[cap:]}
        joining = {i: new for i, (e, rows) in enumerate(zip(self.examples, ranked))
                   if (new := tuple(r for r in rows if r not in e.rows and (i, r) not in passed_over))}
        to_read = len(unread) - len(passed_over)
        # the count runs over questions, each reading its own new passages: said, so "2 of 15" is not read as passages
        stage = (f"reading {to_read} new passages the trained encoder ranks in its top {self.config.candidates}, "
                 f"for {len(joining)} questions (once; cached)")
        saved_at, added = fresh_before, 0
        for done, (i, rows) in enumerate(joining.items(), start=1):
            if should_stop():  # the unread candidates of the questions not reached wait, as those over the cap do
                not_reached = {(j, row) for j, rest in list(joining.items())[done - 1:] for row in rest}
                passed_over |= not_reached & {(j, row) for _, j, row in unread}
                break
            added += len(rows)
            e = self.examples[i]
            self.examples[i] = merged_candidates(e, self.reading.question(e.question, e.answers, rows))
            if cache.fresh - saved_at >= save_every:
                cache.save()
                saved_at = cache.fresh
            if progress is not None and to_read:
                progress(stage, done, len(joining))
        if cache.fresh > saved_at:
            cache.save()
        widening = Widening(step=self.steps_taken, added=added, read=cache.fresh - fresh_before,
                            passed_over=len(passed_over), seconds=time.perf_counter() - started)
        self.widenings.append(widening)
        log.info("widened the candidates at step %d: %d added (%d read now, the others read before and cached) in %.1f s; "
                 "%d more left unread for a later widening",
                 widening.step, widening.added, widening.read, widening.seconds, widening.passed_over)
        return widening

    def step(self) -> float:
        """One optimizer step on the next batch (widening the candidates first when due); its loss before the step."""
        if self.widening_due:
            self.widen()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(self._next_batch())
        loss.backward()
        self.optimizer.step()
        self.steps_taken += 1
        return float(loss.detach())


@dataclass(frozen=True)
class Widening:
    """What one widening of the candidates did."""

    step: int  # steps taken before it
    added: int  # candidates joined, over all questions
    read: int  # of them, passages the reader read now (the others had been read before)
    passed_over: int  # unread passages of the top C left for a later widening (`widen_max_reads`)
    seconds: float


# ---- what the frozen reader makes of each candidate, read once ---------------------------------------------


def reading_key(question: str, answer: str, row: int) -> str:
    """The key of one passage's read in a `ReadingCache`: the question, the answer and the row, nothing else, so a
    passage read once for a question and answer is never read again, whatever it was read beside."""
    return hashlib.sha256(json.dumps(["row", question, answer, int(row)]).encode()).hexdigest()[:32]


def whole_reading_key(question: str, answer: str, rows: Sequence[int]) -> str:
    """The key of a read of several rows at once, as reading caches first kept them: (C, T) under one key."""
    return hashlib.sha256(json.dumps([question, answer, [int(r) for r in rows]]).encode()).hexdigest()[:32]


@dataclass
class ReadingCache:
    """Reader log-likelihoods by `reading_key`, (T,) per passage, kept in one file per knowledge base and reader.

    The file's name must say which knowledge base and reader it is for (the caller's key), since the
    log-probs are theirs. Saved whole, atomically (write aside, rename), so readers never see half a file.
    Whole reads ((C, T) under `whole_reading_key`) from files written before reads were kept per passage are
    split into their rows when those rows are asked for (`adopt_whole_read`), and left in the file as they were.
    `fresh` counts the passages read into it since it was opened.
    """

    path: Path | None
    reads: dict[str, torch.Tensor] = field(default_factory=dict)
    fresh: int = 0

    @classmethod
    def open(cls, path: Path | None) -> ReadingCache:
        if path is None or not path.is_file():
            return cls(path)
        try:
            reads = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as err:  # a damaged file is read again, not trusted
            log.warning("ignoring the reading cache %s (%s); its reads will be done again", path, err)
            reads = {}
        return cls(path, dict(reads))

    def holds(self, question: str, answer: str, row: int) -> bool:
        return reading_key(question, answer, row) in self.reads

    def get(self, question: str, answer: str, row: int) -> torch.Tensor:
        """(T,) log p(y_t|x,z,y<t) of the answer under passage `row`; KeyError when it was never read."""
        return self.reads[reading_key(question, answer, row)]

    def put(self, question: str, answer: str, rows: Sequence[int], token_logprobs: torch.Tensor) -> None:
        """Keep a fresh read: token_logprobs (C, T), one row per passage of `rows`."""
        for row, logprobs in zip(rows, token_logprobs.float().cpu()):
            self.reads[reading_key(question, answer, row)] = logprobs.clone()
        self.fresh += len(rows)

    def adopt_whole_read(self, question: str, answer: str, rows: Sequence[int]) -> None:
        """Where these rows were read together under the older whole key, keep each row's read under its own key."""
        whole = self.reads.get(whole_reading_key(question, answer, rows))
        if whole is not None and whole.shape[0] == len(rows):
            for row, logprobs in zip(rows, whole):
                self.reads.setdefault(reading_key(question, answer, row), logprobs.clone())

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        aside = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        torch.save(self.reads, aside)
        os.replace(aside, self.path)


@dataclass(frozen=True)
class CandidateReading:
    """How a question's candidates are read: read(question, answer, rows) -> (C, T) the frozen reader's
    log p(y_t|x,z,y<t); lexical(question) -> (N,) BM25 over the KB; passage_text(row) -> the text checked
    for an answer; and the cache that spares reading a passage twice."""

    read: Callable[[str, str, Sequence[int]], torch.Tensor]
    lexical: Callable[[str], np.ndarray]
    passage_text: Callable[[int], str]
    cache: ReadingCache = field(default_factory=lambda: ReadingCache(None))

    def question(self, question: str, answers: Sequence[str], rows: Sequence[int]) -> ReadQuestion:
        """The question with `rows` as its candidates, the first answer the target; only rows the cache lacks are
        read (in one reader call)."""
        answer, rows = answers[0], tuple(int(r) for r in rows)
        self.cache.adopt_whole_read(question, answer, rows)
        unread = [r for r in rows if not self.cache.holds(question, answer, r)]
        if unread:
            self.cache.put(question, answer, unread, self.read(question, answer, unread))
        token_logprobs = torch.stack([self.cache.get(question, answer, r) for r in rows])  # (C, T)
        scores = self.lexical(question)
        return ReadQuestion(question, answer, rows, token_logprobs, torch.tensor([float(scores[r]) for r in rows]),
                            tuple(bool(answer_in_text(self.passage_text(r), answers)) for r in rows), tuple(answers))


def read_candidates(pairs: Sequence[tuple[str, Sequence[str]]], *, candidates: Callable[[str], Sequence[int]],
                    reading: CandidateReading, progress: Callable[[int, int], None] | None = None,
                    should_stop: Callable[[], bool] = lambda: False, save_every: int = 200) -> list[ReadQuestion]:
    """Each (question, answers) pair read with its candidates (`candidates(question)` -> C rows of the KB): the
    first answer is the target. Passages already in the reading's cache are taken from it; new reads are added
    and the cache saved every `save_every` passages read and at the end. `should_stop()` ends early with what
    was read.
    """
    cache = reading.cache
    examples, fresh_before, saved_at = [], cache.fresh, cache.fresh
    for done, (question, answers) in enumerate(pairs, start=1):
        if should_stop():
            break
        examples.append(reading.question(question, answers, candidates(question)))
        if cache.fresh - saved_at >= save_every:
            cache.save()
            saved_at = cache.fresh
        if progress is not None:
            progress(done, len(pairs))
    if cache.fresh > fresh_before:
        cache.save()
    return examples


# ---- held-out figures: no passage labels, so a passage that holds an answer stands in for the gold one ------


@dataclass(frozen=True)
class HeldOutFigures:
    """Retrieval on held-out questions: recall@k of a passage that holds an answer, in the top k of the whole
    knowledge base, and the mean p(z|x) that the top `mass_k` give such passages (`answer_mass`)."""

    recall: dict[int, float]
    hits: dict[int, int]  # questions with an answer-bearing passage in the top k (for intervals)
    answer_mass: float
    questions: int

    def to_json(self) -> dict:
        return {**{f"recall@{k}": round(v, 4) for k, v in self.recall.items()}, "answer_mass": round(self.answer_mass, 4),
                "questions": self.questions}


@dataclass(frozen=True)
class TopPassages:
    """One question's top k under an encoder: KB rows, p(z|x) over those k, and which hold an answer."""

    rows: tuple[int, ...]
    probs: tuple[float, ...]
    answer_bearing: tuple[bool, ...]


class HeldOutCheck:
    """Measures an encoder's question side on fixed held-out questions over the whole knowledge base.

    passage_vectors (N, D); lexical_scores (Q, N) BM25 of each question, computed once; passage_text(row)
    is the text checked for an answer (checked once per row and question, then remembered).
    """

    def __init__(self, encoder: Encoder, passage_vectors: np.ndarray | torch.Tensor, questions: Sequence[tuple[str, Sequence[str]]],
                 lexical_scores: np.ndarray, passage_text: Callable[[int], str], *, lexical_weight: float,
                 ks: Sequence[int] = (1, 5, 20), mass_k: int = 5):
        self.encoder, self.questions, self.passage_text = encoder, list(questions), passage_text
        self.passages = torch.as_tensor(np.ascontiguousarray(passage_vectors, dtype=np.float32))  # (N, D)
        self.lexical = torch.from_numpy(np.asarray(lexical_scores, dtype=np.float32)) * float(lexical_weight)  # (Q, N)
        self.ks, self.mass_k = tuple(ks), mass_k
        self._bearing: dict[tuple[int, int], bool] = {}

    def _holds_answer(self, question: int, row: int) -> bool:
        key = (question, row)
        if key not in self._bearing:
            self._bearing[key] = bool(answer_in_text(self.passage_text(row), self.questions[question][1]))
        return self._bearing[key]

    def _logits(self, model: torch.nn.Module, questions: Sequence[int]) -> torch.Tensor:
        model.eval()
        with torch.inference_mode():
            vectors = question_vectors(model, self.encoder, [self.questions[i][0] for i in questions]).cpu()  # (Q, D)
        return self.encoder.scale * vectors @ self.passages.T + self.lexical[list(questions)]  # (Q, N)

    def top(self, model: torch.nn.Module, question: int, k: int) -> TopPassages:
        """One held-out question's top k under `model`, p(z|x) renormalized over them."""
        values, rows = self._logits(model, [question])[0].topk(k)
        probs = doc_logprobs(values[None])[0].exp()
        rows = tuple(int(r) for r in rows)
        return TopPassages(rows, tuple(float(p) for p in probs), tuple(self._holds_answer(question, r) for r in rows))

    def measure(self, model: torch.nn.Module, *, batch: int = 256) -> HeldOutFigures:
        depth = min(max(max(self.ks), self.mass_k), len(self.passages))
        hits = dict.fromkeys(self.ks, 0)
        mass = 0.0
        for start in range(0, len(self.questions), batch):
            chosen = list(range(start, min(start + batch, len(self.questions))))
            values, rows = self._logits(model, chosen).topk(depth, dim=1)  # (Q, depth)
            for i, question in enumerate(chosen):
                bearing = [self._holds_answer(question, int(r)) for r in rows[i]]
                first = next((rank for rank, b in enumerate(bearing) if b), None)
                for k in self.ks:
                    hits[k] += first is not None and first < k
                probs = doc_logprobs(values[i, : self.mass_k][None])[0].exp()  # p(z|x) over the top mass_k
                mass += float(sum(p for p, b in zip(probs, bearing[: self.mass_k]) if b))
        n = len(self.questions)
        return HeldOutFigures({k: hits[k] / n for k in self.ks}, hits, mass / n, n) if n else HeldOutFigures(
            dict.fromkeys(self.ks, float("nan")), hits, float("nan"), 0)

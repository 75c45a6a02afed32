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

The candidates are fixed when they are read (the top C under the packaged encoder, for example): a
passage outside them is never marginalized over, however the encoder moves.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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

    @property
    def pseudo_gold(self) -> int | None:
        """The best-ranked candidate that holds an answer (a KB row), the gold-passage loss's target; None: none does."""
        return next((row for row, bearing in zip(self.rows, self.answer_bearing) if bearing), None)


def padded_batch(examples: Sequence[ReadQuestion]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C, T) token log-probs, 0 past each answer's end (log 1: sums ignore it), and the (B, T) mask of real tokens.

    >>> a = ReadQuestion("q", "a", (0, 1), torch.full((2, 1), -1.0), torch.zeros(2), (True, False))
    >>> b = ReadQuestion("q", "a", (0, 1), torch.full((2, 2), -2.0), torch.zeros(2), (False, False))
    >>> logprobs, mask = padded_batch([a, b])
    >>> logprobs[0].tolist(), mask.tolist()
    ([[-1.0, 0.0], [-1.0, 0.0]], [[True, False], [True, True]])
    """
    candidates = {e.token_logprobs.shape[0] for e in examples}
    if len(candidates) != 1:
        raise ValueError(f"every question needs as many candidates; got {sorted(candidates)}")
    length = max(e.token_logprobs.shape[1] for e in examples)
    logprobs = torch.zeros(len(examples), candidates.pop(), length)
    mask = torch.zeros(len(examples), length, dtype=torch.bool)
    for i, e in enumerate(examples):
        logprobs[i, :, : e.token_logprobs.shape[1]] = e.token_logprobs
        mask[i, : e.token_logprobs.shape[1]] = True
    return logprobs, mask


def marginal_nll(logits: torch.Tensor, token_logprobs: torch.Tensor, mask: torch.Tensor, *, objective: str,
                 k: int) -> torch.Tensor:
    """(B,) −log p(y|x) of each answer under RAG-Token or RAG-Sequence, over the top k of its C candidates.

    logits (B, C) the retriever's; token_logprobs (B, C, T) the reader's, 0 at padding; mask (B, T).
    Which k passages are read is a choice, not a differentiable one (as in the paper, where the
    index picks them): the gradient flows through p(z|x) of those k.
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
    grad mode is on: as the retriever computes them at an ask (`Encoder.vectors`)."""
    return encoder.vectors(model, encoder.tokenizer, list(questions))


class EndToEndTrainer:
    """A copy of the encoder's question side and its optimizer; `step()` takes one step of `config.objective`.

    passage_vectors (N, D) are the knowledge base's fixed vectors. `kb_lexical(question)` gives a
    question's (N,) BM25 scores over the whole knowledge base: only the gold-passage loss needs it.
    Seeded: the same examples, config and starting weights give the same steps.
    """

    def __init__(self, encoder: Encoder, passage_vectors: np.ndarray | torch.Tensor, examples: Sequence[ReadQuestion], *,
                 lexical_weight: float, config: EndToEndConfig = EndToEndConfig(),
                 kb_lexical: Callable[[str], np.ndarray] | None = None):
        if config.objective == "gold-passage":
            examples = [e for e in examples if e.pseudo_gold is not None]
            if kb_lexical is None and lexical_weight:
                raise ValueError("the gold-passage loss needs BM25 over the whole knowledge base (kb_lexical)")
        if not examples:
            raise ValueError("no training questions" + (" with an answer-bearing candidate" if config.objective ==
                                                         "gold-passage" else ""))
        self.encoder, self.config, self.examples = encoder, config, list(examples)
        self.lexical_weight = float(lexical_weight)
        self.kb_lexical = kb_lexical
        torch.manual_seed(config.seed)  # dropout
        self._order = np.random.default_rng(config.seed)
        self._queue: list[int] = []
        self.model = copy.deepcopy(encoder.question_model).float().train()
        device = next(self.model.parameters()).device
        self.passages = torch.as_tensor(np.ascontiguousarray(passage_vectors, dtype=np.float32)).to(device)  # (N, D)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.learning_rate)
        self.steps_taken = 0

    def _next_batch(self) -> list[ReadQuestion]:
        """The next `batch_size` examples of a seeded shuffle, reshuffled after each pass."""
        batch = []
        while len(batch) < min(self.config.batch_size, len(self.examples)):
            if not self._queue:
                self._queue = self._order.permutation(len(self.examples)).tolist()
            batch.append(self.examples[self._queue.pop()])
        return batch

    def loss(self, batch: Sequence[ReadQuestion]) -> torch.Tensor:
        """The mean loss of `config.objective` over `batch`, with gradients to the question side."""
        device = self.passages.device
        vectors = question_vectors(self.model, self.encoder, [e.question for e in batch])  # (B, D)
        scale = self.encoder.scale
        if self.config.objective == "gold-passage":
            logits = scale * vectors @ self.passages.T  # (B, N)
            if self.lexical_weight:
                lexical = np.stack([self.kb_lexical(e.question) for e in batch])  # (B, N)
                logits = logits + self.lexical_weight * torch.from_numpy(lexical).to(device)
            gold = torch.tensor([e.pseudo_gold for e in batch], device=device)
            return torch.nn.functional.cross_entropy(logits, gold)
        rows = torch.tensor([e.rows for e in batch], device=device)  # (B, C)
        dense = torch.einsum("bd,bcd->bc", vectors, self.passages[rows])  # (B, C)
        logits = scale * dense + self.lexical_weight * torch.stack([e.lexical for e in batch]).to(device)  # (B, C)
        token_logprobs, mask = padded_batch(batch)
        return marginal_nll(logits, token_logprobs.to(device), mask.to(device), objective=self.config.objective,
                            k=self.config.k).mean()

    def logits(self, example: ReadQuestion) -> torch.Tensor:
        """(C,) the example's candidate logits under the encoder as it is now, without gradients to it."""
        self.model.eval()
        with torch.no_grad():
            vector = question_vectors(self.model, self.encoder, [example.question])[0]  # (D,)
        dense = self.passages[torch.tensor(example.rows, device=self.passages.device)] @ vector  # (C,)
        return (self.encoder.scale * dense + self.lexical_weight * example.lexical.to(dense.device)).cpu()

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

    def step(self) -> float:
        """One optimizer step on the next batch; its loss before the step."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(self._next_batch())
        loss.backward()
        self.optimizer.step()
        self.steps_taken += 1
        return float(loss.detach())


# ---- what the frozen reader makes of each candidate, read once ---------------------------------------------


def reading_key(question: str, answer: str, rows: Sequence[int]) -> str:
    """The key of one read in a `ReadingCache`: the question, the answer and the rows read, nothing else."""
    return hashlib.sha256(json.dumps([question, answer, [int(r) for r in rows]]).encode()).hexdigest()[:32]


@dataclass
class ReadingCache:
    """Reader log-likelihoods (C, T) by `reading_key`, kept in one file per knowledge base and reader.

    The file's name must say which knowledge base and reader it is for (the caller's key), since the
    log-probs are theirs. Saved whole, atomically (write aside, rename), so readers never see half a file."""

    path: Path | None
    reads: dict[str, torch.Tensor] = field(default_factory=dict)

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

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        aside = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        torch.save(self.reads, aside)
        os.replace(aside, self.path)


def read_candidates(pairs: Sequence[tuple[str, Sequence[str]]], *, candidates: Callable[[str], Sequence[int]],
                    read: Callable[[str, str, Sequence[int]], torch.Tensor], lexical: Callable[[str], np.ndarray],
                    passage_text: Callable[[int], str], cache: ReadingCache | None = None,
                    progress: Callable[[int, int], None] | None = None,
                    should_stop: Callable[[], bool] = lambda: False, save_every: int = 20) -> list[ReadQuestion]:
    """Each (question, answers) pair read with its candidates: the first answer is the target.

    candidates(question) -> C rows of the KB; read(question, answer, rows) -> (C, T) the frozen reader's
    log p(y_t|x,z,y<t); lexical(question) -> (N,) BM25 over the KB; passage_text(row) -> the text
    checked for an answer. Reads already in `cache` are taken from it; new ones are added and the
    cache saved every `save_every` reads and at the end. `should_stop()` ends early with what was read.
    """
    cache = cache or ReadingCache(None)
    examples, fresh = [], 0
    for done, (question, answers) in enumerate(pairs, start=1):
        if should_stop():
            break
        rows = tuple(int(r) for r in candidates(question))
        key = reading_key(question, answers[0], rows)
        if key not in cache.reads:
            cache.reads[key] = read(question, answers[0], rows).float().cpu()
            fresh += 1
            if fresh % save_every == 0:
                cache.save()
        scores = lexical(question)
        examples.append(ReadQuestion(question, answers[0], rows, cache.reads[key],
                                     torch.tensor([float(scores[r]) for r in rows]),
                                     tuple(bool(answer_in_text(passage_text(r), answers)) for r in rows)))
        if progress is not None:
            progress(done, len(pairs))
    if fresh:
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

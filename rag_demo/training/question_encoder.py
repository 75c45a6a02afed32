"""Fine-tuning the retriever's question encoder on a KB's training questions.

RAG fine-tunes its query encoder and keeps the document encoder, and so the index, fixed
(paper, section 2.4): the passages keep the embeddings they were built with and no KB is
rebuilt. The paper trains the query encoder through the generator's marginal likelihood; on
two CPU cores a pass through Gemma-3-270m per passage is far too slow, so this uses the gold
passage each question comes with (DPR's objective): the cross-entropy of the gold passage under
the retriever's own logits over every passage of the KB,

    logits(z) = scale * cos(q(x), d(z)) + lexical_weight * BM25(x, z)     (B, N)

BM25 is a fixed term, so the encoder learns what the hybrid score still gets wrong.

Questions are split by group (`questions.split_questions`): questions that share a gold passage, or
a normalized answer and most of their words, fall on one side, so a held-out question is never
trained on, nor any rewording of it, and only held-out questions are evaluated. The UI's example
questions are left out of training too.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ..config import TuningConfig
from ..precision import build_autocast
from ..retrieval.encoders import Encoder, retrieval_question
from ..retrieval.lexical import LexicalIndex

log = logging.getLogger(__name__)

# A step of the question encoder goes through it in this many runs of similar question length
# (`length_groups`). In a random batch of 64 training questions the padding was 55% of the real
# tokens; in two runs 25%, in four 11% (docs/speed-notes.md has the timings)
QUESTION_LENGTH_GROUPS = 2


@dataclass(frozen=True)
class TrainingQuestion:
    question: str
    gold_id: int  # row of its gold passage in the KB the encoder is tuned on


def drawn_share(items: Sequence, share: float, *, seed: int) -> list:
    """round(share * len(items)) of `items` (at least one of a non-empty list), in a seeded random
    order; with the same seed a larger share begins with a smaller one's draw."""
    if not 0 < share <= 1:
        raise ValueError(f"a share is in (0, 1], not {share}")
    order = np.random.default_rng(seed).permutation(len(items))
    return [items[i] for i in order[:max(1, round(len(items) * share))]] if len(items) else []


def gold_ranks(question_vectors: torch.Tensor, passage_vectors: torch.Tensor, lexical_scores: np.ndarray,
               gold_ids: Sequence[int], *, scale: float, lexical_weight: float) -> np.ndarray:
    """(Q,) 0-based rank of each question's gold passage under the hybrid logits.

    question_vectors (Q, D), passage_vectors (N, D), lexical_scores (Q, N).
    """
    logits = scale * (question_vectors @ passage_vectors.T).cpu().numpy() + lexical_weight * lexical_scores  # (Q, N)
    gold = logits[np.arange(len(gold_ids)), np.asarray(gold_ids)]  # (Q,)
    return (logits > gold[:, None]).sum(axis=1)


def length_groups(lengths: Sequence[int], *, groups: int) -> list[list[int]]:
    """Indices into `lengths`, shortest first, cut into `groups` near-equal runs (fewer when there are fewer items).

    A batch goes through the encoder in these runs, each padded to its own longest, with their
    gradients summed: the same step as the whole batch at once, with less padding.
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    return [run.tolist() for run in np.array_split(np.asarray(order, dtype=np.int64), max(1, min(groups, len(order)))) if len(run)]


def recall_at(model: torch.nn.Module, encoder: Encoder, passage_vectors: torch.Tensor, lexical: LexicalIndex,
              questions: Sequence[TrainingQuestion], *, lexical_weight: float, ks=(1, 5, 20)) -> dict[int, float]:
    """Share of `questions` whose gold passage is in the top k, for each k."""
    if not questions:
        return {k: float("nan") for k in ks}
    model.eval()
    with torch.inference_mode():
        vectors = torch.cat([
            encoder.question_vectors(model, [q.question for q in questions[start:start + 256]])
            for start in range(0, len(questions), 256)
        ])
    lexical_scores = np.stack([lexical.scores(q.question) for q in questions])  # (Q, N)
    ranks = gold_ranks(vectors, passage_vectors.to(vectors.device), lexical_scores, [q.gold_id for q in questions],
                       scale=encoder.scale, lexical_weight=lexical_weight)
    return {k: float((ranks < k).mean()) for k in ks}


def tune_question_encoder(
    encoder: Encoder,
    passage_vectors: np.ndarray,
    lexical: LexicalIndex,
    questions: Sequence[TrainingQuestion],
    *,
    lexical_weight: float,
    config: TuningConfig = TuningConfig(),
    progress: Callable[[int, int], None] | None = None,
    autocast: bool = False,
) -> torch.nn.Module:
    """A fine-tuned copy of `encoder.question_model`; the encoder itself is left as it was.

    passage_vectors (N, D) are the KB's fixed unit embeddings; `lexical` indexes the same N
    passages. `progress(done, total)` is called after every step. `autocast` runs the encoder's
    forward pass in bfloat16 where that is native (`rag_demo.precision`); the logits over the
    KB and the loss stay float32, since neighbouring passages' cosines differ by less than
    bfloat16 resolves.
    """
    if not questions:
        raise ValueError("no training questions")
    torch.manual_seed(config.seed)  # dropout
    order_rng = np.random.default_rng(config.seed)
    model = copy.deepcopy(encoder.question_model).float().train()
    device = next(model.parameters()).device
    passages = torch.from_numpy(np.ascontiguousarray(passage_vectors, dtype=np.float32)).to(device)  # (N, D)
    # One fused kernel per tensor: the plain step walks the 22M weights (the word embeddings are half)
    # op by op, a seventh of a step's time under the profiler on 2 CPU cores. Side by side the fused
    # step was 13% faster in one run and no faster in another (docs/speed-notes.md); the recall is the same.
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, fused=device.type in ("cpu", "cuda"))
    lengths = [len(ids) for ids in encoder.tokenizer([retrieval_question(q.question) for q in questions], truncation=True,
                                                     max_length=encoder.max_length)["input_ids"]]
    steps_per_epoch = -(-len(questions) // config.batch_size)
    total = steps_per_epoch * config.epochs
    started, done = time.perf_counter(), 0
    for epoch in range(config.epochs):
        order = order_rng.permutation(len(questions))
        running = 0.0
        for start in range(0, len(order), config.batch_size):
            batch = order[start:start + config.batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = 0.0
            for group in length_groups([lengths[i] for i in batch], groups=QUESTION_LENGTH_GROUPS):
                part = [questions[batch[i]] for i in group]
                lexical_scores = torch.from_numpy(np.stack([lexical.scores(q.question) for q in part])).to(device)  # (b, N)
                with build_autocast(device, enabled=autocast):
                    # as an ask reads them; pooled in float32 under autocast too
                    vectors = encoder.question_vectors(model, [q.question for q in part])  # (b, D)
                logits = encoder.scale * vectors.float() @ passages.T + lexical_weight * lexical_scores  # (b, N)
                gold = torch.tensor([q.gold_id for q in part], device=device)
                # summed over the part and divided by the whole batch: the parts' gradients add up to the batch mean's
                part_loss = torch.nn.functional.cross_entropy(logits, gold, reduction="sum") / len(batch)
                part_loss.backward()
                loss += part_loss.item()
            optimizer.step()
            running += loss
            done += 1
            if progress is not None:
                progress(done, total)
        log.info("question encoder, epoch %d of %d: mean loss %.3f (%.0f s so far)", epoch + 1, config.epochs,
                 running / steps_per_epoch, time.perf_counter() - started)
    return model.eval()

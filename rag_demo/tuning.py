"""Fine-tuning the retriever's question encoder on nq-wiki's training questions.

RAG fine-tunes its query encoder and keeps the document encoder, and so the index, fixed
(paper, section 2.4): the passages keep the embeddings they were built with and no KB is
rebuilt. The paper trains the query encoder through the generator's marginal likelihood; on
two CPU cores a pass through Gemma-3-270m per passage is far too slow, so this uses the gold
passage each question comes with (DPR's objective): the cross-entropy of the gold passage under
the retriever's own logits over every passage of the KB,

    logits(z) = scale * cos(q(x), d(z)) + lexical_weight * BM25(x, z)     (B, N)

BM25 is a fixed term, so the encoder learns what the hybrid score still gets wrong.

Questions are split by gold passage (`data.is_held_out`): a question whose passage is held out
is never trained on, and only those questions are evaluated; near-duplicate questions share a
passage, so they fall on the same side. The UI's example questions are left out of training too.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from .config import TuningConfig
from .encoders import Encoder, mean_pooled
from .lexical import LexicalIndex

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingQuestion:
    question: str
    gold_id: int  # row of its gold passage in the KB the encoder is tuned on


def gold_ranks(question_vectors: torch.Tensor, passage_vectors: torch.Tensor, lexical_scores: np.ndarray,
               gold_ids: Sequence[int], *, scale: float, lexical_weight: float) -> np.ndarray:
    """(Q,) 0-based rank of each question's gold passage under the hybrid logits.

    question_vectors (Q, D), passage_vectors (N, D), lexical_scores (Q, N).
    """
    logits = scale * (question_vectors @ passage_vectors.T).cpu().numpy() + lexical_weight * lexical_scores  # (Q, N)
    gold = logits[np.arange(len(gold_ids)), np.asarray(gold_ids)]  # (Q,)
    return (logits > gold[:, None]).sum(axis=1)


def _encode(model: torch.nn.Module, tokenizer, questions: Sequence[str], max_length: int) -> torch.Tensor:
    """(B, D) unit question vectors, with gradients when grad mode is on."""
    device = next(model.parameters()).device
    batch = tokenizer(list(questions), padding=True, truncation=True, max_length=max_length, return_tensors="pt").to(device)
    hidden = model(**batch).last_hidden_state  # (B, L, D)
    return mean_pooled(hidden, batch["attention_mask"])


def recall_at(model: torch.nn.Module, encoder: Encoder, passage_vectors: torch.Tensor, lexical: LexicalIndex,
              questions: Sequence[TrainingQuestion], *, lexical_weight: float, ks=(1, 5, 20)) -> dict[int, float]:
    """Share of `questions` whose gold passage is in the top k, for each k."""
    if not questions:
        return {k: float("nan") for k in ks}
    model.eval()
    with torch.inference_mode():
        vectors = torch.cat([
            _encode(model, encoder.tokenizer, [q.question for q in questions[start:start + 256]], encoder.max_length)
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
) -> torch.nn.Module:
    """A fine-tuned copy of `encoder.question_model`; the encoder itself is left as it was.

    passage_vectors (N, D) are the KB's fixed unit embeddings; `lexical` indexes the same N
    passages. `progress(done, total)` is called after every step.
    """
    if not questions:
        raise ValueError("no training questions")
    torch.manual_seed(config.seed)  # dropout
    order_rng = np.random.default_rng(config.seed)
    model = copy.deepcopy(encoder.question_model).float().train()
    device = next(model.parameters()).device
    passages = torch.from_numpy(np.ascontiguousarray(passage_vectors, dtype=np.float32)).to(device)  # (N, D)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    steps_per_epoch = -(-len(questions) // config.batch_size)
    total = steps_per_epoch * config.epochs
    started, done = time.perf_counter(), 0
    for epoch in range(config.epochs):
        order = order_rng.permutation(len(questions))
        running = 0.0
        for start in range(0, len(order), config.batch_size):
            batch = [questions[i] for i in order[start:start + config.batch_size]]
            lexical_scores = torch.from_numpy(np.stack([lexical.scores(q.question) for q in batch])).to(device)  # (B, N)
            vectors = _encode(model, encoder.tokenizer, [q.question for q in batch], encoder.max_length)  # (B, D)
            logits = encoder.scale * vectors @ passages.T + lexical_weight * lexical_scores  # (B, N)
            loss = torch.nn.functional.cross_entropy(logits, torch.tensor([q.gold_id for q in batch], device=device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            running += loss.item()
            done += 1
            if progress is not None:
                progress(done, total)
        log.info("question encoder, epoch %d of %d: mean loss %.3f (%.0f s so far)", epoch + 1, config.epochs,
                 running / steps_per_epoch, time.perf_counter() - started)
    return model.eval()

"""The generator's memory ∅ as a source beside the k passages: its logit θ for a setup, p(z|x) over the
k + 1 sources, and, in an ask where it is no source, the notice that no passage is close to the question.

Importing this module loads nothing heavy.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .config import DEFAULT_ENCODER, DEFAULT_GENERATOR, DEFAULT_KBS, DEFAULT_MEMORY_LOGITS, NO_MATCH_SCORE, EngineConfig
from .marginalize import doc_logprobs_with_memory
from .results import Retrieval


def fitted_logit(config: EngineConfig, encoder, generator, retriever: str, *, own_question_side: bool,
                 kb: str | None = None) -> float | None:
    """θ for asks with `retriever` ("hybrid", "dense", ...) on `kb`: the configured logit, else the one fitted for
    this setup (DEFAULT_MEMORY_LOGITS); None where memory is switched off or this setup has no fitted logit."""
    memory = config.memory
    if not memory.enabled:
        return None
    if memory.logit is not None:
        return float(memory.logit)
    if not fitted_for(config, encoder, generator, own_question_side=own_question_side):
        return None
    # fitted against the packaged bases' logits: another base (a visitor's few passages, a folder of
    # one's own) has BM25 statistics and passage lengths of its own, and θ would outweigh its passages
    if kb is not None and kb not in DEFAULT_KBS:
        return None
    return DEFAULT_MEMORY_LOGITS.get(retriever)


def fitted_for(config: EngineConfig, encoder, generator, *, own_question_side: bool) -> bool:
    """Whether DEFAULT_MEMORY_LOGITS were fitted for this setup: the default encoder's packaged question side and
    the base generator, as a machine without the NQ pair builds them (a fine-tuned or trained question side moves
    every passage's logit)."""
    return not (encoder.name != DEFAULT_ENCODER or encoder.question_weights or not own_question_side
                or generator.name != DEFAULT_GENERATOR or generator.has_adapter or config.rag_checkpoint)


def no_match_floor(encoder, *, own_question_side: bool) -> float | None:
    """The dense score below which no passage is close to a question (NO_MATCH_SCORE), where it was measured: the
    default encoder's packaged question side. None elsewhere (another encoder's scores, or a fine-tuned question side
    that moves them)."""
    calibrated = encoder.name == DEFAULT_ENCODER and not encoder.question_weights and own_question_side
    return NO_MATCH_SCORE if calibrated else None


def with_memory(retrieval: Retrieval, logit: float) -> Retrieval:
    """The retrieval with p(z|x) over its K passages and ∅ at `logit`: doc_lp (K + 1,), the memory's last."""
    logits = torch.tensor([[p.logit for p in retrieval.passages]])
    doc_lp = doc_logprobs_with_memory(logits, logit)[0]  # (K + 1,)
    passages = tuple(replace(p, prob=float(doc_lp[i].exp())) for i, p in enumerate(retrieval.passages))
    return replace(retrieval, passages=passages, doc_lp=doc_lp)


def poor_match_notice(retrieval: Retrieval, floor: float | None) -> tuple[str, ...]:
    """For an ask where memory is no source: a notice when every passage's dense score is below `floor` (None: no
    floor measured for this setup). Such passages are about something else (a visitor's own text asked about
    another subject), and with no other source the answer can only be read from them. () otherwise, and for BM25,
    which has no dense score.

    The floor was measured on the packaged bases' passages, each of one article. A visitor's passage may mix
    subjects (a page of notes), which lowers the score of one that answers: there the notice says to check the
    passages, not that the answer is likely wrong."""
    if floor is None or not retrieval.passages or retrieval.retriever == "bm25":
        return ()
    best = max(p.score for p in retrieval.passages)
    if best >= floor:
        return ()
    if retrieval.kb in DEFAULT_KBS:
        return (f"no passage is close to the question (best score {best:.2f}; a passage that answers a question usually "
                f"scores {floor:.2f} or more), so the answer read from them is likely wrong: compare it with the "
                "closed-book answer",)
    return (f"no passage is close to the question (best score {best:.2f}; on the Wikipedia bases a passage that answers "
            f"usually scores {floor:.2f} or more, though one that covers several subjects scores less): check that a "
            "passage says the answer before trusting it",)

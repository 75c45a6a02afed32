"""How sure an answer is, read from its p(y|x), where that was measured.

A 270M generator names an entity with the same fluency whether a passage says it or not, so an answer's words
alone do not tell a right answer from a wrong one. Its p(y|x) does: on everyday questions over wikipedia, RAG-Token's
answers of p(y|x) 0.2 or more were nearly always right, and most of those under 0.05 were wrong
(config.LIKELY_RIGHT_P). The bands hold where they were measured only: another base, model, retriever or decoding
moves p(y|x), and then no band is given.
"""

from __future__ import annotations

import math

from .config import ASK, GENERAL_KB, LIKELY_RIGHT_P, LIKELY_WRONG_P

MEASURED_VARIANTS = ("token",)
MEASURED_RETRIEVER = "hybrid"  # the page's default, Dense + BM25
SURENESS_WORDS = ("likely right", "unsure", "likely wrong")


def answer_sureness(logprob: float) -> str:
    """The band of an answer of log p(y|x) `logprob`.

    >>> answer_sureness(math.log(0.5)), answer_sureness(math.log(0.1)), answer_sureness(math.log(0.01))
    ('likely right', 'unsure', 'likely wrong')
    """
    p = math.exp(logprob)
    if p >= LIKELY_RIGHT_P:
        return SURENESS_WORDS[0]
    return SURENESS_WORDS[1] if p >= LIKELY_WRONG_P else SURENESS_WORDS[2]


def measured_for(*, setup_measured: bool, kb: str, k: int, retriever: str, memory: bool, num_beams: int,
                 extractive: bool) -> bool:
    """Whether the bands were measured for an ask: the default models (`setup_measured`, as for memory's fitted
    logit: `memory.fitted_for`) on the general base, with the page's default k and retriever, memory as a source,
    and free greedy decoding. More passages would share p(z|x) among more answers, fewer among fewer.

    >>> measured_for(setup_measured=True, kb="wikipedia", k=5, retriever="hybrid", memory=True, num_beams=1, extractive=False)
    True
    >>> measured_for(setup_measured=True, kb="mine", k=5, retriever="hybrid", memory=True, num_beams=1, extractive=False)
    False
    """
    return (setup_measured and kb == GENERAL_KB and k == ASK.k and retriever == MEASURED_RETRIEVER and memory
            and num_beams == 1 and not extractive)

"""How sure an answer is, read from its p(y|x), where that was measured.

A 270M generator names an entity with the same fluency whether a passage says it or not, so an answer's words
alone do not tell a right answer from a wrong one. Its p(y|x) tells them apart far better: on everyday questions
over wikipedia, either variant's answers of p(y|x) 0.2 or more were nearly always right, and most of those under 0.05
were wrong (config.LIKELY_RIGHT_P): a rate, not a proof. The bands hold where they were measured only: another
base, model, retriever or decoding moves p(y|x), and then no band is given (with the default models, a notice
says what differs).
"""

from __future__ import annotations

import math
from dataclasses import replace

from .config import (ASK, DECODING_DEFAULTS, GENERAL_KB, LIKELY_RIGHT_P, LIKELY_WRONG_P, LONG_ANSWER_WORDS,
                     VARIANT_NAMES)
from .question_kinds import unusual_kinds
from .results import VariantResult

MEASURED_VARIANTS = ("token", "sequence")
MEASURED_SEQUENCE_DECODING = DECODING_DEFAULTS.sequence_decoding  # thorough: each candidate under every source
MEASURED_RETRIEVER = "hybrid"  # the page's default, Dense + BM25
SURENESS_WORDS = ("likely right", "unsure", "likely wrong")


def answer_sureness(logprob: float) -> str:
    """The band of an answer of log p(y|x) `logprob`.

    The band is read from p(y|x) as the page prints it, to 3 decimals, so that a badge never contradicts the
    number beside it (0.19996 is shown as 0.200, and is at the threshold).

    >>> answer_sureness(math.log(0.5)), answer_sureness(math.log(0.1)), answer_sureness(math.log(0.01))
    ('likely right', 'unsure', 'likely wrong')
    >>> answer_sureness(math.log(0.19996)), answer_sureness(math.log(0.1994)), answer_sureness(math.log(0.04996))
    ('likely right', 'unsure', 'unsure')
    """
    p = round(math.exp(logprob), 3)
    if p >= LIKELY_RIGHT_P:
        return SURENESS_WORDS[0]
    return SURENESS_WORDS[1] if p >= LIKELY_WRONG_P else SURENESS_WORDS[2]


# The longest question of the sets the bands were measured on has 21 words; a text pasted before a question, which
# the generator reads too, moves p(y|x) in ways they never saw
MEASURED_MAX_WORDS = 30


def unmeasured_options(*, kb: str, question: str, k: int, index: str, retriever: str, memory: bool, num_beams: int,
                       extractive: bool, trained: bool = False) -> list[str]:
    """What of an ask differs from the setting the bands were measured in (the general base, a question of fact of at
    most MEASURED_MAX_WORDS words, of none of `question_kinds.QUESTION_KINDS`: not about the asker, not yes/no, in English...,
    and the page's default options: k = 5, the flat index, Dense + BM25, memory as a source, free greedy decoding, the packaged
    question encoder: not one `trained` on the page), in words; [] when nothing does. More passages would share
    p(z|x) among more answers, an approximate index reads other passages, and so on: each moves p(y|x).

    >>> unmeasured_options(kb="wikipedia", question="who wrote hamlet?", k=5, index="flat", retriever="hybrid",
    ...                    memory=True, num_beams=1, extractive=False)
    []
    >>> unmeasured_options(kb="wikipedia", question="who wrote hamlet?", k=3, index="hnsw", retriever="hybrid",
    ...                    memory=False, num_beams=1, extractive=False)
    ['k = 3', 'the hnsw index', 'memory off']
    """
    checks = ((kb != GENERAL_KB, f"the {kb} base"), (len(question.split()) > MEASURED_MAX_WORDS, "a long question"),
              *((True, kind) for kind in unusual_kinds(question)),
              (k != ASK.k, f"k = {k}"), (index != ASK.index, f"the {index} index"),
              (retriever != MEASURED_RETRIEVER, f"the {retriever} retriever"), (not memory, "memory off"),
              (num_beams != 1, f"{num_beams} beams"), (extractive, "copying"),
              (trained, "a question encoder trained on this page"))
    return [words for differs, words in checks if differs]


def long_answer(text: str) -> bool:
    """Whether an answer is a sentence rather than a name or a number (LONG_ANSWER_WORDS words or more): no band
    was measured for it, and a passage is not expected to hold it word for word.

    >>> long_answer("Leonardo da Vinci"), long_answer("the sky is blue because of Rayleigh scattering")
    (False, True)
    """
    return len(text.split()) >= LONG_ANSWER_WORDS


NO_BADGE = "no likely right / unsure / likely wrong badge"
# Score's answers are a visitor's, not the generator's: the rates were measured on what it wrote itself
SCORED_NO_BADGE = (f"{NO_BADGE} for a scored answer: the badge tells how often answers the generator wrote itself were "
                   "right, and an answer typed in to be scored is not one of those")


def banded(results: dict[str, VariantResult], differences: list[str], *,
           sequence_decoding: str = MEASURED_SEQUENCE_DECODING) -> tuple[dict[str, VariantResult], tuple[str, ...]]:
    """An ask's answers by variant, each measured variant's with its band where nothing `differs` from the measured
    ask (`unmeasured_options`, and for RAG-Sequence its decoding) and the answer is not a sentence; otherwise
    unchanged, with a notice that says why when a measured variant answered."""
    measured = [variant for variant in MEASURED_VARIANTS if variant in results]
    if differences:
        if not measured:
            return results, ()
        if "sequence" in results and sequence_decoding != MEASURED_SEQUENCE_DECODING:
            differences = [*differences, f"{sequence_decoding} RAG-Sequence decoding"]
        return results, (f"{NO_BADGE}: the badges were measured on everyday questions of fact, asked on {GENERAL_KB} with the "
                         f"page's default options, and this ask differs: {', '.join(differences)}",)
    banded_results, notices = dict(results), []
    for variant in measured:
        result, name = results[variant], VARIANT_NAMES[variant]
        if variant == "sequence" and sequence_decoding != MEASURED_SEQUENCE_DECODING:
            notices.append(f"{NO_BADGE} for {name}'s answer: it was measured with {MEASURED_SEQUENCE_DECODING} "
                           f"decoding, and this ask used {sequence_decoding}")
        elif long_answer(result.answer):
            notices.append(f"{NO_BADGE} for {name}'s answer: it is a sentence, and the badge was measured on answers "
                           "of a few words (a long answer's p(y|x) is small whatever it says)")
        else:
            banded_results[variant] = replace(result, sureness=answer_sureness(result.logprob))
    return banded_results, tuple(notices)

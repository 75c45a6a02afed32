"""Answers that only restate the question, and setting them aside while decoding.

A small reader often answers "what is a baby frog called?" with "a baby frog": every word of the
answer is already in the question. Such an answer cannot be right unless the question offers it
(a choice between named things: "which is bigger, the sun or the moon?", or a question that carries a
text of its own, pasted before it, to answer from), so decoding sets it aside
and decodes again with the set-aside answer's first word barred from starting the answer, a few
times at most. The probabilities reported for the answer that stays are the model's own; only the
choice among answers changes, as with any other decoding rule.

Importing this module loads nothing heavy.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..questions import normalize_answer

if TYPE_CHECKING:
    from .decoding import Hypothesis
    from .generator import Generator

# Decodes after the first, at most: each bars one more first word (all its cases and spacings)
RESTATEMENT_RETRIES = 3
_CHOICE = re.compile(r"\bor\b", re.IGNORECASE)
# A question carries a text of its own (pasted before it), whose words an answer may rightly copy, past this many
# words (the longest of the everyday question sets has 21) or where a sentence ends and another begins inside it
# (a word of three letters or more, its closing mark, a capital: "... family Salticidae. What family ...?"; an
# initial such as "John F. Kennedy" is no sentence end). No everyday question is either.
QUESTION_WITH_TEXT_WORDS = 40
_SENTENCE_END = re.compile(r"[^\W\d_]{3,}[.!?]\s+[A-Z]")


def restates_question(question: str, answer: str) -> bool:
    """Whether every word of `answer` (SQuAD-normalized) is a word of `question`, where the
    question offers no choice ("... or ...?") that an answer would have to repeat and carries no
    text of its own that an answer would copy (`carries_text`).

    >>> restates_question("what is a baby frog called?", "A baby frog")
    True
    >>> restates_question("what is a baby frog called?", "tadpole")
    False
    >>> restates_question("which is bigger, the sun or the moon?", "the Sun")
    False
    >>> restates_question("The Great Fire of London burned in 1666. " * 6 + "In which year was it?", "1666")
    False
    """
    words = normalize_answer(answer).split()
    if not words or _CHOICE.search(question) or carries_text(question):
        return False
    asked = set(normalize_answer(question).split())
    return all(word in asked for word in words)


def carries_text(question: str) -> bool:
    """Whether a question brings a text of its own before it: more than QUESTION_WITH_TEXT_WORDS words, or two
    sentences.

    >>> carries_text("Jumping spiders are in the family Salticidae. What family are jumping spiders in?")
    True
    >>> carries_text("in which city was president John F. Kennedy assassinated?"), carries_text("what is 2.5 times 2?")
    (False, False)
    """
    return len(question.split()) > QUESTION_WITH_TEXT_WORDS or bool(_SENTENCE_END.search(question))


def first_word_forms(tokenizer, token_id: int) -> frozenset[int]:
    """`token_id` and every single token spelling the same word in another case or with(out) a
    leading space: what to bar so that a set-aside answer's first word cannot simply come back
    as "The" for "the"."""
    word = tokenizer.decode([token_id]).strip()
    forms = {token_id}
    if not word:
        return frozenset(forms)
    for spelling in {word, word.lower(), word.capitalize(), word.upper()}:
        for text in (spelling, " " + spelling):
            ids = tokenizer(text, add_special_tokens=False).input_ids
            if len(ids) == 1:
                forms.add(int(ids[0]))
    return frozenset(forms)


def set_aside_restatements(decode: Callable[[frozenset[int]], Hypothesis], restates: Callable[[str], bool],
                           generator: Generator) -> tuple[Hypothesis, tuple[str, ...]]:
    """`decode(barred_first)`'s answer, decoded again while `restates(its text)`, each time with one more first
    word barred in all its spellings (`Generator.first_word_forms`), `RESTATEMENT_RETRIES` times at most.

    Returns the answer kept and the answers set aside before it; where every try restates, the first answer
    and () (the model's own choice stands)."""
    barred: frozenset[int] = frozenset()
    set_aside: list[str] = []
    first = None
    for _ in range(1 + RESTATEMENT_RETRIES):
        hyp = decode(barred)
        first = first or hyp
        text = generator.decode(list(hyp.ids))
        if not restates(text):
            return hyp, tuple(set_aside)
        set_aside.append(text)
        word = next((t for t in hyp.ids if t not in generator.special_ids), None)
        if word is None:
            break
        barred = barred | generator.first_word_forms(word)
    return first, ()

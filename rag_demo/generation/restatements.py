"""Answers that only restate the question, and setting them aside while decoding.

A small reader often answers "what is a baby frog called?" with "a baby frog": every word of the
answer is already in the question. Such an answer cannot be right unless the question offers it
(a choice between named things: "which is bigger, the sun or the moon?", or a question that carries a
text of its own, pasted before it, to answer from), so decoding sets it aside
and decodes again with the set-aside answer's first word barred from starting the answer, a few
times at most. The same holds for an answer that starts a sentence out of the question ("what do
koalas eat?" -> "koalas eat a variety of plants, ..."): the reader has begun to repeat the question,
and the span it was asked for, if it comes, comes late in a sentence that exact match never takes.
The probabilities reported for the answer that stays are the model's own; only the choice among
answers changes, as with any other decoding rule.

Importing this module loads nothing heavy.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..questions import FRAME_WORDS, normalize_answer, same_word
from ..retrieval.corpus import sentence_ends

if TYPE_CHECKING:
    from .decoding import Hypothesis
    from .generator import Generator

# Decodes after the first, at most: each bars one more first word (all its cases and spacings)
RESTATEMENT_RETRIES = 3
_CHOICE = re.compile(r"\bor\b", re.IGNORECASE)
_POSSESSIVE = re.compile(r"['\u2019]s\b", re.IGNORECASE)
# An answer this long that opens with the question's words is a sentence made of the question, not a span
SENTENCE_WORDS = 4
# ... except where the question asks for an explanation, which a sentence gives: "why is the sky blue?" -> "the sky is
# blue because of Rayleigh scattering"
_EXPLAINING = re.compile(r"\s*(?:why|how (?:do|does|did|is|are|was|were|can|could|would|should|to))\b", re.IGNORECASE)
# A question carries a text of its own (pasted before it), whose words an answer may rightly copy, past this many
# words (the longest of the everyday question sets has 21) or where a sentence ends and another begins inside it
# (`corpus.sentence_ends`: "... family Salticidae. What family ...?"; an
# initial such as "John F. Kennedy" is no sentence end). No everyday question is either.
QUESTION_WITH_TEXT_WORDS = 40


def restates_question(question: str, answer: str) -> bool:
    """Whether `answer` only restates `question`, where the question offers no choice ("... or ...?")
    that an answer would have to repeat and carries no text of its own that an answer would copy
    (`carries_text`): every word of the answer (SQuAD-normalized, a possessive 's dropped) is a word of
    the question, or the answer is a sentence (SENTENCE_WORDS words or more) whose first two words
    beyond FRAME_WORDS are the question's (`_asked_word`), unless the question asks why or how something is.

    >>> restates_question("what is a baby frog called?", "A baby frog")
    True
    >>> restates_question("what is the bank of england's nickname?", "the Bank of England")
    True
    >>> restates_question("what do koalas eat?", "Koalas eat a variety of plants, including leaves.")
    True
    >>> restates_question("what is a baby frog called?", "tadpole")
    False
    >>> restates_question("what is hokusai's print of a giant wave called?", "The Great Wave off Kanagawa")
    False
    >>> restates_question("which is bigger, the sun or the moon?", "the Sun")
    False
    >>> restates_question("The Great Fire of London burned in 1666. " * 6 + "In which year was it?", "1666")
    False
    """
    words = _words(answer)
    if not words or _CHOICE.search(question) or carries_text(question):
        return False
    asked = _words(question)
    if all(word in asked for word in words):
        return True
    if len(words) < SENTENCE_WORDS or _EXPLAINING.match(question):
        return False
    leading = [word for word in words if word not in FRAME_WORDS][:2]
    return len(leading) == 2 and all(_asked_word(word, asked) for word in leading)


def _words(text: str) -> list[str]:
    return normalize_answer(_POSSESSIVE.sub("", text)).split()


def _asked_word(word: str, asked: list[str]) -> bool:
    """Whether `word` is one of the `asked` words in another form: a plural (`same_word`) or a longer ending of
    one stem of four letters or more ("discovered" for "discover")."""
    return any(same_word(word, said) or (min(len(word), len(said)) >= 4 and (word.startswith(said) or said.startswith(word)))
               for said in asked)


def carries_text(question: str) -> bool:
    """Whether a question brings a text of its own before it: more than QUESTION_WITH_TEXT_WORDS words, or two
    sentences.

    >>> carries_text("Jumping spiders are in the family Salticidae. What family are jumping spiders in?")
    True
    >>> carries_text("in which city was president John F. Kennedy assassinated?"), carries_text("what is 2.5 times 2?")
    (False, False)
    """
    return len(question.split()) > QUESTION_WITH_TEXT_WORDS or bool(sentence_ends(question.split()))


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


def first_standing(texts: list[str], restates: Callable[[str], bool]) -> int:
    """The index of the first of `texts` (candidate answers, best first) that a reader can take: it has words and
    does not restate the question. An answer without words is never right where another candidate has some; 0 where
    none stands (the best candidate then stays, as the model chose).

    >>> first_standing(["", "a baby frog", "tadpole"], lambda text: text == "a baby frog")
    2
    >>> first_standing(["", " "], lambda text: False)
    0
    """
    return next((i for i, text in enumerate(texts) if text.strip() and not restates(text)), 0)


def set_aside_restatements(decode: Callable[[frozenset[int]], Hypothesis], restates: Callable[[str], bool],
                           generator: Generator) -> tuple[Hypothesis, tuple[str, ...]]:
    """`decode(barred_first)`'s answer, decoded again while `restates(its text)`, each time with one more opening
    barred (`opening_forms`: a first word in all its spellings), `RESTATEMENT_RETRIES` times at most.

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
        forms = opening_forms(hyp.ids, generator)
        if not forms:
            break
        barred = barred | forms
    return first, ()


def opening_forms(ids: tuple[int, ...], generator: Generator) -> frozenset[int]:
    """What to bar so that an answer of these token ids cannot open the same way again: its first word's every single-
    token spelling (`Generator.first_word_forms`) where its first token is a whole word; where it is a piece of a longer
    word (" al" of "algeria", its next token going on with letters), that token alone, since the piece's other
    spellings begin other words (" Al" of "Algiers", the answer then left to find). () for an answer without words."""
    words = [t for t in ids if t not in generator.special_ids]
    if not words:
        return frozenset()
    if len(words) > 1 and generator.token_text(words[1])[:1].isalnum():
        return frozenset({words[0]})
    return generator.first_word_forms(words[0])

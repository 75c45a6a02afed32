"""Where an answer's words are found: `VariantResult.found_in` from the engine, and the line each answer card
shows from it (a passage, the generator's memory, or nothing shown). The ranks are checked against a
whole-word search written here; the card's sentences against hand-made results.
"""

from __future__ import annotations

import itertools
import json

import pytest

from rag_demo.questions import FRAME_WORDS
from rag_demo.results import AskResult, ClosedBookResult, RetrievedPassage, VariantResult
from rag_demo.ui.actions import DemoActions, unwrap
from rag_demo.terminal import evidence_line
from rag_demo.ui.html import esc, format_answer_html, format_score_html
from rag_demo.ui.sentences import evidence, knowledge_conflicts
from tests.ui_engine import KB_NAMES, QUESTIONS

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARTICLES = {"a", "an", "the"}


def words(text: str) -> list[str]:
    """Lower-case words with punctuation removed inside them ("Champ-de-Mars" -> "champdemars"), articles dropped."""
    kept = "".join(ch for ch in text.lower() if ch.isalnum() or ch.isspace() or ch == "\u00a0")
    return [w for w in kept.split() if w not in ARTICLES]


SMALL_NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
                 "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]
TENS = {"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}
NUMBER = {**{word: str(n) for n, word in enumerate(SMALL_NUMBERS)}, **{word: str(n) for word, n in TENS.items()}}


def forms(word: str) -> set[str]:
    """The word, its regular plurals, the singulars it may be the plural of (each side 3+ letters), and a number
    up to twenty or a ten in digits and in words."""
    found = {word} | {number for number, digits in NUMBER.items() if word in (number, digits)}
    found |= {NUMBER[w] for w in found if w in NUMBER}
    if len(word) >= 3:
        found |= {word + "s", word + "es"} | ({word[:-1] + "ies"} if word.endswith("y") else set())
    for ending, back in (("ies", "y"), ("es", ""), ("s", "")):
        if word.endswith(ending) and len(word) - len(ending) + len(back) >= 3:
            found.add(word[: len(word) - len(ending)] + back)
    return found


def holds(passage: RetrievedPassage, answer: str, question: str = "") -> bool:
    """The answer's words in order; failing that, the one run of words it adds to the question and the frame."""
    hay = words(f"{passage.title} {passage.text}")

    def said(needle: list[str]) -> bool:
        return bool(needle) and any(all(h in forms(n) for n, h in zip(needle, hay[i:i + len(needle)]))
                                    for i in range(len(hay) - len(needle) + 1))

    asked = set().union(*map(forms, words(question)))
    runs = [list(run) for new, run in itertools.groupby(words(answer), lambda w: w not in FRAME_WORDS and w not in asked)
            if new]
    surname = words(answer)[1:] if words(answer)[:1] and words(answer)[0] in TITLES else []
    new_words = [w for run in runs for w in run]
    around_a_number = (0 < len(new_words) <= 4 and any(len(w) > 2 and any(c.isdigit() for c in w) for w in new_words)
                       and all(forms(w) & set(hay) for w in new_words))
    framing = [w in FRAME_WORDS or w in asked for w in words(answer)]
    inner = [w for w, frame, i in zip(words(answer), framing, range(len(framing)))
             if any(not f for f in framing[:i + 1]) and any(not f for f in framing[i:])]
    restated_subject = len(runs) > 1 and said(inner)
    return (said(words(answer)) or said(surname) or (len(runs) == 1 and said(runs[0])) or around_a_number
            or restated_subject)


TITLES = {"mr", "mrs", "ms", "miss", "dr", "prof", "professor", "captain", "capt", "rev"}


def test_the_oracle_takes_a_plural_for_a_singular_and_nothing_looser():
    passage = RetrievedPassage(1, 0, "LAN", "Local area networks link the computers of one building.", 0.5, 1.0, 10.0)
    assert holds(passage, "Local Area Network") and holds(passage, "computer") and not holds(passage, "buildings link")
    assert not holds(passage, "net")
    legs = RetrievedPassage(1, 0, "Spider", "Spiders have eight limbs and 40 eyes, or about forty.", 0.5, 1.0, 10.0)
    assert holds(legs, "8") and holds(legs, "eight") and holds(legs, "forty") and holds(legs, "40 eyes")
    assert not holds(legs, "18") and not holds(legs, "4")
    assert holds(passage, "they join computers", "what do networks join?") and not holds(passage, "they join computers")


@pytest.mark.parametrize("answer", ["Mr. Greenhalgh", "Mr Tobias Greenhalgh", "Dr. Watson", "Mrs. Watson", "Mr.",
                                    "St. Louis", "Lady Greenhalgh", "Greenhalgh Watson"])
def test_a_name_is_found_where_a_passage_puts_a_first_name_after_its_title(answer):
    from rag_demo.questions import passages_holding

    cat = RetrievedPassage(1, 0, "Observatory", "Mr. Tobias Greenhalgh feeds the cat; Dr John Watson and Louis XIV "
                           "do not.", 0.5, 1.0, 10.0)
    assert passages_holding(answer, [cat]) == ((1,) if holds(cat, answer) else ())
    assert holds(cat, answer) == (answer not in ("St. Louis", "Lady Greenhalgh", "Greenhalgh Watson"))


@pytest.mark.parametrize("answer", ["8", "eight", "8 limbs", "forty", "40", "18", "4", "eight legs", "they have 8"])
def test_a_number_is_found_written_in_digits_or_words(answer):
    from rag_demo.questions import passages_holding

    legs = RetrievedPassage(1, 0, "Spider", "Spiders have eight limbs and 40 eyes, or about forty.", 0.5, 1.0, 10.0)
    question = "how many legs does a spider have?"
    assert passages_holding(answer, [legs], question=question) == ((1,) if holds(legs, answer, question) else ())


@pytest.mark.parametrize("answer", ["DNA is a polymer of two chains that coil around each other.",
                                    "It is a polymer of two chains", "DNA is a polymer of two chains that coil in DNA",
                                    "DNA is a polymer that coils", "a polymer of chains", "DNA is a chain of two polymers."])
def test_a_sentence_that_restates_the_subject_is_found_by_what_it_adds(answer):
    from rag_demo.questions import passages_holding

    dna = RetrievedPassage(1, 0, "DNA", "Deoxyribonucleic acid is a polymer of two chains that coil around each "
                           "other to form a double helix.", 0.5, 1.0, 10.0)
    question = "what is DNA?"
    found = answer in ("DNA is a polymer of two chains that coil around each other.", "It is a polymer of two chains",
                       "DNA is a polymer of two chains that coil in DNA")
    assert holds(dna, answer, question) == found
    assert passages_holding(answer, [dna], question=question) == ((1,) if found else ())


@pytest.mark.parametrize("answer", ["c = 299792458", "c = 299792458 metres", "299,792,458", "c = 186282 miles",
                                    "c = 3 metres", "the light is 299792458 metres per second fast", "about 300000 km",
                                    "vacuum 299792458 c metres", "299792458 furlongs"])
def test_a_short_answer_around_a_number_is_found_however_it_phrases_what_lies_between(answer):
    from rag_demo.questions import passages_holding

    light = RetrievedPassage(1, 0, "Speed of light", "The speed of light in vacuum, commonly denoted c, is exactly equal "
                             "to 299792458 metres per second.", 0.5, 1.0, 10.0)
    question = "what is the speed of light?"
    found = answer in ("c = 299792458", "c = 299792458 metres", "299,792,458", "vacuum 299792458 c metres")
    assert holds(light, answer, question) == found
    assert passages_holding(answer, [light], question=question) == ((1,) if found else ())


@pytest.mark.parametrize("answer", ["Paris", "the river Seine", "Seine, France", "Berlin", "Jupiter", "metres tall",
                                    "metre tall", "8849 metre", "Seines", "The capital of France is Paris.",
                                    "it is Lyon", "Seine in France", "Paris is on the Seine in France", "1", "one",
                                    "2 rivers", "two"])
def test_a_scored_answer_is_found_in_the_passages_that_hold_its_words(ui_engine, answer):
    result = ui_engine.score(QUESTIONS[0], answer, kb=KB_NAMES[0], k=4)
    expected = tuple(p.rank for p in result.passages if holds(p, answer, result.question))
    for variant in result.variants.values():
        assert variant.found_in == expected
    if answer == "Berlin":
        assert expected == ()


def test_generated_answers_carry_where_their_words_are(ui_engine):
    from rag_demo.config import VARIANT_NAMES

    cut_any = False
    for question in QUESTIONS[:4]:
        result = ui_engine.ask(question, kb=KB_NAMES[0], k=4)
        limit = " ".join(notice for notice in result.notices if "length limit" in notice)
        for name, variant in result.variants.items():
            # an answer cut short by the length limit may end in a word's start: it is looked for without it too
            cut = VARIANT_NAMES[name] in limit
            cut_any |= cut
            shorter = " ".join(variant.answer.split()[:-1]) if cut and len(variant.answer.split()) > 1 else variant.answer
            assert variant.found_in == tuple(p.rank for p in result.passages if holds(p, variant.answer, result.question)
                                             or holds(p, shorter, result.question))
        assert "found_in" in json.dumps(result.to_json())
    assert cut_any  # the tiny generator's answers run to the limit: the cut case is exercised


def _result(answer: str, texts: list[str], closed: str | None, memory: tuple[float, ...] = (), question: str = "q") -> AskResult:
    passages = tuple(RetrievedPassage(i + 1, i, f"title {i}", text, 0.5, 1 / len(texts), 10.0) for i, text in enumerate(texts))
    found = tuple(p.rank for p in passages if holds(p, answer))
    variant = VariantResult("token", answer, (answer,), (1,), -1.0, (-1.0,), ((-1.0,) * len(texts),),
                            ((0.2,) * len(texts),), (-0.5,), memory_posteriors=memory, found_in=found)
    closed_book = None if closed is None else ClosedBookResult(closed, (closed,), (-0.5,), -0.5)
    return AskResult(question, "kb", "flat", len(texts), passages, {"token": variant}, closed_book, {})


@pytest.mark.parametrize("answer, texts, closed, memory, kind, sentence", [
    ("Paris", ["Paris is big.", "Lyon.", "Paris again."], "Rome", (), "passages", "Its words are in passages #1 and #3; read them to see whether they answer the question."),
    ("Lyon", ["Paris.", "Lyon."], None, (), "passages", "Its words are in passage #2; read it to see whether it answers the question."),
    ("Rome", ["Paris.", "Lyon."], "Rome", (), "memory",
     "In none of the 2 passages read: from the generator's memory (the closed-book answer)."),
    # mostly memory's, mixed with the passages into another answer than memory's own: neither source states it
    ("Rome", ["Paris.", "Lyon."], "Milan", (0.7,), "memory",
     "In none of the 2 passages read, and memory alone answers otherwise (“Milan”): ∅ memory carries most of its "
     "posterior (0.70), mixed token by token with the passages, so neither source states it; treat it as a guess."),
    ("Rome", ["Paris.", "Lyon."], None, (0.7,), "memory", "mostly from the generator's memory (∅ memory's posterior is 0.70)."),
    # memory's own answer, written while the passages carried the posterior: said so, not left to contradict p(∅)
    ("Rome", ["Paris.", "Lyon."], "Rome", (0.01,), "memory",
     "but it is the closed-book answer: the generator alone says the same, and wrote it here while the passages carried "
     "its posterior (∅ memory's share 0.01)."),
    # near a half, ∅ leads as many tokens as the passages do: memory's, said plainly
    ("Rome", ["Paris.", "Lyon."], "Rome", (0.5,), "memory", "In none of the 2 passages read: from the generator's memory (the closed-book answer)."),
    ("Rome", ["Paris.", "Lyon."], "Rome", (0.001,), "memory", "(∅ memory's share under 0.01)."),
    # a sentence is looked for as one run of words, which a paraphrase never is: not called a guess
    ("the sky looks blue because air scatters blue light", ["Rayleigh.", "Air."], "blue", (0.1,), "none",
     "Its words are not together in any of the 2 passages read, and it is not the closed-book answer: a sentence may"),
    ("Rome", ["Paris.", "Lyon."], "Rome", (0.9,), "memory", "from the generator's memory (the closed-book answer)."),
    ("Rome", ["Paris.", "Lyon."], "Milan", (0.3,), "none", "In none of the 2 passages read, nor the closed-book answer: nothing here"),
    ("Rome", ["Paris."], None, (), "none", "Not in the passage read: nothing here backs it"),
    ("", ["Paris."], "Rome", (), "", ""),
])
def test_each_answer_says_where_its_words_are(answer, texts, closed, memory, kind, sentence):
    result = _result(answer, texts, closed, memory)
    got_kind, said = evidence(result, result.variants["token"])
    assert got_kind == kind and sentence in said
    if kind:
        assert f'rag-evidence-{kind}' in format_answer_html(result)
    # `ask` on the command line prints the card's sentence under the answer
    assert evidence_line(result, result.variants["token"]) == (f"    {said}\n" if said else "")


PASTED = ("The Great Fire of London started in a bakery on Pudding Lane shortly after midnight on Sunday "
          "2 September 1666. Where did the Great Fire of London start?")


@pytest.mark.parametrize("answer, texts, closed, memory, question, kind, sentence", [
    # copied from a text pasted before the question: there, not in memory, even where memory says it too
    ("Pudding Lane", ["Paris.", "Lyon."], "Pudding Lane", (0.0,), PASTED, "question",
     "In none of the 2 passages read, but its words are in the question itself, which the generator reads too."),
    ("the Sun", ["Paris."], None, (), "which is bigger, the sun or the moon?", "question", "its words are in the question"),
    ("Pudding Lane", ["It began on Pudding Lane."], None, (), PASTED, "passages", "Its words are in passage #1; read it to see whether it answers the question."),
    ("Thames Street", ["Paris."], "Thames Street", (), PASTED, "memory", "from the generator's memory"),
])
def test_an_answer_whose_words_are_in_the_question_says_so(answer, texts, closed, memory, question, kind, sentence):
    result = _result(answer, texts, closed, memory, question)
    got_kind, said = evidence(result, result.variants["token"])
    assert got_kind == kind and sentence in said
    # memory gave it too, but the question holds it: no knowledge conflict to report
    assert bool(knowledge_conflicts(result)) == (kind == "memory")
    if kind:
        assert f'rag-evidence-{kind}' in format_answer_html(result)


def test_a_visitors_own_answer_is_only_placed_in_the_passages_or_not(ui_engine):
    result = ui_engine.score(QUESTIONS[0], "Berlin", kb=KB_NAMES[0], k=3)
    kind, said = evidence(result, result.variants["token"], generated=False)
    assert (kind, said) == ("none", "In none of the 3 passages read.")
    cards = format_score_html(result)
    assert "In none of the 3 passages read." in cards and "guess" not in cards and "memory (" not in cards
    # a sentence of the visitor's own is read as the page reads a generated one: not finding it word for word says little
    sentence = "Berlin has been the capital city of the country since the year of its reunification"
    result = ui_engine.score(QUESTIONS[0], sentence, kb=KB_NAMES[0], k=3)
    kind, said = evidence(result, result.variants["token"], generated=False)
    assert kind == "none" and said.startswith("Its words are not together in any of the 3 passages read:")
    assert "closed-book" not in said


def test_passage_text_in_the_evidence_line_is_escaped():
    result = _result("<b>x</b>", ["a <b>x</b> here"], None)
    html = format_answer_html(result)
    assert "Its words are in passage #1;" in html and "<b>x</b>" not in html


def test_the_ask_tab_shows_the_line_on_every_answer_card(ui_engine):
    out = DemoActions(ui_engine).ask(QUESTIONS[0], "both", 3, "flat", KB_NAMES[0], 1, "thorough", None, None, False, False)
    result = unwrap(out.last)
    for variant in result.variants.values():
        kind, said = evidence(result, variant)
        assert not variant.answer.strip() or (kind and esc(said) in out.answer)


def test_an_explanation_is_found_by_the_words_it_adds_after_because():
    from rag_demo.questions import holds_answer

    blue = RetrievedPassage(1, 0, "Blue", "The sky looks blue because of an effect known as Rayleigh scattering.", 0.5, 1.0, 10.0)
    answer, question = "The sky is blue because of Rayleigh scattering.", "why is the sky blue?"
    assert holds(blue, answer, question) and holds_answer(f"{blue.title} {blue.text}", answer, question)
    assert not holds_answer("Blue is a colour.", answer, question)

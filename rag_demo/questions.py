"""The default KBs' questions: their records, and the split into training and held-out questions.

A held-out question must be unseen: no question trained on may be a rewording of it. NQ holds
many near-duplicates ("who plays the queen in star wars episode 1?" and "who plays the queen in
episode 1 star wars?"), and they do not always share a gold passage. So questions are linked
when they share a gold passage, or share a normalized answer and at least half their question
words (Jaccard ≥ `NEAR_DUPLICATE_JACCARD`), and every connected group of linked questions falls
on one side of the split. Groups are held out in the order of a hash of their text until about
one question in `HELD_OUT_ONE_IN` is; the order depends on the questions only, so the same
question falls on the same side in nq-wiki and nq-counterfactual.

Importing this module loads nothing heavy; nothing here reads a model.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import string
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .errors import InputError, KnowledgeBaseError
from .text import clean_text, jsonl_objects, looks_like_path

QUESTIONS_FILE = "questions.jsonl"
HELD_OUT_ONE_IN = 5  # about one question in five is held out of training: those are the evaluation's
NEAR_DUPLICATE_JACCARD = 0.5  # same answer and at least this share of question words: the same question
SPLIT_VERSION = f"groups:jaccard{NEAR_DUPLICATE_JACCARD}:one-in{HELD_OUT_ONE_IN}"  # in the fine-tuned models' cache keys

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_WORD = re.compile(r"\w+")


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower case, drop punctuation and articles, squeeze spaces.

    >>> normalize_answer("The  Eiffel-Tower!")
    'eiffeltower'
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def question_words(question: str) -> frozenset[str]:
    """The lower-cased words of a question, as a set.

    >>> sorted(question_words("Who plays the Queen in episode 1?"))
    ['1', 'episode', 'in', 'plays', 'queen', 'the', 'who']
    """
    return frozenset(_WORD.findall(question.lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b| (0 for two empty sets).

    >>> jaccard(frozenset("ab"), frozenset("bc"))
    0.3333333333333333
    """
    union = len(a | b)
    return len(a & b) / union if union else 0.0


@dataclass(frozen=True)
class KBQuestion:
    """A question of a default KB, as stored in its questions.jsonl."""

    question: str
    answer: str  # real world
    swapped_answer: str
    passage_answer: str  # what this KB's gold passage says
    gold_id: int  # row of the gold passage in this KB
    example: bool = False  # offered in the UI as an example question


@dataclass(frozen=True)
class EvalQuestion:
    question: str
    answer: str  # what the KB's gold passage says
    original_answer: str  # the real-world answer (differs on the counterfactual KB)
    gold_id: int | None  # row of the gold passage in the KB; None for a question set's (no passage labels)
    aliases: tuple[str, ...] = ()  # every answer that counts as right, `answer` first; () means `answer` alone
    original_aliases: tuple[str, ...] = ()  # the same for `original_answer`

    @property
    def answers(self) -> tuple[str, ...]:
        return self.aliases or (self.answer,)

    @property
    def original_answers(self) -> tuple[str, ...]:
        return self.original_aliases or (self.original_answer,)


@dataclass(frozen=True)
class QuestionSplit:
    training: tuple[KBQuestion, ...]  # may be trained on: no example question and no near-duplicate of a held-out one
    held_out: tuple[KBQuestion, ...]  # never trained on; the only questions `eval` asks


def load_questions(kb_path: str | Path, *, examples_only: bool = False) -> list[KBQuestion]:
    """The questions stored beside a default KB; with `examples_only`, only those the page offers.

    A warm start needs only the examples: skipping the JSON of every other line saves about 0.4 s
    of it (35,000 lines in the two default KBs), and those lines are checked where all are read."""
    path = Path(kb_path) / QUESTIONS_FILE
    if not path.is_file():
        raise KnowledgeBaseError(f"{Path(kb_path)} has no {QUESTIONS_FILE}; only the default KBs come with questions")
    questions = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if examples_only and '"example"' not in line:  # every flagged line holds the key; others with it are dropped below
                continue
            try:
                row = json.loads(line)
                questions.append(KBQuestion(
                    str(row["question"]), str(row["answer"]), str(row["swapped_answer"]), str(row["passage_answer"]),
                    int(row["gold_id"]), bool(row.get("example", False)),
                ))
            except (ValueError, KeyError, TypeError):
                raise KnowledgeBaseError(f"{path} line {number} is malformed; delete {Path(kb_path)} to rebuild it") from None
    return [q for q in questions if q.example] if examples_only else questions


def has_questions(kb_path: str | Path | None) -> bool:
    return kb_path is not None and (Path(kb_path) / QUESTIONS_FILE).is_file()


def example_questions(kb_path: str | Path | None) -> list[KBQuestion]:
    """The example questions the page offers for a default KB; [] for a KB without questions."""
    return load_questions(kb_path, examples_only=True) if has_questions(kb_path) else []


def examples_by_kb(kb_paths: Mapping[str, str | Path | None]) -> dict[str, list[KBQuestion]]:
    """{KB name: its example questions} for the KBs stored with some (the default KBs); the others are left out."""
    found = {name: example_questions(path) for name, path in kb_paths.items()}
    return {name: items for name, items in found.items() if items}


def gold_rows_by_question(kb_path: str | Path | None) -> dict[str, tuple[int, ...]]:
    """{normalized question: rows of its gold passage} for a KB stored with questions (the default KBs);
    {} for any other. Questions are matched after SQuAD normalization (case, punctuation, articles), so
    "Who wrote Hamlet?" finds "who wrote hamlet"; a question asked of several passages keeps them all."""
    if not has_questions(kb_path):
        return {}
    rows: dict[str, tuple[int, ...]] = {}
    for question in load_questions(kb_path):
        key = normalize_answer(question.question)
        if question.gold_id not in rows.get(key, ()):
            rows[key] = rows.get(key, ()) + (question.gold_id,)
    return rows


def question_groups(questions: Sequence[KBQuestion]) -> list[int]:
    """For each question, the id of its group: questions linked by a shared gold passage, or by a
    shared normalized answer with question-word Jaccard ≥ NEAR_DUPLICATE_JACCARD, transitively.

    >>> q = lambda text, answer, gold: KBQuestion(text, answer, "", answer, gold)
    >>> question_groups([q("who wrote it", "Ann", 0), q("who wrote it first", "ann", 1), q("who sang", "Bo", 1),
    ...                  q("when was it", "1990", 2)])
    [0, 0, 0, 3]
    """
    parent = list(range(len(questions)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def link(i: int, j: int) -> None:
        a, b = root(i), root(j)
        if a != b:
            parent[max(a, b)] = min(a, b)

    by_passage: dict[int, list[int]] = defaultdict(list)
    by_answer: dict[str, list[int]] = defaultdict(list)
    for i, q in enumerate(questions):
        by_passage[q.gold_id].append(i)
        answer = normalize_answer(q.answer)
        if answer:
            by_answer[answer].append(i)
    for members in by_passage.values():
        for other in members[1:]:
            link(members[0], other)
    words = [question_words(q.question) for q in questions]
    for members in by_answer.values():
        for a, i in enumerate(members):
            for j in members[a + 1:]:
                if jaccard(words[i], words[j]) >= NEAR_DUPLICATE_JACCARD:
                    link(i, j)
    return [root(i) for i in range(len(questions))]


def _group_order_key(texts: Sequence[str]) -> bytes:
    return hashlib.sha256(("held out? " + min(texts)).encode()).digest()


def split_questions(questions: Sequence[KBQuestion]) -> QuestionSplit:
    """Training and held-out questions, whole groups (`question_groups`) on one side.

    Groups are taken in the order of a hash of their alphabetically first question and held
    out until the held-out side has about len(questions) / HELD_OUT_ONE_IN questions. Groups that
    hold a page example are never trained on (they may still be held out).
    """
    groups: dict[int, list[int]] = defaultdict(list)
    for i, group in enumerate(question_groups(questions)):
        groups[group].append(i)
    order = sorted(groups.values(), key=lambda members: _group_order_key([questions[i].question for i in members]))
    target = len(questions) / HELD_OUT_ONE_IN
    held: set[int] = set()
    for members in order:
        if len(held) + len(members) / 2 > target:  # a group is taken while that brings the count closer to the target
            continue
        held.update(members)
    with_examples = {i for members in groups.values() if any(questions[m].example for m in members) for i in members}
    return QuestionSplit(
        training=tuple(q for i, q in enumerate(questions) if i not in held and i not in with_examples),
        held_out=tuple(q for i, q in enumerate(questions) if i in held),
    )


@lru_cache(maxsize=8)
def _held_out_of(path: str, size: int, modified: int) -> tuple[KBQuestion, ...]:
    return split_questions(load_questions(path)).held_out


def held_out_questions(kb_path: str | Path) -> tuple[KBQuestion, ...]:
    """The held-out questions of a default KB (computed once per questions file)."""
    stat = (Path(kb_path) / QUESTIONS_FILE).stat()
    return _held_out_of(str(Path(kb_path)), stat.st_size, stat.st_mtime_ns)


def load_eval_questions(kb_path: str | Path | None) -> list[EvalQuestion]:
    """The held-out questions of a default KB as `EvalQuestion`s; [] for a KB without questions (a user's own).

    Only questions never used to fine-tune the question encoder or the reader are evaluated.
    """
    if not has_questions(kb_path):
        return []
    # A question whose answer the kept swap cut into has no clear answer in that KB: not scored.
    return [EvalQuestion(q.question, q.passage_answer, q.answer, q.gold_id) for q in held_out_questions(kb_path)
            if q.passage_answer]


# -- question sets of our own: everyday questions with answer aliases, checked into the repository ----------

QUESTION_SETS_DIR = Path(__file__).parent / "data"
QUESTION_SETS = {
    "everyday": "everyday-test.jsonl",  # evaluation only: nothing is tuned or picked on it
    "everyday-train": "everyday-train.jsonl",  # fitting, training and the page's example questions
}


@dataclass(frozen=True)
class SetQuestion:
    """A question of a question set: every answer that counts as right, the canonical one first."""

    question: str
    answers: tuple[str, ...]
    topic: str = ""


def question_set_path(name: str | Path) -> Path:
    """A question set by name ("everyday", "everyday-train") or a path to a JSONL file."""
    if str(name) in QUESTION_SETS:
        return QUESTION_SETS_DIR / QUESTION_SETS[str(name)]
    path = Path(name).expanduser()
    if not path.is_file():
        missing = "the file does not exist; " if looks_like_path(str(name)) and not path.exists() else ""
        raise KnowledgeBaseError(f"no question set {str(name)!r}: {missing}give one of {', '.join(QUESTION_SETS)} or a JSONL file "
                                 'with {"question": ..., "answers": [...]} per line')
    return path


def answer_in_text(text: str, answers: Sequence[str]) -> str:
    """The first of `answers` that the text holds as whole words after SQuAD normalization; "" for none.

    >>> answer_in_text("Paris is the capital of France.", ["City of Light", "Paris"])
    'Paris'
    >>> answer_in_text("Parisian cafes", ["Paris"])
    ''
    """
    normalized = f" {normalize_answer(text)} "
    return next((a for a in answers if normalize_answer(a) and f" {normalize_answer(a)} " in normalized), "")


def contains_answer(prediction: str, gold: str) -> bool:
    """The gold answer appears inside the output as whole words (after normalization)."""
    gold_norm = normalize_answer(gold)
    return bool(gold_norm) and f" {gold_norm} " in f" {normalize_answer(prediction)} "


# A small number is written either way ("8", "eight"); answers to "how many" questions are mostly such numbers
NUMBER_WORDS = {word: str(value) for value, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
NUMBER_WORDS.update({word: str(10 * tens) for tens, word in enumerate(
    "thirty forty fifty sixty seventy eighty ninety".split(), start=3)})


def same_word(first: str, second: str) -> bool:
    """Whether two normalized words are one word: the same, one the other's regular plural (+s, +es, y -> ies),
    or a number in digits and in words up to twenty and the tens ("8" and "eight"). Words under three letters
    must match exactly ("i" is not "is").

    >>> same_word("network", "networks"), same_word("cities", "city"), same_word("box", "boxes")
    (True, True, True)
    >>> same_word("8", "eight"), same_word("forty", "40"), same_word("eight", "18")
    (True, True, False)
    >>> same_word("i", "is"), same_word("cat", "cab")
    (False, False)
    """
    if first == second or NUMBER_WORDS.get(first, first) == NUMBER_WORDS.get(second, second):
        return True
    short, long = sorted((first, second), key=len)
    if len(short) < 3:
        return False
    return long in (short + "s", short + "es") or (short.endswith("y") and long == short[:-1] + "ies")


def holds_words(text: str, answer: str) -> bool:
    """Whether `text` holds `answer`'s words in order after SQuAD normalization, each word as written, in its
    regular plural or singular, or a small number in digits for words (`same_word`): "Local Area Network" is in
    "local area networks (LAN)", "8" in "eight limbs".

    >>> holds_words("Local area networks (LAN) link computers.", "Local Area Network"), holds_words("eight limbs", "8")
    (True, True)
    >>> holds_words("Parisian cafes", "Paris"), holds_words("anything", "the")
    (False, False)
    """
    needle, hay = normalize_answer(answer).split(), normalize_answer(text).split()
    return bool(needle) and any(all(same_word(a, b) for a, b in zip(needle, hay[start:start + len(needle)]))
                                for start in range(len(hay) - len(needle) + 1))


# Words an answer written as a sentence wraps its span in ("he eats sardines"): pronouns, the forms of be, have
# and do, prepositions and conjunctions. normalize_answer drops the articles already.
FRAME_WORDS = frozenset(
    "i you he she it we they me him her us them his its our your their is are was were be been being has have had "
    "do does did of in on at to for by with from into and or but as because that this these those which who whom".split())


def new_word_runs(answer: str, question: str) -> list[str]:
    """The runs of `answer`'s words (SQuAD-normalized) that the question does not say (a plural for a singular)
    and FRAME_WORDS does not hold, in order: what the answer adds to the question.

    >>> new_word_runs("He eats sardines.", "What does Tom eat?")
    ['sardines']
    >>> new_word_runs("The oboe belongs to the woodwind family.", "Which family of instruments does the oboe belong to?")
    ['woodwind']
    >>> new_word_runs("The sky is blue because of Rayleigh scattering.", "Why is the sky blue?")
    ['rayleigh scattering']
    >>> new_word_runs("John Adams", "who wrote the declaration?"), new_word_runs("the baby frog", "what is a baby frog called?")
    (['john adams'], [])
    """
    asked = normalize_answer(question).split()
    runs: list[list[str]] = [[]]
    for word in normalize_answer(answer).split():
        if word in FRAME_WORDS or any(same_word(word, said) for said in asked):
            runs.append([])
        else:
            runs[-1].append(word)
    return [" ".join(run) for run in runs if run]


# Words a name may open with that a text may keep apart from the surname: "Mr. Greenhalgh" is the man a passage
# calls "Mr. Tobias Greenhalgh", "Dr. Watson" the one it calls "Dr. John Watson". Not "St" or "Lady": they open
# names of their own ("St. Louis", "Lady Gaga"), whose last word alone names something else.
HONORIFICS = frozenset("mr mrs ms miss dr prof professor captain capt rev".split())


def without_honorific(answer: str) -> str:
    """`answer` without the honorific it opens with, when a word follows it; otherwise unchanged.

    >>> without_honorific("Mr. Greenhalgh"), without_honorific("Dr"), without_honorific("St. Louis")
    ('Greenhalgh', 'Dr', 'St. Louis')
    """
    words = answer.split()
    if len(words) > 1 and normalize_answer(words[0]) in HONORIFICS:
        return " ".join(words[1:])
    return answer


def holds_answer(text: str, answer: str, question: str = "") -> bool:
    """Whether `text` says `answer` in its words: holds them all (`holds_words`), or all but an honorific it
    opens with (`without_honorific`), or, for an answer that wraps one run of new words in the question's own and
    FRAME_WORDS ("he eats sardines" for "what does tom eat?"), holds that run (`new_word_runs`). Words scattered
    through a longer sentence are not looked for one by one:
    "the sum of the letters in the numeral 50" is not said by a passage that has "sum" and "letters" somewhere.

    >>> holds_answer("Tom is a cat. His favourite food is sardines.", "he eats sardines", "what does tom eat?")
    True
    >>> holds_answer("Tom is a cat.", "he eats sardines", "what does tom eat?"), holds_answer("Tom eats.", "Tom", "who eats?")
    (False, True)
    >>> holds_answer("The sum of all letters.", "the sum of the letters in the numeral 50", "what is 50 in roman numerals?")
    False
    >>> holds_answer("Mr. Tobias Greenhalgh keeps the cat.", "Mr. Greenhalgh")
    True
    """
    if holds_words(text, answer) or holds_words(text, without_honorific(answer)):
        return True
    runs = new_word_runs(answer, question)
    return len(runs) == 1 and holds_words(text, runs[0])


def without_last_word(answer: str) -> str:
    """`answer` without its last word, for an answer cut short by the length limit, whose last word may be only a
    word's start ("a vegetarian le"); an answer of one word is kept.

    >>> without_last_word("fish pie, then a vegetarian le"), without_last_word("Paris")
    ('fish pie, then a vegetarian', 'Paris')
    """
    words = answer.split()
    return " ".join(words[:-1]) if len(words) > 1 else answer


def passages_holding(answer: str, passages: Sequence, *, question: str = "") -> tuple[int, ...]:
    """The ranks of `passages` (each with `rank`, `title` and `text`) whose title or text says `answer` in its
    words (`holds_answer`: whole words after SQuAD normalization, a plural for a singular; for an answer
    written as a sentence around the question's words, its one run of new words): where the evidence for an
    answer lies. A mention is not proof (the words may name something else); no mention means the passages do
    not say it in these words.

    >>> from types import SimpleNamespace as P
    >>> passages_holding("the Nile", [P(rank=1, title="Amazon", text="A river."), P(rank=2, title="Egypt", text="The Nile flows.")])
    (2,)
    >>> passages_holding("Nile", [P(rank=1, title="Nile", text="")]), passages_holding("the", [P(rank=1, title="", text="the")])
    ((1,), ())
    """
    return tuple(p.rank for p in passages if holds_answer(f"{p.title} {p.text}", answer, question))


@lru_cache(maxsize=8)
def load_question_set(name: str | Path) -> tuple[SetQuestion, ...]:
    """The questions of a set, in file order; a malformed line is an InputError that names it."""
    path = question_set_path(name)
    shape = '{"question": ..., "answers": [...]}'
    questions = []
    for number, row in jsonl_objects(path, shape=shape):
        answers = row.get("answers")
        if not isinstance(answers, list) or not str(row.get("question") or "").strip():
            raise InputError(f"{path.name} line {number} needs {shape}")
        answers = tuple(str(a).strip() for a in answers if str(a).strip())
        if not answers:
            raise InputError(f"{path.name} line {number} gives no answer; each line needs {shape}")
        questions.append(SetQuestion(str(row["question"]).strip(), answers, str(row.get("topic", ""))))
    if not questions:
        raise InputError(f"{path} holds no questions")
    return tuple(questions)


def set_eval_questions(name: str | Path) -> list[EvalQuestion]:
    """A question set's questions for `eval`: any of their answers counts, and retrieval counts as a hit
    when a retrieved passage holds one of them (there are no gold passages)."""
    return [EvalQuestion(q.question, q.answers[0], q.answers[0], None, q.answers, q.answers) for q in load_question_set(name)]


# Words nearly every English question holds, and those of the languages visitors most often try instead.
# A word both languages use ("a", "was", "die", "hat", "in") is in neither list: it tells nothing.
ENGLISH_WORDS = frozenset(
    "the of and to is are was were who whom whose what which when where why how did does do has have had "
    "by for on with from at as that this these those it its his her their first many much an or name "
    "wrote invented painted discovered won built called largest capital".split())
OTHER_WORDS = frozenset(
    "le la les un une des du de et est qui que quel quelle où qu dans sur pour avec par au aux "  # French
    "der das den dem ein eine einer und ist wer wie wo welche welcher hat von mit auf für "  # German
    "el los las una es quién quien qué cuál cuándo dónde del por para con y fue "  # Spanish
    "il lo gli di che chi è nel della dello sono "  # Italian
    "het een wie wat waar van zijn werd "  # Dutch
    "o os uma um quem onde do da dos das foi "  # Portuguese
    .split()) - ENGLISH_WORDS
NOT_ENGLISH_LETTERS = 0.25  # a question whose letters are this share non-ASCII or more is no English one
LANGUAGE_NOTE = ("This question does not look English. The default models read English: an answer to another "
                 "language is often confidently wrong. Try it in English.")


def looks_english(question: str) -> bool:
    """A cheap guess whether a question is English: its letters mostly ASCII, and its function words English
    rather than French, German, Spanish, Italian, Dutch or Portuguese. Unsure (a name, a few words): True.

    >>> looks_english("who painted the mona lisa?"), looks_english("qui a peint la Joconde ?")
    (True, False)
    >>> looks_english("Wer hat die Mona Lisa gemalt?"), looks_english("誰がモナリザを描いたのか"), looks_english("who sang la vie en rose?")
    (False, False, True)
    >>> looks_english("¿Quién escribió Don Quijote?")
    False
    """
    if "¿" in question or "¡" in question:  # Spanish opens its questions and exclamations with these
        return False
    letters = [ch for ch in question if ch.isalpha()]
    if not letters:
        return True
    if sum(not ch.isascii() for ch in letters) / len(letters) >= NOT_ENGLISH_LETTERS:
        return False
    words = set(re.findall(r"[^\W\d_]+", question.lower()))
    english, other = len(words & ENGLISH_WORDS), len(words & OTHER_WORDS)
    return not (other >= 2 and other > 2 * english)


# Questions whose answer is in no encyclopedia: about the one asking ("what did I eat?", "where are my keys?") or
# about the present day. "I" and "my" count only after a word that makes them the asker's own past or state ("did
# I", "am I", "is my"), since titles and quotations hold them too ("who directed my neighbor totoro?", "world war
# i"), and advice is asked with them of anyone ("how long should I boil an egg?", "how do I tie a tie?"); nor does
# the impersonal "you" ("what do you call ...") ask anything of anyone.
_ABOUT_THE_ASKER = re.compile(
    r"\b(?:am|did|have|had|was|were)\s+i\b"
    r"|\b(?:is|are|was|were|do|does|did|of|for|in|at|to|from|with)\s+my\b|\bmyself\b", re.IGNORECASE)
_ABOUT_NOW = re.compile(
    r"\b(?:today|tonight|tomorrow|yesterday|right now|nowadays|currently|at the moment|this (?:week|weekend|month|year)"
    r"|the latest|the current(?!\s+(?:in|of|through|flowing|flows|that|which|is|was|and|at)\b))\b", re.IGNORECASE)
ABOUT_THE_ASKER_NOTE = ("This question asks about you: no passage here can know that, and neither can the generator. "
                        "The answers say what the passages and the generator make likely, not anything about you.")
ABOUT_NOW_NOTE = ("This question asks about the present: the passages are Wikipedia's text as it stood when it was "
                  "collected, and the generator knows what it read in training. An answer may be out of date.")


# Where the question names a year from here on, few of the base's leads tell it and the generator read little of it;
# the everyday sets, on which the sureness bands were measured, name none after 2016
RECENT_YEARS_FROM = 2020
RECENT_YEAR_NOTE = ("This question is about a recent year: few of the passages tell the events of a single recent year, "
                    "and what the generator read in training may end before it. An answer may be missing or out of date.")
# Asking for writing, not for a fact ("write a poem about cats", "tell me a joke"): a passage holds no answer to it
_REQUEST = re.compile(r"^\s*(?:please\s+)?(?:(?:write|compose|draw|sing|translate|summari[sz]e|generate|create|make up)"
                      r"\s+(?:me|us|a|an|some|another|the|my|this|that|about)|tell\s+(?:me|us)\s+(?:a|an|some|another))\b",
                      re.IGNORECASE)
REQUEST_NOTE = ("This asks for writing rather than a fact: RAG answers questions from passages, and what it writes "
                "here is what the generator makes likely after them.")
# Two questions joined ("who invented the light bulb and when did he die?"): one short answer answers one of them. The
# second asks as a question does, its question word followed by a verb or "many", "long"...; a title joined by "or" or
# "and" seldom does ("twelfth night, or what you will", "dr strangelove or how i learned to stop worrying")
_TWO_QUESTIONS = re.compile(r"\w.*\b(?:and|or)\s+(?:who|whom|whose|when|where|what|which|why|how)\s+"
                            r"(?:is|are|was|were|did|does|do|can|could|will|would|has|have|had|should|many|much|long|old"
                            r"|far|big|tall)\b", re.IGNORECASE)
TWO_QUESTIONS_NOTE = ("This asks two things at once: RAG writes one short answer, which answers one of them at most. "
                      "Ask them one at a time.")
# Questions answered yes or no ("can penguins fly?"): the everyday sets hold none, so their answers get no badge. One
# that asks with a question word further on is trivia that opens with a name ("will smith starred in which film?")
_YES_NO = re.compile(r"^\s*(?:is|are|was|were|am|do|does|did|can|could|will|would|should|shall|has|have|had|may|might"
                     r"|must|isn't|aren't|wasn't|weren't|doesn't|don't|didn't|can't|won't)\b", re.IGNORECASE)
_QUESTION_WORD = re.compile(r"\b(?:who|whom|whose|what|which|when|where|why|how)\b", re.IGNORECASE)
# Asking who or what a thing is by its name alone ("who was cleopatra?", "what is a black hole?"): the answer wanted
# describes it, and a short one names it again ("Cleopatra VII"). The everyday sets hold none: each of theirs asks a
# relation ("who was plato's teacher?", "what is the capital of canada?", "what is tofu made from?")
_WHO_OR_WHAT_IS = re.compile(r"^\s*(?:who|what)\s+(?:is|was|are|were)\s+(?:(?:a|an)\s+)?(?P<name>[^\W\d][^\d?!.]*?)"
                             r"\s*[?!.]*\s*$", re.IGNORECASE)
_NOT_A_NAME = frozenset("the this that these those it he she they there here i you we your my his her their our its "
                        "of in on at for from to by with about called made named known used like now today currently".split())
# "who is president?" asks who holds a role, "who was queen victoria?" who a person was
_ROLES = frozenset({"president", "vice president", "king", "queen", "pope", "prime minister", "chancellor", "mayor",
                    "governor", "ceo", "emperor"})


def asks_what_a_name_is(question: str) -> bool:
    """Whether a question asks who or what something is, by its name of up to five words alone.

    >>> asks_what_a_name_is("who was cleopatra?"), asks_what_a_name_is("What is a black hole?")
    (True, True)
    >>> asks_what_a_name_is("who was queen victoria?"), asks_what_a_name_is("who is president?")
    (True, False)
    >>> asks_what_a_name_is("who was plato's teacher?"), asks_what_a_name_is("what is the capital of canada?")
    (False, False)
    >>> asks_what_a_name_is("what is tofu made from?"), asks_what_a_name_is("what is 7 times 8?")
    (False, False)
    """
    match = _WHO_OR_WHAT_IS.match(question)
    if not match:
        return False
    words = match["name"].lower().split()
    return (len(words) <= 5 and " ".join(words) not in _ROLES and not _NOT_A_NAME.intersection(words)
            and not any("'" in w or "’" in w for w in words))


def names_a_recent_year(question: str, *, this_year: int | None = None) -> bool:
    """Whether a question names a year from RECENT_YEARS_FROM to `this_year` (today's by default). A later number is
    more often a title than a question about the future ("blade runner 2049", "the game 2048").

    >>> names_a_recent_year("who won the 2025 nba finals?", this_year=2026), names_a_recent_year("who won the 2010 world cup?")
    (True, False)
    >>> names_a_recent_year("who directed blade runner 2049?", this_year=2026), names_a_recent_year("what did the 2,025 runners win?")
    (False, False)
    """
    last = this_year or datetime.date.today().year
    return any(RECENT_YEARS_FROM <= int(year) <= last for year in re.findall(r"(?<![\d,.])(20\d\d)(?![\d,])", question))


# (what the no-badge notice calls it, whether a question is of it, the notice it gets or ''): the kinds of question
# no knowledge base here answers as asked, or that the sureness bands were not measured on (`sureness`)
QUESTION_KINDS = (
    ("a question about you", lambda q: bool(_ABOUT_THE_ASKER.search(q)), ABOUT_THE_ASKER_NOTE),
    ("a question about the present", lambda q: bool(_ABOUT_NOW.search(q)), ABOUT_NOW_NOTE),
    ("a question about a recent year", names_a_recent_year, RECENT_YEAR_NOTE),
    ("a request for writing", lambda q: bool(_REQUEST.search(q)), REQUEST_NOTE),
    ("two questions in one", lambda q: bool(_TWO_QUESTIONS.search(q)), TWO_QUESTIONS_NOTE),
    ("a question not in English", lambda q: not looks_english(q), LANGUAGE_NOTE),
    ("a yes/no question", lambda q: bool(_YES_NO.search(q)) and not _QUESTION_WORD.search(q), ""),
    ("a question of who or what something is", asks_what_a_name_is, ""),
)


def unusual_kinds(question: str) -> tuple[str, ...]:
    """The QUESTION_KINDS a question is of, by name; () for a question of fact such as the everyday sets hold.

    >>> unusual_kinds("what did I eat for breakfast?"), unusual_kinds("who is president today?")
    (('a question about you',), ('a question about the present',))
    >>> unusual_kinds("can penguins fly?"), unusual_kinds("write a poem about cats"), unusual_kinds("tell me a joke")
    (('a yes/no question',), ('a request for writing',), ('a request for writing',))
    >>> unusual_kinds("who directed my neighbor totoro?"), unusual_kinds("whose assassination sparked world war i?")
    ((), ())
    >>> unusual_kinds("how long should I boil an egg?"), unusual_kinds("how do I tie a tie?")
    ((), ())
    >>> unusual_kinds("what do you call a baby frog?"), unusual_kinds("what is the SI unit of electric current?")
    ((), ())
    >>> unusual_kinds("what is the current in a circuit measured in?"), unusual_kinds("who is the current pope?")
    ((), ('a question about the present',))
    >>> unusual_kinds("who wrote the book 'is it over'?"), unusual_kinds("who sang tell me why?")
    ((), ())
    >>> unusual_kinds("who invented the light bulb and when did he die?"), unusual_kinds("who wrote who's afraid of virginia woolf?")
    (('two questions in one',), ())
    >>> unusual_kinds("who wrote twelfth night, or what you will?"), unusual_kinds("will smith starred in which film?")
    ((), ())
    >>> unusual_kinds("singer of bohemian rhapsody?"), unusual_kinds("drawbridge is a type of what?")
    ((), ())
    """
    return tuple(name for name, applies, _ in QUESTION_KINDS if applies(question))


def question_notices(question: str) -> tuple[str, ...]:
    """The notices a question's kinds carry (`QUESTION_KINDS`): about the asker, the present, a recent year, a request
    for writing, two questions in one, another language; () for a question of fact."""
    return tuple(note for _, applies, note in QUESTION_KINDS if note and applies(question))


def read_question(question: str) -> tuple[str, tuple[str, ...]]:
    """A question as the engine reads it (`text.clean_text`, its end kept), and the notices a reader should see,
    `question_notices`' among them."""
    question, notices = clean_text(question, what="question", keep_end=True)
    return question, notices + question_notices(question)

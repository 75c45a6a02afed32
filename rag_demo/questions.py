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
from .text import jsonl_objects, looks_like_path

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
    FRAME_WORDS ("he eats sardines" for "what does tom eat?"), holds that run (`new_word_runs`), or, for a short
    answer around a number, holds its new words anywhere (`holds_number_among_words`), or, for a sentence that
    restates the question's subject before what it adds, holds the rest in order (`without_question_frame`).
    Other words scattered through a longer sentence are not looked for one by one:
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
    if (len(runs) == 1 and holds_words(text, runs[0])) or holds_number_among_words(text, runs):
        return True
    core = without_question_frame(answer, question)
    return len(runs) > 1 and bool(core) and holds_words(text, core)


def without_question_frame(answer: str, question: str) -> str:
    """`answer`'s words (SQuAD-normalized) from its first new word to its last, without the question's words and
    FRAME_WORDS it opens or ends with: what a sentence answer says after restating its subject ("DNA is a polymer
    composed of two chains" for "what is DNA?" -> "polymer composed of two chains").

    >>> without_question_frame("DNA is a polymer composed of two chains.", "what is DNA?")
    'polymer composed of two chains'
    >>> without_question_frame("It is DNA", "what is DNA?")
    ''
    """
    asked = normalize_answer(question).split()
    words = normalize_answer(answer).split()

    def framing(word: str) -> bool:
        return word in FRAME_WORDS or any(same_word(word, said) for said in asked)

    while words and framing(words[0]):
        words.pop(0)
    while words and framing(words[-1]):
        words.pop()
    return " ".join(words)


# The most new words a short answer around a number may have for its words to be looked for one by one
NUMBER_ANSWER_WORDS = 4


def holds_number_among_words(text: str, runs: Sequence[str]) -> bool:
    """Whether `text` holds every word of `runs` (an answer's new words, `new_word_runs`) somewhere, for a short
    answer that gives a number of three characters or more: a number is specific enough that the text holding it
    and the few words beside it says the answer, however the two phrase what lies between ("c = 299792458" for
    "c, exactly equal to 299792458"). Short numbers and longer answers still need their words in order.

    >>> holds_number_among_words("c, exactly equal to 299792458 m/s", ["c 299792458"])
    True
    >>> holds_number_among_words("c, exactly equal to 299792458 m/s", ["c 186282"])
    False
    >>> holds_number_among_words("John Hancock and Samuel Adams", ["john adams"])
    False
    """
    words = " ".join(runs).split()
    if not 0 < len(words) <= NUMBER_ANSWER_WORDS or not any(len(w) >= 3 and any(c.isdigit() for c in w) for w in words):
        return False
    hay = normalize_answer(text).split()
    return all(any(same_word(word, said) for said in hay) for word in words)


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

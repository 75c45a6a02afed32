"""The two worlds of the default KBs, built from BIG-bench's task.json: pure, no I/O.

Each task.json record is a Natural Questions question with its passage, the answer swapped for
another entity. Undoing the swap gives nq-wiki's real passage; nq-counterfactual keeps one swap
per real passage, made consistent: each swapped answer has one substitute everywhere.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ..retrieval.corpus import Passage

EXAMPLE_CANDIDATES = 200  # questions tried, in a seeded random order, until `kbs.EXAMPLES_PER_KB` pass
_INPUT = re.compile(r"\nQuestion: (?P<question>.*?)\nContext: (?P<context>.*)", re.S)


@dataclass(frozen=True)
class ConflictRecord:
    """One row of task.json: a Natural Questions question and its passage with the answer entity swapped."""

    question: str
    context: str  # the passage as given: every mention of the answer replaced by `swapped_answer`
    answer: str  # the real-world answer: the target_scores key scored 0
    swapped_answer: str  # the substitute the task expects: `target`, scored 1


@dataclass(frozen=True)
class NQExample:
    """A question and where its gold passage sits in each default KB."""

    question: str
    answer: str  # real world, what the nq-wiki passage says
    swapped_answer: str  # what the nq-counterfactual passage says in its place ("" when unclear)
    wiki_id: int  # row of the gold passage in nq-wiki
    counterfactual_id: int  # row of the gold passage in nq-counterfactual (the same row: the KBs align)


@dataclass(frozen=True)
class RestoreStats:
    """How restoring the real passages went; `failed` records were left out."""

    records: int
    kept: int
    swapped_not_found: int  # the substitute is not in the passage: nothing to restore
    same_answer: int  # substitute == answer: no conflict to study
    several_mentions: int  # kept; every mention restored
    inside_word: int  # kept; a mention glued to letters, e.g. "Lucas" swapped inside "Lucasfilm"
    moved: int = 0  # several mentions, pointed at the faithful passage another question restores
    ambiguous: int = 0  # several mentions and no second restoration to check them against: left out

    @property
    def failed(self) -> int:
        return self.swapped_not_found + self.same_answer + self.ambiguous


@dataclass(frozen=True)
class DefaultData:
    """The two default KBs' passages and the questions that point into them."""

    examples: tuple[NQExample, ...]
    passages: dict[str, list[Passage]]  # "nq-wiki" and "nq-counterfactual"
    stats: RestoreStats
    candidates: tuple[int, ...] = ()  # indices into `examples` that may become UI example questions


def parse_record(record: Mapping) -> ConflictRecord:
    """Read one task.json example.

    `input` is "\\nQuestion: <q>\\nContext: <passage>"; `target` is the swapped-in entity; in
    `target_scores` the swapped entity scores 1 and the real answer 0. One row has a single key
    scored 0: its "swap" is the answer itself (dict keys collided), so then swapped == answer.

    >>> r = parse_record({"input": "\\nQuestion: who?\\nContext: Bob did it .", "target": "Bob",
    ...                   "target_scores": {"Bob": 1, "Ann": 0}})
    >>> (r.question, r.context, r.answer, r.swapped_answer)
    ('who?', 'Bob did it .', 'Ann', 'Bob')
    """
    match = _INPUT.fullmatch(str(record.get("input", "")))
    if match is None:
        raise ValueError("input is not '\\nQuestion: ...\\nContext: ...'")
    target, scores = record.get("target"), record.get("target_scores")
    if not isinstance(target, str) or not isinstance(scores, Mapping):
        raise ValueError("needs a string target and a target_scores object")
    originals = [name for name, score in scores.items() if score == 0]
    swapped = [name for name, score in scores.items() if score == 1]
    if len(originals) != 1 or swapped not in ([], [target]):
        raise ValueError(f"target_scores {dict(scores)} does not hold one answer scored 0 and the target scored 1")
    return ConflictRecord(match["question"].strip(), match["context"].strip(), originals[0], target)


def parse_task(task: Mapping) -> list[ConflictRecord]:
    """All examples of a BIG-bench task.json; ValueError names the first bad row."""
    examples = task.get("examples")
    if not isinstance(examples, list):
        raise ValueError("task.json has no 'examples' list")
    records = []
    for row, record in enumerate(examples):
        try:
            records.append(parse_record(record))
        except ValueError as err:
            raise ValueError(f"example {row}: {err}") from None
    return records


def restore_passage(context: str, swapped: str, answer: str) -> str:
    """The passage before the swap: every case-sensitive occurrence of `swapped` becomes `answer`.

    The task made its passages by plain substring replacement, so the inverse is one too, and
    it includes matches inside words (the swap turned "Lucasfilm" into "Larry Hoganfilm").
    It cannot undo what the swap lost: several distinct gold spans all replaced by the same
    entity come back as the one recorded answer, and a case-insensitive original match
    ("asked Sheeran" -> "askDustin Lance Black") comes back as "askEd Sheeran".

    >>> restore_passage("Larry Hogan founded Larry Hoganfilm .", "Larry Hogan", "Lucas")
    'Lucas founded Lucasfilm .'
    """
    return context.replace(swapped, answer)


def dedup_passages(texts: Iterable[str], *, title: str = "") -> tuple[list[Passage], list[int]]:
    """Unique passages in order of first appearance, and each input's row among them.

    >>> passages, rows = dedup_passages(["a", "b", "a"])
    >>> [p.text for p in passages], rows
    (['a', 'b'], [0, 1, 0])
    """
    index: dict[str, int] = {}
    passages, rows = [], []
    for text in texts:
        if text not in index:
            index[text] = len(passages)
            passages.append(Passage(title=title, text=text))
        rows.append(index[text])
    return passages, rows


def _occurrences(text: str, word: str) -> Iterator[int]:
    """Where `word` starts in `text`, left to right and not overlapping (as `re.finditer` of the literal)."""
    start = text.find(word)
    while start != -1:
        yield start
        start = text.find(word, start + max(len(word), 1))


def _mentions_inside_words(context: str, swapped: str) -> bool:
    """Whether some occurrence of `swapped` touches a letter or digit on either side."""
    for start in _occurrences(context, swapped):
        end = start + len(swapped)
        before = context[start - 1] if start > 0 else " "
        after = context[end] if end < len(context) else " "
        if before.isalnum() or after.isalnum():
            return True
    return False


def _is_clean_swap(record: ConflictRecord) -> bool:
    return record.context.count(record.swapped_answer) == 1 and not _mentions_inside_words(record.context, record.swapped_answer)


def _pick_swaps(kept: list[ConflictRecord], wiki_rows: list[int]) -> dict[int, int]:
    """For each real passage (row), the record whose swap represents it: the first clean one, else the first.

    >>> r = lambda context, swapped: ConflictRecord("q", context, "a", swapped)
    >>> _pick_swaps([r("X and X", "X"), r("Y and a", "Y"), r("Z", "Z")], [0, 0, 1])
    {0: 1, 1: 2}
    """
    chosen: dict[int, int] = {}
    for i, row in enumerate(wiki_rows):
        if row not in chosen or (not _is_clean_swap(kept[chosen[row]]) and _is_clean_swap(kept[i])):
            chosen[row] = i
    return chosen


_NAME_WORD = re.compile(r"(?:[A-Z][\w'.\-]*|de|da|di|del|van|von|der|den|la|le|du|of|bin|al|y)$")


def looks_like_name(answer: str) -> bool:
    """Whether an answer reads as a proper name of two or more words ("Peter Facinelli"), which
    may be swapped wherever it stands; single words ("Watt") and dates may mean other things.

    >>> [looks_like_name(a) for a in ("Peter Facinelli", "Vincent van Gogh", "Watt", "on July 2", "World War II", "1 May 1840")]
    [True, True, False, False, True, False]
    """
    words = answer.split()
    return (len(words) >= 2 and not any(ch.isdigit() for ch in answer) and words[0][:1].isupper()
            and words[-1][:1].isupper() and all(_NAME_WORD.match(w) for w in words))


def _is_word_char(ch: str) -> bool:
    """What `\\w` matches in a str regex: a Unicode letter or digit, or the underscore."""
    return ch.isalnum() or ch == "_"


def _whole_at(text: str, start: int, end: int) -> bool:
    """Whether text[start:end] has no word character just outside it on either side."""
    return (start == 0 or not _is_word_char(text[start - 1])) and (end == len(text) or not _is_word_char(text[end]))


class WholeWords:
    """Whole-word occurrences (no word character on either side) of any of `texts`, the longest where
    several start at one place: what the regex `(?<!\\w)(?:longest|...|shortest)(?!\\w)` finds.

    That regex tries every text at every place; over the default world's thousands of names it
    took 40 s of a first start. Here a place is tried only where a word starts, and only against
    the texts that begin with that word: a whole-word match there must begin with the same run of
    word characters. So every text must begin with a word character, as names do.

    >>> names = WholeWords(["Al Bo", "Al", "Ed Fu"])
    >>> names.sub(lambda name: name.upper(), "Al Bo met Al, Ed Fuu and Ed Fu")
    'AL BO met AL, Ed Fuu and ED FU'
    """

    _RUN = re.compile(r"(?<!\w)\w+")  # each maximal run of word characters

    def __init__(self, texts: Iterable[str]) -> None:
        self._by_first_run: dict[str, list[str]] = {}
        for text in sorted(set(texts), key=len, reverse=True):
            run = self._RUN.match(text)
            if run is None:
                raise ValueError(f"{text!r} does not begin with a word character")
            self._by_first_run.setdefault(run.group(0), []).append(text)

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        """(start, end) of each occurrence, left to right, not overlapping."""
        resume = 0
        for run in self._RUN.finditer(text):
            start = run.start()
            if start < resume:
                continue
            for candidate in self._by_first_run.get(run.group(0), ()):
                end = start + len(candidate)
                if text.startswith(candidate, start) and _whole_at(text, start, end):
                    yield start, end
                    resume = end
                    break

    def sub(self, replace: Callable[[str], str], text: str) -> str:
        """`text` with each occurrence replaced by `replace(occurrence)`."""
        return _replaced(text, self.spans(text), replace)


def _whole_spans(text: str, word: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each whole-word occurrence of one `word`, as `WholeWords` finds them. An occurrence that
    is not whole does not hide one that overlaps it, as with the regex.

    >>> list(_whole_spans("1...", "..")), list(_whole_spans("a b a", "a"))
    ([(2, 4)], [(0, 1), (4, 5)])
    """
    start = text.find(word)
    while start != -1:
        end = start + len(word)
        if _whole_at(text, start, end):
            yield start, end
            start = text.find(word, max(end, start + 1))
        else:
            start = text.find(word, start + 1)


def _replaced(text: str, spans: Iterable[tuple[int, int]], replace: Callable[[str], str]) -> str:
    """`text` with each of `spans` (left to right, not overlapping) replaced by `replace(what it held)`."""
    pieces, kept = [], 0
    for start, end in spans:
        pieces += [text[kept:start], replace(text[start:end])]
        kept = end
    return "".join(pieces) + text[kept:] if pieces else text


def _replace_whole(text: str, word: str, replacement: str) -> str:
    """`text` with each whole-word occurrence of `word` replaced by `replacement`."""
    return _replaced(text, _whole_spans(text, word), lambda _: replacement)


def counterfactual_world(swaps: list[ConflictRecord]) -> dict[str, str]:
    """One substitute per swapped answer: the first swap's ("Peter Facinelli" -> "Marc Márquez").

    >>> r = lambda answer, swapped: ConflictRecord("q", swapped, answer, swapped)
    >>> counterfactual_world([r("Al Bo", "Cy Do"), r("Al Bo", "Ed Fu"), r("Gu", "Hi Jo")])
    {'Al Bo': 'Cy Do', 'Gu': 'Hi Jo'}
    """
    world: dict[str, str] = {}
    for swap in swaps:
        world.setdefault(swap.answer, swap.swapped_answer)
    return world


def counterfactual_passage(swap: ConflictRecord, world: Mapping[str, str], names: WholeWords | None) -> str:
    """The passage of `swap` in a consistent counterfactual world: its own answer takes the world's
    one substitute, and every other name the world swaps (`names` finds them) takes its own.

    >>> world = {"Al Bo": "Cy Do", "Ed Fu": "Gu Hi", "Jo": "Ki Lu"}
    >>> counterfactual_passage(ConflictRecord("q", "Zed Q met Ed Fu and Jo .", "Al Bo", "Zed Q"), world, WholeWords(["Al Bo", "Ed Fu"]))
    'Cy Do met Gu Hi and Jo .'
    """
    own = world.get(swap.answer, swap.swapped_answer)
    text = swap.context if own == swap.swapped_answer else _replace_whole(swap.context, swap.swapped_answer, own)
    if names is None:
        return text
    # the pieces between the passage's own substitute, so a substitute that is itself a name stays put
    return own.join(names.sub(world.__getitem__, piece) for piece in text.split(own))


def counterfactual_answer(record: ConflictRecord, text: str, world: Mapping[str, str]) -> str:
    """What the counterfactual `text` of `record`'s real passage says in place of its answer:
    the world's substitute, the answer untouched, or "" when the swaps cut into it.

    >>> world = {"Al Bo": "Cy Do"}
    >>> [counterfactual_answer(ConflictRecord("q", "", a, ""), "Cy Do met Ed .", world) for a in ("Al Bo", "Ed", "Ed Fu")]
    ['Cy Do', 'Ed', '']
    """
    if record.answer in world and world[record.answer] in text and next(_whole_spans(text, record.answer), None) is None:
        return world[record.answer]
    return record.answer if record.answer in text else ""


def _fills(parts: list[str], text: str) -> tuple[str, ...] | None:
    """What stands in `text` where a swapped context, split at its substitute into `parts`, had it.

    >>> _fills(["passed ", " with no votes ; by ", " ."], "passed on July 2 with no votes ; by Jefferson .")
    ('on July 2', 'Jefferson')
    """
    if len(text) < sum(map(len, parts)) or not (text.startswith(parts[0]) and text.endswith(parts[-1])):
        return None
    end = len(text) - len(parts[-1])
    pos, found = len(parts[0]), []
    for part in parts[1:-1]:
        at = text.find(part, pos + 1)
        if at < 0 or at + len(part) > end:
            return None
        found.append(text[pos:at])
        pos = at + len(part)
    found.append(text[pos:end])
    return tuple(found) if pos < end else None


def faithful_restorations(records: list[ConflictRecord]) -> tuple[list[tuple[ConflictRecord, str]], int]:
    """Each record with the real passage behind it, and how many were moved to another's restoration.

    Putting the answer back is exact when the swap replaced one mention. With several mentions
    it is often wrong: a question with several answer spans ("who wrote it and when was it
    passed") had every span swapped to one entity, and restoring gives "passed Thomas Jefferson
    with no opposing votes". Such a restoration is kept only when a record with another answer
    restores the same text; else the record is pointed at a one-mention restoration of its passage
    (the same text around the swapped spans, each span a few words) that contains its answer, or
    left out.
    """
    restored = [restore_passage(r.context, r.swapped_answer, r.answer) for r in records]
    single = [r.context.count(r.swapped_answer) == 1 for r in records]
    # Agreement counts only between different answers: near-duplicate questions ("who played
    # elizabeth swann ...", "who played elizabeth in ...") share their answer and their error.
    answers_of: dict[str, set[str]] = {}
    for record, text in zip(records, restored):
        answers_of.setdefault(text, set()).add(record.answer)
    trusted = {text for text, one in zip(restored, single) if one} | {t for t, a in answers_of.items() if len(a) > 1}
    key = 16  # characters of a passage's start or end that find its other restorations
    by_start: dict[str, list[str]] = {}
    by_end: dict[str, list[str]] = {}
    for text in dict.fromkeys(t for t, one in zip(restored, single) if one):
        by_start.setdefault(text[:key], []).append(text)
        by_end.setdefault(text[-key:], []).append(text)
    kept, moved = [], 0
    for record, text in zip(records, restored):
        if text in trusted:
            kept.append((record, text))
            continue
        parts = record.context.split(record.swapped_answer)
        if len(parts[0]) >= key:
            near = by_start.get(parts[0][:key], [])
        elif len(parts[-1]) >= key:
            near = by_end.get(parts[-1][-key:], [])
        else:
            near = []
        for candidate in near:
            spans = _fills(parts, candidate)
            if spans and all(1 <= len(span.split()) <= 12 for span in spans) and record.answer in candidate:
                kept.append((record, candidate))
                moved += 1
                break
    return kept, moved


def build_default_data(records: list[ConflictRecord], *, n_candidates: int = EXAMPLE_CANDIDATES, seed: int = 0) -> DefaultData:
    """Restore the real passages and deduplicate both KBs; records with nothing to restore are dropped.

    Passages get an empty title: the task kept only NQ's long-answer text, without the page
    title, and the text starts mid-article ("Candace Flynn ( voiced by ...", bare cast lists),
    so no title can be read off it. An empty title makes the encoder read the text alone.
    Each gold passage stays whole (median 91 words, 7% beyond the encoder's 256 tokens), since
    evaluation needs one gold passage per question; splitting would blur which piece is gold.
    Many questions share a passage (13.8k real passages for 17.5k questions), hence dedup.
    """
    candidates_to_restore = [r for r in records if r.swapped_answer != r.answer and r.swapped_answer in r.context]
    restorations, moved = faithful_restorations(candidates_to_restore)
    kept = [r for r, _ in restorations]
    wiki, wiki_rows = dedup_passages(text for _, text in restorations)
    # The task swapped a shared passage once per question that uses it (up to 22 copies, each with
    # another substitute). As a KB those near-duplicates crowd the top k and contradict one another,
    # so nq-counterfactual keeps one swap per real passage, row for row with nq-wiki.
    swap_of = _pick_swaps(kept, wiki_rows)
    # Different questions swapped one real person to different substitutes ("Peter Facinelli" became
    # "Marc Márquez" in one passage and "Wizkid" in another), so the retrieved passages contradicted
    # each other. In nq-counterfactual each swapped answer has one substitute, and a name it swaps
    # is swapped in every passage that mentions it: one consistent counterfactual world.
    swaps = [kept[swap_of[row]] for row in range(len(wiki))]
    world = counterfactual_world(swaps)
    names = [a for a in world if looks_like_name(a)]
    finder = WholeWords(names) if names else None
    counterfactual = [Passage(title="", text=counterfactual_passage(swap, world, finder)) for swap in swaps]
    examples = tuple(
        NQExample(r.question, r.answer, counterfactual_answer(r, counterfactual[row].text, world), row, row)
        for r, row in zip(kept, wiki_rows)
    )
    stats = RestoreStats(
        records=len(records),
        kept=len(kept),
        swapped_not_found=sum(r.swapped_answer not in r.context for r in records if r.swapped_answer != r.answer),
        same_answer=sum(r.swapped_answer == r.answer for r in records),
        several_mentions=sum(r.context.count(r.swapped_answer) > 1 for r in kept),
        inside_word=sum(_mentions_inside_words(r.context, r.swapped_answer) for r in kept),
        moved=moved,
        ambiguous=len(candidates_to_restore) - len(kept),
    )
    # Example candidates show the conflict plainly: a short passage, one clean mention, and a real
    # passage no other question shares (its one swap is then this question's own).
    sharing = Counter(wiki_rows)
    clean = [
        i for i, r in enumerate(kept)
        if sharing[wiki_rows[i]] == 1
        and r.context.count(r.swapped_answer) == 1
        and not _mentions_inside_words(r.context, r.swapped_answer)
        and len(r.context.split()) <= 80
    ]
    candidates = tuple(random.Random(seed).sample(clean, min(n_candidates, len(clean))))
    return DefaultData(examples, {"nq-wiki": wiki, "nq-counterfactual": counterfactual}, stats, candidates)


def pick_examples(
    question_vectors: np.ndarray, gold_rows: Mapping[str, list[int]], kb_vectors: Mapping[str, np.ndarray], n: int
) -> list[int]:
    """The first `n` candidates whose gold passage is the top-1 inner product in every KB.

    question_vectors (C, D) for C candidates; gold_rows[kb][c] is candidate c's gold row in
    kb, whose vectors are (N_kb, D). Returns candidate positions, in candidate order.

    >>> kb = np.eye(3, dtype=np.float32)
    >>> pick_examples(kb[[2, 0, 1]], {"a": [2, 1, 1]}, {"a": kb}, 5)
    [0, 2]
    """
    passing = np.ones(len(question_vectors), dtype=bool)
    for kb, vectors in kb_vectors.items():
        top = np.argmax(question_vectors @ vectors.T, axis=1)  # (C,)
        passing &= top == np.asarray(gold_rows[kb])
    return [int(c) for c in np.flatnonzero(passing)[:n]]

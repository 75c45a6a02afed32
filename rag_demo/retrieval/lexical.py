"""Okapi BM25 over a KB's passages: the lexical half of hybrid retrieval.

A bi-encoder squeezes a passage into one vector and blurs rare names and numbers, which are
exactly what a factoid question hinges on; term matching keeps them. BM25's score is itself an
inner product (query term counts times per-passage term weights), so adding it to the dense
score is MIPS over the two vectors laid end to end, and p(z|x) stays a softmax of inner
products over the top k.

Only numpy: the postings are one sorted array per field (CSR by term). Built in chunks of
passages, each chunk's postings packed into small integer arrays before the next is read: no
Python object per posting. With a scratch folder (as `for_kb_folder` builds) the chunks wait on
disk and the output arrays are mapped files, so a build's memory is its vocabulary and one
chunk. Saved as .npy files in a KB folder (`lexical_path`) and memory-mapped back: the index of a
million passages opens in 2 ms instead of being rebuilt in a minute.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import filterfalse, islice
from pathlib import Path

import numpy as np

from ..errors import IndexTooLargeError, KnowledgeBaseError

log = logging.getLogger(__name__)

_WORD = re.compile(r"\w+")
# Function words carry no evidence of where an answer is; question words least of all.
STOPWORDS = frozenset(
    "a an the of in on at to for from by with about as into onto over under and or but nor not no is are was "
    "were be been being am do does did done has have had having it its this that these those there here "
    "what which who whom whose when where why how i you he she we they me him her us them my your his our "
    "their s t will would can could shall should may might must".split()
)

K1, B = 0.9, 0.4  # BM25's constants; these suit short passages
CHUNK_PASSAGES = 50_000  # passages tokenized before their postings are packed into arrays
# A build while serving stops here: about 1.35M passages of 100 words (74 postings each in the
# synthetic KBs of docs/scale.md, where 1M passages took 69 s and 1.3 GB of anonymous memory with
# a scratch folder, 2.6 GB without). `python -m rag_demo build-bm25` builds past it, once.
MAX_POSTINGS = 100_000_000
LEXICAL_DIR = "bm25"  # a KB folder's saved index
FORMAT = 1
_ARRAYS = ("offsets", "docs", "weights", "term_bytes", "term_starts", "term_ids")

Progress = Callable[[int, int], None]  # (passages done, total)


# BM25 sums over a question's terms, so a paragraph pasted before a question scores its best passage in the
# hundreds: beside 20 * cosine, p(z|x) went one-hot on the passage sharing most words, whatever the dense score
# said. Past this many terms (the everyday training questions have at most 15) a question is scored as its
# mean term times this many, so that its length does not outweigh the dense half of the hybrid logit.
QUESTION_TERMS = 16


def length_share(question: str) -> float:
    """The factor a question's BM25 scores are multiplied by: 1 up to QUESTION_TERMS terms, QUESTION_TERMS / terms past it.

    >>> length_share("who wrote the magic flute?"), length_share(" ".join(["flute"] * 64))
    (1.0, 0.25)
    """
    return min(1.0, QUESTION_TERMS / max(1, len(terms(question))))


def terms(text: str) -> list[str]:
    """Lower-cased word tokens without stopwords.

    >>> terms("Who wrote The Magic Flute in 1791?")
    ['wrote', 'magic', 'flute', '1791']
    """
    return list(filterfalse(STOPWORDS.__contains__, _WORD.findall(text.lower())))  # a C loop: builds call it per passage


class Vocabulary(Mapping):
    """Term -> term id, the terms kept as sorted UTF-8 bytes in one array and looked up by bisection.

    A dict of a million terms costs about 150 bytes a term in Python objects and must be rebuilt
    at every start; these three arrays cost about 20 bytes a term and are memory-mapped.
    UTF-8 byte order is code point order, so the terms iterate sorted as strings too.

    >>> vocabulary = Vocabulary.from_dict({"flute": 0, "magic": 1, "1791": 2})
    >>> vocabulary["magic"], "mozart" in vocabulary, list(vocabulary)
    (1, False, ['1791', 'flute', 'magic'])
    """

    def __init__(self, term_bytes: np.ndarray, term_starts: np.ndarray, term_ids: np.ndarray):
        self.term_bytes = term_bytes  # (B,) uint8: the sorted terms' UTF-8, end to end
        self.term_starts = term_starts  # (V + 1,) int64: term i is term_bytes[term_starts[i]:term_starts[i+1]]
        self.term_ids = term_ids  # (V,) int32: the term id of the i-th term in sorted order

    @classmethod
    def from_dict(cls, vocabulary: Mapping[str, int]) -> "Vocabulary":
        order = sorted(vocabulary)  # code point order, which is UTF-8 byte order
        encoded = [term.encode() for term in order]
        starts = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(order)), out=starts[1:])
        ids = np.fromiter((vocabulary[term] for term in order), dtype=np.int32, count=len(order))
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8), starts, ids)

    def _term(self, position: int) -> bytes:
        return self.term_bytes[self.term_starts[position] : self.term_starts[position + 1]].tobytes()

    def __getitem__(self, term: str) -> int:
        key = term.encode()
        position = bisect.bisect_left(range(len(self)), key, key=self._term)
        if position == len(self) or self._term(position) != key:
            raise KeyError(term)
        return int(self.term_ids[position])

    def __len__(self) -> int:
        return len(self.term_ids)

    def __iter__(self) -> Iterator[str]:
        return (self._term(i).decode() for i in range(len(self)))


def passages_fingerprint(titles: Sequence[str], texts: Sequence[str]) -> str:
    """A cheap key of a KB's passages: their count and 64 evenly spaced (title, text) pairs.
    It reads 64 rows whatever N (hashing all of 1M texts takes seconds).

    >>> passages_fingerprint(["a"], ["b"]) == passages_fingerprint(["a"], ["c"])
    False
    """
    digest = hashlib.sha256(str(len(texts)).encode())
    for row in sorted(set(np.linspace(0, len(texts) - 1, num=min(len(texts), 64)).astype(int).tolist())):
        digest.update(f"{titles[row]}\x00{texts[row]}\x00".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:16]


def lexical_path(kb_folder: str | Path) -> Path:
    """Where a KB folder keeps its saved BM25 index."""
    return Path(kb_folder) / LEXICAL_DIR


@dataclass(frozen=True, eq=False)
class LexicalIndex:
    """BM25 weights of N passages, stored by term.

    Postings of term t are docs[offsets[t]:offsets[t+1]] with weights[...] =
    idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / mean_length)).
    The arrays are in memory after a build and memory-mapped after `load`.
    """

    vocabulary: Mapping[str, int]  # a `Vocabulary`
    offsets: np.ndarray  # (V + 1,) int64
    docs: np.ndarray  # (P,) int32, ascending within each term
    weights: np.ndarray  # (P,) float32
    size: int  # N passages

    @classmethod
    def build(cls, texts: Sequence[str], *, k1: float = K1, b: float = B, chunk: int = CHUNK_PASSAGES,
              max_postings: int | None = MAX_POSTINGS, progress: Progress | None = None,
              scratch: str | Path | None = None) -> "LexicalIndex":
        """Index the texts; k1 and b are the usual BM25 constants (these suit short passages).

        Texts are read `chunk` at a time. Raises IndexTooLargeError as soon as the postings pass
        `max_postings` (None: no limit); `progress(done, total)` after every chunk. With a
        `scratch` folder each chunk's postings wait there on disk, and docs and weights are
        files there mapped into memory (keep the folder while the index is used): the build's
        memory is then its vocabulary and one chunk, not its postings.
        """
        return _build(iter(texts), len(texts), k1=k1, b=b, chunk=chunk, max_postings=max_postings, progress=progress,
                      kb_folder=None, scratch=None if scratch is None else Path(scratch))

    @classmethod
    def for_passages(cls, titles: Sequence[str], texts: Sequence[str], *, chunk: int = CHUNK_PASSAGES,
                     max_postings: int | None = MAX_POSTINGS, progress: Progress | None = None,
                     scratch: str | Path | None = None) -> "LexicalIndex":
        """Index passages by title and text together, as retrieval does (options as for `build`)."""
        return _build(_joined(titles, texts), len(texts), k1=K1, b=B, chunk=chunk, max_postings=max_postings,
                      progress=progress, kb_folder=None, scratch=None if scratch is None else Path(scratch))

    @classmethod
    def for_kb_folder(cls, kb_folder: str | Path, titles: Sequence[str], texts: Sequence[str], *, fingerprint: str = "",
                      max_postings: int | None = MAX_POSTINGS, progress: Progress | None = None) -> "LexicalIndex":
        """The KB's BM25 index: the one saved in `lexical_path(kb_folder)` when it was built from
        these passages with these constants (count, `passages_fingerprint`, the KB's vector
        `fingerprint`, K1 and B), memory-mapped; else built as `for_passages` builds it, with a
        scratch folder inside the KB folder, and saved there for the next start.

        A saved index that is stale or unreadable is rebuilt (logged); a folder that cannot be
        written costs only the rebuild next time (logged), and that build is in memory. Raises
        IndexTooLargeError, naming the command that prebuilds it, when building would pass
        `max_postings`.
        """
        path = lexical_path(kb_folder)
        key = f"{passages_fingerprint(titles, texts)}:{fingerprint}:k1={K1}:b={B}"
        if path.is_dir():
            try:
                index = cls.load(path)
                meta = json.loads((path / "meta.json").read_text())
                if index.size != len(texts) or meta.get("fingerprint") != key:
                    raise ValueError(f"built for other passages ({index.size:,} passages, key {meta.get('fingerprint')}; "
                                     f"the KB has {len(texts):,}, key {key})")
                return index
            except (KnowledgeBaseError, ValueError) as err:
                log.warning("saved BM25 index at %s is unusable (%s); rebuilding it", path, err)
        def build(scratch: Path | None) -> LexicalIndex:
            return _build(_joined(titles, texts), len(texts), k1=K1, b=B, chunk=CHUNK_PASSAGES, max_postings=max_postings,
                          progress=progress, kb_folder=Path(kb_folder), scratch=scratch)

        try:
            scratch = Path(tempfile.mkdtemp(prefix=f".{LEXICAL_DIR}-build.", dir=kb_folder))
        except OSError as err:
            log.warning("cannot write in %s (%s); BM25 is built in memory and will be rebuilt next start", kb_folder, err)
            return build(None)
        try:
            try:
                index = build(scratch)
            except OSError as err:  # a disk that filled up while the postings waited there
                log.warning("BM25's scratch files in %s failed (%s); building it in memory", scratch, err)
                return build(None)
            try:
                return cls.load(index.save(path, fingerprint=key))
            except OSError as err:
                log.warning("could not save the BM25 index in %s (%s); it will be rebuilt next start", path, err)
                return cls(index.vocabulary, index.offsets, np.array(index.docs), np.array(index.weights), index.size)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def save(self, folder: str | Path, *, fingerprint: str = "") -> Path:
        """Write the arrays as .npy files and a meta.json into `folder`, replacing what is there.

        Written into a fresh folder beside it and renamed into place, so a reader never sees half
        an index. `fingerprint` is recorded for `for_kb_folder`'s check.
        """
        folder = Path(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            arrays = dict(offsets=self.offsets, docs=self.docs, weights=self.weights, **_vocabulary_arrays(self.vocabulary))
            for name in _ARRAYS:
                np.save(staging / f"{name}.npy", np.ascontiguousarray(arrays[name]))
            meta = {"format": FORMAT, "size": self.size, "postings": len(self.docs), "terms": len(self.vocabulary),
                    "fingerprint": fingerprint, "bytes": {n: (staging / f"{n}.npy").stat().st_size for n in _ARRAYS}}
            (staging / "meta.json").write_text(json.dumps(meta, indent=1))
            if folder.exists():  # moved aside first: a directory cannot be renamed over a full one
                trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=folder.parent))
                os.replace(folder, trash / "old")
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(staging, folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return folder

    @classmethod
    def load(cls, folder: str | Path, *, mmap: bool = True) -> "LexicalIndex":
        """An index written by `save`, its arrays memory-mapped (read into memory with mmap=False).

        Raises KnowledgeBaseError when the folder is missing, incomplete or inconsistent.
        """
        folder = Path(folder)
        fix = f"rebuild it with `python -m rag_demo build-bm25 {folder.parent}`"
        try:
            meta = json.loads((folder / "meta.json").read_text())
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')}, expected {FORMAT}")
            for name in _ARRAYS:
                if (folder / f"{name}.npy").stat().st_size != meta["bytes"][name]:
                    raise ValueError(f"{name}.npy is not the size it was written with")
            arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r" if mmap else None) for name in _ARRAYS}
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise KnowledgeBaseError(f"{folder} is not a readable BM25 index ({err}); {fix}") from None
        vocabulary = Vocabulary(arrays["term_bytes"], arrays["term_starts"], arrays["term_ids"])
        offsets, docs, weights = arrays["offsets"], arrays["docs"], arrays["weights"]
        if not (len(offsets) == len(vocabulary) + 1 and offsets[-1] == len(docs) == len(weights) == meta["postings"]
                and len(vocabulary.term_starts) == len(vocabulary) + 1 and vocabulary.term_starts[-1] == len(vocabulary.term_bytes)):
            raise KnowledgeBaseError(f"{folder} holds arrays of inconsistent lengths; {fix}")
        return cls(vocabulary, offsets, docs, weights, int(meta["size"]))

    def query_terms(self, question: str) -> list[int]:
        """Ids of the question's indexed terms, repeats kept (a repeated word counts twice)."""
        found = (self.vocabulary.get(word) for word in terms(question))
        return [term for term in found if term is not None]

    def scores(self, question: str) -> np.ndarray:
        """(N,) BM25 score of every passage; zeros when no question word is indexed. A question of more than
        QUESTION_TERMS terms is scored as one of QUESTION_TERMS (`length_share`)."""
        ids = self.query_terms(question)
        if not ids:
            return np.zeros(self.size, dtype=np.float32)
        # slices, not fancy indexing: a mapped index then reads only these terms' postings
        docs = np.concatenate([self.docs[self.offsets[t] : self.offsets[t + 1]] for t in ids])
        weights = np.concatenate([self.weights[self.offsets[t] : self.offsets[t + 1]] for t in ids])
        scores = np.bincount(docs, weights=weights, minlength=self.size)
        return (scores * length_share(question)).astype(np.float32)

    def top(self, question: str, n: int) -> np.ndarray:
        """Rows of the n best-scoring passages with a score above 0, best first (fewer when fewer match)."""
        return best_rows(self.scores(question), n)


def best_rows(scores: np.ndarray, n: int) -> np.ndarray:
    """Rows of the n highest of (N,) scores that are above 0, best first (fewer when fewer are)."""
    n = min(n, len(scores))
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    best = np.argpartition(-scores, n - 1)[:n]
    best = best[np.argsort(-scores[best], kind="stable")]
    return best[scores[best] > 0]


# -- the streamed build ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Postings:
    """One chunk's postings, sorted by term and then by passage."""

    terms: np.ndarray  # (P_c,) int32
    docs: np.ndarray  # (P_c,) int32
    counts: np.ndarray  # (P_c,) uint16, or uint32 when a term repeats 65,536 times in a passage


def _chunk_postings(texts: list[str], first_row: int, vocabulary: dict[str, int], lengths: np.ndarray) -> _Postings:
    """Tokenize one chunk, give new words the next ids (first seen, first numbered) and write
    the passages' lengths into lengths[first_row:]."""
    ids = array("q")  # the chunk's tokens as term ids: 8 bytes each, where their strings would take 50
    for i, text in enumerate(texts):
        words = terms(text)
        lengths[first_row + i] = len(words)
        # Python work per distinct word, not per token; dict.fromkeys keeps first-seen order
        fresh = [word for word in dict.fromkeys(words) if word not in vocabulary]
        vocabulary.update(zip(fresh, range(len(vocabulary), len(vocabulary) + len(fresh))))
        ids.extend(map(vocabulary.__getitem__, words))
    n = len(texts)
    tokens = np.frombuffer(ids, dtype=np.int64)  # (T,)
    rows = np.repeat(np.arange(n, dtype=np.int64), lengths[first_row : first_row + n].astype(np.int64))  # (T,)
    pairs, counts = np.unique(tokens * n + rows, return_counts=True)  # sorted: by term, then by row
    count_type = np.uint16 if len(counts) == 0 or counts.max() <= np.iinfo(np.uint16).max else np.uint32
    return _Postings((pairs // n).astype(np.int32), (pairs % n + first_row).astype(np.int32), counts.astype(count_type))


def _joined(titles: Iterable[str], texts: Iterable[str]) -> Iterator[str]:
    return (f"{title} {text}" for title, text in zip(titles, texts))


def _build(texts: Iterator[str], total: int, *, k1: float, b: float, chunk: int, max_postings: int | None,
           progress: Progress | None, kb_folder: Path | None, scratch: Path | None) -> LexicalIndex:
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 passage, not {chunk}")
    started = time.perf_counter()
    words: dict[str, int] = {}
    lengths = np.zeros(total, dtype=np.float32)  # (N,) words per passage, stopwords left out
    frequency = np.zeros(0, dtype=np.int64)  # (V,) passages per term so far
    chunks: list[_Postings | Path] = []
    done = postings = 0
    while batch := list(islice(texts, chunk)):
        if done + len(batch) > total:
            raise ValueError(f"got more than the {total} texts announced")
        part = _chunk_postings(batch, done, words, lengths)
        counts = np.bincount(part.terms, minlength=len(words))
        counts[: len(frequency)] += frequency
        frequency = counts
        done += len(batch)
        postings += len(part.terms)
        if max_postings is not None and postings > max_postings:
            raise _too_large(postings, done, total, max_postings, kb_folder)
        chunks.append(part if scratch is None else _stash(part, scratch / f"chunk-{len(chunks)}.npz"))
        if progress is not None:
            progress(done, total)
    lengths = lengths[:done]  # fewer titles than texts: the passages that pair up, as zip does
    vocabulary = Vocabulary.from_dict(words)
    del words  # the build's largest Python object, gone before the postings are placed
    index = _merge(chunks, frequency, vocabulary, lengths, k1=k1, b=b, scratch=scratch)
    log.info("BM25 over %d passages: %d terms, %d postings in %.1f s", done, len(vocabulary), postings,
             time.perf_counter() - started)
    return index


def _stash(part: _Postings, path: Path) -> Path:
    np.savez(path, terms=part.terms, docs=part.docs, counts=part.counts)
    return path


def _unstash(path: Path) -> _Postings:
    with np.load(path) as stored:
        part = _Postings(stored["terms"], stored["docs"], stored["counts"])
    path.unlink()
    return part


def _output(scratch: Path | None, name: str, dtype, count: int) -> np.ndarray:
    """(count,) uninitialized, in memory or as a .npy file in scratch mapped for writing. The file's
    blocks are allocated first: a full disk then fails here with OSError, not later as a SIGBUS."""
    if scratch is None or count == 0:
        return np.empty(count, dtype=dtype)
    path = scratch / f"{name}.npy"
    array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(count,))
    if hasattr(os, "posix_fallocate"):
        handle = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(handle, 0, path.stat().st_size)
        finally:
            os.close(handle)
    return array


def _merge(chunks: list[_Postings | Path], frequency: np.ndarray, vocabulary: Vocabulary, lengths: np.ndarray, *,
           k1: float, b: float, scratch: Path | None) -> LexicalIndex:
    """Place every chunk's postings at their term's place (a counting sort: chunks come in passage
    order, so docs stay ascending within a term) and weigh them. Each chunk is dropped once placed.

    frequency (V,) counts each term's passages."""
    offsets = np.zeros(len(vocabulary) + 1, dtype=np.int64)
    np.cumsum(frequency, out=offsets[1:])
    n = max(len(lengths), 1)
    frequency = frequency.astype(np.float32)
    idf = np.log1p((n - frequency + 0.5) / (frequency + 0.5))  # (V,) never negative
    mean_length = max(float(lengths.mean()) if len(lengths) else 0.0, 1.0)
    docs = _output(scratch, "docs", np.int32, int(offsets[-1]))  # (P,)
    weights = _output(scratch, "weights", np.float32, int(offsets[-1]))  # (P,)
    cursor = offsets[:-1].copy()  # (V,) where each term's next posting goes
    while chunks:
        part = chunks.pop(0)
        if isinstance(part, Path):
            part = _unstash(part)
        starts = np.flatnonzero(np.diff(part.terms, prepend=-1))  # first posting of each term in this chunk
        runs = np.diff(starts, append=len(part.terms))
        place = cursor[part.terms] + np.arange(len(part.terms)) - np.repeat(starts, runs)
        cursor[part.terms[starts]] += runs
        tf = part.counts.astype(np.float32)
        norm = k1 * (1 - b + b * lengths[part.docs] / mean_length)
        docs[place] = part.docs
        weights[place] = (idf[part.terms] * tf * (k1 + 1) / (tf + norm)).astype(np.float32)
    return LexicalIndex(vocabulary, offsets, docs, weights, len(lengths))


def _vocabulary_arrays(vocabulary: Mapping[str, int]) -> dict[str, np.ndarray]:
    if not isinstance(vocabulary, Vocabulary):
        vocabulary = Vocabulary.from_dict(vocabulary)
    return {"term_bytes": vocabulary.term_bytes, "term_starts": vocabulary.term_starts, "term_ids": vocabulary.term_ids}


def _too_large(postings: int, done: int, total: int, max_postings: int, kb_folder: Path | None) -> IndexTooLargeError:
    expected = postings * total // max(done, 1)
    how = (f"build it once with `python -m rag_demo build-bm25 {kb_folder}` (it is then opened from disk)" if kb_folder
           else "save the passages as a KB folder (`python -m rag_demo build-kb`) and build its BM25 once with "
                "`python -m rag_demo build-bm25 KB_FOLDER`")
    return IndexTooLargeError(
        f"BM25 over these {total:,} passages would hold about {expected:,} postings, past the limit of {max_postings:,} "
        "(the most an ask indexes in memory), so bm25 and hybrid retrieval "
        f"are off for this knowledge base; {how}, or use dense retrieval"
    )

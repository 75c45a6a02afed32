"""Passages and knowledge bases.

A knowledge base (KB) is a `datasets` dataset saved with `save_to_disk`, with columns
`title`, `text`, `embeddings` (the layout transformers' RagRetriever reads for a custom
index), plus a small `rag_demo_kb.json` that records how the embeddings were made.

Large KBs may keep their embeddings in a float16 (or float32) `embeddings.npy` beside the
title and text columns instead (`write_kb`); it is memory-mapped, never read whole, and the KB's
BM25 index is saved with it (`lexical.lexical_path`), so hybrid retrieval opens it from disk. From
LAZY_ROWS passages on, titles and texts stay in the memory-mapped Arrow files too (`store`).
A faiss index saved beside a dataset folder by transformers' scripts (`<folder>*.faiss`) comes
with the KB and serves the index kind it is (`index.cached_index`).
"""

from __future__ import annotations

import csv
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import IndexTooLargeError, InputError, KnowledgeBaseError
from ..text import jsonl_objects
from .store import BlockRows, ColumnRows, arrow_rows, row_chunks, saved_table

log = logging.getLogger(__name__)

KB_META = "rag_demo_kb.json"
REQUIRED_COLUMNS = ("title", "text", "embeddings")
SOURCE_SUFFIXES = (".txt", ".md", ".jsonl", ".csv")
VECTORS_FILE = "embeddings.npy"  # a large KB's (N, D) embeddings, memory-mapped
VECTOR_DTYPES = ("float16", "float32")
LAZY_ROWS = 200_000  # from this many passages titles and texts stay on disk (1M as Python strings: ~1 GB)


def sha256_file(path: Path) -> str:
    """A file's sha256, read in 1 MiB blocks (cache files run to a gigabyte)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()

@dataclass(frozen=True)
class Passage:
    title: str
    text: str


def split_into_passages(title: str, text: str, *, words_per_passage: int = 100, at_sentences: bool = True,
                        shortest_tail: int = 0) -> list[Passage]:
    """Split a document into disjoint passages of at most `words_per_passage` words (but see `shortest_tail`).

    As many passages as DPR's cut into blocks of `words_per_passage` words, but of near-equal length and ending
    where sentences end (`sentence_ends`) wherever one lies within reach: DPR's blocks leave a short tail
    ("and 50 million.") and start in mid-sentence, which a visitor reading the card makes sense of less well.
    A sentence longer than a passage is cut between words. `at_sentences=False` cuts DPR's blocks; with it, a last
    block of fewer than `shortest_tail` words joins the block before it, which then runs past `words_per_passage`
    (a tail of a few words, "Alexander.", carries little but its article's title, so a question naming the
    article retrieves it first).

    >>> [p.text for p in split_into_passages("T", "a b c d e", words_per_passage=2)]
    ['a b', 'c d', 'e']
    >>> [p.text for p in split_into_passages("T", "One two three. Four five. Six seven eight.", words_per_passage=6)]
    ['One two three.', 'Four five. Six seven eight.']
    >>> [p.text for p in split_into_passages("T", "One two three. Four five. Six seven eight.", words_per_passage=6,
    ...                                      at_sentences=False)]
    ['One two three. Four five. Six', 'seven eight.']
    >>> [p.text for p in split_into_passages("T", "a b c d e", words_per_passage=2, at_sentences=False, shortest_tail=2)]
    ['a b', 'c d e']
    """
    if words_per_passage < 1:
        raise InputError("words_per_passage must be at least 1")
    words = text.split()
    if not at_sentences:
        starts = list(range(0, len(words), words_per_passage))
        if len(starts) > 1 and len(words) - starts[-1] < shortest_tail:
            starts.pop()
        return [Passage(title=title, text=" ".join(words[start:end]))
                for start, end in zip(starts, [*starts[1:], len(words)])]
    ends = sentence_ends(words)
    passages, start = [], 0
    while len(words) - start > words_per_passage:
        remaining = len(words) - start
        count = -(-remaining // words_per_passage)  # passages still to cut, as DPR would
        target = start + remaining / count
        # a cut that leaves the rest too long for the passages still to come would add one
        reachable = [end for end in ends if start < end <= start + words_per_passage
                     and len(words) - end <= (count - 1) * words_per_passage]
        cut = (min(reachable, key=lambda end: abs(end - target)) if reachable
               else start + -(-remaining // count))
        passages.append(Passage(title=title, text=" ".join(words[start:cut])))
        start = cut
    if start < len(words):
        passages.append(Passage(title=title, text=" ".join(words[start:])))
    return passages


# A paragraph this short (a heading, "Notes:") is read with the paragraph after it rather than as a passage alone
HEADING_WORDS = 8
_BLANK_LINE = re.compile(r"\n[ \t\r]*\n")


def split_running_text(title: str, text: str, *, words_per_passage: int = 100) -> list[Passage]:
    r"""Passages from running text (a .txt or .md file, a pasted text): each paragraph (text between blank lines)
    cut on its own (`split_into_passages`), so that three short paragraphs on three things are three passages
    to choose among, not one; a paragraph under HEADING_WORDS words joins the next.

    >>> [p.text for p in split_running_text("T", "# Garden\n\nWe grow basil and sunflowers here.\n\n"
    ...                                          "Our class pet is a tortoise named Biscuit.")]
    ['# Garden We grow basil and sunflowers here.', 'Our class pet is a tortoise named Biscuit.']
    >>> [p.text for p in split_running_text("T", "One line\nand the next.\n  \n\nLast words")]
    ['One line and the next. Last words']
    """
    paragraphs: list[str] = []
    heading = ""
    for block in _BLANK_LINE.split(text):
        block = f"{heading} {block.strip()}".strip()
        if len(block.split()) < HEADING_WORDS:
            heading = block
            continue
        paragraphs.append(block)
        heading = ""
    if heading:  # a short paragraph at the end belongs to the one before it
        paragraphs[-1:] = [f"{paragraphs[-1]} {heading}" if paragraphs else heading]
    return [p for paragraph in paragraphs for p in split_into_passages(title, paragraph, words_per_passage=words_per_passage)]


# A sentence ends at a word of three letters or more, a number of two digits or more, or a closing bracket, then
# its mark (and closing quotes), and the next word starts with a capital or a digit. An initial ("John F.
# Kennedy") or "c." ends none; an abbreviation of three letters ("Mrs. Smith") may, and then only offers a cut.
_SENTENCE_END = re.compile(r"(?:[^\W\d_]{3,}|\d{2,}|[)\]])[.!?][\"'\u201d\u2019)\]]*$")
_SENTENCE_START = re.compile(r"^[\"'\u201c\u2018(\[]*[^\W_a-z]")


def sentence_ends(words: Sequence[str]) -> list[int]:
    """The positions in `words` where a sentence ends and another begins: the index of each next sentence's first word.

    >>> sentence_ends("Born in 1945. He lived in St. Louis with John F. Kennedy. The end".split())
    [3, 12]
    """
    return [i + 1 for i in range(len(words) - 1)
            if _SENTENCE_END.search(words[i]) and _SENTENCE_START.match(words[i + 1])]


def _rows_from_jsonl(path: Path) -> list[tuple[str, str]]:
    rows = []
    for line_number, record in jsonl_objects(path, shape="an object with a string 'text' (and optionally 'title')"):
        if not isinstance(record.get("text"), str):
            raise InputError(f"{path.name} line {line_number} needs an object with a string 'text' (and optionally 'title')")
        title = record.get("title", "")
        rows.append((title if isinstance(title, str) else str(title), record["text"]))
    return rows


def _rows_from_csv(path: Path) -> list[tuple[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        try:
            if reader.fieldnames is None or "text" not in reader.fieldnames:
                raise InputError(f"{path.name} needs a header row with a 'text' column (and optionally 'title')")
            return [(_cell(row.get("title")), _cell(row.get("text"))) for row in reader]
        except csv.Error as err:
            raise InputError(f"{path.name} is not a readable CSV file (line {reader.line_num}: {err}); check its quoting") from None


def _cell(value: object) -> str:
    """A CSV cell as text; extra cells in a row come as a list under the key None and are not read here."""
    return value if isinstance(value, str) else ""


def read_document_file(path: Path, *, words_per_passage: int = 100) -> list[Passage]:
    """Passages from one .txt/.md file (title = file name) or .jsonl/.csv file (title, text per row)."""
    suffix = path.suffix.lower()
    try:
        if suffix in (".txt", ".md"):
            rows = [(path.stem, path.read_text(encoding="utf-8"))]
        elif suffix == ".jsonl":
            rows = _rows_from_jsonl(path)
        elif suffix == ".csv":
            rows = _rows_from_csv(path)
        else:
            raise InputError(f"{path.name}: unsupported file type; use one of {', '.join(SOURCE_SUFFIXES)}")
    except UnicodeDecodeError:
        raise InputError(f"{path.name} is not UTF-8 text; save it as UTF-8 text") from None
    split = split_running_text if suffix in (".txt", ".md") else split_into_passages  # a row is one unit of text
    return [p for title, text in rows for p in split(title.strip(), text, words_per_passage=words_per_passage)]


def read_source(source: str | Path, *, words_per_passage: int = 100) -> list[Passage]:
    """Passages from a folder of .txt/.md files or from one .txt/.md/.jsonl/.csv file."""
    source = Path(source)
    if not source.exists():
        raise InputError(f"{source} does not exist; give a folder of .txt/.md files or a .jsonl/.csv file")
    files = sorted(p for p in source.rglob("*") if p.suffix.lower() in SOURCE_SUFFIXES) if source.is_dir() else [source]
    passages = [p for path in files for p in read_document_file(path, words_per_passage=words_per_passage)]
    if not passages:
        raise InputError(f"{source} holds no text; add .txt/.md files or rows with a 'text' field")
    return passages


def embeddings_fingerprint(embeddings) -> str:
    """A short content hash of the (N, D) embeddings as float32, read in blocks; caches are keyed by it.

    The same digest as hashing the whole float32 matrix at once, whatever form the rows are in.
    """
    digest = hashlib.sha256(str(tuple(int(d) for d in embeddings.shape)).encode())
    for _, block in row_chunks(embeddings):
        digest.update(np.ascontiguousarray(block, dtype=np.float32).data)
    return digest.hexdigest()[:16]


def unit_rows(embeddings) -> bool:
    """Whether every row has length 1 (within 1e-3): the encoder is a cosine one."""
    return all(bool(np.allclose(np.linalg.norm(np.asarray(block, dtype=np.float32), axis=1), 1.0, atol=1e-3))
               for _, block in row_chunks(embeddings))


@dataclass(frozen=True)
class KnowledgeBase:
    """A loaded KB: passages and their (N, D) embeddings.

    A small KB holds titles and texts as tuples and the embeddings as an in-memory float32 array.
    A large one keeps them on disk: embeddings as a memory-mapped float16/float32 .npy
    (`np.memmap`) or the Arrow column's blocks (`store.BlockRows`), titles and texts as
    `store.ColumnRows`. Either way `embeddings[ids]` reads rows and `titles[row]` one title.
    """

    name: str
    titles: Sequence[str]
    texts: Sequence[str]
    embeddings: np.ndarray | BlockRows  # (N, D)
    encoder: str  # what made the embeddings ("" when unknown)
    normalized: bool  # unit-length embeddings (cosine retrieval)
    fingerprint: str
    path: Path | None = None
    index_file: Path | None = None  # a faiss index that came with the KB (transformers' index_path)

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    @property
    def has_vectors(self) -> bool:
        """False for a KB whose dense vectors are not built yet (`text_only_kb`): BM25 retrieves from it alone."""
        return self.dim > 0

    def passage(self, row: int) -> Passage:
        return Passage(title=self.titles[row], text=self.texts[row])


def text_only_kb(name: str, passages: list[Passage]) -> KnowledgeBase:
    """A KB of passages whose dense vectors are still to come: its embeddings are (N, 0).

    A first start serves one of these with BM25 while the encoder embeds the passages; the
    fingerprint hashes the texts, so nothing cached for the dense KB can be taken for it.
    """
    if len(passages) == 0:
        raise KnowledgeBaseError("a knowledge base needs at least one passage")
    digest = hashlib.sha256(b"text-only")
    for passage in passages:
        digest.update(f"{passage.title}\0{passage.text}\0".encode())
    return KnowledgeBase(name=name, titles=tuple(p.title for p in passages), texts=tuple(p.text for p in passages),
                         embeddings=np.zeros((len(passages), 0), dtype=np.float32), encoder="", normalized=True,
                         fingerprint=digest.hexdigest()[:16])


def make_kb(
    name: str,
    passages: list[Passage],
    embeddings: np.ndarray,
    *,
    encoder: str = "",
    path: Path | None = None,
    index_file: Path | None = None,
) -> KnowledgeBase:
    """An in-memory KB; embeddings (N, D) must line up with passages."""
    embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
    if embeddings.ndim != 2 or embeddings.shape[0] != len(passages):
        raise KnowledgeBaseError(
            f"embeddings have shape {embeddings.shape}, expected ({len(passages)}, dim): one vector per passage"
        )
    if len(passages) == 0:
        raise KnowledgeBaseError("a knowledge base needs at least one passage")
    norms = np.linalg.norm(embeddings, axis=1)
    return KnowledgeBase(
        name=name,
        titles=tuple(p.title for p in passages),
        texts=tuple(p.text for p in passages),
        embeddings=embeddings,
        encoder=encoder,
        normalized=bool(np.allclose(norms, 1.0, atol=1e-3)),
        fingerprint=embeddings_fingerprint(embeddings),
        path=path,
        index_file=index_file,
    )


def save_kb(kb: KnowledgeBase, out_dir: str | Path, *, vectors: str = "arrow") -> Path:
    """Write `kb` with `save_to_disk` plus its meta file, atomically: a half-written folder is never seen.

    vectors="arrow" stores the embeddings as the `embeddings` column (transformers' layout);
    "float16" or "float32" writes them to a memory-mappable `embeddings.npy` instead (`write_kb`).
    """
    if vectors in VECTOR_DTYPES:
        return write_kb(out_dir, name=kb.name, titles=kb.titles, texts=kb.texts,
                        vectors=(block for _, block in row_chunks(kb.embeddings)), dim=kb.dim, dtype=vectors, encoder=kb.encoder)
    if vectors != "arrow":
        raise InputError(f"unknown vector storage {vectors!r}; use arrow, {' or '.join(VECTOR_DTYPES)}")
    from datasets import Dataset

    def write(staging: Path) -> dict:
        dataset = Dataset.from_dict(
            {"title": list(kb.titles), "text": list(kb.texts), "embeddings": np.asarray(kb.embeddings[:], dtype=np.float32).tolist()}
        )
        dataset.save_to_disk(str(staging))
        return {"name": kb.name, "encoder": kb.encoder, "fingerprint": kb.fingerprint, "count": len(kb), "dim": kb.dim}

    return _publish(Path(out_dir), write)


def write_kb(out_dir: str | Path, *, name: str, titles: Sequence[str], texts: Sequence[str], vectors: Iterable[np.ndarray],
             dim: int, dtype: str = "float16", encoder: str = "", bm25: bool = True) -> Path:
    """Write a large KB atomically: titles and texts as a `datasets` dataset, the (N, D) vectors,
    given as consecutive (n_i, D) blocks, streamed into `embeddings.npy` of `dtype` beside it,
    and with `bm25` its BM25 index (`prebuild_bm25`).

    Only one block of vectors is in memory at a time (titles and texts are, as Arrow strings).
    The fingerprint is of the stored (rounded) values, so loading recomputes the same one.
    """
    if dtype not in VECTOR_DTYPES:
        raise InputError(f"vectors are stored as {' or '.join(VECTOR_DTYPES)}, not {dtype!r}")
    if len(titles) != len(texts) or not len(texts):
        raise KnowledgeBaseError(f"a knowledge base needs one title per text and at least one passage "
                                 f"(got {len(titles)} titles, {len(texts)} texts)")
    from datasets import Dataset

    def write(staging: Path) -> dict:
        Dataset.from_dict({"title": [str(t) for t in titles], "text": [str(x) for x in texts]}).save_to_disk(str(staging))
        count = len(texts)
        digest = hashlib.sha256(str((count, int(dim))).encode())
        written, normalized = 0, True
        npy = staging / VECTORS_FILE
        with npy.open("wb") as handle:
            header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (count, int(dim))}
            np.lib.format.write_array_header_1_0(handle, header)
            for block in vectors:
                stored = np.ascontiguousarray(block, dtype=dtype)
                if stored.ndim != 2 or stored.shape[1] != dim or written + len(stored) > count:
                    raise KnowledgeBaseError(f"vector block of shape {stored.shape} does not fit ({count}, {dim})")
                widened = stored.astype(np.float32)
                digest.update(widened.data)
                normalized = normalized and bool(np.allclose(np.linalg.norm(widened, axis=1), 1.0, atol=1e-3))
                handle.write(stored.data)
                written += len(stored)
        if written != count:
            raise KnowledgeBaseError(f"got {written} vectors for {count} passages; give one vector per passage")
        stat = npy.stat()
        if bm25:
            prebuild_bm25(staging, titles, texts, digest.hexdigest()[:16], shown_as=Path(out_dir))
        return {"name": name, "encoder": encoder, "fingerprint": digest.hexdigest()[:16], "count": count, "dim": int(dim),
                "vectors": VECTORS_FILE, "dtype": dtype, "normalized": normalized,
                "vectors_bytes": stat.st_size, "vectors_mtime_ns": stat.st_mtime_ns}

    return _publish(Path(out_dir), write)


def prebuild_bm25(folder: Path, titles: Sequence[str], texts: Sequence[str], fingerprint: str, *,
                  shown_as: Path | None = None) -> bool:
    """Save the KB's BM25 index in its folder, where `lexical.LexicalIndex.for_kb_folder` finds it.

    False, logged with the command that builds it, when the KB passes `lexical.MAX_POSTINGS`:
    writing a KB must not fail for want of its BM25 form. `shown_as` is the folder to name there
    (the KB's final place while it is written into a staging folder).
    """
    from . import lexical

    try:
        lexical.LexicalIndex.for_kb_folder(folder, titles, texts, fingerprint=fingerprint, max_postings=lexical.MAX_POSTINGS)
    except IndexTooLargeError:
        log.warning("%s is saved without its BM25 index: it has more than %s postings (lexical.MAX_POSTINGS), so bm25 "
                    "and hybrid retrieval are off for it until you run `python -m rag_demo build-bm25 %s`",
                    shown_as or folder, f"{lexical.MAX_POSTINGS:,}", shown_as or folder)
        return False
    return True


def _publish(out_dir: Path, write) -> Path:
    """Run `write(staging)` in a fresh folder beside out_dir, add the meta it returns, then rename it into place."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        meta = write(staging)
        (staging / KB_META).write_text(json.dumps(meta, indent=1))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def sibling_index(path: Path) -> Path | None:
    """The faiss file transformers' scripts save beside a dataset folder, named after it
    (`my_knowledge_dataset_hnsw_index.faiss`, `hf_dataset_index.faiss`); None when there is none."""
    found = sorted(p for p in path.parent.glob(f"{glob.escape(path.name)}*.faiss") if p.is_file())
    if len(found) > 1:
        raise KnowledgeBaseError(f"{path} has {len(found)} faiss files beside it ({', '.join(p.name for p in found)}); "
                                 "keep the one that indexes this dataset and move the others away")
    return found[0] if found else None


def kb_folder(path: str | Path) -> Path:
    """`path` as a Path, once it is a folder; else the error that says so (a check that loads nothing)."""
    path = Path(path)
    if not path.is_dir():
        raise KnowledgeBaseError(f"knowledge base folder {path} does not exist; build one with `python -m rag_demo build-kb`")
    return path


def saved_kb_folder(path: str | Path) -> Path:
    """`path`, once it is a folder that `datasets` saved one dataset to (it has the state.json that
    `save_to_disk` writes); else the error that says what it is instead. Reads no data, so a start
    can check a folder before anything is served and load it later."""
    path = kb_folder(path)
    if not (path / "state.json").is_file():
        if (path / "dataset_dict.json").is_file():
            raise KnowledgeBaseError(f"{path} holds a DatasetDict; save a single split (one Dataset) instead")
        raise KnowledgeBaseError(f"{path} is not a knowledge base folder (no state.json, which `save_to_disk` writes); "
                                 "build one with `python -m rag_demo build-kb`")
    return path


def load_kb(path: str | Path, *, name: str | None = None, index_file: str | Path | None = None,
            lazy_from: int = LAZY_ROWS) -> KnowledgeBase:
    """Load a KB folder written by `save_kb` / `write_kb` or by `datasets.Dataset.save_to_disk`.

    `index_file` is a faiss index over the KB's embeddings to search with (transformers'
    `index_path`); a folder without our meta file picks up one saved beside it (`sibling_index`).
    From `lazy_from` passages on, passages and Arrow-stored embeddings are read in place.
    """
    path = kb_folder(path)
    table = saved_table(path)
    if table is None:
        table = _table_via_datasets(path)
    meta_path = path / KB_META
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    npy = path / meta["vectors"] if meta.get("vectors") else None
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names and not (c == "embeddings" and npy)]
    if missing:
        raise KnowledgeBaseError(
            f"{path} lacks column(s) {', '.join(missing)}; a KB needs title, text and embeddings "
            "(build one with `python -m rag_demo build-kb`)"
        )
    if index_file is not None:
        index_file = Path(index_file).expanduser()
        if not index_file.is_file():
            raise KnowledgeBaseError(f"index file {index_file} does not exist; save one with `dataset.get_index('embeddings').save(path)`")
    elif not meta:
        index_file = sibling_index(path)
    name = name or meta.get("name") or path.name
    lazy = table.num_rows >= lazy_from
    if npy is None and not lazy:  # the default KBs: everything in memory, as always
        # straight from the Arrow buffers: datasets' numpy format converts row by row (about 2 s per default KB)
        embeddings = np.concatenate([np.asarray(block, dtype=np.float32) for block in _arrow_vectors(path, table).blocks])
        titles, texts = table.column("title").to_pylist(), table.column("text").to_pylist()
        passages = [Passage(title=str(t or ""), text=str(x or "")) for t, x in zip(titles, texts)]
        kb = make_kb(name, passages, embeddings, encoder=meta.get("encoder", ""), path=path, index_file=index_file)
    else:
        embeddings, fingerprint, normalized = _disk_vectors(path, table, npy, meta)
        if lazy:
            titles, texts = ColumnRows(table.column("title")), ColumnRows(table.column("text"))
        else:
            titles = tuple(str(t or "") for t in table.column("title").to_pylist())
            texts = tuple(str(x or "") for x in table.column("text").to_pylist())
        kb = KnowledgeBase(name=name, titles=titles, texts=texts, embeddings=embeddings, encoder=meta.get("encoder", ""),
                           normalized=normalized, fingerprint=fingerprint, path=path, index_file=index_file)
    if meta.get("fingerprint") and meta["fingerprint"] != kb.fingerprint:
        raise KnowledgeBaseError(f"{path} changed since it was built (fingerprint mismatch); rebuild it")
    return kb


def _table_via_datasets(path: Path):
    """The Arrow table of a saved dataset that `store.saved_table` does not read, through `datasets`."""
    from datasets import load_from_disk

    try:
        dataset = load_from_disk(str(path))
    except Exception as err:  # datasets raises several types for a folder it cannot read
        raise KnowledgeBaseError(
            f"{path} is not a saved `datasets` dataset ({type(err).__name__}); rebuild it with `python -m rag_demo build-kb`"
        ) from None
    if hasattr(dataset, "column_names") and isinstance(dataset.column_names, dict):
        raise KnowledgeBaseError(f"{path} holds a DatasetDict; save a single split (one Dataset) instead")
    return dataset.data


def _arrow_vectors(path: Path, table) -> BlockRows:
    """The `embeddings` column's (N, D) rows, read in place from the Arrow buffers."""
    try:
        return arrow_rows(table.column("embeddings"))
    except ValueError as err:
        raise KnowledgeBaseError(f"{path}: {err}; every passage needs one vector of the same length") from None


def _disk_vectors(path: Path, table, npy: Path | None, meta: dict) -> tuple[np.ndarray | BlockRows, str, bool]:
    """(embeddings read in place, fingerprint, normalized) of a KB on disk."""
    if npy is None:
        embeddings = _arrow_vectors(path, table)
        return embeddings, embeddings_fingerprint(embeddings), unit_rows(embeddings)
    if not npy.is_file():
        raise KnowledgeBaseError(f"{path} lacks its vectors file {npy.name}; rebuild the KB")
    try:
        embeddings = np.load(npy, mmap_mode="r")
    except (OSError, ValueError) as err:
        raise KnowledgeBaseError(f"{npy} is not a readable .npy file ({err}); rebuild the KB") from None
    if embeddings.ndim != 2 or len(embeddings) != table.num_rows or embeddings.dtype.name not in VECTOR_DTYPES:
        raise KnowledgeBaseError(f"{npy} holds {embeddings.dtype} {embeddings.shape}, expected float16/float32 "
                                 f"({table.num_rows}, dim): one vector per passage; rebuild the KB")
    stat = npy.stat()
    if (meta.get("fingerprint") and "normalized" in meta and meta.get("vectors_bytes") == stat.st_size
            and meta.get("vectors_mtime_ns") == stat.st_mtime_ns):
        # the file is as written: re-hashing a 21M x 768 file would cost minutes at every start
        return embeddings, meta["fingerprint"], bool(meta["normalized"])
    return embeddings, embeddings_fingerprint(embeddings), unit_rows(embeddings)


ARTICLE_SCAN = 30  # rows looked at on each side of a passage for the rest of its article


def part_of_article(titles: Sequence[str], row: int) -> tuple[int, int]:
    """(part, parts): which of the neighbouring rows that share `row`'s title it is, 1-based, and how many there are
    (an article cut into passages sits in consecutive rows); (0, 0) for an untitled passage or a title of one row.
    At most ARTICLE_SCAN rows are read on each side.

    >>> titles = ["Mars", "Moon", "Moon", "Moon", "", ""]
    >>> part_of_article(titles, 2), part_of_article(titles, 0), part_of_article(titles, 4)
    ((2, 3), (0, 0), (0, 0))
    """
    title = titles[row]
    if not title.strip():
        return 0, 0
    first = row
    while first > 0 and row - first < ARTICLE_SCAN and titles[first - 1] == title:
        first -= 1
    last = row
    while last + 1 < len(titles) and last - row < ARTICLE_SCAN and titles[last + 1] == title:
        last += 1
    return (row - first + 1, last - first + 1) if last > first else (0, 0)

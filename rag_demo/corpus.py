"""Passages and knowledge bases.

A knowledge base (KB) is a `datasets` dataset saved with `save_to_disk`, with columns
`title`, `text`, `embeddings` (the layout transformers' RagRetriever reads for a custom
index), plus a small `rag_demo_kb.json` that records how the embeddings were made.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import InputError, KnowledgeBaseError

log = logging.getLogger(__name__)

KB_META = "rag_demo_kb.json"
REQUIRED_COLUMNS = ("title", "text", "embeddings")
SOURCE_SUFFIXES = (".txt", ".md", ".jsonl", ".csv")



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


def split_into_passages(title: str, text: str, *, words_per_passage: int = 100) -> list[Passage]:
    """Split a document into disjoint passages of at most `words_per_passage` words, as DPR does.

    >>> [p.text for p in split_into_passages("T", "a b c d e", words_per_passage=2)]
    ['a b', 'c d', 'e']
    """
    if words_per_passage < 1:
        raise InputError("words_per_passage must be at least 1")
    words = text.split()
    return [
        Passage(title=title, text=" ".join(words[start : start + words_per_passage]))
        for start in range(0, len(words), words_per_passage)
    ]


def _rows_from_jsonl(path: Path) -> list[tuple[str, str]]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{path.name} line {line_number} is not valid JSON ({err.msg}); fix or remove it") from None
            except RecursionError:
                raise InputError(f"{path.name} line {line_number} is nested too deeply; give one flat object per line") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
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
    passages = []
    for title, text in rows:
        passages.extend(split_into_passages(title.strip(), text, words_per_passage=words_per_passage))
    return passages


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


def embeddings_fingerprint(embeddings: np.ndarray) -> str:
    """A short content hash of the (N, D) float32 embedding matrix; caches are keyed by it."""
    matrix = np.ascontiguousarray(embeddings, dtype=np.float32)
    digest = hashlib.sha256(str(matrix.shape).encode())
    digest.update(matrix.tobytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class KnowledgeBase:
    """A loaded KB: passages and their (N, D) float32 embeddings, held in memory."""

    name: str
    titles: tuple[str, ...]
    texts: tuple[str, ...]
    embeddings: np.ndarray  # (N, D) float32
    encoder: str  # what made the embeddings ("" when unknown)
    normalized: bool  # unit-length embeddings (cosine retrieval)
    fingerprint: str
    path: Path | None = None

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    def passage(self, row: int) -> Passage:
        return Passage(title=self.titles[row], text=self.texts[row])


def make_kb(
    name: str,
    passages: list[Passage],
    embeddings: np.ndarray,
    *,
    encoder: str = "",
    path: Path | None = None,
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
    )


def save_kb(kb: KnowledgeBase, out_dir: str | Path) -> Path:
    """Write `kb` with `save_to_disk` plus its meta file, atomically: a half-written folder is never seen."""
    from datasets import Dataset

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        dataset = Dataset.from_dict(
            {"title": list(kb.titles), "text": list(kb.texts), "embeddings": kb.embeddings.tolist()}
        )
        dataset.save_to_disk(str(staging))
        meta = {"name": kb.name, "encoder": kb.encoder, "fingerprint": kb.fingerprint, "count": len(kb), "dim": kb.dim}
        (staging / KB_META).write_text(json.dumps(meta, indent=1))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def load_kb(path: str | Path, *, name: str | None = None) -> KnowledgeBase:
    """Load a KB folder written by `save_kb` or by `datasets.Dataset.save_to_disk`."""
    path = Path(path)
    if not path.is_dir():
        raise KnowledgeBaseError(f"knowledge base folder {path} does not exist; build one with `python -m rag_demo build-kb`")
    from datasets import load_from_disk

    try:
        dataset = load_from_disk(str(path))
    except Exception as err:  # datasets raises several types for a folder it cannot read
        raise KnowledgeBaseError(
            f"{path} is not a saved `datasets` dataset ({type(err).__name__}); rebuild it with `python -m rag_demo build-kb`"
        ) from None
    if hasattr(dataset, "column_names") and isinstance(dataset.column_names, dict):
        raise KnowledgeBaseError(f"{path} holds a DatasetDict; save a single split (one Dataset) instead")
    missing = [c for c in REQUIRED_COLUMNS if c not in dataset.column_names]
    if missing:
        raise KnowledgeBaseError(
            f"{path} lacks column(s) {', '.join(missing)}; a KB needs title, text and embeddings "
            "(build one with `python -m rag_demo build-kb`)"
        )
    meta_path = path / KB_META
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    table = dataset.with_format("numpy", columns=["embeddings"], dtype="float32")
    embeddings = np.asarray(table["embeddings"], dtype=np.float32)
    if embeddings.ndim != 2:
        raise KnowledgeBaseError(f"{path}: embeddings must all have the same length")
    passages = [Passage(title=str(t or ""), text=str(x or "")) for t, x in zip(dataset["title"], dataset["text"])]
    kb = make_kb(name or meta.get("name") or path.name, passages, embeddings, encoder=meta.get("encoder", ""), path=path)
    if meta.get("fingerprint") and meta["fingerprint"] != kb.fingerprint:
        raise KnowledgeBaseError(f"{path} changed since it was built (fingerprint mismatch); rebuild it")
    return kb

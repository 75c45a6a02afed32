"""Building a faiss index over a KB's vectors block by block, with progress, resumable.

A KB kept on disk (`store`) is read `store.CHUNK_ROWS` rows at a time, each block widened to
float32 on its own, so the build never holds an (N, D) float32 copy; IVF-PQ is trained first on
a seeded sample of rows (`training_rows`). After each block `progress(done, total)` hears how
many rows are in. Given a `Checkpoint`, the index so far is saved beside its final file now and
then, and the next build of the same KB with the same parameters goes on from there: an HNSW
build of a million rows stopped at 90% costs the last 10% again, not all of it.

A resumed build makes the index an uninterrupted one makes, byte for byte under one faiss
thread: blocks start at the same rows, IVF-PQ's codes depend only on its trained quantizers, and
HNSW's level generator, which a faiss file does not keep, is advanced past the rows already in.
(With several threads HNSW's graph depends on their timing, resumed or not.)
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import INDEX_KINDS, IndexConfig
from .corpus import sha256_file
from ..errors import InputError
from .store import CHUNK_ROWS, gather_rows, in_memory, row_chunks

log = logging.getLogger(__name__)

CHECKPOINT_SECONDS = 120.0  # adding time between checkpoints: an HNSW checkpoint rewrites every row added so far


FAISS_POINTS_PER_CENTROID = 39  # faiss's advice for k-means training


def _default_nlist(n: int) -> int:
    # more lists make search cheaper
    return max(1, min(int(4 * math.sqrt(n)), n // FAISS_POINTS_PER_CENTROID))


def _pq_subquantizers(dim: int, wanted: int | None) -> int:
    target = wanted or max(1, dim // 4)
    return max(m for m in range(1, target + 1) if dim % m == 0)


def training_rows(n: int, nlist: int, wanted: int | None, *, seed: int = 0) -> np.ndarray | None:
    """Row ids (sorted) to train IVF-PQ on, or None for all n rows.

    faiss itself trains on at most 256 points per list and samples the rest away, but only after
    it was handed every row as one float32 matrix; drawing the sample first keeps a KB on disk
    from being copied whole. Sorted ids read a memory-mapped file front to back.

    >>> training_rows(100, 2, None) is None, training_rows(100, 2, 10).tolist()
    (True, [1, 3, 7, 17, 25, 29, 47, 58, 77, 81])
    """
    cap = wanted if wanted is not None else 256 * nlist
    if n <= cap:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, size=cap, replace=False))


def apply_search_params(kind: str, index, config: IndexConfig) -> None:
    if kind == "hnsw":
        index.hnsw.efSearch = config.hnsw_ef_search
    elif kind == "ivfpq":
        index.nprobe = min(config.ivf_nprobe, index.nlist)


def empty_index(kind: str, n: int, dim: int, config: IndexConfig):
    """An empty (untrained) faiss index of `kind` (inner product) for n rows of dim D."""
    import faiss

    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
        return index
    if kind == "ivfpq":
        nlist = config.ivf_nlist or _default_nlist(n)
        trainable_centroids = n // FAISS_POINTS_PER_CENTROID
        bits = 8 if trainable_centroids >= 256 else max(1, min(8, int(math.log2(max(trainable_centroids, 2)))))
        index = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, _pq_subquantizers(dim, config.pq_bytes), bits,
                                 faiss.METRIC_INNER_PRODUCT)
        advised = FAISS_POINTS_PER_CENTROID * max(nlist, 2 ** bits)
        if n < advised:
            # faiss would print its advice to stderr once per subquantizer, ~100 lines no log level can quiet;
            # it changes nothing trained, and the Index variants table says what so few vectors show
            index.cp.min_points_per_centroid = index.pq.cp.min_points_per_centroid = 1
            log.info("IVF-PQ over %d vectors: faiss advises at least %d for its codebooks", n, advised)
        return index
    raise InputError(f"unknown index {kind!r}; choose one of {', '.join(INDEX_KINDS)}")


def _train(kind: str, index, xb, config: IndexConfig) -> None:
    if kind != "ivfpq":
        return
    n = xb.shape[0]
    whole = in_memory(xb)
    # in-memory rows go to faiss whole, as they always did, unless a sample size is set
    sample = None if (whole and config.ivf_train_rows is None) else training_rows(n, index.nlist, config.ivf_train_rows)
    if sample is None and whole:
        index.train(xb)
    else:
        index.train(gather_rows(xb, np.arange(n) if sample is None else sample))


@dataclass(frozen=True)
class Checkpoint:
    """Where a build of `path` (the final index file) keeps the index so far, and what it must match.

    `<path>.partial` is the faiss index with its first rows added; `<path>.partial.json` says how
    many, for which KB (`fingerprint`) and index parameters (`params`), and the partial file's
    size and sha256 (faiss reads a file with a flipped byte without complaint, and the build
    would carry it into the final index). Both are written to a temporary file and renamed into place.
    """

    path: Path
    fingerprint: str
    params: str
    every_seconds: float = CHECKPOINT_SECONDS

    @property
    def partial(self) -> Path:
        return self.path.with_name(self.path.name + ".partial")

    @property
    def meta(self) -> Path:
        return self.path.with_name(self.path.name + ".partial.json")

    def _expected(self, kind: str, n: int, dim: int, block_rows: int) -> dict:
        return {"kind": kind, "fingerprint": self.fingerprint, "params": self.params, "total": n, "dim": dim,
                "block_rows": block_rows}

    def resume(self, kind: str, n: int, dim: int, block_rows: int) -> tuple[object, int] | None:
        """(index, rows added) from a checkpoint of this build; None when there is none.

        One that belongs to another KB or parameters, or is damaged, is removed (logged)."""
        if not self.meta.is_file() and not self.partial.is_file():
            return None
        import faiss

        try:
            meta = json.loads(self.meta.read_text())
            differs = [key for key, value in self._expected(kind, n, dim, block_rows).items() if meta.get(key) != value]
            if differs:
                raise ValueError(f"it was made with another {', '.join(differs)}")
            rows = meta["rows"]
            if not (isinstance(rows, int) and 0 < rows < n and rows % block_rows == 0):
                raise ValueError(f"it records {rows!r} rows added")
            if meta.get("bytes") != self.partial.stat().st_size:
                raise ValueError("its index file's size differs from the recorded size")
            if meta.get("sha256") != sha256_file(self.partial):
                raise ValueError("its index file differs from the recorded sha256")
            index = faiss.read_index(str(self.partial))  # read, not mapped: the build adds to it
            if index.ntotal != rows or index.d != dim or not index.is_trained:
                raise ValueError(f"its index holds {index.ntotal} rows of dim {index.d}, not {rows} of {dim}")
        except (OSError, ValueError, RuntimeError, KeyError, TypeError, AttributeError) as err:  # bad JSON: ValueError
            log.warning("the checkpoint of %s is not resumable (%s); removing it and building from the start",
                        self.path.name, _first_line(err))
            self.discard()
            return None
        if kind == "hnsw":
            for _ in range(rows):  # the levels of the rows to come are the ones an uninterrupted build draws
                index.hnsw.random_level()
        log.info("resuming the %s build of %s at row %d of %d", kind, self.path.name, rows, n)
        return index, rows

    def save(self, index, rows: int, kind: str, n: int, dim: int, block_rows: int) -> None:
        """Write the index so far and its record; raises OSError or RuntimeError (faiss) when it cannot."""
        import faiss

        self.path.parent.mkdir(parents=True, exist_ok=True)
        staged = []
        try:
            handle, tmp = tempfile.mkstemp(prefix=f".{self.partial.name}.", dir=self.path.parent)
            os.close(handle)
            staged.append(tmp)
            faiss.write_index(index, tmp)
            written = {"rows": rows, "bytes": os.path.getsize(tmp), "sha256": sha256_file(Path(tmp))}
            record = self._expected(kind, n, dim, block_rows) | written
            handle, tmp_meta = tempfile.mkstemp(prefix=f".{self.meta.name}.", dir=self.path.parent)
            staged.append(tmp_meta)
            with os.fdopen(handle, "w") as out:
                out.write(json.dumps(record))
            # the index first: a record that outlives its index's replacement no longer matches its size
            os.replace(tmp, self.partial)
            os.replace(tmp_meta, self.meta)
        finally:
            for leftover in staged:
                Path(leftover).unlink(missing_ok=True)

    def discard(self) -> None:
        for path in (self.meta, self.partial):
            try:
                path.unlink(missing_ok=True)
            except OSError as err:
                log.warning("could not remove %s (%s)", path, err)


def _first_line(err: Exception) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0][:200]


def build_faiss(kind: str, xb, config: IndexConfig, *, progress: Callable[[int, int], None] | None = None,
                checkpoint: Checkpoint | None = None, block_rows: int | None = None):
    """Build a faiss index of `kind` over (N, D) vectors (inner product), block by block.

    `progress(done, total)` is called with the rows added: once before the first block (0, or
    where a checkpoint left off) and after each. With `checkpoint`, the index so far is saved
    at most every `checkpoint.every_seconds` of adding, and a build it left is resumed. An
    in-memory float32 matrix is added to HNSW in one call, as it always was: HNSW's graph depends
    on how rows are batched; such a build is neither checkpointed nor resumed.
    """
    n, dim = xb.shape
    block_rows = block_rows or CHUNK_ROWS  # read when called: a checkpoint names the block size it was made with
    if in_memory(xb) and kind == "hnsw":
        index = empty_index(kind, n, dim, config)
        if progress is not None:
            progress(0, n)
        index.add(xb)
        if progress is not None:
            progress(n, n)
        apply_search_params(kind, index, config)
        return index
    resumed = checkpoint.resume(kind, n, dim, block_rows) if checkpoint is not None else None
    if resumed is not None:
        index, start = resumed
    else:
        index, start = empty_index(kind, n, dim, config), 0
        _train(kind, index, xb, config)
    if progress is not None:
        progress(start, n)
    last_saved = time.monotonic()
    for begin, block in row_chunks(xb, block_rows, start=start):
        index.add(np.ascontiguousarray(block, dtype=np.float32))
        done = begin + len(block)
        if checkpoint is not None and done < n and time.monotonic() - last_saved >= checkpoint.every_seconds:
            try:
                checkpoint.save(index, done, kind, n, dim, block_rows)
            except (OSError, RuntimeError) as err:  # faiss reports a failed write as a RuntimeError
                log.warning("could not save a checkpoint of the %s build in %s (%s); building on without one",
                            kind, checkpoint.path.parent, _first_line(err))
                checkpoint = None
            last_saved = time.monotonic()
        if progress is not None:
            progress(done, n)
    apply_search_params(kind, index, config)
    return index

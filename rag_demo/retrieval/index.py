"""Maximum inner product search over a KB's passage vectors: exact and approximate variants.

- flat: exact inner product (faiss IndexFlatIP; on CUDA the vectors placed once in float16 on
  every visible GPU, a share each, and scanned with torch matmul + topk).
- hnsw: a graph index (faiss IndexHNSWFlat, inner-product metric) — what transformers' "exact"
  wiki_dpr index really is.
- ivfpq: inverted lists + product quantization (faiss IndexIVFPQ), the paper's compressed index.

Approximate variants are scored by recall@k against flat, which is the oracle. Built indexes
are cached beside the KB, keyed by the KB's fingerprint and the index parameters, and read back
memory-mapped; they are built block by block, with progress and checkpoints that an interrupted
build resumes from (`index_build`). A KB kept on disk (a .npy memmap or an Arrow column, see
`store`) is searched exactly in chunks (`flat.search`), never copied whole; IVF-PQ may re-rank
its candidates with the stored vectors (`IndexConfig.ivf_rerank`). A faiss index that came with a KB (transformers'
format) serves the kind it is, with the search parameters saved in it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..config import INDEX_KINDS, IndexConfig
from .corpus import sha256_file
from ..errors import InputError, KnowledgeBaseError
from .flat import Share, place, rerank, search_placed, share_bounds
from .flat import search as flat_search
from .index_build import CHECKPOINT_SECONDS, Checkpoint, apply_search_params, build_faiss
from ..results import IndexReport
from .store import Workspace, abs_mean, gather_rows, in_memory

log = logging.getLogger(__name__)

RECALL_QUERIES = 200  # passage vectors reused as queries when measuring recall@k
TIMING_SECONDS = 2.0  # latency is the mean over the first of them asked one at a time, at least 3, within about this long


@dataclass
class SearchIndex:
    """One built index. `search(xq, k)` -> (D, I): (B, k) scores and (B, k) row ids (-1: none found)."""

    kind: str
    faiss_index: object | None
    shares: tuple[Share, ...] | None  # flat placed on devices (GPUs; the CPU without faiss)
    build_seconds: float
    nbytes: int
    rows: object | None = None  # the KB's (N, D) vectors: flat searched in chunks, or IVF-PQ re-ranking
    rerank: int = 0  # IVF-PQ candidates re-scored exactly with `rows` (0: the codes' own ranking)
    devices: tuple[torch.device, ...] = (torch.device("cpu"),)  # where flat-in-chunks scores its chunks
    threads: threading.local = field(default_factory=threading.local, repr=False, compare=False)  # .workspace per thread

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        if self.shares is not None:
            return search_placed(xq, self.shares, k)
        if self.faiss_index is None:
            if not hasattr(self.threads, "workspace"):
                self.threads.workspace = Workspace()
            return flat_search(xq, self.rows, k, devices=self.devices, workspace=self.threads.workspace)
        if self.rerank and self.rows is not None:
            _, candidates = self.faiss_index.search(xq, max(k, self.rerank))
            return rerank(xq, candidates, self.rows, k)
        return self.faiss_index.search(xq, k)


@functools.cache
def has_faiss() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def params_key(kind: str, config: IndexConfig) -> str:
    relevant = {"kind": kind, "faiss_index_version": 1}
    if kind == "hnsw":
        relevant |= {"m": config.hnsw_m, "efc": config.hnsw_ef_construction}
    if kind == "ivfpq":
        relevant |= {"nlist": config.ivf_nlist, "pq": config.pq_bytes}
        if config.ivf_train_rows is not None:  # only when set, so the keys of indexes built before stay valid
            relevant |= {"train": config.ivf_train_rows}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:10]


def _serialized_bytes(index) -> int:
    import faiss

    return int(faiss.serialize_index(index).size)


def read_index_mapped(path: str | Path):
    """A faiss index file, memory-mapped where this faiss can map that index type.

    IO_FLAG_MMAP_IFC (faiss >= 1.10) maps flat codes, HNSW storage and IVF lists in place;
    IO_FLAG_MMAP maps the inverted lists of IVF indexes only (older faiss). Types neither can
    map are read with IO_FLAG_READ_ONLY. A mapped index reads its file as it searches, so the
    file must stay in place (caches are replaced by rename, which keeps the old file alive).
    """
    import faiss

    flags = [getattr(faiss, "IO_FLAG_MMAP_IFC", None), faiss.IO_FLAG_MMAP, faiss.IO_FLAG_READ_ONLY]
    last = None
    for flag in [f for f in flags if f is not None]:
        try:
            return faiss.read_index(str(path), flag)
        except RuntimeError as err:
            last = err
    raise last


# faiss file signatures (the first 4 bytes write_index puts down) of the types each kind names
_PREBUILT_KINDS = {b"IxFI": "flat", b"IxF2": "flat", b"IxFl": "flat", b"IHNf": "hnsw", b"IwPQ": "ivfpq"}


def prebuilt_kind(path: Path) -> str | None:
    """The index kind a faiss file serves (flat, hnsw, ivfpq), read from its 4-byte signature;
    None for other index types (they are not used; the KB's own indexes are built instead)."""
    try:
        with Path(path).open("rb") as handle:
            return _PREBUILT_KINDS.get(handle.read(4))
    except OSError:
        return None


def build_index(kind: str, xb, config: IndexConfig, *, device: torch.device | None = None,
                count_bytes: bool = True, progress: Callable[[int, int], None] | None = None,
                checkpoint: Checkpoint | None = None) -> SearchIndex:
    """Build `kind` over xb (N, D). flat on a CUDA device is placed once in float16 on every visible
    GPU (`flat.place`) when their free memory holds it, and otherwise, for a KB on disk (`store`),
    streamed to them in chunks at each search; on the CPU a KB on disk is no copy at all (searched
    in chunks), and without faiss an in-memory KB is placed in float32.
    A faiss index is built block by block (`index_build.build_faiss`: `progress(done, total)` rows
    added, resumable from `checkpoint`). `count_bytes=False` leaves nbytes 0 (serializing a large
    index just to count it doubles memory)."""
    if kind not in INDEX_KINDS:
        raise InputError(f"unknown index {kind!r}; choose one of {', '.join(INDEX_KINDS)}")
    started = time.perf_counter()
    on_gpu = device is not None and device.type == "cuda"
    rerank = config.ivf_rerank if kind == "ivfpq" else 0
    gpus = tuple(torch.device("cuda", i) for i in range(torch.cuda.device_count())) if on_gpu else ()
    if kind == "flat" and gpus:
        free = [torch.cuda.mem_get_info(gpu)[0] for gpu in gpus]
        # stored float16 stays float16; float32 stays float32 where it fits (exact), else is rounded to float16
        dtype = next((d for d in (torch.float32, torch.float16) if d.itemsize <= np.dtype(xb.dtype).itemsize
                      and shares_fit(len(xb), xb.shape[1], free, itemsize=d.itemsize)), None)
        if dtype is not None:
            if dtype.itemsize < np.dtype(xb.dtype).itemsize:
                log.info("flat: %d x %d vectors placed on %d GPU(s) rounded to float16 (float32 does not fit)",
                         len(xb), xb.shape[1], len(gpus))
            shares = place(xb, gpus, dtype=dtype)
            return SearchIndex(kind, None, shares, time.perf_counter() - started, _placed_bytes(shares))
        log.warning("flat: %d x %d vectors do not fit the free memory of %d GPU(s) (%s GB); %s", len(xb), xb.shape[1],
                    len(gpus), ", ".join(f"{f / 2**30:.1f}" for f in free),
                    "streaming them in chunks at each search" if not in_memory(xb) else "searching on the CPU")
    if kind == "flat" and not in_memory(xb):
        devices = gpus if gpus else (torch.device("cpu"),)
        return SearchIndex(kind, None, None, time.perf_counter() - started, _rows_bytes(xb), rows=xb, devices=devices)
    if kind == "flat" and not has_faiss():
        shares = place(xb, (torch.device("cpu"),), dtype=torch.float32)
        return SearchIndex(kind, None, shares, time.perf_counter() - started, _placed_bytes(shares))
    index = build_faiss(kind, xb, config, progress=progress, checkpoint=checkpoint)
    return SearchIndex(kind, index, None, time.perf_counter() - started, _serialized_bytes(index) if count_bytes else 0,
                       rows=xb if rerank else None, rerank=rerank)


def shares_fit(rows: int, dim: int, free_bytes: list[int], *, itemsize: int = 2, headroom: float = 0.1) -> bool:
    """Whether shares of a (rows, dim) matrix of `itemsize`-byte values, cut by `flat.share_bounds`,
    fit devices with `free_bytes` each, leaving `headroom` of each one's free memory for the scans.

    >>> shares_fit(21_000_000, 768, [139 * 2**30]), shares_fit(21_000_000, 768, [20 * 2**30, 20 * 2**30])
    (True, True)
    >>> shares_fit(21_000_000, 768, [20 * 2**30]), shares_fit(21_000_000, 768, [139 * 2**30], itemsize=4)
    (False, True)
    """
    bounds = share_bounds(rows, len(free_bytes))
    return bool(free_bytes) and all((bounds[i + 1] - bounds[i]) * dim * itemsize <= free * (1 - headroom)
                                    for i, free in enumerate(free_bytes))


def _placed_bytes(shares: tuple[Share, ...]) -> int:
    return sum(share.vectors.numel() * share.vectors.element_size() for share in shares)


def _rows_bytes(xb) -> int:
    return int(xb.shape[0] * xb.shape[1] * np.dtype(xb.dtype).itemsize)


def index_cache_paths(kind: str, fingerprint: str, cache_dir: Path, config: IndexConfig) -> tuple[Path, Path]:
    """(index file, its metadata) for `kind` of the KB with this fingerprint under `cache_dir`."""
    stem = f"{kind}-{fingerprint}-{params_key(kind, config)}"
    return cache_dir / f"{stem}.faiss", cache_dir / f"{stem}.json"


def load_prebuilt(kind: str, path: Path, xb, config: IndexConfig) -> SearchIndex:
    """The faiss index that came with a KB (transformers' `index_path`), memory-mapped.

    It keeps the search parameters saved in it (efSearch, nprobe), as transformers' retriever
    does, so both find the same rows. Raises KnowledgeBaseError when it does not fit the KB.
    """
    started = time.perf_counter()
    try:
        index = read_index_mapped(path)
    except RuntimeError as err:
        raise KnowledgeBaseError(f"{path} is not a readable faiss index ({str(err).splitlines()[0][:120]}); "
                                 "rewrite it with `dataset.get_index('embeddings').save(path)`") from None
    if index.ntotal != xb.shape[0] or index.d != xb.shape[1]:
        raise KnowledgeBaseError(f"{path} indexes {index.ntotal} vectors of dim {index.d}, but the KB has "
                                 f"{xb.shape[0]} of dim {xb.shape[1]}; rebuild the index over this dataset")
    rerank = config.ivf_rerank if kind == "ivfpq" else 0
    return SearchIndex(kind, index, None, time.perf_counter() - started, path.stat().st_size,
                       rows=xb if rerank else None, rerank=rerank)


def cached_index(kind: str, xb, fingerprint: str, cache_dir: Path | None, config: IndexConfig,
                 *, device: torch.device | None = None, prebuilt: Path | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 checkpoint_seconds: float = CHECKPOINT_SECONDS) -> SearchIndex:
    """Load `kind` from `cache_dir` when it was built for this KB fingerprint, else build and save it.

    `prebuilt`, a faiss file that came with the KB, is used when it is of this kind. A cache file
    that cannot be read, or whose size or sha256 differs from what was recorded when it was
    written, is rebuilt (logged); a cache folder that cannot be written only costs the rebuild
    next time (logged), never the answer. Cached indexes are read back memory-mapped.

    A build reports `progress(done, total)` rows added and, every `checkpoint_seconds` of adding,
    saves the index so far beside the final file (`index_build.Checkpoint`); an interrupted build
    goes on from its checkpoint next time, and the checkpoint is removed once the index is saved.
    """
    if prebuilt is not None and prebuilt_kind(prebuilt) == kind:
        return load_prebuilt(kind, prebuilt, xb, config)
    if prebuilt is not None and prebuilt_kind(prebuilt) is None:
        log.warning("%s is a faiss index type that is none of %s; the KB's own %s index is used instead",
                    prebuilt, ", ".join(INDEX_KINDS), kind)
    if kind == "flat" or cache_dir is None:
        return build_index(kind, xb, config, device=device, progress=progress)
    import faiss

    path, meta_path = index_cache_paths(kind, fingerprint, cache_dir, config)
    stem = path.stem
    rerank = config.ivf_rerank if kind == "ivfpq" else 0
    if path.is_file() and meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            if meta.get("bytes") != path.stat().st_size:
                raise ValueError("size differs from the recorded size")
            if meta.get("sha256") != sha256_file(path):
                raise ValueError("content differs from the recorded sha256")
            index = read_index_mapped(path)
            if index.ntotal != xb.shape[0] or index.d != xb.shape[1]:
                raise ValueError("vector count or dimension differs from the KB")
            apply_search_params(kind, index, config)
            return SearchIndex(kind, index, None, float(meta["build_seconds"]), int(meta["bytes"]),
                               rows=xb if rerank else None, rerank=rerank)
        except (ValueError, RuntimeError, KeyError, json.JSONDecodeError) as err:
            log.warning("cached %s index at %s is unusable (%s); rebuilding it", kind, path, err)
    checkpoint = Checkpoint(path, fingerprint, params_key(kind, config), every_seconds=checkpoint_seconds)
    built = build_index(kind, xb, config, count_bytes=False, progress=progress, checkpoint=checkpoint)
    tmp = None
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=f".{stem}.", dir=cache_dir)
        os.close(handle)
        faiss.write_index(built.faiss_index, tmp)
        size, digest = os.path.getsize(tmp), sha256_file(Path(tmp))
        os.replace(tmp, path)
        meta_path.write_text(json.dumps({"build_seconds": built.build_seconds, "bytes": size, "sha256": digest, "kind": kind}))
        built.nbytes = size
        checkpoint.discard()
    except (OSError, RuntimeError) as err:  # faiss reports a failed write as a RuntimeError
        log.warning("could not cache the %s index in %s (%s); it will be rebuilt next start", kind, cache_dir, err)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        built.nbytes = _serialized_bytes(built.faiss_index)
    return built


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean fraction of the exact top-k ids that the approximate search returned. (B, k), (B, k)."""
    hits = [len(set(a[a >= 0].tolist()) & set(e.tolist())) for a, e in zip(found, exact)]
    return float(np.mean(hits) / exact.shape[1])


def measure(index: SearchIndex, flat: SearchIndex, xb, *, k: int = 10, queries: int = RECALL_QUERIES) -> IndexReport:
    """Recall@k against flat and mean query latency, using KB vectors (plus noise) as queries."""
    rng = np.random.default_rng(0)
    rows = rng.choice(xb.shape[0], size=min(queries, xb.shape[0]), replace=False)
    xq = gather_rows(xb, rows) + rng.normal(scale=0.05 * float(abs_mean(xb) + 1e-6), size=(len(rows), xb.shape[1])).astype(np.float32)
    k = min(k, xb.shape[0])
    _, exact = flat.search(xq, k)
    started, timed = time.perf_counter(), 0
    for row in xq:
        index.search(row[None], k)
        timed += 1
        if timed >= 3 and time.perf_counter() - started > TIMING_SECONDS:  # exact search over millions: 1.5 s a question
            break
    query_ms = (time.perf_counter() - started) * 1000 / timed
    _, found = index.search(xq, k)
    return IndexReport(
        kind=index.kind,
        build_seconds=index.build_seconds,
        bytes=index.nbytes,
        recall_at_k=recall_at_k(found, exact),
        recall_k=k,
        query_ms=query_ms,
        num_vectors=int(xb.shape[0]),
    )


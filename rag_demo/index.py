"""Maximum inner product search over a KB's passage vectors: exact and approximate variants.

- flat: exact inner product (faiss IndexFlatIP; on CUDA a torch matmul + topk on the GPU).
- hnsw: a graph index (faiss IndexHNSWFlat, inner-product metric) — what transformers' "exact"
  wiki_dpr index really is.
- ivfpq: inverted lists + product quantization (faiss IndexIVFPQ), the paper's compressed index.

Approximate variants are scored by recall@k against flat, which is the oracle. Built indexes
are cached beside the KB, keyed by the KB's fingerprint and the index parameters.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .config import INDEX_KINDS, IndexConfig
from .corpus import sha256_file
from .errors import InputError
from .results import IndexReport

log = logging.getLogger(__name__)

RECALL_QUERIES = 200  # passage vectors reused as queries when measuring recall@k


@dataclass
class SearchIndex:
    """One built index. `search(xq, k)` -> (D, I): (B, k) scores and (B, k) row ids."""

    kind: str
    faiss_index: object | None
    vectors: torch.Tensor | None  # flat on torch (GPU): (N, D)
    build_seconds: float
    nbytes: int

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        xq = np.ascontiguousarray(xq, dtype=np.float32)
        if self.vectors is not None:
            scores, ids = torch_topk(torch.from_numpy(xq).to(self.vectors.device), self.vectors, k)
            return scores.float().cpu().numpy(), ids.cpu().numpy()
        return self.faiss_index.search(xq, k)


def torch_topk(xq: torch.Tensor, xb: torch.Tensor, k: int, *, chunk_rows: int = 1 << 22) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact MIPS with matmuls: xq (B, D), xb (N, D) -> scores (B, k), ids (B, k).

    xb is read in chunks of `chunk_rows` rows; each chunk keeps its own top k and the best k of
    those win, so the (B, N) score matrix never exists whole (21M rows x 32 queries would be 1.3 GB).
    """
    xq = xq.to(xb.dtype)
    kept_scores, kept_ids = [], []
    for start in range(0, xb.shape[0], chunk_rows):
        scores = xq @ xb[start : start + chunk_rows].T  # (B, n)
        top, ids = scores.topk(min(k, scores.shape[1]), dim=1)
        kept_scores.append(top)
        kept_ids.append(ids + start)
    if len(kept_scores) == 1:
        return kept_scores[0], kept_ids[0]
    scores, ids = torch.cat(kept_scores, dim=1), torch.cat(kept_ids, dim=1)  # (B, chunks * k)
    top, order = scores.topk(min(k, scores.shape[1]), dim=1)
    return top, ids.gather(1, order)


@functools.cache
def has_faiss() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def _default_nlist(n: int) -> int:
    # faiss wants about 39 training points per centroid; more lists make search cheaper
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


def _pq_subquantizers(dim: int, wanted: int | None) -> int:
    target = wanted or max(1, dim // 4)
    return max(m for m in range(1, target + 1) if dim % m == 0)


def params_key(kind: str, config: IndexConfig) -> str:
    relevant = {"kind": kind, "faiss_index_version": 1}
    if kind == "hnsw":
        relevant |= {"m": config.hnsw_m, "efc": config.hnsw_ef_construction}
    if kind == "ivfpq":
        relevant |= {"nlist": config.ivf_nlist, "pq": config.pq_bytes}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:10]


def build_faiss(kind: str, xb: np.ndarray, config: IndexConfig):
    """Build a faiss index of `kind` over (N, D) float32 vectors (inner product)."""
    import faiss

    n, dim = xb.shape
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
    elif kind == "ivfpq":
        nlist = config.ivf_nlist or _default_nlist(n)
        quantizer = faiss.IndexFlatIP(dim)
        bits = 8 if n >= 256 * 39 else max(1, min(8, int(math.log2(max(n // 39, 2)))))
        index = faiss.IndexIVFPQ(quantizer, dim, nlist, _pq_subquantizers(dim, config.pq_bytes), bits, faiss.METRIC_INNER_PRODUCT)
        index.train(xb)
    else:
        raise InputError(f"unknown index {kind!r}; choose one of {', '.join(INDEX_KINDS)}")
    index.add(xb)
    apply_search_params(kind, index, config)
    return index


def apply_search_params(kind: str, index, config: IndexConfig) -> None:
    if kind == "hnsw":
        index.hnsw.efSearch = config.hnsw_ef_search
    elif kind == "ivfpq":
        index.nprobe = min(config.ivf_nprobe, index.nlist)


def _serialized_bytes(index) -> int:
    import faiss

    return int(faiss.serialize_index(index).size)


def build_index(kind: str, xb: np.ndarray, config: IndexConfig, *, device: torch.device | None = None) -> SearchIndex:
    """Build `kind` over xb (N, D). flat on a CUDA device is an fp16 torch matrix on the GPU (and a
    float32 torch matrix on the CPU when faiss is not installed)."""
    if kind not in INDEX_KINDS:
        raise InputError(f"unknown index {kind!r}; choose one of {', '.join(INDEX_KINDS)}")
    started = time.perf_counter()
    on_gpu = device is not None and device.type == "cuda"
    if kind == "flat" and (on_gpu or not has_faiss()):
        vectors = torch.from_numpy(np.ascontiguousarray(xb)).to(device if on_gpu else "cpu", torch.float16 if on_gpu else torch.float32)
        return SearchIndex(kind, None, vectors, time.perf_counter() - started, vectors.numel() * vectors.element_size())
    index = build_faiss(kind, np.ascontiguousarray(xb, dtype=np.float32), config)
    return SearchIndex(kind, index, None, time.perf_counter() - started, _serialized_bytes(index))


def index_cache_paths(kind: str, fingerprint: str, cache_dir: Path, config: IndexConfig) -> tuple[Path, Path]:
    """(index file, its metadata) for `kind` of the KB with this fingerprint under `cache_dir`."""
    stem = f"{kind}-{fingerprint}-{params_key(kind, config)}"
    return cache_dir / f"{stem}.faiss", cache_dir / f"{stem}.json"


def cached_index(kind: str, xb: np.ndarray, fingerprint: str, cache_dir: Path | None, config: IndexConfig,
                 *, device: torch.device | None = None) -> SearchIndex:
    """Load `kind` from `cache_dir` when it was built for this KB fingerprint, else build and save it.

    A cache file that cannot be read, or whose size or sha256 differs from what was recorded
    when it was written, is rebuilt (logged); a cache folder that cannot be written only costs
    the rebuild next time (logged), never the answer.
    """
    if kind == "flat" or cache_dir is None:
        return build_index(kind, xb, config, device=device)
    import faiss

    path, meta_path = index_cache_paths(kind, fingerprint, cache_dir, config)
    stem = path.stem
    if path.is_file() and meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            if meta.get("bytes") != path.stat().st_size:
                raise ValueError("size differs from the recorded size")
            if meta.get("sha256") != sha256_file(path):
                raise ValueError("content differs from the recorded sha256")
            index = faiss.read_index(str(path))
            if index.ntotal != xb.shape[0] or index.d != xb.shape[1]:
                raise ValueError("vector count or dimension differs from the KB")
            apply_search_params(kind, index, config)
            return SearchIndex(kind, index, None, float(meta["build_seconds"]), _serialized_bytes(index))
        except (ValueError, RuntimeError, KeyError, json.JSONDecodeError) as err:
            log.warning("cached %s index at %s is unusable (%s); rebuilding it", kind, path, err)
    built = build_index(kind, xb, config)
    tmp = None
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=f".{stem}.", dir=cache_dir)
        os.close(handle)
        faiss.write_index(built.faiss_index, tmp)
        size, digest = os.path.getsize(tmp), sha256_file(Path(tmp))
        os.replace(tmp, path)
        meta_path.write_text(json.dumps({"build_seconds": built.build_seconds, "bytes": size, "sha256": digest, "kind": kind}))
    except (OSError, RuntimeError) as err:  # faiss reports a failed write as a RuntimeError
        log.warning("could not cache the %s index in %s (%s); it will be rebuilt next start", kind, cache_dir, err)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return built


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean fraction of the exact top-k ids that the approximate search returned. (B, k), (B, k)."""
    hits = [len(set(a[a >= 0].tolist()) & set(e.tolist())) for a, e in zip(found, exact)]
    return float(np.mean(hits) / exact.shape[1])


def measure(index: SearchIndex, flat: SearchIndex, xb: np.ndarray, *, k: int = 10, queries: int = RECALL_QUERIES) -> IndexReport:
    """Recall@k against flat and mean query latency, using KB vectors (plus noise) as queries."""
    rng = np.random.default_rng(0)
    rows = rng.choice(xb.shape[0], size=min(queries, xb.shape[0]), replace=False)
    xq = xb[rows] + rng.normal(scale=0.05 * float(np.abs(xb).mean() + 1e-6), size=(len(rows), xb.shape[1])).astype(np.float32)
    k = min(k, xb.shape[0])
    _, exact = flat.search(xq, k)
    started = time.perf_counter()
    for row in xq:
        index.search(row[None], k)
    query_ms = (time.perf_counter() - started) * 1000 / len(xq)
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


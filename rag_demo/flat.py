"""Exact maximum inner product search in chunks, with a deterministic top-k merge.

The passage matrix xb (N, D) is never copied whole: it is read `chunk_rows` rows at a time
(`store.row_chunks`), each chunk is scored in float32 on a device chosen by argument, keeps its
own best k, and the running best k of all chunks seen so far is kept (`merge_topk`). With several
CUDA devices the chunks go round-robin to them. Equal scores are ordered by row id, so the same
question gives the same rows whatever the chunk size or the devices.

Names follow faiss: xq (B, D) queries, xb (N, D) passages, k, D scores and I row ids.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

from .store import CHUNK_ROWS, Workspace, gather_rows, in_memory, row_chunks

CPU = torch.device("cpu")


def chunk_topk(xq: torch.Tensor, chunk: torch.Tensor, k: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The best k rows of one chunk: xq (B, D), chunk (n, D) float32 on one device ->
    scores (B, min(k, n)) float32 and row ids (B, min(k, n)) int64 (chunk rows + offset).

    Where the k-th score is shared by rows past the cut, the lowest row ids are kept.

    >>> scores, ids = chunk_topk(torch.ones(1, 2), torch.tensor([[1., 0.], [2., 0.], [1., 0.]]), 2, offset=10)
    >>> scores.tolist(), ids.tolist()
    ([[2.0, 1.0]], [[11, 10]])
    """
    scores = xq @ chunk.T  # (B, n)
    k = min(k, scores.shape[1])
    top, ids = scores.topk(k, dim=1)  # (B, k); which of several equal rows topk keeps is unspecified
    tied = (scores >= top[:, -1:]).sum(dim=1) > k  # (B,) rows whose cut falls inside a run of equal scores
    if tied.any():
        # rare: a stable sort keeps equal scores in row order, so the lowest ids come first
        order = torch.sort(scores[tied], dim=1, descending=True, stable=True).indices[:, :k]
        ids[tied] = order
        top[tied] = scores[tied].gather(1, order)
    return top, ids + offset


def merge_topk(scores: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The best k of candidate lists: scores (B, M), ids (B, M) -> (B, min(k, M)) each, by score
    descending, equal scores by row id ascending (padding, id -1 with score -inf, comes last).

    >>> s, i = merge_topk(torch.tensor([[1., 3., 3., 2.]]), torch.tensor([[4, 9, 7, 1]]), 3)
    >>> s.tolist(), i.tolist()
    ([[3.0, 3.0, 2.0]], [[7, 9, 1]])
    """
    by_id = torch.argsort(torch.where(ids < 0, torch.iinfo(torch.int64).max, ids), dim=1, stable=True)  # (B, M)
    scores, ids = scores.gather(1, by_id), ids.gather(1, by_id)
    by_score = torch.argsort(scores, dim=1, descending=True, stable=True)[:, :k]  # (B, k)
    return scores.gather(1, by_score), ids.gather(1, by_score)


def pad_topk(scores: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Widen (B, m) results to (B, k) with score -inf and id -1, as faiss reports missing rows."""
    missing = k - scores.shape[1]
    if missing <= 0:
        return scores, ids
    b = scores.shape[0]
    return (torch.cat([scores, torch.full((b, missing), -float("inf"), dtype=scores.dtype, device=scores.device)], dim=1),
            torch.cat([ids, torch.full((b, missing), -1, dtype=ids.dtype, device=ids.device)], dim=1))


def _as_tensor(block: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():  # a read-only mapped block: torch only reads it here
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(block)


def _on_device(block: np.ndarray, device: torch.device, buffer: torch.Tensor | None) -> torch.Tensor:
    """One chunk as float32 on `device`. On the CPU a float16 chunk is widened into `buffer`
    (reused: a fresh 50 MB tensor per chunk costs more in page faults than the widening);
    to a GPU it travels in its stored dtype (half the bytes) and is widened there."""
    tensor = _as_tensor(block)
    if device.type == "cpu":
        if tensor.dtype == torch.float32:
            return tensor
        out = buffer[: len(block)]
        out.copy_(tensor)
        return out
    return tensor.to(device).float()


def search(xq: np.ndarray, xb, k: int, *, devices: Sequence[torch.device] = (CPU,),
           chunk_rows: int = CHUNK_ROWS, workspace: Workspace | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k inner products: xq (B, D), xb (N, D) -> D (B, k) float32, I (B, k) int64.

    xb is any row source `store.row_chunks` reads (an array, a .npy memmap, BlockRows) in any
    float dtype; scores are float32 products of float32 queries with the stored values widened to
    float32. Chunk i goes to devices[i % len(devices)]. When k > N the missing places hold
    score -inf and id -1, as faiss fills them. A caller that searches often passes its thread's
    `workspace`, so the chunk buffers are made once.
    """
    if not devices:
        raise ValueError("search needs at least one device")
    queries = {d: torch.from_numpy(np.ascontiguousarray(xq, dtype=np.float32)).to(d) for d in devices}
    workspace = workspace if workspace is not None else Workspace()
    buffer = None
    if CPU in devices and not in_memory(xb):
        buffer = torch.from_numpy(workspace.get("widen", (min(chunk_rows, len(xb)), xb.shape[1]), np.float32))
    best = None
    for i, (start, block) in enumerate(row_chunks(xb, chunk_rows, workspace=workspace)):
        device = devices[i % len(devices)]
        part = chunk_topk(queries[device], _on_device(block, device, buffer), k, start)
        part = (part[0].to(CPU), part[1].to(CPU))
        best = part if best is None else merge_topk(torch.cat([best[0], part[0]], 1), torch.cat([best[1], part[1]], 1), k)
    if best is None:  # no rows at all
        best = (torch.empty(len(xq), 0), torch.empty(len(xq), 0, dtype=torch.int64))
    scores, ids = merge_topk(*best, k)  # a single chunk has not been through the tie order yet
    scores, ids = pad_topk(scores, ids, k)
    return scores.numpy(), ids.numpy()


def search_tensor(xq: torch.Tensor, xb: torch.Tensor, k: int, *, chunk_rows: int = 1 << 22) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k over a matrix already on a device: xq (B, D), xb (N, D) -> (B, min(k, N)) scores and ids.

    The (B, N) score matrix never exists whole (21M rows x 32 queries would be 1.3 GB). Scores are
    computed in xb's dtype (float16 on a GPU) and returned in it.
    """
    xq = xq.to(xb.dtype)
    best = None
    for start in range(0, xb.shape[0], chunk_rows):
        part = chunk_topk(xq, xb[start : start + chunk_rows], k, start)
        best = part if best is None else merge_topk(torch.cat([best[0], part[0]], 1), torch.cat([best[1], part[1]], 1), k)
    return merge_topk(*best, k)


def inner_products(xq: np.ndarray, xb, *, chunk_rows: int = CHUNK_ROWS) -> torch.Tensor:
    """Every passage's score: xq (B, D), xb (N, D) -> (B, N) float32 (4 MB per question at 1M rows)."""
    query = torch.from_numpy(np.ascontiguousarray(xq, dtype=np.float32))
    workspace = Workspace()
    buffer = None if in_memory(xb) else torch.from_numpy(workspace.get("widen", (min(chunk_rows, len(xb)), xb.shape[1]), np.float32))
    out = torch.empty(query.shape[0], len(xb), dtype=torch.float32)
    for start, block in row_chunks(xb, chunk_rows, workspace=workspace):
        out[:, start : start + len(block)] = query @ _on_device(block, CPU, buffer).T
    return out


def rerank(xq: np.ndarray, candidates: np.ndarray, xb, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Re-score candidate rows exactly: xq (B, D), candidates (B, C) row ids (-1: none), xb (N, D)
    -> D (B, k) float32 inner products with the stored vectors, I (B, k), best first, ties by id.

    An approximate index (IVF-PQ) finds C > k candidates cheaply; reading their C stored vectors
    and ranking them by the exact product recovers most of what the compressed codes lose.
    """
    query = torch.from_numpy(np.ascontiguousarray(xq, dtype=np.float32))  # (B, D)
    rows = []
    for b, found in enumerate(candidates):
        ids = np.unique(found[found >= 0])  # (C',) sorted, so equal scores keep row order
        vectors = torch.from_numpy(gather_rows(xb, ids))  # (C', D)
        scores = vectors @ query[b]  # (C',)
        top, order = merge_topk(scores[None], torch.from_numpy(ids)[None], k)
        rows.append(pad_topk(top, order, k))
    return torch.cat([r[0] for r in rows]).numpy(), torch.cat([r[1] for r in rows]).numpy()

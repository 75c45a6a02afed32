"""Exact maximum inner product search in chunks, with a deterministic top-k merge.

The passage matrix xb (N, D) is never copied whole: it is read `chunk_rows` rows at a time
(`store.row_chunks`), each chunk is scored in float32 on a device chosen by argument, keeps its
own best k, and the running best k of all chunks seen so far is kept (`merge_topk`). With several
CUDA devices the chunks go round-robin to them. Equal scores are ordered by row id, so the same
question gives the same rows whatever the chunk size or the devices.

On a GPU the rows can instead be placed once (`place`): each visible device holds a contiguous
share of them in float16, read from the KB chunk by chunk, and `search_placed` scans every share
on its own device and merges the shares' best rows on the CPU.

Names follow faiss: xq (B, D) queries, xb (N, D) passages, k, D scores and I row ids.
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .store import CHUNK_ROWS, Workspace, gather_rows, in_memory, row_chunks

CPU = torch.device("cpu")
RESCORE_MARGIN = 32  # rows beyond k that a float16 scan keeps per share, to be re-scored in float32


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


@dataclass(frozen=True)
class Share:
    """Rows [start, start + len(vectors)) of a KB's vectors, held on one device."""

    start: int
    vectors: torch.Tensor  # (n, D) in the placed dtype


def share_bounds(n: int, parts: int) -> list[int]:
    """Row boundaries that cut n rows into `parts` contiguous shares as even as can be.

    >>> share_bounds(10, 3)
    [0, 3, 7, 10]
    """
    return [round(i * n / parts) for i in range(parts + 1)]


def place(xb, devices: Sequence[torch.device], *, dtype: torch.dtype = torch.float16, chunk_rows: int = CHUNK_ROWS,
          workspace: Workspace | None = None) -> tuple[Share, ...]:
    """Copy xb (N, D) onto `devices` once, device i holding the i-th of `share_bounds` in `dtype`.

    The rows are read a chunk at a time (`store.row_chunks`) and converted on the way, so neither
    the host nor a device ever holds a float32 copy of the whole matrix: 21M x 768 rows take
    32 GB of float16 in all, a share of it on each device.
    """
    if not devices:
        raise ValueError("place needs at least one device")
    bounds = share_bounds(len(xb), len(devices))
    shares = [torch.empty((bounds[i + 1] - bounds[i], xb.shape[1]), dtype=dtype, device=device)
              for i, device in enumerate(devices)]
    for start, block in row_chunks(xb, chunk_rows, workspace=workspace):
        row, end = start, start + len(block)
        while row < end:  # a chunk can straddle two shares
            i = bisect.bisect_right(bounds, row) - 1
            stop = min(end, bounds[i + 1])
            shares[i][row - bounds[i] : stop - bounds[i]].copy_(_as_tensor(block[row - start : stop - start]))
            row = stop
    return tuple(Share(bounds[i], tensor) for i, tensor in enumerate(shares))


def search_placed(xq: np.ndarray, shares: Sequence[Share], k: int, *, margin: int = RESCORE_MARGIN,
                  chunk_rows: int = 1 << 22) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k over placed shares: xq (B, D) -> D (B, k) float32, I (B, k) int64, ties by row id.

    Each share is scanned on its device in its own dtype (`search_tensor`), keeping its best
    k + margin rows; those are scored again in float32 from the stored values (what the chunked
    `search` computes) and the shares' lists merged. A float16 scan rounds each product to about
    three significant digits, so it can misplace rows whose scores differ by less than that; the
    margin keeps them, and a true top-k row is lost only when more than `margin` rows outscore
    it within that rounding.
    """
    query = torch.from_numpy(np.ascontiguousarray(xq, dtype=np.float32))  # (B, D)
    scores, ids = [], []
    for share in shares:
        if not len(share.vectors):
            continue
        on_device = query.to(share.vectors.device)
        _, local = search_tensor(on_device, share.vectors, k + margin, chunk_rows=chunk_rows)  # (B, c)
        rows = share.vectors[local].float()  # (B, c, D)
        exact = torch.bmm(rows, on_device[:, :, None])[:, :, 0]  # (B, c)
        scores.append(exact.cpu())
        ids.append((local + share.start).cpu())
    if not scores:
        best = (torch.empty(len(xq), 0), torch.empty(len(xq), 0, dtype=torch.int64))
    else:
        best = merge_topk(torch.cat(scores, 1), torch.cat(ids, 1), k)
    top, order = pad_topk(*best, k)
    return top.numpy(), order.numpy()

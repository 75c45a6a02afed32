"""Exact search in chunks against one full matmul + sort (the oracle), on every row source and device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rag_demo.retrieval.flat import chunk_topk, inner_products, merge_topk, place, rerank, search, search_placed, share_bounds
from rag_demo.retrieval.store import BlockRows, gather_rows, row_chunks

CUDA = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device visible")


def oracle(xq: np.ndarray, xb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every score at once in float64, sorted by score descending then row id; padded like faiss."""
    scores = xq.astype(np.float64) @ np.asarray(xb, dtype=np.float32).astype(np.float64).T  # (B, N)
    ids = np.stack([np.lexsort((np.arange(len(row)), -row)) for row in scores])[:, :k]  # (B, min(k, N))
    top = np.take_along_axis(scores, ids, axis=1)
    missing = k - ids.shape[1]
    if missing > 0:
        top = np.concatenate([top, np.full((len(xq), missing), -np.inf)], axis=1)
        ids = np.concatenate([ids, np.full((len(xq), missing), -1)], axis=1)
    return top, ids


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((1000, 24)).astype(np.float32), rng.standard_normal((6, 24)).astype(np.float32)


@pytest.mark.parametrize("chunk_rows", [1, 7, 256, 1000, 5000])
@pytest.mark.parametrize("k", [1, 10])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_chunked_search_equals_the_full_matmul(data, chunk_rows, k, dtype):
    xb, xq = data
    xb = xb.astype(dtype)
    scores, ids = search(xq, xb, k, chunk_rows=chunk_rows)
    want_scores, want_ids = oracle(xq, xb, k)
    assert scores.dtype == np.float32 and ids.dtype == np.int64 and ids.shape == (len(xq), k)
    assert np.array_equal(ids, want_ids)
    assert np.allclose(scores, want_scores, atol=1e-4)


def test_equal_scores_come_in_row_order_whatever_the_chunks():
    # small integers: every product is exact in float32, and most scores are shared by many rows
    rng = np.random.default_rng(1)
    xb = rng.integers(-1, 2, size=(300, 4)).astype(np.float32)
    xq = rng.integers(-1, 2, size=(5, 4)).astype(np.float32)
    want_scores, want_ids = oracle(xq, xb, 25)
    for chunk_rows in (1, 3, 16, 64, 300):
        scores, ids = search(xq, xb, 25, chunk_rows=chunk_rows)
        assert np.array_equal(ids, want_ids), chunk_rows
        assert np.array_equal(scores, want_scores.astype(np.float32))


def test_k_beyond_n_is_padded_as_faiss_pads():
    xb = np.eye(3, dtype=np.float32)
    scores, ids = search(np.array([[0, 2, 1]], dtype=np.float32), xb, 5, chunk_rows=2)
    assert ids.tolist() == [[1, 2, 0, -1, -1]]
    assert scores[0, :3].tolist() == [2, 1, 0] and np.isneginf(scores[0, 3:]).all()


def test_merge_of_random_splits_equals_one_topk():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (3, 40), generator=generator).float()  # many ties
    ids = torch.randperm(40, generator=generator).repeat(3, 1)
    merged = merge_topk(scores, ids, 12)
    cut = 17
    left, right = merge_topk(scores[:, :cut], ids[:, :cut], 12), merge_topk(scores[:, cut:], ids[:, cut:], 12)
    again = merge_topk(torch.cat([left[0], right[0]], 1), torch.cat([left[1], right[1]], 1), 12)
    assert torch.equal(merged[0], again[0]) and torch.equal(merged[1], again[1])
    for row_scores, row_ids in zip(*merged):  # score descending, then id ascending
        pairs = list(zip((-row_scores).tolist(), row_ids.tolist()))
        assert pairs == sorted(pairs)


def test_chunk_topk_keeps_the_lowest_ids_of_a_tie_at_the_cut():
    chunk = torch.tensor([[1.0], [3.0], [1.0], [1.0], [2.0]])
    scores, ids = chunk_topk(torch.ones(1, 1), chunk, 3, offset=100)
    assert sorted(ids[0].tolist()) == [100, 101, 104]
    scores, ids = chunk_topk(torch.ones(1, 1), chunk, 4)
    assert sorted(ids[0].tolist()) == [0, 1, 2, 4]


def test_memmap_and_arrow_blocks_search_like_the_array(data, tmp_path):
    xb, xq = data
    half = xb.astype(np.float16)
    np.save(tmp_path / "v.npy", half)
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    blocks = BlockRows((half[:3], half[3:500], half[500:501], half[501:]))
    want = search(xq, half, 10)
    for rows in (mapped, blocks, mapped[:]):  # a view of a memmap is read through the mapping
        for chunk_rows in (64, 999, 4096):
            got = search(xq, rows, 10, chunk_rows=chunk_rows)
            assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])
    starts = [start for start, _ in row_chunks(blocks, 100)]
    assert starts == list(range(0, 1000, 100))
    assert np.array_equal(np.concatenate([b.copy() for _, b in row_chunks(blocks, 100)]), half)
    assert np.array_equal(gather_rows(blocks, [999, 0, 2, 3]), half[[999, 0, 2, 3]].astype(np.float32))
    for rows in (mapped, blocks, half):  # a walk resumed part way: the same blocks as the rest of a whole walk
        whole = [(start, b.copy()) for start, b in row_chunks(rows, 100) if start >= 300]
        resumed = [(start, b.copy()) for start, b in row_chunks(rows, 100, start=300)]
        assert [s for s, _ in resumed] == [s for s, _ in whole] == list(range(300, 1000, 100))
        assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(resumed, whole))
        assert list(row_chunks(rows, 100, start=1000)) == []


def test_a_scan_of_a_mapped_file_keeps_it_out_of_resident_memory(tmp_path):
    from rag_demo.serving.heap import status_mb

    rows = np.lib.format.open_memmap(tmp_path / "big.npy", mode="w+", dtype=np.float16, shape=(400_000, 64))  # 51 MB
    for start in range(0, len(rows), 100_000):
        rows[start : start + 100_000] = 1.0
    del rows
    np.save(tmp_path / "small.npy", np.ones((100, 64), dtype=np.float16))
    search(np.ones((1, 64), dtype=np.float32), np.load(tmp_path / "small.npy", mmap_mode="r"), 5)  # library code paged in
    mapped = np.load(tmp_path / "big.npy", mmap_mode="r")
    before = status_mb("RssFile")
    search(np.ones((1, 64), dtype=np.float32), mapped, 5, chunk_rows=8192)
    if before is None:
        pytest.skip("no /proc/self/status here")
    assert status_mb("RssFile") - before < 10  # read with file reads, not by touching every mapped page


def test_inner_products_and_rerank_against_the_oracle(data):
    xb, xq = data
    half = xb.astype(np.float16)
    all_scores = inner_products(xq, half, chunk_rows=300)
    assert all_scores.shape == (len(xq), len(xb))
    assert np.allclose(all_scores.numpy(), xq @ half.astype(np.float32).T, atol=1e-4)
    want_scores, want_ids = oracle(xq, half, 5)
    candidates = np.concatenate([want_ids[:, ::-1], np.full((len(xq), 3), -1), np.arange(20).reshape(1, 20).repeat(len(xq), 0)], 1)
    scores, ids = rerank(xq, candidates, half, 5)
    assert np.array_equal(ids, want_ids) and np.allclose(scores, want_scores, atol=1e-4)
    scores, ids = rerank(xq[:1], np.array([[3, -1]]), half, 3)  # fewer candidates than k: padded
    assert ids.tolist() == [[3, -1, -1]]


@needs_cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cuda_devices_give_the_cpu_result(data, dtype, tmp_path):
    xb, xq = data
    np.save(tmp_path / "v.npy", xb.astype(dtype))
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    want = search(xq, mapped, 10, chunk_rows=128)
    for devices in ([CUDA[0]], CUDA, [CUDA[0], torch.device("cpu")]):
        got = search(xq, mapped, 10, chunk_rows=128, devices=devices)
        assert np.array_equal(got[1], want[1])
        assert np.allclose(got[0], want[0], atol=1e-4)


@pytest.mark.parametrize("parts, n", [(1, 1000), (3, 1000), (4, 2), (5, 1000)])
def test_share_bounds_cover_every_row_once(parts, n):
    bounds = share_bounds(n, parts)
    assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == parts + 1
    sizes = np.diff(bounds)
    assert sizes.min() >= 0 and sizes.max() - sizes.min() <= 1


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("chunk_rows", [7, 1000])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_placed_shares_give_the_chunked_search(data, parts, chunk_rows, dtype, tmp_path):
    """Shares on several 'devices' (the CPU standing in for GPUs), read from a memory-mapped file in
    chunks that straddle the shares' bounds, find what one pass over all rows finds."""
    xb, xq = data
    np.save(tmp_path / "v.npy", xb.astype(dtype))
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    shares = place(mapped, [torch.device("cpu")] * parts, dtype=torch.from_numpy(np.empty(0, dtype)).dtype,
                   chunk_rows=chunk_rows)
    assert [s.start for s in shares] == share_bounds(len(xb), parts)[:-1]
    assert np.array_equal(torch.cat([s.vectors for s in shares]).numpy(), np.asarray(mapped))
    for k in (1, 10):
        want_scores, want_ids = oracle(xq, mapped, k)
        scores, ids = search_placed(xq, shares, k)
        assert scores.dtype == np.float32 and np.array_equal(ids, want_ids)
        assert np.allclose(scores, want_scores, atol=1e-4)


def test_placed_float32_rows_can_be_held_in_float16(data):
    xb, xq = data
    shares = place(xb, [torch.device("cpu")] * 2, dtype=torch.float16, chunk_rows=64)
    assert all(s.vectors.dtype == torch.float16 for s in shares)
    rounded = xb.astype(np.float16)  # what is searched is the rounded rows, exactly
    scores, ids = search_placed(xq, shares, 10)
    want_scores, want_ids = oracle(xq, rounded, 10)
    assert np.array_equal(ids, want_ids) and np.allclose(scores, want_scores, atol=1e-4)


def test_the_rescored_margin_recovers_rows_a_float16_scan_ties():
    # every stored row scores 300 + 0.00025 i in float32, but 300 to float16's three digits: the
    # scan alone keeps the lowest ids, re-scoring the margin's candidates puts the best first
    xb = np.stack([np.full(20, 300.0), np.arange(20) * 0.25], axis=1).astype(np.float16)  # (20, 2), values exact in float16
    xq = np.array([[1.0, 0.001]], dtype=np.float32)
    shares = place(xb, [torch.device("cpu")], dtype=torch.float16)
    assert search_placed(xq, shares, 3, margin=0)[1].tolist() != [[19, 18, 17]]
    scores, ids = search_placed(xq, shares, 3)
    assert ids.tolist() == [[19, 18, 17]] and np.allclose(scores, 300 + 0.00025 * np.array([[19, 18, 17]]), atol=1e-4)


def test_placed_search_pads_and_skips_empty_shares():
    xb = np.eye(2, dtype=np.float32)
    shares = place(xb, [torch.device("cpu")] * 4, dtype=torch.float32)  # two of four shares hold no row
    assert sorted(len(s.vectors) for s in shares) == [0, 0, 1, 1]
    scores, ids = search_placed(np.array([[1.0, 0.5]], dtype=np.float32), shares, 3)
    assert ids.tolist() == [[0, 1, -1]] and scores[0, 2] == -np.inf


@needs_cuda
def test_placed_on_cuda_gives_the_cpu_result(data):
    xb, xq = data
    half = xb.astype(np.float16)
    want = search(xq, half, 10)
    got = search_placed(xq, place(half, CUDA, dtype=torch.float16, chunk_rows=128), 10)
    assert np.array_equal(got[1], want[1]) and np.allclose(got[0], want[0], atol=1e-4)


def test_workspace_buffers_are_reused_while_big_enough():
    from rag_demo.retrieval.store import Workspace

    workspace = Workspace()
    first = workspace.get("read", (10, 4), np.float16)
    assert first.shape == (10, 4) and np.shares_memory(first, workspace.get("read", (6, 4), np.float16))
    assert not np.shares_memory(first, workspace.get("read", (20, 4), np.float16))  # outgrown: made again
    assert workspace.get("widen", (3, 4), np.float32).dtype == np.float32


def test_rows_of_a_mapped_file_are_read_without_mapping_them(tmp_path):
    from rag_demo.serving.heap import status_mb

    half = np.random.default_rng(0).standard_normal((200_000, 64)).astype(np.float16)  # 26 MB
    np.save(tmp_path / "v.npy", half)
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    ids = np.random.default_rng(1).choice(len(half), size=3000, replace=False)
    gather_rows(mapped, ids[:10])
    before = status_mb("RssFile")
    got = gather_rows(mapped, ids)
    assert np.array_equal(got, half[ids].astype(np.float32)) and got.dtype == np.float32
    assert np.array_equal(gather_rows(mapped, [-1, 0]), half[[-1, 0]].astype(np.float32))
    with pytest.raises(IndexError):
        gather_rows(mapped, [len(half)])
    if before is not None:
        assert status_mb("RssFile") - before < 5  # through the mapping, 3000 random rows would map most of the file

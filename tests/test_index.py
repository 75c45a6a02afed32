"""Every index variant against flat (the oracle), and the on-disk index cache."""

from __future__ import annotations

import numpy as np
import pytest

from rag_demo.config import IndexConfig
from rag_demo.index import build_index, cached_index, measure, recall_at_k


@pytest.fixture(scope="module")
def vectors():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(20, 32))
    xb = centers[rng.integers(0, 20, 3000)] + 0.3 * rng.normal(size=(3000, 32))
    return (xb / np.linalg.norm(xb, axis=1, keepdims=True)).astype(np.float32)


def test_flat_is_exact(vectors):
    flat = build_index("flat", vectors, IndexConfig())
    xq = vectors[:7]
    scores, ids = flat.search(xq, 5)
    brute = xq @ vectors.T
    assert np.array_equal(ids, np.argsort(-brute, axis=1)[:, :5])
    assert np.allclose(scores, np.sort(brute, axis=1)[:, ::-1][:, :5], atol=1e-5)


# tight clusters of 150 near-duplicates: hard for 8-byte codes, chance level is 10 / 3000
@pytest.mark.parametrize("kind, floor", [("hnsw", 0.95), ("ivfpq", 0.3)])
def test_approximate_indexes_recall_against_flat(vectors, kind, floor):
    flat = build_index("flat", vectors, IndexConfig())
    index = build_index(kind, vectors, IndexConfig())
    report = measure(index, flat, vectors, k=10, queries=100)
    assert report.recall_at_k >= floor
    assert report.bytes > 0 and report.query_ms > 0
    if kind == "ivfpq":  # compressed: far fewer bytes than the float vectors
        assert report.bytes < vectors.nbytes / 2


def test_recall_at_k_counts_overlap():
    assert recall_at_k(np.array([[1, 2, 3]]), np.array([[3, 2, 9]])) == pytest.approx(2 / 3)
    assert recall_at_k(np.array([[1, -1, -1]]), np.array([[1, 2, 3]])) == pytest.approx(1 / 3)


def test_cache_is_reused_and_a_corrupt_file_rebuilt(vectors, tmp_path, caplog):
    first = cached_index("hnsw", vectors, "fp", tmp_path, IndexConfig())
    files = sorted(tmp_path.glob("*.faiss"))
    assert len(files) == 1
    again = cached_index("hnsw", vectors, "fp", tmp_path, IndexConfig())
    assert again.build_seconds == pytest.approx(first.build_seconds)  # loaded, not rebuilt
    files[0].write_bytes(files[0].read_bytes()[:100])  # a half-written file
    rebuilt = cached_index("hnsw", vectors, "fp", tmp_path, IndexConfig())
    assert "unusable" in caplog.text
    assert np.array_equal(rebuilt.search(vectors[:3], 5)[1], first.search(vectors[:3], 5)[1])


def test_unwritable_cache_still_answers(vectors, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    index = cached_index("ivfpq", vectors, "fp", blocker / "sub", IndexConfig())
    assert index.search(vectors[:2], 3)[1].shape == (2, 3)

"""Every index variant against flat (the oracle), and the on-disk index cache."""

from __future__ import annotations

import numpy as np
import pytest

from rag_demo.config import IndexConfig
from rag_demo.retrieval.index import build_index, cached_index, measure, recall_at_k


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


@pytest.fixture(scope="module")
def on_disk(vectors, tmp_path_factory):
    """The same vectors as a float16 .npy, memory-mapped, as a large KB keeps them."""
    path = tmp_path_factory.mktemp("disk") / "v.npy"
    np.save(path, vectors.astype(np.float16))
    return np.load(path, mmap_mode="r")


def test_flat_over_a_memmap_is_exact_and_copies_nothing(on_disk):
    flat = build_index("flat", on_disk, IndexConfig())
    assert flat.faiss_index is None and flat.shares is None and flat.rows is on_disk
    assert flat.nbytes == on_disk.nbytes
    widened = np.asarray(on_disk, dtype=np.float32)
    scores, ids = flat.search(widened[:7], 5)
    faiss_scores, faiss_ids = build_index("flat", widened, IndexConfig()).search(widened[:7], 5)
    assert np.array_equal(ids, faiss_ids) and np.allclose(scores, faiss_scores, atol=1e-5)


@pytest.mark.parametrize("kind, floor", [("hnsw", 0.95), ("ivfpq", 0.3)])
def test_approximate_indexes_build_from_a_memmap_in_chunks(on_disk, kind, floor, tmp_path):
    config = IndexConfig(ivf_train_rows=1000)
    index = cached_index(kind, on_disk, "fp16", tmp_path, config)
    flat = build_index("flat", on_disk, config)
    assert measure(index, flat, on_disk, k=10, queries=100).recall_at_k >= floor
    assert index.nbytes == next(tmp_path.glob("*.faiss")).stat().st_size
    again = cached_index(kind, on_disk, "fp16", tmp_path, config)  # read back memory-mapped
    assert again.build_seconds == pytest.approx(index.build_seconds) and again.nbytes == index.nbytes
    assert np.array_equal(again.search(np.asarray(on_disk[:5], dtype=np.float32), 10)[1],
                          index.search(np.asarray(on_disk[:5], dtype=np.float32), 10)[1])


def test_ivfpq_reranked_with_the_stored_vectors_finds_the_exact_rows(vectors, on_disk):
    flat = build_index("flat", vectors, IndexConfig())
    plain = measure(build_index("ivfpq", vectors, IndexConfig()), flat, vectors, k=10, queries=100)
    reranked_index = build_index("ivfpq", on_disk, IndexConfig(ivf_rerank=200))
    reranked = measure(reranked_index, flat, vectors, k=10, queries=100)
    assert reranked.recall_at_k >= 0.9 > plain.recall_at_k
    scores, ids = reranked_index.search(vectors[:3], 4)  # exact products of the stored (float16) vectors, best first
    assert np.allclose(scores, np.take_along_axis(vectors[:3] @ np.asarray(on_disk, dtype=np.float32).T, ids, 1), atol=1e-5)
    assert (np.diff(scores, axis=1) <= 0).all()


def test_training_sample_keys_the_cache_only_when_set():
    from rag_demo.retrieval.index import params_key

    assert params_key("ivfpq", IndexConfig()) == params_key("ivfpq", IndexConfig(ivf_rerank=50))
    assert params_key("ivfpq", IndexConfig()) != params_key("ivfpq", IndexConfig(ivf_train_rows=500))


def test_a_prebuilt_index_of_the_kind_is_used_as_saved(vectors, tmp_path):
    import faiss

    from rag_demo.errors import KnowledgeBaseError
    from rag_demo.retrieval.index import prebuilt_kind

    saved = faiss.IndexHNSWFlat(vectors.shape[1], 8, faiss.METRIC_INNER_PRODUCT)
    saved.hnsw.efSearch = 7  # transformers searches with what was saved; so do we
    saved.add(vectors)
    path = tmp_path / "kb_hnsw_index.faiss"
    faiss.write_index(saved, str(path))
    assert prebuilt_kind(path) == "hnsw" and prebuilt_kind(tmp_path / "missing.faiss") is None
    index = cached_index("hnsw", vectors, "fp", tmp_path / "cache", IndexConfig(), prebuilt=path)
    assert index.faiss_index.hnsw.efSearch == 7 and index.nbytes == path.stat().st_size
    assert np.array_equal(index.search(vectors[:4], 5)[1], saved.search(vectors[:4], 5)[1])
    assert not (tmp_path / "cache").exists()  # nothing was built
    other = cached_index("ivfpq", vectors, "fp", tmp_path / "cache", IndexConfig(), prebuilt=path)
    assert type(other.faiss_index).__name__ == "IndexIVFPQ"  # another kind: the KB's own index is built
    with pytest.raises(KnowledgeBaseError, match="indexes 3000 vectors"):
        cached_index("hnsw", vectors[:10], "fp", None, IndexConfig(), prebuilt=path)


def test_a_prebuilt_index_of_another_type_is_left_aside(vectors, tmp_path, caplog):
    import faiss

    other = faiss.IndexIVFFlat(faiss.IndexFlatIP(vectors.shape[1]), vectors.shape[1], 4, faiss.METRIC_INNER_PRODUCT)
    other.train(vectors)
    other.add(vectors)
    path = tmp_path / "kb_ivfflat.faiss"
    faiss.write_index(other, str(path))
    index = cached_index("ivfpq", vectors, "fp", None, IndexConfig(), prebuilt=path)
    assert type(index.faiss_index).__name__ == "IndexIVFPQ" and "none of flat, hnsw, ivfpq" in caplog.text


def test_latency_is_timed_on_a_few_questions_when_search_is_slow(monkeypatch):
    from rag_demo.retrieval import index as index_module

    xb = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
    flat = build_index("flat", xb, IndexConfig())
    calls = []
    real = flat.search
    monkeypatch.setattr(flat, "search", lambda xq, k: calls.append(len(xq)) or real(xq, k))
    monkeypatch.setattr(index_module, "TIMING_SECONDS", 0.0)  # every question "slow": the floor of 3 is timed
    report = index_module.measure(flat, flat, xb, queries=50)
    assert calls == [50, 1, 1, 1, 50] and report.recall_at_k == 1.0 and report.query_ms > 0
    monkeypatch.setattr(index_module, "TIMING_SECONDS", 60.0)
    calls.clear()
    index_module.measure(flat, flat, xb, queries=50)
    assert calls == [50] + [1] * 50 + [50]

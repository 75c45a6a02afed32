"""Indexes built block by block: the same index as a build in one go, progress, and resuming."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from rag_demo.config import IndexConfig
from rag_demo.retrieval.index import build_index, cached_index, index_cache_paths

BLOCK = 500  # rows per block here: 3000 rows make 6 blocks
CONFIG = IndexConfig(ivf_train_rows=1000)  # a sample, as large KBs are trained on


class Interrupted(Exception):
    pass


@pytest.fixture(scope="module")
def on_disk(vectors, tmp_path_factory):
    path = tmp_path_factory.mktemp("disk") / "v.npy"
    np.save(path, vectors.astype(np.float16))
    return np.load(path, mmap_mode="r")


@pytest.fixture(autouse=True)
def one_faiss_thread(monkeypatch):
    """One thread: HNSW's graph then depends only on the rows and their order, so builds compare byte for byte."""
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    monkeypatch.setattr("rag_demo.retrieval.index_build.CHUNK_ROWS", BLOCK)
    yield
    faiss.omp_set_num_threads(before)


def todays_build(kind, xb, config):
    """The index as it was built before blocks had progress and checkpoints, spelled out in faiss."""
    import faiss

    from rag_demo.retrieval.index_build import training_rows

    n, dim = xb.shape
    whole = type(xb) is np.ndarray and xb.dtype == np.float32
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
    else:
        nlist = min(int(4 * np.sqrt(n)), n // 39)
        index = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, 8, 6, faiss.METRIC_INNER_PRODUCT)
        sample = training_rows(n, nlist, config.ivf_train_rows)
        index.train(np.asarray(xb if sample is None else xb[sample], dtype=np.float32))
    if whole:
        index.add(xb)
    else:
        for start in range(0, n, BLOCK):
            index.add(np.asarray(xb[start : start + BLOCK], dtype=np.float32))
    if kind == "hnsw":
        index.hnsw.efSearch = config.hnsw_ef_search
    else:
        index.nprobe = min(config.ivf_nprobe, nlist)
    return index


def serialized(index) -> bytes:
    import faiss

    return faiss.serialize_index(index).tobytes()


def same_answers(a, b, xq) -> bool:
    (da, ia), (db, ib) = a.search(xq, 10), b.search(xq, 10)
    return np.array_equal(ia, ib) and np.array_equal(da, db)


@pytest.mark.parametrize("kind", ["hnsw", "ivfpq"])
@pytest.mark.parametrize("source", ["memmap", "memory"])
def test_a_streamed_build_is_the_index_of_before_with_progress(vectors, on_disk, kind, source):
    xb = on_disk if source == "memmap" else vectors
    config = CONFIG if source == "memmap" else IndexConfig()
    heard = []
    built = build_index(kind, xb, config, progress=lambda done, total: heard.append((done, total)))
    before = todays_build(kind, xb, config)
    assert serialized(built.faiss_index) == serialized(before)
    assert same_answers(built, before, vectors[:20])
    # an in-memory HNSW is added in one call, as before: its graph depends on how rows are batched
    steps = [0, 3000] if (kind, source) == ("hnsw", "memory") else list(range(0, 3001, BLOCK))
    assert heard == [(done, 3000) for done in steps]


def interrupt_after(blocks: int):
    def progress(done, total):
        if done >= blocks * BLOCK:
            raise Interrupted

    return progress


def recorder():
    heard = []
    return heard, lambda done, total: heard.append(done)


@pytest.mark.parametrize("kind", ["hnsw", "ivfpq"])
def test_an_interrupted_build_resumes_where_it_stopped(on_disk, vectors, kind, tmp_path):
    whole = cached_index(kind, on_disk, "fp", tmp_path / "whole", CONFIG)
    with pytest.raises(Interrupted):
        cached_index(kind, on_disk, "fp", tmp_path / "cut", CONFIG, progress=interrupt_after(2), checkpoint_seconds=0)
    final, _ = index_cache_paths(kind, "fp", tmp_path / "cut", CONFIG)
    saved = json.loads(final.with_name(final.name + ".partial.json").read_text())
    assert saved["rows"] == 2 * BLOCK and not final.exists()
    heard, progress = recorder()
    resumed = cached_index(kind, on_disk, "fp", tmp_path / "cut", CONFIG, progress=progress, checkpoint_seconds=0)
    assert heard == list(range(2 * BLOCK, 3001, BLOCK))  # 4 blocks added, not 6
    assert serialized(resumed.faiss_index) == serialized(whole.faiss_index)
    assert same_answers(resumed, whole, vectors[:20])
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == sorted([final.name, final.with_suffix(".json").name])


def test_a_checkpoint_of_another_kb_or_a_damaged_one_is_removed_not_used(on_disk, vectors, tmp_path, caplog):
    whole = cached_index("hnsw", on_disk, "fp", tmp_path / "whole", CONFIG)
    final, _ = index_cache_paths("hnsw", "fp", tmp_path, CONFIG)
    meta, partial = final.with_name(final.name + ".partial.json"), final.with_name(final.name + ".partial")

    def interrupted_then(damage):
        with pytest.raises(Interrupted):
            cached_index("hnsw", on_disk, "fp", tmp_path, CONFIG, progress=interrupt_after(3), checkpoint_seconds=0)
        damage()
        caplog.clear()
        heard, progress = recorder()
        with caplog.at_level(logging.WARNING):
            rebuilt = cached_index("hnsw", on_disk, "fp", tmp_path, CONFIG, progress=progress, checkpoint_seconds=0)
        assert heard[0] == 0 and "not resumable" in caplog.text
        assert serialized(rebuilt.faiss_index) == serialized(whole.faiss_index)
        assert not meta.exists() and not partial.exists()
        final.unlink()  # the next case builds again
        return caplog.text

    def other_kb():
        meta.write_text(json.dumps(json.loads(meta.read_text()) | {"fingerprint": "another"}))

    assert "another fingerprint" in interrupted_then(other_kb)
    assert "size" in interrupted_then(lambda: partial.write_bytes(partial.read_bytes()[:100]))

    def flipped_byte():
        content = bytearray(partial.read_bytes())
        content[len(content) // 2] ^= 0xFF  # faiss would read it without complaint
        partial.write_bytes(bytes(content))

    assert "sha256" in interrupted_then(flipped_byte)
    assert "rows" in interrupted_then(lambda: meta.write_text(json.dumps(json.loads(meta.read_text()) | {"rows": 1234})))
    assert "Expecting value" in interrupted_then(lambda: meta.write_text("not json"))


def test_a_folder_that_takes_no_checkpoint_still_builds(on_disk, vectors, tmp_path, caplog):
    from rag_demo.retrieval.index_build import Checkpoint, build_faiss

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    checkpoint = Checkpoint(blocker / "sub" / "x.faiss", "fp", "key", every_seconds=0)
    index = build_faiss("ivfpq", on_disk, CONFIG, checkpoint=checkpoint)
    assert index.ntotal == 3000 and "could not save a checkpoint" in caplog.text
    assert caplog.text.count("could not save a checkpoint") == 1  # said once, not after every block


@pytest.mark.parametrize("rows", [5, 60])
def test_ivfpq_on_a_few_rows_trains_the_same_codes_without_faiss_printing_advice(rows, capfd, caplog):
    """faiss's k-means prints "please provide at least N training points" to stderr once per subquantizer (about
    a hundred lines on a visitor's few passages); the page's Index variants table explains small bases instead."""
    from rag_demo.retrieval.index_build import build_faiss, empty_index

    xb = np.random.default_rng(1).standard_normal((rows, 32)).astype(np.float32)
    caplog.set_level(logging.INFO)
    built = build_faiss("ivfpq", xb, IndexConfig())
    assert "training points" not in capfd.readouterr().err
    assert f"IVF-PQ over {rows} vectors" in caplog.text

    loud = empty_index("ivfpq", rows, 32, IndexConfig())
    loud.cp.min_points_per_centroid = loud.pq.cp.min_points_per_centroid = 39  # faiss's own default
    loud.train(xb)
    loud.add(xb)
    assert "training points" in capfd.readouterr().err  # the advice this build keeps out of the log
    loud.nprobe = built.nprobe
    assert serialized(built) == serialized(loud)

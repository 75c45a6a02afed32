"""Passage splitting, source files, and the KB folder format."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_demo.offline.leads import lead_passages
from rag_demo.retrieval.corpus import KB_META, Passage, load_kb, make_kb, read_source, save_kb, split_into_passages
from rag_demo.errors import InputError, KnowledgeBaseError


def test_split_into_as_many_passages_as_dpr_of_near_equal_length():
    text = " ".join(f"w{i}" for i in range(250))  # no sentence ends: cut between words
    passages = split_into_passages("T", text)
    assert [len(p.text.split()) for p in passages] == [84, 83, 83]
    assert passages[1].text.split()[0] == "w84" and all(p.title == "T" for p in passages)
    dpr = split_into_passages("T", text, at_sentences=False)  # the packaged general base's cut
    assert [len(p.text.split()) for p in dpr] == [100, 100, 50] and dpr[1].text.split()[0] == "w100"


def test_passages_end_where_sentences_end():
    sentences = [" ".join(["word"] * n) + " stop." for n in (30, 45, 25, 45, 20)]
    text = " ".join(f"{s[0].upper()}{s[1:]}" for s in sentences)  # 170 words in 5 sentences
    passages = split_into_passages("T", text)
    assert len(passages) == 2  # as DPR's 100 + 70
    assert all(p.text.endswith(".") for p in passages)
    assert [len(p.text.split()) for p in passages] == [77, 93]  # the one sentence end that leaves at most 100


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "Bee.", "cat", "Dog", "1999.", "e.", "F.", "(g)."]), max_size=400),
       st.integers(min_value=1, max_value=120))
def test_split_keeps_every_word_in_order_within_the_limit(words, limit):
    passages = split_into_passages("T", " ".join(words), words_per_passage=limit)
    assert " ".join(p.text for p in passages).split() == words
    assert all(1 <= len(p.text.split()) <= limit for p in passages)
    assert len(passages) == -(-len(words) // limit)  # DPR's count, never more


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=450), st.integers(min_value=0, max_value=30))
def test_dpr_blocks_fold_a_short_rest_into_the_block_before(count, shortest):
    words = [f"w{i}" for i in range(count)]
    passages = split_into_passages("T", " ".join(words), at_sentences=False, shortest_tail=shortest)
    lengths = [len(p.text.split()) for p in passages]
    assert " ".join(p.text for p in passages).split() == words
    assert all(n == 100 for n in lengths[:-1])  # only the last block differs from DPR's
    if len(lengths) > 1:
        assert shortest <= lengths[-1] <= max(100, 99 + shortest)
    plain = [len(p.text.split()) for p in split_into_passages("T", " ".join(words), at_sentences=False)]
    assert len(passages) == len(plain) - (len(plain) > 1 and plain[-1] < shortest)


def test_lead_passages_leave_no_rest_under_ten_words():
    lead = " ".join(f"w{i}" for i in range(205))
    passages = lead_passages({"c": {"title": "Cleopatra", "extract": lead},
                              "d": {"title": "D", "extract": "Only five words are here."}})
    assert [(p.title, len(p.text.split())) for p in passages] == [("Cleopatra", 100), ("Cleopatra", 105), ("D", 5)]


def test_read_source_formats(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "alpha.txt").write_text("one two three")
    (tmp_path / "docs" / "beta.md").write_text("# head\nfour five")
    (tmp_path / "rows.jsonl").write_text(json.dumps({"title": "J", "text": "json text"}) + "\n\n")
    (tmp_path / "rows.csv").write_text("title,text\nC,\"csv, text\"\n")
    assert [p.title for p in read_source(tmp_path / "docs")] == ["alpha", "beta"]
    assert read_source(tmp_path / "rows.jsonl") == [Passage("J", "json text")]
    assert read_source(tmp_path / "rows.csv") == [Passage("C", "csv, text")]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.jsonl", "{not json}\n", "line 1 is not valid JSON"),
        ("bad2.jsonl", json.dumps([1, 2]) + "\n", "string 'text'"),
        ("bad.csv", "a,b\n1,2\n", "'text' column"),
        ("bin.txt", b"\xff\xfe\x00\x81", "not UTF-8"),
        ("empty.txt", "   ", "holds no text"),
        ("x.pdf", "%PDF", "unsupported file type"),
    ],
)
def test_bad_sources_are_explained(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InputError, match=message):
        read_source(path)


def test_kb_round_trip_and_validation(tmp_path):
    kb = make_kb("mini", [Passage("a", "alpha"), Passage("b", "beta")], np.eye(2, 3, dtype=np.float32), encoder="enc")
    save_kb(kb, tmp_path / "kb")
    loaded = load_kb(tmp_path / "kb")
    assert loaded.texts == kb.texts and loaded.fingerprint == kb.fingerprint and loaded.encoder == "enc"
    assert loaded.normalized

    meta = json.loads((tmp_path / "kb" / KB_META).read_text())
    meta["fingerprint"] = "0" * 16
    (tmp_path / "kb" / KB_META).write_text(json.dumps(meta))
    with pytest.raises(KnowledgeBaseError, match="fingerprint"):
        load_kb(tmp_path / "kb")


def test_a_saved_kb_loads_without_importing_datasets(tmp_path):
    """A start reads the default KBs with pyarrow alone: importing `datasets` would cost a second."""
    import subprocess
    import sys

    kb = make_kb("mini", [Passage("a", "alpha"), Passage("b", "beta")], np.eye(2, 3, dtype=np.float32), encoder="enc")
    save_kb(kb, tmp_path / "kb")
    probe = ("import sys; from rag_demo.retrieval.corpus import load_kb; kb = load_kb(sys.argv[1]); "
             "print(kb.fingerprint, list(kb.titles), 'datasets' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "kb")], capture_output=True, text=True, check=True)
    assert shown.stdout.split() == [kb.fingerprint, "['a',", "'b']", "False"]


def test_saved_folders_pyarrow_does_not_read_go_through_datasets(tmp_path):
    from datasets import Dataset

    from rag_demo.retrieval.store import saved_table

    vectors = np.arange(6, dtype=np.float32).reshape(3, 2)
    rows = {"title": ["a", "b", "c"], "text": ["x", "y", "z"], "embeddings": vectors.tolist()}
    Dataset.from_dict(rows).save_to_disk(str(tmp_path / "plain"), num_shards=2)  # two Arrow files, joined
    table = saved_table(tmp_path / "plain")
    assert table.num_rows == 3 and table.column("title").to_pylist() == ["a", "b", "c"]
    np.testing.assert_array_equal(load_kb(tmp_path / "plain").embeddings, vectors)
    # an indices mapping (a selection saved without flattening) is left to datasets
    state = json.loads((tmp_path / "plain" / "state.json").read_text())
    (tmp_path / "plain" / "state.json").write_text(json.dumps({**state, "_indices_data_files": [{"filename": "x.arrow"}]}))
    assert saved_table(tmp_path / "plain") is None
    (tmp_path / "plain" / "state.json").write_text(json.dumps(state))
    (tmp_path / "plain" / state["_data_files"][0]["filename"]).write_bytes(b"not arrow")
    assert saved_table(tmp_path / "plain") is None
    with pytest.raises(KnowledgeBaseError, match="not a saved"):
        load_kb(tmp_path / "plain")


def test_kb_without_embeddings_or_folder_is_refused(tmp_path):
    from datasets import Dataset

    Dataset.from_dict({"title": ["a"], "text": ["b"]}).save_to_disk(str(tmp_path / "noemb"))
    with pytest.raises(KnowledgeBaseError, match="lacks column"):
        load_kb(tmp_path / "noemb")
    with pytest.raises(KnowledgeBaseError, match="does not exist"):
        load_kb(tmp_path / "missing")
    (tmp_path / "junk").mkdir()
    with pytest.raises(KnowledgeBaseError, match="not a saved"):
        load_kb(tmp_path / "junk")


def _unit_kb(n: int = 50, dim: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return make_kb("disk", [Passage(f"t{i}", f"text {i}") for i in range(n)], vectors, encoder="enc")


def test_fingerprint_in_blocks_equals_one_hash_of_the_matrix():
    import hashlib

    from rag_demo.retrieval.corpus import embeddings_fingerprint
    from rag_demo.retrieval.store import BlockRows

    xb = np.random.default_rng(0).standard_normal((70_000, 3)).astype(np.float32)  # more rows than one block
    whole = hashlib.sha256(str(xb.shape).encode() + xb.tobytes()).hexdigest()[:16]
    assert embeddings_fingerprint(xb) == whole
    assert embeddings_fingerprint(BlockRows((xb[:5], xb[5:]))) == whole


def test_kb_with_a_float16_vectors_file_is_memory_mapped(tmp_path):
    from rag_demo.retrieval.corpus import VECTORS_FILE, embeddings_fingerprint

    kb = _unit_kb()
    save_kb(kb, tmp_path / "kb", vectors="float16")
    loaded = load_kb(tmp_path / "kb")
    assert isinstance(loaded.embeddings, np.memmap) and loaded.embeddings.dtype == np.float16
    assert np.array_equal(loaded.embeddings, kb.embeddings.astype(np.float16))
    assert loaded.titles == kb.titles and loaded.texts == kb.texts and loaded.encoder == "enc" and loaded.normalized
    assert loaded.fingerprint == embeddings_fingerprint(kb.embeddings.astype(np.float16))  # of the stored values
    assert loaded.index_file is None

    npy = tmp_path / "kb" / VECTORS_FILE
    os.utime(npy, ns=(1, 1))  # copied without its times: the fingerprint is recomputed, and agrees
    assert load_kb(tmp_path / "kb").fingerprint == loaded.fingerprint
    rows = np.load(npy, mmap_mode="r+")
    rows[0, 0] += 1  # the content changed after the build
    rows.flush()
    del rows
    with pytest.raises(KnowledgeBaseError, match="fingerprint"):
        load_kb(tmp_path / "kb")


def test_large_kb_passages_and_arrow_vectors_stay_on_disk(tmp_path):
    from rag_demo.retrieval.store import BlockRows, ColumnRows

    kb = _unit_kb(n=2500)  # several Arrow record batches
    save_kb(kb, tmp_path / "kb")
    small, large = load_kb(tmp_path / "kb"), load_kb(tmp_path / "kb", lazy_from=0)
    assert isinstance(small.titles, tuple) and isinstance(small.embeddings, np.ndarray)
    assert isinstance(large.titles, ColumnRows) and isinstance(large.embeddings, BlockRows)
    assert len(large.embeddings.blocks) > 1
    assert large.fingerprint == small.fingerprint and large.normalized
    assert list(large.titles) == list(small.titles) and large.texts[1234] == small.texts[1234]
    assert large.texts[-1] == small.texts[-1] and large.titles[3:6] == list(small.titles[3:6])
    assert large.passage(7) == small.passage(7) and len(large) == 2500
    assert np.array_equal(large.embeddings[[2499, 0, 1000]], small.embeddings[[2499, 0, 1000]])


def test_foreign_dataset_vectors_load_exactly_as_float32_and_ragged_ones_are_refused(tmp_path):
    from datasets import Dataset

    vectors = np.random.default_rng(0).normal(size=(5, 4))  # float64, as a list column from Python floats
    Dataset.from_dict({"title": ["t", None, "", "x", "y"], "text": ["a", "b", None, "d", "e"],
                       "embeddings": vectors.tolist()}).save_to_disk(str(tmp_path / "plain"))
    kb = load_kb(tmp_path / "plain")
    assert kb.embeddings.dtype == np.float32 and np.array_equal(kb.embeddings, vectors.astype(np.float32))
    assert list(kb.titles) == ["t", "", "", "x", "y"] and list(kb.texts) == ["a", "b", "", "d", "e"]
    Dataset.from_dict({"title": ["a", "b"], "text": ["a", "b"], "embeddings": [[0.1, 0.2], [0.3]]}).save_to_disk(
        str(tmp_path / "ragged"))
    with pytest.raises(KnowledgeBaseError, match="same length"):
        load_kb(tmp_path / "ragged")


def test_a_faiss_file_beside_a_foreign_dataset_comes_with_it(tmp_path):
    from datasets import Dataset

    kb = _unit_kb()
    Dataset.from_dict({"title": list(kb.titles), "text": list(kb.texts), "embeddings": kb.embeddings.tolist()}).save_to_disk(
        str(tmp_path / "my_knowledge_dataset"))
    index = tmp_path / "my_knowledge_dataset_hnsw_index.faiss"
    index.write_bytes(b"IHNf")
    assert load_kb(tmp_path / "my_knowledge_dataset").index_file == index
    (tmp_path / "my_knowledge_dataset_other.faiss").write_bytes(b"IxFI")
    with pytest.raises(KnowledgeBaseError, match="2 faiss files"):
        load_kb(tmp_path / "my_knowledge_dataset")
    assert load_kb(tmp_path / "my_knowledge_dataset", index_file=index).index_file == index
    with pytest.raises(KnowledgeBaseError, match="does not exist"):
        load_kb(tmp_path / "my_knowledge_dataset", index_file=tmp_path / "nope.faiss")
    save_kb(kb, tmp_path / "ours")  # our own folders carry a meta file and never pick up a neighbour
    (tmp_path / "ours_index.faiss").write_bytes(b"IxFI")
    assert load_kb(tmp_path / "ours").index_file is None


def test_vectors_file_that_does_not_fit_is_refused(tmp_path):
    from rag_demo.retrieval.corpus import VECTORS_FILE, write_kb

    with pytest.raises(KnowledgeBaseError, match="one vector per passage"):
        write_kb(tmp_path / "kb", name="x", titles=["a", "b"], texts=["a", "b"], vectors=[np.ones((1, 4))], dim=4)
    assert not (tmp_path / "kb").exists()  # nothing half-written is left
    write_kb(tmp_path / "kb", name="x", titles=["a", "b"], texts=["a", "b"], vectors=[np.ones((1, 4)), np.ones((1, 4))], dim=4,
             dtype="float32")
    np.save(tmp_path / "kb" / VECTORS_FILE, np.ones((3, 4), dtype=np.float16))
    with pytest.raises(KnowledgeBaseError, match="one vector per passage"):
        load_kb(tmp_path / "kb")


TITLES, TEXTS = ["Mozart", "Baikal", "Penny"], ["magic flute vienna", "deep lake siberia", "black stamp 1840"]


def test_a_written_kb_carries_its_bm25_index(tmp_path, monkeypatch):
    from rag_demo.retrieval import lexical
    from rag_demo.retrieval.corpus import write_kb

    write_kb(tmp_path / "kb", name="x", titles=TITLES, texts=TEXTS, vectors=[np.eye(3, 4)], dim=4)
    kb = load_kb(tmp_path / "kb")

    def no_build(*args, **kwargs):
        raise AssertionError("the saved index should have been opened")

    monkeypatch.setattr(lexical, "_build", no_build)
    index = lexical.LexicalIndex.for_kb_folder(kb.path, kb.titles, kb.texts, fingerprint=kb.fingerprint)
    assert index.top("siberia lake", 3).tolist() == [1] and isinstance(index.docs, np.memmap)


def test_a_kb_past_the_bm25_limit_is_written_without_it(tmp_path, monkeypatch, caplog):
    from rag_demo.retrieval import lexical
    from rag_demo.retrieval.corpus import write_kb

    monkeypatch.setattr(lexical, "MAX_POSTINGS", 5)  # the three passages hold 12
    with caplog.at_level("WARNING", logger="rag_demo.retrieval.corpus"):
        write_kb(tmp_path / "kb", name="x", titles=TITLES, texts=TEXTS, vectors=[np.eye(3, 4)], dim=4)
    assert f"run `python -m rag_demo build-bm25 {tmp_path / 'kb'}`" in caplog.text
    assert not lexical.lexical_path(tmp_path / "kb").exists() and len(load_kb(tmp_path / "kb")) == 3
    monkeypatch.undo()
    write_kb(tmp_path / "kb", name="x", titles=TITLES, texts=TEXTS, vectors=[np.eye(3, 4)], dim=4, bm25=False)
    assert not lexical.lexical_path(tmp_path / "kb").exists()

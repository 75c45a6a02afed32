"""Passage splitting, source files, and the KB folder format."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag_demo.corpus import KB_META, Passage, load_kb, make_kb, read_source, save_kb, split_into_passages
from rag_demo.errors import InputError, KnowledgeBaseError


def test_split_into_100_word_passages():
    text = " ".join(f"w{i}" for i in range(250))
    passages = split_into_passages("T", text)
    assert [len(p.text.split()) for p in passages] == [100, 100, 50]
    assert passages[1].text.split()[0] == "w100" and all(p.title == "T" for p in passages)


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

"""The cache's atomicity and error messages, through the knowledge source: task.json extracted once
from an sdist placed by hand, rebuilt when damaged, and each failure a message that says what to do."""

from __future__ import annotations

import errno
import json
import shutil

import pytest

from rag_demo.errors import CacheError, ModelLoadError
from rag_demo.offline import registry, source
from rag_demo.offline.cache import MARKER, _marker_checksum, marker_problem
from rag_demo.offline.gguf import ensure_generator
from rag_demo.offline.source import ensure_source, manual_sdist_path
from tests.offline_fakes import failing_pip, make_sdist


def test_source_is_extracted_once_from_the_sdist(offline_source):
    cache, payload = offline_source
    path = ensure_source(cache=cache)
    assert path.read_bytes() == payload and marker_problem(path.parent, _source_key(), deep=True) is None
    assert not list(path.parent.parent.glob(".*"))  # no staging folder left behind
    plain = path.parent.parent / "plain"
    plain.mkdir()
    assert path.parent.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777  # not mkdtemp's 0700
    manual_sdist_path(cache).unlink()  # a second call must not need it
    assert ensure_source(cache=cache) == path


def _source_key() -> str:
    return source.TASK_SOURCE.key


@pytest.mark.parametrize("damage", ["no marker", "bad checksum", "truncated", "other key"])
def test_half_written_source_is_rebuilt_not_used(offline_source, damage, caplog):
    cache, payload = offline_source
    path = ensure_source(cache=cache)
    marker = path.parent / MARKER
    content = json.loads(marker.read_text())
    if damage == "no marker":
        marker.unlink()
    elif damage == "bad checksum":
        content["files"]["task.json"][0] += 1
        marker.write_text(json.dumps(content))
    elif damage == "truncated":
        path.write_bytes(payload[:100])
    else:
        content["key"] = "bigbench==0.9:old"
        content["checksum"] = _marker_checksum(content["key"], content["files"])
        marker.write_text(json.dumps(content))
    assert ensure_source(cache=cache).read_bytes() == payload
    assert "rebuilding" in caplog.text


def test_no_network_says_where_to_put_the_sdist(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_pip_download_command", failing_pip)
    with pytest.raises(CacheError, match="connect to PyPI") as caught:
        ensure_source(cache=tmp_path)
    assert str(manual_sdist_path(tmp_path)) in str(caught.value)
    assert "network is unreachable" in str(caught.value)


def test_a_foreign_sdist_is_refused(offline_source):
    cache, _ = offline_source
    make_sdist(manual_sdist_path(cache), b'{"examples": []}')
    with pytest.raises(CacheError, match="pinned"):
        ensure_source(cache=cache)
    assert not (cache / "sources" / "bigbench-1.0.0").exists()


def test_unwritable_cache_says_to_set_rag_demo_cache(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a folder below a regular file cannot be made, even by root
    with pytest.raises(CacheError, match="RAG_DEMO_CACHE to a writable folder"):
        ensure_source(cache=blocker / "cache")


def test_full_disk_says_to_free_space(offline_source, monkeypatch):
    cache, _ = offline_source

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("rag_demo.offline.cache.write_marker", disk_full)
    with pytest.raises(CacheError, match="full; free some space"):
        ensure_source(cache=cache)
    assert not list((cache / "sources").glob(".*"))  # the staging folder was cleaned up


def test_too_little_free_space_is_reported_before_downloading(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: type("Usage", (), {"free": 10_000_000})())
    with pytest.raises(CacheError, match="needs about 0.5 GB"):
        ensure_source(cache=tmp_path)


def test_missing_generator_packages_name_requirements(tmp_path, monkeypatch):
    monkeypatch.setattr("rag_demo.offline.gguf.GENERATOR_MODULES", ("transformers", "no_such_module_for_rag_demo"))
    with pytest.raises(ModelLoadError, match=r"no_such_module_for_rag_demo: pip install -r requirements.txt"):
        ensure_generator(cache=tmp_path)


def test_a_gguf_is_parsed_once_inside_the_block_and_afresh_outside(tmp_path):
    import gguf
    import numpy as np

    from rag_demo.offline.gguf import gguf_parsed_once

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    writer.add_tensor("weight", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    original = gguf.GGUFReader
    with gguf_parsed_once() as readers:
        first, second = gguf.GGUFReader(path), gguf.GGUFReader(str(tmp_path / "." / "tiny.gguf"))
        assert first is second and len(readers) == 1
        assert np.array_equal(np.asarray(first.tensors[0].data).reshape(-1), np.arange(6, dtype=np.float32))
    assert gguf.GGUFReader is original and gguf.GGUFReader(path) is not first

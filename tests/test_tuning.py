"""Fine-tuning the question encoder: the split, the training, and the cached weights.

A tiny random BERT (mean pooled, like all-MiniLM-L6-v2) stands in for the default encoder; the
passages get fixed random unit vectors, as a KB's embeddings stay fixed while the questions'
side learns.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rag_demo import data, tuning
from rag_demo.config import EncoderConfig, TuningConfig
from rag_demo.corpus import Passage, make_kb, save_kb
from rag_demo.encoders import load_encoder
from rag_demo.lexical import LexicalIndex
from tests import tiny
from tests.test_data import offline_source  # noqa: F401 (a fixture)

TOPICS = ["fox", "paris", "hemingway", "baikal", "penny", "mozart"]


def tiny_sentence_encoder(folder: Path) -> Path:
    """A random BERT with a WordPiece tokenizer, saved like a sentence-transformers model folder."""
    from transformers import BertConfig, BertModel

    tokenizer = tiny.dpr_tokenizer(folder)
    torch.manual_seed(3)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def tiny_setup(tmp_path, one_torch_thread):
    """(encoder, passage vectors (6, 16), lexical index, one training question per passage)."""
    encoder = load_encoder(EncoderConfig(model=str(tiny_sentence_encoder(tmp_path / "encoder"))))
    vectors = np.random.default_rng(0).normal(size=(len(tiny.PASSAGES), 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    lexical = LexicalIndex.for_passages([t for t, _ in tiny.PASSAGES], [x for _, x in tiny.PASSAGES])
    # Each question names the topic of another passage than its gold one, so lexical matching alone misleads.
    questions = [tuning.TrainingQuestion(f"who wrote the {TOPICS[(row + 1) % 6]} thing", row) for row in range(6)]
    return encoder, vectors, lexical, questions


def test_held_out_split_is_one_passage_in_five_and_stable():
    held = [data.is_held_out(row) for row in range(20_000)]
    assert 0.18 < np.mean(held) < 0.22
    assert held == [data.is_held_out(row) for row in range(20_000)]


def test_training_split_leaves_out_held_out_passages_and_the_examples_passages():
    def question(text, gold_id, example=False):
        return data.KBQuestion(text, "A", "B", "A", gold_id, example)

    rows = range(40)
    held_row = next(r for r in rows if data.is_held_out(r))
    free_rows = [r for r in rows if not data.is_held_out(r)]
    featured_row, plain_row = free_rows[0], free_rows[1]
    questions = [question("q1", held_row), question("q2", featured_row, example=True),
                 question("q3 near-duplicate of q2", featured_row), question("q4", plain_row)]
    training, held = data.training_split(questions)
    assert [q.question for q in training] == ["q4"]
    assert [q.question for q in held] == ["q1"]


def test_tuning_pulls_training_questions_to_their_gold_passages(tiny_setup):
    encoder, vectors, lexical, questions = tiny_setup
    before_weights = {name: p.detach().clone() for name, p in encoder.question_model.named_parameters()}
    passages = torch.from_numpy(vectors)
    before = tuning.recall_at(encoder.question_model, encoder, passages, lexical, questions, lexical_weight=0.2, ks=(1,))
    steps = []
    tuned = tuning.tune_question_encoder(encoder, vectors, lexical, questions, lexical_weight=0.2,
                                         config=TuningConfig(epochs=60, learning_rate=3e-3, batch_size=6),
                                         progress=lambda done, total: steps.append((done, total)))
    after = tuning.recall_at(tuned, encoder, passages, lexical, questions, lexical_weight=0.2, ks=(1,))
    assert before[1] <= 0.5 and after[1] == 1.0
    assert steps[-1] == (60, 60)
    for name, p in encoder.question_model.named_parameters():  # the encoder itself is untouched
        assert torch.equal(p, before_weights[name]), name


def test_gold_ranks_count_the_passages_scored_above_the_gold_one():
    questions = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # (Q, D)
    passages = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])  # (N, D)
    lexical = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 10.0]], np.float32)  # (Q, N)
    ranks = tuning.gold_ranks(questions, passages, lexical, [2, 1], scale=1.0, lexical_weight=0.0)
    assert ranks.tolist() == [1, 0]
    ranks = tuning.gold_ranks(questions, passages, lexical, [2, 1], scale=1.0, lexical_weight=1.0)
    assert ranks.tolist() == [1, 1]  # BM25 lifts passage 2 above the second question's gold one


def test_tuned_encoder_is_built_once_and_loads_for_questions_only(tmp_path, tiny_setup, monkeypatch):
    encoder_folder = tmp_path / "encoder"
    config = EncoderConfig(model=str(encoder_folder))
    encoder, vectors, _, questions = tiny_setup
    cache = tmp_path / "cache"
    wiki = data.default_kb_paths(config.model, config.max_length, cache=cache)["nq-wiki"]
    passages = [Passage(t, x) for t, x in tiny.PASSAGES]
    save_kb(make_kb("nq-wiki", passages, vectors, encoder=config.model), wiki)
    with (wiki / data.QUESTIONS_FILE).open("w") as handle:
        for q in questions:
            handle.write(json.dumps({"question": q.question, "answer": "A", "swapped_answer": "B",
                                     "passage_answer": "A", "gold_id": q.gold_id}) + "\n")
    recipe = TuningConfig(epochs=2, batch_size=4)
    stages = []
    folder = data.ensure_tuned_encoder(encoder, config, wiki, tuning=recipe, cache=cache,
                                       progress=lambda s, d, t: stages.append(s))
    assert folder == data.tuned_encoder_path(config, recipe, cache=cache)
    assert data.marker_problem(folder, data.tuned_encoder_key(config, recipe)) is None
    assert any(stage.startswith("fine-tuning the question encoder") for stage in stages)

    def no_training(*args, **kwargs):
        raise AssertionError("a cached tuned encoder was trained again")

    monkeypatch.setattr(tuning, "tune_question_encoder", no_training)
    assert data.ensure_tuned_encoder(encoder, config, wiki, tuning=recipe, cache=cache) == folder

    tuned = load_encoder(config, question_path=folder)
    assert tuned.question_weights == folder.name and encoder.question_weights == ""
    asked = ["who wrote the paris thing"]
    assert not torch.allclose(tuned.encode_questions(asked), encoder.encode_questions(asked))
    assert np.allclose(tuned.encode_passages(passages[:2]), encoder.encode_passages(passages[:2]))
    other = EncoderConfig(model=str(encoder_folder), scale=5.0)
    assert data.tuned_encoder_path(other, recipe, cache=cache) != folder  # the key follows the retrieval logits
    assert data.tuned_encoder_path(config, cache=cache) != folder  # and the recipe


def test_eval_questions_are_the_held_out_ones(tmp_path):
    rows = list(range(30))
    kb = tmp_path / "kb"
    kb.mkdir()
    with (kb / data.QUESTIONS_FILE).open("w") as handle:
        for r in rows:
            handle.write(json.dumps({"question": f"q{r}", "answer": "A", "swapped_answer": "B",
                                     "passage_answer": "A", "gold_id": r}) + "\n")
    evals = data.load_eval_questions(kb)
    assert [e.gold_id for e in evals] == [r for r in rows if data.is_held_out(r)] and evals


def test_prepare_fine_tunes_the_default_encoder_once_and_then_loads_nothing(offline_source, tmp_path, monkeypatch,
                                                                             one_torch_thread):
    """The wiring of `data.prepare`: the default encoder (a tiny BERT here) gets its question side
    tuned after the KBs are built; a warm prepare then loads no model and returns the same folder."""
    cache, _ = offline_source
    folder = str(tiny_sentence_encoder(tmp_path / "encoder"))
    monkeypatch.setattr(data, "DEFAULT_ENCODER", folder)  # the default, as far as `prepare` can tell
    monkeypatch.setattr(data, "_encoder_path", lambda model: model)
    name, key = data._generator_key()
    generator = cache / "models" / name
    generator.mkdir(parents=True)
    (generator / "config.json").write_text("{}")
    data.write_marker(generator, key)
    config = EncoderConfig(model=folder, max_length=32)
    prepared = data.prepare(cache=cache, encoder_config=config)
    assert prepared.question_encoder_path == data.tuned_encoder_path(config, cache=cache)
    assert data.marker_problem(prepared.question_encoder_path, data.tuned_encoder_key(config)) is None

    def no_loading(*args, **kwargs):
        raise AssertionError("a warm prepare loaded a model")

    monkeypatch.setattr("rag_demo.encoders.load_encoder", no_loading)
    assert data.prepare(cache=cache, encoder_config=config) == prepared
    untuned = data.prepare(cache=cache, encoder_config=EncoderConfig(model=folder, max_length=32, tuned=False))
    assert untuned.question_encoder_path is None and untuned.kb_paths == prepared.kb_paths
    # what an engine without prepared data (own KBs, another generator) looks up
    assert data.cached_tuned_encoder(config, cache=cache) == prepared.question_encoder_path
    assert data.cached_tuned_encoder(EncoderConfig(model=folder, max_length=32, tuned=False), cache=cache) is None
    assert data.prepare(cache=cache, encoder_config=config, build_kbs=False).question_encoder_path == prepared.question_encoder_path

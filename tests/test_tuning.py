"""Fine-tuning the question encoder and the generator: the split, the training, the cached weights.

A tiny random BERT (mean pooled, like all-MiniLM-L6-v2) stands in for the default encoder; the
passages get fixed random unit vectors, as a KB's embeddings stay fixed while the questions'
side learns. A tiny random Llama with a byte-level BPE stands in for the default generator.
"""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from rag_demo.training import question_encoder as question_tuning
from rag_demo.training import reader as reader_tuning
from rag_demo.generation.adapters import adapter_parameters
from rag_demo.config import EncoderConfig, GeneratorConfig, ReaderTuningConfig, TuningConfig
from rag_demo.retrieval.corpus import Passage, make_kb, save_kb
from rag_demo.retrieval.encoders import load_encoder
from rag_demo.generation.decode_state import Target
from rag_demo.generation.generator import load_generator
from rag_demo.retrieval.lexical import LexicalIndex
from rag_demo.offline.cache import MARKER, marker_problem
from rag_demo.offline.gguf import generator_key
from rag_demo.offline.kbs import default_kb_paths
from rag_demo.offline.prepare import prepare
from rag_demo.offline.tuned import (
    cached_tuned_encoder,
    _reading_examples,
    cached_tuned_generator,
    distractor_rows,
    ensure_tuned_encoder,
    marginal_examples,
    reading_questions,
    train_reader,
    training_split,
    tuned_encoder_key,
    tuned_encoder_path,
    tuned_generator_path,
)
from rag_demo.generation.prompts import NO_ANSWER
from rag_demo.questions import QUESTIONS_FILE, KBQuestion, load_questions, split_questions
from tests import tiny

TOPICS = ["fox", "paris", "hemingway", "baikal", "penny", "mozart"]


@pytest.fixture
def tiny_setup(tmp_path, one_torch_thread):
    """(encoder, passage vectors (6, 16), lexical index, one training question per passage)."""
    encoder = load_encoder(EncoderConfig(model=str(tiny.tiny_sentence_encoder(tmp_path / "encoder"))))
    vectors = np.random.default_rng(0).normal(size=(len(tiny.PASSAGES), 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    lexical = LexicalIndex.for_passages([t for t, _ in tiny.PASSAGES], [x for _, x in tiny.PASSAGES])
    # Each question names the topic of another passage than its gold one, so lexical matching alone misleads.
    questions = [question_tuning.TrainingQuestion(f"who wrote the {TOPICS[(row + 1) % 6]} thing", row) for row in range(6)]
    return encoder, vectors, lexical, questions


def test_tuning_reads_questions_as_an_ask_retrieves_with_them(tiny_setup):
    """Questions that differ only in their closing marks train the same weights: the tuner reads them as an ask does."""
    encoder, vectors, lexical, questions = tiny_setup
    marked = [question_tuning.TrainingQuestion(q.question + " ?", q.gold_id) for q in questions]
    config = TuningConfig(epochs=2, learning_rate=3e-3, batch_size=6)
    plain_side, marked_side = (question_tuning.tune_question_encoder(encoder, vectors, lexical, items, lexical_weight=0.2,
                                                                     config=config) for items in (questions, marked))
    for (name, plain), (_, trained) in zip(plain_side.named_parameters(), marked_side.named_parameters()):
        assert torch.equal(plain, trained), name


def test_training_split_is_the_question_split():
    """`offline.tuned.training_split` is `questions.split_questions`; the split itself is tested in test_questions."""
    items = [KBQuestion(f"who wrote book {i}", f"A{i}", "B", f"A{i}", i, i == 3) for i in range(50)]
    training, held = training_split(items)
    split = split_questions(items)
    assert (training, held) == (list(split.training), list(split.held_out))
    assert held and training and items[3] not in training


def test_tuning_pulls_training_questions_to_their_gold_passages(tiny_setup):
    encoder, vectors, lexical, questions = tiny_setup
    before_weights = {name: p.detach().clone() for name, p in encoder.question_model.named_parameters()}
    passages = torch.from_numpy(vectors)
    before = question_tuning.recall_at(encoder.question_model, encoder, passages, lexical, questions, lexical_weight=0.2, ks=(1,))
    steps = []
    tuned = question_tuning.tune_question_encoder(encoder, vectors, lexical, questions, lexical_weight=0.2,
                                         config=TuningConfig(epochs=60, learning_rate=3e-3, batch_size=6),
                                         progress=lambda done, total: steps.append((done, total)))
    after = question_tuning.recall_at(tuned, encoder, passages, lexical, questions, lexical_weight=0.2, ks=(1,))
    assert before[1] <= 0.5 and after[1] == 1.0
    assert steps[-1] == (60, 60)
    for name, p in encoder.question_model.named_parameters():  # the encoder itself is untouched
        assert torch.equal(p, before_weights[name]), name


def test_length_groups_are_runs_of_similar_length():
    assert question_tuning.length_groups([5, 1, 3, 1, 9, 2], groups=2) == [[1, 3, 5], [2, 0, 4]]
    assert question_tuning.length_groups([4, 2], groups=3) == [[1], [0]]  # no empty runs
    assert question_tuning.length_groups([7, 7, 7], groups=1) == [[0, 1, 2]]
    assert question_tuning.length_groups([], groups=2) == []


def test_a_step_in_length_runs_is_the_step_of_the_whole_batch(tiny_setup, monkeypatch):
    """The runs' gradients add up to the batch mean's: one step in 1 or 3 runs gives the same weights
    (dropout off, so the two differ only in how the batch is cut)."""
    encoder, vectors, lexical, _ = tiny_setup
    for module in encoder.question_model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    words = ["fox", "paris hemingway baikal", "penny", "mozart fox paris penny baikal", "the", "hemingway mozart"]
    questions = [question_tuning.TrainingQuestion(f"who wrote {w}", row) for row, w in enumerate(words)]
    lengths = {len(ids) for ids in encoder.tokenizer([q.question for q in questions])["input_ids"]}
    assert len(lengths) >= 3  # the runs do pad differently
    # plain SGD in place of AdamW, whose first step is about lr times the gradient's sign: with it,
    # float noise in near-zero gradients would flip whole steps, and the weights compare the gradients
    monkeypatch.setattr(torch.optim, "AdamW", lambda params, lr, fused=False: torch.optim.SGD(params, lr=lr))
    tuned = {}
    for groups in (1, 3):
        monkeypatch.setattr(question_tuning, "QUESTION_LENGTH_GROUPS", groups)
        tuned[groups] = question_tuning.tune_question_encoder(encoder, vectors, lexical, questions, lexical_weight=0.2,
                                                     config=TuningConfig(epochs=1, learning_rate=1.0, batch_size=6))
    moved = 0.0
    for (name, whole), (_, runs) in zip(tuned[1].named_parameters(), tuned[3].named_parameters()):
        torch.testing.assert_close(runs, whole, atol=1e-6, rtol=1e-5)
        moved = max(moved, (whole - dict(encoder.question_model.named_parameters())[name]).abs().max().item())
    assert moved > 1e-3  # the step did change the weights


def test_gold_ranks_count_the_passages_scored_above_the_gold_one():
    questions = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # (Q, D)
    passages = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])  # (N, D)
    lexical = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 10.0]], np.float32)  # (Q, N)
    ranks = question_tuning.gold_ranks(questions, passages, lexical, [2, 1], scale=1.0, lexical_weight=0.0)
    assert ranks.tolist() == [1, 0]
    ranks = question_tuning.gold_ranks(questions, passages, lexical, [2, 1], scale=1.0, lexical_weight=1.0)
    assert ranks.tolist() == [1, 1]  # BM25 lifts passage 2 above the second question's gold one


def test_tuned_encoder_is_built_once_and_loads_for_questions_only(tmp_path, tiny_setup, monkeypatch):
    encoder_folder = tmp_path / "encoder"
    config = EncoderConfig(model=str(encoder_folder))
    encoder, vectors, _, questions = tiny_setup
    cache = tmp_path / "cache"
    wiki = default_kb_paths(config.model, config.input_tokens, cache=cache)["nq-wiki"]
    passages = [Passage(t, x) for t, x in tiny.PASSAGES]
    save_kb(make_kb("nq-wiki", passages, vectors, encoder=config.model), wiki)
    with (wiki / QUESTIONS_FILE).open("w") as handle:
        for q in questions:
            handle.write(json.dumps({"question": q.question, "answer": "A", "swapped_answer": "B",
                                     "passage_answer": "A", "gold_id": q.gold_id}) + "\n")
    recipe = TuningConfig(epochs=2, batch_size=4)
    stages = []
    folder = ensure_tuned_encoder(encoder, config, wiki, tuning=recipe, cache=cache,
                                  progress=lambda s, d, t: stages.append(s))
    assert folder == tuned_encoder_path(config, recipe, cache=cache)
    assert marker_problem(folder, tuned_encoder_key(config, recipe)) is None
    assert any(stage.startswith("fine-tuning the question encoder") for stage in stages)

    def no_training(*args, **kwargs):
        raise AssertionError("a cached tuned encoder was trained again")

    monkeypatch.setattr(question_tuning, "tune_question_encoder", no_training)
    assert ensure_tuned_encoder(encoder, config, wiki, tuning=recipe, cache=cache) == folder

    tuned = load_encoder(config, question_path=folder)
    assert tuned.question_weights == folder.name and encoder.question_weights == ""
    asked = ["who wrote the paris thing"]
    assert not torch.allclose(tuned.encode_questions(asked), encoder.encode_questions(asked))
    assert np.allclose(tuned.encode_passages(passages[:2]), encoder.encode_passages(passages[:2]))
    other = EncoderConfig(model=str(encoder_folder), scale=5.0)
    assert tuned_encoder_path(other, recipe, cache=cache) != folder  # the key follows the retrieval logits
    assert tuned_encoder_path(config, cache=cache) != folder  # and the recipe


def test_prepare_fine_tunes_the_default_models_once_and_then_loads_nothing(default_setup, tmp_path, monkeypatch):
    """The wiring of `prepare`: the default encoder (a tiny BERT here) gets its question side
    tuned after the KBs are built, then the default generator (a tiny Llama) its reading; a warm
    prepare then loads no model and returns the same folders."""
    cache, config = default_setup
    folder, generator = config.model, cache / "models" / generator_key()[0]
    prepared = prepare(cache=cache, encoder_config=config)
    assert prepared.question_encoder_path == tuned_encoder_path(config, cache=cache)
    assert marker_problem(prepared.question_encoder_path, tuned_encoder_key(config)) is None
    assert prepared.generator_path == generator
    adapter = prepared.reader_adapter_path
    assert adapter == tuned_generator_path(encoder_config=config, cache=cache)
    assert adapter != tuned_generator_path(cache=cache)  # the KBs' encoder picks the examples the reader skips
    marker = json.loads((adapter / MARKER).read_text())
    assert marker["info"]["training_questions"] > 0
    assert sum(f.stat().st_size for f in adapter.iterdir()) < 1_000_000  # an adapter, not a copy of the model
    reloaded = load_generator(GeneratorConfig(), path=str(generator), adapter=adapter)
    assert reloaded.weights == adapter.name and reloaded.has_adapter
    original = load_generator(GeneratorConfig(), path=str(generator))
    base = dict(original.model.named_parameters())
    own = dict(reloaded.model.named_parameters())
    assert all(torch.equal(p, own[n]) for n, p in base.items())  # the base weights are untouched
    assert any(n.endswith("lora_up") and p.abs().sum() > 0 for n, p in own.items())
    ids = torch.tensor([[1, 5, 9, 12]])
    with torch.no_grad():
        reading, plain = reloaded.model(ids).logits, original.model(ids).logits
        with reloaded.base_weights():
            switched_off = reloaded.model(ids).logits
    assert not torch.allclose(reading, plain) and torch.equal(switched_off, plain)

    def no_loading(*args, **kwargs):
        raise AssertionError("a warm prepare loaded a model")

    monkeypatch.setattr("rag_demo.retrieval.encoders.load_encoder", no_loading)
    monkeypatch.setattr("rag_demo.generation.generator.load_generator", no_loading)
    assert prepare(cache=cache, encoder_config=config) == prepared
    untuned = prepare(cache=cache, encoder_config=EncoderConfig(model=folder, max_length=32, tuned=False),
                      generator_config=GeneratorConfig(tuned=False))
    assert untuned.question_encoder_path is None and untuned.kb_paths == prepared.kb_paths
    assert untuned.reader_adapter_path is None and untuned.generator_path == generator
    # what an engine without prepared data (own KBs, another generator) looks up
    assert cached_tuned_encoder(config, cache=cache) == prepared.question_encoder_path
    assert cached_tuned_encoder(EncoderConfig(model=folder, max_length=32, tuned=False), cache=cache) is None
    assert cached_tuned_generator(encoder_config=config, cache=cache) == prepared.reader_adapter_path
    assert cached_tuned_generator(GeneratorConfig(model="other/model"), encoder_config=config, cache=cache) is None
    assert cached_tuned_generator(encoder_config=replace(config, max_length=24), cache=cache) is None
    warm_own = prepare(cache=cache, encoder_config=config, build_kbs=False)
    assert (warm_own.question_encoder_path, warm_own.reader_adapter_path) == (prepared.question_encoder_path,
                                                                             prepared.reader_adapter_path)
    # a cache travels: copied or mounted elsewhere, it loads as it is, nothing rebuilt
    moved = tmp_path / "mounted" / "cache"
    moved.parent.mkdir()
    shutil.move(str(cache), str(moved))
    travelled = prepare(cache=moved, encoder_config=config)
    assert travelled.reader_adapter_path == moved / prepared.reader_adapter_path.relative_to(cache)
    assert travelled.question_encoder_path == moved / prepared.question_encoder_path.relative_to(cache)
    assert travelled.kb_paths == {name: moved / path.relative_to(cache) for name, path in prepared.kb_paths.items()}


def test_the_readers_training_questions_can_be_set_for_the_whole_build(default_setup, monkeypatch):
    """RAG_DEMO_READER_QUESTIONS: another adapter, in its own folder, found by every later lookup."""
    from rag_demo.errors import InputError
    from rag_demo.offline.tuned import build_reader_tuning

    cache, config = default_setup
    default_folder = tuned_generator_path(encoder_config=config, cache=cache)
    monkeypatch.setenv("RAG_DEMO_READER_QUESTIONS", "3")
    prepared = prepare(cache=cache, encoder_config=config)
    adapter = prepared.reader_adapter_path
    assert adapter == tuned_generator_path(encoder_config=config, cache=cache) != default_folder and not default_folder.exists()
    assert json.loads((adapter / MARKER).read_text())["info"]["training_questions"] == 3
    assert cached_tuned_generator(encoder_config=config, cache=cache) == adapter
    monkeypatch.delenv("RAG_DEMO_READER_QUESTIONS")
    assert cached_tuned_generator(encoder_config=config, cache=cache) is None  # the default recipe's adapter was never built
    for wrong in ("many", "0", "-5", "1.5", "20000"):
        with pytest.raises(InputError, match="RAG_DEMO_READER_QUESTIONS is the number of questions"):
            build_reader_tuning({"RAG_DEMO_READER_QUESTIONS": wrong})
    assert build_reader_tuning({"RAG_DEMO_READER_QUESTIONS": " "}).examples == 600


# -- the generator as a reader ------------------------------------------------------------------------

def test_shared_prefix_is_the_common_start_less_its_last_token():
    examples = [reader_tuning.ReadingExample((5, 6, 7, 8, 1), (2,)), reader_tuning.ReadingExample((5, 6, 7, 9), (2,))]
    assert reader_tuning.shared_prefix(examples) == (5, 6)
    assert reader_tuning.shared_prefix(examples[:1]) == (5, 6, 7, 8)
    assert reader_tuning.shared_prefix([reader_tuning.ReadingExample((4,), (2,)), *examples]) == ()


def test_length_sorted_batches_cover_each_example_once_and_pad_less():
    lengths = np.random.default_rng(1).integers(20, 400, size=203).tolist()
    plain = reader_tuning.length_sorted_batches(lengths, batch_size=8, window=1, seed=3)
    # window 1 is the plain seeded shuffle the reader trained with before
    assert [i for batch in plain for i in batch] == np.random.default_rng(3).permutation(203).tolist()
    sorted_ = reader_tuning.length_sorted_batches(lengths, batch_size=8, window=8, seed=3)
    for batches in (plain, sorted_):
        assert sorted(i for batch in batches for i in batch) == list(range(203))
        assert all(1 <= len(batch) <= 8 for batch in batches) and len(batches) == 26
    padded = lambda batches: sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)  # noqa: E731
    assert padded(sorted_) < 0.8 * padded(plain)
    # the batches come in a shuffled order, not shortest first
    maxima = [max(lengths[i] for i in batch) for batch in sorted_]
    assert maxima != sorted(maxima)
    assert reader_tuning.length_sorted_batches(lengths, batch_size=8, window=8, seed=3) == sorted_
    with pytest.raises(ValueError):
        reader_tuning.length_sorted_batches(lengths, batch_size=8, window=0, seed=3)


def test_reading_loss_with_the_shared_block_cached_equals_plain_full_forwards(reader):
    """Right padding, positions after the cached block, and the labels line up with one unpadded
    forward per example (no cache): the mean answer-token NLL is the same."""
    generator, examples = reader
    shared = reader_tuning.shared_prefix(examples)
    assert len(shared) > 50  # the few-shot block
    with torch.no_grad():
        got = reader_tuning.reading_loss(generator.model, shared, examples).item()
        total, count = 0.0, 0
        for example in examples:
            ids = torch.tensor([list(example.prompt_ids) + list(example.answer_ids)])
            logits = generator.model(ids).logits[0, len(example.prompt_ids) - 1:-1]  # (A, V)
            total += torch.nn.functional.cross_entropy(logits, torch.tensor(example.answer_ids), reduction="sum").item()
            count += len(example.answer_ids)
    assert got == pytest.approx(total / count, rel=1e-5)
    assert reader_tuning.mean_answer_loss(generator.model, shared, examples, batch_size=4) == pytest.approx(got, rel=1e-5)


def test_packed_rows_give_the_padded_loss_and_gradients(reader, monkeypatch):
    """Laying the rows end to end (one sequence, each row attending to the shared block and to
    itself) changes only how the batch goes through the layers: the loss and every gradient are
    those of the right-padded batch, in training mode as the reader trains."""
    from rag_demo.generation.kernels import PACKED_ATTENTION

    generator, examples = reader
    model = generator.model
    shared = reader_tuning.shared_prefix(examples)
    rows = [list(e.prompt_ids[len(shared):]) + list(e.answer_ids) for e in examples]
    assert model.config._attn_implementation == PACKED_ATTENTION and reader_tuning._packable(model, len(shared), rows)
    assert len({len(r) for r in rows}) > 1  # rows of unequal length: the padded batch pads
    packable = reader_tuning._packable
    model.train()
    try:
        results = {}
        for packed in (True, False):
            monkeypatch.setattr(reader_tuning, "_packable", packable if packed else (lambda *args: False))
            model.zero_grad(set_to_none=True)
            loss = reader_tuning.reading_loss(model, shared, examples)
            loss.backward()
            results[packed] = (loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    (packed_loss, packed_grads), (padded_loss, padded_grads) = results[True], results[False]
    assert packed_loss == pytest.approx(padded_loss, rel=1e-5)
    assert packed_grads.keys() == padded_grads.keys() and len(packed_grads) > 10
    for name, grad in packed_grads.items():
        assert torch.allclose(grad, padded_grads[name], rtol=1e-4, atol=1e-6), name


def test_rows_that_reach_past_a_sliding_window_are_padded_not_packed(reader, monkeypatch):
    """The packed attention applies no sliding window, so a batch any of whose rows a window would
    cut takes the padded path, whose masks apply it; a model without the packed attention always does."""
    generator, examples = reader
    model = generator.model
    shared = reader_tuning.shared_prefix(examples)
    rows = [list(e.prompt_ids[len(shared):]) + list(e.answer_ids) for e in examples]
    longest = len(shared) + max(map(len, rows))
    monkeypatch.setattr(model.config, "sliding_window", longest, raising=False)
    assert reader_tuning._packable(model, len(shared), rows)
    monkeypatch.setattr(model.config, "sliding_window", longest - 1)
    assert not reader_tuning._packable(model, len(shared), rows)
    monkeypatch.setattr(model.config, "layer_types", ["full_attention"] * model.config.num_hidden_layers, raising=False)
    assert reader_tuning._packable(model, len(shared), rows)  # a window no layer uses cuts nothing
    monkeypatch.setattr(model.config, "_attn_implementation", "sdpa")
    assert not reader_tuning._packable(model, len(shared), rows)


def _grouped(examples, answer_of, doc_logprobs):
    """Marginal examples: for each answer index in `answer_of`, every example's prompt read with that answer."""
    return [reader_tuning.MarginalExample(tuple(reader_tuning.ReadingExample(e.prompt_ids, examples[a].answer_ids) for e in examples[:len(doc)]),
                                   tuple(doc)) for a, doc in zip(answer_of, doc_logprobs)]


def test_marginal_loss_is_the_rag_sequence_likelihood_of_plain_forwards(reader):
    """-log sum_z p(z|x) p(y|x,z) / |y|, each p(y|x,z) from one unpadded forward of its own prompt."""
    generator, examples = reader
    shared = reader_tuning.shared_prefix(examples)
    doc_sets = [torch.log_softmax(torch.tensor([1.5, 0.2, -1.0]), 0).tolist(), torch.log_softmax(torch.tensor([0.0, 3.0]), 0).tolist()]
    batch = _grouped(examples, [0, 3], doc_sets)
    with torch.no_grad():
        got = reader_tuning.marginal_loss(generator.model, shared, batch).item()
        expected = []
        for example in batch:
            sequence = []
            for read in example.reads:
                ids = torch.tensor([list(read.prompt_ids) + list(read.answer_ids)])
                logits = generator.model(ids).logits[0, len(read.prompt_ids) - 1:-1]  # (A, V)
                sequence.append(-torch.nn.functional.cross_entropy(logits, torch.tensor(read.answer_ids), reduction="sum"))
            total = torch.logsumexp(torch.tensor(example.doc_logprobs) + torch.stack(sequence), 0)
            expected.append(-total.item() / len(example.reads[0].answer_ids))
    assert got == pytest.approx(sum(expected) / len(expected), rel=1e-5)
    # one passage with p(z|x) = 1 is the gold-passage loss of that read
    single = reader_tuning.MarginalExample(examples[2:3], (0.0,))
    with torch.no_grad():
        assert reader_tuning.marginal_loss(generator.model, shared, [single]).item() == pytest.approx(
            reader_tuning.reading_loss(generator.model, shared, examples[2:3]).item(), rel=1e-5)


def test_marginal_examples_refuse_reads_that_do_not_fit():
    read = reader_tuning.ReadingExample((1, 2), (3,))
    with pytest.raises(ValueError):
        reader_tuning.MarginalExample((read, read), (0.0,))
    with pytest.raises(ValueError):
        reader_tuning.MarginalExample((read, reader_tuning.ReadingExample((1, 2), (4,))), (-0.7, -0.7))
    with pytest.raises(ValueError):
        reader_tuning.MarginalExample((), ())


def test_reader_learns_from_the_marginal_over_retrieved_passages(reader):
    """Trained with the paper's loss, the answer's marginal likelihood over each question's passages
    rises; a step takes batch_size // K questions, and a mixed list is refused."""
    generator, examples = reader
    model = generator.model
    shared = reader_tuning.shared_prefix(examples)
    doc = torch.log_softmax(torch.tensor([2.0, 0.5, 0.0]), 0).tolist()
    batch = _grouped(examples, range(6), [doc] * 6)
    with torch.no_grad():
        before = reader_tuning.marginal_loss(model, shared, batch).item()
    steps = []
    recipe = ReaderTuningConfig(learning_rate=3e-2, batch_size=6, epochs=3, adapted_share=1.0, marginal_passages=3)
    reader_tuning.tune_reader(model, shared, batch, config=recipe, progress=lambda done, total: steps.append((done, total)))
    with torch.no_grad():
        after = reader_tuning.marginal_loss(model, shared, batch).item()
    assert after < before - 1, (before, after)
    assert steps[-1] == (9, 9)  # 6 questions, 2 a step, 3 epochs
    with pytest.raises(ValueError):
        reader_tuning.tune_reader(model, shared, [batch[0], examples[0]], config=recipe)


def test_marginal_rows_are_the_retrieved_ones_with_the_gold_passage_kept():
    kb = make_kb("nq-wiki", [Passage(f"t{r}", f"passage {r}") for r in range(6)], np.eye(6, 8, dtype=np.float32))
    found = KBQuestion("found", "A", "B", "A", 1)
    missed = KBQuestion("missed", "C", "D", "C", 5)
    calls = []

    def retrieve(name, question, k, rows):
        calls.append((name, question, k, rows))
        rows = rows if rows is not None else [0, 1, 2]
        return rows, [-float(i) - 1.0 for i in range(len(rows))]

    examples = marginal_examples(CausalGeneratorStub(), {"nq-wiki": kb}, [("nq-wiki", found), ("nq-wiki", missed)], retrieve, 3)
    assert [[read.prompt_ids[0].split()[1] for read in e.reads] for e in examples] == [["0", "1", "2"], ["0", "1", "5"]]
    assert all(read.answer_ids == ("A",) for read in examples[0].reads)
    assert all(read.answer_ids == ("C",) for read in examples[1].reads)
    # p(z|x) of a question whose gold passage was put in is the retriever's over exactly those rows
    assert calls[-1] == ("nq-wiki", "missed", 3, [0, 1, 5]) and examples[1].doc_logprobs == (-1.0, -2.0, -3.0)
    assert len(calls) == 3


def test_marginal_training_needs_the_engines_retrieval(tmp_path):
    with pytest.raises(ValueError, match="retrieval"):
        train_reader(None, {}, tuning=ReaderTuningConfig(marginal_passages=4))
    with pytest.raises(ValueError, match="retrieval"):
        train_reader(None, {}, tuning=ReaderTuningConfig(marginal_passages=1), retrieve=lambda *a: ([], []))


def test_reader_adapter_learns_the_answers_and_switches_off_to_the_base_model(reader):
    generator, examples = reader
    model = generator.model
    shared = reader_tuning.shared_prefix(examples)
    base = {name: p.detach().clone() for name, p in model.named_parameters()}
    before = reader_tuning.mean_answer_loss(model, shared, examples)
    steps = []
    recipe = ReaderTuningConfig(learning_rate=3e-2, batch_size=4, epochs=2, adapted_share=1.0)  # a tiny model needs every block
    returned = reader_tuning.tune_reader(model, shared, examples * 4, config=recipe, progress=lambda done, total: steps.append((done, total)))
    after = reader_tuning.mean_answer_loss(model, shared, examples)
    assert returned is model and not model.training
    assert after < before - 2, (before, after)  # nats per answer token
    params = dict(model.named_parameters())
    assert all(torch.equal(params[name], value) for name, value in base.items())
    assert set(params) - set(base) == set(adapter_parameters(model))
    with generator.base_weights():
        assert reader_tuning.mean_answer_loss(model, shared, examples) == pytest.approx(before, rel=1e-6)
    assert not any(p.requires_grad for p in model.parameters())
    assert steps[-1] == (12, 12)


def test_the_default_recipe_adapts_the_top_half_of_the_blocks(reader):
    from rag_demo.generation.adapters import block_number

    generator, examples = reader
    blocks = len(generator.model.model.layers)
    assert blocks >= 2 and ReaderTuningConfig().adapted_share == 0.5
    reader_tuning.tune_reader(generator.model, reader_tuning.shared_prefix(examples), examples[:2], config=ReaderTuningConfig(batch_size=2))
    adapted = {block_number(name) for name in adapter_parameters(generator.model)}
    assert adapted == set(range(blocks - (blocks + 1) // 2, blocks))


def test_full_reader_tuning_learns_the_answers_and_leaves_the_embeddings(reader):
    generator, examples = reader
    model = generator.model
    shared = reader_tuning.shared_prefix(examples)
    embeddings = model.get_input_embeddings().weight.detach().clone()
    layer = next(model.base_model.layers[0].parameters()).detach().clone()
    before = reader_tuning.mean_answer_loss(model, shared, examples)
    reader_tuning.tune_reader(model, shared, examples * 8, config=ReaderTuningConfig(method="full", learning_rate=3e-2, batch_size=4))
    assert reader_tuning.mean_answer_loss(model, shared, examples) < before - 2
    assert torch.equal(model.get_input_embeddings().weight, embeddings)
    assert not torch.equal(next(model.base_model.layers[0].parameters()), layer)
    assert not adapter_parameters(model)
    with pytest.raises(ValueError, match="unknown reader tuning method"):
        reader_tuning.tune_reader(model, shared, examples, config=ReaderTuningConfig(method="half"))


def test_reader_tuning_refuses_prompts_without_the_shared_block(reader):
    generator, examples = reader
    with pytest.raises(ValueError, match="shared block"):
        reader_tuning.tune_reader(generator.model, (99999,), examples)
    with pytest.raises(ValueError, match="no reading examples"):
        reader_tuning.tune_reader(generator.model, (), [])


def _questions_file(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    with (folder / QUESTIONS_FILE).open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return folder


def test_reading_questions_train_on_both_kbs_and_check_on_held_out_ones(tmp_path):
    rows = range(300)
    wiki = _questions_file(tmp_path / "wiki", [{"question": f"q{r}", "answer": f"A{r}", "swapped_answer": f"B{r}",
                                                "passage_answer": f"A{r}", "gold_id": r, "example": r == 7} for r in rows])
    swapped = _questions_file(tmp_path / "cf", [{"question": f"q{r}", "answer": f"A{r}", "swapped_answer": f"B{r}",
                                                 "passage_answer": "" if r % 10 == 3 else f"B{r}", "gold_id": r} for r in rows])
    paths = {"nq-wiki": wiki, "nq-counterfactual": swapped}
    training, check = reading_questions(paths, ReaderTuningConfig(examples=100, counterfactual_share=0.5))
    assert len(training) == 100 and len({q.question for _, q in training}) == 100
    held_ids = {q.gold_id for q in split_questions(load_questions(wiki)).held_out}
    assert not any(q.gold_id in held_ids or q.gold_id == 7 for _, q in training)
    assert {kb for kb, _ in training} == {"nq-wiki", "nq-counterfactual"}
    assert all(q.passage_answer == (f"B{q.gold_id}" if kb == "nq-counterfactual" else f"A{q.gold_id}") for kb, q in training)
    assert check and all(q.gold_id in held_ids for _, q in check)
    assert training == reading_questions(paths, ReaderTuningConfig(examples=100, counterfactual_share=0.5))[0]
    only_wiki, _ = reading_questions(paths, ReaderTuningConfig(examples=50, counterfactual_share=0.0))
    assert {kb for kb, _ in only_wiki} == {"nq-wiki"}


def test_distractors_match_the_question_but_hold_neither_answer(tmp_path):
    texts = ["The Old Man and the Sea is a novella written by Ernest Hemingway in 1951.",  # gold
             "Hemingway wrote the old man and the sea in Cuba; the sea was his subject.",  # holds the answer
             "The old man and the sea were painted by Winslow Homer; the sea was his subject.",  # looks like one
             "Mozart composed The Magic Flute.", "Lake Baikal is deep.", "The Penny Black was a stamp."]
    titles = [""] * len(texts)
    folder = tmp_path / "kb"
    save_kb(make_kb("kb", [Passage(t, x) for t, x in zip(titles, texts)], np.eye(len(texts), 8, dtype=np.float32)), folder)
    LexicalIndex.for_passages(titles, texts).save(folder / "bm25")
    kbs = {"nq-wiki": make_kb("nq-wiki", [Passage(t, x) for t, x in zip(titles, texts)], np.eye(len(texts), 8, dtype=np.float32))}
    question = KBQuestion("who wrote the old man and the sea", "Ernest Hemingway", "Mark Twain", "Ernest Hemingway", 0)
    unmatched = KBQuestion("zebra quagga okapi", "Okapi", "Okapi", "Okapi", 3)
    rows = distractor_rows({"nq-wiki": folder}, kbs, [("nq-wiki", question), ("nq-wiki", unmatched), ("nq-wiki", question)],
                           2, seed=0)
    assert rows == [("nq-wiki", question, 2)]  # the second has no matching passage; the third is past the count
    examples = _reading_examples(CausalGeneratorStub(), kbs, [("nq-wiki", question)], rows)
    assert [e.answer_ids for e in examples] == [("Ernest Hemingway",), (NO_ANSWER,)]
    assert "Winslow Homer" in examples[1].prompt_ids[0] and "novella" in examples[0].prompt_ids[0]


class CausalGeneratorStub:
    """Just enough of a generator for `_reading_examples`: the prompt and target as one 'token' each."""

    def format_input(self, question, passage):
        return f"{passage.text} {question}"

    def tokenizer(self, text):
        return {"input_ids": [text]}

    def answer_target(self, answer):
        return Target(prefix=(), ids=(answer,))


def test_drawn_share_is_seeded_nested_and_keeps_at_least_one():
    items = list(range(101))
    half = question_tuning.drawn_share(items, 0.5, seed=3)
    assert len(half) == 50 and len(set(half)) == 50 and set(half) <= set(items)
    assert question_tuning.drawn_share(items, 0.5, seed=3) == half
    assert question_tuning.drawn_share(items, 0.25, seed=3) == half[:25]  # a smaller share is a part of a larger one
    assert question_tuning.drawn_share(items, 0.5, seed=4) != half
    assert sorted(question_tuning.drawn_share(items, 1.0, seed=3)) == items
    assert len(question_tuning.drawn_share(items, 0.001, seed=3)) == 1
    assert question_tuning.drawn_share([], 0.5, seed=3) == []
    for share in (0, -0.5, 1.5):
        with pytest.raises(ValueError):
            question_tuning.drawn_share(items, share, seed=3)
        with pytest.raises(ValueError):
            TuningConfig(question_share=share)


def test_the_shared_block_kept_below_the_adapters_gives_the_same_loss_and_gradients(reader, monkeypatch):
    """With adapters on the top half only, the shared block's states below them are computed once
    (`frozen_bottom`): each step's loss and adapter gradients are those of running the shared block
    through every block, packed and padded alike; an adapter in the lowest block keeps nothing."""
    generator, examples = reader
    model = copy.deepcopy(generator.model)
    shared = reader_tuning.shared_prefix(examples)
    blocks = model.config.num_hidden_layers
    assert blocks >= 2
    reader_tuning.adapters_to_train(model, ReaderTuningConfig(adapted_share=0.5))
    bottom = reader_tuning.frozen_bottom(model, shared)
    assert bottom is not None and 0 < bottom.first < blocks and len(bottom.keys) == bottom.first
    packable = reader_tuning._packable
    with torch.no_grad():  # the adapters begin as a no-op (B = 0): give them weight, so the blocks above change
        for parameter in adapter_parameters(model).values():
            parameter.normal_(0, 0.05)
    results = {}
    for packed in (True, False):
        monkeypatch.setattr(reader_tuning, "_packable", packable if packed else (lambda *args: False))
        for kept in (bottom, None):
            model.zero_grad(set_to_none=True)
            loss = reader_tuning.reading_loss(model, shared, examples, bottom=kept)
            loss.backward()
            results[packed, kept is not None] = (loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                               if p.grad is not None})
        assert all("forward" not in vars(block) for block in model.base_model.layers)  # the blocks are whole again
    for packed in (True, False):
        (kept_loss, kept_grads), (plain_loss, plain_grads) = results[packed, True], results[packed, False]
        assert kept_loss == pytest.approx(plain_loss, rel=1e-6)
        assert kept_grads.keys() == plain_grads.keys() and kept_grads
        for name, grad in kept_grads.items():
            assert torch.allclose(grad, plain_grads[name], rtol=1e-5, atol=1e-7), name
    everything = copy.deepcopy(generator.model)
    reader_tuning.adapters_to_train(everything, ReaderTuningConfig(adapted_share=1.0))
    assert reader_tuning.frozen_bottom(everything, shared) is None
    assert reader_tuning.frozen_bottom(model, ()) is None

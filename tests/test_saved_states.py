"""Few-shot caches and stop tokens saved across restarts give exactly what computing them gives."""

from __future__ import annotations

import logging

import torch

from rag_demo.generation import prompts
from rag_demo.generation.adapters import AdapterShape, adapter_parameters, add_adapters
from rag_demo.config import GeneratorConfig
from rag_demo.retrieval.corpus import Passage
from rag_demo.generation.generator import CausalGenerator
from rag_demo.generation.saved_states import SavedStates
from tests import tiny
from tests.test_packed_prefill import tiny_gemma3

QUESTION = "who wrote a farewell to arms"


def _generator(model, tokenizer, folder=None, *, weights="base-1", adapter=""):
    generator = CausalGenerator(model, tokenizer, GeneratorConfig(model="t", max_prompt_tokens=400), name="t")
    generator.weights = adapter
    if folder is not None:
        generator.saved_states = SavedStates(folder, weights=weights)
    return generator


def _prompts(generator, tiny_kb):
    return [generator.format_input(QUESTION, Passage(t, x)) for t, x in zip(tiny_kb.titles[:3], tiny_kb.texts[:3])]


def _first_logprobs(generator, texts):
    with torch.inference_mode():
        state = generator.start(texts)
        after = generator.advance(state, state.logprobs.argmax(-1))
    return state.logprobs, after.logprobs


def test_a_restarted_generator_reads_the_saved_block_and_answers_the_same(tiny_parts, tiny_kb, tmp_path):
    tokenizer = tiny_parts["gen_tok"]
    model = tiny.tiny_causal(len(tokenizer))
    first = _generator(model, tokenizer, tmp_path)
    texts = _prompts(first, tiny_kb)
    computed = _first_logprobs(first, texts)
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert len([name for name in saved if name.startswith("prefix-")]) == 1  # the block with passages

    restarted = _generator(model, tokenizer, tmp_path)
    calls = []
    restarted._blocks._computed = lambda *args: calls.append(args)  # must not be needed
    loaded = _first_logprobs(restarted, texts)
    assert calls == []
    for a, b in zip(computed, loaded):
        assert torch.equal(a, b)
    ids, cache = restarted._prefix_state(prompts.few_shot_prefix())
    fresh_ids, fresh_cache = first._prefix_state(prompts.few_shot_prefix())
    assert ids == fresh_ids and cache.get_seq_length() == fresh_cache.get_seq_length() == len(ids)


def test_states_of_other_weights_are_not_read(tiny_parts, tiny_kb, tmp_path):
    tokenizer = tiny_parts["gen_tok"]
    model = tiny.tiny_causal(len(tokenizer))
    texts = _prompts(_generator(model, tokenizer), tiny_kb)
    _first_logprobs(_generator(model, tokenizer, tmp_path, weights="base-1"), texts)
    other = tiny.tiny_causal(len(tokenizer), seed=5)
    expected = _first_logprobs(_generator(other, tokenizer), texts)
    got = _first_logprobs(_generator(other, tokenizer, tmp_path, weights="base-2"), texts)
    for a, b in zip(expected, got):
        assert torch.equal(a, b)
    assert len(list(tmp_path.glob("prefix-*"))) == 2


def test_adapted_and_base_blocks_are_saved_apart(tiny_parts, tiny_kb, tmp_path):
    """Closed-book rows run on the base weights; their block must not come from the adapted one."""
    tokenizer = tiny_parts["gen_tok"]
    model = tiny.tiny_causal(len(tokenizer))
    add_adapters(model, AdapterShape(rank=4))
    with torch.no_grad():
        for parameter in adapter_parameters(model).values():
            parameter.normal_(0, 0.5)  # an adapter that changes what the model computes
    generator = _generator(model, tokenizer, tmp_path, adapter="adapter-1")
    block = prompts.few_shot_prefix()
    adapted = generator._prefix_state(block)[1].layers[-1].keys
    with generator.base_weights():
        base = generator._prefix_state(block)[1].layers[-1].keys
    assert not torch.allclose(adapted, base)
    restarted = _generator(model, tokenizer, tmp_path, adapter="adapter-1")
    with restarted.base_weights():
        assert torch.equal(restarted._prefix_state(block)[1].layers[-1].keys, base)
    assert torch.equal(restarted._prefix_state(block)[1].layers[-1].keys, adapted)
    assert len(list(tmp_path.glob("prefix-*"))) == 2


def test_a_block_longer_than_the_sliding_window_is_not_saved(tiny_parts, tiny_kb, tmp_path):
    tokenizer = tiny_parts["gen_tok"]
    block = len(tokenizer(prompts.few_shot_prefix())["input_ids"]) - 1
    generator = _generator(tiny_gemma3(len(tokenizer), sliding_window=block // 2), tokenizer, tmp_path)
    ids, cache = generator._prefix_state(prompts.few_shot_prefix())
    assert len(ids) == block and cache.layers[-1].keys.shape[-2] < block  # the window dropped part of it
    assert not list(tmp_path.glob("prefix-*"))


def test_a_damaged_file_is_computed_again_and_replaced(tiny_parts, tiny_kb, tmp_path, caplog):
    tokenizer = tiny_parts["gen_tok"]
    model = tiny.tiny_causal(len(tokenizer))
    texts = _prompts(_generator(model, tokenizer), tiny_kb)
    expected = _first_logprobs(_generator(model, tokenizer, tmp_path), texts)
    (path,) = tmp_path.glob("prefix-*")
    path.write_bytes(b"not safetensors")
    with caplog.at_level(logging.WARNING, logger="rag_demo.generation.saved_states"):
        got = _first_logprobs(_generator(model, tokenizer, tmp_path), texts)
    assert "ignoring the saved few-shot cache" in caplog.text
    for a, b in zip(expected, got):
        assert torch.equal(a, b)
    assert SavedStates(tmp_path, weights="base-1").load_prefix(prompts.few_shot_prefix(), adapter=None, model=model) is not None


def test_a_read_only_folder_only_costs_the_time(tiny_parts, tiny_kb, tmp_path):
    tokenizer = tiny_parts["gen_tok"]
    model = tiny.tiny_causal(len(tokenizer))
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would be")
    texts = _prompts(_generator(model, tokenizer), tiny_kb)
    expected = _first_logprobs(_generator(model, tokenizer), texts)
    got = _first_logprobs(_generator(model, tokenizer, blocked / "states"), texts)
    for a, b in zip(expected, got):
        assert torch.equal(a, b)


def test_stop_tokens_are_saved_and_read_back(tiny_parts, tmp_path):
    tokenizer = tiny_parts["gen_tok"]
    model = tiny.tiny_causal(len(tokenizer))
    computed = _generator(model, tokenizer, tmp_path).stop_ids
    assert computed == _generator(model, tokenizer).stop_ids
    restarted = _generator(model, tokenizer, tmp_path)
    restarted.tokenizer = None  # reading the saved set needs no vocabulary scan
    assert restarted.stop_ids == computed

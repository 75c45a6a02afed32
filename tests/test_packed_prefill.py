"""Packed causal prefill and cheap cache forks give what the plain left-padded batch gives."""

from __future__ import annotations

import pytest
import torch

from rag_demo.config import GeneratorConfig
from rag_demo.generation.decode_state import copy_cache
from rag_demo.generation.generator import CausalGenerator
from rag_demo.generation.kernels import PACKED_ATTENTION
from tests import tiny

QUESTION = "who wrote a farewell to arms"


def tiny_gemma3(vocab_size: int, *, sliding_window: int, seed: int = 3):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, sliding_window=sliding_window, max_position_embeddings=1024,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        bos_token_id=0, eos_token_id=2, pad_token_id=1, initializer_range=0.5,
    )
    return Gemma3ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def texts(tiny_parts, tiny_kb):
    from rag_demo.retrieval.corpus import Passage

    generator = CausalGenerator(tiny.tiny_causal(len(tiny_parts["gen_tok"])), tiny_parts["gen_tok"],
                                GeneratorConfig(model="t", max_prompt_tokens=400), name="t")
    return [generator.format_input(QUESTION, Passage(t, x)) for t, x in zip(tiny_kb.titles, tiny_kb.texts)]


def _decode_both(generator, texts, steps):
    """Log-probs after start and after each of `steps` greedy tokens, packed and padded."""
    out = {}
    for packed in (True, False):
        rows = [generator.tokenizer(t)["input_ids"] for t in texts]
        shared, prefix_cache = generator._shared_prefix(rows)
        assert shared and generator._can_pack(rows, prefix_cache, len(shared))
        if not packed:
            generator._packable_layers = ()
        with torch.inference_mode():
            state = generator.start(texts)
            seen = [state.logprobs]
            for _ in range(steps):
                state = generator.advance(state, state.logprobs.argmax(-1))
                seen.append(state.logprobs)
        out[packed] = seen
        generator.__dict__.pop("_packable_layers", None)
    return out


@pytest.mark.parametrize("window", [4096, 700])
def test_packed_prefill_equals_padded_batch(tiny_parts, texts, window, monkeypatch):
    import rag_demo.generation.generator as generator_module

    tokenizer = tiny_parts["gen_tok"]
    model = tiny_gemma3(len(tokenizer), sliding_window=window)
    generator = CausalGenerator(model, tokenizer, GeneratorConfig(model="t", max_prompt_tokens=400), name="t")
    assert model.config._attn_implementation == PACKED_ATTENTION  # packed rows attend row by row; padded ones by SDPA
    lengths = [len(tokenizer(t)["input_ids"]) for t in texts]
    assert len(set(lengths)) > 1 and max(lengths) <= window  # padding is really saved; the window allows packing
    monkeypatch.setattr(generator_module, "PACK_TOKENS", 1000)  # several packed forwards of two or three rows
    steps = window - max(lengths) + 3 if window < 4096 else 4  # decoding runs past the window
    both = _decode_both(generator, texts, steps)
    for packed, padded in zip(both[True], both[False]):
        assert torch.allclose(packed, padded, atol=1e-4)


def test_copy_cache_is_independent(tiny_parts, texts):
    generator = CausalGenerator(tiny.tiny_causal(len(tiny_parts["gen_tok"])), tiny_parts["gen_tok"],
                                GeneratorConfig(model="t", max_prompt_tokens=400), name="t")
    with torch.inference_mode():
        state = generator.start(texts[:3])
        before = [layer.keys.clone() for layer in state.cache.layers]
        branch = generator.fork(state, torch.tensor([2, 0]))
        generator.advance(branch, torch.tensor([5, 6]))
        assert copy_cache(state.cache).layers[0] is not state.cache.layers[0]
    assert all(torch.equal(a, layer.keys) for a, layer in zip(before, state.cache.layers))


@pytest.mark.parametrize("window", [4096, 40, 6])
def test_packed_teacher_forcing_equals_pair_by_pair(tiny_parts, texts, window, monkeypatch):
    """Targets laid end to end per row give each pair's log-probs of the one-pair-per-row path. A
    sliding window that the cache and pack cross (40) is applied by a mask of its own for the
    sliding layers; one shorter than a target (6) sends the call to the one-pair-per-row path."""
    import rag_demo.generation.generator as generator_module
    from rag_demo.generation.generator import Generator

    tokenizer = tiny_parts["gen_tok"]
    generator = CausalGenerator(tiny_gemma3(len(tokenizer), sliding_window=window), tokenizer,
                                GeneratorConfig(model="t", max_prompt_tokens=400), name="t")
    answers = ["ernest hemingway", "a", "the old man and the sea by ernest hemingway", "mark twain"]
    ids = [generator.answer_target(a).ids for a in answers]
    pairs = [(t, r) for t in range(len(ids)) for r in (0, 2, 3, 1) if (t + r) % 3]  # rows repeat, in mixed order
    width = max(len(i) for i in ids)
    targets = torch.zeros(len(pairs), width, dtype=torch.long)
    mask = torch.zeros(len(pairs), width, dtype=torch.bool)
    for p, (t, _) in enumerate(pairs):
        targets[p, : len(ids[t])] = torch.tensor(ids[t])
        mask[p, : len(ids[t])] = True
    rows = torch.tensor([r for _, r in pairs])
    with torch.inference_mode():
        state = generator.start(texts[:4])
        packable = generator._can_pack_targets(state, rows.tolist(), mask.sum(1).tolist())
        assert packable == (window != 6)
        assert max(mask.sum(1).tolist()) >= 6 and (window == 4096) == (state.attention_mask.shape[1] < window)
        expected = Generator.continuation_logprobs(generator, state, rows, targets, mask)
        packed = generator.continuation_logprobs(state, rows, targets, mask)
        monkeypatch.setattr(generator_module, "CONTINUATION_BYTES", 1)  # a group per pair
        one_by_one = generator.continuation_logprobs(state, rows, targets, mask)
    assert torch.allclose(packed, expected, atol=1e-4) and torch.allclose(one_by_one, expected, atol=1e-4)
    assert bool((expected[mask] < 0).all()) and bool((expected[~mask] == 0).all())

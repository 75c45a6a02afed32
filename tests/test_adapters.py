"""Reading adapters: off gives the base model exactly, per thread; saved and loaded alone; the engine
answers closed-book on the base weights and reads passages with the adapter."""

from __future__ import annotations

import threading

import pytest
import torch

from rag_demo.generation import adapters
from rag_demo.engine import RagEngine
from rag_demo.generation.generator import CausalGenerator
from tests.ui_engine import make_ui_engine


def _tiny_llama(seed: int = 0, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def _perturb(model, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in adapters.adapter_parameters(model).items():
            if name.endswith("lora_up"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)


def test_adapters_cover_every_linear_layer_but_the_head_and_start_as_no_change():
    model, plain = _tiny_llama(), _tiny_llama()
    adapters.add_adapters(model, adapters.AdapterShape(rank=4, alpha=8))
    names = adapters.adapted_layer_names(model)
    assert len(names) == 2 * 7 and "lm_head" not in names  # q, k, v, o, gate, up, down per layer
    ids = torch.tensor([[3, 9, 27, 5]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, plain(ids).logits, atol=1e-6)  # B = 0
    with pytest.raises(ValueError, match="already has adapters"):
        adapters.add_adapters(model)


def test_switching_off_gives_the_base_model_exactly_and_only_in_this_thread():
    model, plain = _tiny_llama(), _tiny_llama()
    adapters.add_adapters(model, adapters.AdapterShape(rank=4, alpha=8))
    _perturb(model)
    ids = torch.tensor([[3, 9, 27, 5]])
    seen = {}
    with torch.no_grad():
        reading = model(ids).logits
        assert not torch.allclose(reading, plain(ids).logits, atol=1e-3)
        with adapters.base_weights(model):
            assert torch.equal(model(ids).logits, plain(ids).logits)
            assert not adapters.adapters_active(model)
            other = threading.Thread(target=lambda: seen.update(logits=model(ids).logits))
            other.start()
            other.join()
        assert adapters.adapters_active(model)
    assert torch.equal(seen["logits"], reading)  # the other thread kept reading with the adapter


def test_saved_adapter_loads_alone_and_refuses_another_shape(tmp_path):
    model = _tiny_llama()
    adapters.add_adapters(model, adapters.AdapterShape(rank=4, alpha=8))
    _perturb(model)
    adapters.save_adapters(model, tmp_path)
    assert adapters.is_adapter_folder(tmp_path) and not adapters.reads_no_answer(tmp_path)
    (tmp_path / "marker").mkdir()
    adapters.save_adapters(model, tmp_path / "marker", no_answer=True)
    assert adapters.reads_no_answer(tmp_path / "marker")
    fresh = _tiny_llama()
    adapters.load_adapters(fresh, tmp_path)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)
    from transformers import LlamaConfig, LlamaForCausalLM

    wider = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    with pytest.raises(ValueError, match="does not fit"):
        adapters.load_adapters(wider, tmp_path)
    with pytest.raises(ValueError, match="no adapters"):
        adapters.save_adapters(_tiny_llama(), tmp_path)


@pytest.fixture(scope="module")
def engines(tmp_path_factory, one_torch_thread):
    """(an engine whose generator has a perturbed reading adapter, the same engine without it)."""
    with_adapter = make_ui_engine(tmp_path_factory.mktemp("adapted"))
    plain = make_ui_engine(tmp_path_factory.mktemp("plain"))
    adapters.add_adapters(with_adapter.generator.model, adapters.AdapterShape(rank=4, alpha=8))
    _perturb(with_adapter.generator.model, seed=5)
    return with_adapter, plain


def test_closed_book_uses_the_base_weights_and_reading_the_adapter(engines):
    adapted, plain = engines
    question = "who wrote a farewell to arms?"
    assert adapted.generator.has_adapter and not plain.generator.has_adapter
    assert adapted.closed_book(question) == plain.closed_book(question)
    read, base = adapted.ask(question, k=2), plain.ask(question, k=2)
    assert read.closed_book == base.closed_book
    token = read.variants["token"]
    reference = plain.score(question, token.answer, k=2, variants=("token",)).variants["token"]
    if reference.token_ids == token.token_ids:  # the closed-book log-probs of the same tokens are the base model's
        assert token.closed_book_token_logprobs == pytest.approx(reference.closed_book_token_logprobs, abs=1e-5)
    assert read.variants["token"].doc_token_logprobs != base.variants["token"].doc_token_logprobs
    scored, reference = adapted.score(question, "Hemingway", k=2), plain.score(question, "Hemingway", k=2)
    # the answer's own tokens (the ending after them is each model's likeliest, so it may differ)
    answer_tokens = len(scored.closed_book.tokens) - 1
    assert scored.closed_book.tokens[:answer_tokens] == reference.closed_book.tokens[:answer_tokens]
    assert scored.closed_book.token_logprobs[:answer_tokens] == pytest.approx(
        reference.closed_book.token_logprobs[:answer_tokens], abs=1e-5)
    assert scored.variants["token"].doc_token_logprobs[0] != reference.variants["token"].doc_token_logprobs[0]
    assert adapters.adapters_active(adapted.generator.model)  # switched back on after every closed-book pass


def test_the_few_shot_cache_is_kept_apart_for_base_and_adapted_weights(engines):
    adapted, _ = engines
    generator: CausalGenerator = adapted.generator
    text = "Question: one\nAnswer: two\n\n"
    with_adapter = generator._prefix_state(text)[1]
    with generator.base_weights():
        without = generator._prefix_state(text)[1]
    assert without is not with_adapter
    assert not torch.equal(without.layers[0].keys, with_adapter.layers[0].keys)
    assert isinstance(adapted, RagEngine)


def test_adapters_from_a_first_layer_leave_the_blocks_below_untouched_and_untrained(tmp_path):
    """With first_layer, only blocks from it up carry adapters, and training leaves the lower blocks
    out of the backward pass: no lower hidden state requires grad."""
    model = _tiny_llama(layers=4)
    adapters.add_adapters(model, adapters.AdapterShape(rank=2, alpha=4, first_layer=2))
    blocks = {adapters.block_number(name) for name in adapters.adapter_parameters(model)}
    assert blocks == {2, 3}
    trained = {id(p) for p in adapters.adapter_parameters(model).values()}
    for parameter in model.parameters():  # as the reader's training sets them
        parameter.requires_grad_(id(parameter) in trained)
    seen = {}
    for number, block in enumerate(model.model.layers):
        block.register_forward_hook(lambda module, inputs, output, number=number:
                                    seen.__setitem__(number, (output[0] if isinstance(output, tuple) else output).requires_grad))
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    assert seen == {0: False, 1: False, 2: True, 3: True}
    with pytest.raises(ValueError, match="leaves no layer"):
        adapters.add_adapters(_tiny_llama(layers=4), adapters.AdapterShape(first_layer=4))
    assert [adapters.first_block_for_share(_tiny_llama(layers=4), share) for share in (1.0, 0.5, 0.3, 0.01)] == [0, 2, 2, 3]
    with pytest.raises(ValueError, match="share"):
        adapters.first_block_for_share(model, 0.0)
    _perturb(model)
    adapters.save_adapters(model, tmp_path)
    loaded = _tiny_llama(layers=4)
    adapters.load_adapters(loaded, tmp_path)
    assert set(adapters.adapter_parameters(loaded)) == set(adapters.adapter_parameters(model))
    with torch.no_grad():
        ids = torch.tensor([[1, 2, 3]])
        assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits)

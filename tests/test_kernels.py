"""CPU fast paths compute what the plain torch / transformers calls compute."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rag_demo.generation import kernels


@pytest.mark.parametrize("shape", [(1, 24), (5, 24), (2, 3, 24), (kernels.FEW_ROWS + 1, 24)])
@pytest.mark.parametrize("bias", [False, True])
def test_few_rows_linear_equals_linear(shape, bias):
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 9000, bias=bias)
    x = torch.randn(*shape)
    expected = F.linear(x, layer.weight, layer.bias)
    kernels.use_few_rows_head_module(layer)
    assert type(layer) is kernels.FewRowsLinear
    out = layer(x)
    assert out.shape == expected.shape and out.is_contiguous()
    assert torch.allclose(out, expected, atol=1e-5, rtol=1e-5)


def test_few_rows_head_keeps_tied_weights_and_skips_small_heads():
    from transformers import LlamaConfig, LlamaForCausalLM

    big = LlamaForCausalLM(LlamaConfig(vocab_size=kernels.MIN_VOCAB, hidden_size=16, intermediate_size=32,
                                       num_hidden_layers=1, num_attention_heads=2, tie_word_embeddings=True))
    embedding = big.get_input_embeddings().weight
    assert kernels.use_few_rows_head(big)
    assert type(big.get_output_embeddings()) is kernels.FewRowsLinear
    assert big.get_output_embeddings().weight is embedding
    assert kernels.use_few_rows_head(big)  # a second call leaves it as it is
    small = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2))
    assert not kernels.use_few_rows_head(small)
    assert type(small.get_output_embeddings()) is torch.nn.Linear


def test_stock_head_restores_plain_linear_inside_the_block_only():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=kernels.MIN_VOCAB, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2))
    kernels.use_few_rows_head(model)
    head = model.get_output_embeddings()
    with kernels.stock_head(model):
        assert type(head) is torch.nn.Linear
    assert type(head) is kernels.FewRowsLinear
    with pytest.raises(RuntimeError), kernels.stock_head(model):
        raise RuntimeError("a failing generate")
    assert type(head) is kernels.FewRowsLinear  # put back after an error too
    plain = torch.nn.Linear(4, 5)
    with kernels.stock_head(plain):  # nothing to undo on a model without a swapped head
        assert type(plain) is torch.nn.Linear


def test_few_rows_linear_leaves_bfloat16_to_linear():
    layer = torch.nn.Linear(8, 9000).to(torch.bfloat16)
    kernels.use_few_rows_head_module(layer)
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


class _Attention(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True
        self.eval()  # a module in training mode goes to SDPA attention (its dropout)


@pytest.mark.parametrize("heads,kv_heads", [(4, 1), (2, 2)])
@pytest.mark.parametrize("shared", [0, 7])
def test_packed_rows_attention_equals_masked_sdpa(heads, kv_heads, shared):
    """Row by row over [prefix | own tokens] equals one SDPA over the packed sequence with a block mask."""
    torch.manual_seed(1)
    lengths, dim = (3, 5, 1, 4), 8
    total = sum(lengths)
    query = torch.randn(1, heads, total, dim)
    key, value = torch.randn(2, 1, kv_heads, shared + total, dim)
    allowed = torch.zeros(total, shared + total, dtype=torch.bool)
    allowed[:, :shared] = True
    start = 0
    for n in lengths:
        allowed[start : start + n, shared + start : shared + start + n] = torch.ones(n, n, dtype=torch.bool).tril()
        start += n
    repeat = heads // kv_heads
    expected = F.scaled_dot_product_attention(query, key.repeat_interleave(repeat, 1), value.repeat_interleave(repeat, 1),
                                              attn_mask=allowed[None, None], scale=0.3).transpose(1, 2)
    out, weights = kernels.packed_rows_attention(_Attention(repeat), query, key, value, None, scaling=0.3,
                                                 packed_rows=(shared, lengths))
    assert weights is None and out.shape == (1, total, heads, dim)
    assert torch.allclose(out, expected, atol=1e-6)


def test_packed_rows_attention_without_rows_is_sdpa_attention():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(2)
    query, key, value = torch.randn(3, 2, 2, 5, 8)
    mask = torch.rand(2, 1, 5, 5) > 0.3
    mask[..., 0] = True
    module = _Attention(1)
    out, _ = kernels.packed_rows_attention(module, query, key, value, mask, scaling=0.5)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.5)
    assert torch.equal(out, expected)


def test_registered_name_builds_masks_and_attends():
    """A model switched to the packed attention gives the SDPA model's logits on an ordinary padded batch."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    ids = torch.randint(3, 50, (2, 6))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.inference_mode():
        expected = model(input_ids=ids, attention_mask=mask).logits
        model.set_attn_implementation(kernels.register_packed_attention())
        out = model(input_ids=ids, attention_mask=mask).logits
    assert model.config._attn_implementation == kernels.PACKED_ATTENTION
    assert torch.allclose(out[0, 2:], expected[0, 2:], atol=1e-6) and torch.allclose(out[1], expected[1], atol=1e-6)

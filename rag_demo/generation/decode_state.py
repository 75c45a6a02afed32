"""What a decode carries from step to step: each row's next-token log-probs, its KV cache and
masks, and the answer targets teacher forcing scores; copying a cache and selecting rows cheaply.

`rag_demo.generation.generator` makes and advances these; `rag_demo.generation.decoding` searches over them.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import torch


@dataclass
class DecodeState:
    """Per-row decoding state. R rows; S encoder positions; L prompt + generated positions."""

    logprobs: torch.Tensor  # (R, V) float32 log p(next token | row so far)
    cache: object  # transformers Cache
    encoder_hidden: torch.Tensor | None = None  # (R, S, H) seq2seq only
    encoder_mask: torch.Tensor | None = None  # (R, S)
    attention_mask: torch.Tensor | None = None  # (R, L) causal only
    next_position: torch.Tensor | None = None  # (R,) causal only

    @property
    def rows(self) -> int:
        return int(self.logprobs.shape[0])


@dataclass(frozen=True)
class Target:
    """An answer as the generator scores it: `prefix` is fed, `ids` are scored (EOS / stop included)."""

    prefix: tuple[int, ...]
    ids: tuple[int, ...]


def index_rows(tensor: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if tensor is None else tensor.index_select(0, rows)


def row_bytes(state: DecodeState) -> int:
    """Bytes of one row's cache and encoder states (what a fork copies per row)."""
    cache = state.cache
    caches = [cache.self_attention_cache, cache.cross_attention_cache] if hasattr(cache, "self_attention_cache") else [cache]
    tensors = [state.encoder_hidden] + [getattr(layer, name, None) for c in caches for layer in getattr(c, "layers", ())
                                        for name in ("keys", "values")]
    total = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    return total // max(state.rows, 1)


def copy_cache(cache):
    """A new cache object over the same key/value tensors.

    Dynamic cache layers never write into their tensors (`update` concatenates, `reorder_cache`
    index-selects; both rebind), so a copy of the layer objects is an independent cache at no cost.
    """
    if hasattr(cache, "self_attention_cache"):  # EncoderDecoderCache
        copied = copy.copy(cache)
        copied.self_attention_cache = copy_cache(cache.self_attention_cache)
        copied.cross_attention_cache = copy_cache(cache.cross_attention_cache)
        copied.is_updated = dict(cache.is_updated)
        return copied
    from transformers import DynamicCache

    if not isinstance(cache, DynamicCache) or not all(type(layer) in rebinding_layers() for layer in cache.layers):
        return copy.deepcopy(cache)
    copied = copy.copy(cache)
    copied.layers = [copy.copy(layer) for layer in cache.layers]
    return copied


@functools.cache
def rebinding_layers() -> tuple[type, ...]:
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    return (DynamicLayer, DynamicSlidingWindowLayer)


def join_rows(first: DecodeState, second: DecodeState) -> DecodeState | None:
    """The rows of `first`, then those of `second`, as one causal decode, so that one forward pass steps
    them all: each cache layer's keys and values are left-padded to the longer of the two (a sliding
    layer keeps at most its window, so its two lengths are padded alike), and so are the attention
    masks, whose zeros hide the padding; positions stay each row's own. None where a cache is not plain
    dynamic layers (or the states are not causal), so the caller steps them apart.

    Both states must come from the same model and weights: a row is then stepped exactly as alone.
    """
    from transformers import DynamicCache

    caches = (first.cache, second.cache)
    if (first.attention_mask is None or second.attention_mask is None or first.encoder_hidden is not None
            or not all(isinstance(c, DynamicCache) and all(type(layer) in rebinding_layers() for layer in c.layers) for c in caches)
            or len(first.cache.layers) != len(second.cache.layers)):
        return None

    def left_padded(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
        width = max(t.shape[dim] for t in tensors)
        padded = []
        for t in tensors:
            shape = list(t.shape)
            shape[dim] = width - t.shape[dim]
            padded.append(torch.cat([t.new_zeros(shape), t], dim=dim))
        return torch.cat(padded, dim=0)

    cache = copy_cache(first.cache)
    for joined, a, b in zip(cache.layers, first.cache.layers, second.cache.layers):
        joined.keys = left_padded([a.keys, b.keys], dim=-2)
        joined.values = left_padded([a.values, b.values], dim=-2)
        if hasattr(a, "cumulative_length"):  # sliding layers count every position seen: the padded length
            joined.cumulative_length = max(first.attention_mask.shape[1], second.attention_mask.shape[1])
    return DecodeState(
        logprobs=torch.cat([first.logprobs, second.logprobs.to(first.logprobs.device)]),
        cache=cache,
        attention_mask=left_padded([first.attention_mask, second.attention_mask], dim=1),
        next_position=torch.cat([first.next_position, second.next_position]),
    )

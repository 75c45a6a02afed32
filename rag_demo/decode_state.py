"""What a decode carries from step to step: each row's next-token log-probs, its KV cache and
masks, and the answer targets teacher forcing scores; copying a cache and selecting rows cheaply.

`rag_demo.generator` makes and advances these; `rag_demo.decoding` searches over them.
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

"""Fast paths that keep a generator's math and change only how torch is asked to compute it.

- The vocabulary projection of a few rows (CPU, float32). A decode step or a prefill that keeps
  only the last positions sends 1-64 rows through the LM head, a (V, H) matrix (Gemma-3:
  262,144 x 640, 671 MB in float32). For that shape `F.linear(x, W)` (x @ Wᵀ) measured 2-3x
  slower on this project's CPUs than `W @ xᵀ`, the same products in the other operand order
  (docs/speed-notes.md). `FewRowsLinear` keeps the weight (tied weights stay tied) and only
  swaps the product.
- Packed prefill attention. Packing the k passage prompts into one sequence avoids computing
  padding in the linear layers, but one attention over the packed sequence scores every query
  against every row's keys and masks most of them away. `packed_rows_attention` attends each
  row to the shared prefix and its own keys only: the same softmax, about half the work at k=5.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

FEW_ROWS = 64  # up to this many rows the (V, H) @ (H, rows) product wins (docs/speed-notes.md)
MIN_VOCAB = 8192  # smaller heads are cheap either way
PACKED_ATTENTION = "rag_demo_packed_rows"


class FewRowsLinear(torch.nn.Linear):
    """An nn.Linear that computes few-row float32 CPU inputs as W @ xᵀ; otherwise nn.Linear."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.numel() // max(hidden.shape[-1], 1)
        if not (0 < rows <= FEW_ROWS and hidden.device.type == "cpu" and hidden.dtype == torch.float32
                and self.weight.dtype == torch.float32):
            return super().forward(hidden)
        flat = hidden.reshape(rows, hidden.shape[-1])
        out = torch.mm(self.weight, flat.t()).t().contiguous()  # (rows, V)
        if self.bias is not None:
            out += self.bias
        return out.view(*hidden.shape[:-1], self.out_features)


def use_few_rows_head(model) -> bool:
    """Make `model`'s output projection a FewRowsLinear in place (same weight). True when it is one."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is torch.nn.Linear and head.out_features >= MIN_VOCAB:
        use_few_rows_head_module(head)
    return isinstance(head, FewRowsLinear)


def use_few_rows_head_module(layer: torch.nn.Linear) -> None:
    """Swap the forward of this nn.Linear for FewRowsLinear's; parameters and state stay as they are."""
    layer.__class__ = FewRowsLinear


@contextlib.contextmanager
def stock_head(model):
    """Within the block `model`'s output projection is a plain nn.Linear again.

    `benchmarks.speed` times transformers' own generate on the module our engine also runs; this keeps the
    fast path above on our side only, so their time is that of the code they ship."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not FewRowsLinear:
        yield
        return
    head.__class__ = torch.nn.Linear
    try:
        yield
    finally:
        head.__class__ = FewRowsLinear


def packed_rows_attention(module, query, key, value, attention_mask, *, scaling=None, dropout=0.0,
                          packed_rows: tuple[int, tuple[int, ...]] | None = None, **kwargs):
    """Attention for a packed prefill or a packed training step (`tuning`, no attention dropout);
    any other call goes to transformers' SDPA attention.

    packed_rows = (shared, lengths): the query holds rows of `lengths` tokens end to end, the keys
    are [shared prefix | the same rows]. Each row attends to the prefix and causally to itself.
    query (1, H, N, D); key, value (1, H_kv, shared + N, D) -> (1, N, H, D), as SDPA attention returns.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if packed_rows is None or (module.training and dropout) or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    shared, lengths = packed_rows
    grouped = query.shape[1] != key.shape[1]
    outputs, start = [], 0
    for n in lengths:
        rows_keys = torch.cat([key[:, :, :shared], key[:, :, shared + start : shared + start + n]], dim=2)
        rows_values = torch.cat([value[:, :, :shared], value[:, :, shared + start : shared + start + n]], dim=2)
        outputs.append(F.scaled_dot_product_attention(query[:, :, start : start + n], rows_keys, rows_values,
                                                      attn_mask=_prefix_causal_mask(shared, n, query.device),
                                                      scale=scaling, enable_gqa=grouped))
        start += n
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def packed_rows_mask(shared: int, lengths: list[int], dtype: torch.dtype) -> torch.Tensor:
    """(1, 1, N, shared + N) additive mask of rows of `lengths` packed end to end after a shared
    prefix: each row sees the prefix and causally itself. What `packed_rows_attention` computes row
    by row; plain SDPA needs it whole."""
    total = sum(lengths)
    allowed = torch.zeros(total, shared + total, dtype=torch.bool)
    allowed[:, :shared] = True
    end = 0
    for n in lengths:
        end += n
        allowed[end - n:end, shared + end - n:shared + end] = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def attention_windows(model_config) -> tuple[float, ...]:
    """Each layer's attention window as its cache keeps it (inf: full attention), from the model's config."""
    from transformers import DynamicCache

    return tuple(float(getattr(layer, "sliding_window", None) or math.inf)
                 for layer in DynamicCache(config=model_config).layers)


def rows_fit_windows(windows: Sequence[float], longest: int) -> bool:
    """Rows may run packed end to end: the packed mask applies no attention window, so each row, with
    everything before it (the shared prefix, a cache), must fit every layer's window. No windows
    known (`windows` empty) means no packing.

    >>> rows_fit_windows((math.inf, 512.0), 512), rows_fit_windows((math.inf, 512.0), 513), rows_fit_windows((), 3)
    (True, False, False)
    """
    return bool(windows) and all(longest <= window for window in windows)


@dataclass(frozen=True)
class PackedRows:
    """Rows of token ids laid end to end after a shared prefix of `shared` positions, as one forward takes them."""

    ids: torch.Tensor  # (1, N) the rows' tokens
    positions: torch.Tensor  # (1, N) each row's positions, from `shared` on
    mask: torch.Tensor  # (1, 1, N, shared + N) additive: each row sees the prefix and causally itself
    ends: torch.Tensor  # (R,) where each row ends in the pack (cumulative lengths), on the CPU
    lengths: tuple[int, ...]
    shared: int

    def model_kwargs(self, model_config) -> dict:
        """The forward's packing arguments: the mask, and the row layout for `packed_rows_attention` when the
        model attends through it (plain SDPA and eager read the mask alone)."""
        packed = {"packed_rows": (self.shared, self.lengths)} if model_config._attn_implementation == PACKED_ATTENTION else {}
        return {"attention_mask": self.mask, "position_ids": self.positions, **packed}


def pack_rows(rows: Sequence[Sequence[int]], *, shared: int, dtype: torch.dtype, device: torch.device) -> PackedRows:
    """`rows` (token ids, the shared prefix left out) packed for one forward after a prefix of `shared` positions."""
    lengths = tuple(len(row) for row in rows)
    ids = torch.tensor([[token for row in rows for token in row]], dtype=torch.long, device=device)  # (1, N)
    positions = torch.cat([torch.arange(shared, shared + n) for n in lengths])[None].to(device)  # (1, N)
    mask = packed_rows_mask(shared, list(lengths), dtype).to(device)
    return PackedRows(ids=ids, positions=positions, mask=mask, ends=torch.tensor(lengths).cumsum(0), lengths=lengths,
                      shared=shared)


def _prefix_causal_mask(shared: int, n: int, device: torch.device) -> torch.Tensor:
    """(1, 1, n, shared + n) bool: every query sees the prefix and the row's tokens up to itself."""
    allowed = torch.ones(n, shared + n, dtype=torch.bool, device=device)
    allowed[:, shared:] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    return allowed[None, None]


@functools.cache
def register_packed_attention() -> str:
    """Register `packed_rows_attention` (and SDPA's mask builder) with transformers under PACKED_ATTENTION."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(PACKED_ATTENTION, packed_rows_attention)
    AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)
    return PACKED_ATTENTION

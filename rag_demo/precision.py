"""bfloat16 autocast for the build, where the hardware runs it natively.

Embedding the default KBs and fine-tuning the question encoder are much of a first start. With
AMX or AVX-512 BF16 (recent Xeons) or a CUDA GPU, their matrix products run two to three times
faster in bfloat16 under autocast, while weights, optimizer state, losses and the softmaxes stay
float32; the vectors and the encoder's recall came out the same. The reader's fine-tune can use it
too but the default build does not: there it saved a sixth of the time and cost 3 points of
reading. Elsewhere bfloat16 would be emulated and slower, so autocast is off.
Serving never uses this: answers and their probabilities are computed in the model's own dtype.
"""

from __future__ import annotations

import contextlib

import torch


def bf16_native(device: torch.device | str) -> bool:
    """True when `device` multiplies bfloat16 matrices in hardware."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def build_autocast(device: torch.device | str, *, enabled: bool = True) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on `device` when `enabled` and native there; a no-op context otherwise."""
    device = torch.device(device)
    if not (enabled and bf16_native(device)):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def build_precision(device: torch.device | str, *, enabled: bool = True) -> str:
    """What `build_autocast` will use, for the cache's records: "bfloat16-autocast" or "float32"."""
    return "bfloat16-autocast" if enabled and bf16_native(device) else "float32"

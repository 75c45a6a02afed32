"""Low-rank adapters (LoRA, Hu et al. 2021) on a generator's linear layers, with an off switch.

The offline default reads passages with a fine-tuned generator, but its closed-book answers must
come from the base weights: closed-book shows what the model knows without passages, and a
reader trained only on passages has forgotten how to answer without one. An adapter keeps both in
one model. Each adapted layer computes

    y = x Wᵀ + b + (alpha / rank) · (x Aᵀ) Bᵀ        A: (rank, in), B: (out, rank)

and the second term can be switched off (`base_weights`) to get the base model exactly. B starts
at zero, so a fresh adapter changes nothing. The switch is per thread: a closed-book pass in one
thread never changes what another thread's reading pass computes.

The adapter is saved alone (`adapter.safetensors`, a few MB) beside a small JSON of its shape.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

ADAPTER_WEIGHTS = "adapter.safetensors"
ADAPTER_CONFIG = "adapter.json"
ADAPTER_NO_ANSWER = "no_answer.json"  # present when the adapter learned `prompts.NO_ANSWER`


@dataclass(frozen=True)
class AdapterShape:
    rank: int = 16
    alpha: float = 32.0
    # Blocks numbered below this (the `layers.N` of the module names) get no adapter. Training then
    # back-propagates only through the blocks from it up: with the lower half left out, a step of
    # Gemma-3-270m's took 0.64 of one that adapts every block (benchmarks/reader_steps.py).
    first_layer: int = 0


class AdapterSwitch(threading.local):
    """Whether adapters act, for the current thread (on unless a `base_weights` block says otherwise)."""

    on = True


class AdaptedLinear(torch.nn.Linear):
    """An nn.Linear plus a switchable low-rank term; the base weight and bias are the layer's own."""

    lora_down: torch.nn.Parameter  # A (rank, in)
    lora_up: torch.nn.Parameter  # B (out, rank)
    lora_scaling: float
    adapter_switch: AdapterSwitch

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = F.linear(hidden, self.weight, self.bias)
        if self.adapter_switch.on:
            out = out + F.linear(F.linear(hidden, self.lora_down), self.lora_up) * self.lora_scaling
        return out


def block_number(name: str) -> int | None:
    """The N of the first `layers.N` in a module name ("model.layers.12.mlp.up_proj" -> 12), or None.

    >>> block_number("model.layers.12.mlp.up_proj"), block_number("lm_head")
    (12, None)
    """
    parts = name.split(".")
    return next((int(after) for before, after in zip(parts, parts[1:]) if before == "layers" and after.isdigit()), None)


def adapted_layer_names(model: torch.nn.Module, first_layer: int = 0) -> list[str]:
    """Every nn.Linear of `model` except its output head (tied to the token embeddings in Gemma),
    and with `first_layer` > 0 only those in blocks numbered from `first_layer` up."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = [name for name, module in model.named_modules()
             if isinstance(module, torch.nn.Linear) and module is not head]
    if first_layer <= 0:
        return names
    numbered = [(name, block_number(name)) for name in names]
    if all(number is None for _, number in numbered):
        raise ValueError("this model's layers are not numbered as layers.N, so first_layer cannot pick among them")
    kept = [name for name, number in numbered if number is not None and number >= first_layer]
    if not kept:
        raise ValueError(f"first_layer {first_layer} leaves no layer to adapt")
    return kept


def first_block_for_share(model: torch.nn.Module, share: float) -> int:
    """The `first_layer` that adapts the top `share` of the model's numbered blocks (at least one).

    `share` 1 adapts every layer (0). A model whose layers are not numbered as layers.N must use 1.
    """
    if not 0 < share <= 1:
        raise ValueError(f"the adapted share of blocks must be in (0, 1], not {share}")
    if share == 1:
        return 0
    numbers = {block_number(name) for name in adapted_layer_names(model)} - {None}
    if not numbers:
        raise ValueError("this model's layers are not numbered as layers.N, so a share of them cannot be picked")
    blocks = max(numbers) + 1
    return blocks - max(1, math.ceil(blocks * share))


def add_adapters(model: torch.nn.Module, shape: AdapterShape = AdapterShape(), *, seed: int = 0) -> AdapterSwitch:
    """Give every adaptable linear layer of `model` a fresh adapter (B = 0: the model is unchanged).

    Returns the switch shared by all of them. The base weights are left as they are.
    """
    if adapter_switch(model) is not None:
        raise ValueError("this model already has adapters")
    switch = AdapterSwitch()
    generator = torch.Generator().manual_seed(seed)
    for name in adapted_layer_names(model, shape.first_layer):
        layer = model.get_submodule(name)
        weight = layer.weight
        down = torch.empty(shape.rank, layer.in_features, dtype=torch.float32)
        # the uniform bound of nn.Linear's default init (kaiming_uniform with a = sqrt(5))
        down.uniform_(-1 / math.sqrt(layer.in_features), 1 / math.sqrt(layer.in_features), generator=generator)
        layer.__class__ = AdaptedLinear
        layer.lora_down = torch.nn.Parameter(down.to(weight.device, weight.dtype), requires_grad=False)
        layer.lora_up = torch.nn.Parameter(torch.zeros(layer.out_features, shape.rank, device=weight.device, dtype=weight.dtype),
                                           requires_grad=False)
        layer.lora_scaling = shape.alpha / shape.rank
        layer.adapter_switch = switch
    model.adapter_switch = switch
    model.adapter_shape = shape
    return switch


def adapter_switch(model: torch.nn.Module) -> AdapterSwitch | None:
    return getattr(model, "adapter_switch", None)


def adapter_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The adapters' own parameters by name (empty for a model without adapters)."""
    return {name: p for name, p in model.named_parameters() if name.endswith((".lora_down", ".lora_up"))}


@contextlib.contextmanager
def base_weights(model: torch.nn.Module):
    """Within the block, in this thread, `model` computes with its base weights alone."""
    switch = adapter_switch(model)
    if switch is None:
        yield
        return
    was = switch.on
    switch.on = False
    try:
        yield
    finally:
        switch.on = was


def adapters_active(model: torch.nn.Module) -> bool:
    switch = adapter_switch(model)
    return switch is not None and switch.on


def save_adapters(model: torch.nn.Module, folder: Path, *, no_answer: bool = False) -> None:
    """The adapters' weights and shape in `folder`; `no_answer`: they were trained to write
    `prompts.NO_ANSWER` after a passage that does not answer (see `reads_no_answer`)."""
    from safetensors.torch import save_file

    tensors = {name: p.detach().to("cpu", torch.float32).contiguous() for name, p in adapter_parameters(model).items()}
    if not tensors:
        raise ValueError("this model has no adapters to save")
    save_file(tensors, str(Path(folder) / ADAPTER_WEIGHTS))
    (Path(folder) / ADAPTER_CONFIG).write_text(json.dumps(asdict(model.adapter_shape)))
    if no_answer:
        (Path(folder) / ADAPTER_NO_ANSWER).write_text("{}")


def reads_no_answer(folder: str | Path) -> bool:
    """Whether the adapter saved in `folder` was trained to say when a passage does not answer."""
    return (Path(folder) / ADAPTER_NO_ANSWER).is_file()


def is_adapter_folder(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_WEIGHTS).is_file() and (Path(folder) / ADAPTER_CONFIG).is_file()


def load_adapters(model: torch.nn.Module, folder: str | Path) -> AdapterSwitch:
    """Add the adapters saved in `folder` to `model` (in the base weights' dtype and device)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    shape = AdapterShape(**json.loads((folder / ADAPTER_CONFIG).read_text()))
    switch = add_adapters(model, shape)
    saved = load_file(str(folder / ADAPTER_WEIGHTS))
    own = adapter_parameters(model)
    if set(saved) != set(own):
        missing, extra = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
        raise ValueError(f"the adapter in {folder} does not fit this model (missing {missing[:2]}, unexpected {extra[:2]})")
    with torch.no_grad():
        for name, parameter in own.items():
            if saved[name].shape != parameter.shape:
                raise ValueError(f"the adapter in {folder} does not fit this model ({name}: {tuple(saved[name].shape)} "
                                 f"vs {tuple(parameter.shape)})")
            parameter.copy_(saved[name].to(parameter.dtype))
    return switch

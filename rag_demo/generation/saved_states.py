"""What a causal generator works out once per process, saved beside the models so that a restarted
server's first ask does not work it out again.

Before its first answer the offline default computes the KV cache of each few-shot block its
prompts begin with (three blocks: with passages, with passages on the base weights for
closed-book rows, and without passages), about 1 s on two cores, and scans its 262,144-token
vocabulary for the tokens that end an answer line, 0.3 s. Both depend only on the weights, the
text and the software that computed them, so each is saved under a key of all of those and read
back in milliseconds. A file that cannot be read is computed again; a cache folder that cannot be
written (a read-only mount) only costs the time. `FewShotBlocks` holds the blocks of one process;
`SavedStates` keeps them, and the stop tokens, across restarts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

FORMAT = 1  # bump when what is saved, or how it is laid out, changes


@dataclass(frozen=True)
class SavedStates:
    """Saved states of one generator. `weights` names its weights by content (the offline default's
    cache folder names are content keys), so states of other weights never match."""

    folder: Path
    weights: str

    def _path(self, kind: str, suffix: str, **parts) -> Path:
        import transformers

        described = {"format": FORMAT, "kind": kind, "weights": self.weights, "torch": torch.__version__,
                     "transformers": transformers.__version__, **parts}
        key = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:24]
        return self.folder / f"{kind}-{key}{suffix}"

    def load_prefix(self, text: str, *, adapter: str | None, model) -> tuple[list[int], object] | None:
        """(the block's token ids, a transformers DynamicCache holding its keys and values) as saved
        for `model` (on its device, in its dtype); None when not saved or not readable."""
        path = self._prefix_path(text, adapter, model)
        if not path.is_file():
            return None
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt", device="cpu") as saved:
                ids = json.loads(saved.metadata()["ids"])
                layers = int(saved.metadata()["layers"])
                kv = [(saved.get_tensor(f"keys.{i}"), saved.get_tensor(f"values.{i}")) for i in range(layers)]
        except Exception as err:  # a damaged or foreign file: compute the block again and save over it
            log.warning("ignoring the saved few-shot cache %s (%s)", path.name, err)
            return None
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        if len(kv) != len(cache.layers) or any(k.shape[-2] != len(ids) or v.shape[-2] != len(ids) for k, v in kv):
            log.warning("ignoring the saved few-shot cache %s: its shape does not match the model or its tokens", path.name)
            return None
        device = next(model.parameters()).device
        for index, (keys, values) in enumerate(kv):
            cache.update(keys.to(device), values.to(device), index)  # as the block's forward pass fills each layer
        return ids, cache

    def save_prefix(self, text: str, ids: list[int], cache, *, adapter: str | None, model) -> None:
        """Save the block's cache, if it holds every position of the block: a sliding-window layer
        past its window keeps fewer (and counts what it dropped), so it could not be rebuilt."""
        layers = getattr(cache, "layers", None)
        if not ids or not layers or any(getattr(layer, "keys", None) is None or layer.keys.shape[-2] != len(ids)
                                        for layer in layers):
            return
        from safetensors.torch import save_file

        tensors = {}
        for i, layer in enumerate(layers):
            tensors[f"keys.{i}"] = layer.keys.detach().to("cpu").contiguous()
            tensors[f"values.{i}"] = layer.values.detach().to("cpu").contiguous()
        metadata = {"ids": json.dumps(ids), "layers": str(len(layers))}
        self._write(self._prefix_path(text, adapter, model), lambda tmp: save_file(tensors, tmp, metadata=metadata))

    def _prefix_path(self, text: str, adapter: str | None, model) -> Path:
        device = next(model.parameters()).device
        return self._path("prefix", ".safetensors", text=text, adapter=adapter, dtype=str(model.dtype), device=device.type)

    def ids(self, kind: str, compute, **parts) -> frozenset[int]:
        """The token ids saved under `kind` and `parts`, or `compute()`d and saved."""
        path = self._path(kind, ".json", **parts)
        try:
            return frozenset(int(i) for i in json.loads(path.read_text()))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as err:
            log.warning("ignoring the saved %s in %s (%s)", kind, path.name, err)
        ids = frozenset(compute())
        self._write(path, lambda tmp: Path(tmp).write_text(json.dumps(sorted(ids))))
        return ids

    def _write(self, path: Path, write) -> None:
        """Write through a temporary file renamed into place: a reader never sees half a file."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=self.folder)
            os.close(handle)
            try:
                write(tmp)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError as err:  # a read-only cache: the state is computed at each start instead
            log.info("could not save %s in %s (%s); it is computed at each start", path.name, self.folder, err)


class FewShotBlocks:
    """The KV cache of each few-shot block a causal generator's prompts begin with, computed once
    per text and weights (`adapter` None: the base weights), or read from saved states."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.states: dict[tuple[str, str | None], tuple[list[int], object]] = {}
        self._lock = threading.Lock()

    def state(self, text: str, *, adapter: str | None, saved: SavedStates | None) -> tuple[list[int], object]:
        """(the block's token ids, its one-row cache); shared: `copy_cache` it before writing."""
        with self._lock:
            key = (text, adapter)
            if key not in self.states:
                state = saved.load_prefix(text, adapter=adapter, model=self.model) if saved else None
                if state is None:
                    state = self._computed(text)
                    if saved:
                        saved.save_prefix(text, *state, adapter=adapter, model=self.model)
                self.states[key] = state
            return self.states[key]

    def _computed(self, text: str) -> tuple[list[int], object]:
        from transformers import DynamicCache

        ids = self.tokenizer(text)["input_ids"]
        # the block's last token is left to the rows: its tokenization can merge with what follows
        ids = ids[:-1]
        cache = DynamicCache(config=self.model.config)
        if ids:
            device = next(self.model.parameters()).device
            with torch.inference_mode():
                self.model(input_ids=torch.tensor([ids], dtype=torch.long, device=device), cache=cache, use_cache=True,
                           logits_to_keep=1)
        return ids, cache

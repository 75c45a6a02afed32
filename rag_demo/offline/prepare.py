"""The offline default in one call: `prepare()` builds whatever is missing and returns where it all is."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import EncoderConfig, GeneratorConfig
from ..packaged import resolve_encoder_path
from ..progress import Progress
from .cache import marker_problem, resolve_root
from .gguf import ensure_generator
from .kbs import default_kb_paths, ensure_default_kbs, kb_key
from .source import ensure_source
from .tuned import (
    cached_tuned_encoder,
    cached_tuned_generator,
    ensure_tuned_encoder,
    ensure_tuned_generator,
    wants_reading_adapter,
    wants_tuned_encoder,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedPaths:
    """Where `prepare` found or built each part of the offline default."""

    generator_path: Path  # float32 safetensors folder of the default generator
    encoder_path: str  # the default encoder's packaged folder, or the hub id / folder configured
    kb_paths: dict[str, Path] = field(default_factory=dict)  # empty when build_kbs=False
    question_encoder_path: Path | None = None  # the fine-tuned question side; None: the encoder's own
    reader_adapter_path: Path | None = None  # the generator's reading adapter; None: the converted generator reads as it is


def prepare(
    *,
    cache: str | Path | None = None,
    progress: Progress | None = None,
    build_kbs: bool = True,
    encoder_config: EncoderConfig = EncoderConfig(),
    generator_config: GeneratorConfig = GeneratorConfig(),
) -> PreparedPaths:
    """Fetch, convert and embed whatever of the offline default is not cached yet.

    When everything is cached this only reads markers and imports neither torch nor a model
    (a few ms). The encoder is loaded only to embed missing KBs or to fine-tune its question side,
    the generator only to fine-tune it.
    """
    root = resolve_root(cache)
    started = time.perf_counter()
    generator_path = ensure_generator(cache=root, progress=progress)
    encoder_path = resolve_encoder_path(encoder_config.model)
    kb_paths: dict[str, Path] = {}
    tunes = wants_tuned_encoder(encoder_config)
    question_path = cached_tuned_encoder(encoder_config, cache=root)
    reads = wants_reading_adapter(generator_config)
    tuned_generator = cached_tuned_generator(generator_config, cache=root)
    if build_kbs:
        kb_paths = default_kb_paths(encoder_config.model, encoder_config.max_length, cache=root)
        key = kb_key(encoder_config.model, encoder_config.max_length)
        kbs_ready = all(marker_problem(path, key) is None for path in kb_paths.values())
        if not kbs_ready or (tunes and question_path is None):
            from ..encoders import load_encoder

            if not kbs_ready:
                ensure_source(cache=root, progress=progress)  # fetch before the encoder takes memory
            encoder = load_encoder(encoder_config)
            kb_paths = ensure_default_kbs(encoder, cache=root, progress=progress)
            if tunes:
                question_path = ensure_tuned_encoder(encoder, encoder_config, kb_paths["nq-wiki"], cache=root,
                                                     progress=progress)
            del encoder
        if reads and tuned_generator is None:
            tuned_generator = ensure_tuned_generator(generator_path, kb_paths, generator_config=generator_config,
                                                     cache=root, progress=progress)
    else:
        if tunes and question_path is None:
            log.info("no fine-tuned question encoder is cached (it is built with the default KBs); using the packaged one")
        if reads and tuned_generator is None:
            log.info("no reading adapter is cached (it is built with the default KBs); the converted generator reads")
    log.info("offline default ready in %.2f s under %s", time.perf_counter() - started, root)
    return PreparedPaths(generator_path=generator_path, encoder_path=encoder_path, kb_paths=kb_paths,
                         question_encoder_path=question_path, reader_adapter_path=tuned_generator)

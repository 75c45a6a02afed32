"""The offline default in one call: `prepare()` builds whatever is missing and returns where it all is.

`prepare_in_stages()` builds the same, but says after each part what can serve already, so a
first start answers within minutes and improves while it builds:

    1 of 4  BM25 over the passages, and the converted base generator (no embeddings needed)
    2 of 4  dense retrieval: both KBs embedded with the packaged encoder
    3 of 4  the fine-tuned question encoder
    4 of 4  the generator's reading adapter: full quality
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..config import DEFAULT_KBS, EncoderConfig, GeneratorConfig
from ..corpus import KnowledgeBase, text_only_kb
from ..errors import RagDemoError
from ..packaged import resolve_encoder_path
from ..progress import Progress
from .cache import build_lock, marker_problem, recording_timeline, resolve_root
from .gguf import ensure_generator, generator_key
from .kbs import EXAMPLES_PER_KB, default_kb_paths, ensure_default_kbs, kb_key
from .source import ensure_source, read_default_data
from .tuned import (
    cached_tuned_encoder,
    cached_tuned_generator,
    check_tuned_generator,
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


STAGES = 4  # the parts a first start serves in turn; see the module docstring


@dataclass(frozen=True)
class Readiness:
    """What of the offline default can serve now, and what is still building.

    `paths.kb_paths` is empty until the KBs are embedded; meanwhile `text_kbs` holds their
    passages with no vectors (`corpus.text_only_kb`), for BM25. `question_encoder_path` and
    `reader_adapter_path` are None until those are trained (or when the config wants none).
    """

    paths: PreparedPaths
    stage: int  # 1..STAGES; STAGES once everything is built
    text_kbs: Mapping[str, KnowledgeBase] = field(default_factory=dict)
    text_examples: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # example questions of `text_kbs`

    @property
    def complete(self) -> bool:
        return self.stage == STAGES

    def serving(self) -> str:
        """Which parts answer now, for the page's banner and each answer's notices."""
        retrieval = ("dense retrieval with the fine-tuned question encoder" if self.paths.question_encoder_path
                     else "dense retrieval" if self.paths.kb_paths else "BM25 retrieval")
        reader = "the reading adapter" if self.paths.reader_adapter_path else "the base generator"
        return f"{retrieval} and {reader}"

    def building(self) -> str:
        """What is still being built, e.g. "dense vectors are building (2 of 4)"; "" when complete."""
        if self.complete:
            return ""
        part = {1: "dense vectors are", 2: "the fine-tuned question encoder is", 3: "the reading adapter is"}[self.stage]
        return f"{part} building ({self.stage + 1} of {STAGES})"


def _text_stage(data, base: PreparedPaths) -> Readiness:
    kbs = {name: text_only_kb(name, data.passages[name]) for name in DEFAULT_KBS}
    # Example questions before any retrieval check: the held-out candidates, in their seeded order.
    questions = tuple(data.examples[i].question for i in data.candidates[:EXAMPLES_PER_KB])
    return Readiness(base, stage=1, text_kbs=kbs, text_examples={name: questions for name in kbs})


def prepare_in_stages(
    *,
    cache: str | Path | None = None,
    progress: Progress | None = None,
    build_kbs: bool = True,
    encoder_config: EncoderConfig = EncoderConfig(),
    generator_config: GeneratorConfig = GeneratorConfig(),
) -> Iterator[Readiness]:
    """Build what is missing of the offline default, yielding a `Readiness` after each part that
    lets it serve better; the last one yielded is complete. With everything cached it yields
    once, having only read markers (no torch, no model). One build per cache folder at a time:
    another process building the same folder is waited for (`cache.build_lock`).

    Without `build_kbs` (own KBs with the default generator) only the generator is converted.
    """
    root = resolve_root(cache)
    started = time.perf_counter()
    with build_lock(root, progress), recording_timeline() as timeline, ThreadPoolExecutor(1) as fetching:
        kb_paths = default_kb_paths(encoder_config.model, encoder_config.input_tokens, cache=root)
        key = kb_key(encoder_config.model, encoder_config.input_tokens)
        kbs_ready = all(marker_problem(path, key) is None for path in kb_paths.values())
        # A missing model package is reported before anything is downloaded.
        encoder_path = resolve_encoder_path(encoder_config.model)
        generator_key()
        # The source's download waits on the network while the GGUF's conversion keeps the cores
        # busy, so the two overlap; the thread copies this context to record into the same timeline.
        source = (fetching.submit(contextvars.copy_context().run, ensure_source, cache=root, progress=progress)
                  if build_kbs and not kbs_ready else None)
        generator_path = ensure_generator(cache=root, progress=progress)
        tunes = wants_tuned_encoder(encoder_config)
        question_path = cached_tuned_encoder(encoder_config, cache=root)
        reads = wants_reading_adapter(generator_config)
        adapter_path = cached_tuned_generator(generator_config, encoder_config=encoder_config, cache=root)
        base = PreparedPaths(generator_path=generator_path, encoder_path=encoder_path)
        if not build_kbs:
            if tunes and question_path is None:
                log.info("no fine-tuned question encoder is cached (it is built with the default KBs); using the packaged one")
            if reads and adapter_path is None:
                log.info("no reading adapter is cached (it is built with the default KBs); the converted generator reads")
            yield Readiness(replace(base, question_encoder_path=question_path, reader_adapter_path=adapter_path), stage=STAGES)
            return
        if kbs_ready and (question_path or not tunes) and (adapter_path or not reads):
            yield Readiness(replace(base, kb_paths=kb_paths, question_encoder_path=question_path,
                                    reader_adapter_path=adapter_path), stage=STAGES)
            return
        if not kbs_ready or (tunes and question_path is None):
            from ..encoders import load_encoder

            data = None
            if not kbs_ready:
                data = read_default_data(source.result())  # before the encoder takes memory
                yield _text_stage(data, base)
            encoder = load_encoder(encoder_config)
            kb_paths = ensure_default_kbs(encoder, cache=root, progress=progress, data=data)
            if tunes:
                yield Readiness(replace(base, kb_paths=kb_paths), stage=2)
                question_path = ensure_tuned_encoder(encoder, encoder_config, kb_paths["nq-wiki"], cache=root,
                                                     progress=progress)
            del encoder
        built_adapter = reads and adapter_path is None
        if built_adapter:
            yield Readiness(replace(base, kb_paths=kb_paths, question_encoder_path=question_path), stage=3)
            adapter_path = ensure_tuned_generator(generator_path, kb_paths, generator_config=generator_config,
                                                  encoder_config=encoder_config, cache=root, progress=progress)
        if timeline.steps:
            log.info("offline default built under %s:\n%s", root, timeline.table())
        log.info("offline default ready in %.1f s", time.perf_counter() - started)
        yield Readiness(replace(base, kb_paths=kb_paths, question_encoder_path=question_path,
                                reader_adapter_path=adapter_path), stage=STAGES)
        if built_adapter:  # measured once it serves: the record need not hold up full quality
            try:
                check_tuned_generator(generator_path, adapter_path, kb_paths, generator_config=generator_config,
                                      progress=progress)
            except RagDemoError as err:  # the adapter is built and serving; only its record is missing
                log.warning("the reading adapter's held-out check was not recorded: %s", err)


def prepare(
    *,
    cache: str | Path | None = None,
    progress: Progress | None = None,
    build_kbs: bool = True,
    encoder_config: EncoderConfig = EncoderConfig(),
    generator_config: GeneratorConfig = GeneratorConfig(),
) -> PreparedPaths:
    """Fetch, convert, embed and fine-tune whatever of the offline default is not cached yet.

    When everything is cached this only reads markers and imports neither torch nor a model
    (a few ms). The encoder is loaded only to embed missing KBs or to fine-tune its question side,
    the generator only to fine-tune it. The log shows a timeline of the steps that ran, and after it
    the held-out check of a reading adapter built just now.
    """
    readiness = None
    for readiness in prepare_in_stages(cache=cache, progress=progress, build_kbs=build_kbs,
                                       encoder_config=encoder_config, generator_config=generator_config):
        pass
    return readiness.paths

"""The offline default in one call: `prepare()` builds whatever is missing and returns where it all is.

`prepare_in_stages()` builds the same, but says after each part what can serve already, so a
first start answers within minutes and improves while it builds:

    text      BM25 over the passages, and the converted base generator (no embeddings needed)
    dense     dense retrieval: the general pair embedded first (wikipedia, the page's base, and its
              counterfactual twin), then the NQ pair
    encoder   the question encoder fine-tuned on nq-wiki's training questions
    reader    the generator's reading adapter: full quality

The NQ pair comes from BIG-bench's task, fetched from PyPI. Where it cannot be had, the build goes
on without it (and without the two parts trained on it), says so, and does not try again at the
next start unless the sdist is put in downloads/ by hand or `python -m rag_demo prepare` runs.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..config import DEFAULT_KBS, GENERAL_KBS, NQ_KBS, EncoderConfig, GeneratorConfig
from ..retrieval.corpus import KnowledgeBase, text_only_kb
from ..errors import CacheError, RagDemoError
from ..packaged import resolve_encoder_path
from ..progress import Progress
from .cache import build_lock, marker_problem, recording_timeline, resolve_root, writing
from .gguf import ensure_generator, generator_key
from .kbs import (
    EXAMPLES_PER_KB,
    default_kb_keys,
    default_kb_paths,
    ensure_general_kbs,
    ensure_nq_kbs,
    general_text_examples,
)
from .leads import ensure_leads, read_leads
from .source import TASK_SOURCE, ensure_source, manual_sdist_path, read_default_data
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
    kb_paths: dict[str, Path] = field(default_factory=dict)  # the default KBs built so far; empty when build_kbs=False
    question_encoder_path: Path | None = None  # the fine-tuned question side; None: the encoder's own
    reader_adapter_path: Path | None = None  # the generator's reading adapter; None: the converted generator reads as it is
    unavailable: Mapping[str, str] = field(default_factory=dict)  # default KBs that cannot be built here, and why


# What each part of the build makes serve, as the page's banner says it is building
PARTS = {"dense": "dense vectors are", "dense-nq": "dense vectors of the NQ pair are",
         "encoder": "the fine-tuned question encoder is", "reader": "the reading adapter is"}


@dataclass(frozen=True)
class Readiness:
    """What of the offline default can serve now, and what is still building.

    `paths.kb_paths` holds the KBs embedded so far; `text_kbs` holds the others' passages with no
    vectors (`corpus.text_only_kb`), for BM25. `question_encoder_path` and `reader_adapter_path` are
    None until those are trained (or when the config or the missing NQ pair wants none). `coming`
    names the parts still to build, in order (keys of PARTS).
    """

    paths: PreparedPaths
    stage: int = 1  # 1.. stages; the last once everything is built
    stages: int = 1
    text_kbs: Mapping[str, KnowledgeBase] = field(default_factory=dict)
    text_examples: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # example questions of `text_kbs`
    coming: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.coming

    def serving(self) -> str:
        """Which parts answer now, for the page's banner and each answer's notices. BM25 is built before the dense
        vectors, so a base with vectors answers with the default retriever, Dense + BM25."""
        paths = self.paths
        if paths.question_encoder_path:
            retrieval = "Dense + BM25 retrieval with the fine-tuned question encoder"
        elif paths.kb_paths and self.text_kbs:
            retrieval = f"Dense + BM25 retrieval on {', '.join(paths.kb_paths)}, BM25 on {', '.join(self.text_kbs)}"
        else:
            retrieval = "Dense + BM25 retrieval" if paths.kb_paths else "BM25 retrieval"
        reader = "the reading adapter" if paths.reader_adapter_path else "the base generator"
        return f"{retrieval} and {reader}"

    def building(self) -> str:
        """What is being built, e.g. "dense vectors are building (2 of 4)"; "" when complete."""
        if self.complete:
            return ""
        return f"{PARTS[self.coming[0]]} building ({self.stage + 1} of {self.stages})"

    def missing(self) -> str:
        """Why default KBs are left out, for the page and the log; "" when none is."""
        return "; ".join(f"{name}: {reason}" for name, reason in self.paths.unavailable.items())


def _unavailable_note(root: Path) -> Path:
    return root / "sources" / f"{TASK_SOURCE.package}-{TASK_SOURCE.version}.unavailable.json"


def _nq_note(root: Path, retry: bool) -> str | None:
    """Why the NQ pair is not tried at this start (an earlier start could not fetch it), or None."""
    if retry or manual_sdist_path(root).is_file():
        return None
    try:
        return str(json.loads(_unavailable_note(root).read_text(encoding="utf-8"))["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _record_nq_outcome(root: Path, reason: str | None) -> None:
    note = _unavailable_note(root)
    try:
        with writing(note.parent):
            note.parent.mkdir(parents=True, exist_ok=True)
            if reason is None:
                note.unlink(missing_ok=True)
            else:
                note.write_text(json.dumps({"reason": reason}), encoding="utf-8")
    except CacheError as err:  # only a later start's retry depends on it
        log.warning("could not record the NQ source's outcome: %s", err)


def _fetch_sources(root: Path, progress: Progress | None, *, leads: bool, task: bool):
    """(leads path or None, task.json path or None, why the task could not be fetched or None). The leads
    are needed: their failure is the build's. The task is optional: its failure is returned."""
    leads_path = ensure_leads(cache=root, progress=progress) if leads else None
    task_path, failure = None, None
    if task:
        try:
            task_path = ensure_source(cache=root, progress=progress)
        except CacheError as err:
            failure = str(err)
    return leads_path, task_path, failure


def _unavailable_reason(failure: str, root: Path) -> str:
    return (f"BIG-bench's task could not be fetched ({failure.split(';')[0]}); put {TASK_SOURCE.archive} at "
            f"{manual_sdist_path(root)} or run `python -m rag_demo prepare` to try PyPI again")


def prepare_in_stages(
    *,
    cache: str | Path | None = None,
    progress: Progress | None = None,
    build_kbs: bool = True,
    encoder_config: EncoderConfig = EncoderConfig(),
    generator_config: GeneratorConfig = GeneratorConfig(),
    retry_unavailable: bool = False,
) -> Iterator[Readiness]:
    """Build what is missing of the offline default, yielding a `Readiness` after each part that
    lets it serve better; the last one yielded is complete. With everything cached it yields
    once, having only read markers (no torch, no model). One build per cache folder at a time:
    another process building the same folder is waited for (`cache.build_lock`).

    Without `build_kbs` (own KBs with the default generator) only the generator is converted.
    `retry_unavailable` tries PyPI again for an NQ source an earlier start could not fetch.
    """
    root = resolve_root(cache)
    started = time.perf_counter()
    with build_lock(root, progress), recording_timeline() as timeline, ThreadPoolExecutor(1) as fetching:
        all_paths = default_kb_paths(encoder_config.model, encoder_config.input_tokens, cache=root)
        keys = default_kb_keys(encoder_config.model, encoder_config.input_tokens)
        built = {name for name, path in all_paths.items() if marker_problem(path, keys[name]) is None}
        # A missing model package is reported before anything is downloaded.
        encoder_path = resolve_encoder_path(encoder_config.model)
        generator_key()
        nq_missing = not set(NQ_KBS) <= built
        skipped = _nq_note(root, retry_unavailable) if build_kbs and nq_missing else None
        wants_leads = build_kbs and not set(GENERAL_KBS) <= built
        wants_task = build_kbs and nq_missing and skipped is None
        # The sources' downloads wait on the network while the GGUF's conversion keeps the cores
        # busy, so the two overlap; the thread copies this context to record into the same timeline.
        sources = (fetching.submit(contextvars.copy_context().run, _fetch_sources, root, progress, leads=wants_leads,
                                   task=wants_task)
                   if wants_leads or wants_task else None)
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
            yield Readiness(replace(base, question_encoder_path=question_path, reader_adapter_path=adapter_path))
            return
        leads_path, task_path, failure = sources.result() if sources is not None else (None, None, None)
        unavailable = {}
        reason = _unavailable_reason(failure, root) if failure else skipped
        if wants_task:
            _record_nq_outcome(root, reason)
        if reason:  # said once, when the fetch fails; later starts that skip it say so only in the info log
            log.log(logging.WARNING if failure else logging.INFO, "the NQ knowledge bases are left out: %s", reason)
            unavailable = {name: reason for name in NQ_KBS if name not in built}
        has_nq = set(NQ_KBS) <= built or task_path is not None
        # the tuned parts learn from nq-wiki's training questions: without the NQ pair there are none
        tunes, reads = tunes and has_nq, reads and has_nq
        if not has_nq:
            question_path = adapter_path = None
        base = replace(base, unavailable=unavailable)
        coming = ((("dense",) if leads_path is not None else ())
                  + (("dense-nq",) if task_path is not None else ())
                  + (("encoder",) if tunes and question_path is None else ())
                  + (("reader",) if reads and adapter_path is None else ()))
        if coming[:1] == ("dense-nq",):
            coming = ("dense",) + coming[1:]  # only the NQ pair to embed: it is the dense stage
        kb_paths = {name: all_paths[name] for name in DEFAULT_KBS if name in built}
        if not coming:
            yield Readiness(replace(base, kb_paths=kb_paths, question_encoder_path=question_path,
                                    reader_adapter_path=adapter_path))
            return
        data = read_default_data(task_path) if task_path is not None else None  # before the encoder takes memory
        leads = read_leads(leads_path) if leads_path is not None else None
        text = {}
        if leads is not None:
            text |= {name: (text_only_kb(name, passages), general_text_examples())
                     for name, passages in zip(GENERAL_KBS, (leads.passages, leads.counterfactual.passages))}
        if data is not None:
            # Example questions before any retrieval check: the held-out candidates, in their seeded order.
            questions = tuple(data.examples[i].question for i in data.candidates[:EXAMPLES_PER_KB])
            text |= {name: (text_only_kb(name, data.passages[name]), questions) for name in NQ_KBS}

        def readiness(remaining: tuple[str, ...]) -> Readiness:
            """What serves while the parts `remaining` are still to build (stage 1 serves before any)."""
            ordered = {name: kb_paths[name] for name in DEFAULT_KBS if name in kb_paths}
            return Readiness(replace(base, kb_paths=ordered, question_encoder_path=question_path,
                                     reader_adapter_path=adapter_path),
                             stage=len(coming) + 1 - len(remaining), stages=len(coming) + 1,
                             text_kbs={name: kb for name, (kb, _) in text.items()},
                             text_examples={name: qs for name, (_, qs) in text.items()}, coming=remaining)

        remaining = coming
        yield readiness(remaining)
        if leads is not None or data is not None or "encoder" in remaining:
            from ..retrieval.encoders import load_encoder

            encoder = load_encoder(encoder_config)
            if leads is not None:
                kb_paths |= ensure_general_kbs(encoder, leads, cache=root, progress=progress)
                for name in GENERAL_KBS:
                    del text[name]
                remaining = remaining[1:]
                if data is not None:
                    yield readiness(remaining)
            if data is not None:
                kb_paths |= ensure_nq_kbs(encoder, cache=root, progress=progress, data=data)
                text.clear()
                remaining = remaining[1:]
            if "encoder" in remaining:
                yield readiness(remaining)
                question_path = ensure_tuned_encoder(encoder, encoder_config, kb_paths["nq-wiki"], cache=root,
                                                     progress=progress)
                remaining = remaining[1:]
            del encoder
        built_adapter = "reader" in remaining
        if built_adapter:
            yield readiness(remaining)
            adapter_path = ensure_tuned_generator(generator_path, {name: kb_paths[name] for name in NQ_KBS},
                                                  generator_config=generator_config, encoder_config=encoder_config,
                                                  cache=root, progress=progress)
        if timeline.steps:
            log.info("offline default built under %s:\n%s", root, timeline.table())
        log.info("offline default ready in %.1f s", time.perf_counter() - started)
        yield readiness(())
        if built_adapter:  # measured once it serves: the record need not hold up full quality
            try:
                check_tuned_generator(generator_path, adapter_path, {name: kb_paths[name] for name in NQ_KBS},
                                      generator_config=generator_config, progress=progress)
            except RagDemoError as err:  # the adapter is built and serving; only its record is missing
                log.warning("the reading adapter's held-out check was not recorded: %s", err)


def prepare(
    *,
    cache: str | Path | None = None,
    progress: Progress | None = None,
    build_kbs: bool = True,
    encoder_config: EncoderConfig = EncoderConfig(),
    generator_config: GeneratorConfig = GeneratorConfig(),
    retry_unavailable: bool = False,
) -> PreparedPaths:
    """Fetch, convert, embed and fine-tune whatever of the offline default is not cached yet.

    When everything is cached this only reads markers and imports neither torch nor a model
    (a few ms). The encoder is loaded only to embed missing KBs or to fine-tune its question side,
    the generator only to fine-tune it. The log shows a timeline of the steps that ran, and after it
    the held-out check of a reading adapter built just now.
    """
    readiness = None
    for readiness in prepare_in_stages(cache=cache, progress=progress, build_kbs=build_kbs, encoder_config=encoder_config,
                                       generator_config=generator_config, retry_unavailable=retry_unavailable):
        pass
    return readiness.paths

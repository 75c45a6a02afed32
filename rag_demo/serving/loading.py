"""Building a `RagEngine` from settings: the offline default, hub ids / folders, or a RAG checkpoint.

The dependency runs one way: this module builds engines, and the engine knows nothing of loading.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..config import DEFAULT_GENERATOR, EngineConfig, cache_root
from ..retrieval.corpus import KnowledgeBase, load_kb
from ..retrieval.encoders import encoder_from_modules, load_encoder, load_pretrained
from ..engine import RagEngine
from ..errors import InputError, KnowledgeBaseError, ModelLoadError
from ..generation.generator import generator_from_model, load_generator
from ..questions import examples_by_kb

if TYPE_CHECKING:
    from ..offline.prepare import Readiness

log = logging.getLogger(__name__)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu")
    if name not in ("cpu", "cuda"):
        raise InputError(f"unknown device {name!r}; use auto, cpu or cuda")
    return torch.device(name)


def rag_engine_from_modules(*, question_encoder, question_tokenizer, generator_model, generator_tokenizer,
                            rag_config, kbs: dict[str, KnowledgeBase], config: EngineConfig = EngineConfig(),
                            token_generation_config=None) -> RagEngine:
    """An engine that reproduces transformers' RAG classes for these modules and KBs.

    Generator inputs follow RagRetriever: the question is the question-encoder tokenizer's
    decoding of its own tokens (so an uncased encoder lower-cases what the generator reads).
    """
    generator_config = replace(
        config.generator,
        title_sep=rag_config.title_sep,
        doc_sep=rag_config.doc_sep,
        max_combined_length=rag_config.max_combined_length,
        prefix=getattr(rag_config.generator, "prefix", None) if hasattr(rag_config, "generator") else None,
    )
    encoder = encoder_from_modules("rag-question-encoder", question_encoder, question_tokenizer, kind="dpr",
                                   scale=1.0 if config.encoder.scale is None else config.encoder.scale)
    generator = generator_from_model(generator_model, generator_tokenizer, generator_config, name="rag-generator")

    def as_retriever_reads(question: str) -> str:
        ids = question_tokenizer(question, truncation=True, max_length=encoder.max_length)["input_ids"]
        return question_tokenizer.decode(ids, skip_special_tokens=True)

    return RagEngine(encoder=encoder, generator=generator, kbs=kbs, config=replace(config, generator=generator_config),
                     token_generation_config=token_generation_config, question_for_generator=as_retriever_reads)


def engine_from_rag_checkpoint(config: EngineConfig, kbs: dict[str, KnowledgeBase], device: torch.device) -> RagEngine:
    """Question encoder, generator and tokenizers from a facebook/rag-* id or a saved Rag* folder."""
    from transformers import AutoConfig, RagSequenceForGeneration, RagTokenForGeneration, RagTokenizer

    source = config.rag_checkpoint
    rag_config = load_pretrained(AutoConfig, source, "RAG checkpoint")
    if rag_config.model_type != "rag":
        raise ModelLoadError(f"{source} is not a RAG checkpoint (model_type {rag_config.model_type!r})")
    architecture = (rag_config.architectures or ["RagTokenForGeneration"])[0]
    model_cls = RagSequenceForGeneration if "Sequence" in architecture else RagTokenForGeneration
    model = load_pretrained(model_cls, source, "RAG checkpoint").to(device).eval()
    tokenizer = load_pretrained(RagTokenizer, source, "RAG tokenizer")
    return rag_engine_from_modules(
        question_encoder=model.rag.question_encoder, question_tokenizer=tokenizer.question_encoder,
        generator_model=model.rag.generator, generator_tokenizer=tokenizer.generator, rag_config=rag_config,
        kbs=kbs, config=config, token_generation_config=model.generation_config,
    )


def load_kbs(kb_paths: dict[str, str], index_files: dict[str, str] | None = None) -> dict[str, KnowledgeBase]:
    """The KB folders by name; `index_files` names a faiss index for some of them (else one beside the folder)."""
    index_files = index_files or {}
    return {name: load_kb(Path(path).expanduser(), name=name, index_file=index_files.get(name)) for name, path in kb_paths.items()}


def rag_checkpoint_kb(source: str) -> tuple[str, str, str | None] | None:
    """(name, passages_path, index_path) of the custom knowledge base a RAG checkpoint was saved with.

    `RagRetriever.save_pretrained` and transformers' `use_own_knowledge_dataset.py` record it in the
    config as index_name="custom", passages_path (a `save_to_disk` folder), index_path (a faiss file).
    None when the checkpoint names none, or names one that is not on this machine (logged).
    """
    from transformers import AutoConfig

    rag_config = load_pretrained(AutoConfig, source, "RAG checkpoint")
    passages = getattr(rag_config, "passages_path", None)
    if getattr(rag_config, "index_name", None) != "custom" or not passages:
        return None
    if not Path(passages).expanduser().is_dir():
        log.warning("%s was saved with the knowledge base %s, which is not here; give one with --kb-path NAME=PATH",
                    source, passages)
        return None
    index = getattr(rag_config, "index_path", None)
    return Path(passages).name, passages, index if index and Path(index).expanduser().is_file() else None


def engine_from_config(config: EngineConfig = EngineConfig(), *, kb_paths: dict[str, str] | None = None,
                       progress=None) -> RagEngine:
    """Load everything `config` names. The offline default's models and KBs are prepared (fetched,
    converted, embedded, cached) on first use; later starts only load them."""
    device = pick_device(config.device)
    index_files = {}
    if kb_paths is None and config.rag_checkpoint:
        saved_with = rag_checkpoint_kb(config.rag_checkpoint)  # the KB the checkpoint names, not the default ones
        if saved_with is not None:
            name, passages, index = saved_with
            kb_paths, index_files = {name: passages}, ({name: index} if index else {})
    uses_default_generator = not config.rag_checkpoint and config.generator.model == DEFAULT_GENERATOR
    needs_default_data = kb_paths is None or uses_default_generator
    prepared = None
    if needs_default_data:
        from ..offline.prepare import prepare

        prepared = prepare(progress=progress, build_kbs=kb_paths is None, encoder_config=config.encoder,
                           generator_config=config.generator)
    if kb_paths is None:
        kb_paths = {name: str(path) for name, path in prepared.kb_paths.items()}
    kbs = load_kbs(kb_paths, index_files)
    if config.rag_checkpoint:
        return engine_from_rag_checkpoint(config, kbs, device)
    if config.encoder.question_weights is not None:
        question_path = Path(config.encoder.question_weights)
    elif prepared is not None:
        question_path = prepared.question_encoder_path
    else:  # own KBs and another generator: nothing is prepared, but a cached fine-tuned side still serves
        from ..offline.tuned import cached_tuned_encoder

        question_path = cached_tuned_encoder(config.encoder)
    encoder = load_encoder(config.encoder, device=device, question_path=question_path)
    generator_path = str(prepared.generator_path) if uses_default_generator else None
    adapter = prepared.reader_adapter_path if uses_default_generator else None
    generator = load_generator(config.generator, path=generator_path, device=device, adapter=adapter,
                               states=cache_root() / "states" if uses_default_generator else None)
    return RagEngine(encoder=encoder, generator=generator, kbs=kbs, config=config,
                     index_cache=cache_root() / "indexes", examples=_example_questions(kbs))


def staged_default_engines(config: EngineConfig = EngineConfig(), *, progress=None,
                           extra_kbs: dict[str, KnowledgeBase] | None = None) -> Iterator[tuple[RagEngine, Readiness]]:
    """The offline default's engines as a first start builds it: one per `offline.prepare.Readiness`.

    The first answers with BM25 over the KBs' passages and the converted base generator, minutes
    after a cold start; each later one adds what was built meanwhile (dense vectors, the fine-tuned
    question side, the reading adapter). A model that did not change is handed on, not loaded
    again. With everything cached there is one engine, the complete one. `extra_kbs` (loaded
    folders, e.g. a large KB given to `app.py --kb-path`) follow the default KBs in every engine.
    """
    from ..offline.prepare import prepare_in_stages

    device = pick_device(config.device)
    encoder = generator = question_path = adapter = None
    loaded: dict[str, KnowledgeBase] = {}  # KB folders are loaded once; later stages reuse them
    for readiness in prepare_in_stages(progress=progress, encoder_config=config.encoder, generator_config=config.generator):
        paths = readiness.paths
        fresh = {name: str(path) for name, path in paths.kb_paths.items() if name not in loaded}
        if fresh:
            loaded |= load_kbs(fresh)
        kbs = {name: loaded[name] if name in loaded else readiness.text_kbs[name]
               for name in [*paths.kb_paths, *readiness.text_kbs]}
        examples = _example_questions({name: loaded[name] for name in paths.kb_paths}) | {
            name: list(qs) for name, qs in readiness.text_examples.items()}
        # A replaced model stays alive in the engine it served until that engine's last ask returns.
        if encoder is None or question_path != paths.question_encoder_path:
            question_path = paths.question_encoder_path
            encoder = load_encoder(config.encoder, device=device, question_path=question_path)
        if generator is None or adapter != paths.reader_adapter_path:
            adapter = paths.reader_adapter_path
            generator = load_generator(config.generator, path=str(paths.generator_path), device=device, adapter=adapter,
                                       states=cache_root() / "states")
        # each engine gets its own dicts: a KB added to one (on the page) stays there
        engine = RagEngine(encoder=encoder, generator=generator, kbs=dict(kbs), config=config,
                           index_cache=cache_root() / "indexes", examples={name: list(qs) for name, qs in examples.items()})
        add_extra_kbs(engine, extra_kbs or {})
        yield engine, readiness


def add_extra_kbs(engine: RagEngine, kbs: dict[str, KnowledgeBase]) -> None:
    """Add `kbs` after the engine's own. One it cannot serve (vectors of another width than the
    encoder's, a name already taken) is left out, with its reason logged as an error."""
    for name, kb in kbs.items():
        try:
            engine.retriever.add_kb(name, kb)
        except (KnowledgeBaseError, InputError) as err:
            log.error("knowledge base %r left out: %s", name, err)


def _example_questions(kbs: dict[str, KnowledgeBase]) -> dict[str, list[str]]:
    """Each KB folder's example questions (none for a KB without a questions file)."""
    return {name: [q.question for q in items]
            for name, items in examples_by_kb({name: kb.path for name, kb in kbs.items()}).items()}

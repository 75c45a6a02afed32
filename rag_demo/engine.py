"""The RAG engine: retrieve passages, read them, marginalize over them, trace each token (paper, section 2).

One `RagEngine` holds a `Retriever` (the question encoder, the knowledge bases and their indexes)
and a generator, read-only; each call returns a typed `AskResult` with the numbers behind every
answer and the time each stage took.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from .generation import decoding
from . import memory as parametric_memory
from . import sureness
from .config import ASK, DEFAULT_KBS, GENERAL_KBS, LIMITS, VARIANT_NAMES, VARIANTS, EngineConfig
from .retrieval.corpus import KnowledgeBase, Passage
from .retrieval.encoders import Encoder
from .errors import InputError
from .options import check_decoding, parse_variants
from .generation.decode_state import DecodeState, Target, join_rows
from .generation.decoding import Hypothesis, MemoryRows
from .generation.generator import Generator, generator_from_model
from .generation.teacher_forcing import every_source_logprobs, rows_logprobs, sources_logprobs
from .generation.restatements import first_standing, restates_question, set_aside_restatements
from .retrieval.index import SearchIndex
from .marginalize import (rag_sequence_logprob, rag_sequence_posteriors, rag_sequence_token_logprobs, rag_token_logprob,
                          rag_token_posteriors, rag_token_token_logprobs)
from .progress import Progress, StepCounter, counted
from .question_kinds import read_question
from .questions import passages_holding, without_last_word
from .results import AskResult, ClosedBookResult, IndexReport, Retrieval, RetrievedPassage, RetrieverComparison, VariantResult
from .retrieval.retriever import Retriever
from .text import clean_text

log = logging.getLogger(__name__)

OOM_NOTICE = "the GPU ran out of memory, so this answer was computed on the CPU (and later ones will be too)"


def falls_back_to_cpu_on_gpu_oom(method):
    """Run an engine method; when CUDA runs out of memory, move the models to the CPU and run it once more.

    The result then carries `OOM_NOTICE`, so the visitor knows why it was slower.
    """

    @functools.wraps(method)
    def run(self: "RagEngine", *args, **kwargs) -> AskResult:
        try:
            return method(self, *args, **kwargs)
        except torch.cuda.OutOfMemoryError as err:
            self.move_to_cpu(reason=f"out of GPU memory ({str(err).splitlines()[0][:120] if str(err) else 'no details'})")
        result = method(self, *args, **kwargs)
        return replace(result, notices=result.notices + (OOM_NOTICE,))

    return run


class RagEngine:
    """The paper's pipeline: retrieve passages, read them with the generator, marginalize over them,
    and trace each answer token to its passages; see `ask` and `score`.

    Knowledge bases, indexes and p(z|x) are the `retriever`'s; the engine offers its public calls too.
    """

    def __init__(
        self,
        *,
        encoder: Encoder,
        generator: Generator,
        kbs: dict[str, KnowledgeBase],
        config: EngineConfig = EngineConfig(),
        index_cache: Path | None = None,
        token_generation_config=None,
        question_for_generator: Callable[[str], str] | None = None,
        examples: dict[str, list[str]] | None = None,
    ):
        self.retriever = Retriever(encoder=encoder, kbs=kbs, config=config.retrieval, index_config=config.index,
                                   index_cache=index_cache, question_for_generator=question_for_generator)
        self.generator = generator
        self.config = config
        # transformers' RagTokenForGeneration decodes with the RAG model's generation config,
        # RAG-Sequence with the generator's own; a checkpoint may set them differently.
        self.token_generation_config = token_generation_config or generator.model.generation_config
        self._examples = examples or {}
        self._lock = threading.RLock()

    # -- the retriever's, for the pages, the CLI and the benchmarks ---------------------------------
    @property
    def encoder(self) -> Encoder:
        return self.retriever.encoder

    @property
    def kbs(self) -> dict[str, KnowledgeBase]:
        return self.retriever.kbs

    @property
    def kb_names(self) -> tuple[str, ...]:
        return self.retriever.kb_names

    @property
    def default_kb(self) -> str:
        return self.retriever.default_kb

    @property
    def lexical_weight(self) -> float:
        return self.retriever.lexical_weight

    @property
    def retrievers(self) -> tuple[str, ...]:
        return self.retriever.retrievers

    def resolve_kb(self, kb: str | KnowledgeBase | None) -> KnowledgeBase:
        return self.retriever.resolve_kb(kb)

    def resolve_retriever(self, retriever: str | None) -> str:
        return self.retriever.resolve_retriever(retriever)

    def search_index(self, kb: str | KnowledgeBase | None = None, kind: str = "flat", *,
                     progress: Progress | None = None) -> SearchIndex:
        return self.retriever.search_index(kb, kind, progress=progress)

    def index_reports(self, kb: str | KnowledgeBase | None = None, *, k: int = ASK.index_report_k) -> list[IndexReport]:
        return self.retriever.index_reports(kb, k=k)

    def release_kb(self, kb: KnowledgeBase) -> None:
        self.retriever.release_kb(kb)

    def retrieve(self, question: str, *, kb: str | KnowledgeBase | None = None, k: int = ASK.k, index: str = ASK.index,
                 retriever: str | None = None, rows: Sequence[int] | None = None,
                 question_model: torch.nn.Module | None = None) -> Retrieval:
        return self.retriever.retrieve(question, kb=kb, k=k, index=index, retriever=retriever, rows=rows,
                                       question_model=question_model)

    def build_kb(self, name: str, passages: list[Passage], *, progress: Progress | None = None) -> KnowledgeBase:
        """Embed `passages` into an in-memory KB (`Retriever.build_kb`); when even one passage at a time
        does not fit in GPU memory, the models move to the CPU and it is embedded there."""
        try:
            return self.retriever.build_kb(name, passages, progress=progress)
        except torch.cuda.OutOfMemoryError:
            if self.encoder.device.type == "cpu":
                raise
        self.move_to_cpu(reason="out of GPU memory while embedding one passage at a time")
        return self.retriever.build_kb(name, passages, progress=progress)

    @falls_back_to_cpu_on_gpu_oom
    def compare_retrievers(self, question: str, *, kb: str | KnowledgeBase | None = None, k: int = ASK.k) -> RetrieverComparison:
        """The top k of each retriever offered for one question (`Retriever.compare`)."""
        question, notices = read_question(question)
        comparison = self.retriever.compare(question, kb=kb, k=k)
        return replace(comparison, notices=notices + comparison.notices)

    # -- serving ----------------------------------------------------------------------------------
    def move_to_cpu(self, *, reason: str) -> None:
        """Serve from the CPU from now on (after the GPU ran out of memory); indexes are rebuilt there."""
        cpu = torch.device("cpu")
        with self._lock:
            log.warning("%s; moving the models to the CPU", reason)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            gen = self.generator
            if gen.device.type != "cpu":
                self.generator = generator_from_model(gen.model.to(cpu), gen.tokenizer, gen.config, name=gen.name)
            self.retriever.move_to_cpu()

    def warm_up(self) -> float:
        """Load each KB's indexes (`Retriever.warm_up`) and run one small ask; returns the seconds it took.

        Indexes load and the few-shot caches are computed on first use, and torch's first passes are
        slow, so without this the first visitor of a fresh server waits several times a normal ask.
        One passage and two new tokens touch every one of those (both variants, closed-book) at a
        fraction of a full ask's cost: a visitor who asks meanwhile shares the cores with it.
        """
        started = time.perf_counter()
        self.retriever.warm_up()
        question = next(iter(self.example_questions()), "Who wrote the novel Nineteen Eighty-Four?")
        self.ask(question, k=1, max_new_tokens=2)
        return time.perf_counter() - started

    def feature_examples(self, examples: dict[str, list[str]]) -> None:
        """Replace the example questions offered for these KBs (e.g. reordered by `featured`)."""
        self._examples = {**self._examples, **{name: list(qs) for name, qs in examples.items()}}

    def example_questions(self, kb: str | None = None, n: int = ASK.examples) -> list[str]:
        return list(self._examples.get(kb or self.default_kb, []))[:n]

    # -- generation helpers --------------------------------------------------------------------
    def _inputs(self, retrieval: Retrieval) -> list[str]:
        return [
            self.generator.format_input(retrieval.generator_question, Passage(p.title, p.text)) for p in retrieval.passages
        ]

    def _variant_result(self, variant: str, ids: tuple[int, ...], per_source: torch.Tensor, doc_lp: torch.Tensor,
                        closed: torch.Tensor, *, question: str, passages_read: Sequence[RetrievedPassage], decoding_name: str,
                        candidates=(), memory: bool = False, set_aside: tuple[str, ...] = (),
                        cut_short: bool = False) -> VariantResult:
        """per_source: (S, T) and doc_lp (S,) over the passages, then the memory when `memory`. `cut_short`: the
        answer reached the length limit before ending, so its last word may be a word's start."""
        tl, lp = per_source[None], doc_lp[None]  # (1, S, T), (1, S)
        mask = torch.ones(1, per_source.shape[1], dtype=torch.bool)
        if variant == "token":
            logprob = rag_token_logprob(tl, lp, mask)[0]
            token_lps = rag_token_token_logprobs(tl, lp)[0]
            posteriors = rag_token_posteriors(tl, lp)[0]
        else:
            logprob = rag_sequence_logprob(tl, lp, mask)[0]
            token_lps = rag_sequence_token_logprobs(tl, lp)[0]
            posteriors = rag_sequence_posteriors(tl, lp)[0]
        passages = per_source.shape[0] - memory
        answer = self.generator.decode(list(ids))
        return VariantResult(
            variant=variant,
            answer=answer,
            tokens=tuple(self.generator.token_text(i) for i in ids),
            token_ids=tuple(int(i) for i in ids),
            logprob=float(logprob),
            token_logprobs=tuple(float(x) for x in token_lps),
            doc_token_logprobs=tuple(tuple(float(x) for x in row) for row in per_source[:passages].T),
            posteriors=tuple(tuple(float(x) for x in row) for row in posteriors[:, :passages]),
            closed_book_token_logprobs=tuple(float(x) for x in closed),
            candidates=tuple(candidates),
            decoding=decoding_name,
            memory_posteriors=tuple(float(x) for x in posteriors[:, passages]) if memory else (),
            set_aside=set_aside,
            found_in=(passages_holding(answer, passages_read, question=question)
                      or (passages_holding(without_last_word(answer), passages_read, question=question) if cut_short
                          else ())),
        )

    def _closed_book_state(self, question: str, prefix: tuple[int, ...]) -> DecodeState:
        return self.generator.start([self.generator.format_input(question, None)], prefix)

    # -- decoding -------------------------------------------------------------------------------
    def _restates(self, question: str, text: str) -> bool:
        """Whether decoding sets `text` aside as restating `question` (`generation.restatements`)."""
        return self.config.decoding.set_aside_restatements and restates_question(question, text)

    def _setting_aside_restatements(self, question: str, decode: Callable[[frozenset[int]], Hypothesis]) -> tuple[Hypothesis, tuple[str, ...]]:
        return set_aside_restatements(decode, functools.partial(self._restates, question), self.generator)

    def _decode_token(self, state: DecodeState, doc_lp: torch.Tensor, prefix, *, question: str, num_beams: int,
                      max_new_tokens: int, copy_from=None, closed_state: DecodeState | None = None,
                      ) -> tuple[tuple[int, ...], dict[int, torch.Tensor], tuple[str, ...]]:
        """The answer, the per-source log-probs decoding already gave for it ({} after beam search), and
        the answers set aside before it as restating `question`. With `closed_state`, the memory is the
        last of doc_lp's sources."""
        gen = self.generator
        stop = self._stop_ids()

        def decode(barred_first: frozenset[int]) -> Hypothesis:
            branch = gen.fork(state, torch.arange(state.rows))
            memory = None if closed_state is None else MemoryRows(gen, gen.fork(closed_state, torch.arange(1)))
            options = dict(prefix=prefix, max_new_tokens=max_new_tokens, stop_ids=stop, generation_config=self.token_generation_config,
                           copy_from=copy_from, memory=memory, barred_first=barred_first)
            if num_beams == 1:
                return decoding.greedy(gen, branch, groups=1, doc_lp=doc_lp, **options)[0]
            return decoding.beam_search(gen, branch, groups=1, doc_lp=doc_lp, num_beams=num_beams, **options)[0][0]

        hyp, set_aside = self._setting_aside_restatements(question, decode)
        return hyp.ids, ({} if hyp.row_logprobs is None else dict(enumerate(hyp.row_logprobs))), set_aside

    def _decode_sequence(self, state: DecodeState, doc_lp: torch.Tensor, prefix, *, question: str, num_beams: int, max_new_tokens: int,
                         sequence_decoding: str, copy_from=None, step: Callable[[str], None] | None = None,
                         closed_state: DecodeState | None = None, recalled: list[Hypothesis] | None = None,
                         ) -> tuple[tuple[int, ...], list[tuple[tuple[int, ...], float]], dict[int, torch.Tensor], tuple[str, ...]]:
        """Per-passage beams, then the marginal over passages (thorough) or over finders (fast); the best
        candidate with words that does not restate `question` wins where there is one (`restatements.first_standing`).

        With `closed_state`, the memory is a source too (the last of doc_lp's): `recalled` are its own
        hypotheses, the closed-book answers, and every candidate is scored under it as under a passage.
        Returns the answer, all candidates with their scores, the answer's per-source log-probs known so
        far (greedy gives the finders'; thorough scoring gives every source's), and the better-scored
        candidates set aside as restating the question."""
        gen = self.generator
        docs = state.rows
        sources = docs + (closed_state is not None)
        branch = gen.fork(state, torch.arange(docs))
        stop = self._stop_ids()
        # each source offers its first answer that does not restate: a restating one is never chosen, and hides the next
        answered: list[tuple[Hypothesis, tuple[str, ...]]] = []
        if num_beams == 1:
            greedy = decoding.greedy(gen, branch, groups=docs, doc_lp=None, prefix=prefix, max_new_tokens=max_new_tokens,
                                     stop_ids=stop, copy_from=copy_from)
            answered = [self._greedy_answer(state, prefix, question=question, max_new_tokens=max_new_tokens, row=z,
                                            copy_from=copy_from, first=hyp) for z, hyp in enumerate(greedy)]
            per_group = [[hyp] for hyp, _ in answered]
        else:
            per_group = decoding.beam_search(gen, branch, groups=docs, doc_lp=None, prefix=prefix,
                                             max_new_tokens=max_new_tokens, stop_ids=stop, num_beams=num_beams,
                                             copy_from=copy_from)
        if closed_state is not None:
            per_group.append(list(recalled or []))
        found_by: dict[tuple[int, ...], list[int]] = {}
        known: dict[tuple[int, ...], dict[int, torch.Tensor]] = {}
        for z, hyps in enumerate(per_group):
            for h in hyps:
                finders = found_by.setdefault(h.ids, [])
                if z not in finders:
                    finders.append(z)
                if h.row_logprobs is not None:
                    known.setdefault(h.ids, {})[z] = h.row_logprobs[0]
        candidates = list(found_by)
        if step is not None:
            step(f"RAG-Sequence: scoring {counted(len(candidates), 'candidate answer')} "
                 + (f"against all {docs} passages" + (" and the memory" if sources > docs else "") if sequence_decoding == "thorough"
                    else "against the passages that wrote them" if sources == docs else "against the sources that wrote them"))
        rows = [list(range(sources)) if sequence_decoding == "thorough" else found_by[c] for c in candidates]
        missing = [[z for z in zs if z not in known.get(c, {})] for c, zs in zip(candidates, rows)]
        for cand, zs, lps in zip(candidates, missing, sources_logprobs(self.generator, state, closed_state, candidates, missing)):
            known.setdefault(cand, {}).update({z: lps[i] for i, z in enumerate(zs)})
        scored = []
        for cand, zs in zip(candidates, rows):
            lps = torch.stack([known[cand][z] for z in zs])[None]  # (1, len(zs), T)
            # fast decoding sums over the finders alone: p(y|x,z) of the other sources is taken as 0
            marginal = rag_sequence_logprob(lps, doc_lp[zs][None], torch.ones(1, lps.shape[-1], dtype=torch.bool))
            scored.append((cand, float(marginal[0])))
        ranked = sorted(scored, key=lambda item: -item[1])
        texts = [self.generator.decode(list(cand)) for cand, _ in ranked]
        kept = first_standing(texts, functools.partial(self._restates, question)) if self.config.decoding.set_aside_restatements else 0
        best = ranked[kept][0]
        set_aside = [text for _, said in answered for text in said] + [text for text in texts[:kept] if text.strip()]
        return best, ranked, known[best], tuple(dict.fromkeys(set_aside))

    def _stop_ids(self) -> frozenset[int]:
        return getattr(self.generator, "stop_ids", self.generator.eos_ids)

    # -- the generator's memory as a source -----------------------------------------------------
    def memory_logit(self, retriever: str | None = None, kb: str | None = None) -> float | None:
        """The logit of the memory source ∅ for asks with this retriever (on `kb`, where given); None when this setup
        has none (memory is then no source: see `config.MemoryConfig`)."""
        return self._memory_logit(retriever, own_question_side=True, kb=kb)

    def _memory_logit(self, retriever: str | None, *, own_question_side: bool, kb: str | None = None) -> float | None:
        """As `memory_logit`; with `kb`, for asks on that knowledge base."""
        return parametric_memory.fitted_logit(self.config, self.encoder, self.generator, self.resolve_retriever(retriever),
                                              own_question_side=own_question_side, kb=kb)

    def _poor_match(self, retrieval: Retrieval, *, own_question_side: bool) -> tuple[str, ...]:
        floor = parametric_memory.no_match_floor(self.encoder, own_question_side=own_question_side)
        return parametric_memory.poor_match_notice(retrieval, floor)

    def _with_memory(self, retrieval: Retrieval, memory: bool | None, *, own_question_side: bool = True) -> tuple[Retrieval, float | None]:
        """The retrieval with p(z|x) over its passages and the memory (the last of doc_lp's K + 1), and
        the memory's logit; as it was, and None, when memory is not a source of this ask."""
        logit = (self._memory_logit(retrieval.retriever, own_question_side=own_question_side, kb=retrieval.kb)
                 if memory in (None, True) else None)
        if memory is True and logit is None:
            raise InputError("this setup has no fitted logit for the generator's memory"
                             + ("" if own_question_side else " with a question encoder of its own")
                             + ("" if retrieval.kb in DEFAULT_KBS else f" on {retrieval.kb}")
                             + "; ask without memory (memory false over the API, --no-memory on the command line), "
                             "or give it a logit (--memory-logit on the command line, `MemoryConfig.logit` in Python)")
        if logit is None or not retrieval.passages:
            return retrieval, None
        return parametric_memory.with_memory(retrieval, logit), logit

    # -- public API -----------------------------------------------------------------------------
    def _check_options(self, variants, num_beams, max_new_tokens, sequence_decoding) -> tuple[str, ...]:
        variants = parse_variants(variants)
        if not isinstance(num_beams, int) or not 1 <= num_beams <= LIMITS.max_beams:
            raise InputError(f"num_beams must be between 1 and {LIMITS.max_beams}")
        if not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= LIMITS.max_new_tokens:
            raise InputError(f"max_new_tokens must be between 1 and {LIMITS.max_new_tokens}")
        check_decoding(sequence_decoding)
        return variants

    @falls_back_to_cpu_on_gpu_oom
    def ask(self, question: str, *, kb: str | KnowledgeBase | None = None, k: int = ASK.k, index: str = ASK.index,
            variants=VARIANTS, num_beams: int | None = None, sequence_decoding: str | None = None,
            max_new_tokens: int | None = None, closed_book: bool = True, retriever: str | None = None,
            extractive: bool | None = None, memory: bool | None = None, progress: Progress | None = None,
            rows: Sequence[int] | None = None, question_model: torch.nn.Module | None = None) -> AskResult:
        """Retrieve k passages, answer with each variant, and trace every token to its passages.

        `memory` makes the generator's memory a source beside the passages (None: where this setup has
        a fitted logit for it, `memory_logit`; False: the paper's k passages alone). `extractive` makes
        both variants copy a run of a retrieved passage (see `decoding.CopySpans`);
        the closed-book answer, which reads no passage, stays free. `progress(stage, done, total)`
        hears of each step as it starts (`total` steps in all), so a page can say what is running
        instead of guessing a time. `rows` reads those passages of the KB instead of retrieving
        (see `retrieve`). `question_model` computes q(x) for this ask alone in place of the encoder's
        question side (`Retriever.retrieve`); the memory then has no fitted logit unless one is configured
        (it was fitted for the packaged question side)."""
        num_beams = self.config.decoding.num_beams if num_beams is None else num_beams
        max_new_tokens = self.config.decoding.max_new_tokens if max_new_tokens is None else max_new_tokens
        sequence_decoding = sequence_decoding or self.config.decoding.sequence_decoding
        variants = self._check_options(variants, num_beams, max_new_tokens, sequence_decoding)
        extractive = self.config.decoding.extractive if extractive is None else bool(extractive)
        if extractive and self.generator.kind != "causal":
            raise InputError("copying answers from passages works with causal generators only; "
                             f"{self.generator.name} is {self.generator.kind}")
        question, notices = read_question(question)
        step = StepCounter(progress, 3 + ("token" in variants) + 2 * ("sequence" in variants) + closed_book)
        total_started = time.perf_counter()
        step("retrieving passages")
        retrieval, memory_logit = self._with_memory(
            self.retrieve(question, kb=kb, k=k, index=index, retriever=retriever, rows=rows, question_model=question_model),
            memory, own_question_side=question_model is None)
        with_memory = memory_logit is not None
        if not with_memory:  # say where passages lie far from the question and nothing else can answer
            notices += self._poor_match(retrieval, own_question_side=question_model is None)
        timings = retrieval.timings_ms
        started = time.perf_counter()
        gen = self.generator
        prefix = gen.generation_prefix()
        copy_from = ([gen.copy_source(retrieval.generator_question, Passage(p.title, p.text)) for p in retrieval.passages]
                     if extractive else None)
        docs = len(retrieval.passages)
        with torch.inference_mode():
            step(f"reading the {counted(docs, 'passage')}" + (" and the question alone (memory)" if with_memory else ""))
            state = gen.start(self._inputs(retrieval), prefix)
            no_answer = self._no_answer_probs(state)
            closed_state = closed_greedy = recalled = joined = None
            closed_set_aside: tuple[str, ...] = ()
            if with_memory or closed_book:
                with gen.base_weights():  # the model's own memory, without the reading adapter
                    closed_state = self._closed_book_state(retrieval.generator_question, prefix)
                # Where passages are read with the base weights too, memory's row joins theirs: one forward
                # pass steps all k + 1 (a row of its own would cost a pass of its own per token)
                if with_memory and not extractive and not gen.has_adapter:
                    joined = join_rows(state, gen.fork(closed_state, torch.arange(1)))
                with gen.base_weights():
                    recalls = with_memory and joined is None and "sequence" in variants and not extractive
                    if closed_book or (recalls and num_beams == 1):  # RAG-Sequence's memory candidates
                        closed_greedy, closed_set_aside = self._greedy_answer(closed_state, prefix, question=question,
                                                                               max_new_tokens=max_new_tokens)
                    if recalls:
                        recalled = [closed_greedy] if num_beams == 1 else self._closed_book_beams(
                            closed_state, prefix, max_new_tokens, num_beams=num_beams)
            if joined is not None:
                state = joined  # memory is its last row, as a last passage
            memory_state = closed_state if with_memory and joined is None else None
            # variant -> (answer ids, candidates with their scores, per-source log-probs known, answers set aside)
            answers: dict[str, tuple[tuple[int, ...], list, dict[int, torch.Tensor], tuple[str, ...]]] = {}
            if "token" in variants:
                step("RAG-Token: writing the answer, one token at a time over all "
                     + ("passages and the memory" if with_memory else "passages"))
                ids, known, set_aside = self._decode_token(state, retrieval.doc_lp, prefix, question=question, num_beams=num_beams,
                                                           max_new_tokens=max_new_tokens, copy_from=copy_from,
                                                           closed_state=memory_state)
                answers["token"] = (ids, [], known, set_aside)
            if "sequence" in variants:
                step("RAG-Sequence: an answer from each passage" + (" and from memory" if with_memory else ""))
                ids, candidates, known, set_aside = self._decode_sequence(
                    state, retrieval.doc_lp, prefix, question=question, num_beams=num_beams,
                    max_new_tokens=max_new_tokens, sequence_decoding=sequence_decoding,
                    copy_from=copy_from, step=step, closed_state=memory_state, recalled=recalled)
                answers["sequence"] = (ids, candidates, known, set_aside)
            step("tracing each answer token to its passages")
            targets = [ids for ids, _, _, _ in answers.values()]
            per_source = every_source_logprobs(self.generator, state, memory_state, docs + with_memory, targets,
                                                 [known for _, _, known, _ in answers.values()])
            if with_memory:  # the memory's row is the closed-book pass
                closed_lps = [lps[-1:] for lps in per_source]
            elif closed_book:
                step("the closed-book answer (no passages)")
                with gen.base_weights():
                    closed_lps = rows_logprobs(self.generator, closed_state, targets, [[0]] * len(targets))
            else:
                closed_lps = [torch.full((1, len(t)), float("nan")) for t in targets]
            closed_result = self._closed_book_result(closed_greedy, closed_set_aside) if closed_book else None
            results = {}
            decoding_name = ("greedy" if num_beams == 1 else f"beam {num_beams}") + (", copying" if extractive else "")
            for (variant, (ids, candidates, _, set_aside)), lps, closed in zip(answers.items(), per_source, closed_lps):
                name = decoding_name if variant == "token" else f"{decoding_name}, {sequence_decoding}"
                results[variant] = self._variant_result(
                    variant, ids, lps, retrieval.doc_lp, closed[0], question=question, passages_read=retrieval.passages,
                    decoding_name=name,
                    candidates=[(gen.decode(list(c)), s) for c, s in candidates], memory=with_memory, set_aside=set_aside,
                    cut_short=decoding.reached_length_limit(ids, max_new_tokens, self._stop_ids()),
                )
            if parametric_memory.fitted_for(self.config, self.encoder, self.generator, own_question_side=True) and retrieval.kb in GENERAL_KBS:
                results, said = sureness.banded(results, sureness.unmeasured_options(
                    kb=retrieval.kb, question=question, k=docs, index=index, retriever=retrieval.retriever, memory=with_memory,
                    num_beams=num_beams, extractive=extractive, trained=question_model is not None), sequence_decoding=sequence_decoding)
                notices += said
            written = {VARIANT_NAMES[variant]: ids for variant, (ids, *_rest) in answers.items()}
            written.update({"the closed-book answer": closed_greedy.ids} if closed_book else {})
            notices += decoding.ending_notices(written, max_new_tokens, self._stop_ids(), decode=self.generator.decode)
        timings["generate"] = (time.perf_counter() - started) * 1000
        timings["total"] = (time.perf_counter() - total_started) * 1000
        return AskResult(
            question=question, kb=retrieval.kb, index=index, k=len(retrieval.passages),
            passages=retrieval.passages,
            variants=results, closed_book=closed_result, timings_ms=timings,
            notices=notices + retrieval.notices, index_recall=retrieval.index_recall, scale=retrieval.scale,
            retriever=retrieval.retriever, lexical_weight=retrieval.lexical_weight, extractive=extractive,
            no_answer=no_answer, memory_logit=memory_logit,
            memory_prob=float(retrieval.doc_lp[-1].exp()) if with_memory else None,
            question_encoder=retrieval.question_encoder,
        )

    def _no_answer_probs(self, state: DecodeState) -> tuple[float, ...]:
        """(K,) per passage, the probability that the reader's first token is the no-answer marker
        (`prompts.NO_ANSWER`): how sure it is that the passage does not answer; () without a marker."""
        ids = self.generator.no_answer_ids
        if not ids:
            return ()
        first = state.logprobs[:, torch.tensor(sorted(ids), device=state.logprobs.device)]  # (K, M)
        return tuple(float(p) for p in first.logsumexp(-1).exp().cpu())

    def _closed_book_beams(self, state: DecodeState, prefix, max_new_tokens: int, *, num_beams: int) -> list[Hypothesis]:
        """Beam search's answers from `state`, the closed-book prompt (call with the base weights), best
        first: RAG-Sequence's candidates from memory. `state` stays usable."""
        gen = self.generator
        return decoding.beam_search(gen, gen.fork(state, torch.arange(1)), groups=1, doc_lp=None, prefix=prefix,
                                    max_new_tokens=max_new_tokens, stop_ids=self._stop_ids(), num_beams=num_beams)[0]

    def _greedy_answer(self, state: DecodeState, prefix, *, question: str, max_new_tokens: int, row: int = 0,
                       copy_from=None, first: Hypothesis | None = None) -> tuple[Hypothesis, tuple[str, ...]]:
        """Row `row` of `state`'s greedy answer (the closed-book prompt's: call with the base weights) and the answers
        set aside before it as restating `question` (`restatements`); `first`: the row's greedy answer, decoded
        already. `state` stays usable."""
        gen = self.generator
        options = dict(groups=1, doc_lp=None, prefix=prefix, max_new_tokens=max_new_tokens, stop_ids=self._stop_ids(),
                       copy_from=None if copy_from is None else [copy_from[row]])

        def decode(barred: frozenset[int]) -> Hypothesis:
            if first is not None and not barred:
                return first
            return decoding.greedy(gen, gen.fork(state, torch.tensor([row])), barred_first=barred, **options)[0]

        return self._setting_aside_restatements(question, decode)

    def _closed_book_result(self, hyp: Hypothesis, set_aside: tuple[str, ...] = ()) -> ClosedBookResult:
        gen = self.generator
        lps = hyp.row_logprobs[0]  # greedy's own log-probs of its tokens
        return ClosedBookResult(
            answer=gen.decode(list(hyp.ids)), tokens=tuple(gen.token_text(i) for i in hyp.ids),
            token_logprobs=tuple(float(x) for x in lps), logprob=float(lps.sum()), set_aside=set_aside,
        )

    def closed_book(self, question: str, *, max_new_tokens: int | None = None) -> ClosedBookResult:
        """The generator's greedy answer without any passage: its parametric memory alone (the base
        weights, without a reading adapter)."""
        max_new_tokens = self.config.decoding.max_new_tokens if max_new_tokens is None else max_new_tokens
        self._check_options(VARIANTS, 1, max_new_tokens, "thorough")
        question, _ = read_question(question)
        prefix = self.generator.generation_prefix()
        with torch.inference_mode(), self.generator.base_weights():
            state = self._closed_book_state(self.retriever.generator_question(question), prefix)
            return self._closed_book_result(*self._greedy_answer(state, prefix, question=question, max_new_tokens=max_new_tokens))

    @falls_back_to_cpu_on_gpu_oom
    def score(self, question: str, answer: str, *, kb: str | KnowledgeBase | None = None, k: int = ASK.k,
              index: str = ASK.index, variants=VARIANTS, retriever: str | None = None, memory: bool | None = None,
              progress: Progress | None = None, rows: Sequence[int] | None = None,
              question_model: torch.nn.Module | None = None) -> AskResult:
        """log p(answer|x) under each variant, with per-token provenance, for an answer the user gives.

        The answer is scored with the ending RAG-Token finds likeliest after it (for a causal
        generator "\n\n", "\n" or EOS): the one greedy decoding would pick, so an answer the page
        wrote scores as it did when asked. `memory`, `rows` and `question_model` as for `ask`."""
        variants = self._check_options(variants, 1, 1, "thorough")
        question, notices = read_question(question)
        answer, answer_notices = clean_text(answer, what="answer", limit=LIMITS.max_answer_chars)
        step = StepCounter(progress, 4)
        total_started = time.perf_counter()
        step("retrieving passages")
        retrieval, memory_logit = self._with_memory(
            self.retrieve(question, kb=kb, k=k, index=index, retriever=retriever, rows=rows, question_model=question_model),
            memory, own_question_side=question_model is None)
        with_memory = memory_logit is not None
        if not with_memory:  # say where passages lie far from the question and nothing else can answer
            notices += self._poor_match(retrieval, own_question_side=question_model is None)
        timings = retrieval.timings_ms
        started = time.perf_counter()
        gen = self.generator
        targets: list[Target] = gen.answer_targets(answer)  # every ending shares the prefix
        with torch.inference_mode():
            docs = len(retrieval.passages)
            step(f"reading the {counted(docs, 'passage')}")
            state = gen.start(self._inputs(retrieval), targets[0].prefix)
            no_answer = self._no_answer_probs(state)
            with gen.base_weights():
                closed_state = self._closed_book_state(retrieval.generator_question, targets[0].prefix)
            step("scoring the answer under each passage" + (" and the memory" if with_memory else ""))
            all_rows = list(range(docs + with_memory))
            per_ending = sources_logprobs(self.generator, state, closed_state, [t.ids for t in targets], [all_rows] * len(targets))
            token_lp = [float(rag_token_token_logprobs(lps[None], retrieval.doc_lp[None])[0, -1]) for lps in per_ending]
            best = max(range(len(targets)), key=lambda i: token_lp[i])  # the answer part is shared
            target, per_source = targets[best], per_ending[best]
            step("scoring it closed-book (no passages)")
            if with_memory:
                closed = per_source[-1]
            else:
                with gen.base_weights():
                    closed = rows_logprobs(self.generator, closed_state, [target.ids], [[0]])[0][0]
        results = {
            v: self._variant_result(v, target.ids, per_source, retrieval.doc_lp, closed, question=question,
                                    passages_read=retrieval.passages, decoding_name="scored", memory=with_memory)
            for v in variants
        }
        closed_result = ClosedBookResult(
            answer=answer, tokens=tuple(gen.token_text(i) for i in target.ids),
            token_logprobs=tuple(float(x) for x in closed), logprob=float(closed.sum()),
        )
        timings["generate"] = (time.perf_counter() - started) * 1000
        timings["total"] = (time.perf_counter() - total_started) * 1000
        return AskResult(
            question=question, kb=retrieval.kb, index=index, k=k, passages=retrieval.passages,
            variants=results, closed_book=closed_result, timings_ms=timings,
            notices=notices + answer_notices + retrieval.notices + (sureness.SCORED_NO_BADGE,),
            index_recall=retrieval.index_recall, scale=retrieval.scale,
            retriever=retrieval.retriever, lexical_weight=retrieval.lexical_weight, no_answer=no_answer,
            memory_logit=memory_logit, memory_prob=float(retrieval.doc_lp[-1].exp()) if with_memory else None,
            question_encoder=retrieval.question_encoder,
        )

"""The RAG engine: encode the question, search, weigh passages, generate, marginalize.

One `RagEngine` holds the models and knowledge bases read-only; each call returns a typed
`AskResult` with the numbers behind every answer and the time each stage took.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from . import decoding
from .config import (BM25_SCALE, DECODINGS, DEFAULT_ENCODER, DEFAULT_LEXICAL_WEIGHT, INDEX_KINDS, LIMITS, RETRIEVERS,
                     VARIANTS, EngineConfig)
from .corpus import KnowledgeBase, Passage, load_kb, make_kb
from .encoders import Encoder
from .errors import InputError, KnowledgeBaseError
from .generator import DecodeState, Generator, Target, generator_from_model
from .flat import inner_products
from .index import SearchIndex, cached_index, index_cache_paths, measure, prebuilt_kind, recall_at_k
from .lexical import LexicalIndex, best_rows
from .marginalize import (
    doc_logprobs,
    rag_sequence_logprob,
    rag_sequence_posteriors,
    rag_sequence_token_logprobs,
    rag_token_logprob,
    rag_token_posteriors,
    rag_token_token_logprobs,
)
from .progress import Progress, counted
from .results import (AskResult, ClosedBookResult, IndexReport, RetrievedPassage, RetrieverComparison, RetrieverRanking,
                      VariantResult)
from .store import gather_rows
from .text import clean_text

log = logging.getLogger(__name__)

PRIVATE_INDEX_SLOTS = 16  # indexes of visitors' own KBs kept in memory, least recently used dropped
OOM_NOTICE = "the GPU ran out of memory, so this answer was computed on the CPU (and later ones will be too)"


@dataclass(frozen=True)
class _Retrieval:
    passages: tuple[RetrievedPassage, ...]
    doc_lp: torch.Tensor  # (K,) log p(z|x)
    generator_question: str  # the question as the generator reads it
    recall: float | None
    notices: tuple[str, ...]
    retriever: str = "dense"
    lexical_weight: float = 0.0
    scale: float = 1.0  # the logits' scale: the encoder's, or BM25_SCALE for bm25 retrieval


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


class _Steps:
    """Counts an ask's steps for `progress(stage, done, total)`; without a listener it does nothing."""

    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, stage: str) -> None:
        if self.progress is not None:
            self.progress(stage, min(self.done, self.total - 1), self.total)
        self.done += 1


class RagEngine:
    """Composes an encoder, a generator and knowledge bases; see `ask` and `score`."""

    def __init__(
        self,
        *,
        encoder: Encoder,
        generator: Generator,
        kbs: dict[str, KnowledgeBase],
        config: EngineConfig = EngineConfig(),
        index_cache: Path | None = None,
        token_generation_config=None,
        question_for_generator=None,
        examples: dict[str, list[str]] | None = None,
    ):
        if not kbs:
            raise KnowledgeBaseError("the engine needs at least one knowledge base")
        for kb in kbs.values():
            check_kb_matches_encoder(kb, encoder)
        self.encoder = encoder
        self.generator = generator
        self.kbs = dict(kbs)
        self.config = config
        self.index_cache = index_cache
        # transformers' RagTokenForGeneration decodes with the RAG model's generation config,
        # RAG-Sequence with the generator's own; a checkpoint may set them differently.
        self.token_generation_config = token_generation_config or generator.model.generation_config
        self._question_for_generator = question_for_generator or (lambda q: q)
        self._examples = examples or {}
        self._indexes: dict[tuple[str, str], SearchIndex] = {}
        self._private: OrderedDict[tuple[str, str], SearchIndex] = OrderedDict()
        self._reports: dict[tuple[str, str], IndexReport] = {}
        self._lock = threading.RLock()
        weight = config.retrieval.lexical_weight
        if weight is None:
            weight = DEFAULT_LEXICAL_WEIGHT if encoder.name == DEFAULT_ENCODER else 0.0
        if not weight >= 0:
            raise InputError(f"the lexical weight must be 0 or more, not {weight}")
        self.lexical_weight = float(weight)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: EngineConfig = EngineConfig(), *, kb_paths: dict[str, str] | None = None, progress=None) -> "RagEngine":
        """Load models and KBs. With defaults everywhere, fetch/build the offline default first."""
        from .loading import engine_from_config

        return engine_from_config(config, kb_paths=kb_paths, progress=progress)

    # -- knowledge bases and indexes ------------------------------------------------------------
    @property
    def kb_names(self) -> tuple[str, ...]:
        return tuple(self.kbs)

    @property
    def default_kb(self) -> str:
        return next(iter(self.kbs))

    def resolve_kb(self, kb: str | KnowledgeBase | None) -> KnowledgeBase:
        if isinstance(kb, KnowledgeBase):
            check_kb_matches_encoder(kb, self.encoder)
            return kb
        name = kb or self.default_kb
        if name in self.kbs:
            return self.kbs[name]
        if _is_folder(name):
            loaded = load_kb(Path(name).expanduser())
            check_kb_matches_encoder(loaded, self.encoder)
            with self._lock:
                self.kbs.setdefault(str(name), loaded)
            return loaded
        raise InputError(f"unknown knowledge base {name!r}; choose one of {', '.join(self.kbs)} or give a KB folder")

    def _kept(self, kb: KnowledgeBase, kind: str, build):
        """`build(registered)` once per KB and kind, then kept: for good when the KB is registered,
        in the PRIVATE_INDEX_SLOTS least-recently-used slots when it is a visitor's own."""
        key = (kb.fingerprint, kind)
        registered = any(k is kb for k in self.kbs.values())
        with self._lock:
            store = self._indexes if registered else self._private
            if key in store:
                if not registered:
                    store.move_to_end(key)
                return store[key]
            store[key] = built = build(registered)
            if not registered:
                while len(store) > PRIVATE_INDEX_SLOTS:
                    store.popitem(last=False)
            return built

    def _index_for(self, kb: KnowledgeBase, kind: str) -> SearchIndex:
        if kind not in INDEX_KINDS:
            raise InputError(f"unknown index {kind!r}; choose one of {', '.join(INDEX_KINDS)}")

        def build(registered: bool) -> SearchIndex:
            cache_dir = (kb.path / "indexes") if (registered and kb.path is not None) else None
            if cache_dir is None and registered and self.index_cache is not None:
                cache_dir = self.index_cache / kb.fingerprint
            return cached_index(kind, kb.embeddings, kb.fingerprint, cache_dir, self.config.index, device=self.encoder.device,
                                prebuilt=kb.index_file)

        return self._kept(kb, kind, build)

    def _lexical_for(self, kb: KnowledgeBase) -> LexicalIndex:
        """The KB's BM25 index, built on first use (about a second for the default KBs) and kept like its vector indexes."""
        return self._kept(kb, "bm25", lambda registered: LexicalIndex.for_passages(kb.titles, kb.texts))

    @property
    def retrievers(self) -> tuple[str, ...]:
        """The retrievers this engine offers: dense and bm25 always, hybrid when it has a lexical weight."""
        return tuple(r for r in RETRIEVERS if r != "hybrid" or self.lexical_weight > 0)

    def resolve_retriever(self, retriever: str | None) -> str:
        """The retriever an ask uses: the one named, or hybrid when this engine has a lexical weight."""
        if retriever is None:
            return "hybrid" if self.lexical_weight > 0 else "dense"
        if retriever not in RETRIEVERS:
            raise InputError(f"unknown retriever {str(retriever)[:40]!r}; choose one of {', '.join(RETRIEVERS)}")
        if retriever == "hybrid" and self.lexical_weight == 0:
            raise InputError("hybrid retrieval needs a lexical weight above 0 for this encoder (--lexical-weight); "
                             "dense and bm25 need none")
        return retriever

    def search_index(self, kb: str | KnowledgeBase | None = None, kind: str = "flat") -> SearchIndex:
        """The built `kind` index of a knowledge base (built or loaded on first use)."""
        return self._index_for(self.resolve_kb(kb), kind)

    def index_reports(self, kb: str | KnowledgeBase | None = None, *, k: int = 10) -> list[IndexReport]:
        """Build time, bytes, recall@k against flat and query latency of each index variant."""
        knowledge = self.resolve_kb(kb)
        flat = self._index_for(knowledge, "flat")
        reports = []
        for kind in INDEX_KINDS:
            key = (knowledge.fingerprint, f"{kind}@{k}")
            with self._lock:
                if key not in self._reports:
                    self._reports[key] = measure(self._index_for(knowledge, kind), flat, knowledge.embeddings, k=k)
                reports.append(self._reports[key])
        return reports

    def build_kb(self, name: str, passages: list[Passage], *, progress=None) -> KnowledgeBase:
        """Embed `passages` into an in-memory KB (e.g. a visitor's own text); nothing is written.

        Out of GPU memory, the batch is halved down to one passage, then the models move to the CPU.
        """
        if not passages:
            raise InputError("no passages to index; paste or upload some text")
        callback = None if progress is None else (lambda done, total: progress("embedding passages", done, total))
        batch_size = 32
        while True:
            try:
                vectors = self.encoder.encode_passages(passages, batch_size=batch_size, progress=callback)
                break
            except torch.cuda.OutOfMemoryError:
                if self.encoder.device.type == "cpu":
                    raise
                if batch_size > 1:
                    batch_size //= 2
                    log.warning("out of GPU memory while embedding; retrying with batches of %d passages", batch_size)
                else:
                    self.move_to_cpu(reason="out of GPU memory while embedding one passage at a time")
        return make_kb(name, passages, vectors, encoder=self.encoder.name)

    def release_kb(self, kb: KnowledgeBase) -> None:
        """Forget the in-memory indexes and reports of a visitor's own KB (its session ended)."""
        if any(known is kb for known in self.kbs.values()):
            return
        with self._lock:
            for store in (self._private, self._reports):
                for key in [key for key in store if key[0] == kb.fingerprint]:
                    del store[key]

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
            enc = self.encoder
            if enc.device.type != "cpu":
                self.encoder = replace(
                    enc, question_model=enc.question_model.to(cpu), device=cpu,
                    passage_model=enc.passage_model.to(cpu) if enc.passage_model is not None else None,
                )
                self._indexes.clear()
                self._private.clear()

    def warm_up(self) -> float:
        """Load each KB's exact index, the approximate ones already saved beside it, and its BM25
        index (bm25 and hybrid retrieval), and answer one example question; returns the seconds it took.

        Indexes load and the few-shot cache is computed on first use, and torch's first passes are
        slow, so without this the first visitor of a fresh server waits several times a normal ask.
        """
        started = time.perf_counter()
        for name in self.kbs:
            self.search_index(name, "flat")
            for kind in self._prebuilt_kinds(self.kbs[name]):
                self.search_index(name, kind)  # checking and reading the file: tens of ms at a first ask
            self._lexical_for(self.kbs[name])  # every engine offers bm25 retrieval
        question = next(iter(self.example_questions()), "Who wrote the novel Nineteen Eighty-Four?")
        self.ask(question, k=min(5, len(self.kbs[self.default_kb])))
        return time.perf_counter() - started

    def _prebuilt_kinds(self, kb: KnowledgeBase) -> list[str]:
        """The approximate index kinds already saved beside a KB (`prepare` saves them for the default KBs)."""
        if kb.path is None:
            return []
        came_with = prebuilt_kind(kb.index_file) if kb.index_file is not None else None
        return [kind for kind in INDEX_KINDS if kind != "flat" and (kind == came_with or
                index_cache_paths(kind, kb.fingerprint, kb.path / "indexes", self.config.index)[0].is_file())]

    def feature_examples(self, examples: dict[str, list[str]]) -> None:
        """Replace the example questions offered for these KBs (e.g. reordered by `featured`)."""
        self._examples = {**self._examples, **{name: list(qs) for name, qs in examples.items()}}

    def example_questions(self, kb: str | None = None, n: int = 8) -> list[str]:
        return list(self._examples.get(kb or self.default_kb, []))[:n]

    # -- retrieval ------------------------------------------------------------------------------
    def retrieve(self, question: str, *, kb: str | KnowledgeBase | None = None, k: int = 5, index: str = "flat",
                 retriever: str | None = None, timings: dict[str, float] | None = None,
                 rows: Sequence[int] | None = None) -> _Retrieval:
        """The top k passages of a knowledge base for `question` and their p(z|x) under `retriever`.

        `rows` names the passages instead of searching for them (k = len(rows)): p(z|x) is then the
        same softmax over just those rows, e.g. 1 for a single gold passage (`eval --gold-passage`)."""
        knowledge = self.resolve_kb(kb)
        retriever = self.resolve_retriever(retriever)
        if rows is not None:
            rows = [int(row) for row in rows]
            if not rows or any(not 0 <= row < len(knowledge) for row in rows):
                raise InputError(f"passage rows must lie in 0..{len(knowledge) - 1} of {knowledge.name}")
            k, index = len(rows), "flat"
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise InputError("k must be a whole number of at least 1")
        if k > len(knowledge):
            raise InputError(f"k={k} is larger than the knowledge base ({len(knowledge)} passages); choose k <= {len(knowledge)}")
        if k > LIMITS.max_k:
            raise InputError(f"k must be between 1 and {LIMITS.max_k}")
        if index not in INDEX_KINDS:
            raise InputError(f"unknown index {index!r}; choose one of {', '.join(INDEX_KINDS)}")
        timings = {} if timings is None else timings
        if retriever == "bm25":
            return self._retrieve_bm25(question, knowledge, k=k, index=index, timings=timings, rows=rows)
        notices = []
        started = time.perf_counter()
        question_tokens = len(self.encoder.tokenizer(question)["input_ids"])
        if question_tokens > self.encoder.max_length:
            notices.append(f"the question is {question_tokens} tokens; the retriever read its first {self.encoder.max_length}")
        xq = self.encoder.encode_questions([question])  # (1, D)
        timings["encode"] = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        query = xq.float().cpu().numpy()
        weight = self.lexical_weight if retriever == "hybrid" else 0.0
        lexical = self._lexical_for(knowledge).scores(question) if retriever == "hybrid" else None  # (N,)
        recall = None
        if rows is not None:
            ids = rows
            vectors = torch.from_numpy(gather_rows(knowledge.embeddings, ids))  # (k, D)
            scores = (xq.float().cpu() @ vectors.T)[0]  # (k,)
        elif retriever == "hybrid" and index == "flat":
            ids = list(range(len(knowledge)))  # exact search: every passage's dense + lexical logit
            scores = inner_products(query, knowledge.embeddings)[0]  # (N,), the rows read in chunks
        else:
            depth = k if retriever == "dense" else min(max(k, self.config.retrieval.candidates), len(knowledge))
            _, found = self._index_for(knowledge, index).search(query, depth)
            ids = [int(i) for i in found[0] if i >= 0]
            if index != "flat":
                _, exact = self._index_for(knowledge, "flat").search(query, k)
                recall = recall_at_k(found[:, :k], exact)
            if lexical is not None:  # an approximate index: its dense rows and BM25's best, rescored together
                seen = set(ids)
                ids += [int(i) for i in best_rows(lexical, depth) if int(i) not in seen]
            # Scores are exact inner products with the stored vectors, as transformers' RagModel does,
            # so an approximate index changes which passages come back, not how they are weighed.
            vectors = torch.from_numpy(gather_rows(knowledge.embeddings, ids))  # (C, D)
            scores = (xq.float().cpu() @ vectors.T)[0]  # (C,)
        lexical_scores = torch.from_numpy(lexical[ids]) if lexical is not None else torch.zeros(len(ids))  # (C,)
        logits = scores * self.encoder.scale + weight * lexical_scores  # (C,)
        passages, doc_lp = _top_k(knowledge, ids, scores, lexical_scores, logits, k)
        if len(passages) < k:
            notices.append(f"the {index} index returned {len(passages)} of {k} passages")
        timings["search"] = (time.perf_counter() - started) * 1000
        return _Retrieval(passages, doc_lp, self._question_for_generator(question), recall, tuple(notices), retriever, weight,
                          self.encoder.scale)

    def _retrieve_bm25(self, question: str, knowledge: KnowledgeBase, *, k: int, index: str,
                       timings: dict[str, float], rows: list[int] | None = None) -> _Retrieval:
        """BM25 alone: every passage scored (exact, whatever the index), p(z|x) = softmax(BM25_SCALE * BM25) over the top k."""
        notices = []
        if index != "flat":  # said, not silently ignored: the visitor chose an index and should know it did nothing
            notices.append(f"BM25 scores every passage exactly; the {index} index holds dense vectors, so it was not used")
        timings["encode"] = 0.0  # no encoder runs: BM25 reads the question's words
        started = time.perf_counter()
        lexical = torch.from_numpy(self._lexical_for(knowledge).scores(question))  # (N,)
        ids = list(range(len(knowledge))) if rows is None else rows
        lexical = lexical[ids]  # (C,)
        passages, doc_lp = _top_k(knowledge, ids, lexical, lexical, BM25_SCALE * lexical, k)
        matching = int((lexical > 0).sum())
        if matching < k:  # BM25 knows nothing about the others: they tie at 0, so say where their order comes from
            notices.append(_bm25_shortfall(matching, k))
        timings["search"] = (time.perf_counter() - started) * 1000
        return _Retrieval(passages, doc_lp, self._question_for_generator(question), None, tuple(notices), "bm25", 0.0,
                          BM25_SCALE)

    def gold_rows(self, question: str, kb: str | KnowledgeBase | None = None) -> tuple[int, ...]:
        """Rows of the question's gold passage when the KB is stored with its questions (the default KBs); else ()."""
        from .questions import gold_rows_by_question, normalize_answer

        knowledge = self.resolve_kb(kb)
        table = self._kept(knowledge, "gold", lambda registered: gold_rows_by_question(knowledge.path))
        return table.get(normalize_answer(question), ())

    @falls_back_to_cpu_on_gpu_oom
    def compare_retrievers(self, question: str, *, kb: str | KnowledgeBase | None = None, k: int = 5) -> RetrieverComparison:
        """The top k of each retriever this engine offers for one question, with the gold passage's rank when known.

        Every retriever searches exactly (the flat index), so the columns differ only in how passages are scored."""
        question, notices = clean_text(question, what="question")
        knowledge = self.resolve_kb(kb)
        gold = self.gold_rows(question, knowledge)
        started = time.perf_counter()
        rankings, timings = [], {}
        for retriever in self.retrievers:
            began = time.perf_counter()
            retrieval = self.retrieve(question, kb=knowledge, k=k, retriever=retriever)
            timings[retriever] = (time.perf_counter() - began) * 1000
            ranks = [p.rank for p in retrieval.passages if p.id in gold]
            rankings.append(RetrieverRanking(retriever, retrieval.passages, retrieval.scale, retrieval.lexical_weight,
                                             gold_rank=min(ranks) if ranks else None, notices=retrieval.notices))
        timings["total"] = (time.perf_counter() - started) * 1000
        return RetrieverComparison(question=question, kb=knowledge.name, k=k, rankings=tuple(rankings), gold_ids=gold,
                                   timings_ms=timings, notices=notices)

    # -- generation helpers --------------------------------------------------------------------
    def _inputs(self, retrieval: _Retrieval) -> list[str]:
        return [
            self.generator.format_input(retrieval.generator_question, Passage(p.title, p.text)) for p in retrieval.passages
        ]

    def _doc_token_logprobs(self, state: DecodeState, targets: list[tuple[int, ...]], rows_per_target: list[list[int]]) -> list[torch.Tensor]:
        """Teacher-forced log p(y_t|x,z,y<t) of each target under the given rows of `state`."""
        pairs = [(t, r) for t, rows in enumerate(rows_per_target) for r in rows]
        if not pairs:
            return [torch.zeros(0, len(t)) for t in targets]
        length = max(len(targets[t]) for t, _ in pairs)
        ids = torch.full((len(pairs), max(length, 1)), 0, dtype=torch.long)
        mask = torch.zeros(len(pairs), max(length, 1), dtype=torch.bool)
        for i, (t, _) in enumerate(pairs):
            ids[i, : len(targets[t])] = torch.tensor(targets[t], dtype=torch.long)
            mask[i, : len(targets[t])] = True
        rows = torch.tensor([r for _, r in pairs])
        logprobs = self.generator.continuation_logprobs(state, rows, ids, mask)  # (P, T)
        out, cursor = [], 0
        for t, rows in enumerate(rows_per_target):
            out.append(logprobs[cursor : cursor + len(rows), : len(targets[t])])
            cursor += len(rows)
        return out

    def _all_rows_logprobs(self, state: DecodeState, targets: list[tuple[int, ...]],
                           known: list[dict[int, torch.Tensor]]) -> list[torch.Tensor]:
        """(R, T) log p(y_t|x,z,y<t) of each target under every row: rows that decoding already scored
        (`known[i][row]`, (T,)) are reused, the rest are teacher-forced in one pass."""
        missing = [[r for r in range(state.rows) if r not in have] for have in known]
        forced = self._doc_token_logprobs(state, targets, missing)
        out = []
        for target, have, rows, lps in zip(targets, known, missing, forced):
            got = dict(have) | {r: lps[i] for i, r in enumerate(rows)}
            out.append(torch.stack([got[r] for r in range(state.rows)]) if got else torch.zeros(0, len(target)))
        return out

    def _variant_result(self, variant: str, ids: tuple[int, ...], per_doc: torch.Tensor, doc_lp: torch.Tensor,
                        closed: torch.Tensor, *, decoding_name: str, candidates=()) -> VariantResult:
        tl, lp = per_doc[None], doc_lp[None]  # (1, K, T), (1, K)
        mask = torch.ones(1, per_doc.shape[1], dtype=torch.bool)
        if variant == "token":
            logprob = rag_token_logprob(tl, lp, mask)[0]
            token_lps = rag_token_token_logprobs(tl, lp)[0]
            posteriors = rag_token_posteriors(tl, lp)[0]
        else:
            logprob = rag_sequence_logprob(tl, lp, mask)[0]
            token_lps = rag_sequence_token_logprobs(tl, lp)[0]
            posteriors = rag_sequence_posteriors(tl, lp)[0]
        return VariantResult(
            variant=variant,
            answer=self.generator.decode(list(ids)),
            tokens=tuple(self.generator.token_text(i) for i in ids),
            token_ids=tuple(int(i) for i in ids),
            logprob=float(logprob),
            token_logprobs=tuple(float(x) for x in token_lps),
            doc_token_logprobs=tuple(tuple(float(x) for x in row) for row in per_doc.T),
            posteriors=tuple(tuple(float(x) for x in row) for row in posteriors),
            closed_book_token_logprobs=tuple(float(x) for x in closed),
            candidates=tuple(candidates),
            decoding=decoding_name,
        )

    def _closed_book_state(self, question: str, prefix: tuple[int, ...]) -> DecodeState:
        return self.generator.start([self.generator.format_input(question, None)], prefix)

    # -- decoding -------------------------------------------------------------------------------
    def _decode_token(self, state: DecodeState, doc_lp: torch.Tensor, prefix, *, num_beams: int,
                      max_new_tokens: int, copy_from=None) -> tuple[tuple[int, ...], dict[int, torch.Tensor]]:
        """The answer and the per-row log-probs decoding already gave for it ({} after beam search)."""
        gen = self.generator
        branch = gen.fork(state, torch.arange(state.rows))
        stop = self._stop_ids()
        options = dict(prefix=prefix, max_new_tokens=max_new_tokens, stop_ids=stop, generation_config=self.token_generation_config,
                       copy_from=copy_from)
        if num_beams == 1:
            hyp = decoding.greedy(gen, branch, groups=1, doc_lp=doc_lp, **options)[0]
            return hyp.ids, dict(enumerate(hyp.row_logprobs))
        return decoding.beam_search(gen, branch, groups=1, doc_lp=doc_lp, num_beams=num_beams, **options)[0][0].ids, {}

    def _decode_sequence(self, state: DecodeState, doc_lp: torch.Tensor, prefix, *, num_beams: int, max_new_tokens: int,
                         sequence_decoding: str, copy_from=None, step: Callable[[str], None] | None = None,
                         ) -> tuple[tuple[int, ...], list[tuple[tuple[int, ...], float]], dict[int, torch.Tensor]]:
        """Per-passage beams, then the marginal over passages (thorough) or over finders (fast).

        Returns the best answer, all candidates with their scores, and the best answer's per-row
        log-probs known so far (greedy gives the finders' rows; thorough scoring gives every row)."""
        gen = self.generator
        docs = state.rows
        branch = gen.fork(state, torch.arange(docs))
        stop = self._stop_ids()
        if num_beams == 1:
            per_group = [[h] for h in decoding.greedy(gen, branch, groups=docs, doc_lp=None, prefix=prefix,
                                                      max_new_tokens=max_new_tokens, stop_ids=stop, copy_from=copy_from)]
        else:
            per_group = decoding.beam_search(gen, branch, groups=docs, doc_lp=None, prefix=prefix,
                                             max_new_tokens=max_new_tokens, stop_ids=stop, num_beams=num_beams,
                                             copy_from=copy_from)
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
                 + (f"against all {docs} passages" if sequence_decoding == "thorough" else "against the passages that wrote them"))
        rows = [list(range(docs)) if sequence_decoding == "thorough" else found_by[c] for c in candidates]
        missing = [[z for z in zs if z not in known.get(c, {})] for c, zs in zip(candidates, rows)]
        for cand, zs, lps in zip(candidates, missing, self._doc_token_logprobs(state, candidates, missing)):
            known.setdefault(cand, {}).update({z: lps[i] for i, z in enumerate(zs)})
        scored = []
        for cand, zs in zip(candidates, rows):
            lps = torch.stack([known[cand][z] for z in zs])  # (len(zs), T)
            scored.append((cand, float(torch.logsumexp(lps.sum(-1) + doc_lp[zs], dim=0))))
        best = max(range(len(scored)), key=lambda i: scored[i][1])
        return scored[best][0], sorted(scored, key=lambda item: -item[1]), known[scored[best][0]]

    def _stop_ids(self) -> frozenset[int]:
        return getattr(self.generator, "stop_ids", self.generator.eos_ids)

    # -- public API -----------------------------------------------------------------------------
    def _check_options(self, variants, num_beams, max_new_tokens, sequence_decoding) -> tuple[str, ...]:
        if isinstance(variants, str):
            variants = VARIANTS if variants == "both" else (variants,)
        if not isinstance(variants, (tuple, list)):
            raise InputError(f"unknown variant {str(variants)[:40]!r}; choose token, sequence or both")
        variants = tuple(variants)
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown or not variants:
            raise InputError(f"unknown variant {unknown[0] if unknown else ''!r}; choose token, sequence or both")
        if not isinstance(num_beams, int) or not 1 <= num_beams <= LIMITS.max_beams:
            raise InputError(f"num_beams must be between 1 and {LIMITS.max_beams}")
        if not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= LIMITS.max_new_tokens:
            raise InputError(f"max_new_tokens must be between 1 and {LIMITS.max_new_tokens}")
        if sequence_decoding not in DECODINGS:
            raise InputError(f"unknown decoding {sequence_decoding!r}; choose thorough or fast")
        return variants

    @falls_back_to_cpu_on_gpu_oom
    def ask(self, question: str, *, kb: str | KnowledgeBase | None = None, k: int = 5, index: str = "flat",
            variants=VARIANTS, num_beams: int | None = None, sequence_decoding: str | None = None,
            max_new_tokens: int | None = None, closed_book: bool = True, retriever: str | None = None,
            extractive: bool | None = None, progress: Progress | None = None, rows: Sequence[int] | None = None) -> AskResult:
        """Retrieve k passages, answer with each variant, and trace every token to its passages.

        `extractive` makes both variants copy a run of a retrieved passage (see `decoding.CopySpans`);
        the closed-book answer, which reads no passage, stays free. `progress(stage, done, total)`
        hears of each step as it starts (`total` steps in all), so a page can say what is running
        instead of guessing a time. `rows` reads those passages of the KB instead of retrieving
        (see `retrieve`)."""
        num_beams = self.config.decoding.num_beams if num_beams is None else num_beams
        max_new_tokens = self.config.decoding.max_new_tokens if max_new_tokens is None else max_new_tokens
        sequence_decoding = sequence_decoding or self.config.decoding.sequence_decoding
        variants = self._check_options(variants, num_beams, max_new_tokens, sequence_decoding)
        extractive = self.config.decoding.extractive if extractive is None else bool(extractive)
        if extractive and self.generator.kind != "causal":
            raise InputError("copying answers from passages works with causal generators only; "
                             f"{self.generator.name} is {self.generator.kind}")
        question, notices = clean_text(question, what="question")
        step = _Steps(progress, 3 + ("token" in variants) + 2 * ("sequence" in variants) + closed_book)
        total_started = time.perf_counter()
        timings: dict[str, float] = {}
        step("retrieving passages")
        retrieval = self.retrieve(question, kb=kb, k=k, index=index, retriever=retriever, timings=timings, rows=rows)
        started = time.perf_counter()
        gen = self.generator
        prefix = gen.generation_prefix()
        copy_from = ([gen.copy_source(retrieval.generator_question, Passage(p.title, p.text)) for p in retrieval.passages]
                     if extractive else None)
        docs = len(retrieval.passages)
        with torch.inference_mode():
            step(f"reading the {counted(docs, 'passage')}")
            state = gen.start(self._inputs(retrieval), prefix)
            answers: dict[str, tuple[tuple[int, ...], list, dict[int, torch.Tensor]]] = {}
            if "token" in variants:
                step("RAG-Token: writing the answer, one token at a time over all passages")
                ids, known = self._decode_token(state, retrieval.doc_lp, prefix, num_beams=num_beams, max_new_tokens=max_new_tokens,
                                                copy_from=copy_from)
                answers["token"] = (ids, [], known)
            if "sequence" in variants:
                step("RAG-Sequence: an answer from each passage")
                answers["sequence"] = self._decode_sequence(state, retrieval.doc_lp, prefix, num_beams=num_beams,
                                                            max_new_tokens=max_new_tokens, sequence_decoding=sequence_decoding,
                                                            copy_from=copy_from, step=step)
            step("tracing each answer token to its passages")
            targets = [ids for ids, _, _ in answers.values()]
            per_doc = self._all_rows_logprobs(state, targets, [known for _, _, known in answers.values()])
            closed_lps = [torch.full((1, len(t)), float("nan")) for t in targets]
            closed_result = None
            if closed_book:
                step("the closed-book answer (no passages)")
                with gen.base_weights():  # the model's own memory, without the reading adapter
                    closed_state = self._closed_book_state(retrieval.generator_question, prefix)
                    closed_lps = self._doc_token_logprobs(closed_state, targets, [[0]] * len(targets))
                    closed_result = self._closed_book_answer(closed_state, prefix, max_new_tokens)
            results = {}
            decoding_name = ("greedy" if num_beams == 1 else f"beam {num_beams}") + (", copying" if extractive else "")
            for (variant, (ids, candidates, _)), lps, closed in zip(answers.items(), per_doc, closed_lps):
                name = decoding_name if variant == "token" else f"{decoding_name}, {sequence_decoding}"
                results[variant] = self._variant_result(
                    variant, ids, lps, retrieval.doc_lp, closed[0], decoding_name=name,
                    candidates=[(gen.decode(list(c)), s) for c, s in candidates],
                )
        timings["generate"] = (time.perf_counter() - started) * 1000
        timings["total"] = (time.perf_counter() - total_started) * 1000
        return AskResult(
            question=question, kb=self.resolve_kb(kb).name, index=index, k=len(retrieval.passages),
            passages=retrieval.passages,
            variants=results, closed_book=closed_result, timings_ms=timings,
            notices=notices + retrieval.notices, index_recall=retrieval.recall, scale=retrieval.scale,
            retriever=retrieval.retriever, lexical_weight=retrieval.lexical_weight, extractive=extractive,
        )

    def _closed_book_answer(self, state: DecodeState, prefix, max_new_tokens: int) -> ClosedBookResult:
        gen = self.generator
        hyp = decoding.greedy(gen, gen.fork(state, torch.arange(1)), groups=1, doc_lp=None, prefix=prefix,
                              max_new_tokens=max_new_tokens, stop_ids=self._stop_ids())[0]
        lps = hyp.row_logprobs[0]  # greedy's own log-probs of its tokens
        return ClosedBookResult(
            answer=gen.decode(list(hyp.ids)), tokens=tuple(gen.token_text(i) for i in hyp.ids),
            token_logprobs=tuple(float(x) for x in lps), logprob=float(lps.sum()),
        )

    def closed_book(self, question: str, *, max_new_tokens: int | None = None) -> ClosedBookResult:
        """The generator's greedy answer without any passage: its parametric memory alone (the base
        weights, without a reading adapter)."""
        max_new_tokens = self.config.decoding.max_new_tokens if max_new_tokens is None else max_new_tokens
        self._check_options(VARIANTS, 1, max_new_tokens, "thorough")
        question, _ = clean_text(question, what="question")
        prefix = self.generator.generation_prefix()
        with torch.inference_mode(), self.generator.base_weights():
            state = self._closed_book_state(self._question_for_generator(question), prefix)
            return self._closed_book_answer(state, prefix, max_new_tokens)

    @falls_back_to_cpu_on_gpu_oom
    def score(self, question: str, answer: str, *, kb: str | KnowledgeBase | None = None, k: int = 5,
              index: str = "flat", variants=VARIANTS, retriever: str | None = None,
              progress: Progress | None = None) -> AskResult:
        """log p(answer|x) under each variant, with per-token provenance, for an answer the user gives.

        The answer is scored with the ending RAG-Token finds likeliest after it (for a causal
        generator "\n\n", "\n" or EOS): the one greedy decoding would pick, so an answer the page
        wrote scores as it did when asked."""
        variants = self._check_options(variants, 1, 1, "thorough")
        question, notices = clean_text(question, what="question")
        answer, answer_notices = clean_text(answer, what="answer", limit=LIMITS.max_answer_chars)
        step = _Steps(progress, 4)
        total_started = time.perf_counter()
        timings: dict[str, float] = {}
        step("retrieving passages")
        retrieval = self.retrieve(question, kb=kb, k=k, index=index, retriever=retriever, timings=timings)
        started = time.perf_counter()
        gen = self.generator
        targets: list[Target] = gen.answer_targets(answer)
        with torch.inference_mode():
            docs = len(retrieval.passages)
            step(f"reading the {counted(docs, 'passage')}")
            state = gen.start(self._inputs(retrieval), targets[0].prefix)
            step("scoring the answer under each passage")
            all_rows = list(range(state.rows))
            per_ending = self._doc_token_logprobs(state, [t.ids for t in targets], [all_rows] * len(targets))
            token_lp = [float(rag_token_token_logprobs(lps[None], retrieval.doc_lp[None])[0, -1]) for lps in per_ending]
            best = max(range(len(targets)), key=lambda i: token_lp[i])  # the answer part is shared
            target, per_doc = targets[best], per_ending[best]
            step("scoring it closed-book (no passages)")
            with gen.base_weights():
                closed_state = self._closed_book_state(retrieval.generator_question, target.prefix)
                closed = self._doc_token_logprobs(closed_state, [target.ids], [[0]])[0][0]
        results = {
            v: self._variant_result(v, target.ids, per_doc, retrieval.doc_lp, closed, decoding_name="scored") for v in variants
        }
        closed_result = ClosedBookResult(
            answer=answer, tokens=tuple(gen.token_text(i) for i in target.ids),
            token_logprobs=tuple(float(x) for x in closed), logprob=float(closed.sum()),
        )
        timings["generate"] = (time.perf_counter() - started) * 1000
        timings["total"] = (time.perf_counter() - total_started) * 1000
        return AskResult(
            question=question, kb=self.resolve_kb(kb).name, index=index, k=k, passages=retrieval.passages,
            variants=results, closed_book=closed_result, timings_ms=timings,
            notices=notices + answer_notices + retrieval.notices, index_recall=retrieval.recall, scale=retrieval.scale,
            retriever=retrieval.retriever, lexical_weight=retrieval.lexical_weight,
        )


def _bm25_shortfall(matching: int, k: int) -> str:
    """The notice for a BM25 top k in which only `matching` passages share a word with the question.

    >>> _bm25_shortfall(2, 3)
    "only 2 passages share a word with the question; the last of the top 3 scores 0 (ties keep the knowledge base's order)"
    """
    if matching == 0:
        return f"no passage shares a word with the question: all score 0, so the top {k} follow the knowledge base's order"
    rest = k - matching
    shares = "shares" if matching == 1 else "share"
    last = f"the last of the top {k} scores" if rest == 1 else f"the last {rest} of the top {k} score"
    return (f"only {counted(matching, 'passage')} {shares} a word with the question; {last} 0 "
            "(ties keep the knowledge base's order)")


def _top_k(knowledge: KnowledgeBase, ids: list[int], scores: torch.Tensor, lexical: torch.Tensor, logits: torch.Tensor,
           k: int) -> tuple[tuple[RetrievedPassage, ...], torch.Tensor]:
    """The k candidates with the highest logits, best first (ties keep candidate order), and log p(z|x) over them.

    `ids` are C KB rows; `scores`, `lexical`, `logits` are (C,) in the same order. Returns the passages and (K,) log p(z|x).
    """
    order = torch.argsort(logits, descending=True, stable=True)[:k]
    scores, lexical, logits = scores[order], lexical[order], logits[order]
    doc_lp = doc_logprobs(logits[None])[0]  # (K,)
    passages = tuple(
        RetrievedPassage(
            rank=rank + 1, id=row, title=knowledge.titles[row], text=knowledge.texts[row],
            score=float(scores[rank]), prob=float(doc_lp[rank].exp()), logit=float(logits[rank]), lexical=float(lexical[rank]),
        )
        for rank, row in enumerate(ids[i] for i in order.tolist())
    )
    return passages, doc_lp


def _is_folder(name: object) -> bool:
    """Whether `name` names an existing folder; odd names (a NUL byte, a number) simply do not."""
    try:
        return Path(str(name)).expanduser().is_dir()
    except (OSError, ValueError):
        return False


def check_kb_matches_encoder(kb: KnowledgeBase, encoder: Encoder) -> None:
    if kb.dim != encoder.dim:
        raise KnowledgeBaseError(
            f"knowledge base {kb.name!r} has {kb.dim}-dim embeddings but the encoder {encoder.name!r} makes "
            f"{encoder.dim}-dim vectors; rebuild the KB with this encoder (`python -m rag_demo build-kb ... --encoder {encoder.name}`)"
        )

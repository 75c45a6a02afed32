"""The retriever p(z|x): a question's top k passages of a knowledge base and their weights.

A `Retriever` holds the question encoder, the knowledge bases, their search indexes (exact and
approximate, `rag_demo.retrieval.index`) and their BM25 indexes (`rag_demo.retrieval.lexical`). It weighs C candidate
passages by one of three logits:

    dense   scale * d(z)ᵀq(x)                                the paper's retriever
    bm25    BM25_SCALE * BM25(x, z)                           word matching alone; no encoder runs
    hybrid  scale * d(z)ᵀq(x) + lexical_weight * BM25(x, z)

and p(z|x) is the softmax of the top k logits, renormalized over those k (`marginalize.doc_logprobs`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ..config import (ASK, BM25_SCALE, DEFAULT_ENCODER, DEFAULT_LEXICAL_WEIGHT, INDEX_KINDS, LIMITS, RETRIEVERS, IndexConfig,
                     RetrievalConfig)
from .corpus import KnowledgeBase, Passage, load_kb, make_kb, part_of_article
from .encoders import Encoder
from ..options import check_index
from ..errors import IndexTooLargeError, InputError, KnowledgeBaseError
from .flat import inner_products
from .index import SearchIndex, cached_index, index_cache_paths, measure, prebuilt_kind, recall_at_k
from .lexical import QUESTION_TERMS, LexicalIndex, best_rows, length_share, terms
from ..marginalize import doc_logprobs
from ..progress import Progress, counted
from ..text import looks_like_path
from ..results import IndexReport, RetrievedPassage, Retrieval, RetrieverComparison, RetrieverRanking
from .store import gather_rows

log = logging.getLogger(__name__)

# An approximate index over more rows than this is not built inside an ask or a page event: at 1M
# rows HNSW took 4 minutes and 2.2 GB on 2 cores (docs/scale.md); `build-index` builds it once.
BUILD_WHILE_SERVING_MAX_ROWS = 1_000_000
PRIVATE_INDEX_SLOTS = 16  # indexes of visitors' own KBs kept in memory, least recently used dropped
# A result's `question_encoder` when the call gave its own question side; the caller, who knows what it is, names it
GIVEN_QUESTION_MODEL = "a question side given for this call"


class Retriever:
    """Knowledge bases, their indexes, and p(z|x) over their passages; see `retrieve`.

    Indexes are built or loaded on first use and kept: for good for a registered KB (one of `kbs`),
    in `private_slots` least-recently-used slots for a KB passed as an object (a visitor's own).
    """

    def __init__(
        self,
        *,
        encoder: Encoder,
        kbs: dict[str, KnowledgeBase],
        config: RetrievalConfig = RetrievalConfig(),
        index_config: IndexConfig = IndexConfig(),
        index_cache: Path | None = None,
        question_for_generator: Callable[[str], str] | None = None,
        private_slots: int = PRIVATE_INDEX_SLOTS,
    ):
        if not kbs:
            raise KnowledgeBaseError("the engine needs at least one knowledge base")
        for kb in kbs.values():
            check_kb_matches_encoder(kb, encoder)
        self.encoder = encoder
        self.kbs = dict(kbs)
        self.config = config
        self.index_config = index_config
        self.index_cache = index_cache
        self.private_slots = private_slots
        # transformers' RagRetriever hands the generator the question as its own tokenizer decodes it
        self._question_for_generator = question_for_generator or (lambda q: q)
        self._indexes: dict[tuple[str, str], object] = {}
        self._private: OrderedDict[tuple[str, str], object] = OrderedDict()
        self._reports: dict[tuple[str, str], IndexReport] = {}
        self._lock = threading.RLock()
        weight = config.lexical_weight
        if weight is None:
            weight = DEFAULT_LEXICAL_WEIGHT if encoder.name == DEFAULT_ENCODER else 0.0
        if not weight >= 0:
            raise InputError(f"the lexical weight must be 0 or more, not {weight}")
        self.lexical_weight = float(weight)

    # -- knowledge bases --------------------------------------------------------------------------
    @property
    def kb_names(self) -> tuple[str, ...]:
        return tuple(self.kbs)

    @property
    def default_kb(self) -> str:
        return next(iter(self.kbs))

    def resolve_kb(self, kb: str | KnowledgeBase | None) -> KnowledgeBase:
        """A KB object as given (checked against the encoder), a registered KB by name, or a KB folder (then registered)."""
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
        if looks_like_path(str(name)):
            raise InputError(f"no knowledge base folder at {name!r}: the path does not exist or is not a folder "
                             "(`python -m rag_demo build-kb` writes one)")
        raise InputError(f"unknown knowledge base {name!r}; choose one of {', '.join(self.kbs)} or give a KB folder")

    def add_kb(self, name: str, kb: KnowledgeBase) -> None:
        """Register a loaded KB under `name`, after those already here; its vectors must fit the encoder."""
        check_kb_matches_encoder(kb, self.encoder)
        with self._lock:
            if name in self.kbs:
                raise InputError(f"a knowledge base named {name!r} is already loaded; give this one another name")
            self.kbs[name] = kb

    def build_kb(self, name: str, passages: list[Passage], *, progress: Progress | None = None) -> KnowledgeBase:
        """Embed `passages` into an in-memory KB (e.g. a visitor's own text); nothing is written.

        Out of GPU memory, the batch is halved down to one passage; past that the error is raised,
        for the caller to move the models to the CPU.
        """
        if not passages:
            raise InputError("no passages to index; paste or upload some text")
        callback = None if progress is None else (lambda done, total: progress("embedding passages", done, total))
        batch_size = 32
        while True:
            try:
                vectors = self.encoder.encode_passages(passages, batch_size=batch_size, progress=callback)
                return make_kb(name, passages, vectors, encoder=self.encoder.name)
            except torch.cuda.OutOfMemoryError:
                if self.encoder.device.type == "cpu" or batch_size == 1:
                    raise
                batch_size //= 2
                log.warning("out of GPU memory while embedding; retrying with batches of %d passages", batch_size)

    def release_kb(self, kb: KnowledgeBase) -> None:
        """Forget the in-memory indexes and reports of a visitor's own KB (its session ended)."""
        if self._registered(kb):
            return
        with self._lock:
            for store in (self._private, self._reports):
                for key in [key for key in store if key[0] == kb.fingerprint]:
                    del store[key]

    def gold_rows(self, question: str, kb: str | KnowledgeBase | None = None) -> tuple[int, ...]:
        """Rows of the question's gold passage when the KB is stored with its questions (the default KBs); else ()."""
        from ..questions import gold_rows_by_question, normalize_answer

        knowledge = self.resolve_kb(kb)
        table = self._kept(knowledge, "gold", lambda registered: gold_rows_by_question(knowledge.path))
        return table.get(normalize_answer(question), ())

    # -- indexes ----------------------------------------------------------------------------------
    def search_index(self, kb: str | KnowledgeBase | None = None, kind: str = "flat", *,
                     progress: Progress | None = None) -> SearchIndex:
        """The `kind` index of a knowledge base, built or loaded on first use; a build reports
        `progress(stage, done, total)` in rows added (an index already held or saved reports nothing)."""
        check_index(kind)
        knowledge = self.resolve_kb(kb)
        _require_vectors(knowledge, "dense search")

        def build(registered: bool) -> SearchIndex:
            if (kind != "flat" and len(knowledge) > BUILD_WHILE_SERVING_MAX_ROWS
                    and kind not in self.prebuilt_kinds(knowledge)):
                where = knowledge.path if knowledge.path is not None else "KB_FOLDER"
                raise InputError(f"the {kind} index of {knowledge.name} ({len(knowledge):,} passages) is not built yet, and "
                                 f"building it takes minutes and gigabytes; build it once with `python -m rag_demo "
                                 f"build-index {where} --kind {kind}`, then choose it again. Exact (flat) search works meanwhile.")
            cache_dir = (knowledge.path / "indexes") if (registered and knowledge.path is not None) else None
            if cache_dir is None and registered and self.index_cache is not None:
                cache_dir = self.index_cache / knowledge.fingerprint
            rows = None if progress is None else (
                lambda done, total: progress(f"building the {kind} index of {knowledge.name}", done, total))
            return cached_index(kind, knowledge.embeddings, knowledge.fingerprint, cache_dir, self.index_config,
                                device=self.encoder.device, prebuilt=knowledge.index_file, progress=rows)

        return self._kept(knowledge, kind, build)

    def lexical_index(self, kb: str | KnowledgeBase | None = None) -> LexicalIndex:
        """The KB's BM25 index, built on first use (about a second for the default KBs) and kept like its vector indexes.

        A registered KB folder keeps it in `bm25/` beside the passages. Raises `IndexTooLargeError`
        (its message names the command that prebuilds it) when a KB is too large to index while serving.
        """
        knowledge = self.resolve_kb(kb)

        def build(registered: bool) -> LexicalIndex:
            if registered and knowledge.path is not None:  # saved beside the passages: opened, not rebuilt, next start
                return LexicalIndex.for_kb_folder(knowledge.path, knowledge.titles, knowledge.texts,
                                                  fingerprint=knowledge.fingerprint)
            return LexicalIndex.for_passages(knowledge.titles, knowledge.texts)

        return self._kept(knowledge, "bm25", build)

    def index_reports(self, kb: str | KnowledgeBase | None = None, *, k: int = ASK.index_report_k) -> list[IndexReport]:
        """Build time, bytes, recall@k against flat and query latency of each index variant."""
        knowledge = self.resolve_kb(kb)
        _require_vectors(knowledge, "comparing the index variants")
        # every index first: one a large KB lacks is refused before minutes of measuring
        indexes = {kind: self.search_index(knowledge, kind) for kind in INDEX_KINDS}
        reports = []
        for kind, index in indexes.items():
            key = (knowledge.fingerprint, f"{kind}@{k}")
            with self._lock:
                if key not in self._reports:
                    self._reports[key] = measure(index, indexes["flat"], knowledge.embeddings, k=k)
                reports.append(self._reports[key])
        return reports

    def prebuilt_kinds(self, kb: KnowledgeBase) -> list[str]:
        """The approximate index kinds already saved beside a KB (`prepare` saves them for the default KBs)."""
        if kb.path is None:
            return []
        came_with = prebuilt_kind(kb.index_file) if kb.index_file is not None else None
        return [kind for kind in INDEX_KINDS if kind != "flat" and (kind == came_with or
                index_cache_paths(kind, kb.fingerprint, kb.path / "indexes", self.index_config)[0].is_file())]

    def warm_up(self) -> None:
        """Load each registered KB's exact index, the approximate ones already saved beside it, and its BM25 index."""
        for name, kb in self.kbs.items():
            try:
                self.lexical_index(name)  # every retriever offers bm25
            except IndexTooLargeError as err:  # asks that need BM25 say so; dense still serves
                log.warning("%s", err)
            if not kb.has_vectors:
                continue
            self.search_index(name, "flat")
            for kind in self.prebuilt_kinds(kb):
                self.search_index(name, kind)  # checking and reading the file: tens of ms at a first ask

    def held(self) -> set[tuple[str, str]]:
        """What is kept in memory, as (KB fingerprint, what): an index kind, "bm25", "gold" (the KB's
        questions' gold rows) or "<kind>@<k>" (an index report)."""
        with self._lock:
            return set(self._indexes) | set(self._private) | set(self._reports)

    def move_to_cpu(self) -> None:
        """Encode on the CPU from now on; indexes held on the GPU are dropped, to be rebuilt on the CPU when next needed."""
        cpu = torch.device("cpu")
        with self._lock:
            enc = self.encoder
            if enc.device.type == "cpu":
                return
            self.encoder = replace(
                enc, question_model=enc.question_model.to(cpu), device=cpu,
                passage_model=enc.passage_model.to(cpu) if enc.passage_model is not None else None,
            )
            self._indexes.clear()
            self._private.clear()

    def generator_question(self, question: str) -> str:
        """The question as the generator reads it: as given, or for a RAG checkpoint as its retriever decoded it."""
        return self._question_for_generator(question)

    def _registered(self, kb: KnowledgeBase) -> bool:
        return any(known is kb for known in self.kbs.values())

    def _kept(self, kb: KnowledgeBase, kind: str, build):
        """`build(registered)` once per KB and kind, then kept: for good when the KB is registered,
        in the `private_slots` least-recently-used slots when it is a visitor's own."""
        key = (kb.fingerprint, kind)
        registered = self._registered(kb)
        with self._lock:
            store = self._indexes if registered else self._private
            if key in store:
                if not registered:
                    store.move_to_end(key)
                return store[key]
            store[key] = built = build(registered)
            if not registered:
                while len(store) > self.private_slots:
                    store.popitem(last=False)
            return built

    # -- retrieval --------------------------------------------------------------------------------
    @property
    def retrievers(self) -> tuple[str, ...]:
        """The retrievers offered: dense and bm25 always, hybrid when there is a lexical weight."""
        return tuple(r for r in RETRIEVERS if r != "hybrid" or self.lexical_weight > 0)

    def resolve_retriever(self, retriever: str | None) -> str:
        """The retriever an ask uses: the one named, or hybrid when there is a lexical weight."""
        if retriever is None:
            return "hybrid" if self.lexical_weight > 0 else "dense"
        if retriever not in RETRIEVERS:
            raise InputError(f"unknown retriever {str(retriever)[:40]!r}; choose one of {', '.join(RETRIEVERS)}")
        if retriever == "hybrid" and self.lexical_weight == 0:
            raise InputError("hybrid retrieval needs a lexical weight above 0 for this encoder (--lexical-weight); "
                             "dense and bm25 need none")
        return retriever

    def retrieve(self, question: str, *, kb: str | KnowledgeBase | None = None, k: int = ASK.k, index: str = ASK.index,
                 retriever: str | None = None, rows: Sequence[int] | None = None,
                 question_model: torch.nn.Module | None = None) -> Retrieval:
        """The top k passages of a knowledge base for `question` and their p(z|x) under `retriever`.

        `rows` names the passages instead of searching for them (k = len(rows)): p(z|x) is then the
        same softmax over just those rows, e.g. 1 for a single gold passage (`eval --gold-passage`).
        `question_model` computes q(x) for this call in place of the encoder's question side (a copy trained
        end to end, in eval mode; `Encoder.encode_questions`); the passage vectors and indexes stay the KB's,
        so it serves every index variant. BM25 reads no vector and ignores it."""
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
            raise InputError(f"k={k} is larger than the knowledge base ({counted(len(knowledge), 'passage')}); "
                             f"choose k <= {len(knowledge)}")
        if rows is None and k > LIMITS.max_k:
            raise InputError(f"k must be between 1 and {LIMITS.max_k}")
        check_index(index)
        if retriever != "bm25" and not knowledge.has_vectors:  # a first start embeds while BM25 serves
            retrieval = self._retrieve_bm25(question, knowledge, k=k, index="flat", rows=rows)
            notice = (f"{knowledge.name}'s dense vectors are still being built, so BM25 retrieved these passages "
                      f"instead of {'Dense + BM25' if retriever == 'hybrid' else 'the dense retriever'}")
            return replace(retrieval, notices=(notice, *retrieval.notices))
        if retriever == "bm25":
            return self._retrieve_bm25(question, knowledge, k=k, index=index, rows=rows)
        return self._retrieve_dense(question, knowledge, k=k, index=index, hybrid=retriever == "hybrid", rows=rows,
                                    question_model=question_model)

    def _retrieve_dense(self, question: str, knowledge: KnowledgeBase, *, k: int, index: str, hybrid: bool,
                        rows: list[int] | None, question_model: torch.nn.Module | None) -> Retrieval:
        """Dense (the paper's) or hybrid: the index finds the candidates, exact inner products weigh them."""
        notices = []
        started = time.perf_counter()
        question_tokens = len(self.encoder.tokenizer(question)["input_ids"])
        if question_tokens > self.encoder.max_length:
            notices.append(f"the question is {question_tokens} tokens; the retriever read its last {self.encoder.max_length}")
        xq = self.encoder.encode_questions([question], question_model=question_model).float().cpu()  # (1, D)
        encode_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        query = xq.numpy()
        weight = self.lexical_weight if hybrid else 0.0
        lexical = self.lexical_index(knowledge).scores(question) if hybrid else None  # (N,)
        if hybrid:
            notices.extend(_long_question_notice(question))
        if lexical is not None and len(lexical) and not lexical.max() > 0:
            notices.append("no passage shares a word with the question: BM25 adds nothing, and the passages are the "
                           "dense retriever's nearest, however far")
        recall, recall_ms = None, 0.0
        if rows is None and hybrid and index == "flat":
            ids = np.arange(len(knowledge))  # exact search: every passage's dense + lexical logit
            scores = inner_products(query, knowledge.embeddings)[0]  # (N,), the rows read in chunks
        else:
            ids, recall, recall_ms = (rows, None, 0.0) if rows is not None else self._candidates(knowledge, query, k, index,
                                                                                                lexical)
            # Scores are exact inner products with the stored vectors, as transformers' RagModel does,
            # so an approximate index changes which passages come back, not how they are weighed.
            scores = (xq @ torch.from_numpy(gather_rows(knowledge.embeddings, ids)).T)[0]  # (C,)
        lexical_scores = torch.from_numpy(lexical[ids]) if lexical is not None else torch.zeros(len(ids))  # (C,)
        logits = scores * self.encoder.scale + weight * lexical_scores  # (C,)
        passages, doc_lp = top_k(knowledge, ids, scores, lexical_scores, logits, k)
        if lexical is not None and rows is None and index != "flat":
            checked = time.perf_counter()
            recall = self._hybrid_recall(knowledge, query, lexical, weight, passages, k)
            recall_ms = (time.perf_counter() - checked) * 1000
        if len(passages) < k:
            notices.append(f"the {index} index returned {len(passages)} of {k} passages")
        return Retrieval(
            kb=knowledge.name, passages=passages, doc_lp=doc_lp, generator_question=self.generator_question(question),
            retriever="hybrid" if hybrid else "dense", scale=self.encoder.scale, lexical_weight=weight,
            index_recall=recall, notices=tuple(notices), encode_ms=encode_ms, recall_ms=recall_ms,
            search_ms=(time.perf_counter() - started) * 1000 - recall_ms,
            question_encoder=self.encoder.description if question_model is None else GIVEN_QUESTION_MODEL,
        )

    def _candidates(self, knowledge: KnowledgeBase, query, k: int, index: str,
                    lexical) -> tuple[list[int], float | None, float]:
        """Rows the `index` finds for query (1, D), and BM25's best too when `lexical` (N,) scores are given
        (hybrid): the candidate rows, for an approximate index its recall@k against exact search (else None), and
        the milliseconds that exact search took."""
        depth = k if lexical is None else min(max(k, self.config.candidates), len(knowledge))
        _, found = self.search_index(knowledge, index).search(query, depth)
        ids = [int(i) for i in found[0] if i >= 0]
        if lexical is not None:  # the index's dense rows and BM25's best, rescored together (recall: `_hybrid_recall`)
            seen = set(ids)
            return ids + [int(i) for i in best_rows(lexical, depth) if int(i) not in seen], None, 0.0
        if index == "flat":
            return ids, None, 0.0
        checked = time.perf_counter()
        _, exact = self.search_index(knowledge, "flat").search(query, k)
        return ids, recall_at_k(found[:, :k], exact), (time.perf_counter() - checked) * 1000

    def _hybrid_recall(self, knowledge: KnowledgeBase, query, lexical, weight: float,
                       passages: Sequence[RetrievedPassage], k: int) -> float:
        """Of the exact Dense + BM25 top k (every passage scored, as with the flat index), the share among the
        `passages` an approximate index's candidates gave: what the index cost the passages shown, not the dense
        search alone (the hybrid logit can rank a passage the dense search missed). query (1, D), lexical (N,)."""
        logits = inner_products(query, knowledge.embeddings)[0] * self.encoder.scale + weight * torch.from_numpy(lexical)
        exact = torch.topk(logits, min(k, len(logits))).indices.numpy()[None]  # (1, k)
        return recall_at_k(np.array([[p.id for p in passages]]), exact)

    def _retrieve_bm25(self, question: str, knowledge: KnowledgeBase, *, k: int, index: str,
                       rows: list[int] | None) -> Retrieval:
        """BM25 alone: every passage scored (exact, whatever the index), p(z|x) = softmax(BM25_SCALE * BM25) over the top k."""
        notices = []
        if index != "flat":  # said, not silently ignored: the visitor chose an index and should know it did nothing
            notices.append(f"BM25 scores every passage exactly; the {index} index holds dense vectors, so it was not used")
        started = time.perf_counter()
        ids = list(range(len(knowledge))) if rows is None else rows
        lexical = torch.from_numpy(self.lexical_index(knowledge).scores(question))[ids]  # (C,)
        notices.extend(_long_question_notice(question))
        passages, doc_lp = top_k(knowledge, ids, lexical, lexical, BM25_SCALE * lexical, k)
        matching = int((lexical > 0).sum())
        if matching < k:  # BM25 knows nothing about the others: they tie at 0, so say where their order comes from
            notices.append(_bm25_shortfall(matching, k))
        return Retrieval(
            kb=knowledge.name, passages=passages, doc_lp=doc_lp, generator_question=self.generator_question(question),
            retriever="bm25", scale=BM25_SCALE, notices=tuple(notices), search_ms=(time.perf_counter() - started) * 1000,
        )

    def compare(self, question: str, *, kb: str | KnowledgeBase | None = None, k: int = ASK.k) -> RetrieverComparison:
        """The top k of each retriever offered for one question, with the gold passage's rank when known.

        Every retriever searches exactly (the flat index), so the columns differ only in how passages are scored."""
        knowledge = self.resolve_kb(kb)
        gold = self.gold_rows(question, knowledge)
        started = time.perf_counter()
        rankings, timings = [], {}
        for retriever in self.retrievers if knowledge.has_vectors else ("bm25",):
            began = time.perf_counter()
            retrieval = self.retrieve(question, kb=knowledge, k=k, retriever=retriever)
            timings[retriever] = (time.perf_counter() - began) * 1000
            ranks = [p.rank for p in retrieval.passages if p.id in gold]
            rankings.append(RetrieverRanking(retriever, retrieval.passages, retrieval.scale, retrieval.lexical_weight,
                                             gold_rank=min(ranks) if ranks else None, notices=retrieval.notices))
        timings["total"] = (time.perf_counter() - started) * 1000
        return RetrieverComparison(question=question, kb=knowledge.name, k=k, rankings=tuple(rankings), gold_ids=gold,
                                   timings_ms=timings)


def top_k(knowledge: KnowledgeBase, ids: Sequence[int], scores: torch.Tensor, lexical: torch.Tensor, logits: torch.Tensor,
          k: int) -> tuple[tuple[RetrievedPassage, ...], torch.Tensor]:
    """The k candidates with the highest logits, best first (ties keep candidate order), and log p(z|x) over them.

    `ids` are C KB rows; `scores`, `lexical`, `logits` are (C,) in the same order. Returns K = min(k, C)
    passages and (K,) log p(z|x).
    """
    if len(logits) > 4 * k:  # millions of candidates (hybrid over a large KB): sort only those that can make the top k
        contenders = torch.nonzero(logits >= torch.topk(logits, k).values[-1]).flatten()  # ascending, so ties keep order
        order = contenders[torch.argsort(logits[contenders], descending=True, stable=True)[:k]]
    else:
        order = torch.argsort(logits, descending=True, stable=True)[:k]
    scores, lexical, logits = scores[order], lexical[order], logits[order]
    doc_lp = doc_logprobs(logits[None])[0]  # (K,)
    passages = []
    for rank, row in enumerate(int(ids[i]) for i in order.tolist()):
        part, parts = part_of_article(knowledge.titles, row)
        passages.append(RetrievedPassage(
            rank=rank + 1, id=row, title=knowledge.titles[row], text=knowledge.texts[row],
            score=float(scores[rank]), prob=float(doc_lp[rank].exp()), logit=float(logits[rank]), lexical=float(lexical[rank]),
            part=part, parts=parts,
        ))
    return tuple(passages), doc_lp


def _long_question_notice(question: str) -> list[str]:
    """What BM25 did with a question past `lexical.QUESTION_TERMS` terms (a text pasted before it), if it is one."""
    if length_share(question) >= 1:
        return []
    return [f"the question has {len(terms(question))} words that BM25 matches; it scored it as a question of "
            f"{QUESTION_TERMS}, so that the length of a pasted text does not outweigh what the words mean"]


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


def _is_folder(name: object) -> bool:
    """Whether `name` names an existing folder; odd names (a NUL byte, a number) simply do not."""
    try:
        return Path(str(name)).expanduser().is_dir()
    except (OSError, ValueError):
        return False


def _require_vectors(kb: KnowledgeBase, what: str) -> None:
    if not kb.has_vectors:
        raise InputError(f"{kb.name}'s dense vectors are still being built, so {what} is not available yet; BM25 "
                         "answers meanwhile. Try again when the banner says they are ready.")


def check_kb_matches_encoder(kb: KnowledgeBase, encoder: Encoder) -> None:
    if kb.has_vectors and kb.dim != encoder.dim:
        raise KnowledgeBaseError(
            f"knowledge base {kb.name!r} has {kb.dim}-dim embeddings but the encoder {encoder.name!r} makes "
            f"{encoder.dim}-dim vectors; rebuild the KB with this encoder (`python -m rag_demo build-kb ... --encoder {encoder.name}`)"
        )

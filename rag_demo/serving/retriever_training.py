"""Training the question encoder end to end on an engine's knowledge base (`training.end_to_end`), and named
question encoders that `ask`, `eval` and the page load (`--question-encoder NAME`).

The engine supplies what the training loop takes as plain callables: each question's candidate passages
(its top C under the engine's retriever, Dense + BM25 by default), the frozen reader's log-likelihood
of the answer under each (`RagEngine.score` over those rows, the generator's memory off: the paper's
formulas), and BM25 scores. Reads are cached on disk per knowledge base and reader, one entry per question,
answer and passage, so a second run on the same questions starts at once, and widening the candidates
reads only passages never read before.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..config import ASK, GENERAL_KB, VARIANTS, EndToEndConfig, cache_root
from ..errors import InputError, RunStopped
from ..progress import counted
from ..training.pairs import QAPair, load_pairs
from .interface import NoTrainedEncoder

if TYPE_CHECKING:  # the page's process unpickles this module's views without loading torch
    from ..progress import Progress
    from ..results import AskResult
    from ..retrieval.corpus import KnowledgeBase
    from ..training.end_to_end import CandidateReading, HeldOutCheck, ReadQuestion

log = logging.getLogger(__name__)

# The question sets a default knowledge base trains on and is measured on: training questions and held-out
# ones never overlap (`rag_demo/data`).
QUESTION_SETS_FOR_KB = {GENERAL_KB: ("everyday-train", "everyday")}
HELD_OUT_SHARE = 0.2  # of a file's pairs, held out to measure on when no held-out file is given
ENCODERS_FOLDER = "question-encoders"
TRAINING_RECORD = "training.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def reading_cache_path(engine, kb) -> Path:
    """Where the reads of this knowledge base by this engine's reader are kept (their key names both)."""
    gen = engine.generator
    reader = f"{gen.name}:{gen.weights}:{gen.config}"
    digest = hashlib.sha256(f"{kb.fingerprint}:{reader}".encode()).hexdigest()[:16]
    return cache_root() / "training" / f"reads-{kb.name}-{digest}.pt"


def engine_reader(engine, kb) -> Callable[[str, str, Sequence[int]], "object"]:
    """read(question, answer, rows) -> (C, T) log p(y_t|x,z,y<t) of the answer under each row, memory off."""
    import torch

    def read(question: str, answer: str, rows: Sequence[int]):
        result = engine.score(question, answer, kb=kb, rows=list(rows), memory=False, variants=("token",))
        return torch.tensor(result.variants["token"].doc_token_logprobs, dtype=torch.float32).T  # (T, C) -> (C, T)

    return read


def training_pairs(kb_name: str, questions: str | Path | None, held_out: str | Path | None) -> tuple[list[QAPair], list[QAPair]]:
    """(training pairs in a seeded random order, held-out pairs): the files given, or the knowledge base's own
    question sets. A file given without a held-out one is split, a seeded HELD_OUT_SHARE held out (question text
    never on both sides)."""
    own = QUESTION_SETS_FOR_KB.get(kb_name)
    if questions is None and own is None:
        raise InputError(f"{kb_name} has no training questions of its own; give a file of question-answer pairs "
                         "(--questions FILE, .jsonl or .csv)")
    train = load_pairs(questions if questions is not None else own[0])
    if held_out is not None:
        held = load_pairs(held_out)
    elif questions is None:
        held = load_pairs(own[1])
    else:
        texts = sorted({q.lower() for q, _ in train})
        random.Random(0).shuffle(texts)
        kept_out = set(texts[: max(1, round(HELD_OUT_SHARE * len(texts)))]) if len(texts) > 1 else set()
        held = [p for p in train if p[0].lower() in kept_out]
        train = [p for p in train if p[0].lower() not in kept_out]
    seen = {q.lower() for q, _ in held}
    train = [p for p in train if p[0].lower() not in seen]  # a held-out question is never trained on
    random.Random(0).shuffle(train)  # question sets are grouped by topic: the first n are then a fair draw
    if not train:
        raise InputError("no training questions are left once the held-out ones are set aside; give more pairs")
    return train, held


@dataclass
class TrainingData:
    """Everything a run needs, read from the engine once."""

    kb: object  # the KnowledgeBase
    examples: list[ReadQuestion]
    check: HeldOutCheck
    lexical_weight: float
    kb_lexical: Callable[[str], np.ndarray]
    read_seconds: float
    fresh_reads: int  # passages the reader read (the rest came from the cache)
    reading: CandidateReading  # how new candidates are read, for widening them as the encoder learns


def prepare_training(engine, *, kb: str | None, pairs: Sequence[QAPair], held_out: Sequence[QAPair],
                     candidates: int = EndToEndConfig().candidates, progress=None, should_stop: Callable[[], bool] = lambda: False,
                     ) -> TrainingData:
    """Read each training pair's candidates (cached) and set up the held-out check, on `kb`'s passages.

    `progress(stage, done, total)` hears of the reading. The retriever is the engine's default one.
    """
    import time

    from ..training.end_to_end import CandidateReading, HeldOutCheck, ReadingCache, read_candidates

    knowledge = engine.resolve_kb(kb)
    if not knowledge.has_vectors:
        raise InputError(f"{knowledge.name}'s dense vectors are not built yet; train once they are")
    candidates = min(candidates, len(knowledge))  # a small base of one's own: every passage is a candidate
    retriever = engine.resolve_retriever(None)
    lexical_weight = engine.lexical_weight if retriever == "hybrid" else 0.0
    bm25 = engine.retriever.lexical_index(knowledge)
    reading = CandidateReading(engine_reader(engine, knowledge), bm25.scores, lambda row: knowledge.texts[row],
                               ReadingCache.open(reading_cache_path(engine, knowledge)))
    started = time.perf_counter()
    # each question's top passages are found every run; only those no run has read are read (a cached run takes
    # seconds, and the status must not say it reads them all again)
    stage = f"finding {len(pairs)} questions' top {candidates} passages and reading any not read before"
    examples = read_candidates(
        pairs, candidates=lambda q: [p.id for p in engine.retrieve(q, kb=knowledge, k=candidates, retriever=retriever).passages],
        reading=reading, progress=None if progress is None else (lambda done, total: progress(stage, done, total)),
        should_stop=should_stop)
    read_seconds = time.perf_counter() - started
    lexical_scores = np.stack([bm25.scores(q) for q, _ in held_out]) if held_out else np.zeros((0, len(knowledge)))
    check = HeldOutCheck(engine.encoder, knowledge.embeddings, held_out, lexical_scores, lambda row: knowledge.texts[row],
                         lexical_weight=lexical_weight)
    return TrainingData(knowledge, examples, check, lexical_weight, bm25.scores, read_seconds, reading.cache.fresh, reading)


# ---- named question encoders --------------------------------------------------------------------------------


def encoders_folder() -> Path:
    return cache_root() / ENCODERS_FOLDER


def check_encoder_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise InputError(f"{name!r} cannot name a question encoder: use letters, digits, '.', '_' or '-' "
                         "(at most 64, starting with a letter or digit)")
    return name


def trained_encoder_path(name: str) -> Path | None:
    """The folder of the question encoder trained under `name`, when there is a complete one; else None."""
    from ..offline.cache import MARKER

    if not _NAME.match(name or ""):
        return None
    folder = encoders_folder() / name
    return folder if (folder / MARKER).is_file() else None


def trained_encoder_names() -> list[str]:
    """The names of the complete question encoders `train --save` has saved, sorted."""
    from ..offline.cache import MARKER

    folder = encoders_folder()
    return sorted(path.name for path in folder.iterdir() if (path / MARKER).is_file()) if folder.is_dir() else []


def save_question_encoder(model, name: str, record: dict) -> Path:
    """Save a trained question side under `name` (replacing one of that name), with its training record."""
    from ..offline.cache import publish, staged, writing

    folder = encoders_folder() / check_encoder_name(name)
    with staged(folder) as staging, writing(staging):
        model.save_pretrained(staging)
        (staging / TRAINING_RECORD).write_text(json.dumps(record, indent=1), encoding="utf-8")
        publish(staging, folder, f"trained-question-encoder:{name}:{uuid.uuid4().hex}", {"objective": record.get("objective")})
    return folder


# ---- the page's runs: one per visitor, stepped a few steps per call, as plain data ---------------------------

OBJECTIVE_NAMES = {"rag-token": "RAG-Token", "rag-sequence": "RAG-Sequence", "gold-passage": "gold passage"}


def trained_encoder_name(objective: str, steps: int) -> str:
    """How results and the page name the question encoder a visitor's run trained.

    >>> trained_encoder_name("rag-token", 60), trained_encoder_name("gold-passage", 1)
    ('trained on this page (RAG-Token, 60 steps)', 'trained on this page (gold passage, 1 step)')
    """
    return f"trained on this page ({OBJECTIVE_NAMES.get(objective, objective)}, {counted(steps, 'step')})"


def passes_over(steps: int, batch_size: int, questions: int) -> float:
    """How many times `steps` steps go over `questions` training questions, a step taking a batch of `batch_size`
    of them (all, when fewer; `EndToEndTrainer`'s batches).

    >>> passes_over(60, 16, 100), passes_over(60, 16, 8)
    (9.6, 60.0)
    """
    return steps * min(batch_size, questions) / questions


@dataclass(frozen=True)
class RankedPassages:
    """A question's top k under an encoder, as the page shows them."""

    titles: tuple[str, ...]
    rows: tuple[int, ...]
    probs: tuple[float, ...]  # p(z|x) over these k
    answer_bearing: tuple[bool, ...]


@dataclass(frozen=True)
class GradientExample:
    """One training question's passage that the loss pulls up hardest now: its p(z|x) and ∂loss/∂logit (< 0: raised)."""

    question: str
    answer: str
    title: str
    prior: float
    gradient: float


@dataclass(frozen=True)
class TrainingView:
    """Where a visitor's run stands: everything the Train tab draws, plain data (it crosses to the page's process)."""

    objective: str
    step: int
    steps: int
    losses: tuple[float, ...]  # one per step taken
    checks: tuple[tuple[int, float, float], ...]  # (step, held-out recall@5, mean p(z|x) on answer-bearing passages)
    held_out: int  # questions in the held-out sample
    questions_asked: int  # training questions the visitor chose
    questions_read: int  # of those, the ones the knowledge base's training set holds (it may hold fewer)
    training_questions: int  # of those read, the ones the loss trains on (`left_out`)
    batch_size: int  # training questions a step trains on, drawn in a shuffled order (all of them, when fewer)
    candidates: int  # passages read per training question (the top C under the engine's retriever)
    question: str  # the question whose p(z|x) the tab follows, one of the held-out sample
    answers: tuple[str, ...]
    before: RankedPassages
    now: RankedPassages
    read_seconds: float  # reading passages with the reader: before the first step, and each widening since
    step_seconds: float  # mean time of a step so far, its widening's reading included
    gradient: GradientExample | None = None  # None for the gold-passage loss
    passages_read: int = 0  # passages the reader read in `read_seconds`; the others came from the cache of earlier runs

    @property
    def finished(self) -> bool:
        return self.step >= self.steps

    @property
    def left_out(self) -> int:
        """Questions read but not trained on: the gold-passage loss needs a candidate that holds the answer
        (`EndToEndTrainer`); the marginal losses train on every question read."""
        return self.questions_read - self.training_questions

    @property
    def passes(self) -> float:
        """How many times the steps taken so far went over the training questions (epochs)."""
        return passes_over(self.step, self.batch_size, self.training_questions)

    @property
    def question_encoder(self) -> str:
        """The trained encoder's name, as an ask with it (`TrainingRuns.train_ask`) says it now."""
        return trained_encoder_name(self.objective, self.step)


@dataclass(frozen=True)
class PageRunConfig:
    """The page's runs: 60 steps of 16 questions (0.2 s each on 2 CPU cores once read), measured on a fixed
    held-out sample. The steps do not grow with the questions chosen: more questions, fewer passes over each."""

    steps: int = 60
    check_every: int = 5
    held_out_sample: int = 60
    top_k: int = 5  # the followed question's passages shown, and recall@k's k
    batch_size: int = EndToEndConfig().batch_size  # questions per step, whatever the number chosen
    max_questions: int = 200
    default_questions: int = 100  # the page's first choice, whose reads a first start does ahead (`read_ahead`)
    candidates: int = EndToEndConfig().candidates  # passages read per training question, the first time
    widen_every: int = 20  # steps between widenings of the candidates (`EndToEndConfig.widen_every`; 0: never)
    widen_max_reads: int = 20  # passages read at most per widening: about 4 s on 2 CPU cores, the first time only


class _Run:
    def __init__(self, data: TrainingData, trainer, *, followed: int, before: RankedPassages, config: PageRunConfig,
                 questions_asked: int):
        import threading

        self.data, self.trainer, self.followed, self.before, self.config = data, trainer, followed, before, config
        self.questions_asked = questions_asked
        self.losses: list[float] = []
        self.checks: list[tuple[int, float, float]] = []
        self.step_seconds = 0.0
        # the encoder is stepped and asked with from different calls (the Train and Ask tabs run side by side):
        # an ask never sees a step half taken, nor dropout on (a step sets train mode)
        self.model_lock = threading.Lock()


class TrainingRuns:
    """Each visitor's run on the page (by session id): `train_begin`, then `train_advance` until finished or
    stopped, and `train_end` when the visitor leaves. The trained encoder lives here only, for that visitor:
    `train_ask` and `train_score` hand it to the engine for one call, and the engine's own encoder is never
    changed. `engine()` gives the engine serving now."""

    def __init__(self, engine: Callable[[], object], *, config: PageRunConfig = PageRunConfig(),
                 question_sets: dict[str, tuple[str | Path | Sequence[QAPair], str | Path | Sequence[QAPair]]] | None = None):
        import threading

        self._engine, self.config = engine, config
        self.question_sets = dict(QUESTION_SETS_FOR_KB if question_sets is None else question_sets)
        self._runs: dict[str, _Run] = {}
        self._stopping: set[str] = set()  # sessions whose visitor pressed Stop since their last train_begin
        self._lock = threading.Lock()

    def train_kbs(self) -> tuple[str, ...]:
        """The knowledge bases a visitor can train on: those with a training and a held-out set."""
        engine = self._engine()
        return tuple(name for name in engine.kb_names if name in self.question_sets)

    def _pairs(self, kb: str) -> tuple[list[QAPair], list[QAPair]]:
        if kb not in self.question_sets:
            raise InputError(f"{kb} has no training questions for the page; choose one of {', '.join(self.question_sets)} "
                             "or train with `python -m rag_demo train --questions FILE`")
        train, held = (load_pairs(part) if isinstance(part, (str, Path)) else list(part) for part in self.question_sets[kb])
        seen = {q.lower() for q, _ in held}
        train = [p for p in train if p[0].lower() not in seen]
        random.Random(0).shuffle(train)  # the same draw as `train`: the page's reads are the command's
        return train, held[: self.config.held_out_sample]

    def read_ahead(self, *, questions: int | None = None, progress=None) -> int:
        """Read the candidates of the page's first `questions` training questions (the default choice) on every
        knowledge base the page trains on, so that a visitor's run of that size starts training at once; the
        passages read (0 once cached). A first start does this after full quality (`background.default_engines`)."""
        engine, read = self._engine(), 0
        for kb in self.train_kbs():
            if not engine.resolve_kb(kb).has_vectors:
                continue
            train, _ = self._pairs(kb)
            data = prepare_training(engine, kb=kb, pairs=train[: questions or self.config.default_questions],
                                    held_out=[], candidates=self.config.candidates, progress=progress)
            read += data.fresh_reads
        return read

    def _ranked(self, run_data: TrainingData, model, question: int) -> RankedPassages:
        top = run_data.check.top(model, question, min(self.config.top_k, len(run_data.kb)))
        return RankedPassages(tuple(run_data.kb.titles[r] for r in top.rows), top.rows, top.probs, top.answer_bearing)

    def train_begin(self, session: str, *, objective: str, questions: int, kb: str | None = None,
                    progress=None) -> TrainingView:
        """Read the candidates of `questions` training questions (cached after a first time), measure the
        packaged encoder, and hold a fresh run for `session` (replacing its last one)."""
        from ..config import END_TO_END_OBJECTIVES, EndToEndConfig
        from ..training.end_to_end import EndToEndTrainer

        if objective not in END_TO_END_OBJECTIVES:
            raise InputError(f"unknown objective {objective!r}; choose one of {', '.join(END_TO_END_OBJECTIVES)}")
        if not isinstance(questions, int) or not 1 <= questions <= self.config.max_questions:
            raise InputError(f"train on 1 to {self.config.max_questions} questions")
        self.train_end(session)
        engine = self._engine()
        kb = kb or next(iter(self.train_kbs()), engine.default_kb)
        train, held = self._pairs(kb)
        data = prepare_training(engine, kb=kb, pairs=train[:questions], held_out=held, candidates=self.config.candidates,
                                progress=progress, should_stop=lambda: self._stopped(session))
        if self._stopped(session):  # what was read stays cached for the next run
            raise RunStopped(f"stopped while reading the training questions' passages ({len(data.examples)} of "
                             f"{questions} read, and kept for the next run); no step was taken")
        config = EndToEndConfig(objective=objective, steps=self.config.steps, batch_size=self.config.batch_size,
                                seed=0, candidates=self.config.candidates,
                                widen_every=self.config.widen_every, widen_max_reads=self.config.widen_max_reads)
        try:
            trainer = EndToEndTrainer(engine.encoder, data.kb.embeddings, data.examples, lexical_weight=data.lexical_weight,
                                      config=config, kb_lexical=data.kb_lexical, reading=data.reading)
        except ValueError as err:
            raise InputError(f"{err}; train on more questions") from None
        followed = self._followed(data, trainer.model)
        run = _Run(data, trainer, followed=followed, before=self._ranked(data, trainer.model, followed),
                   config=self.config, questions_asked=questions)
        figures = data.check.measure(trainer.model)
        run.checks.append((0, figures.recall[5], figures.answer_mass))
        with self._lock:
            self._runs[session] = run
        return self._view(run)

    def _followed(self, data: TrainingData, model) -> int:
        """The held-out question to follow: of those with a passage holding the answer in the top k, the one
        whose such passages get the least p(z|x) (where training has the most to show); else the first."""
        best, least = 0, None
        for i in range(len(data.check.questions)):
            top = data.check.top(model, i, min(self.config.top_k, len(data.kb)))
            mass = sum(p for p, bearing in zip(top.probs, top.answer_bearing) if bearing)
            if any(top.answer_bearing) and (least is None or mass < least):
                best, least = i, mass
        return best

    def train_advance(self, session: str, *, steps: int, progress: Progress | None = None) -> TrainingView:
        """Take up to `steps` more steps of the session's run; the held-out sample is measured every `check_every`.
        `progress(stage, done, total)` hears of the reading when the candidates are widened (not timed as a step)."""
        import time

        with self._lock:
            run = self._runs.get(session)
        if run is None:
            raise InputError("no training run for this page; press Train to start one")
        stopped = functools.partial(self._stopped, session)
        for _ in range(max(0, min(steps, self.config.steps - run.trainer.steps_taken))):
            if stopped():
                break
            with run.model_lock:
                if run.trainer.widening_due:
                    run.trainer.widen(progress=progress, should_stop=stopped)
                    if stopped():
                        break
                started = time.perf_counter()
                run.losses.append(run.trainer.step())
                taken = run.trainer.steps_taken
                run.step_seconds += (time.perf_counter() - started - run.step_seconds) / taken  # running mean
                if taken % self.config.check_every == 0 or taken == self.config.steps:
                    figures = run.data.check.measure(run.trainer.model)
                    run.checks.append((taken, figures.recall[5], figures.answer_mass))
                if taken == self.config.steps:  # kept only to be shown now: AdamW's moments are twice the encoder
                    run.trainer.optimizer.state.clear()
        with run.model_lock:
            return self._view(run)

    def _trained(self, session: str) -> _Run:
        with self._lock:
            run = self._runs.get(session)
        if run is None:
            raise NoTrainedEncoder("this page holds no trained question encoder (none was trained, or its run ended); "
                                   "train one on the Train tab, or ask with the packaged encoder")
        return run

    def train_ask(self, session: str, question: str, *, kb: str | KnowledgeBase | None = None, k: int = ASK.k,
                  index: str = ASK.index, variants: str | Sequence[str] = VARIANTS, num_beams: int | None = None,
                  sequence_decoding: str | None = None, max_new_tokens: int | None = None, closed_book: bool = True,
                  retriever: str | None = None, extractive: bool | None = None, memory: bool | None = None,
                  progress: Progress | None = None) -> AskResult:
        """The engine's `ask` with the question encoder the session's run trained (as it stands now), for this ask
        alone; its result names the encoder. Raises `NoTrainedEncoder` when the session has no run."""
        run = self._trained(session)
        with run.model_lock:  # held for the whole ask: a step waits for it (an ask takes about as long as a few steps)
            model = run.trainer.model.eval()
            result = self._engine().ask(
                question, kb=kb, k=k, index=index, variants=variants, num_beams=num_beams,
                sequence_decoding=sequence_decoding, max_new_tokens=max_new_tokens, closed_book=closed_book,
                retriever=retriever, extractive=extractive, memory=memory, progress=progress, question_model=model)
            return self._named(result, run)

    def train_score(self, session: str, question: str, answer: str, *, kb: str | KnowledgeBase | None = None,
                    k: int = ASK.k, index: str = ASK.index, variants: str | Sequence[str] = VARIANTS,
                    retriever: str | None = None, memory: bool | None = None,
                    progress: Progress | None = None) -> AskResult:
        """The engine's `score` with the session's trained question encoder, as `train_ask` asks with it."""
        run = self._trained(session)
        with run.model_lock:
            model = run.trainer.model.eval()
            result = self._engine().score(question, answer, kb=kb, k=k, index=index, variants=variants,
                                          retriever=retriever, memory=memory, progress=progress, question_model=model)
            return self._named(result, run)

    @staticmethod
    def _named(result: AskResult, run: _Run) -> AskResult:
        """The result, its `question_encoder` naming the run's encoder where one computed q(x) (not for BM25)."""
        if not result.question_encoder:
            return result
        return replace(result, question_encoder=trained_encoder_name(run.trainer.config.objective, run.trainer.steps_taken))

    def train_end(self, session: str) -> None:
        """Forget the session's run and its trained encoder."""
        with self._lock:
            self._runs.pop(session, None)
            self._stopping.discard(session)

    def train_stop(self, session: str) -> None:
        """The session's reading and steps end at the next question read or step; its run stays, to be asked with."""
        with self._lock:
            self._stopping.add(session)

    def _stopped(self, session: str) -> bool:
        with self._lock:
            return session in self._stopping

    def sessions(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._runs)

    @staticmethod
    def _gradient(run: _Run) -> GradientExample | None:
        """The first training question with an answer-bearing candidate, and its passage the loss raises most."""
        from ..config import END_TO_END_OBJECTIVES

        if run.trainer.config.objective not in END_TO_END_OBJECTIVES[:2]:
            return None
        example = next((e for e in run.trainer.examples if any(e.answer_bearing)), None)
        if example is None:
            return None
        prior, gradient = run.trainer.logit_gradient(example)
        pulled = int(gradient.argmin())
        return GradientExample(example.question, example.answer, run.data.kb.titles[example.rows[pulled]],
                               float(prior[pulled]), float(gradient[pulled]))

    def _view(self, run: _Run) -> TrainingView:
        question, answers = run.data.check.questions[run.followed]
        return TrainingView(
            objective=run.trainer.config.objective, step=run.trainer.steps_taken, steps=self.config.steps,
            losses=tuple(run.losses), checks=tuple(run.checks), held_out=len(run.data.check.questions),
            questions_asked=run.questions_asked, questions_read=len(run.data.examples),
            training_questions=len(run.trainer.examples), batch_size=run.trainer.config.batch_size,
            candidates=run.trainer.config.candidates, question=question, answers=tuple(answers), before=run.before,
            now=self._ranked(run.data, run.trainer.model, run.followed),
            read_seconds=run.data.read_seconds + sum(widening.seconds for widening in run.trainer.widenings),
            step_seconds=run.step_seconds, gradient=self._gradient(run),
            passages_read=run.data.fresh_reads + sum(widening.read for widening in run.trainer.widenings))

"""Training the question encoder end to end on an engine's knowledge base (`training.end_to_end`), and named
question encoders that `ask`, `eval` and the page load (`--question-encoder NAME`).

The engine supplies what the training loop takes as plain callables: each question's candidate passages
(its top C under the engine's retriever, Dense + BM25 by default), the frozen reader's log-likelihood
of the answer under each (`RagEngine.score` over those rows, the generator's memory off: the paper's
formulas), and BM25 scores. Reads are cached on disk per knowledge base and reader, so a second run on
the same questions starts at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import GENERAL_KB, EndToEndConfig, cache_root
from ..errors import InputError
from ..training.end_to_end import HeldOutCheck, ReadingCache, ReadQuestion, read_candidates
from ..training.pairs import QAPair, load_pairs

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
    fresh_reads: int


def prepare_training(engine, *, kb: str | None, pairs: Sequence[QAPair], held_out: Sequence[QAPair],
                     candidates: int = EndToEndConfig().candidates, progress=None, should_stop: Callable[[], bool] = lambda: False,
                     ) -> TrainingData:
    """Read each training pair's candidates (cached) and set up the held-out check, on `kb`'s passages.

    `progress(stage, done, total)` hears of the reading. The retriever is the engine's default one.
    """
    import time

    knowledge = engine.resolve_kb(kb)
    if not knowledge.has_vectors:
        raise InputError(f"{knowledge.name}'s dense vectors are not built yet; train once they are")
    if candidates > len(knowledge):
        raise InputError(f"{knowledge.name} holds {len(knowledge)} passages, fewer than the {candidates} candidates "
                         "a question is read with")
    retriever = engine.resolve_retriever(None)
    lexical_weight = engine.lexical_weight if retriever == "hybrid" else 0.0
    bm25 = engine.retriever.lexical_index(knowledge)
    cache = ReadingCache.open(reading_cache_path(engine, knowledge))
    before = len(cache.reads)
    started = time.perf_counter()
    stage = f"reading {len(pairs)} questions' top {candidates} passages (once; cached)"
    examples = read_candidates(
        pairs, candidates=lambda q: [p.id for p in engine.retrieve(q, kb=knowledge, k=candidates, retriever=retriever).passages],
        read=engine_reader(engine, knowledge), lexical=bm25.scores, passage_text=lambda row: knowledge.texts[row],
        cache=cache, progress=None if progress is None else (lambda done, total: progress(stage, done, total)),
        should_stop=should_stop)
    read_seconds = time.perf_counter() - started
    lexical_scores = np.stack([bm25.scores(q) for q, _ in held_out]) if held_out else np.zeros((0, len(knowledge)))
    check = HeldOutCheck(engine.encoder, knowledge.embeddings, held_out, lexical_scores, lambda row: knowledge.texts[row],
                         lexical_weight=lexical_weight)
    return TrainingData(knowledge, examples, check, lexical_weight, bm25.scores, read_seconds, len(cache.reads) - before)


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


def save_question_encoder(model, name: str, record: dict) -> Path:
    """Save a trained question side under `name` (replacing one of that name), with its training record."""
    from ..offline.cache import publish, staged, writing

    folder = encoders_folder() / check_encoder_name(name)
    with staged(folder) as staging, writing(staging):
        model.save_pretrained(staging)
        (staging / TRAINING_RECORD).write_text(json.dumps(record, indent=1), encoding="utf-8")
        publish(staging, folder, f"trained-question-encoder:{name}:{uuid.uuid4().hex}", {"objective": record.get("objective")})
    return folder

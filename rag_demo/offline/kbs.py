"""The default knowledge bases, embedded once per encoder: wikipedia (the leads of Wikipedia's vital
articles) and the NQ pair, nq-wiki and nq-counterfactual. Each has a questions.jsonl in which a few
questions are marked as the page's example questions (wikipedia's holds only those)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..config import DEFAULT_ENCODER, GENERAL_KBS, NQ_KBS
from ..retrieval.corpus import Passage, load_kb, make_kb, save_kb
from ..packaged import ENCODER_DISTRIBUTION, ENCODER_MODULE, missing_packages
from ..progress import Progress, counted
from ..questions import QUESTIONS_FILE, answer_in_text, load_question_set
from .leads import LEADS_SOURCE, GeneralData
from .swapped import SwappedWorld, counterfactual_answer
from .cache import is_complete, publish, report, require_space, resolve_root, staged, timed, writing
from .source import TASK_SOURCE, ensure_source, read_default_data
from .worlds import DefaultData, pick_examples

if TYPE_CHECKING:
    from ..retrieval.encoders import Encoder

log = logging.getLogger(__name__)

KB_FORMAT = 6  # 2: example questions retrieval gets right in both KBs; 3: one counterfactual per real passage;
# 4: no restoration with several mentions unless checked against a second one; 5: one substitute per swapped
# answer, and swapped names swapped in every counterfactual passage; 6: examples picked with questions read as
# the retriever reads them (`encoders.retrieval_question`)
EXAMPLES_PER_KB = 8
GENERAL_FORMAT = 5  # 2: the twin's examples only where the canonical answer is a swapped person; 3: as KB_FORMAT 6;
# 4: in the twin, a surname alone is swapped in every article that names its person in full (`swapped.swap_people`);
# 5: a lead's rest under leads.SHORTEST_TAIL_WORDS words joins the passage before it
WORLD_FILE = "world.json"  # beside the counterfactual general KB: who was swapped for whom
EXAMPLES_FROM = "everyday-train"  # wikipedia's example questions: never the evaluation set
EXAMPLE_CANDIDATES = 200  # of them, tried in a seeded order until EXAMPLES_PER_KB pass
EMBED_BATCH_SIZE = 16  # passages are sorted by length, so batches pad little; 16 took 0.84 of 32's time on 2 cores (benchmarks.build_steps)


def encoder_identity(name: str) -> str:
    """The encoder as far as embeddings depend on it: the offline default includes its package version."""
    if name != DEFAULT_ENCODER:
        return name
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{name}@{ENCODER_DISTRIBUTION}=={version(ENCODER_DISTRIBUTION)}"
    except PackageNotFoundError:
        raise missing_packages([ENCODER_MODULE], "the default encoder") from None


def kb_key(encoder_name: str, max_length: int) -> str:
    """What the NQ pair is made from: the pinned task.json, this module's format, the encoder."""
    return f"{TASK_SOURCE.sha256}:kb{KB_FORMAT}:{encoder_identity(encoder_name)}:max_length={max_length}"


def general_kb_key(encoder_name: str, max_length: int) -> str:
    """What wikipedia is made from: the pinned leads, this module's format, the encoder. (Its example
    questions are picked once, at the build, from EXAMPLES_FROM.)"""
    return f"{LEADS_SOURCE.sha256}:general{GENERAL_FORMAT}:{encoder_identity(encoder_name)}:max_length={max_length}"


def default_kb_keys(encoder_name: str, max_length: int) -> dict[str, str]:
    """{default KB: the key its marker must name}."""
    nq = kb_key(encoder_name, max_length)
    general = general_kb_key(encoder_name, max_length)
    return {name: general for name in GENERAL_KBS} | {name: nq for name in NQ_KBS}


def default_kb_paths(encoder_name: str, max_length: int, *, cache: str | Path | None = None) -> dict[str, Path]:
    """Where the default KBs for this encoder live (built or not); computing this loads nothing."""
    root = resolve_root(cache)
    return {name: root / "kbs" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
            for name, key in default_kb_keys(encoder_name, max_length).items()}


def _question_rows(data: DefaultData, kb: str, featured: set[int]) -> list[dict]:
    rows = []
    for i, example in enumerate(data.examples):
        counterfactual = kb == "nq-counterfactual"
        row = {
            "question": example.question,
            "answer": example.answer,
            "swapped_answer": example.swapped_answer,
            "passage_answer": example.swapped_answer if counterfactual else example.answer,
            "gold_id": example.counterfactual_id if counterfactual else example.wiki_id,
        }
        if i in featured:
            row["example"] = True
        rows.append(row)
    return rows


def _embed_unique(encoder: Encoder, passages: list[Passage], progress: Progress | None) -> dict[Passage, np.ndarray]:
    """Each distinct passage embedded once, longest first (batches then pad little, and the ETA errs long).

    Distinct as the encoder reads it: a swapped passage whose swap lies past the encoder's cut reads
    the same as the real one (427 of the default KBs' 21,052 passages at 128 word pieces) and
    shares its vector."""
    unique = sorted(set(passages), key=lambda p: (-len(p.title) - len(p.text), p.title, p.text))
    read = encoder.passage_token_ids(unique)
    first_reading: dict[tuple[int, ...], int] = {}
    distinct = [i for i, ids in enumerate(read) if first_reading.setdefault(ids, i) == i]
    stage = f"embedding {counted(len(distinct), 'passage')}"
    callback = None if progress is None else (lambda done, total: progress(stage, done, total))
    report(progress, stage, 0, len(distinct))
    with timed(stage):
        vectors = encoder.encode_passages([unique[i] for i in distinct], batch_size=EMBED_BATCH_SIZE, progress=callback,
                                          autocast=True)  # (N, D)
    by_reading = {read[i]: vector for i, vector in zip(distinct, vectors)}
    return {passage: by_reading[ids] for passage, ids in zip(unique, read)}


def _featured_examples(encoder: Encoder, data: DefaultData, kb_vectors: Mapping[str, np.ndarray]) -> set[int]:
    """Example questions for the UI: candidates the retriever answers with their gold passage in both KBs.

    Then asking one on nq-wiki and on nq-counterfactual shows the generator reading the
    retrieved passage, not retrieval noise. Deterministic for a given encoder.
    """
    candidates = [data.examples[i] for i in data.candidates]
    if not candidates:
        return set()
    questions = encoder.encode_questions([e.question for e in candidates]).cpu().numpy()  # (C, D)
    gold_rows = {"nq-wiki": [e.wiki_id for e in candidates], "nq-counterfactual": [e.counterfactual_id for e in candidates]}
    picked = pick_examples(questions, gold_rows, kb_vectors, EXAMPLES_PER_KB)
    log.info("%d example questions among %d candidates (gold passage retrieved first in both KBs)",
             len(picked), len(candidates))
    return {data.candidates[c] for c in picked}


def ensure_nq_kbs(encoder: Encoder, *, cache: str | Path | None = None, progress: Progress | None = None,
                  data: DefaultData | None = None) -> dict[str, Path]:
    """Build (once) nq-wiki and nq-counterfactual with `encoder`, each with its questions.jsonl.

    `encoder` is a `rag_demo.retrieval.encoders.Encoder` (anything with `name`, `max_length`,
    `encode_passages` and `encode_questions`). A passage present in both KBs is embedded once.
    On 2 CPU cores the default encoder embedded 74 passages/s in float32 on a quiet machine (the
    21,052 distinct passages of the two KBs in about 6 minutes); where the CPU has bfloat16
    natively the build embeds under autocast (`rag_demo.precision`), about 2.5 times as fast.
    """
    root = resolve_root(cache)
    key = kb_key(encoder.name, encoder.max_length)
    paths = {name: path for name, path in default_kb_paths(encoder.name, encoder.max_length, cache=root).items()
             if name in NQ_KBS}
    missing = [name for name, path in paths.items() if not is_complete(path, key)]
    if not missing:
        return paths
    from ..precision import build_precision

    if data is None:
        data = read_default_data(ensure_source(cache=root, progress=progress))
    with writing(root):
        (root / "kbs").mkdir(parents=True, exist_ok=True)
    require_space(root / "kbs", 200_000_000 * len(missing), "building the default knowledge bases")
    vectors = _embed_unique(encoder, [p for name in missing for p in data.passages[name]], progress)
    kb_vectors = {
        name: np.stack([vectors[p] for p in data.passages[name]]) if name in missing else load_kb(paths[name]).embeddings
        for name in NQ_KBS
    }
    featured = _featured_examples(encoder, data, kb_vectors)
    for name in missing:
        kb = make_kb(name, data.passages[name], kb_vectors[name], encoder=encoder.name)
        with staged(paths[name]) as staging, writing(staging):
            save_kb(kb, staging)
            with (staging / QUESTIONS_FILE).open("w", encoding="utf-8") as handle:
                for row in _question_rows(data, name, featured):
                    handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            publish(staging, paths[name], key, {"passages": len(kb), "questions": len(data.examples), "encoder": encoder.name,
                                                "precision": build_precision(encoder.device)})
        log.info("built %s: %d passages, %d questions at %s", name, len(kb), len(data.examples), paths[name])
    return paths


def general_example_candidates() -> list[int]:
    """Positions in EXAMPLES_FROM of the questions tried as wikipedia's examples, in a seeded order."""
    import random

    order = list(range(len(load_question_set(EXAMPLES_FROM))))
    random.Random(0).shuffle(order)
    return order[:EXAMPLE_CANDIDATES]


def general_text_examples() -> tuple[str, ...]:
    """The general KBs' example questions before any retrieval check: the first candidates."""
    questions = load_question_set(EXAMPLES_FROM)
    return tuple(questions[i].question for i in general_example_candidates()[:EXAMPLES_PER_KB])


def _general_question_rows(encoder: Encoder, passages: list[Passage], vectors: np.ndarray,
                           world: SwappedWorld | None = None) -> list[dict]:
    """A general KB's example questions: candidates whose top passage under `encoder` holds one of
    their answers, that passage taken as their gold one. With `world` (the counterfactual twin), only
    questions whose answer is a swapped person, the top passage holding the substitute. Deterministic
    for a given encoder."""
    questions = load_question_set(EXAMPLES_FROM)
    candidates = [questions[i] for i in general_example_candidates()]
    query = encoder.encode_questions([q.question for q in candidates]).cpu().numpy()  # (C, D)
    top = np.argmax(query @ vectors.T, axis=1)  # (C,)
    rows = []
    for question, row in zip(candidates, top):
        text = passages[int(row)].text
        swapped = ("" if world is None or question.answers[0] not in world.substitutes  # as `evaluate.counterfactual_questions`
                   else counterfactual_answer(text, question.answers[:1], world))
        found = answer_in_text(text, [swapped] if world is not None else question.answers)
        if found:
            rows.append({"question": question.question, "answer": question.answers[0], "swapped_answer": swapped,
                         "passage_answer": found, "gold_id": int(row), "example": True})
        if len(rows) == EXAMPLES_PER_KB:
            break
    return rows


def counterfactual_world_record(world: SwappedWorld) -> dict:
    """What `eval` needs of the counterfactual world to know each question's swapped answer."""
    return {"substitutes": world.substitutes, "surnames": world.surnames}


def load_counterfactual_world(kb_path: str | Path) -> SwappedWorld | None:
    """The world a counterfactual general KB was made with; None for any other KB."""
    path = Path(kb_path) / WORLD_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    return SwappedWorld([], dict(record["substitutes"]), frozenset(), dict(record["surnames"]))


def ensure_general_kbs(encoder: Encoder, data: GeneralData, *, cache: str | Path | None = None,
                       progress: Progress | None = None) -> dict[str, Path]:
    """Build (once) wikipedia and its counterfactual twin with `encoder` from the leads (`leads.read_leads`),
    each with its example questions; a passage the swap left alone is embedded once for both. 11,701
    passages and 1,882 swapped ones: a minute and a half on 2 cores with bfloat16."""
    root = resolve_root(cache)
    key = general_kb_key(encoder.name, encoder.max_length)
    paths = {name: path for name, path in default_kb_paths(encoder.name, encoder.max_length, cache=root).items()
             if name in GENERAL_KBS}
    missing = [name for name, path in paths.items() if not is_complete(path, key)]
    if not missing:
        return paths
    from ..precision import build_precision

    real, counterfactual = GENERAL_KBS
    passages = {real: data.passages, counterfactual: data.counterfactual.passages}
    with writing(root):
        (root / "kbs").mkdir(parents=True, exist_ok=True)
    require_space(root / "kbs", 100_000_000 * len(missing), "building the wikipedia knowledge bases")
    vectors = _embed_unique(encoder, [p for name in missing for p in passages[name]], progress)
    for name in missing:
        kb_vectors = np.stack([vectors[p] for p in passages[name]])
        world = data.counterfactual if name == counterfactual else None
        rows = _general_question_rows(encoder, passages[name], kb_vectors, world)
        log.info("%d example questions for %s (an answer in the top passage)", len(rows), name)
        kb = make_kb(name, passages[name], kb_vectors, encoder=encoder.name)
        with staged(paths[name]) as staging, writing(staging):
            save_kb(kb, staging)
            with (staging / QUESTIONS_FILE).open("w", encoding="utf-8") as handle:
                for row in rows:
                    handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            if world is not None:
                (staging / WORLD_FILE).write_text(json.dumps(counterfactual_world_record(world), ensure_ascii=False),
                                                  encoding="utf-8")
            publish(staging, paths[name], key, {"passages": len(kb), "questions": len(rows), "encoder": encoder.name,
                                                "precision": build_precision(encoder.device)})
        log.info("built %s: %d passages at %s", name, len(kb), paths[name])
    return paths

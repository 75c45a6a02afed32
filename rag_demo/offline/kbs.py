"""The default knowledge bases, nq-wiki and nq-counterfactual: embedded once per encoder, each with
its questions.jsonl, in which a few questions are marked as the page's example questions."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..config import DEFAULT_ENCODER, DEFAULT_KBS
from ..corpus import Passage, load_kb, make_kb, save_kb
from ..packaged import ENCODER_DISTRIBUTION, ENCODER_MODULE, missing_packages
from ..progress import Progress, counted
from ..questions import QUESTIONS_FILE
from .cache import is_complete, publish, report, require_space, resolve_root, staged, timed, writing
from .source import SOURCE_SHA256, ensure_source, read_default_data
from .worlds import DefaultData, pick_examples

if TYPE_CHECKING:
    from ..encoders import Encoder

log = logging.getLogger(__name__)

KB_FORMAT = 5  # 2: example questions retrieval gets right in both KBs; 3: one counterfactual per real passage;
# 4: no restoration with several mentions unless checked against a second one; 5: one substitute per swapped
# answer, and swapped names swapped in every counterfactual passage
EXAMPLES_PER_KB = 8
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
    """What the default KBs are made from: the pinned task.json, this module's format, the encoder."""
    return f"{SOURCE_SHA256}:kb{KB_FORMAT}:{encoder_identity(encoder_name)}:max_length={max_length}"


def default_kb_paths(encoder_name: str, max_length: int, *, cache: str | Path | None = None) -> dict[str, Path]:
    """Where the default KBs for this encoder live (built or not); computing this loads nothing."""
    root = resolve_root(cache)
    suffix = hashlib.sha256(kb_key(encoder_name, max_length).encode()).hexdigest()[:12]
    return {name: root / "kbs" / f"{name}-{suffix}" for name in DEFAULT_KBS}


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


def ensure_default_kbs(encoder: Encoder, *, cache: str | Path | None = None, progress: Progress | None = None,
                       data: DefaultData | None = None) -> dict[str, Path]:
    """Build (once) nq-wiki and nq-counterfactual with `encoder`, each with its questions.jsonl.

    `encoder` is a `rag_demo.encoders.Encoder` (anything with `name`, `max_length`,
    `encode_passages` and `encode_questions`). A passage present in both KBs is embedded once.
    On 2 CPU cores the default encoder embedded 74 passages/s in float32 on a quiet machine (the
    21,052 distinct passages of the two KBs in about 6 minutes); where the CPU has bfloat16
    natively the build embeds under autocast (`rag_demo.precision`), about 2.5 times as fast.
    """
    root = resolve_root(cache)
    key = kb_key(encoder.name, encoder.max_length)
    paths = default_kb_paths(encoder.name, encoder.max_length, cache=root)
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
        for name in DEFAULT_KBS
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

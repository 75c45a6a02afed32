"""The page's example questions, ordered so that the first ones are answered right.

A default KB stores a few example questions whose gold passage its retriever ranks first. Whether
the generator then reads the right answer out of that passage is only known by asking, so the
first start asks each example once with the page's default settings, saves which answers matched
what the passage says, and orders the examples: both variants right, one right, neither. Later
starts read the saved order (keyed by the KBs, the prompt and the settings, so a change asks again).
Every answer the page shows is still computed when a visitor asks; only the order comes from here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from ..retrieval.corpus import Passage
from ..evaluate import exact_match

log = logging.getLogger(__name__)

FORMAT = 1  # bump when what is checked changes
PAGE_K = 5  # the page's default k
VARIANTS = ("token", "sequence")


def order_key(engine, questions: dict[str, list]) -> str:
    """A digest of everything the check's outcome depends on."""
    gen = engine.generator
    parts = {
        "format": FORMAT,
        "generator": gen.name,
        "generator_weights": gen.weights,
        "prompt": gen.format_input("{question}", Passage("{title}", "{text}")),
        "closed_prompt": gen.format_input("{question}", None),
        "decoding": asdict(engine.config.decoding),
        "retrieval": asdict(engine.config.retrieval),
        "encoder": engine.encoder.name,
        "question_weights": engine.encoder.question_weights,
        "kbs": {name: [engine.kbs[name].fingerprint, [(q.question, q.passage_answer) for q in items]]
                for name, items in sorted(questions.items())},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _ranked(engine, kb: str, items: list, progress, done: int, total: int) -> tuple[list[str], dict[str, int]]:
    right: dict[str, int] = {}
    for i, item in enumerate(items):
        result = engine.ask(item.question, kb=kb, k=min(PAGE_K, len(engine.kbs[kb])), variants=VARIANTS,
                            closed_book=False)
        right[item.question] = sum(exact_match(result.variants[v].answer, item.passage_answer) for v in VARIANTS)
        if progress is not None:
            progress("checking the example questions", done + i + 1, total)
    order = sorted((item.question for item in items), key=lambda q: -right[q])  # stable: ties keep their order
    return order, right


def order_examples(engine, questions: dict[str, list], *, cache_dir: Path | None, progress=None) -> dict[str, list[str]]:
    """{kb: example questions, those answered right by both variants first}.

    `questions[kb]` are the KB's example questions (`questions.KBQuestion`). The outcome is saved under
    `cache_dir`; an unreadable saved file is checked again, an unwritable folder costs a check next
    start, never this one.
    """
    key = order_key(engine, questions)
    path = None if cache_dir is None else cache_dir / f"examples-{key}.json"
    if path is not None and path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            if all(sorted(saved["order"][kb]) == sorted(q.question for q in items) for kb, items in questions.items()):
                return {kb: list(saved["order"][kb]) for kb in questions}
            log.warning("saved example order %s does not match the KBs; checking again", path)
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("saved example order %s is unreadable (%s); checking again", path, err)
    total = sum(len(items) for items in questions.values())
    order, right, done = {}, {}, 0
    for kb, items in questions.items():
        order[kb], right[kb] = _ranked(engine, kb, items, progress, done, total)
        done += len(items)
    log.info("example questions answered right by both variants: %s",
             {kb: sum(n == len(VARIANTS) for n in hits.values()) for kb, hits in right.items()})
    if path is not None:
        _save(path, {"key": key, "order": order, "right": right})
    return order


def feature_checked_examples(engine, *, cache_dir: Path | None = None, progress=None) -> None:
    """Order the engine's example questions of every KB stored with questions (the default KBs).

    The first call for a given setup asks each example once (about a minute on 2 CPU cores for
    the two default KBs); `python -m rag_demo prepare` does it at build time, `app.py` otherwise.
    """
    from ..config import cache_root
    from ..questions import examples_by_kb

    featured = examples_by_kb({name: kb.path for name, kb in engine.kbs.items()})
    if featured:
        cache_dir = cache_root() / "featured" if cache_dir is None else cache_dir
        engine.feature_examples(order_examples(engine, featured, cache_dir=cache_dir, progress=progress))


def _save(path: Path, record: dict) -> None:
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", dir=path.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(record, out, ensure_ascii=False, indent=1)
        os.replace(tmp, path)
    except OSError as err:
        log.warning("could not save the example order in %s (%s); it will be checked again next start", path.parent, err)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)

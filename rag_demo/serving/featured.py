"""The page's example questions, ordered so that the first ones are answered right, with two where
RAG-Token and RAG-Sequence disagree right after the first.

A default KB stores a few example questions whose gold passage its retriever ranks first. Whether
the generator then reads the right answer out of that passage is only known by asking, so the
first start asks each example once with the page's default settings, saves which answers matched
what the passage says, and orders the examples: both variants right, one right, neither. The two
variants' answers differ on few questions, and those show best how they differ (paper Figure 2):
when fewer than `DIFFERING_SHOWN` examples differ, spare questions (the general KBs' training
questions the examples were drawn from) are asked too, at most `SPARE_ASKS`, and those that differ
join the examples. Later starts read the saved order (keyed by the KBs, the prompt, the settings
and the spares, so a change asks again). Every answer the page shows is still computed when a
visitor asks; only the choice and the order come from here, never a stored answer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from ..config import GENERAL_KBS
from ..evaluate import exact_match
from ..retrieval.corpus import Passage

log = logging.getLogger(__name__)

FORMAT = 3  # bump when what is checked changes; 2: examples where the variants differ are featured;
# 3: questions retrieved as `encoders.retrieval_question` reads them
PAGE_K = 5  # the page's default k
VARIANTS = ("token", "sequence")
DIFFERING_SHOWN = 2  # examples whose two variants answer differently, placed right after the first
SPARE_ASKS = 24  # spare questions asked per KB, at most, to find them (about 40 s on 2 CPU cores)


def order_key(engine, questions: dict[str, list], spares: dict[str, list] | None = None) -> str:
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
    if spares:  # only where some are given, so that a key made before spares existed still reads the same way
        parts["spares"] = {name: [(q.question, q.passage_answer) for q in items] for name, items in sorted(spares.items())}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _check(engine, kb: str, item) -> tuple[int, bool]:
    """(how many variants answer `item` right, whether the two variants' answers differ), asked as the page asks."""
    result = engine.ask(item.question, kb=kb, k=min(PAGE_K, len(engine.kbs[kb])), variants=VARIANTS, closed_book=False)
    answers = [result.variants[v].answer for v in VARIANTS]
    return sum(exact_match(a, item.passage_answer) for a in answers), not exact_match(*answers)


def _ranked(engine, kb: str, items: list, progress, done: int, total: int) -> tuple[list[str], dict[str, int], list[str]]:
    right: dict[str, int] = {}
    differing = []
    for i, item in enumerate(items):
        right[item.question], differs = _check(engine, kb, item)
        if differs:
            differing.append(item.question)
        if progress is not None:
            progress("checking the example questions", done + i + 1, total)
    order = sorted((item.question for item in items), key=lambda q: -right[q])  # stable: ties keep their order
    return order, right, differing


def _differing_spares(engine, kb: str, spares: list, wanted: int, right: dict[str, int], progress) -> list[str]:
    """Spare questions whose two variants answer differently, asked in order until `wanted` of them have one
    variant right, or `SPARE_ASKS` were asked; those with a right answer first."""
    found: list[str] = []
    for i, item in enumerate(spares[:SPARE_ASKS]):
        right[item.question], differs = _check(engine, kb, item)
        if differs:
            found.append(item.question)
        if progress is not None:
            progress(f"looking for questions the two RAG variants answer differently ({kb})", i + 1,
                     min(len(spares), SPARE_ASKS))
        if sum(right[q] > 0 for q in found) >= wanted:
            break
    return sorted(found, key=lambda q: -right[q])


def arrange(order: list[str], differing: list[str], shown: int = DIFFERING_SHOWN) -> list[str]:
    """`order` (right-first) with the first `shown` of `differing` just after its first question, so that the
    first examples a visitor sees include answers where RAG-Token and RAG-Sequence disagree.

    >>> arrange(["a", "b", "c", "d"], ["d", "x"])
    ['a', 'd', 'x', 'b', 'c']
    >>> arrange(["a", "b", "c"], ["a", "c", "b"])  # the first differs already: one more joins it
    ['a', 'c', 'b']
    """
    picks = differing[:shown]
    head = order[:1]
    return head + [q for q in picks if q not in head] + [q for q in order if q not in head and q not in picks]


def _matches(saved: list, items: list, spares: list) -> bool:
    """Whether a saved order holds every example question and nothing but examples and spares."""
    examples = {q.question for q in items}
    return examples <= set(saved) and set(saved) <= examples | {q.question for q in spares} and len(set(saved)) == len(saved)


def order_examples(engine, questions: dict[str, list], *, cache_dir: Path | None, progress=None,
                   spares: dict[str, list] | None = None) -> dict[str, list[str]]:
    """{kb: example questions, those answered right by both variants first, with `DIFFERING_SHOWN` whose two
    variants answer differently right after the first}.

    `questions[kb]` are the KB's example questions (`questions.KBQuestion`); `spares[kb]`, questions asked
    only when too few examples differ, in order. The outcome is saved under `cache_dir`; an unreadable
    saved file is checked again, an unwritable folder costs a check next start, never this one.
    """
    spares = spares or {}
    key = order_key(engine, questions, spares)
    path = None if cache_dir is None else cache_dir / f"examples-{key}.json"
    if path is not None and path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            if all(_matches(saved["order"][kb], items, spares.get(kb, [])) for kb, items in questions.items()):
                return {kb: list(saved["order"][kb]) for kb in questions}
            log.warning("saved example order %s does not match the KBs; checking again", path)
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("saved example order %s is unreadable (%s); checking again", path, err)
    total = sum(len(items) for items in questions.values())
    order, right, differ, done = {}, {}, {}, 0
    for kb, items in questions.items():
        ranked, right[kb], differing = _ranked(engine, kb, items, progress, done, total)
        differing.sort(key=lambda q: -right[kb][q])  # one variant right first: the other's answer is the odd one
        missing = DIFFERING_SHOWN - sum(right[kb][q] > 0 for q in differing)
        if missing > 0 and spares.get(kb):
            differing += _differing_spares(engine, kb, spares[kb], missing, right[kb], progress)
            differing.sort(key=lambda q: -right[kb][q])
        order[kb], differ[kb] = arrange(ranked, differing), differing
        done += len(items)
    log.info("example questions answered right by both variants: %s; with differing answers: %s",
             {kb: sum(n == len(VARIANTS) for n in hits.values()) for kb, hits in right.items()},
             {kb: len(qs) for kb, qs in differ.items()})
    if path is not None:
        _save(path, {"key": key, "order": order, "right": right, "differ": differ})
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
        spares = {kb: spare_questions(items) for kb, items in featured.items() if kb in GENERAL_KBS}
        engine.feature_examples(order_examples(engine, featured, cache_dir=cache_dir, progress=progress,
                                               spares={kb: items for kb, items in spares.items() if items}))


def spare_questions(examples: list) -> list:
    """A general KB's spare questions: the training questions its examples were drawn from, in the order they
    were tried, less the examples themselves (never the evaluation set). Their answers are the set's first alias."""
    from ..offline.kbs import EXAMPLES_FROM, general_example_candidates
    from ..questions import KBQuestion, load_question_set

    taken = {q.question for q in examples}
    questions = load_question_set(EXAMPLES_FROM)
    candidates = (questions[i] for i in general_example_candidates())
    return [KBQuestion(q.question, q.answers[0], "", q.answers[0], -1) for q in candidates if q.question not in taken]


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

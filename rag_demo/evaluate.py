"""Exact match / F1 (SQuAD normalization) and retrieval recall on a KB's own questions."""

from __future__ import annotations

import random
import re
import string
import sys
import time
from collections import Counter
from dataclasses import dataclass

from .errors import InputError

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower case, drop punctuation and articles, squeeze spaces.

    >>> normalize_answer("The  Eiffel-Tower!")
    'eiffeltower'
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def f1_score(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def contains_answer(prediction: str, gold: str) -> bool:
    """The gold answer appears inside the output (after normalization)."""
    gold_norm = normalize_answer(gold)
    return bool(gold_norm) and f" {gold_norm} " in f" {normalize_answer(prediction)} "


@dataclass(frozen=True)
class EvalQuestion:
    question: str
    answer: str  # what the KB's gold passage says
    original_answer: str  # the real-world answer (differs on the counterfactual KB)
    gold_id: int  # row of the gold passage in the KB


def sample_questions(questions: list[EvalQuestion], n: int, seed: int) -> list[EvalQuestion]:
    if n < 1:
        raise InputError("--n must be at least 1")
    rng = random.Random(seed)
    return rng.sample(questions, min(n, len(questions)))


def evaluate(engine, *, kb: str, variant: str, n: int, seed: int, k: int = 5, index: str = "flat", num_beams: int = 1,
             max_new_tokens: int = 16, sequence_decoding: str = "thorough", questions: list[EvalQuestion] | None = None,
             progress=None) -> dict:
    """Sample n questions of `kb` and score `variant` ("token", "sequence" or "closed-book")."""
    if variant not in ("token", "sequence", "closed-book"):
        raise InputError(f"unknown variant {variant!r}; choose token, sequence or closed-book")
    if questions is None:
        from .data import load_eval_questions

        questions = load_eval_questions(engine.resolve_kb(kb))
    if not questions:
        raise InputError(f"knowledge base {kb!r} has no evaluation questions")
    picked = sample_questions(questions, n, seed)
    totals = Counter()
    started = time.perf_counter()
    for done, item in enumerate(picked, start=1):
        if variant == "closed-book":
            prediction = engine.closed_book(item.question, max_new_tokens=max_new_tokens).answer
            retrieved = False
        else:
            result = engine.ask(item.question, kb=kb, k=k, index=index, variants=(variant,), num_beams=num_beams,
                                max_new_tokens=max_new_tokens, sequence_decoding=sequence_decoding, closed_book=False)
            prediction = result.variants[variant].answer
            retrieved = any(p.id == item.gold_id for p in result.passages)
        totals["exact_match"] += exact_match(prediction, item.answer)
        totals["f1"] += f1_score(prediction, item.answer)
        totals["answer_recall"] += contains_answer(prediction, item.answer)
        totals["retrieval_recall"] += retrieved
        if normalize_answer(item.original_answer) != normalize_answer(item.answer):
            totals["counterfactual"] += 1
            totals["original_match"] += exact_match(prediction, item.original_answer)
        if progress is not None:
            progress(f"evaluating {variant} on {kb}", done, len(picked))
    count = len(picked)
    report = {key: totals[key] / count for key in ("exact_match", "f1", "answer_recall", "retrieval_recall")}
    if variant == "closed-book":
        report["retrieval_recall"] = None  # nothing is retrieved
    report["original_match"] = totals["original_match"] / totals["counterfactual"] if totals["counterfactual"] else None
    report |= {"n": count, "kb": kb, "variant": variant, "k": k, "index": index, "seed": seed,
               "seconds_per_question": (time.perf_counter() - started) / count}
    return report


def print_report(report: dict, out=sys.stdout) -> None:
    out.write(f"{report['variant']} on {report['kb']} (n={report['n']}, k={report['k']}, seed={report['seed']})\n")
    for key in ("exact_match", "f1", "answer_recall", "retrieval_recall", "original_match"):
        value = report[key]
        out.write(f"  {key:<17} {'n/a' if value is None else f'{100 * value:5.1f}%'}\n")
    out.write(f"  {report['seconds_per_question']:.2f} s per question\n")

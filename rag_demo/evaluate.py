"""Exact match / F1 (SQuAD normalization) and retrieval recall on a KB's own questions."""

from __future__ import annotations

import math
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from .config import ASK, DECODING_DEFAULTS, DEFAULT_QUESTION_SETS, VARIANTS
from .errors import InputError
from .options import CLOSED_BOOK, parse_variants
from .offline.kbs import load_counterfactual_world
from .offline.swapped import SwappedWorld, counterfactual_answer
from .questions import EvalQuestion, answer_in_text, contains_answer, load_eval_questions, normalize_answer, set_eval_questions

__all__ = ["EvalQuestion", "normalize_answer", "exact_match", "matches_any", "f1_score", "contains_answer", "evaluate", "evaluate_table", "answer_record"]


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def matches_any(prediction: str, answers) -> bool:
    """Exact match with any of `answers` (a question's aliases).

    >>> matches_any("the Tigris", ["Tigris River", "Tigris"]), matches_any("Euphrates", ["Tigris"])
    (True, False)
    """
    return any(exact_match(prediction, answer) for answer in answers)


def f1_score(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def answer_record(item: EvalQuestion, prediction: str, *, kb: str, variant: str, k: int | None,
                  retrieved: bool | None, logprob: float | None = None) -> dict:
    """One scored answer as plain data (a line of `eval --answers`): the question, both gold
    answers (and every alias that counts), the prediction, its log p(y|x), and what it was scored as.
    `retrieved` (the gold passage, or for a question set a passage holding an answer, was among those
    read) is None for closed-book, which reads none."""
    swapped = normalize_answer(item.original_answer) != normalize_answer(item.answer)
    return {"kb": kb, "variant": variant, "k": k, "question": item.question, "answer": item.answer,
            "original_answer": item.original_answer, "answers": list(item.answers), "prediction": prediction,
            "exact_match": matches_any(prediction, item.answers),
            "original_match": matches_any(prediction, item.original_answers) if swapped else None,
            "retrieved": retrieved, "logprob": logprob}


def counterfactual_questions(questions: list[EvalQuestion], world: SwappedWorld) -> list[EvalQuestion]:
    """The questions whose answer the counterfactual general KB swapped, each expecting the substitute
    (full name or surname) and keeping its real answers as the original ones."""
    swapped = []
    for item in questions:
        # only a canonical answer that is a swapped person's full name: an alias may be a surname that also
        # names a thing ("Hubble" for the telescope), which the swap left alone
        substitute = counterfactual_answer("", item.answers[:1], world) if item.answers[0] in world.substitutes else ""
        if substitute:
            forms = (substitute, world.surnames[substitute]) if substitute in world.surnames else (substitute,)
            swapped.append(replace(item, answer=substitute, aliases=forms))
    return swapped


def sample_questions(questions: list[EvalQuestion], n: int, seed: int) -> list[EvalQuestion]:
    if n < 1:
        raise InputError("--n must be at least 1")
    rng = random.Random(seed)
    return rng.sample(questions, min(n, len(questions)))


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (z = 1.96); (nan, nan) for n = 0.

    >>> [round(x, 3) for x in wilson_interval(30, 100)]
    [0.219, 0.396]
    """
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


PROPORTIONS = ("exact_match", "answer_recall", "retrieval_recall")  # per question 0 or 1: these get an interval


class _Tally:
    """Running sums of one variant's metrics over the questions seen so far."""

    def __init__(self):
        self.totals, self.count = Counter(), 0
        self.answers = Counter()  # normalized answers: a generator that gives one answer to everything shows here

    def add(self, record: dict) -> None:
        """Count one `answer_record`."""
        prediction, golds = record["prediction"], record.get("answers") or [record["answer"]]
        self.count += 1
        self.answers[normalize_answer(prediction)] += 1
        self.totals["exact_match"] += record["exact_match"]
        self.totals["f1"] += max(f1_score(prediction, gold) for gold in golds)
        self.totals["answer_recall"] += any(contains_answer(prediction, gold) for gold in golds)
        self.totals["retrieval_recall"] += bool(record["retrieved"])
        if record["original_match"] is not None:
            self.totals["counterfactual"] += 1
            self.totals["original_match"] += record["original_match"]

    def report(self, **about) -> dict:
        totals, count = self.totals, self.count
        report = {key: totals[key] / count for key in ("exact_match", "f1", "answer_recall", "retrieval_recall")}
        intervals = {key: wilson_interval(totals[key], count) for key in PROPORTIONS}
        if about.get("variant") == CLOSED_BOOK:
            report["retrieval_recall"] = None  # nothing is retrieved
            intervals["retrieval_recall"] = None
        swapped = totals["counterfactual"]
        report["original_match"] = totals["original_match"] / swapped if swapped else None
        intervals["original_match"] = wilson_interval(totals["original_match"], swapped) if swapped else None
        (answer, times), = self.answers.most_common(1) or [("", 0)]
        return report | {"n": count, "intervals": intervals, "most_common_answer": answer,
                         "most_common_share": times / count if count else None} | about


def sample_kb(kb, questions: list[EvalQuestion], size: int, seed: int):
    """`size` passages of `kb` drawn with `seed`, and the questions whose gold passage is among them.

    Row-aligned KBs (nq-wiki and nq-counterfactual) get the same rows for the same seed. Returns
    (KnowledgeBase, questions with gold_id renumbered to the sample's rows).
    """
    from .retrieval.corpus import make_kb

    if size < 1:
        raise InputError("--kb-sample must be at least 1")
    if size >= len(kb):
        return kb, questions
    rows = sorted(random.Random(seed).sample(range(len(kb)), size))
    renumber = {row: new for new, row in enumerate(rows)}
    sample = make_kb(f"{kb.name} ({size}-passage sample, seed {seed})", [kb.passage(row) for row in rows],
                     kb.embeddings[rows], encoder=kb.encoder)
    kept = [replace(q, gold_id=renumber[q.gold_id]) for q in questions if q.gold_id in renumber]
    return sample, kept


def _picked(engine, kb: str, n: int, seed: int, questions: list[EvalQuestion] | None, kb_sample: int | None):
    """(the KB to ask, n sampled questions)."""
    knowledge = engine.resolve_kb(kb)
    if questions is None and kb in DEFAULT_QUESTION_SETS:
        questions = set_eval_questions(DEFAULT_QUESTION_SETS[kb])
        world = load_counterfactual_world(knowledge.path) if knowledge.path is not None else None
        if world is not None:
            questions = counterfactual_questions(questions, world)
    elif questions is None:
        questions = load_eval_questions(knowledge.path)
    if kb_sample is not None:
        if any(q.gold_id is None for q in questions):
            raise InputError("--kb-sample needs questions with gold passages (a default NQ KB's own); a question set has none")
        knowledge, questions = sample_kb(knowledge, questions, kb_sample, seed)
    if not questions:
        raise InputError(f"knowledge base {kb!r} has no evaluation questions")
    return knowledge, sample_questions(questions, n, seed)


def evaluate(engine, *, kb: str, variant: str, n: int, seed: int, k: int = ASK.k, index: str = ASK.index, num_beams: int = 1,
             max_new_tokens: int = DECODING_DEFAULTS.max_new_tokens, sequence_decoding: str = "thorough",
             questions: list[EvalQuestion] | None = None,
             kb_sample: int | None = None, retriever: str | None = None, extractive: bool = False, gold_passage: bool = False,
             progress=None, answers: Callable[[dict], None] | None = None, memory: bool | None = None) -> dict:
    """Sample n questions of `kb` and score `variant` ("token", "sequence" or "closed-book")."""
    parse_variants(variant, closed_book=True)
    reports = evaluate_table(engine, kbs=(kb,), ks=(k,), n=n, seed=seed, variants=(variant,), index=index,
                             num_beams=num_beams, max_new_tokens=max_new_tokens, sequence_decoding=sequence_decoding,
                             questions={kb: questions} if questions is not None else None, kb_sample=kb_sample,
                             retriever=retriever, extractive=extractive, gold_passage=gold_passage, progress=progress,
                             answers=answers, memory=memory)
    return reports[0]


def evaluate_table(engine, *, kbs, ks, n: int, seed: int, variants=(*VARIANTS, CLOSED_BOOK),
                   index: str = ASK.index, num_beams: int = 1, max_new_tokens: int = DECODING_DEFAULTS.max_new_tokens,
                   sequence_decoding: str = "thorough",
                   questions: dict[str, list[EvalQuestion]] | None = None, kb_sample: int | None = None,
                   retriever: str | None = None, extractive: bool = False, gold_passage: bool = False,
                   progress=None, answers: Callable[[dict], None] | None = None, memory: bool | None = None) -> list[dict]:
    """One report per (kb, variant, k); closed-book gets one per kb (it reads no passage).

    `kb_sample` asks over a random part of each KB of that many passages (see `sample_kb`).
    `gold_passage` gives the generator each question's gold passage alone instead of retrieving
    (k = 1, p(z|x) = 1): the reading ceiling, what the generator makes of the right passage.

    Each question is asked once per k with every retrieval variant at once, so RAG-Token and
    RAG-Sequence read the same retrieved passages and share the prompt computation.

    `answers(record)` is called with every answer as it is scored (`answer_record`), so two builds'
    answers to the same questions can be compared one by one (`benchmarks.paired_answers`).
    `memory` as for `RagEngine.ask`: the generator's memory as a source beside the passages; each
    report says whether it was one (`memory_logit`, None when not).
    """
    variants = parse_variants(variants, closed_book=True)
    open_book = tuple(v for v in variants if v != CLOSED_BOOK)
    retriever = engine.resolve_retriever(retriever)
    if gold_passage:
        ks = (1,)
    reports = []
    for kb in kbs:
        knowledge, picked = _picked(engine, kb, n, seed, (questions or {}).get(kb), kb_sample)
        if gold_passage and any(item.gold_id is None for item in picked):
            raise InputError("--gold-passage needs questions with gold passages (a default NQ KB's own); a question set "
                             "has none")
        tallies = {(v, k): _Tally() for k in ks for v in open_book}
        closed = _Tally() if CLOSED_BOOK in variants else None
        seconds = Counter()
        memory_logits = set()
        for done, item in enumerate(picked, start=1):
            scored = []  # (tally, answer_record) of each answer to this question
            if closed is not None:
                started = time.perf_counter()
                closed_answer = engine.closed_book(item.question, max_new_tokens=max_new_tokens)
                seconds[CLOSED_BOOK] += time.perf_counter() - started
                scored.append((closed, answer_record(item, closed_answer.answer, kb=kb, variant=CLOSED_BOOK, k=None,
                                                     retrieved=None, logprob=closed_answer.logprob)))
            for k in ks if open_book else ():
                started = time.perf_counter()
                result = engine.ask(item.question, kb=knowledge, k=k, index=index, variants=open_book, num_beams=num_beams,
                                    max_new_tokens=max_new_tokens, sequence_decoding=sequence_decoding, closed_book=False,
                                    retriever=retriever, extractive=extractive, rows=[item.gold_id] if gold_passage else None,
                                    memory=memory)
                memory_logits.add(result.memory_logit)
                seconds[k] += time.perf_counter() - started
                retrieved = (any(answer_in_text(p.text, item.answers) for p in result.passages) if item.gold_id is None
                             else any(p.id == item.gold_id for p in result.passages))
                scored += [(tallies[v, k], answer_record(item, result.variants[v].answer, kb=kb, variant=v, k=k,
                                                          retrieved=retrieved, logprob=result.variants[v].logprob))
                           for v in open_book]
            for tally, record in scored:
                tally.add(record)
                if answers is not None:
                    answers(record)
            if progress is not None:
                progress(f"evaluating on {kb}", done, len(picked))
        common = {"kb": kb, "kb_passages": len(knowledge), "index": index, "retriever": retriever, "seed": seed}
        open_common = common | {"extractive": extractive, "gold_passage": gold_passage,
                                "memory_logit": next(iter(memory_logits)) if len(memory_logits) == 1 else None}
        for (v, k), tally in tallies.items():
            # both variants came out of one ask, so the time is theirs together
            reports.append(tally.report(variant=v, k=k, seconds_per_question=seconds[k] / len(picked), **open_common))
        if closed is not None:
            reports.append(closed.report(variant=CLOSED_BOOK, k=None, seconds_per_question=seconds[CLOSED_BOOK] / len(picked), **common))
    return reports


def _percent(report: dict, key: str, *, interval: bool) -> str:
    value = report[key]
    if value is None:
        return "n/a"
    bounds = (report.get("intervals") or {}).get(key) if interval else None
    return f"{100 * value:.1f}" + (f" ({100 * bounds[0]:.1f}-{100 * bounds[1]:.1f})" if bounds else "")


def print_table(reports: list[dict], out=sys.stdout) -> None:
    """A markdown table of `evaluate_table`'s reports, in percent, with 95% Wilson intervals."""
    keys = ("exact_match", "f1", "answer_recall", "retrieval_recall", "original_match")
    out.write("| KB | passages | retriever | variant | k | n | EM (95% CI) | F1 | answer recall | gold in top k (95% CI) "
              "| real-world answer (95% CI) | most common answer | s/question |\n")
    out.write("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in reports:
        cells = [_percent(r, key, interval=key != "f1") for key in keys]
        k = "-" if r["variant"] == CLOSED_BOOK else str(r["k"])
        variant = (r["variant"] + (", copying" if r.get("extractive") else "") + (", gold passage" if r.get("gold_passage") else "")
                   + (f", memory θ={r['memory_logit']:g}" if r.get("memory_logit") is not None else ""))
        retriever = "-" if r["variant"] == CLOSED_BOOK or r.get("gold_passage") else r["retriever"]
        common = f"{r['most_common_answer'][:30] or '(empty)'} ({100 * r['most_common_share']:.0f}%)" if r.get("most_common_share") else "-"
        out.write(f"| {r['kb']} | {r['kb_passages']:,} | {retriever} | {variant} | {k} | {r['n']} | " + " | ".join(cells)
                  + f" | {common} | {r['seconds_per_question']:.2f} |\n")
    out.write("\n" + "".join(f"{name}: {means}\n" for name, means in TABLE_NOTES))


# what the table's columns that its header does not explain are
TABLE_NOTES = (
    ("EM", "exact match: the answer equals an alias (lower case, punctuation and articles dropped)"),
    ("answer recall", "the answer contains an alias"),
    ("gold in top k", "the top k held the gold passage (a question set has none: a passage holding an alias)"),
    ("s/question", "the seconds of the ask that answered it; RAG-Token and RAG-Sequence at one k come out of one ask "
                   "and share its time"),
)


# what each figure of a report is, as `eval` prints it beside the figure (percent of the questions asked)
REPORT_MEANS = {
    "exact_match": "% answers equal to an answer alias (lower case, punctuation and articles dropped)",
    "f1": "% word overlap with the closest alias, averaged",
    "answer_recall": "% answers that contain an alias",
    "retrieval_recall": "% questions whose top k held the gold passage (no gold: a passage holding an alias)",
    "original_match": "% answers that are the real-world one, on a swapped base (n/a elsewhere)",
}


def print_report(report: dict, out=sys.stdout) -> None:
    copying = ", copying from passages" if report.get("extractive") else ""
    how = "the gold passage alone" if report.get("gold_passage") else f"{report['retriever']} retrieval{copying}"
    if report.get("memory_logit") is not None:
        how += f", memory a source (θ={report['memory_logit']:g})"
    out.write(f"{report['variant']} on {report['kb']} ({report['kb_passages']:,} passages, n={report['n']}, k={report['k']}, "
              f"{how}, seed={report['seed']})\n")
    for key in ("exact_match", "f1", "answer_recall", "retrieval_recall", "original_match"):
        out.write(f"  {key:<17} {_percent(report, key, interval=key != 'f1'):<18} {REPORT_MEANS[key]}\n")
    if report.get("most_common_share") and report["n"] >= 20:  # a check for one answer given to everything
        out.write(f"  most common answer {report['most_common_answer'][:60]!r}: {100 * report['most_common_share']:.0f}% of answers\n")
    out.write(f"  {report['seconds_per_question']:.2f} s per question\n")

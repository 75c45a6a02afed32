"""The logit of the generator's memory ∅: the marginal likelihood of training questions' answers, and
RAG-Token's exact match, for each θ.

    python -m benchmarks.memory_logit --n 150 --seed 0                      # the likelihood curve per retriever
    python -m benchmarks.memory_logit --n 150 --seed 0 --em-grid 10,12,13,14,16,18,20,21.5 --retrievers hybrid

With memory as a source, p(z|x) is the softmax of the k passages' logits and one more logit, θ, for
∅ (the question read with no passage, by the base weights). For a question x with right answers A,
RAG-Sequence's likelihood is p(A|x) = Σ_z p_θ(z|x) p(A|x,z), where p(A|x,z) sums the answers' own
probabilities (each alias teacher-forced, the ending the engine would write included). The per-source
p(A|x,z) do not depend on θ, so one pass per question records them, for every passage any of the
retrievers ranks in its top k, and the mean log-likelihood is then recomputed for every θ on a grid;
the best θ per retriever is the fit, on that retriever's logit scale. The questions are the
everyday-train set (never the evaluation set); the KB is the page's.

Prints per retriever the grid's mean log p(A|x) and mean p(∅|x) around the best θ, the best θ, and
the same at θ = -inf (memory off) for comparison.

The likelihood rewards a source for giving the right answer some probability, where exact match asks
that it win: on questions no passage answers, memory gives the answer more probability than a wrong
passage does, so the likelihood wants memory everywhere. `--em-grid` asks the same questions with
RAG-Token (greedy) at each θ, beside memory off and closed-book, and prints exact match: what the
default logits (`config.DEFAULT_MEMORY_LOGITS`) were chosen by.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
from dataclasses import replace

import torch

from rag_demo.config import GENERAL_KB, MemoryConfig
from rag_demo.marginalize import doc_logprobs_with_memory
from rag_demo.questions import load_question_set

log = logging.getLogger(__name__)

MAX_ALIASES = 3  # the first aliases of each question: the canonical answer and its commonest short forms


def source_logprobs(engine, question: str, answers, *, kb: str, retrievers, k: int):
    """({retriever: (K,) logits of its top k}, {retriever: (K,) their rows}, {row: log p(A|x,z)},
    log p(A|x,∅)): one score per alias over the union of the retrievers' top k, memory included."""
    logits, rows = {}, {}
    for retriever in retrievers:
        retrieval = engine.retrieve(question, kb=kb, k=k, retriever=retriever)
        logits[retriever] = torch.tensor([p.logit for p in retrieval.passages])
        rows[retriever] = [p.id for p in retrieval.passages]
    union = sorted({row for found in rows.values() for row in found})
    per_alias_rows, per_alias_memory = [], []
    for answer in answers[:MAX_ALIASES]:
        scored = engine.score(question, answer, kb=kb, rows=union, variants=("sequence",), memory=True)
        variant = scored.variants["sequence"]
        per_doc = torch.tensor(variant.doc_token_logprobs).sum(0)  # (U,) log p(a|x,z), rows in `union`'s order
        per_alias_rows.append(per_doc)
        per_alias_memory.append(sum(variant.closed_book_token_logprobs))
    by_row = torch.stack(per_alias_rows).logsumexp(0)  # (U,) log p(A|x,z)
    memory = float(torch.tensor(per_alias_memory).logsumexp(0))
    return logits, rows, {row: float(lp) for row, lp in zip(union, by_row)}, memory


def mean_loglik(records, retriever: str, theta: float | None) -> tuple[float, float]:
    """(mean log p(A|x), mean p(∅|x)) over the records for memory logit θ (None: memory off)."""
    total, memory_mass = 0.0, 0.0
    for logits, rows, by_row, memory in records:
        per_source = torch.tensor([by_row[row] for row in rows[retriever]])  # (K,)
        if theta is None:
            prior = torch.log_softmax(logits[retriever].float(), dim=-1)
            total += float((prior + per_source).logsumexp(0))
            continue
        prior = doc_logprobs_with_memory(logits[retriever][None], theta)[0]  # (K + 1,)
        total += float((prior + torch.cat([per_source, torch.tensor([memory])])).logsumexp(0))
        memory_mass += float(prior[-1].exp())
    return total / len(records), memory_mass / len(records)


def exact_match_grid(engine, args) -> None:
    """RAG-Token's exact match on the same questions with memory off, at each θ of `--em-grid`, and closed-book."""
    from rag_demo.evaluate import evaluate_table, print_table
    from rag_demo.questions import set_eval_questions

    questions = {args.kb: set_eval_questions(args.questions)}
    common = dict(kbs=(args.kb,), ks=(args.k,), n=args.n, seed=args.seed, questions=questions)
    reports = []
    for retriever in args.retrievers.split(","):
        reports += evaluate_table(engine, **common, variants=("token", "closed-book"), retriever=retriever, memory=False)
        for theta in (float(t) for t in args.em_grid.split(",")):
            engine.config = replace(engine.config, memory=MemoryConfig(logit=theta))
            reports += evaluate_table(engine, **common, variants=("token",), retriever=retriever, memory=True)
    if args.json:
        print(json.dumps(reports))
    else:
        print_table(reports)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--kb", default=GENERAL_KB)
    parser.add_argument("--questions", default="everyday-train")
    parser.add_argument("--retrievers", default="hybrid,dense,bm25")
    parser.add_argument("--step", type=float, default=0.5, help="the grid's step, in logits")
    parser.add_argument("--em-grid", default="", metavar="THETAS",
                        help="comma-separated logits: RAG-Token's exact match at each instead of the likelihood")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from rag_demo.serving.loading import engine_from_config

    engine = engine_from_config()
    if args.em_grid:
        exact_match_grid(engine, args)
        return
    engine.config = replace(engine.config, memory=MemoryConfig(logit=0.0))  # any logit: only per-source log-probs are read
    retrievers = [r for r in args.retrievers.split(",") if r in engine.retrievers]
    questions = list(load_question_set(args.questions))
    picked = random.Random(args.seed).sample(questions, min(args.n, len(questions)))
    records = []
    for done, item in enumerate(picked, start=1):
        records.append(source_logprobs(engine, item.question, item.answers, kb=args.kb, retrievers=retrievers, k=args.k))
        if done % 20 == 0:
            log.warning("%d of %d questions read", done, len(picked))
    results = {}
    for retriever in retrievers:
        logits = torch.cat([r[0][retriever] for r in records])
        low, high = math.floor(float(logits.min())) - 4, math.ceil(float(logits.max())) + 4
        grid = [low + i * args.step for i in range(int((high - low) / args.step) + 1)]
        curve = [(theta, *mean_loglik(records, retriever, theta)) for theta in grid]
        best = max(curve, key=lambda row: row[1])
        off, _ = mean_loglik(records, retriever, None)
        results[retriever] = {"best_logit": best[0], "loglik": best[1], "memory_prob": best[2], "loglik_memory_off": off,
                              "curve": curve, "n": len(records), "k": args.k, "kb": args.kb, "questions": args.questions,
                              "seed": args.seed, "passage_logits": [float(logits.min()), float(logits.max())]}
    if args.json:
        print(json.dumps(results))
        return
    for retriever, fit in results.items():
        print(f"\n{retriever} on {fit['kb']}, k = {fit['k']}, {fit['n']} {fit['questions']} questions (seed {fit['seed']}); "
              f"passage logits {fit['passage_logits'][0]:.1f} to {fit['passage_logits'][1]:.1f}")
        print("| θ | mean log p(A|x) | mean p(∅|x) |\n|---|---|---|")
        best = fit["best_logit"]
        for theta, loglik, mass in fit["curve"]:
            if abs(theta - best) <= 3:
                print(f"| {theta:.1f}{' (best)' if theta == best else ''} | {loglik:.3f} | {mass:.3f} |")
        print(f"| memory off | {fit['loglik_memory_off']:.3f} | 0 |")


if __name__ == "__main__":
    main()

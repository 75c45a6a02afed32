"""RAG-Sequence exact match as p(z|x) is made sharper or flatter, from one pass over the questions.

    python -m benchmarks.posterior_sharpness --n 300 --seed 11
    python -m benchmarks.posterior_sharpness --n 300 --seed 11 --kb nq-wiki --multipliers 0.25,0.5,1,2
    python -m benchmarks.posterior_sharpness --n 150 --seed 0 --kb wikipedia --questions everyday-train

p(z|x) is the softmax of the top k's logits (scale * cosine + lexical weight * BM25 on the default).
Multiplying every logit by m keeps the ranking and the retrieved passages, and moves only how much
the retriever's preference weighs against the reader's p(y|x,z) in the marginal: m -> 0 is a plain
average over the k passages, large m reads the first passage alone.

RAG-Sequence's thorough decoding finds its candidates by decoding each passage on its own (p(z|x)
plays no part in that) and then scores every candidate against every passage. So one ask per
question records each candidate's log p(y|x,z) for every z, and the marginal for any m is
recomputed exactly: argmax over candidates of logsumexp_z(log_softmax(m * logits)_z + log p(y|x,z)).
RAG-Token decodes with p(z|x) at each step, so it cannot be replayed; ask it with the engine's own
settings to check a choice. Prints one row per multiplier for each KB: exact match with its 95%
interval, and how many answers differ from m = 1's. The paper's k passages alone: memory is no source
here. `--questions` asks a question set (any of its aliases counts) instead of the KB's own questions.
"""

from __future__ import annotations

import argparse
import logging

import torch

from rag_demo import engine as engine_module
from rag_demo.evaluate import matches_any, sample_questions, wilson_interval
from rag_demo.questions import load_eval_questions, set_eval_questions

log = logging.getLogger(__name__)


class _Recorder:
    """Wraps the engine's RAG-Sequence marginal to keep each candidate's per-passage log-probs."""

    def __init__(self, marginal):
        self.marginal, self.calls = marginal, []

    def __call__(self, token_logprobs, doc_lp, mask):
        out = self.marginal(token_logprobs, doc_lp, mask)
        per_doc = (token_logprobs * mask.unsqueeze(1)).sum(-1)[0]  # (K,) log p(y|x,z)
        self.calls.append((float(out[0]), per_doc.detach().clone(), doc_lp[0].detach().clone()))
        return out


def candidate_table(engine, question: str, *, kb: str, k: int, recorder: _Recorder):
    """([candidate answers], (C, K) log p(y_c|x,z), (K,) log p(z|x)) of one thorough RAG-Sequence ask."""
    recorder.calls.clear()
    result = engine.ask(question, kb=kb, k=k, variants=("sequence",), closed_book=False, sequence_decoding="thorough",
                        memory=False)
    by_score = {}
    for score, per_doc, doc_lp in recorder.calls:
        by_score.setdefault(score, (per_doc, doc_lp))
    answers, rows, doc_lp = [], [], None
    for text, score in result.variants["sequence"].candidates:
        if score not in by_score or len(by_score[score][0]) != len(result.passages):
            continue  # scored against fewer passages (fast decoding): not replayable
        per_doc, doc_lp = by_score[score]
        answers.append(text)
        rows.append(per_doc)
    if not rows:
        raise RuntimeError(f"no candidate of {question!r} was recorded")
    return answers, torch.stack(rows), doc_lp, result.variants["sequence"].answer


def best_answer(answers: list[str], per_doc: torch.Tensor, doc_lp: torch.Tensor, multiplier: float) -> str:
    """The RAG-Sequence answer with p(z|x) ∝ p(z|x)^m. per_doc (C, K), doc_lp (K,)."""
    sharpened = torch.log_softmax(multiplier * doc_lp, dim=-1)  # = log_softmax(m * logits): the constant cancels
    return answers[int(torch.logsumexp(per_doc + sharpened, dim=-1).argmax())]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.posterior_sharpness", description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--kb", action="append", help="repeatable; default: every KB")
    parser.add_argument("--multipliers", default="0,0.25,0.5,0.75,1,1.5,2,4")
    parser.add_argument("--questions", help="a question set (e.g. everyday-train) instead of each KB's own questions")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from rag_demo.config import EngineConfig
    from rag_demo.serving.loading import engine_from_config

    multipliers = [float(m) for m in args.multipliers.split(",")]
    if 1.0 not in multipliers:
        multipliers.append(1.0)
    engine = engine_from_config(EngineConfig())
    recorder = _Recorder(engine_module.rag_sequence_logprob)
    engine_module.rag_sequence_logprob = recorder
    print(f"RAG-Sequence (thorough), k = {args.k}, {args.n} {args.questions or 'held-out'} questions per KB, seed {args.seed}")
    print("| KB | multiplier m | exact match, % (95% CI) | answers that differ from m = 1 |")
    print("|---|---:|---|---:|")
    for kb in args.kb or list(engine.kbs):
        pool = set_eval_questions(args.questions) if args.questions else load_eval_questions(engine.resolve_kb(kb).path)
        questions = sample_questions(pool, args.n, args.seed)
        answers_by_m = {m: [] for m in multipliers}
        for item in questions:
            answers, per_doc, doc_lp, engine_answer = candidate_table(engine, item.question, kb=kb, k=args.k, recorder=recorder)
            if best_answer(answers, per_doc, doc_lp, 1.0) != engine_answer:
                log.warning("replay at m = 1 differs from the engine for %r", item.question)
            for m in multipliers:
                answers_by_m[m].append(best_answer(answers, per_doc, doc_lp, m))
        for m in multipliers:
            hits = sum(matches_any(a, q.answers) for a, q in zip(answers_by_m[m], questions))
            low, high = wilson_interval(hits, len(questions))
            differ = sum(a != b for a, b in zip(answers_by_m[m], answers_by_m[1.0]))
            print(f"| {kb} | {m:g} | {100 * hits / len(questions):.1f} ({100 * low:.1f}-{100 * high:.1f}) | {differ} |", flush=True)


if __name__ == "__main__":
    main()

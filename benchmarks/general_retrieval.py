"""How far retrieval on the general-knowledge base can take a question set: the share of questions some
passage answers at all, and the share whose answer-bearing passage each retriever ranks in its top k.

    python -m benchmarks.general_retrieval --questions everyday-train
    python -m benchmarks.general_retrieval --questions everyday-train --weights 0,0.1,0.2,0.3,0.5,1
    python -m benchmarks.general_retrieval --questions everyday-train --as-typed    # the closing "?" kept too

A passage "answers" a question when its text holds one of the question's aliases as whole words
(`questions.answer_in_text`, the check `eval` uses). "Covered" is that check over every passage of the
base: no retriever can do better, and what it misses is missing from the base or worded otherwise.
The logits are the engine's: `scale · cos(q(x), d(z)) + β · BM25(x, z)` for each β (β = 0 is dense
alone), and BM25 alone. Exhaustive (every passage scored), so the figures are the flat index's.
`--as-typed` adds the same rows with q(x) of the question as typed, closing marks and all (the retriever
reads it without them, `encoders.retrieval_question`), and how many questions the two readings give
another first passage or another top 5.
"""

from __future__ import annotations

import argparse
import logging

import numpy as np
import torch

from rag_demo.config import GENERAL_KB
from rag_demo.evaluate import wilson_interval
from rag_demo.questions import answer_in_text, load_question_set, normalize_answer

KS = (1, 3, 5, 10, 20)


def covering_rows(texts: list[str], normalized: list[str], answers: tuple[str, ...]) -> list[int]:
    """Rows whose text holds one of `answers` as whole words: a substring test first, the exact check after."""
    keys = [normalize_answer(a) for a in answers if normalize_answer(a)]
    return [row for row, text in enumerate(normalized) if any(key in text for key in keys)
            and answer_in_text(texts[row], answers)]


def first_hits(logits: torch.Tensor, covering: list[set[int]], depth: int) -> list[int | None]:
    """Each question's rank (0-based) of its first answer-bearing passage in the top `depth` of (Q, N) logits."""
    ranks = []
    for row_logits, rows in zip(logits, covering):
        top = row_logits.topk(depth).indices.tolist()
        ranks.append(next((rank for rank, row in enumerate(top) if row in rows), None))
    return ranks


def question_set_parser(description: str) -> argparse.ArgumentParser:
    """The options of a benchmark over a question set on a knowledge base: --questions and --kb."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--questions", default="everyday-train", help="a question set (name or JSONL file)")
    parser.add_argument("--kb", default=GENERAL_KB)
    return parser


def load_question_set_run(args: argparse.Namespace):
    """The offline default's engine, the knowledge base `args.kb` and the question set `args.questions`."""
    logging.basicConfig(level=logging.WARNING)
    from rag_demo.serving.loading import engine_from_config

    engine = engine_from_config()
    return engine, engine.resolve_kb(args.kb), load_question_set(args.questions)


def dense_scores(encoder, knowledge, questions) -> torch.Tensor:
    """(Q, N) cosines (inner products for DPR) of the questions with every passage of the base, unscaled."""
    passages = torch.as_tensor(np.ascontiguousarray(knowledge.embeddings, dtype=np.float32))  # (N, D)
    vectors = torch.cat([encoder.encode_questions([q.question for q in questions[i:i + 64]]).float().cpu()
                         for i in range(0, len(questions), 64)])  # (Q, D)
    return vectors @ passages.T


def main(argv: list[str] | None = None) -> None:
    parser = question_set_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--weights", default="0,0.1,0.2,0.3,0.5", help="comma-separated BM25 weights β")
    parser.add_argument("--as-typed", action="store_true", help="also q(x) of the questions as typed, closing marks and all")
    args = parser.parse_args(argv)
    engine, knowledge, questions = load_question_set_run(args)
    encoder = engine.encoder
    passages = torch.as_tensor(np.ascontiguousarray(knowledge.embeddings, dtype=np.float32))  # (N, D)
    dense = encoder.scale * dense_scores(encoder, knowledge, questions)  # (Q, N)
    bm25 = engine.retriever.lexical_index(knowledge)
    lexical = torch.from_numpy(np.stack([bm25.scores(q.question) for q in questions]).astype(np.float32))  # (Q, N)

    texts = list(knowledge.texts)
    normalized = [f" {normalize_answer(t)} " for t in texts]
    covering = [set(covering_rows(texts, normalized, q.answers)) for q in questions]
    n = len(questions)
    covered = sum(bool(rows) for rows in covering)
    low, high = wilson_interval(covered, n)
    print(f"{args.kb}: {len(texts):,} passages; {args.questions}: {n} questions; some passage answers "
          f"{100 * covered / n:.1f}% ({100 * low:.1f}-{100 * high:.1f})\n")
    print("| retriever | " + " | ".join(f"@{k}" for k in KS) + " |")
    print("|---|" + "---|" * len(KS))
    weights = {("dense" if float(w) == 0 else f"dense + {w} · BM25"): float(w) for w in args.weights.split(",")}
    rows = [("BM25 alone", lexical)] + [(name, dense + w * lexical) for name, w in weights.items()]
    if args.as_typed:
        with torch.inference_mode():
            typed = torch.cat([encoder.vectors(encoder.question_model, encoder.tokenizer, [q.question for q in questions[i:i + 64]])
                               .float().cpu() for i in range(0, len(questions), 64)])  # (Q, D)
        typed_dense = encoder.scale * typed @ passages.T  # (Q, N)
        rows += [(f"{name}, as typed", typed_dense + w * lexical) for name, w in weights.items()]
    for name, logits in rows:
        ranks = first_hits(logits, covering, max(KS))
        print(f"| {name} | " + " | ".join(f"{100 * sum(r is not None and r < k for r in ranks) / n:.1f}" for k in KS) + " |")
    if args.as_typed:
        weight = float(args.weights.split(",")[-1])
        read, as_typed = (dense + weight * lexical).topk(5).indices, (typed_dense + weight * lexical).topk(5).indices
        first = int((read[:, 0] != as_typed[:, 0]).sum())
        top5 = sum(set(a.tolist()) != set(b.tolist()) for a, b in zip(read, as_typed))
        print(f"\nβ = {weight}: reading the questions as typed changes the first passage of {first} of {n} "
              f"({100 * first / n:.1f}%) and the top 5 of {top5} ({100 * top5 / n:.1f}%)")


if __name__ == "__main__":
    main()

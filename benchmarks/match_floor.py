"""Where the "no passage is close to the question" notice should start: the dense scores (cosines for the
default encoder) of passages that answer a question, against the best score among passages about other things.

    python -m benchmarks.match_floor --questions everyday-train

For each question: its answer-bearing passage's score (the best-scored passage in its dense top 20 that holds
an alias, `questions.answer_in_text`), and the best score among 5 and among 100 passages drawn at random from
those outside its top 200 that hold no alias (a visitor's text about something else, short and long). Prints
percentiles of each and, for the floor `config.NO_MATCH_SCORE` and its neighbours, the share of answering
passages that would be called far (false alarms) and of unrelated sets that would not (misses).
"""

from __future__ import annotations

import random

import numpy as np

from rag_demo.config import NO_MATCH_SCORE
from rag_demo.questions import normalize_answer

from .general_retrieval import covering_rows, dense_scores, load_question_set_run, question_set_parser

PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)


def main(argv: list[str] | None = None) -> None:
    parser = question_set_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    engine, knowledge, questions = load_question_set_run(args)
    scores = dense_scores(engine.encoder, knowledge, questions)  # (Q, N): what the page shows as "score"
    texts = list(knowledge.texts)
    normalized = [f" {normalize_answer(t)} " for t in texts]
    rng = random.Random(args.seed)
    answering, best_of_5, best_of_100 = [], [], []
    for row, question in zip(scores, questions):
        covering = set(covering_rows(texts, normalized, question.answers))
        top = row.topk(20)
        hits = [float(s) for s, i in zip(top.values, top.indices.tolist()) if i in covering]
        if hits:
            answering.append(max(hits))
        near = set(row.topk(200).indices.tolist()) | covering
        unrelated = [i for i in rng.sample(range(len(texts)), 400) if i not in near][:100]
        best_of_5.append(float(row[unrelated[:5]].max()))
        best_of_100.append(float(row[unrelated].max()))

    print(f"{args.kb}: {len(texts):,} passages; {args.questions}: {len(questions)} questions, "
          f"{len(answering)} with an answer-bearing passage in the dense top 20\n")
    print("| best score of | n | " + " | ".join(f"p{p}" for p in PERCENTILES) + " |")
    print("|---|---|" + "---|" * len(PERCENTILES))
    sets = (("the answer-bearing passage", answering), ("5 unrelated passages", best_of_5),
            ("100 unrelated passages", best_of_100))
    for name, values in sets:
        cut = np.percentile(values, PERCENTILES)
        print(f"| {name} | {len(values)} | " + " | ".join(f"{c:.2f}" for c in cut) + " |")
    print("\n| floor | answering passages below it (false alarms) | 5 unrelated above it | 100 unrelated above it |")
    print("|---|---|---|---|")
    for floor in sorted({NO_MATCH_SCORE - 0.05, NO_MATCH_SCORE, NO_MATCH_SCORE + 0.05}):
        below = np.mean(np.array(answering) < floor)
        above = [np.mean(np.array(values) >= floor) for values in (best_of_5, best_of_100)]
        mark = " (the default)" if floor == NO_MATCH_SCORE else ""
        print(f"| {floor:.2f}{mark} | {100 * below:.1f}% | {100 * above[0]:.1f}% | {100 * above[1]:.1f}% |")


if __name__ == "__main__":
    main()

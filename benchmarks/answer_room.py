"""What the answer-length limit costs and gives, side by side in one run.

    python -m benchmarks.answer_room [--n 12] [--seed 0] [--limits 16,32]

Asks two kinds of question with the page's default ask (both variants, k = 5, memory, Dense + BM25, flat), each at
every limit of `--limits` (`max_new_tokens`), the limits taken in turn question by question so that the machine's
drift falls on all of them alike:
- "what is <title>?" / "who was <title>?" for `--n` articles of the leads drawn with `--seed`
  (`benchmarks.tail_passages.article_question`): an answer that describes, often a sentence;
- `--n` questions of the everyday-train set drawn with the same seed: an answer that names.
Per kind and limit: the share of answers (both variants) cut at the limit, the median seconds of generation per ask,
and how many answers differ from the first limit's.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics

from rag_demo.config import GENERAL_KB
from rag_demo.generation.decoding import reached_length_limit

from benchmarks.tail_passages import article_question


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=12, help="questions of each kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limits", default="16,32", help="comma-separated answer-length limits in tokens")
    args = parser.parse_args(argv)
    limits = [int(x) for x in args.limits.split(",")]
    logging.basicConfig(level=logging.WARNING)
    from rag_demo.offline.leads import ensure_leads
    from rag_demo.questions import load_question_set
    from rag_demo.serving.loading import engine_from_config

    engine = engine_from_config()
    rng = random.Random(args.seed)
    articles = [a for a in json.loads(ensure_leads().read_text(encoding="utf-8")).values() if a["extract"].strip()]
    kinds = {
        "what is / who was <title>?": [article_question(a) for a in rng.sample(articles, args.n)],
        "everyday-train": [q.question for q in rng.sample(list(load_question_set("everyday-train")), args.n)],
    }
    stop_ids = frozenset(engine.generator.stop_ids)
    print(f"{GENERAL_KB}, both variants, k = 5, memory, Dense + BM25, flat; {args.n} questions a kind, seed {args.seed}\n")
    print("| questions | limit, tokens | answers cut at the limit | generate, median s / ask | answers unlike the first limit's |")
    print("|---|---|---|---|---|")
    for kind, questions in kinds.items():
        cut = {limit: 0 for limit in limits}
        seconds = {limit: [] for limit in limits}
        answers = {limit: [] for limit in limits}
        for turn, question in enumerate(questions):
            order = limits if turn % 2 == 0 else limits[::-1]
            for limit in order:
                result = engine.ask(question, kb=GENERAL_KB, max_new_tokens=limit)
                seconds[limit].append(result.timings_ms["generate"] / 1000)
                for variant in result.variants.values():
                    cut[limit] += reached_length_limit(variant.token_ids, limit, stop_ids)
                answers[limit].append(tuple(v.answer for v in result.variants.values()))
        total = 2 * len(questions)
        for limit in limits:
            unlike = sum(a != b for pair_a, pair_b in zip(answers[limits[0]], answers[limit]) for a, b in zip(pair_a, pair_b))
            print(f"| {kind} | {limit} | {cut[limit]} of {total} | {statistics.median(seconds[limit]):.2f} | {unlike} |")


if __name__ == "__main__":
    main()

"""How much choosing between the passages and the generator's memory, question by question, could give.

    python -m benchmarks.memory_choice --n 150 --seed 0

Memory as a source (θ, `config.DEFAULT_MEMORY_LOGITS`) moves RAG-Token's answer to the closed-book one
where no passage matches well. This measures the room for any better way of deciding that: everyday
training questions are asked on the general base with RAG-Token over the top 5 (memory off) and
closed-book, and the table gives each alone, the share either gets right (what a perfect choice
would reach), and, for a few signals a choice could use, the best rule "answer closed-book when the
signal passes a threshold" with the threshold fitted on these very questions (so an optimistic bound
for that signal). The signals: the top passage's retrieval logit (lower: memory), closed-book's mean
token log-probability (the generator's confidence alone), and closed-book's minus RAG-Token's.
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

from rag_demo.config import GENERAL_KB
from rag_demo.evaluate import matches_any, sample_questions, wilson_interval
from rag_demo.offline.prepare import prepare
from rag_demo.questions import set_eval_questions
from rag_demo.serving.loading import engine_from_config


def best_threshold(signal: np.ndarray, closed_right: np.ndarray, rag_right: np.ndarray) -> tuple[float, float]:
    """(the best share right, its threshold) of answering closed-book where `signal >= threshold`.

    >>> best_threshold(np.array([0.0, 1.0]), np.array([False, True]), np.array([True, False]))
    (1.0, 1.0)
    """
    best = (float(rag_right.mean()), float("inf"))
    for threshold in np.unique(signal):
        right = float(np.where(signal >= threshold, closed_right, rag_right).mean())
        if right > best[0]:
            best = (right, float(threshold))
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--questions", default="everyday-train")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    prepare()
    engine = engine_from_config()
    rag_right, closed_right, top_logit, closed_conf, rag_conf = [], [], [], [], []
    for number, item in enumerate(sample_questions(set_eval_questions(args.questions), args.n, args.seed), 1):
        result = engine.ask(item.question, kb=GENERAL_KB, k=5, variants=("token",), closed_book=True, memory=False)
        token, closed = result.variants["token"], result.closed_book
        rag_right.append(matches_any(token.answer, item.answers))
        closed_right.append(matches_any(closed.answer, item.answers))
        top_logit.append(result.passages[0].logit)
        closed_conf.append(float(np.mean(closed.token_logprobs)) if closed.token_logprobs else -np.inf)
        rag_conf.append(float(np.mean(token.token_logprobs)) if token.token_logprobs else -np.inf)
        if number % 25 == 0:
            logging.info("%d questions asked", number)
    rag_right, closed_right = np.array(rag_right), np.array(closed_right)
    n = len(rag_right)

    def cell(share: float) -> str:
        low, high = wilson_interval(round(share * n), n)
        return f"{100 * share:.1f} ({100 * low:.1f}-{100 * high:.1f})"

    rows = [("RAG-Token, memory off", cell(rag_right.mean()), ""), ("closed-book", cell(closed_right.mean()), ""),
            ("either (a perfect choice)", cell((rag_right | closed_right).mean()), "")]
    signals = {"top passage's logit (lower: memory)": -np.array(top_logit),
               "closed-book's mean token log-prob": np.array(closed_conf),
               "closed-book's minus RAG-Token's mean token log-prob": np.array(closed_conf) - np.array(rag_conf)}
    for label, signal in signals.items():
        share, threshold = best_threshold(signal, closed_right, rag_right)
        rows.append((f"closed-book where {label} passes a threshold", cell(share), f"{threshold:.2f}"))
    print(f"\n{args.questions}, {n} questions (seed {args.seed}), {GENERAL_KB}, k = 5, greedy\n")
    print("| answer | exact match, % (95% CI) | threshold fitted here |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

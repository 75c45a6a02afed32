"""How often an answer is right for each line its card shows: its words in a passage read, in the question
itself, from the generator's memory, or backed by nothing on the page (`ui.sentences.evidence`).

    python -m benchmarks.evidence_kinds --questions everyday-train --n 150 --seed 0

Each question is asked as the page asks it (both variants, closed-book, the default base and options); each
variant's answer is put in the kind its card names and scored against the question's aliases. The
sentences module is plain text and imports no gradio.
"""

from __future__ import annotations

import argparse
import logging
from collections import Counter
from collections.abc import Iterator

from rag_demo.config import GENERAL_KB
from rag_demo.evaluate import matches_any, sample_questions, wilson_interval
from rag_demo.questions import SetQuestion, load_question_set
from rag_demo.results import AskResult
from rag_demo.ui.sentences import evidence

KINDS = {"passages": "in a passage read", "question": "in the question itself", "memory": "from the generator's memory",
         "none": "backed by nothing shown"}
SHOWN_WHEN_EMPTY = ("passages", "memory", "none")  # the rest get a row only where some answer is of that kind


def page_asks_arguments(description: str, argv: list[str] | None) -> argparse.Namespace:
    """--questions, --kb, --n and --seed: which questions to ask as the page does (`asked_as_the_page`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--questions", default="everyday-train", help="a question set (name or JSONL file)")
    parser.add_argument("--kb", default=GENERAL_KB)
    parser.add_argument("--n", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def asked_as_the_page(args: argparse.Namespace) -> Iterator[tuple[SetQuestion, AskResult]]:
    """Each of `args.n` questions drawn (seeded) from `args.questions`, asked on `args.kb` with the page's defaults:
    both variants, closed-book, the offline default engine."""
    logging.basicConfig(level=logging.WARNING)
    from rag_demo.serving.loading import engine_from_config

    engine = engine_from_config()
    for item in sample_questions(list(load_question_set(args.questions)), args.n, args.seed):
        yield item, engine.ask(item.question, kb=args.kb)


def main(argv: list[str] | None = None) -> None:
    args = page_asks_arguments(__doc__.split("\n\n")[0], argv)
    tally: Counter = Counter()
    picked = 0
    for item, result in asked_as_the_page(args):
        picked += 1
        for name, variant in result.variants.items():
            kind, _ = evidence(result, variant)
            tally[name, kind or "empty", matches_any(variant.answer, item.answers)] += 1

    print(f"{args.kb}, {args.questions}: {picked} questions (seed {args.seed}); right / answers of that kind, "
          "% (95% CI)\n")
    print("| the card says the answer is | RAG-Token | RAG-Sequence |\n|---|---|---|")
    for kind, words in (*KINDS.items(), ("empty", "empty")):
        cells = []
        for name in ("token", "sequence"):
            right, wrong = tally[name, kind, True], tally[name, kind, False]
            if right + wrong == 0:
                cells.append("-")
                continue
            low, high = wilson_interval(right, right + wrong)
            cells.append(f"{right} / {right + wrong}: {100 * right / (right + wrong):.1f} ({100 * low:.1f}-{100 * high:.1f})")
        if kind in SHOWN_WHEN_EMPTY or cells != ["-", "-"]:
            print(f"| {words} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

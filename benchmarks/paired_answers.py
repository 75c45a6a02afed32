"""Two builds' answers to the same questions, compared question by question.

    python -m rag_demo eval --n 1000 --kb nq-counterfactual --answers before.jsonl    # one build's cache
    python -m rag_demo eval --n 1000 --kb nq-counterfactual --answers after.jsonl     # the other's
    python -m benchmarks.paired_answers before.jsonl after.jsonl

Two builds asked the same questions mostly agree, so the difference of their exact match is
measured far more finely from the questions where they disagree than by setting two intervals side
by side. For each (KB, variant, k) both files hold, on the questions both asked: each build's exact
match, the difference (second minus first) with a 95% interval over the paired per-question
differences, how many questions only one build got right, and McNemar's exact two-sided p (the
chance of a split at least this uneven if neither build were better). Prints one table.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from benchmarks.speed import table

COLUMNS = ("KB", "variant", "k", "questions", "first EM, %", "second EM, %", "second - first, points (95% CI)",
           "only first right", "only second right", "McNemar p")


def read_answers(path: Path) -> dict[tuple, dict[str, bool]]:
    """{(kb, variant, k): {question: exact match}} from an `eval --answers` file."""
    groups: dict[tuple, dict[str, bool]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise SystemExit(f"cannot read {path}: {err.strerror or err}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            key = (record["kb"], record["variant"], record["k"])
            groups.setdefault(key, {})[record["question"]] = bool(record["exact_match"])
        except (ValueError, KeyError, TypeError):
            raise SystemExit(f"{path}, line {number}: not a record of `eval --answers`") from None
    return groups


def mcnemar_p(only_first: int, only_second: int) -> float:
    """Exact two-sided McNemar p: the binomial tail of the smaller count among the discordant pairs.

    >>> mcnemar_p(0, 0), round(mcnemar_p(2, 8), 4)
    (1.0, 0.1094)
    """
    n = only_first + only_second
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_first, only_second) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_row(first: dict[str, bool], second: dict[str, bool]) -> dict | None:
    """The comparison on the questions both asked, or None where they share none."""
    shared = sorted(set(first) & set(second))
    if not shared:
        return None
    n = len(shared)
    diffs = [int(second[q]) - int(first[q]) for q in shared]  # each -1, 0 or 1
    mean = sum(diffs) / n
    spread = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    half = 1.96 * spread / math.sqrt(n)
    only_first, only_second = diffs.count(-1), diffs.count(1)
    return {"questions": n,
            "first EM, %": f"{100 * sum(first[q] for q in shared) / n:.1f}",
            "second EM, %": f"{100 * sum(second[q] for q in shared) / n:.1f}",
            "second - first, points (95% CI)": f"{100 * mean:+.1f} ({100 * (mean - half):+.1f} to {100 * (mean + half):+.1f})",
            "only first right": only_first, "only second right": only_second,
            "McNemar p": f"{mcnemar_p(only_first, only_second):.3f}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.paired_answers", description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="an `eval --answers` file")
    parser.add_argument("second", type=Path, help="another, from the same questions")
    args = parser.parse_args(argv)
    first, second = read_answers(args.first), read_answers(args.second)
    rows = []
    for key in sorted(set(first) & set(second), key=str):
        row = paired_row(first[key], second[key])
        if row is not None:
            kb, variant, k = key
            rows.append({"KB": kb, "variant": variant, "k": "-" if k is None else k, **row})
    if not rows:
        raise SystemExit("the two files share no (KB, variant, k) with a question in common")
    print(table(rows, list(COLUMNS)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

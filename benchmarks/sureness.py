"""How often answers were right by how likely the model found them: the bands of `rag_demo.sureness`.

    python -m rag_demo eval --kb wikipedia --questions everyday-train --variant token --n 150 --seed 0 --k 5 --answers train.jsonl
    python -m rag_demo eval --kb wikipedia --variant token --n 220 --seed 0 --k 5 --answers test.jsonl
    python -m benchmarks.sureness train.jsonl test.jsonl

For each `eval --answers` file and each (KB, variant, k) in it: the answers in each band of p(y|x)
(config.LIKELY_RIGHT_P and LIKELY_WRONG_P), and the share of them that were right with a 95% interval. Answers of
config.LONG_ANSWER_WORDS words or more, which the page gives no band, are counted in a row of their own.
The thresholds were chosen on the training questions; the held-out file says whether they hold. Prints one table.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from benchmarks.speed import table
from rag_demo.evaluate import wilson_interval
from rag_demo.config import LONG_ANSWER_WORDS
from rag_demo.sureness import SURENESS_WORDS, answer_sureness, long_answer

COLUMNS = ["file", "KB", "variant", "k", "band", "answers", "right", "right, % (95% CI)"]


def read_records(path: Path) -> list[dict]:
    """The scored answers of an `eval --answers` file that carry their log p(y|x)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise SystemExit(f"cannot read {path}: {err.strerror or err}") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise SystemExit(f"{path} line {number} is not JSON; give files written by `eval --answers`") from None
        if isinstance(record, dict) and isinstance(record.get("logprob"), (int, float)) and math.isfinite(record["logprob"]):
            records.append(record)
    if not records:
        raise SystemExit(f"{path} has no answer with its log p(y|x); write it with `eval --answers` at this version")
    return records


def band_rows(name: str, records: list[dict]) -> list[dict]:
    rows = []
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault((record["kb"], record["variant"], record["k"]), []).append(record)
    sentence = f"a sentence ({LONG_ANSWER_WORDS}+ words): no band"

    def band_of(record: dict) -> str:
        return sentence if long_answer(record["prediction"]) else answer_sureness(record["logprob"])

    for (kb, variant, k), group in groups.items():
        for band in (*SURENESS_WORDS, sentence):
            picked = [r for r in group if band_of(r) == band]
            right = sum(bool(r["exact_match"]) for r in picked)
            low, high = wilson_interval(right, len(picked)) if picked else (float("nan"), float("nan"))
            share = f"{100 * right / len(picked):.1f} ({100 * low:.1f}-{100 * high:.1f})" if picked else "-"
            rows.append({"file": name, "KB": kb, "variant": variant, "k": k if k is not None else "-", "band": band,
                         "answers": len(picked), "right": right, "right, % (95% CI)": share})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("answers", nargs="+", type=Path, help="files written by `python -m rag_demo eval --answers`")
    args = parser.parse_args(argv)
    rows = [row for path in args.answers for row in band_rows(path.name, read_records(path))]
    print(table(rows, COLUMNS))


if __name__ == "__main__":
    main()

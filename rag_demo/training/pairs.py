"""Question-answer pairs to train the question encoder on, from a CSV or JSONL file: no passage labels needed.

    JSONL  {"question": "...", "answers": ["...", "..."]} per line (the question sets' format), or "answer": "..."
    CSV    a header with a `question` column and an `answer` or `answers` column; several answers split on "|"

The first answer is the one the reader is scored on; any of them marks a passage as holding the answer.
"""

from __future__ import annotations

import csv
from pathlib import Path

from ..errors import InputError
from ..text import jsonl_objects
from ..questions import QUESTION_SETS, question_set_path

QAPair = tuple[str, tuple[str, ...]]


def _answers(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, list) else str(value or "").split("|")
    return tuple(a for a in (str(item).strip() for item in items) if a)


def _from_jsonl(path: Path) -> list[QAPair]:
    pairs = []
    for number, row in jsonl_objects(path, shape='an object {"question": ..., "answers": [...]}'):
        answers = _answers(row.get("answers", row.get("answer")))
        question = str(row.get("question") or "").strip()
        if not question or not answers:
            raise InputError(f'{path} line {number} lacks a "question" or an answer ("answers": [...] or "answer": ...)')
        pairs.append((question, answers))
    return pairs


def _from_csv(path: Path) -> list[QAPair]:
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        columns = [c.strip().lower() for c in reader.fieldnames or []]
        answer_column = next((c for c in ("answers", "answer") if c in columns), None)
        if "question" not in columns or answer_column is None:
            raise InputError(f"{path} needs a header with a 'question' column and an 'answer' (or 'answers') column; "
                             f"it has {', '.join(repr(c) for c in columns) or 'none'}")
        pairs = []
        for number, row in enumerate(reader, start=2):
            row = {str(k).strip().lower(): v for k, v in row.items() if k is not None}
            question, answers = str(row.get("question") or "").strip(), _answers(row.get(answer_column))
            if not question or not answers:
                raise InputError(f"{path} line {number} lacks a question or an answer")
            pairs.append((question, answers))
    return pairs


def load_pairs(source: str | Path) -> list[QAPair]:
    """The (question, answers) pairs of a question set by name ("everyday-train") or of a .jsonl / .csv file."""
    path = question_set_path(source) if str(source) in QUESTION_SETS else Path(source).expanduser()
    if not path.is_file():
        raise InputError(f"no questions file {str(source)!r}; give a .jsonl or .csv file of question-answer pairs "
                         f"or one of {', '.join(QUESTION_SETS)}")
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".csv"):
        raise InputError(f"{path} is neither .jsonl nor .csv; give question-answer pairs in one of those")
    try:
        pairs = _from_csv(path) if suffix == ".csv" else _from_jsonl(path)
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text") from None
    if not pairs:
        raise InputError(f"{path} holds no question-answer pairs")
    return pairs

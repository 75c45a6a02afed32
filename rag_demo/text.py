"""Text from visitors, files and the command line, made safe for the models and for a terminal.

One cleaning serves every entry point, so a question reads the same on the page, through the
API and from the command line.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from pathlib import Path

from .config import LIMITS
from .errors import InputError


def plain_text(text: str) -> str:
    """Text every tokenizer and JSON encoder accepts: control characters and unpaired surrogates
    become spaces; line breaks and tabs stay.

    >>> plain_text("a\\ud800b\\x00c\\nd")
    'a b c\\nd'
    """
    return "".join(ch if ch.isprintable() or ch in "\n\t" else " " for ch in text)


def clean_text(text: str, *, what: str, limit: int = LIMITS.max_question_chars,
               keep_end: bool = False) -> tuple[str, tuple[str, ...]]:
    """`text` as plain words on one line, and the notices the reader should see.

    Empty text is refused; text longer than `limit` is cut to it, with a notice, so that a pasted
    paragraph still gets an answer. `keep_end` keeps its end, from a word's start (a question, which a
    visitor asks after a pasted text); otherwise its start.

    >>> clean_text("  who\\x00wrote\\n it? ", what="question")
    ('who wrote it?', ())
    >>> clean_text("abcdef", what="answer", limit=3)
    ('abc', ('the answer was cut to its first 3 characters',))
    >>> clean_text("a long text. who wrote it?", what="question", limit=15, keep_end=True)
    ('who wrote it?', ('the question was cut to its last 15 characters',))
    """
    if not isinstance(text, str):
        raise InputError(f"the {what} must be text")
    cleaned = " ".join(plain_text(text).split())
    if not cleaned:
        raise InputError(f"the {what} is empty; type a {what}")
    if len(cleaned) > limit and keep_end:
        end = cleaned[-limit:]
        whole_words = end.split(" ", 1)[1] if " " in end and cleaned[-limit - 1] != " " else end
        return whole_words.strip() or end, (f"the {what} was cut to its last {limit:,} characters",)
    if len(cleaned) > limit:
        return cleaned[:limit], (f"the {what} was cut to its first {limit:,} characters",)
    return cleaned, ()


def require_words(text: str, *, what: str) -> str:
    """`text` unchanged, or an InputError when it is blank or marks alone ("?", "..."), in the API's and the
    command line's words (the page says it as a sentence).

    >>> require_words("?!", what="answer")
    Traceback (most recent call last):
    ...
    rag_demo.errors.InputError: the answer '?!' has no words: give the answer in words
    """
    if not text.strip():
        raise InputError(f"the {what} is empty; give a non-blank {what}")
    if not has_words(text):
        remedy = "ask it in words" if what == "question" else f"give the {what} in words"
        raise InputError(f"the {what} {text.strip()[:40]!r} has no words: {remedy}")
    return text


def check_length(text: str, *, what: str, limit: int = LIMITS.max_input_chars) -> str:
    """`text` unchanged, or an InputError when it is longer than anyone should send.

    >>> check_length("x" * 6, what="question", limit=5)
    Traceback (most recent call last):
    ...
    rag_demo.errors.InputError: the question has 6 characters; the limit is 5
    """
    if len(text) > limit:
        raise InputError(f"the {what} has {len(text):,} characters; the limit is {limit:,}")
    return text


def one_line(text: str) -> str:
    """A message as one printable line: control characters (which a question may carry) are shown escaped.

    >>> one_line("unrecognized arguments: \\r\\x1b[31m")
    'unrecognized arguments: \\\\r\\\\x1b[31m'
    """
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def looks_like_path(name: str) -> bool:
    """Whether a name given where a name or a path may go was meant as a path: it holds a folder separator,
    starts with "~" or ".", or ends in a file suffix.

    >>> looks_like_path("wikipedia"), looks_like_path("/data/kb"), looks_like_path("mine.jsonl")
    (False, True, True)
    """
    return any(mark in name for mark in "/\\") or name.startswith(("~", ".")) or bool(Path(name).suffix)


def jsonl_objects(path: Path, *, shape: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSON Lines file someone gave; a line that is
    not JSON, is nested too deeply to read, or is not an object is an InputError naming the line and
    `shape`, what each line should look like."""
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{Path(path).name} line {number} is not valid JSON ({err.msg}); each line needs {shape}") from None
            except RecursionError:
                raise InputError(f"{Path(path).name} line {number} is nested too deeply; each line needs {shape}") from None
            if not isinstance(record, dict):
                raise InputError(f"{Path(path).name} line {number} needs {shape}")
            yield number, record


def has_words(text: str) -> bool:
    """Whether a text is more than punctuation and spaces: "?" or "..." asks nothing. Symbols, emoji and control
    characters count (the engine cleans the last, and says so when nothing is left).

    >>> has_words("?"), has_words(" ... !"), has_words("¿?"), has_words("why?"), has_words("誰?"), has_words("🤔?")
    (False, False, False, True, True, True)
    """
    return not all(ch.isspace() or unicodedata.category(ch).startswith("P") for ch in text)

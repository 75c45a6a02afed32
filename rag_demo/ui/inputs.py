"""Page and API inputs -> engine arguments, and visitors' uploads -> passages. No gradio.

Every function here either returns a value the engine accepts or raises `InputError` with a
message that says what to change. Numbers are checked against `rag_demo.config.LIMITS`, which
the page's controls, the command line and the engine read too.
"""

from __future__ import annotations

import csv
import hashlib
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import LIMITS
from ..retrieval.corpus import SOURCE_SUFFIXES, Passage, read_document_file, split_into_passages
from ..errors import InputError
from ..text import check_length, plain_text


@dataclass(frozen=True)
class UploadLimits:
    """What one visitor may upload for a knowledge base of their own; the page's help text says it too."""

    max_files: int = 5
    max_file_bytes: int = 2_000_000
    max_passages: int = 2_000
    max_paste_chars: int = 200_000

    def describe(self) -> str:
        return (
            f"Up to {self.max_files} files ({', '.join(SOURCE_SUFFIXES)}), {self.max_file_bytes / 1e6:g} MB each, "
            f"and {self.max_passages:,} passages of 100 words in all; .jsonl rows and .csv columns: "
            "'text' and optionally 'title'. Files are read and indexed in memory for this browser tab only; "
            "uploads are deleted from the server when the tab is closed."
        )


def parse_retriever(choice: object) -> str | None:
    """A retriever choice from the page or the API; empty means the engine's default (the engine checks the rest)."""
    return choice or None


MEMORY_WORDS = {"": None, "auto": None, "true": True, "on": True, "false": False, "off": False}


def parse_memory(choice: object) -> bool | None:
    """The API's memory switch -> the engine's `memory`: empty or "auto" means on where this setup has a
    fitted logit (None), true means required (the engine refuses where there is none), false means off.

    >>> parse_memory(None), parse_memory(""), parse_memory(True), parse_memory("off")
    (None, None, True, False)
    """
    if choice is None or isinstance(choice, bool):
        return choice
    word = str(choice).strip().lower()
    if word not in MEMORY_WORDS:
        raise InputError(f"memory must be true, false or empty (on where available), got {str(choice)[:40]!r}")
    return MEMORY_WORDS[word]


def memory_switch(on: object) -> bool | None:
    """The page's checkbox -> the engine's `memory`: ticked is on where available (None), so that a
    setup without a fitted logit answers with the paper's k passages and says so instead of failing.

    >>> memory_switch(True), memory_switch(False)
    (None, False)
    """
    return None if on is None or bool(on) else False


def _whole_number(value: object, *, name: str, most: int) -> int:
    """A page or API number (sliders send floats) as a whole number from 1 to `most`.

    >>> _whole_number(3.0, name="k", most=20)
    3
    """
    try:
        number = int(float(value))
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{name} must be a whole number, got {str(value)[:40]!r}") from None
    if not 1 <= number <= most:
        raise InputError(f"{name} must be between 1 and {most}")
    return number


def parse_k(k: object) -> int:
    return _whole_number(k, name="k", most=LIMITS.max_k)


def parse_beams(beams: object) -> int:
    """The beam slider's value; empty means 1 (greedy)."""
    if beams is None or beams == "":
        return 1
    return _whole_number(beams, name="beams", most=LIMITS.max_beams)


def require_question(question: str | None) -> str:
    if not isinstance(question, str) or not question.strip():
        raise InputError("Type a question first, or click one of the examples.")
    return check_length(question, what="question").strip()


def require_answer(answer: str | None) -> str:
    if not isinstance(answer, str) or not answer.strip():
        raise InputError("Type an answer to score.")
    return check_length(answer, what="answer").strip()


def safe_file_name(name: str) -> str:
    """A file name that stays inside its folder: no path, no leading dots, only plain characters.

    >>> safe_file_name("../../etc/pass wd.txt"), safe_file_name(".."), safe_file_name("C:\\\\x\\\\y.md")
    ('pass_wd.txt', 'upload', 'y.md')
    """
    base = re.split(r"[\\/]", str(name))[-1]
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".")[-100:]
    return cleaned or "upload"


class SessionFiles:
    """Per-session folders for visitors' uploads, under one private temporary root.

    Gradio first stores an upload in its shared upload folder (named by the content's hash);
    `adopt` moves it from there into the visitor's own folder before anything reads it, and
    `drop` deletes that folder when the session ends.
    """

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="rag-demo-sessions-"))

    def folder(self, session: str) -> Path:
        path = self._path(session)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

    def _path(self, session: str) -> Path:
        """The session's folder; gradio makes the id, but it arrives from the browser, so it is cleaned."""
        return self.root / (re.sub(r"[^A-Za-z0-9_-]", "", str(session))[:64] or "anonymous")

    def adopt(self, session: str, files: Sequence[str | Path]) -> list[Path]:
        """Move each uploaded file into the session's folder; a file moved by an earlier build is found there."""
        folder = self.folder(session)
        adopted = []
        for file in files:
            source = Path(file)
            # One subfolder per upload keeps the visitor's file name (a .txt file's stem is its passages' title).
            plain = source.name not in ("", ".", "..") and "\\" not in source.name
            name = source.name if plain else safe_file_name(source.name)
            dest = folder / hashlib.sha256(str(source).encode()).hexdigest()[:12] / name
            if not dest.is_file():
                if not source.is_file() or source.is_symlink():
                    raise InputError(f"{source.name} is no longer on the server; upload it again")
                dest.parent.mkdir(mode=0o700, exist_ok=True)
                shutil.move(source, dest)
            adopted.append(dest)
        return adopted

    def drop(self, session: str) -> None:
        shutil.rmtree(self._path(session), ignore_errors=True)


def _is_binary(path: Path) -> bool:
    with path.open("rb") as handle:
        head = handle.read(8192)
    return b"\x00" in head


def passages_from_inputs(
    files: Sequence[str | Path] | None,
    paste_title: str | None,
    paste_text: str | None,
    *,
    limits: UploadLimits = UploadLimits(),
) -> list[Passage]:
    """Passages from uploaded files and pasted text, within `limits`; InputError says what to fix."""
    paths = [Path(f) for f in (files or [])]
    if len(paths) > limits.max_files:
        raise InputError(f"{len(paths)} files uploaded; the limit is {limits.max_files}. Remove some and build again.")
    passages: list[Passage] = []
    for path in paths:
        name = path.name
        if path.suffix.lower() not in SOURCE_SUFFIXES:
            raise InputError(f"{name}: unsupported file type; upload {', '.join(SOURCE_SUFFIXES)} files")
        size = path.stat().st_size
        if size > limits.max_file_bytes:
            raise InputError(f"{name} is {size / 1e6:.1f} MB; the limit is {limits.max_file_bytes / 1e6:g} MB per file")
        if size == 0:
            raise InputError(f"{name} is empty")
        if _is_binary(path):
            raise InputError(f"{name} looks like a binary file, not text; upload UTF-8 text ({', '.join(SOURCE_SUFFIXES)})")
        try:
            passages.extend(read_document_file(path))
        except csv.Error as err:
            raise InputError(f"{name} is not a readable CSV file ({err}); check its quoting") from None
        if len(passages) > limits.max_passages:
            raise InputError(f"more than {limits.max_passages:,} passages; upload less text")
    text = paste_text or ""
    if text.strip():
        if len(text) > limits.max_paste_chars:
            raise InputError(f"the pasted text has {len(text):,} characters; the limit is {limits.max_paste_chars:,}")
        passages.extend(split_into_passages((paste_title or "").strip() or "Pasted text", text))
    passages = [Passage(plain_text(p.title), plain_text(p.text)) for p in passages]
    passages = [p for p in passages if p.text.strip()]
    if not passages:
        raise InputError("Nothing to index: upload a file or paste some text first.")
    if len(passages) > limits.max_passages:
        raise InputError(f"{len(passages):,} passages; the limit is {limits.max_passages:,}. Upload less text.")
    return passages

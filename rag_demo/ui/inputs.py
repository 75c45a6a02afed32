"""Page and API inputs -> engine arguments, and visitors' uploads -> passages. No gradio.

Every function here either returns a value the engine accepts or raises `InputError` with a
message that says what to change. Numbers are checked against `rag_demo.config.LIMITS`, which
the page's controls, the command line and the engine read too.
"""

from __future__ import annotations

import atexit
import csv
import hashlib
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from ..config import ASK, LIMITS, VARIANTS
from ..retrieval.corpus import SOURCE_SUFFIXES, Passage, read_document_file, split_running_text
from ..errors import InputError
from ..options import BOTH
from ..text import check_length, plain_text, require_words


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
            f"and {self.max_passages:,} passages in all: each paragraph of a .txt or .md file or of pasted text is a "
            "passage, cut at 100 words; .jsonl rows and .csv columns: 'text' and optionally 'title'. Files are read and indexed in memory for this browser tab only; "
            "uploads are deleted from the server when the tab is closed."
        )


def parse_retriever(choice: object) -> str | None:
    """A retriever choice from the page or the API; empty means the engine's default (the engine checks the rest)."""
    return choice or None


# the question encoders of the Ask, Score and Swap tabs: the engine's own, or this visitor's trained one
PACKAGED, TRAINED = "packaged", "trained"


def parse_question_encoder(choice: object) -> str:
    """A tab's question-encoder choice (Ask, Score, Swap); empty means the packaged one.

    >>> parse_question_encoder(None), parse_question_encoder("trained")
    ('packaged', 'trained')
    """
    if choice in (None, "", PACKAGED, TRAINED):
        return str(choice or PACKAGED)
    raise InputError(f"unknown question encoder {str(choice)[:40]!r}; choose {PACKAGED} or {TRAINED}")


SWITCH_WORDS = {"true": True, "on": True, "false": False, "off": False}
MEMORY_WORDS = {"": None, "auto": None, **SWITCH_WORDS}


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


def parse_extractive(choice: object) -> bool:
    """The API's extractive switch: true or false, empty meaning false (free decoding).

    >>> parse_extractive(None), parse_extractive("true"), parse_extractive(False)
    (False, True, False)
    """
    if choice is None or isinstance(choice, bool):
        return bool(choice)
    word = str(choice).strip().lower()
    if word != "" and word not in SWITCH_WORDS:
        raise InputError(f"extractive must be true, false or empty (false), got {str(choice)[:40]!r}")
    return SWITCH_WORDS.get(word, False)


def memory_switch(on: object) -> bool | None:
    """The page's checkbox -> the engine's `memory`: ticked is on where available (None), so that a
    setup without a fitted logit answers with the paper's k passages and says so instead of failing.

    >>> memory_switch(True), memory_switch(False)
    (None, False)
    """
    return None if on is None or bool(on) else False


def _whole_number(value: object, *, name: str, most: int) -> int:
    """A page or API number (sliders send floats) as a whole number from 1 to `most`.

    >>> _whole_number(3.0, name="k", most=20), _whole_number("4", name="k", most=20)
    (3, 4)
    """
    try:
        if isinstance(value, bool):  # JSON true is no count
            raise TypeError
        number = float(value)
        if not number.is_integer():
            raise ValueError
        number = int(number)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{name} must be a whole number, got {str(value)[:40]!r}") from None
    if not 1 <= number <= most:
        raise InputError(f"{name} must be between 1 and {most}")
    return number


def parse_k(k: object) -> int:
    """The k slider's value, or an API call's; empty means the default (ASK.k), as for the API's other values."""
    if k is None or k == "":
        return ASK.k
    return _whole_number(k, name="k", most=LIMITS.max_k)


def parse_beams(beams: object) -> int:
    """The beam slider's value; empty means 1 (greedy)."""
    if beams is None or beams == "":
        return 1
    return _whole_number(beams, name="beams", most=LIMITS.max_beams)


def require_question(question: str | None, *, page: bool = True, examples: bool = True) -> str:
    """The question, stripped; an InputError for none, or one without a letter or digit ("?", "..."), worded for the
    page (pointing to the examples where its tab has some: `examples`) or, with `page` False, for the API."""
    if question is not None and not isinstance(question, str):
        raise InputError(f"the question must be text, got {type(question).__name__} {str(question)[:40]!r}")
    if page and (not question or not question.strip()):
        raise InputError("Type a question first, or click one of the examples." if examples else "Type a question first.")
    return check_length(_worded(question or "", what="question", page=page), what="question").strip()


def require_answer(answer: str | None, *, page: bool = True) -> str:
    """The answer to score, stripped; an InputError for none, or one without a letter or digit, as for questions."""
    if answer is not None and not isinstance(answer, str):
        raise InputError(f"the answer must be text, got {type(answer).__name__} {str(answer)[:40]!r}")
    if page and (not answer or not answer.strip()):
        raise InputError("Type an answer to score.")
    return check_length(_worded(answer or "", what="answer", page=page), what="answer").strip()


def _worded(text: str, *, what: str, page: bool) -> str:
    """`text.require_words`: its lower-case phrase for the API, a sentence on the page."""
    try:
        return require_words(text, what=what)
    except InputError as err:
        if not page:
            raise
        said = str(err)
        raise InputError(f"{said[0].upper()}{said[1:]}.") from None


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
    `drop` deletes that folder when the session ends. Without a `root` given, the temporary root is made on the
    first upload (a page nobody uploads to leaves nothing behind) and removed when the process exits.
    """

    def __init__(self, root: str | Path | None = None):
        self._root = Path(root) if root is not None else None

    @property
    def root(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="rag-demo-sessions-"))
            atexit.register(shutil.rmtree, self._root, ignore_errors=True)
        return self._root

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
        passages.extend(split_running_text((paste_title or "").strip() or "Pasted text", text))
    passages = [Passage(plain_text(p.title), plain_text(p.text)) for p in passages]
    passages = [p for p in passages if p.text.strip()]
    if not passages:
        raise InputError("Nothing to index: upload a file or paste some text first.")
    if len(passages) > limits.max_passages:
        raise InputError(f"{len(passages):,} passages; the limit is {limits.max_passages:,}. Upload less text.")
    return passages


# ---- links to a question ----------------------------------------------------------------------------

LINK_TABS = ("ask", "swap", "mine", "score", "index", "learn", "train")  # the page's tab ids, as `?tab=` names them
# `?tab=` also takes a tab's label, in any case with "-" or "_" for its spaces ("your-knowledge"), or its last word
# where that is no other tab's id ("knowledge"; "index" is the Index variants tab)
TAB_LABELS = {"ask": "ask", "swap": "swap the index", "mine": "your knowledge", "score": "score your answer",
              "index": "index variants", "learn": "learn", "train": "train"}
TAB_ALIASES = {name: tab for tab, label in TAB_LABELS.items() for name in (label.replace(" ", "-"), label.split()[-1])}


def link_tab(raw: str) -> str:
    """A `?tab=` value as the page's tab id: an id, a label or its last word; the value itself when none matches.

    >>> link_tab("Your Knowledge"), link_tab("knowledge"), link_tab("index_variants"), link_tab("nope")
    ('mine', 'mine', 'index', 'nope')
    """
    value = "-".join(str(raw).strip().lower().replace("_", " ").split())
    return value if value in LINK_TABS else TAB_ALIASES.get(value, value)


LINK_VARIANTS = (*VARIANTS, BOTH)


@dataclass(frozen=True)
class PageLink:
    """What a link (`?q=...&kb=...`) asks for; None: the page's own value. `notices` says what was ignored."""

    question: str = ""
    tab: str | None = None
    kb: str | None = None
    variant: str | None = None
    k: int | None = None
    index: str | None = None
    retriever: str | None = None
    memory: bool | None = None
    left: str | None = None  # the Swap tab's two knowledge bases
    right: str | None = None
    notices: tuple[str, ...] = ()

    @property
    def asks(self) -> str | None:
        """Which tab asks on load: "swap" for a Swap link with a question, "ask" for any other; None without one."""
        if not self.question:
            return None
        return "swap" if self.tab == "swap" else "ask"


def parse_link(params: Mapping[str, str], *, kb_names: Sequence[str] | None, index_kinds: Sequence[str],
               retrievers: Sequence[str]) -> PageLink:
    """A link's query parameters -> a `PageLink`. A value the page does not offer is ignored with a
    notice, never an error: the rest of the link still works. `kb_names` None: not known yet (the
    engine is starting), so any name is kept and checked when it is asked.

    >>> link = parse_link({"q": " who wrote hamlet? ", "tab": "Learn", "k": "7", "variant": "nope"},
    ...                   kb_names=["wikipedia"], index_kinds=["flat"], retrievers=["dense"])
    >>> link.question, link.tab, link.k, link.variant, link.asks
    ('who wrote hamlet?', 'learn', 7, None, 'ask')
    >>> link.notices
    ("the link's variant 'nope' is not one of token, sequence, both; the page's is used",)
    """
    notices = []

    def pick(name: str, offered: Sequence[str] | None, *, lower: bool = True) -> str | None:
        raw = params.get(name)
        if raw is None or not str(raw).strip():
            return None
        value = str(raw).strip().lower() if lower else str(raw).strip()
        if offered is None or value in offered:
            return value[:200]
        notices.append(f"the link's {name} {value[:60]!r} is not one of {', '.join(offered)}; the page's is used")
        return None

    question = " ".join(plain_text(str(params.get("q", ""))).split())[: LIMITS.max_input_chars]

    def parsed(name: str, parse):
        if not params.get(name):
            return None
        try:
            return parse(params[name])
        except InputError as err:
            notices.append(f"the link's {name} is ignored: {err}")
            return None

    k, memory = parsed("k", parse_k), parsed("memory", parse_memory)
    if params.get("tab"):
        params = {**params, "tab": link_tab(params["tab"])}
    return PageLink(
        question=question, tab=pick("tab", LINK_TABS), kb=pick("kb", kb_names, lower=False),
        variant=pick("variant", LINK_VARIANTS), k=k, index=pick("index", index_kinds),
        retriever=pick("retriever", retrievers), memory=memory, left=pick("left", kb_names, lower=False),
        right=pick("right", kb_names, lower=False), notices=tuple(notices))


def link_query(tab: str, question: str | None, **options: object) -> str:
    """The query string of a link to `question` on `tab` with these options; empty options are left out.

    >>> link_query("ask", "who wrote hamlet?", kb="wikipedia", variant="both", k=5.0, memory=False, index=None)
    '?tab=ask&q=who+wrote+hamlet%3F&kb=wikipedia&variant=both&k=5&memory=false'
    """
    pairs = [("tab", tab)]
    if question and question.strip():
        pairs.append(("q", " ".join(question.split())[: LIMITS.max_input_chars]))
    for name, value in options.items():
        if value is None or value == "":
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        pairs.append((name, str(value)))
    return "?" + urlencode(pairs)

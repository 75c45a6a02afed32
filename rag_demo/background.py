"""The engine behind the page, built in a background thread so that a first start shows progress.

`Engine` is what the page needs of `rag_demo.engine.RagEngine`; `BackgroundEngine` is one that is
still being built: until it is ready, every call raises `EngineNotReady`, whose message says how
far the build has come.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from . import heap
from .corpus import KnowledgeBase, Passage
from .errors import RagDemoError
from .progress import Progress, eta_text
from .results import AskResult, IndexReport, RetrieverComparison

log = logging.getLogger(__name__)

class Engine(Protocol):
    """What the UI needs from `rag_demo.engine.RagEngine`."""

    @property
    def kb_names(self) -> tuple[str, ...]: ...

    @property
    def default_kb(self) -> str: ...

    @property
    def lexical_weight(self) -> float: ...  # BM25's weight for hybrid retrieval; 0: no hybrid

    @property
    def retrievers(self) -> tuple[str, ...]: ...  # those it offers: dense and bm25, and hybrid with a lexical weight

    def ask(self, question: str, *, kb: str | KnowledgeBase, k: int = 5, index: str = "flat",
            variants: tuple[str, ...] = ("token", "sequence"), num_beams: int = 1,
            sequence_decoding: str = "thorough", max_new_tokens: int = 16, closed_book: bool = True,
            retriever: str | None = None, extractive: bool | None = None, progress: Progress | None = None) -> AskResult: ...

    def score(self, question: str, answer: str, *, kb: str | KnowledgeBase, k: int = 5, index: str = "flat",
              variants: tuple[str, ...] = ("token", "sequence"), retriever: str | None = None,
              progress: Progress | None = None) -> AskResult: ...

    def compare_retrievers(self, question: str, *, kb: str | KnowledgeBase, k: int = 5) -> RetrieverComparison: ...

    def index_reports(self, kb: str | KnowledgeBase) -> list[IndexReport]: ...

    def build_kb(self, name: str, passages: list[Passage], *, progress: Progress | None = None) -> KnowledgeBase: ...

    def example_questions(self, kb: str, n: int = 8) -> list[str]: ...


class EngineNotReady(RagDemoError):
    """The engine is still being prepared (first start) or failed to start."""


class BackgroundEngine:
    """Builds the engine in a thread so the page can show progress instead of failing on first start.

    `factory(progress)` returns the engine; `progress(stage, done, total)` is reported on the page.
    Until it is ready every engine method raises `EngineNotReady`, whose message the page shows.
    """

    def __init__(self, factory: Callable[[Progress], Engine]):
        self._factory = factory
        self._engine: Engine | None = None
        self._error: str | None = None
        self._stage: tuple[str, int, int] = ("starting", 0, 0)
        self._started = time.monotonic()
        self._stage_started = self._started
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> BackgroundEngine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._build, name="engine-build", daemon=True)
            self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the engine is ready or failed; True when ready."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.ready

    def _progress(self, stage: str, done: int, total: int) -> None:
        with self._lock:
            if str(stage) != self._stage[0]:
                self._stage_started = time.monotonic()
            self._stage = (str(stage), int(done), int(total))

    def _build(self) -> None:
        try:
            engine = self._factory(self._progress)
        except RagDemoError as err:
            log.error("engine failed to start: %s", err)
            self._error = str(err)
        except Exception as err:  # a thread boundary: record it for the page, keep the server up
            log.exception("engine failed to start")
            self._error = f"{type(err).__name__}: {err}"
        else:
            self._engine = engine

    @property
    def ready(self) -> bool:
        return self._engine is not None

    @property
    def failed(self) -> bool:
        return self._error is not None

    def status_text(self) -> str:
        if self._error is not None:
            return f"The demo could not start: {self._error}"
        if self._engine is not None:
            return "ready"
        with self._lock:
            stage, done, total = self._stage
            stage_started = self._stage_started
        now = time.monotonic()
        count = ""
        if total:
            eta = eta_text(done, total, now - stage_started)
            count = f" ({done:,}/{total:,}{', ' + eta if eta else ''})"
        return (f"Preparing models and indexes: {stage}{count}; {now - self._started:.0f} s so far. "
                "A first start builds its caches (minutes); later starts load them (seconds).")

    def _get(self) -> Engine:
        if self._engine is None:
            raise EngineNotReady(self.status_text() + (" Restart the app once fixed." if self.failed else " Try again in a moment."))
        return self._engine

    @property
    def kb_names(self) -> tuple[str, ...]:
        return self._get().kb_names

    @property
    def default_kb(self) -> str:
        return self._get().default_kb

    @property
    def lexical_weight(self) -> float:
        return self._get().lexical_weight

    @property
    def retrievers(self) -> tuple[str, ...]:
        return self._get().retrievers

    def ask(self, question: str, **options: Any) -> AskResult:
        try:
            return self._get().ask(question, **options)
        finally:
            heap.release_free_memory()  # a long-running server: see rag_demo.heap

    def score(self, question: str, answer: str, **options: Any) -> AskResult:
        try:
            return self._get().score(question, answer, **options)
        finally:
            heap.release_free_memory()

    def compare_retrievers(self, question: str, *, kb: str | KnowledgeBase, k: int = 5) -> RetrieverComparison:
        return self._get().compare_retrievers(question, kb=kb, k=k)

    def index_reports(self, kb: str | KnowledgeBase) -> list[IndexReport]:
        return self._get().index_reports(kb)

    def build_kb(self, name: str, passages: list[Passage], *, progress: Progress | None = None) -> KnowledgeBase:
        return self._get().build_kb(name, passages, progress=progress)

    def example_questions(self, kb: str, n: int = 8) -> list[str]:
        return self._get().example_questions(kb, n)

    def release_kb(self, kb: KnowledgeBase) -> None:
        release = getattr(self._get(), "release_kb", None)
        if release is not None:
            release(kb)


def engine_ready(engine: Engine) -> bool:
    """Plain engines are always ready; a `BackgroundEngine` says so itself."""
    return bool(getattr(engine, "ready", True))

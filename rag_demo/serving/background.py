"""The engine behind the page, built in a background thread so that a first start shows progress.

`BackgroundEngine` forwards the engine interface (`serving.interface.Engine`) to an engine that is
still being built: until one is ready, every call raises `EngineNotReady`, whose message says how
far the build has come.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, is_dataclass, replace
from typing import Any

from ..errors import RagDemoError
from ..progress import Progress, eta_text
from . import heap
from .interface import READING_CALLS, TRAINING_CALLS, BuildStatus, Engine, forwarding, not_ready

log = logging.getLogger(__name__)

LONGEST_PAUSE_S = 30.0  # the build steps aside for visitors' calls at most this long at a time


class Answering:
    """Counts the calls that answer a visitor, so that a build running beside them can step aside.

    On 2 cores a first start's build (embedding, fine-tuning) and an ask share the cores, and the
    ask took up to twice as long. The build reports progress after every batch or step; there it waits
    while a call answers (`step_aside`): at most LONGEST_PAUSE_S at a time, and only while its
    waits add up to less than the time it has run, so that steady asking slows it by half at most."""

    def __init__(self) -> None:
        self._calls = 0
        self._changed = threading.Condition()
        self._began = time.monotonic()
        self._waited = 0.0

    def __enter__(self) -> Answering:
        with self._changed:
            self._calls += 1
        return self

    def __exit__(self, *exc_info) -> None:
        with self._changed:
            self._calls -= 1
            self._changed.notify_all()

    @property
    def calls(self) -> int:
        return self._calls

    def step_aside(self) -> float:
        """Wait while a visitor's call runs, within the bounds above; the seconds waited."""
        now = time.monotonic()
        limit = min(LONGEST_PAUSE_S, (now - self._began) - 2 * self._waited)  # after this wait too: waited <= ran
        with self._changed:
            if self._calls == 0 or limit <= 0:
                return 0.0
            self._changed.wait_for(lambda: self._calls == 0, timeout=limit)
        waited = time.monotonic() - now
        self._waited += waited
        log.debug("the build stepped aside %.1f s for a visitor's call", waited)
        return waited


@dataclass(frozen=True)
class Stage:
    """One engine of a first start, serving while the rest of the build goes on."""

    engine: Engine
    serving: str = ""  # which parts answer, e.g. "BM25 retrieval and the base generator"
    building: str = ""  # what is still being built, e.g. "dense vectors are building (2 of 4)"; "" when complete


@forwarding
class BackgroundEngine:
    """Builds the engine in a thread so the page can show progress instead of failing on first start.

    `factory(progress)` returns the engine, or yields `Stage`s: each engine that can serve while
    the build goes on, the last one complete. Each is swapped in as it comes; an ask already
    running finishes on the engine it started on. `progress(stage, done, total)` is reported on
    the page. Until the first engine is ready every engine method raises `EngineNotReady`, whose
    message the page shows; while later parts build, every answer says which parts gave it.
    """

    def __init__(self, factory: Callable[[Progress], Engine | Iterator[Stage]], *,
                 on_change: Callable[[], None] | None = None):
        self._factory = factory
        self._on_change = on_change or (lambda: None)  # told of each progress report, swap and failure
        self._current: Stage | None = None
        self._served = 0  # engines swapped in so far
        self._error: str | None = None
        self._stage: tuple[str, int, int] = ("starting", 0, 0)
        self._started = time.monotonic()
        self._stage_started = self._started
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.answering = Answering()  # the visitors' calls in flight, which the build steps aside for

    def start(self) -> BackgroundEngine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._build, name="engine-build", daemon=True)
            self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the build has finished or failed; True when the complete engine is serving."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.complete

    def _progress(self, stage: str, done: int, total: int) -> None:
        with self._lock:
            if str(stage) != self._stage[0]:
                self._stage_started = time.monotonic()
            self._stage = (str(stage), int(done), int(total))
        self._on_change()
        if self._current is not None:  # an engine serves: its answers come before the next batch
            self.answering.step_aside()

    def _serve(self, stage: Stage) -> None:
        with self._lock:
            self._current = stage
            self._served += 1
        self._on_change()
        log.info("serving with %s%s", stage.serving or "the engine", f"; {stage.building}" if stage.building else "")

    def _build(self) -> None:
        try:
            built = self._factory(self._progress)
            for stage in (built if isinstance(built, Iterator) else [Stage(built)]):
                self._serve(stage)
        except RagDemoError as err:
            log.error("engine failed to start: %s", err)
            self._error = str(err)
        except Exception as err:  # a thread boundary: record it for the page, keep the server up
            log.exception("engine failed to start")
            self._error = f"{type(err).__name__}: {err}"
        self._on_change()

    @property
    def ready(self) -> bool:
        """An engine is serving (perhaps not yet the complete one)."""
        return self._current is not None

    @property
    def complete(self) -> bool:
        """The complete engine is serving: nothing is being built any more."""
        current = self._current
        return current is not None and not current.building

    @property
    def engines_served(self) -> int:
        return self._served

    @property
    def failed(self) -> bool:
        """The build stopped before any engine could serve."""
        return self._error is not None and self._current is None

    def _progress_text(self) -> str:
        with self._lock:
            stage, done, total = self._stage
            stage_started = self._stage_started
        count = ""
        if total:
            eta = eta_text(done, total, time.monotonic() - stage_started)
            count = f" ({done:,}/{total:,}{', ' + eta if eta else ''})"
        return f"{stage}{count}"

    def status_text(self) -> str:
        current, error = self._current, self._error
        elapsed = f"{time.monotonic() - self._started:.0f} s so far"
        if current is None:
            if error is not None:
                return f"The demo could not start: {error}"
            return (f"Preparing models and indexes: {self._progress_text()}; {elapsed}. "
                    "A first start builds its caches (minutes); later starts load them (seconds).")
        if not current.building:
            return "ready"
        if error is not None:
            return (f"Answering with {current.serving}; building the rest failed: {error}. "
                    "Restart the app to try again.")
        return (f"Answering now with {current.serving}; {current.building}: {self._progress_text()}; {elapsed}. "
                "Answers get better as each part is ready, with no restart.")

    def status(self) -> dict:
        """The build as data, for the API (`BuildStatus`)."""
        current = self._current
        stage, done, total = self._stage
        return BuildStatus(status=self.status_text(), seconds=round(time.monotonic() - self._started, 1),
                           ready=current is not None, complete=self.complete, engines_served=self._served,
                           serving=current.serving if current else "", building=current.building if current else "",
                           step=stage, done=done, total=total, error=self._error or "").to_json()

    def _get(self) -> Stage:
        current = self._current
        if current is None:
            raise not_ready(self.status_text(), failed=self.failed)
        return current

    def _noted(self, stage: Stage, notices: tuple[str, ...]) -> tuple[str, ...]:
        if not stage.building:
            return notices
        return (*notices, f"answered with {stage.serving} while the rest is built: {stage.building}")

    def _field(self, name: str) -> Any:
        return getattr(self._get().engine, name)

    def _forward(self, name: str, args: tuple, kwargs: dict) -> Any:
        """`name(*args, **kwargs)` on the engine serving now, which answers the whole call whatever is
        swapped in meanwhile; a visitor's call makes the build step aside, and its notices say which
        parts answered while the rest builds."""
        if name in TRAINING_CALLS:  # the runs find the engine serving now themselves; an ask's notices name it
            stage, call = self._current, getattr(self._training_runs(), name)
        else:
            stage = self._get()
            call = getattr(stage.engine, name)
        if name in READING_CALLS:
            return call(*args, **kwargs)
        try:
            with self.answering:
                result = call(*args, **kwargs)
        finally:
            heap.release_free_memory()  # a long-running server: see rag_demo.serving.heap
        if stage is not None and is_dataclass(result) and isinstance(getattr(result, "notices", None), tuple):
            return replace(result, notices=self._noted(stage, result.notices))
        return result

    # -- visitors' runs training the question encoder (`retriever_training.TrainingRuns`), on the engine serving now
    def _training_runs(self):
        from .retriever_training import TrainingRuns

        with self._lock:
            if getattr(self, "_training", None) is None:
                self._training = TrainingRuns(lambda: self._get().engine)
            return self._training


def default_engines(progress: Progress, *, extra_kb_paths: dict[str, str] | None = None) -> Iterator[Stage]:
    """The real engine with the default config, in stages on a first start (heavy imports happen
    here, not at import time): BM25 and the base generator answer within minutes, and each part
    built afterwards is swapped in (`rag_demo.offline.prepare` says which). A warm start yields the
    complete engine at once. `extra_kb_paths` (name -> KB folder) are loaded first, memory-mapped
    where large, and follow the default KBs; a folder that cannot be read stops the start with its
    reason."""
    from ..config import EngineConfig
    from .featured import feature_checked_examples
    from .loading import load_kbs, staged_default_engines

    extra_kbs = load_kbs(extra_kb_paths) if extra_kb_paths else None
    stages = staged_default_engines(EngineConfig(), progress=progress, extra_kbs=extra_kbs)
    for engine, readiness in stages:
        engine.retriever.warm_up()  # BM25 and the indexes before the first ask, not during it
        if not readiness.complete:
            yield Stage(engine, readiness.serving(), readiness.building())
            continue
        # Full quality serves at once; what follows only orders the example questions (asked once per
        # setup, saved) and warms the caches, and a visitor's ask meanwhile just shares the cores.
        yield Stage(engine, readiness.serving())
        # The build ends here and lets go of the cache's lock (`offline.cache.build_lock`): a command run beside
        # the page would otherwise wait out the minutes below
        next(stages, None)
        feature_checked_examples(engine, progress=progress)
        progress("warming up: one example question", 0, 1)
        seconds = engine.warm_up()
        progress("warming up: one example question", 1, 1)
        log.info("warm-up ask took %.1f s", seconds)
        _read_ahead_for_training(engine, progress)
        heap.release_free_memory()  # loading parsed large files (the tokenizer's JSON) into memory now free


def _read_ahead_for_training(engine, progress: Progress) -> None:
    """The Train tab's default run reads its questions' passages first (minutes on 2 cores): do it now, once, so a
    visitor's first run trains at once. Best effort: a failure leaves the reading to the run, as before."""
    from .retriever_training import TrainingRuns

    started = time.perf_counter()
    try:
        read = TrainingRuns(lambda: engine).read_ahead(progress=progress)
    except Exception:  # noqa: BLE001 - the page serves at full quality already; a run reads what it needs itself
        log.exception("reading the Train tab's questions ahead failed; a run will read them itself")
        return
    if read:
        log.info("read %d passages ahead for the Train tab in %.0f s", read, time.perf_counter() - started)

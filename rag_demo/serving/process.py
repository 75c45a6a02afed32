"""The engine in a process of its own, beside the page's, so that a start uses both cores.

Loading the engine (torch, transformers, the models) and importing gradio both run Python under
the interpreter lock: in one process they take turns, however many cores there are. `EngineProcess`
builds the engine in a child process (a `BackgroundEngine` there, from a picklable factory) while
the parent imports gradio and builds the page, and then forwards each engine call over a pipe. It
offers what the page asks of a `BackgroundEngine`: the `Engine` protocol, the build's status, and
`progress` callbacks, which the child reports back while a call runs and the caller's thread calls.

Reading the build's status never calls the child: it pushes its status whenever the build moves
(and each second while it builds), and the page reads the last one here. A call answered by the
child's main thread would take the interpreter lock from the build each time, and the page and
its visitors ask for the status often: polled every 50 ms, a warm start took 2 s longer.

Calls and answers are pickled: arguments and results are plain data (a visitor's own KB crosses
whole, and is small: uploads are capped). An exception raised in the child is raised again in the
caller, as itself where it pickles. If the child stops (killed for memory, say), every call in
flight and every later one raises `EngineNotReady` naming its exit code, and the status says so.

Set RAG_DEMO_ENGINE_PROCESS=0 to keep the engine in the page's process instead, in a thread (one
process to debug or profile, at the cost of the slower start).
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import RagDemoError
from ..progress import Progress
from . import heap
from .background import BackgroundEngine, Stage
from .interface import ENGINE_CALLS, ENGINE_FIELDS, TRAINING_CALLS, BuildStatus, EngineNotReady, forwarding, not_ready

log = logging.getLogger(__name__)

# What the page may call in the child (the engine interface, the training runs, waiting for the build); anything
# else is refused there.
METHODS = frozenset({*ENGINE_CALLS, *TRAINING_CALLS, "wait"})
CALL_THREADS = 8  # calls answered at once in the child; the page runs one engine call at a time
STATUS_EVERY_S = 1.0  # while building: the status's "N s so far" and time left move on
STATUS_AT_MOST_S = 0.25  # between two pushes: an embedding run reports progress many times a second
STATUS_ID = -1  # the call id of a pushed status


def engine_process_wanted(environ: Mapping[str, str]) -> bool:
    """RAG_DEMO_ENGINE_PROCESS=0 (or false/no/off) keeps the engine in the page's process.

    >>> engine_process_wanted({}), engine_process_wanted({"RAG_DEMO_ENGINE_PROCESS": "0"})
    (True, False)
    """
    return environ.get("RAG_DEMO_ENGINE_PROCESS", "1").strip().lower() not in ("0", "false", "no", "off")


@forwarding
class EngineProcess:
    """A `BackgroundEngine` in a child process, called over a pipe (see the module's docstring).

    `factory` must pickle: a module-level function, or a `functools.partial` of one.
    """

    def __init__(self, factory: Callable[[Progress], Any | Iterator[Stage]], *, log_level: int | None = None):
        self._factory = factory
        self._log_level = logging.getLogger().getEffectiveLevel() if log_level is None else log_level
        self._ids = itertools.count()
        self._waiting: dict[int, queue.SimpleQueue] = {}
        self._lock = threading.Lock()  # guards _waiting and _stopped, and one send at a time
        self._stopped: str | None = None  # why the child is gone
        self._snapshot: dict = {}  # the child's last pushed status (see `status_snapshot`)
        self._process = None
        self._connection = None
        self._started = time.monotonic()

    def start(self) -> EngineProcess:
        if self._process is not None:
            return self
        from multiprocessing.connection import Connection

        # A plain child (`python -m rag_demo.serving.process FD`) rather than multiprocessing's spawn,
        # which would run the parent's main script again in the child; the factory is its first message.
        ours, theirs = socket.socketpair()
        package_root = str(Path(__file__).resolve().parents[1])
        environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH"))))}
        self._process = subprocess.Popen([sys.executable, "-m", "rag_demo.serving.process", str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), env=environ)
        theirs.close()
        self._connection = Connection(ours.detach())
        self._connection.send(list(sys.path))  # first, so that the factory's module imports there
        self._connection.send((self._factory, self._log_level))
        threading.Thread(target=self._read, name="engine-answers", daemon=True).start()
        return self

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def stop(self, timeout: float = 10.0) -> None:
        """End the child: asked over the pipe (closing it would not wake this side's reader), then
        terminated if it lingers."""
        if self._process is None:
            return
        with self._lock:
            try:
                self._connection.send(("stop", -1, "", (), {}, False))
            except (OSError, ValueError):  # already gone
                pass
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.terminate()
            self._process.wait(timeout)

    # ---- the pipe -------------------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            try:
                kind, call_id, *payload = self._connection.recv()
            except (EOFError, OSError):
                break
            if kind == "status":
                self._snapshot = payload[0]
                continue
            with self._lock:
                waiting = self._waiting.get(call_id)
            if waiting is not None:
                waiting.put((kind, payload))
        try:
            code = self._process.wait(5)
        except subprocess.TimeoutExpired:  # the pipe broke but the child lingers: it can serve nobody
            self._process.kill()
            code = self._process.wait()
        how = f"was killed (signal {-code}; out of memory?)" if code is not None and code < 0 else f"exited (code {code})"
        why = f"The engine's process {how}; see the server log, and restart the app."
        with self._lock:
            self._stopped = why
            waiting = list(self._waiting.values())
        for each in waiting:
            each.put(("stopped", [why]))

    def _call(self, name: str, args: tuple, kwargs: dict) -> Any:
        """`name(*args, **kwargs)` on the child's `BackgroundEngine`, with `progress` reported here."""
        kwargs = dict(kwargs)
        progress = kwargs.pop("progress", None)
        call_id = next(self._ids)
        answers: queue.SimpleQueue = queue.SimpleQueue()
        with self._lock:
            if self._stopped is not None:
                raise EngineNotReady(self._stopped)
            if self._process is None:
                raise EngineNotReady("The engine's process was not started.")
            self._waiting[call_id] = answers
            try:
                self._connection.send(("call", call_id, name, args, kwargs, progress is not None))
            except (OSError, ValueError) as err:
                del self._waiting[call_id]
                raise EngineNotReady(f"The engine's process cannot be reached ({err}); restart the app.") from None
            except Exception as err:  # an argument that does not pickle: the caller's mistake, said plainly
                del self._waiting[call_id]
                raise RagDemoError(f"cannot send {name}'s arguments to the engine's process: {err}") from None
        try:
            while True:
                kind, payload = answers.get()
                if kind == "progress":
                    progress(*payload)
                elif kind in ("result", "error"):
                    value = _unpickled(payload[0])
                    if kind == "error":
                        raise value
                    return value
                else:  # "stopped"
                    raise EngineNotReady(payload[0])
        finally:
            with self._lock:
                self._waiting.pop(call_id, None)

    # ---- what the page reads: the child's last pushed status ------------------------------------
    def _field(self, name: str) -> Any:
        snapshot = self._snapshot
        if self._stopped is None and name in snapshot.get("engine", {}):
            return snapshot["engine"][name]
        raise not_ready(self.status_text(), failed=self.failed)

    @property
    def ready(self) -> bool:
        return bool(self.status()["ready"])

    @property
    def complete(self) -> bool:
        return bool(self.status()["complete"])

    @property
    def engines_served(self) -> int:
        return int(self.status()["engines_served"])

    @property
    def failed(self) -> bool:
        return self._stopped is not None or bool(self._snapshot.get("failed"))

    def status_text(self) -> str:
        return self.status()["status"]

    def status(self) -> dict:
        """The build as data (`BackgroundEngine.status`), as the child last pushed it."""
        if self._stopped is None and "status" in self._snapshot:
            return dict(self._snapshot["status"])
        return BuildStatus(status=self._stopped or "The engine's process is starting.",
                           seconds=round(time.monotonic() - self._started, 1), error=self._stopped or "").to_json()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the build has finished or failed; True when the complete engine is serving."""
        return self._call("wait", (timeout,), {})

    # ---- what the page asks: the engine interface, each call checked here (`forwarding`) ----------
    def _forward(self, name: str, args: tuple, kwargs: dict) -> Any:
        return self._call(name, args, kwargs)


# ---- the child ------------------------------------------------------------------------------------
def main(argv: list[str]) -> None:
    """`python -m rag_demo.serving.process FD`: FD is this end of the pipe; the first message on it
    is the parent's import path, the second the factory and the log level."""
    import signal
    from multiprocessing.connection import Connection

    # Ctrl-C in a terminal reaches the whole process group: the page's process stops, and this one
    # ends when the pipe closes, without a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    connection = Connection(int(argv[0]))
    try:
        path = connection.recv()
        sys.path[:] = [*path, *(entry for entry in sys.path if entry not in path)]
        factory, log_level = connection.recv()
    except (EOFError, OSError):
        return
    serve(connection, factory, log_level)


def serve(connection, factory: Callable[[Progress], Any | Iterator[Stage]], log_level: int) -> None:
    """The child's whole life: build the engine in a thread, push its status, answer calls until
    the pipe closes."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    heap.limit_arenas(2)  # see rag_demo.serving.heap: the call threads share two malloc arenas
    sending = threading.Lock()

    def send(message: tuple) -> None:
        with sending:
            try:
                connection.send(message)
            except (OSError, ValueError):  # the page's process is gone; the loop below ends too
                pass

    status = StatusPusher(send)
    engine = BackgroundEngine(factory, on_change=status.changed)
    status.engine = engine
    status.push()  # the page knows at once that the build has begun
    engine.start()
    threading.Thread(target=status.run, name="engine-status", daemon=True).start()

    def answer(call_id: int, name: str, args: tuple, kwargs: dict) -> None:
        reply = _answer(call_id, lambda: _call_method(engine, name, args, kwargs))
        status.push()  # what the page reads after a call reflects at least what the call saw
        send(reply)

    with ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix="engine-call") as calls:
        while True:
            try:
                op, call_id, name, args, kwargs, wants_progress = connection.recv()
            except (EOFError, OSError):
                break
            if op == "stop":
                break
            if wants_progress:
                kwargs["progress"] = _progress_sender(send, call_id)
            calls.submit(answer, call_id, name, args, kwargs)
    os._exit(0)  # the page is gone: a build thread still running has nobody to serve


class StatusPusher:
    """Sends the engine's status to the page's process when it changes: at once after a swap or a
    failure, at most every `STATUS_AT_MOST_S` while progress is reported, and each `STATUS_EVERY_S`
    while a build runs (its clock moves on); never while nothing happens."""

    def __init__(self, send: Callable[[tuple], None]):
        self.engine: BackgroundEngine | None = None
        self._send = send
        self._changed = threading.Event()
        self._lock = threading.Lock()
        self._last: dict | None = None

    def changed(self) -> None:
        self._changed.set()

    def push(self) -> None:
        with self._lock:
            snapshot = status_snapshot(self.engine)
            if snapshot != self._last:
                self._last = snapshot
                self._send(("status", STATUS_ID, snapshot))

    def run(self) -> None:
        while True:
            building = not self.engine.complete and not self.engine.failed
            self._changed.wait(STATUS_EVERY_S if building else None)
            self._changed.clear()
            self.push()
            time.sleep(STATUS_AT_MOST_S)


def status_snapshot(engine: BackgroundEngine) -> dict:
    """{"status": engine.status(), "failed": ..., "engine": the ENGINE_FIELDS once an engine serves}."""
    snapshot = {"status": engine.status(), "failed": engine.failed}
    if engine.ready:
        fields = {}
        for name in ENGINE_FIELDS:
            try:
                fields[name] = getattr(engine, name)
            except (AttributeError, RagDemoError):  # an engine without it: the page's read says not ready
                continue
        snapshot["engine"] = fields
    return snapshot


def _call_method(engine: BackgroundEngine, name: str, args: tuple, kwargs: dict) -> Any:
    if name not in METHODS:
        raise RagDemoError(f"the engine has no method {name!r}")
    return getattr(engine, name)(*args, **kwargs)


def _progress_sender(send: Callable[[tuple], None], call_id: int) -> Progress:
    def progress(stage: str, done: int, total: int) -> None:
        send(("progress", call_id, str(stage), int(done), int(total)))

    return progress


def _answer(call_id: int, work: Callable[[], Any]) -> tuple:
    """("result" or "error", id, the value or exception pickled here, so that the send cannot fail on it)."""
    try:
        value = work()
    except Exception as err:
        if not isinstance(err, (RagDemoError, ValueError)):
            log.exception("engine call failed")
        return ("error", call_id, pickle.dumps(_portable(err), protocol=pickle.HIGHEST_PROTOCOL))
    try:
        return ("result", call_id, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as err:
        log.exception("an engine answer could not be pickled")
        unsent = RagDemoError(f"the engine's answer could not be sent to the page ({type(err).__name__}: {err})")
        return ("error", call_id, pickle.dumps(unsent, protocol=pickle.HIGHEST_PROTOCOL))


def _unpickled(blob: bytes) -> Any:
    try:
        return pickle.loads(blob)
    except Exception as err:
        log.exception("an answer from the engine's process could not be read")
        raise RagDemoError(f"an answer from the engine's process could not be read ({type(err).__name__}: {err})") from None


def _portable(err: Exception) -> Exception:
    """The exception itself where it survives pickling; otherwise one that says what it was."""
    try:
        if type(pickle.loads(pickle.dumps(err))) is type(err):
            return err
    except Exception:  # noqa: S110 (any failure to round-trip means: send a description instead)
        pass
    return RagDemoError(f"{type(err).__name__}: {err}")


if __name__ == "__main__":
    main(sys.argv[1:])

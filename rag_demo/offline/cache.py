"""Cache folders: a hidden staging folder, a marker that proves the folder complete, an atomic rename.

A folder counts as complete only when its `complete.json` names the expected key, every listed
file has the recorded size, and the marker's own checksum holds. Errors while writing become a
`CacheError` that says how to fix them (free space, or point RAG_DEMO_CACHE elsewhere).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from ..config import cache_root
from ..retrieval.corpus import sha256_file
from ..errors import CacheError
from ..progress import Progress

log = logging.getLogger(__name__)

MARKER = "complete.json"
STALE_STAGING_SECONDS = 3600  # a staging folder this old belongs to a build that died


def resolve_root(cache: str | Path | None) -> Path:
    """The cache root: `cache` when given, else `config.cache_root()`."""
    return Path(cache) if cache is not None else cache_root()


def _marker_checksum(key: str, files: Mapping[str, list]) -> str:
    return hashlib.sha256(json.dumps([key, files], sort_keys=True).encode()).hexdigest()


def write_marker(folder: Path, key: str, info: Mapping | None = None) -> None:
    """Record every file under `folder` with its size and sha256, then the marker's own checksum."""
    files = {
        path.relative_to(folder).as_posix(): [path.stat().st_size, sha256_file(path)]
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MARKER
    }
    marker = {"key": key, "files": files, "checksum": _marker_checksum(key, files), "info": dict(info or {})}
    (folder / MARKER).write_text(json.dumps(marker, indent=1), encoding="utf-8")


def marker_problem(folder: Path, key: str, *, deep: bool = False) -> str | None:
    """Why `folder` is not a complete artifact for `key`, or None when it is.

    The default check reads the marker, stats the files (fast even for the 1 GB model) and
    re-hashes only a file written after the marker was (a partial copy, an edit, a write cut
    short: anything that touched it since the build); `deep` re-hashes every file.
    """
    marker_path = folder / MARKER
    if not folder.is_dir():
        return "missing"
    try:
        marked_ns = marker_path.stat().st_mtime_ns
        marker = json.loads(marker_path.read_text(encoding="utf-8"))
        files, recorded_key, checksum = marker["files"], marker["key"], marker["checksum"]
        entries = [(str(name), int(size), str(sha256)) for name, (size, sha256) in files.items()]
    except FileNotFoundError:
        return f"no {MARKER} (an interrupted build)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"unreadable {MARKER} ({type(err).__name__})"
    if checksum != _marker_checksum(recorded_key, files):
        return f"{MARKER} does not match its checksum"
    if recorded_key != key:
        return f"built for {recorded_key!r}, expected {key!r}"
    for name, size, sha256 in entries:
        path = folder / name
        try:
            stat = path.stat()
        except OSError:
            return f"{name} is missing"
        if stat.st_size != size:
            return f"{name} has {stat.st_size} bytes, expected {size}"
        if (deep or stat.st_mtime_ns > marked_ns) and sha256_file(path) != sha256:
            return f"{name} does not match its sha256"
    return None


def is_complete(folder: Path, key: str) -> bool:
    """Whether `folder` is a complete artifact for `key`; a folder that is there but not complete is logged."""
    problem = marker_problem(folder, key)
    if problem is not None and problem != "missing":
        log.warning("cache folder %s is incomplete or stale (%s); rebuilding it", folder, problem)
    return problem is None


def _cache_error(err: OSError, where: Path) -> CacheError:
    if err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return CacheError(
            f"the disk holding {where} is full; free some space there or set RAG_DEMO_CACHE to a folder on a larger disk"
        )
    reason = err.strerror or type(err).__name__
    return CacheError(
        f"cannot write the cache at {where} ({reason}); set RAG_DEMO_CACHE to a writable folder"
    )


@contextmanager
def writing(where: Path) -> Iterator[None]:
    """Turn an OSError while writing the cache into a CacheError that says what to do."""
    try:
        yield
    except OSError as err:
        raise _cache_error(err, where) from None


def require_space(folder: Path, needed: int, what: str) -> None:
    """Fail before a long build, not halfway through it, when the disk cannot hold `needed` bytes."""
    with writing(folder):
        free = shutil.disk_usage(folder).free
    if free < needed:
        raise CacheError(
            f"{what} needs about {needed / 1e9:.1f} GB in {folder} but {free / 1e9:.1f} GB are free; "
            "free some space or set RAG_DEMO_CACHE to a folder on a larger disk"
        )


def _remove_stale_staging(dest: Path) -> None:
    for stale in dest.parent.glob(f".{dest.name}.tmp-*"):
        try:
            if time.time() - stale.stat().st_mtime > STALE_STAGING_SECONDS:
                log.info("removing %s, left by an interrupted build", stale)
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            continue


@contextmanager
def staged(dest: Path) -> Iterator[Path]:
    """A fresh hidden folder beside `dest` (same file system, so the final rename is atomic)."""
    with writing(dest.parent):
        dest.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_staging(dest)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _share_like_umask(folder: Path) -> None:
    """Give `folder` (made 0700 by mkdtemp) and its files the modes a plain mkdir/open would.

    Otherwise a cache built by one user (say, while building a container image) is unreadable
    by another that runs the demo. The umask is read off a fresh file: os.umask would change
    it for every thread for a moment.
    """
    probe = folder / ".umask-probe"
    probe.touch()
    file_mode = probe.stat().st_mode & 0o666
    probe.unlink()
    dir_mode = file_mode | (file_mode & 0o444) >> 2  # x wherever r
    folder.chmod(dir_mode)
    for path in folder.rglob("*"):
        path.chmod(dir_mode if path.is_dir() else file_mode)


def publish(staging: Path, dest: Path, key: str, info: Mapping | None = None) -> None:
    """Mark `staging` complete and rename it to `dest`, replacing an incomplete or stale `dest`."""
    with writing(dest.parent):
        _share_like_umask(staging)
        write_marker(staging, key, info)
        if marker_problem(dest, key) is None:  # another process finished the same artifact meanwhile
            log.info("%s was built concurrently; keeping that copy", dest)
            return
        if dest.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent)) / "old"
            os.replace(dest, trash)
            shutil.rmtree(trash.parent, ignore_errors=True)
        try:
            os.replace(staging, dest)
        except OSError:
            if marker_problem(dest, key) is None:  # another process published the same artifact first
                log.info("%s was built concurrently; keeping that copy", dest)
                return
            raise


@dataclass
class Timeline:
    """The steps of one build as they ran: (what, began after s, took s), seconds from its start."""

    started: float = field(default_factory=lambda: time.perf_counter())
    steps: list[tuple[str, float, float]] = field(default_factory=list)

    def table(self) -> str:
        """The steps one per line, then the total.

        >>> line = Timeline(started=0.0, steps=[("embedding", 1.0, 2.5)]).table().splitlines()[1]
        >>> line.split()
        ['1.0', '2.5', 'embedding']
        """
        lines = [f"{'began':>8} {'took':>8}  step (seconds)"]
        lines += [f"{began:8.1f} {took:8.1f}  {what}" for what, began, took in self.steps]
        lines.append(f"{'':>8} {time.perf_counter() - self.started:8.1f}  in all")
        return "\n".join(lines)


_TIMELINE: ContextVar[Timeline | None] = ContextVar("rag_demo_build_timeline", default=None)


@contextmanager
def recording_timeline() -> Iterator[Timeline]:
    """Collect every `timed` step run inside the block (in this thread) into one `Timeline`."""
    timeline = Timeline()
    token = _TIMELINE.set(timeline)
    try:
        yield timeline
    finally:
        _TIMELINE.reset(token)


@contextmanager
def timed(what: str) -> Iterator[None]:
    """Log how long the block took, so a slow first start shows which step the time went to; the
    step also joins the timeline being recorded, if any."""
    started = time.perf_counter()
    yield
    took = time.perf_counter() - started
    log.info("%s took %.1f s", what, took)
    timeline = _TIMELINE.get()
    if timeline is not None:
        timeline.steps.append((what, started - timeline.started, took))


@contextmanager
def build_lock(root: Path, progress: Progress | None = None) -> Iterator[None]:
    """One build at a time per cache folder, across processes.

    A second process (a CLI command run while the app's first start is building, say) waits here
    and then finds the parts built, instead of building its own copy alongside. Where the
    platform has no `fcntl` (Windows), builds are not serialized; publishing stays atomic anyway.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    with writing(root):
        root.mkdir(parents=True, exist_ok=True)
        handle = (root / ".build.lock").open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            stage = f"waiting for another process that is building the offline default under {root}"
            log.info("%s", stage)
            report(progress, stage, 0, 1)
            fcntl.flock(handle, fcntl.LOCK_EX)
            report(progress, stage, 1, 1)  # the wait is over: a terminal's bar ends its line
        yield
    finally:
        handle.close()  # closing releases the lock


def report(progress: Progress | None, stage: str, done: int, total: int) -> None:
    """`progress(stage, done, total)`, when there is a progress callback."""
    if progress is not None:
        progress(stage, done, total)


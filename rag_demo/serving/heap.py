"""Keep a long-running server's resident memory from creeping up (glibc only; a no-op elsewhere).

An ask allocates and frees a few hundred MB of short-lived tensors. glibc's malloc gives each
thread that allocates its own arena (up to 8 per core) and keeps freed pages of every arena for
reuse, so a server whose requests run on changing worker threads holds more and more memory it
no longer uses. Fewer arenas and returning free pages after each request keep it flat.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from pathlib import Path

_M_ARENA_MAX = -8  # mallopt parameter number in glibc's malloc.h


@functools.cache
def _glibc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 (present only in glibc)
        libc.malloc_trim
        libc.mallopt
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas(count: int = 2) -> bool:
    """Cap malloc arenas for threads started from now on; True when glibc took the setting."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(_M_ARENA_MAX, int(count)) == 1)


def release_free_memory() -> bool:
    """Hand freed heap pages back to the operating system; True when glibc released some."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0) == 1)


def status_mb(field: str, pid: int | str = "self") -> float | None:
    """A memory line of /proc/<pid>/status in MB, e.g. "VmRSS" (resident now) or "VmHWM" (its peak).

    None where there is no /proc or the process is gone.
    """
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def descendants(pid: int | str = "self") -> list[int]:
    """The process ids of `pid`'s children, their children and so on (from /proc; [] where there is none)."""
    found, queue = [], [str(pid)]
    while queue:
        parent = queue.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):  # nothing where there is no such process
            try:
                children = task.read_text().split()
            except OSError:
                continue
            found.extend(int(child) for child in children)
            queue.extend(children)
    return found


def tree_mb(field: str, pid: int | str = "self") -> float | None:
    """`status_mb(field)` summed over `pid` and its descendants: the app and its engine's process.

    For "VmHWM" it is the sum of each process's own peak, which bounds their peak together from above.
    """
    own = status_mb(field, pid)
    if own is None:
        return None
    return own + sum(status_mb(field, child) or 0.0 for child in descendants(pid))

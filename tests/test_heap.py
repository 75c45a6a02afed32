from __future__ import annotations

import sys

import numpy as np
import pytest

from rag_demo import heap


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


@pytest.mark.skipif(not sys.platform.startswith("linux") or heap._glibc() is None, reason="glibc only")
def test_release_returns_freed_heap_holes_to_the_system():
    # 64 KB blocks live in the heap (below the mmap threshold); keeping every 16th alive leaves
    # holes that free() cannot hand back by itself
    blocks = [np.ones(64 * 1024 // 8) for _ in range(4000)]  # ~250 MB
    keep = blocks[::16]
    del blocks
    held = _rss_mb()
    assert heap.release_free_memory()
    assert held - _rss_mb() > 100  # most of the ~235 MB freed comes back
    del keep


def test_limit_arenas_is_accepted_on_glibc_and_harmless_elsewhere():
    assert heap.limit_arenas(2) is (heap._glibc() is not None)

from __future__ import annotations

import sys

import numpy as np
import pytest

from rag_demo import heap


@pytest.mark.skipif(not sys.platform.startswith("linux") or heap._glibc() is None, reason="glibc only")
def test_release_returns_freed_heap_holes_to_the_system():
    # 64 KB blocks live in the heap (below the mmap threshold); keeping every 16th alive leaves
    # holes that free() cannot hand back by itself
    blocks = [np.ones(64 * 1024 // 8) for _ in range(4000)]  # ~250 MB
    keep = blocks[::16]
    del blocks
    held = heap.status_mb("VmRSS")
    assert heap.release_free_memory()
    assert held - heap.status_mb("VmRSS") > 100  # most of the ~235 MB freed comes back
    del keep


def test_limit_arenas_is_accepted_on_glibc_and_harmless_elsewhere():
    assert heap.limit_arenas(2) is (heap._glibc() is not None)


def test_status_mb_reads_this_process_and_none_for_a_gone_one():
    if not sys.platform.startswith("linux"):
        pytest.skip("/proc only")
    assert 0 < heap.status_mb("VmRSS") <= heap.status_mb("VmHWM")
    assert heap.status_mb("VmRSS", pid=2**22 + 1) is None  # above Linux's largest pid
    assert heap.status_mb("NoSuchField") is None

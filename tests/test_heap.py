from __future__ import annotations

import sys

import numpy as np
import pytest

from rag_demo.serving import heap


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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc only")
def test_tree_mb_adds_the_child_processes():
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import sys; b = bytearray(300 << 20); sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        for _ in range(200):  # until the child holds its 300 MB
            if (heap.status_mb("VmRSS", child.pid) or 0) > 300:
                break
            import time

            time.sleep(0.05)
        assert child.pid in heap.descendants()
        own, child_mb = heap.status_mb("VmRSS"), heap.status_mb("VmRSS", child.pid)
        assert child_mb > 300
        assert heap.tree_mb("VmRSS") == pytest.approx(own + child_mb, abs=5)
    finally:
        child.communicate(b"")
    assert child.pid not in heap.descendants()
    assert heap.tree_mb("VmRSS", 4_194_311) is None  # above the largest pid Linux gives

"""The C allocator while training (`training.allocator`): a step's buffers come from the heap, and
what a step frees stays there for the next one, instead of being mapped and faulted in anew."""

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# In a fresh process (pytest's own allocations would sit on the heap's top, above the buffers):
# glibc's `struct mallinfo2` (malloc.h) before, while and after 16 MiB buffers are held.
PROBE = textwrap.dedent("""
    import ctypes, ctypes.util, json
    import torch
    from spirelib.training.allocator import MMAP_THRESHOLD, keep_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                          "fsmblks", "uordblks", "fordblks", "keepcost")]

    mallinfo2 = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
    mallinfo2.restype = MallInfo2
    took = keep_freed_memory()
    before = mallinfo2()
    block = MMAP_THRESHOLD // 2  # 16 MiB, more than glibc maps apart by default
    buffers = [torch.empty(block, dtype=torch.uint8) for _ in range(4 + before.fordblks // block)]
    held = mallinfo2()
    del buffers
    after = mallinfo2()
    print(json.dumps({"took": took, "mapped": [before.hblkhd, held.hblkhd],
                      "heap": [before.arena, held.arena, after.arena]}))
""")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt and mallinfo2 are glibc's")
def test_a_steps_buffers_come_from_the_heap_and_stay_there_once_freed():
    root = Path(__file__).resolve().parents[2]
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, cwd=root,
                           env={**os.environ, "PYTHONPATH": str(root)})
    assert probe.returncode == 0, probe.stderr[-2000:]
    got = json.loads(probe.stdout)
    assert got["took"]
    assert got["mapped"][1] == got["mapped"][0], "a block under the threshold was mapped apart from the heap"
    before, held, after = got["heap"]
    assert held > before  # more than the heap had free: it grew, its last blocks at its top
    assert after == held, "the heap gave freed memory back to the system"

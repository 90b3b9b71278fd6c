"""The C allocator while training: a step reuses the memory the previous step freed.

A training step allocates and frees the same buffers of a few megabytes every step (activations,
a loss chunk's logits, attention's outputs). glibc's malloc serves a block above its mmap threshold
(128 KiB, raised as large blocks are freed) with a fresh mapping, and returns the free top of the
heap to the system once it exceeds twice that threshold, so each step faults the same pages in
again, zero-filled by the kernel: 20,000-40,000 minor page faults a step at the workbook's
shapes. `keep_freed_memory` sets both thresholds for the process (`mallopt`, as the environment
variables MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ would at start-up): blocks up to
32 MiB, glibc's largest mmap threshold on 64-bit, come from the heap, and the heap keeps what is
freed (up to `TRIM_THRESHOLD` at its top) for the next step. A no-op on other C libraries.
Measured side by side: docs/benchmarks.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # bytes: glibc refuses more on 64-bit (half its heap size, HEAP_MAX_SIZE)
TRIM_THRESHOLD = 2**31 - 1  # bytes of free heap top kept (mallopt takes an int): in effect, never trim


@functools.cache
def keep_freed_memory() -> bool:
    """Keep freed memory in the process's heap for reuse (see the module docstring), once per
    process; True where glibc took both settings, False on a C library without `mallopt`."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

"""glibc's malloc thresholds for a process that trains or evaluates a model.

Every SGD step allocates its activations and frees them at the end (about 30 MB for the
McMahan CNN at B = 32). glibc gives the free top of its heap back to the kernel once it
exceeds the *trim threshold*, and serves allocations above the *mmap threshold* with
fresh ``mmap`` pages; it moves both with the largest ``mmap`` chunk the process has freed
so far. Whether a process hands its step's memory back and faults it in again on the next
step (a ``brk`` shrink and regrow per step, page zeroing, cold caches) thus depends on what
it happened to allocate before: a ClientApp's Ray actor did, at 2,500-10,000 minor page
faults per CPU-second, where a bare process training the same model did not. Even the same
steps in a fresh process trim in some runs and not in others: one torch thread training the
McMahan CNN (B = 32) took 28.3-35.5 ms per step with glibc's thresholds (median 32.4, up to
4,070 faults per step) and 27.1-30.9 ms with fixed ones (median 27.5, 3-8 faults per step;
``python -m simulation bench heap``). Fixed thresholds make every such process keep one
step's memory for the next; the memory kept is at most what a step uses.
"""

from __future__ import annotations

import ctypes
import functools
import platform

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD_BYTES = 256 << 20  # free heap top kept: activations of steps up to 256 MB
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest on 64-bit; larger blocks still use mmap


@functools.cache
def keep_step_memory() -> bool:
    """Fix this process's glibc trim and mmap thresholds (once; True when set). Off glibc
    (macOS, Windows, musl) it does nothing and returns False."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))

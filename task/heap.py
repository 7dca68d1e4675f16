"""glibc's malloc thresholds for a process that trains or evaluates a model, and for the
ServerApp (:func:`unmap_large_blocks`).

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
SERVER_MMAP_THRESHOLD_BYTES = 1 << 20  # a process that relays models but does not train


def _mallopt(*settings: tuple[int, int]) -> bool:
    """glibc's ``mallopt`` for each (parameter, value); False off glibc (macOS, Windows,
    musl) or when one is refused."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return all(libc.mallopt(parameter, value) for parameter, value in settings)


@functools.cache
def keep_step_memory() -> bool:
    """Fix this process's glibc trim and mmap thresholds (once; True when set). Off glibc
    (macOS, Windows, musl) it does nothing and returns False."""
    return _mallopt((M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
                    (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


@functools.cache
def unmap_large_blocks() -> bool:
    """Fix this process's mmap threshold at 1 MiB (once; True when set): for the ServerApp,
    which receives, aggregates and sends model-sized buffers but runs no SGD step. glibc
    would raise the threshold to the largest block freed so far (a model, 6.65 MB for the
    McMahan CNN), serve later such blocks from its heaps and keep their pages when they are
    freed, one heap per thread that touched them; with the fixed threshold each block is
    its own mapping and goes back to the kernel when freed. The bench workload's ServerApp
    peaked at 436 MB with it against 472 MB without (docs/results/benchmark.md)."""
    return _mallopt((M_MMAP_THRESHOLD, SERVER_MMAP_THRESHOLD_BYTES))

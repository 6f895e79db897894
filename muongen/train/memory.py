"""Keeping freed memory in the process on the CPU (glibc's malloc).

A training step on the CPU allocates and frees the same few-megabyte activations several
times per update. glibc's malloc serves blocks that large from fresh ``mmap`` regions and
gives freed memory at the top of its heaps back to the kernel, so every step touches new
pages: on the shared bench's rich batch ~8000 page faults and ~20 ms of kernel time per
step, and with the step's shards on two threads they also queue on the process's one
memory-map lock. :func:`keep_freed_memory` asks malloc to keep what it frees (a trim
threshold and a top pad far above the step's needs, and ``mmap`` only for blocks above
32 MiB, glibc's ceiling for that setting), after which a step faults almost no pages in.
The process then holds on to its peak heap, which a training process reaches every
step anyway.

It changes the whole process's allocator, once; off glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

#: blocks up to this size come from the heap (glibc refuses more than 32 MiB on 64 bits)
MMAP_THRESHOLD = 32 * 1024 * 1024
#: freed memory kept at the top of a heap before any goes back to the kernel
KEEP_BYTES = 1024 * 1024 * 1024
#: the extra asked for whenever a heap grows (virtual until touched)
TOP_PAD = 64 * 1024 * 1024

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory in the process (see the module docstring).

    Idempotent; returns whether the settings are in force (False off Linux/glibc or when
    malloc refused them, which is logged).
    """
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    settings = [
        ("M_MMAP_THRESHOLD", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        ("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, KEEP_BYTES),
        ("M_TOP_PAD", M_TOP_PAD, TOP_PAD),
    ]
    refused = [name for name, param, value in settings if mallopt(param, value) != 1]
    if refused:
        log.info("malloc kept its defaults for %s: freed memory may go back to the kernel",
                 ", ".join(refused))  # fmt: skip
    _applied = not refused
    return _applied

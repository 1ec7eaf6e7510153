"""glibc's heap top pad for tidemq's own processes (servers and the command line tools).

A broker answering pulls and a consumer decoding them allocate and free a few hundred KB per
pull (a socket read, the answer's body joined once, its messages' bodies). With glibc's
defaults the freed top of the heap is given back to the kernel (trimmed) as soon as more than
128 KiB-1 MiB of it is free, and the next pull grows the heap again page by page: one page
fault per 4 KiB of fresh memory. Measured (issue 18, benchmarks/RESULTS.md): ~0.23 faults per
1 KiB message in each process, 0.4 µs of the consumer's ~2.1 µs per message and 0.1 µs of the
broker's ~0.85. With a top pad of 64 MiB the heap grows in large steps and keeps that much
free at its top, so the steady pull cycle reuses warm pages.

``pad_heap_top`` sets it (``mallopt(M_TOP_PAD)``, what ``MALLOC_TOP_PAD_=67108864`` in the
environment does) when the process runs on glibc and the environment does not already say
(an operator's ``MALLOC_TOP_PAD_``, 0 included, stands). The cost is memory: up to 64 MiB of
freed heap a process keeps instead of returning it. An application that embeds tidemq's
client sets the variable itself (docs/operations.md).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

# mallopt's parameter number for the top pad (glibc malloc.h: M_TOP_PAD -2).
_M_TOP_PAD = -2
# 64 MiB: above the few MB a pull cycle allocates at once (a 1 MiB answer, its messages and
# reads, with ten thousand messages buffered), small beside a broker's page cache.
TOP_PAD_BYTES = 64 * 1024 * 1024


def pad_heap_top(pad_bytes: int = TOP_PAD_BYTES) -> bool:
    """Set glibc malloc's top pad to ``pad_bytes`` for this process (module docstring).

    Returns:
        True when it was set; False when not glibc, when ``MALLOC_TOP_PAD_`` is in the
        environment (the operator's value stands), or when ``mallopt`` refused.
    """
    if "MALLOC_TOP_PAD_" in os.environ or not sys.platform.startswith("linux"):
        return False
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(_M_TOP_PAD, pad_bytes) == 1

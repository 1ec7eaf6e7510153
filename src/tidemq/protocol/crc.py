"""CRC-32 of message bodies (BODYCRC), with an optional accelerator.

BODYCRC is zlib's CRC-32 (polynomial 0xEDB88320 reflected, initial value and final xor
0xFFFFFFFF) of the stored body, masked to 31 bits (message.py). CPython's ``zlib.crc32``
uses the system zlib; Debian bookworm's 1.2.13 computes it a table lookup at a time, ~0.4-0.7
us per 1 KiB body on this project's machines, about a tenth of the broker's CPU per message
under batch produce, where every body's CRC is computed on the event loop's thread.

ISA-L (PyPI ``isal``, ``isal.isal_zlib.crc32``) computes the same CRC-32 with carry-less
multiplication (PCLMULQDQ on x86-64, PMULL on aarch64): ~0.07 us per 1 KiB measured here. It
is the same function of the same bytes with the same signature (``crc32(data, value=0)``,
any contiguous buffer), so the stored bytes do not depend on which one ran;
tests/unit/protocol/test_crc.py checks it, and the store's encoder tests and the consumer's
damaged-record tests run both ways. Users: the store's record encoders, recovery's record
checks, a slave's check of replicated records, and a consumer's check of pulled records
(``check_crc``).

``crc32`` is ISA-L's when the package is installed (a dependency of tidemq; it may be
missing where no wheel exists), zlib's otherwise; ``ACCELERATED`` says which. Nothing else
changes with it. Measured end to end (benchmarks/RESULTS.md, issue 18): the broker's event
loop 3.67 -> 3.20 us of user CPU per message in batch produce; one PullConsumer 1.95 -> 1.53
us per message.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

try:
    from isal.isal_zlib import crc32 as _accelerated_crc32
except ImportError:  # not installed: zlib's, same results
    _accelerated_crc32 = None

ACCELERATED: bool = _accelerated_crc32 is not None

crc32: Callable[..., int] = _accelerated_crc32 if _accelerated_crc32 is not None else zlib.crc32
"""``crc32(data, value=0)``: zlib's CRC-32 of ``data`` continuing from ``value``."""

zlib_crc32: Callable[..., int] = zlib.crc32
"""zlib's own, for the tests that compare the two."""


def accelerator_warning() -> str | None:
    """What a server logs at start when BODYCRC is computed by zlib (None when ISA-L's
    ``crc32`` is in use): the cost and the fix."""
    if ACCELERATED:
        return None
    return (
        "message body CRCs (BODYCRC) are computed with zlib because the isal package (a "
        "tidemq dependency) is not installed or did not load: about 0.4 us more CPU per "
        "1 KiB message on the event loop; install it with 'pip install isal'"
    )

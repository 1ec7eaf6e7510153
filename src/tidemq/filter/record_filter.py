"""Keep the stored records of a pull body whose properties pass a test.

A pull body is stored records concatenated (docs/protocol.md §6.1, layout in
``tidemq.protocol.message``). A SQL92 filter needs each record's properties; this reads only
what it takes to find them — TOTALSIZE, SYSFLAG (for the host widths) and the lengths of
BODY, TOPIC and PROPERTIES — with ``struct.unpack_from`` on the buffer, and copies the kept
records with one join of memoryview slices. A body whose records all pass is returned as it
is, without a copy.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from tidemq.errors import CorruptRecord
from tidemq.protocol.message import POSITION_SYSFLAG, decode_properties, record_prefix

_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")


def filter_records(
    body: bytes, keep: Callable[[dict[str, str]], bool]
) -> tuple[bytes, int, int]:
    """Keep the records of ``body`` for which ``keep(properties)`` is true.

    Args:
        body: stored records, concatenated, as the store returns them for a pull.
        keep: the test, given each record's properties (TAGS and system properties
            included).
    Returns:
        (the kept records concatenated, how many were kept, how many were dropped).
    Raises:
        CorruptRecord: a record's sizes run past the body (the store handed over bytes that
            are not whole records).
    """
    kept_slices: list[memoryview] = []
    kept = dropped = 0
    end = len(body)
    position = 0
    with memoryview(body) as view:
        while position < end:
            try:
                properties = _record_properties(body, view, position, end)
            except (IndexError, struct.error):
                properties = None
            if properties is None:
                raise CorruptRecord(
                    f"record at byte {position} of a pull body has sizes that run past its "
                    f"end ({end - position} bytes left); the store handed over broken records"
                )
            total_size = _INT32.unpack_from(body, position)[0]
            if keep(properties):
                kept_slices.append(view[position:position + total_size])
                kept += 1
            else:
                dropped += 1
            position += total_size
        if not dropped:
            return body, kept, 0
        return b"".join(kept_slices), kept, dropped


def _record_properties(
    body: bytes, view: memoryview, position: int, end: int
) -> dict[str, str] | None:
    """The properties of the record at ``position``; None when its sizes do not add up.

    Raises:
        IndexError, struct.error: a size points past the end of ``body``.
    """
    total_size = _INT32.unpack_from(body, position)[0]
    if total_size <= 0 or position + total_size > end:
        return None
    sysflag = _INT32.unpack_from(body, position + POSITION_SYSFLAG)[0]
    prefix_size = record_prefix(sysflag).size
    body_length = _INT32.unpack_from(body, position + prefix_size - 4)[0]
    if body_length < 0:
        return None
    topic_at = position + prefix_size + body_length
    properties_at = topic_at + 1 + body[topic_at]
    properties_length = _INT16.unpack_from(body, properties_at)[0]
    properties_end = properties_at + 2 + properties_length
    if properties_length < 0 or properties_end > position + total_size:
        return None
    return decode_properties(str(view[properties_at + 2:properties_end], "utf-8", "replace"))

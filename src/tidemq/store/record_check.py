"""Verify stored records in place, and read the fields dispatch needs, without a full decode.

Recovery, ``tidemq store check``, ``store dump`` and re-dispatch walk the commit log record
by record with ``inspect_record``; it looks only at the bytes it must (the layout is in
``tidemq.protocol.message``) and says what is at a position:

- RECORD: a whole v1 record whose sizes add up, whose PHYSICALOFFSET is where it sits and
  (when asked) whose BODYCRC matches the body;
- BLANK: the end-of-file marker; the log goes on at the next segment;
- END: zeros (or the end of the segment): nothing was written here;
- INVALID: anything else; ``problem`` says what is wrong.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tidemq.protocol.crc import crc32
from tidemq.protocol.message import (
    BLANK_MAGIC,
    MAGIC_V1,
    POSITION_SYSFLAG,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    decode_properties,
    record_size,
    store_timestamp_position,
)

# TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG: the first 40 bytes.
_HEAD = struct.Struct(">iiiiiqqi")
_SIZE_MAGIC = struct.Struct(">ii")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_INT64 = struct.Struct(">q")
_MIN_RECORD_SIZE = record_size(0, 0, 0)  # 91: an empty body, topic and properties


class RecordKind(enum.Enum):
    """What ``inspect_record`` found at a position."""

    RECORD = "record"
    BLANK = "blank"
    END = "end"
    INVALID = "invalid"


@dataclass(slots=True)
class Inspection:
    """The verdict on one position: its kind, its size in bytes, and the problem if invalid."""

    kind: RecordKind
    size: int = 0
    problem: str = ""


_END = Inspection(RecordKind.END)


def inspect_record(
    buffer: memoryview | bytes,
    position: int,
    limit: int,
    physical_offset: int,
    check_crc: bool,
) -> Inspection:
    """Say what starts at ``position`` of a segment's ``buffer``.

    Args:
        limit: the end of the segment's bytes (its size, or what a reader may see).
        physical_offset: the log offset of ``position``; a record must carry it.
        check_crc: verify BODYCRC too (``check_crc_on_recover``).
    """
    remaining = limit - position
    if remaining <= 0:
        return _END
    if remaining < 8:
        if not any(buffer[position:limit]):
            return _END
        return Inspection(RecordKind.INVALID, problem=f"{remaining} stray bytes at the end")
    total, magic = _SIZE_MAGIC.unpack_from(buffer, position)
    if magic == MAGIC_V1:
        pass
    elif magic == BLANK_MAGIC:
        if total == remaining:
            return Inspection(RecordKind.BLANK, total)
        return Inspection(
            RecordKind.INVALID,
            problem=f"end-of-file marker says {total} bytes are left but {remaining} are",
        )
    elif magic == 0 and total == 0:
        return _END
    else:
        return Inspection(
            RecordKind.INVALID,
            problem=f"magic {magic & 0xFFFFFFFF:#010x} is not a record's "
            f"{MAGIC_V1 & 0xFFFFFFFF:#010x}",
        )
    if total < _MIN_RECORD_SIZE or total > remaining:
        return Inspection(
            RecordKind.INVALID,
            problem=f"record size {total} is outside [{_MIN_RECORD_SIZE}, {remaining}] "
            "(the bytes left in the segment)",
        )
    _, _, crc, _, _, _, stored_offset, sysflag = _HEAD.unpack_from(buffer, position)
    if stored_offset != physical_offset:
        return Inspection(
            RecordKind.INVALID,
            problem=f"record says it is at physical offset {stored_offset}, not {physical_offset}",
        )
    prefix_size = record_size(0, 0, 0, sysflag) - 3
    body_length = _INT32.unpack_from(buffer, position + prefix_size - 4)[0]
    cursor = position + prefix_size + body_length
    end = position + total
    if body_length < 0 or cursor + 3 > end:
        return Inspection(
            RecordKind.INVALID,
            problem=f"body length {body_length} overruns the {total}-byte record",
        )
    topic_length = buffer[cursor]
    properties_at = cursor + 1 + topic_length
    if properties_at + 2 > end:
        return Inspection(RecordKind.INVALID, problem=f"topic length {topic_length} overruns it")
    properties_length = _INT16.unpack_from(buffer, properties_at)[0]
    if properties_length < 0 or properties_at + 2 + properties_length != end:
        return Inspection(
            RecordKind.INVALID,
            problem=f"properties length {properties_length} does not end the {total}-byte record",
        )
    if check_crc:
        body_start = position + prefix_size
        actual = crc32(buffer[body_start : body_start + body_length]) & 0x7FFFFFFF
        if actual != crc:
            return Inspection(
                RecordKind.INVALID,
                problem=f"body CRC is {actual:#010x} but the record says {crc:#010x}",
            )
    return Inspection(RecordKind.RECORD, total)


_PREFIX_IPV4 = record_size(0, 0, 0) - 3  # up to and with BODYLENGTH, IPv4 hosts
_HOSTS_V6 = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6


def valid_record_size(
    buffer: memoryview | bytes, position: int, limit: int, physical_offset: int, check_crc: bool
) -> int:
    """The size of the whole, valid record at ``position`` (what ``inspect_record`` calls a
    RECORD), or 0 when there is none or it is not the common kind (IPv4 hosts): the caller
    then asks ``inspect_record``. Recovery's scan runs this once per record, so it reads the
    header with one unpack and skips the verdict object."""
    if limit - position < _MIN_RECORD_SIZE:
        return 0
    total, magic, crc, _, _, _, stored_offset, sysflag = _HEAD.unpack_from(buffer, position)
    if (
        magic != MAGIC_V1
        or stored_offset != physical_offset
        or sysflag & _HOSTS_V6
        or total < _MIN_RECORD_SIZE
        or total > limit - position
    ):
        return 0
    body_start = position + _PREFIX_IPV4
    body_length = _INT32.unpack_from(buffer, body_start - 4)[0]
    cursor = body_start + body_length
    end = position + total
    if body_length < 0 or cursor + 3 > end:
        return 0
    properties_at = cursor + 1 + buffer[cursor]
    if properties_at + 2 > end or (
        properties_at + 2 + _INT16.unpack_from(buffer, properties_at)[0] != end
    ):
        return 0
    if check_crc and crc32(buffer[body_start:cursor]) & 0x7FFFFFFF != crc:
        return 0
    return total


@dataclass(slots=True)
class DispatchFields:
    """What re-dispatch needs of a verified record."""

    topic: str
    queue_id: int
    queue_offset: int
    sysflag: int
    store_timestamp: int
    properties: dict[str, str]


_MAGIC_V1_BYTES = struct.pack(">i", MAGIC_V1)
_MAGIC_POSITION = 4


def find_next_record(
    mapped_find: Callable[[bytes, int, int], int],
    buffer: memoryview | bytes,
    start: int,
    limit: int,
    base_offset: int,
) -> int | None:
    """The first position at or after ``start`` (below ``limit``) where a whole, valid record
    sits: magic, sizes, its own PHYSICALOFFSET and its body CRC all consistent. None when
    there is none. Used to resynchronise after damage in the middle of a segment.

    Args:
        mapped_find: the segment's ``mmap.find`` (a C scan for the magic's bytes, so a large
            damaged range costs one pass, not a Python step per byte).
        base_offset: the log offset of the segment's first byte.
    """
    search_from = start + _MAGIC_POSITION
    while True:
        hit = mapped_find(_MAGIC_V1_BYTES, search_from, limit)
        if hit < 0:
            return None
        candidate = hit - _MAGIC_POSITION
        inspection = inspect_record(buffer, candidate, limit, base_offset + candidate, True)
        if inspection.kind is RecordKind.RECORD:
            return candidate
        search_from = hit + 1


def find_next_record_in(
    mapped_find: Callable[[bytes, int, int], int],
    buffer: memoryview | bytes,
    ranges: Iterable[tuple[int, int]],
    start: int,
    base_offset: int,
) -> int | None:
    """``find_next_record`` from ``start`` within ``ranges`` only (the segment's data ranges,
    ``MappedFile.data_ranges``): a valid record lies wholly in the bytes written, so the
    ranges never written (zeros) are not searched."""
    for range_start, range_end in ranges:
        found = find_next_record(mapped_find, buffer, max(start, range_start), range_end,
                                 base_offset)
        if found is not None:
            return found
    return None


def dispatch_fields(buffer: memoryview | bytes, position: int) -> DispatchFields:
    """Read topic, queue, queue offset, sysflag, store time and properties of the record at
    ``position`` (which ``inspect_record`` has accepted)."""
    total, _, _, queue_id, _, queue_offset, _, sysflag = _HEAD.unpack_from(buffer, position)
    store_timestamp = _INT64.unpack_from(buffer, position + store_timestamp_position(sysflag))[0]
    prefix_size = record_size(0, 0, 0, sysflag) - 3
    body_length = _INT32.unpack_from(buffer, position + prefix_size - 4)[0]
    cursor = position + prefix_size + body_length
    topic_length = buffer[cursor]
    topic = bytes(buffer[cursor + 1 : cursor + 1 + topic_length]).decode("utf-8", "replace")
    cursor += 1 + topic_length + 2
    properties_text = bytes(buffer[cursor : position + total]).decode("utf-8", "replace")
    return DispatchFields(
        topic=topic,
        queue_id=queue_id,
        queue_offset=queue_offset,
        sysflag=sysflag,
        store_timestamp=store_timestamp,
        properties=decode_properties(properties_text),
    )


def queue_key(buffer: memoryview | bytes, position: int) -> tuple[str, int, int, int]:
    """(topic, queue id, queue offset, sysflag) of a verified record, without its properties
    (re-dispatch skips records the queues and the index already hold by these alone)."""
    _, _, _, queue_id, _, queue_offset, _, sysflag = _HEAD.unpack_from(buffer, position)
    prefix_size = record_size(0, 0, 0, sysflag) - 3
    body_length = _INT32.unpack_from(buffer, position + prefix_size - 4)[0]
    cursor = position + prefix_size + body_length
    topic = str(buffer[cursor + 1 : cursor + 1 + buffer[cursor]], "utf-8", "replace")
    return topic, queue_id, queue_offset, sysflag


def read_store_timestamp(buffer: memoryview | bytes, position: int) -> int:
    """STORETIMESTAMP of the record at ``position`` (its position depends on SYSFLAG)."""
    sysflag = _INT32.unpack_from(buffer, position + POSITION_SYSFLAG)[0]
    return _INT64.unpack_from(buffer, position + store_timestamp_position(sysflag))[0]

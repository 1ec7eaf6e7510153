"""Reads through a consume queue: pull (``get_messages``) and search by time.

``get_messages`` answers a pull the way docs/protocol.md §4.4 says: the status table first
(queue unknown, empty, offset below min, at max, above max), then a scan of consume-queue
entries from the offset (at most max(16000, max_count * 20) bytes of them, within one
segment) that keeps the entries whose tag code is wanted, until ``max_count`` messages or
``max_bytes`` bytes. The records are not decoded: consecutive records of the commit log are
taken as one memoryview slice of its mapping (or, for records just appended, of the buffer
the append wrote: the commit log's ``recent``, which spares the page fault of a fresh page's
first read), and the slices are joined once into the body.

Most pulls want every tag and read a stretch of the queue that fits the byte bound, with no
filler and nothing below the log's minimum or its verified start: those are read by columns
(``_collect_all``). The entries' offsets and sizes are unpacked at once and checked with
``min``/``sum``; records that follow each other in the log (a queue written alone) are one
slice; records that other queues' records separate (queues written together, the usual
case at 20,000 msg/s) are sliced one by one and joined by ``map`` and ``bytes.join``, with
no Python step per record, from the appended buffers when they hold them, else from the one
segment's mapping. Any other case (a tag filter, a filler, a removed or unverified record,
records leaving one segment's written part) goes through the entry-by-entry loop
(``_collect``), which reads it as before.

Searching by time is a binary search over the queue's entries, reading each probed record's
store time from the commit log (store times grow with the log).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection
from operator import add

from tidemq.protocol.message import POSITION_PHYSICAL_OFFSET
from tidemq.store.commit_log import CommitLog
from tidemq.store.consume_queue import ENTRY, ENTRY_SIZE, FILLER_SIZE, ConsumeQueue
from tidemq.store.interface import GetResult, GetStatus
from tidemq.store.mapped_file import MappedFile
from tidemq.store.recent_writes import range_views
from tidemq.store.record_check import RecordKind, inspect_record

# RocketMQ scans at most this many bytes of consume queue per pull (800 entries), or
# max_count * 20 if more: a filter matching nothing must not make one pull read a whole queue.
SCAN_BYTES_MIN = 16000

_iter_entries = ENTRY.iter_unpack
# TOTALSIZE, MAGICCODE, then PHYSICALOFFSET.
_HEADER_CHECK = struct.Struct(f">ii{POSITION_PHYSICAL_OFFSET - 8}xq")


def get_messages(
    queue: ConsumeQueue | None,
    commit_log: CommitLog,
    offset: int,
    max_count: int,
    max_bytes: int,
    tag_codes: Collection[int] | None,
) -> GetResult:
    """Read a queue from ``offset``; see the module docstring and ``MessageStore``."""
    if queue is None:
        return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
    min_offset = queue.min_offset
    max_offset = queue.max_offset
    if max_offset == 0:
        return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, min_offset, max_offset)
    if offset < min_offset:
        return GetResult(GetStatus.OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
    if offset == max_offset:
        return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset)
    if offset > max_offset:
        return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, max_offset, min_offset, max_offset)
    if max_count <= 0:
        return GetResult(GetStatus.NO_MATCHED_MESSAGE, offset, min_offset, max_offset)
    entries = queue.read_entries(offset, max(SCAN_BYTES_MIN, max_count * ENTRY_SIZE))
    if entries is None:
        return GetResult(
            GetStatus.OFFSET_FOUND_NULL, queue.next_file_offset(offset), min_offset, max_offset
        )
    wanted = tag_codes
    if wanted is not None and not isinstance(wanted, (set, frozenset)):
        wanted = frozenset(wanted)
    try:
        found = (_collect_all(entries, commit_log, max_count, max_bytes) if wanted is None
                 else None)
        if found is not None:
            body, count = found
            return GetResult(GetStatus.FOUND, offset + count, min_offset, max_offset, body,
                             count)
        status, body, count, scanned = _collect(
            entries, commit_log, max_count, max_bytes, wanted
        )
    finally:
        entries.release()
    return GetResult(status, offset + scanned, min_offset, max_offset, body, count)


def _collect_all(
    entries: memoryview, commit_log: CommitLog, max_count: int, max_bytes: int
) -> tuple[bytes, int] | None:
    """Body and count of the first ``max_count`` entries when all of them are read (no filter),
    by columns (module docstring); None when one needs the entry-by-entry loop."""
    count = min(len(entries) // ENTRY_SIZE, max_count)
    if count <= 0:
        return None
    columns = _entry_columns(count)(entries)
    physical_offsets = columns[0::2]
    sizes = columns[1::2]
    # A filler's size is FILLER_SIZE, above any byte bound; an unwritten entry's is 0.
    if min(sizes) <= 0 or sum(sizes) > max_bytes:
        return None
    if min(physical_offsets) < max(commit_log.min_offset(), commit_log.verified_from):
        return None  # removed by retention, or not verified at open: the loop says which
    ends = tuple(map(add, physical_offsets, sizes))
    try:
        # Usually, for a queue written alone, each record starts where the one before it
        # ends (they were appended one after the other): one run, one slice.
        if physical_offsets[1:] == ends[:-1]:
            run = _run_view(commit_log.recent.view, commit_log.find_file, physical_offsets[0],
                            ends[-1])
            if run is None:
                return None
            with run:
                return bytes(run), count
        # Else (queues written together: other queues' records between this one's), each
        # record is sliced where it lies, with no Python step per record.
        body = commit_log.recent.gather(physical_offsets, ends)
        if body is None:
            body = _gather_mapped(commit_log.find_file, physical_offsets, ends)
            if body is None:
                return None
        return body, count
    except ValueError:
        return None  # a segment was deleted by retention meanwhile: the loop says so


def _gather_mapped(find_file: Callable[[int], MappedFile | None], starts: tuple[int, ...],
                   ends: tuple[int, ...]) -> bytes | None:
    """The commit log's bytes [starts[i], ends[i]) for every i, back to back, read through
    the mapping of the one segment that holds them all; None when no segment holds the
    first or the last goes past its written end (or into the next segment).

    Raises:
        ValueError: the segment was unmapped (deleted by retention) meanwhile.
    """
    mapped = find_file(starts[0])
    if mapped is None:
        return None
    base = mapped.file_from_offset
    if ends[-1] > base + mapped.write_position:
        return None
    parts = range_views(mapped.buffer, base, starts, ends)
    try:
        return b"".join(parts)
    finally:
        for part in parts:  # views of the mapping: retention cannot unmap it while they live
            part.release()


def _run_view(recent: Callable[[int, int], memoryview | None],
              find_file: Callable[[int], MappedFile | None], run_start: int,
              run_end: int) -> memoryview | None:
    """A view of the commit log's bytes [run_start, run_end) in one segment (the caller
    releases it), or None when no segment holds run_start or the run goes past its written
    end (or into the next segment). Bytes an append has just written are viewed in the
    buffer it wrote (``recent``, the log's ``RecentWrites.view``): read through the mapping,
    each page the writer filled would cost a page fault on its first read.

    Raises:
        ValueError: the segment was unmapped (deleted by retention) meanwhile.
    """
    view = recent(run_start, run_end)
    if view is not None:
        return view
    mapped = find_file(run_start)
    if mapped is None:
        return None
    base = mapped.file_from_offset
    if run_end > base + mapped.write_position:
        return None
    return mapped.buffer[run_start - base : run_end - base]


# Per entry count, the unpacker of that many entries' (offset, size) columns: the format
# text and struct's cache lookup of it cost more than the unpack for a pull of a few entries.
# Kept for counts a pull may ask (PULL_TRANSFER_COUNT_MAX); larger reads make their own.
_ENTRY_COLUMNS: dict[int, Callable[[memoryview], tuple[int, ...]]] = {}
_ENTRY_COLUMNS_KEPT_MAX = 1024


def _entry_columns(count: int) -> Callable[[memoryview], tuple[int, ...]]:
    unpack = _ENTRY_COLUMNS.get(count)
    if unpack is None:
        unpack = struct.Struct(f">{'qi8x' * count}").unpack_from
        if count <= _ENTRY_COLUMNS_KEPT_MAX:
            _ENTRY_COLUMNS[count] = unpack
    return unpack


def _collect(
    entries: memoryview,
    commit_log: CommitLog,
    max_count: int,
    max_bytes: int,
    wanted: Collection[int] | None,
) -> tuple[GetStatus, bytes, int, int]:
    # The per-entry loop is the read path's cost: keep it to a tuple unpack, a few integer
    # comparisons and, only when a run of adjacent records breaks, one segment lookup.
    commit_log_min = commit_log.min_offset()
    # Records below this were trusted at open, not verified: their headers are checked here.
    verified_from = commit_log.verified_from
    find_file = commit_log.find_file
    parts: list[memoryview] = []
    count = 0
    total = 0
    scanned = 0
    removed = False
    run_start = run_end = run_limit = -1
    base = 0
    buffer: memoryview | None = None
    try:
        for physical_offset, size, tag_code in _iter_entries(entries):
            if count >= max_count:
                break
            if size <= 0 or size == FILLER_SIZE:
                scanned += 1
                continue
            if physical_offset < commit_log_min:
                removed = True
                scanned += 1
                continue
            if wanted is not None and tag_code not in wanted:
                scanned += 1
                continue
            if count and total + size > max_bytes:
                break
            scanned += 1
            end = physical_offset + size
            if physical_offset == run_end and end <= run_limit:
                if physical_offset < verified_from and not _header_matches(
                    commit_log, buffer, physical_offset - base, physical_offset, size  # type: ignore[arg-type]
                ):
                    parts.append(buffer[run_start - base : run_end - base])  # type: ignore[index]
                    run_start = run_end = -1
                    continue
                run_end = end
            else:
                if run_end > run_start:
                    parts.append(buffer[run_start - base : run_end - base])
                run_start = run_end = -1
                mapped = find_file(physical_offset)
                if mapped is None:
                    removed = True
                    continue
                base = mapped.file_from_offset
                run_limit = base + mapped.write_position
                if end > run_limit:  # points past the written log: not a record (yet)
                    continue
                buffer = mapped.buffer
                if physical_offset < verified_from and not _header_matches(
                    commit_log, buffer, physical_offset - base, physical_offset, size
                ):
                    continue
                run_start = physical_offset
                run_end = end
            count += 1
            total += size
        if run_end > run_start:
            parts.append(buffer[run_start - base : run_end - base])
        body = b"".join(parts)
    except ValueError:
        # A segment was deleted by retention while we read it.
        return GetStatus.MESSAGE_WAS_REMOVING, b"", 0, scanned
    finally:
        for part in parts:
            part.release()
    if count:
        return GetStatus.FOUND, body, count, scanned
    if removed:
        return GetStatus.MESSAGE_WAS_REMOVING, b"", 0, scanned
    return GetStatus.NO_MATCHED_MESSAGE, b"", 0, scanned


def _header_matches(
    commit_log: CommitLog, buffer: memoryview, position: int, physical_offset: int, size: int
) -> bool:
    # A record recovery did not verify (an old segment after a clean start): its framing
    # (magic, every size, PHYSICALOFFSET) must hold and its size be what the consume queue
    # says, or the bytes would derail the client's decoding of the whole pull. The body CRC
    # is the client's to check (it costs a pass over the body; the framing does not).
    inspection = inspect_record(buffer, position, position + size, physical_offset, False)
    if inspection.kind is RecordKind.RECORD and inspection.size == size:
        return True
    total, magic, stored_offset = _HEADER_CHECK.unpack_from(buffer, position)
    commit_log.report_unreadable(
        physical_offset,
        f"{inspection.problem or 'not a record'} (TOTALSIZE {total}, magic "
        f"{magic & 0xFFFFFFFF:#010x}, PHYSICALOFFSET {stored_offset}; the consume queue says "
        f"{size} bytes at {physical_offset})",
    )
    return False


def _store_time(queue: ConsumeQueue, commit_log: CommitLog, queue_offset: int) -> int:
    entry = queue.entry(queue_offset)
    if entry is None:
        return -1
    timestamp = commit_log.store_timestamp_at(entry[0])
    return -1 if timestamp is None else timestamp


def offset_by_time(queue: ConsumeQueue | None, commit_log: CommitLog, timestamp_ms: int) -> int:
    """The queue offset stored at ``timestamp_ms``, else the closest one (tie: the earlier);
    0 when the queue holds nothing readable (docs/protocol.md §4.12)."""
    if queue is None:
        return 0
    low = queue.first_offset_at_or_after(commit_log.min_offset())
    high = queue.max_offset
    if low >= high:
        return 0
    # First offset whose store time is >= timestamp_ms.
    left, right = low, high
    while left < right:
        middle = (left + right) // 2
        if _store_time(queue, commit_log, middle) < timestamp_ms:
            left = middle + 1
        else:
            right = middle
    if left == high:
        return high - 1
    after = _store_time(queue, commit_log, left)
    if after == timestamp_ms or left == low:
        return left
    before = _store_time(queue, commit_log, left - 1)
    return left - 1 if timestamp_ms - before <= after - timestamp_ms else left


def earliest_message_time(queue: ConsumeQueue | None, commit_log: CommitLog) -> int:
    """Store time of the queue's first readable message, or -1 if none."""
    if queue is None:
        return -1
    first = queue.first_offset_at_or_after(commit_log.min_offset())
    if first >= queue.max_offset:
        return -1
    return _store_time(queue, commit_log, first)

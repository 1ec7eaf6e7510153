"""The commit log: every topic's records in one append-only sequence of segments.

Layout: ``<storePathRootDir>/commitlog/<20-digit start offset>``, segments of
``mapped_file_size_commit_log`` bytes (1 GiB by default), each holding whole records of the
layout in ``tidemq.protocol.message`` (docs/protocol.md §6.1) back to back. A record never
straddles two segments: when the next record does not fit, the writer puts the 8-byte blank
marker (TOTALSIZE = bytes left in the segment, MAGICCODE = BLANK_MAGIC) and goes on at the
start of the next segment. A record fits when it fills the segment exactly or leaves room
for that marker (>= 8 bytes), so the space left in a segment is always 0 or >= 8.

After a crash, the tail of the last segment may hold a torn record or garbage; recovery
(recovery.py) finds the last whole record and cuts the rest.

Appends are written through the file, everything is read through the mapping: an append is
one ``os.pwrite`` of the batch's buffer at the write position (the in-memory log, and
platforms without pwrite, copy into the mapping instead). Both reach the same page cache, so
readers see the bytes through the mapping at once. (The last appended buffers are also kept
a moment, ``recent``, recent_writes.py: pulls of what was just appended read those instead
of the mapping's fresh pages, whose first read costs a page fault each.) Why pwrite:
- a first write to a page through the mapping takes a page fault with the GIL held, and on
  large-folio kernels that fault zero-fills whole folios of the preallocated file (measured:
  1.2 to 2.5 us of system time per 1 KiB record, against 0.3 us with pwrite);
- pwrite releases the GIL while the kernel copies, so other appenders encode meanwhile;
- pages dirtied through a mapping are write-protected again by each sync and fault again on
  the next write; pages written with pwrite are not mapped writable. That refault is not
  only CPU: with the volume's journal busy (other processes syncing) it blocked the event
  loop for ~18 ms every few seconds on single sends at 2,000 msg/s, the end-to-end tail of
  issue 18 (benchmarks/RESULTS.md); a single put pays ~3 us more for the system call.
The next segment is asked of the allocator (segment_allocator.py) as soon as the current one
is in use, as RocketMQ's AllocateMappedFileService does, and each append tells it how far the
current one is written: it warms the next one that far plus an eighth of a segment, so its cost
comes with the bytes written, and the next segment is warm when the appender gets there. Asked at
half a segment and warmed at once, it fell behind whenever the appender outpaced it (the
warming shares the cores with the appender and its clients), and the appender then wrote to
pages nobody had touched, at several times the cost.

Threads: ``append`` runs under the store's append lock (one writer). Readers find segments
through the copy-on-write segment list and read only below offsets a consume queue or the
write position gave them. The flush thread calls ``flush``.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from collections import deque
from collections.abc import Iterator
from itertools import accumulate, repeat
from operator import add

from tidemq.errors import StoreError
from tidemq.protocol.message import (
    BLANK_MAGIC,
    MAGIC_V1,
    POSITION_PHYSICAL_OFFSET,
    POSITION_QUEUE_OFFSET,
    store_timestamp_position,
)
from tidemq.store.flush import SegmentSyncer, sync_mapped_files
from tidemq.store.mapped_file import MappedFile
from tidemq.store.mapped_file_queue import MappedFileQueue
from tidemq.store.recent_writes import RecentWrites
from tidemq.store.record_check import read_store_timestamp
from tidemq.store.record_encoder import EncodedBatch, patch_offsets, patch_store_timestamp
from tidemq.store.segment_allocator import SegmentAllocator

logger = logging.getLogger(__name__)

# Damaged records found on the read path are logged once each, up to this many.
_REPORTED_UNREADABLE_MAX = 10_000

_SIZE_MAGIC = struct.Struct(">ii")
_INT64 = struct.Struct(">q")
_pack_offsets_into = struct.Struct(">qq").pack_into  # QUEUEOFFSET, PHYSICALOFFSET (adjacent)
_pack_int64_into = _INT64.pack_into
_STORE_TIMESTAMP_POSITION_IPV4 = store_timestamp_position(0)
_HAS_PWRITE = hasattr(os, "pwrite")  # not on Windows: there appends copy into the mapping
_HAS_PWRITEV = hasattr(os, "pwritev")
# Buffers one pwritev takes at most (POSIX IOV_MAX; Linux allows 1024): more go one by one.
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16
BLANK_MARKER_SIZE = 8
_MIN_RECORD_SIZE = 91


class CommitLog:
    """Append records, read them back by physical offset.

    Args:
        directory: ``<root>/commitlog``, or None for an in-memory log.
        file_size: ``mapped_file_size_commit_log``.
    """

    def __init__(self, directory: str | None, file_size: int, *, readonly: bool = False) -> None:
        self.queue = MappedFileQueue(directory, file_size, readonly=readonly)
        self.file_size = file_size
        # Store time of the newest record; the checkpoint records it once that is flushed.
        self.last_store_timestamp = 0
        # Prepares the next segment in the background (file store only).
        self.allocator: SegmentAllocator | None = None
        # (segment being written, a descriptor on its file) for _write; None until then.
        self._writer: tuple[MappedFile, int] | None = None
        # The flush keeps the segment being written open between syncs (flush.SegmentSyncer).
        self._syncer = SegmentSyncer()
        # Whether the allocator was asked for the segment after the last one.
        self._next_segment_requested = False
        # Damaged ranges recovery found, [start, end) log offsets, sorted and disjoint: never
        # served, never dispatched (set_damaged). Two tuples swapped as one, for readers.
        self._damaged: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
        # Records from here on were verified by recovery (CRC included) or appended by this
        # process; older ones were trusted at open and are checked on the way out.
        self.verified_from = 0
        self._reported_unreadable: set[int] = set()
        # The appended batches' buffers, for readers of the log's tail (recent_writes.py).
        self.recent = RecentWrites()

    # -- damage ---------------------------------------------------------------------------------

    def set_damaged(self, ranges: list[tuple[int, int]]) -> None:
        """Record the damaged ranges recovery found (see ``recovery.py``)."""
        ranges = sorted(ranges)
        self._damaged = (tuple(r[0] for r in ranges), tuple(r[1] for r in ranges))

    @property
    def damaged(self) -> list[tuple[int, int]]:
        """The damaged ranges, [start, end) log offsets, in order."""
        starts, ends = self._damaged
        return list(zip(starts, ends, strict=True))

    def report_unreadable(self, physical_offset: int, problem: str) -> None:
        """A reader found the record at ``physical_offset`` damaged (not served): log it once."""
        reported = self._reported_unreadable
        if physical_offset in reported or len(reported) >= _REPORTED_UNREADABLE_MAX:
            return
        reported.add(physical_offset)
        segment = self.find_file(physical_offset)
        logger.error(
            "commit-log record at %s:%d (log offset %d) is damaged and was not served: %s; "
            "run 'tidemq store check' on the store",
            segment.describe() if segment else "?",
            physical_offset - (segment.file_from_offset if segment else 0), physical_offset,
            problem,
        )

    def damage_end(self, start: int, end: int) -> int | None:
        """The end of a damaged range that overlaps [start, end), or None when none does."""
        starts, ends = self._damaged
        if not starts:
            return None
        index = bisect.bisect_right(starts, end - 1) - 1
        if index >= 0 and ends[index] > start:
            return ends[index]
        return None

    def _new_segment(self, file_from_offset: int) -> MappedFile:
        """A segment for ``file_from_offset``, not yet registered: the allocator's spare
        when it has that one ready, else a new file (which may raise StoreFull)."""
        if self.allocator is not None:
            spare = self.allocator.take(file_from_offset)
            if spare is not None:
                return spare
        return self.queue.create_file(file_from_offset, register=False)

    def _start_segment(self, mapped: MappedFile) -> None:
        self.queue.register(mapped)
        self._next_segment_requested = False

    def start_segment_at(self, file_from_offset: int) -> MappedFile:
        """Make the segment at ``file_from_offset`` the log's last one (the allocator's spare
        when it has that one); a slave's replicated bytes call for it.

        The next segment is not asked for: replicated bytes come in chunks that ``write_raw``
        writes with pwrite, which needs no warmed pages, so warming would write every byte
        of a slave's log twice (measured: a fifth of a catch-up's CPU).

        Raises:
            StoreFull / StoreError: the segment cannot be created.
        """
        mapped = self._new_segment(file_from_offset)
        self._start_segment(mapped)
        return mapped

    def request_next_segment(self) -> None:
        """Ask the allocator to prepare the segment after the last one (at open, and after
        each append until asked); the first segment at once (module docstring)."""
        if self.allocator is None or self._next_segment_requested:
            return
        last = self.queue.last_file()
        if last is None:
            self.allocator.request(0)
        else:
            self.allocator.note_written(last.write_position)
            self.allocator.request(last.file_from_offset + self.file_size)
            self._next_segment_requested = True

    # -- offsets --------------------------------------------------------------------------------

    def min_offset(self) -> int:
        """The first physical offset still stored."""
        return self.queue.min_offset()

    def max_offset(self) -> int:
        """Where the next record goes (the end of the written log)."""
        return self.queue.max_offset()

    def find_file(self, physical_offset: int) -> MappedFile | None:
        """The segment holding ``physical_offset`` (binary search), or None."""
        return self.queue.find_file(physical_offset)

    # -- appends --------------------------------------------------------------------------------

    def append(
        self,
        batch: EncodedBatch,
        queue_offset: int,
        queue_offset_step: int,
        store_timestamp: int,
        queue_offsets: list[int] | None = None,
    ) -> list[int]:
        """Write the batch's records, patching their offsets (and store time when it differs
        from the one encoded); return each record's physical offset.

        Records that do not fit the current segment go to the next one (after a blank
        marker); every segment needed is created before the first byte is written, so a
        failure to create one leaves the log as it was.

        Args:
            queue_offset: the first record's QUEUEOFFSET.
            queue_offset_step: 1 for queued records, 0 for those without a queue offset
                (prepared and rollback transaction records keep 0).
            queue_offsets: each record's QUEUEOFFSET, instead of ``queue_offset`` and the
                step (a queue group: records of several queues).

        Raises:
            StoreFull / StoreError: a new segment could not be created, or the disk failed a
                write. The log is as it was unless the batch spans segments and a later
                write failed: then ``max_offset`` has moved past the part that was written.
        """
        last = self._last_segment()
        buffer = batch.buffer
        free = last.free_bytes
        if len(buffer) == free or len(buffer) + BLANK_MARKER_SIZE <= free:
            # The common case: the whole batch fits the current segment, one copy.
            base = last.file_from_offset + last.write_position
            physical_offsets = list(accumulate(batch.sizes, initial=base))
            physical_offsets.pop()
            self._patch(
                batch, physical_offsets, base, queue_offset, queue_offset_step, queue_offsets
            )
            if store_timestamp != batch.store_timestamp:
                self._patch_timestamps(batch, store_timestamp)
            self._write(last, buffer, True)
        else:
            if queue_offsets is None:
                queue_offsets = _queue_offsets(len(batch.sizes), queue_offset, queue_offset_step)
            physical_offsets = self._append_across_segments(
                batch, last, queue_offsets, store_timestamp
            )
        self._appended(store_timestamp)
        return physical_offsets

    def append_one(self, batch: EncodedBatch, queue_offset: int, store_timestamp: int) -> int:
        """``append`` of a batch of one queued record at QUEUEOFFSET ``queue_offset`` (a
        lone send); return its physical offset.

        The record patched and written with no per-batch step when it fits the current
        segment; otherwise (a new segment, a roll) through ``append``, which raises as it
        says.
        """
        last = self.queue.last_file()
        if last is None or last.reserved_position < last.file_size:
            return self.append(batch, queue_offset, 1, store_timestamp)[0]
        buffer = batch.buffer
        position = last.write_position
        free = last.file_size - position
        if len(buffer) != free and len(buffer) + BLANK_MARKER_SIZE > free:
            return self.append(batch, queue_offset, 1, store_timestamp)[0]
        physical_offset = last.file_from_offset + position
        _pack_offsets_into(buffer, POSITION_QUEUE_OFFSET, queue_offset, physical_offset)
        if store_timestamp != batch.store_timestamp:
            _pack_int64_into(buffer, batch.store_timestamp_position(0), store_timestamp)
        self._write(last, buffer, True)
        self._appended(store_timestamp)
        return physical_offset

    def append_many(
        self, batches: list[EncodedBatch], queue_offsets: list[int], store_timestamp: int
    ) -> list[list[int]] | None:
        """``append`` of several batches of queued records, in order, ``batches[i]``'s first
        record at QUEUEOFFSET ``queue_offsets[i]``; return each batch's physical offsets.

        Only when all fit the current segment: they go with one ``os.pwritev`` (no copy into
        one buffer first). Otherwise nothing is written and the answer is None: the caller
        appends them one by one, so that a batch refused for want of a new segment (a full
        disk) is refused alone, after the batches before it were stored and dispatched.

        Raises:
            StoreError: the write failed (the segment was in reach; nothing is half done
                unless the file write itself was short).
        """
        last = self._last_segment()
        total = sum(len(batch.buffer) for batch in batches)
        free = last.free_bytes
        if total != free and total + BLANK_MARKER_SIZE > free:
            return None
        base = last.file_from_offset + last.write_position
        offsets_per_batch: list[list[int]] = []
        for batch, queue_offset in zip(batches, queue_offsets, strict=True):
            physical_offsets = list(accumulate(batch.sizes, initial=base))
            next_base = physical_offsets.pop()
            self._patch(batch, physical_offsets, base, queue_offset, 1, None)
            if store_timestamp != batch.store_timestamp:
                self._patch_timestamps(batch, store_timestamp)
            offsets_per_batch.append(physical_offsets)
            base = next_base
        self._write_many(last, [batch.buffer for batch in batches])
        self._appended(store_timestamp)
        return offsets_per_batch

    def _last_segment(self) -> MappedFile:
        """The segment appends go to, created (the first) or reserved (one from disk)."""
        last = self.queue.last_file()
        if last is None:
            last = self._new_segment(0)
            self._start_segment(last)
        elif last.reserved_position < last.file_size:
            # A segment opened from disk (or extended after a crash): make sure its blocks
            # are allocated before a write through the mapping could fault on a full disk.
            last.reserve(last.file_size)
        return last

    def _appended(self, store_timestamp: int) -> None:
        self.last_store_timestamp = store_timestamp
        if self.allocator is not None:
            self.allocator.note_written(self.queue.last_file().write_position)  # type: ignore[union-attr]
            if not self._next_segment_requested:
                self.request_next_segment()

    @staticmethod
    def _patch(
        batch: EncodedBatch,
        physical_offsets: list[int],
        base: int,
        queue_offset: int,
        step: int,
        queue_offsets: list[int] | None,
    ) -> None:
        # ``base``: the physical offset of the buffer's first byte (when it is one run). One
        # pack_into per record, driven by map so that no Python code runs per record.
        if queue_offsets is None:
            queue_offsets = _queue_offsets(len(physical_offsets), queue_offset, step)
        deque(
            map(
                _pack_offsets_into,
                repeat(batch.buffer),
                map(add, physical_offsets, repeat(POSITION_QUEUE_OFFSET - base)),
                queue_offsets,
                physical_offsets,
            ),
            maxlen=0,
        )

    @staticmethod
    def _patch_timestamps(batch: EncodedBatch, store_timestamp: int) -> None:
        buffer = batch.buffer
        if batch.store_timestamp_positions is None:
            # Every record has it at the same place: one pack_into per record, through map.
            record_starts = accumulate(batch.sizes[:-1], initial=0)
            deque(
                map(
                    _pack_int64_into,
                    repeat(buffer),
                    map(add, record_starts, repeat(_STORE_TIMESTAMP_POSITION_IPV4)),
                    repeat(store_timestamp),
                ),
                maxlen=0,
            )
            return
        position = 0
        for index, size in enumerate(batch.sizes):
            patch_store_timestamp(
                buffer, position + batch.store_timestamp_position(index), store_timestamp
            )
            position += size

    def _append_across_segments(
        self,
        batch: EncodedBatch,
        last: MappedFile,
        queue_offsets: list[int] | range | repeat[int],
        store_timestamp: int,
    ) -> list[int]:
        file_size = self.file_size
        # Plan: which segment (0 = the current one) and position each record goes to.
        plan: list[tuple[int, int]] = []
        segment = 0
        position = last.write_position
        for size in batch.sizes:
            free = file_size - position
            if size != free and size + BLANK_MARKER_SIZE > free:
                segment += 1
                position = 0
            plan.append((segment, position))
            position += size
        segments = [last]
        try:
            for k in range(1, segment + 1):
                segments.append(self._new_segment(last.file_from_offset + k * file_size))
        except BaseException:
            for spare in segments[1:]:
                spare.destroy()
            raise
        if store_timestamp != batch.store_timestamp:
            self._patch_timestamps(batch, store_timestamp)
        # Write: one copy per segment touched, after patching each record in the buffer.
        buffer = batch.buffer
        view = memoryview(buffer)
        physical_offsets: list[int] = []
        current = 0
        run_start = 0
        buffer_position = 0
        for size, (segment, position), queue_offset in zip(
            batch.sizes, plan, queue_offsets, strict=False
        ):
            if segment != current:
                self._write_run(segments[current], view[run_start:buffer_position], True)
                current = segment
                self._start_segment(segments[current])
                run_start = buffer_position
            physical_offset = segments[segment].file_from_offset + position
            patch_offsets(buffer, buffer_position, queue_offset, physical_offset)
            physical_offsets.append(physical_offset)
            buffer_position += size
        self._write_run(segments[current], view[run_start:buffer_position], False)
        view.release()
        return physical_offsets

    def _write_run(self, mapped: MappedFile, data: memoryview, close_segment: bool) -> None:
        if len(data):
            self._write(mapped, data)
        if close_segment:
            free = mapped.free_bytes
            if free:
                marker = _SIZE_MAGIC.pack(free, BLANK_MAGIC)
                self._write(mapped, marker)
                mapped.write_position = mapped.file_size

    def _write(self, mapped: MappedFile, data: bytes | bytearray | memoryview,
               keep: bool = False) -> None:
        """Append ``data`` at the segment's write position, through the file (see the
        module docstring); the in-memory log copies into its mapping. ``keep``: ``data`` is
        a batch's buffer, never changed after this, which readers may be served from
        (``recent``); any other write makes ``recent`` forget what it kept."""
        position = mapped.write_position
        if mapped.path is None or not _HAS_PWRITE:
            mapped.write(position, data)
        else:
            writer = self._writer
            if writer is None or writer[0] is not mapped:
                writer = self._open_writer(mapped)
            try:
                written = os.pwrite(writer[1], data, position)
            except OSError as e:
                raise StoreError(f"cannot write {len(data)} bytes to {mapped.path}: {e}") from e
            if written != len(data):
                raise StoreError(
                    f"short write to {mapped.path}: {written} of {len(data)} bytes at "
                    f"{position}"
                )
            mapped.write_position = position + written
        if keep:
            self.recent.written(mapped.file_from_offset + position, data)  # type: ignore[arg-type]
        else:
            self.recent.clear()

    def _write_many(self, mapped: MappedFile, buffers: list[bytearray]) -> None:
        """``_write`` of batches' buffers (kept, as ``keep`` says) one after the other,
        with one system call."""
        if mapped.path is None or not _HAS_PWRITEV or len(buffers) > _IOV_MAX:
            for buffer in buffers:
                self._write(mapped, buffer, True)
            return
        writer = self._writer
        if writer is None or writer[0] is not mapped:
            writer = self._open_writer(mapped)
        position = mapped.write_position
        size = sum(map(len, buffers))
        try:
            written = os.pwritev(writer[1], buffers, position)
        except OSError as e:
            raise StoreError(f"cannot write {size} bytes to {mapped.path}: {e}") from e
        if written != size:
            raise StoreError(
                f"short write to {mapped.path}: {written} of {size} bytes at {position}"
            )
        mapped.write_position = position + written
        start = mapped.file_from_offset + position
        for buffer in buffers:
            self.recent.written(start, buffer)
            start += len(buffer)

    def write_raw(self, mapped: MappedFile, data: bytes | bytearray | memoryview) -> None:
        """Write bytes that are already records (a slave's copy of its master's log) at
        ``mapped``'s write position, the way an append writes (through the file).

        Raises:
            StoreError: the disk failed the write.
        """
        self._write(mapped, data)

    def _open_writer(self, mapped: MappedFile) -> tuple[MappedFile, int]:
        self._close_writer()
        try:
            fd = os.open(mapped.path, os.O_RDWR)  # type: ignore[arg-type]
        except OSError as e:
            raise StoreError(f"cannot open segment {mapped.path} for writing: {e}") from e
        self._writer = (mapped, fd)
        return self._writer

    def _close_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            os.close(writer[1])

    # -- reads ----------------------------------------------------------------------------------

    def read_record(self, physical_offset: int) -> bytes | None:
        """A copy of the record starting at ``physical_offset``, or None if none starts there
        (outside the log, in a blank, or in the middle of another record)."""
        found = self._record_at(physical_offset)
        if found is None:
            return None
        mapped, position, total = found
        if self._damaged[0] and self.damage_end(physical_offset, physical_offset + total):
            return None
        try:
            return mapped.read(position, total)
        except ValueError:  # the segment was deleted by retention while we read it
            return None

    def read_records(self, physical_offset: int, size: int) -> bytes | None:
        """A copy of the ``size`` bytes from ``physical_offset`` when a record starts there
        and they lie in the written part of one segment (what one batch append wrote),
        else None. Only the first record is checked; the caller knows the rest."""
        found = self._record_at(physical_offset) if size > 0 else None
        if found is None:
            return None
        mapped, position, _ = found
        if position + size > mapped.write_position:
            return None
        if self._damaged[0] and self.damage_end(physical_offset, physical_offset + size):
            return None
        try:
            return mapped.read(position, size)
        except ValueError:  # the segment was deleted by retention while we read it
            return None

    def _record_at(self, physical_offset: int) -> tuple[MappedFile, int, int] | None:
        """(segment, position in it, TOTALSIZE) of the record starting at
        ``physical_offset``, or None if none starts there."""
        mapped = self.find_file(physical_offset)
        if mapped is None:
            return None
        position = physical_offset - mapped.file_from_offset
        limit = mapped.write_position
        if position < 0 or position + _MIN_RECORD_SIZE > limit:
            return None
        try:
            total, magic = _SIZE_MAGIC.unpack_from(mapped.buffer, position)
            if magic != MAGIC_V1 or total < _MIN_RECORD_SIZE or position + total > limit:
                return None
            stored = _INT64.unpack_from(mapped.buffer, position + POSITION_PHYSICAL_OFFSET)[0]
        except ValueError:  # the segment was deleted by retention while we read it
            return None
        return (mapped, position, total) if stored == physical_offset else None

    def store_timestamp_at(self, physical_offset: int) -> int | None:
        """STORETIMESTAMP of the record at ``physical_offset``, or None if it is gone."""
        mapped = self.find_file(physical_offset)
        if mapped is None:
            return None
        position = physical_offset - mapped.file_from_offset
        if position + _MIN_RECORD_SIZE > mapped.write_position:
            return None
        try:
            return read_store_timestamp(mapped.buffer, position)
        except ValueError:
            return None

    def iter_positions(self, start_offset: int) -> Iterator[tuple[MappedFile, int]]:
        """(segment, position) of each record from ``start_offset`` (a record boundary) to
        the end of the log, skipping blank markers and damaged ranges. The caller verifies
        each record."""
        mapped = self.find_file(start_offset)
        if mapped is None:
            return
        position = start_offset - mapped.file_from_offset
        while mapped is not None:
            limit = mapped.write_position
            buffer = mapped.buffer
            base = mapped.file_from_offset
            while position + BLANK_MARKER_SIZE <= limit:
                if self._damaged[0]:
                    skip_to = self.damage_end(base + position, base + position + 1)
                    if skip_to is not None:
                        position = skip_to - base
                        continue
                total, magic = _SIZE_MAGIC.unpack_from(buffer, position)
                if magic != MAGIC_V1 or total < _MIN_RECORD_SIZE or position + total > limit:
                    break
                yield mapped, position
                position += total
            mapped = self.queue.file_after(mapped)
            position = 0

    # -- maintenance ----------------------------------------------------------------------------

    def flush(self) -> int:
        """Sync what was written; return the flushed physical offset.

        Appends go on while the disk works (see ``flush.sync_mapped_files``).
        """
        return sync_mapped_files(self.queue, self._syncer)

    def close(self) -> None:
        """Unmap every segment (files stay)."""
        self.recent.clear()
        self._close_writer()
        self._syncer.close()
        self.queue.close()

    def truncate(self, physical_offset: int) -> None:
        """Make ``physical_offset`` the end of the log (zero the rest, drop later segments)."""
        self.recent.clear()
        self._close_writer()
        self._syncer.close()
        self.queue.truncate_dirty(physical_offset)
        self._next_segment_requested = False


def _queue_offsets(count: int, queue_offset: int, step: int) -> range | repeat[int]:
    """QUEUEOFFSET of each of ``count`` records: consecutive from ``queue_offset``, or all 0
    (``step`` 0: records without a queue offset)."""
    return range(queue_offset, queue_offset + count) if step else repeat(0)

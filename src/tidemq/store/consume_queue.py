"""ConsumeQueue: the per-(topic, queue id) index of a queue's records in the commit log.

Layout: ``<storePathRootDir>/consumequeue/<topic>/<queueId>/<20-digit start byte offset>``,
segments of ``mapped_file_size_consume_queue`` bytes (6,000,000 = 300,000 entries by
default). Entry N (queue offset N) sits at byte N * 20 of the queue's byte space, so a
segment is named by the byte offset of its first entry. Each entry, big-endian::

    off  size  field
      0     8  physical offset   commit-log offset of the record
      8     4  size              the record's TOTALSIZE
     12     8  tag code          Java hash of TAGS, sign-extended; in SCHEDULE_TOPIC_XXXX
                                 the delivery time (ms)
    ENTRY_SIZE = 8 + 4 + 8 = 20

A *filler* entry (physical offset 0, size 2^31-1, tag code 0) stands for a queue offset whose
record is not in this queue's files: it pads a queue rebuilt from the middle of a segment.
Readers skip fillers.

The queue is derived data: the commit log is the truth, and recovery rebuilds what is missing
from it. After a crash the tail may hold entries that point past the recovered end of the
commit log (the queue was flushed ahead of it): recovery drops them.

``max_offset`` is the next queue offset to write; ``min_offset`` the first readable one (it
moves forward when retention deletes the commit log below the entries).

Disk: a segment is sized sparse and its space reserved in ``RESERVE_CHUNK_BYTES`` steps as it
fills (mapped_file.py): ``ensure_room``, called before the commit-log append, reserves what
the append's entries need, so a full disk refuses the append (``StoreFull``) instead of
faulting a write through the mapping; a new queue costs one small file, not 5.7 MiB.

Threads: writes (dispatch, truncation, min-offset moves) run under the store's append lock;
reads take the copy-on-write segment list and read below ``max_offset``.
"""

from __future__ import annotations

import logging
import struct
from itertools import chain

from tidemq.store.flush import sync_mapped_files
from tidemq.store.mapped_file import MappedFile
from tidemq.store.mapped_file_queue import MappedFileQueue

ENTRY_SIZE = 20
FILLER_SIZE = 0x7FFFFFFF
ENTRY = struct.Struct(">qiq")
assert ENTRY.size == ENTRY_SIZE
_FILLER = ENTRY.pack(0, FILLER_SIZE, 0)
_FILLER_RUN = _FILLER * 1024

logger = logging.getLogger(__name__)

# RocketMQ recovers a consume queue from its last three files (older ones were complete).
RECOVER_FILE_COUNT = 3

# Disk is reserved for a segment in steps of this many bytes (3,276 entries): small enough that
# a new queue takes little disk and its creation costs microseconds (issue 18 measured ~3 ms per
# new queue when each reserved its whole 5.7 MiB segment), large enough that reserving is rare.
RESERVE_CHUNK_BYTES = 64 * 1024

# Segment names have 20 digits, so byte offsets stay below 10^20; no real queue comes near.
QUEUE_OFFSET_MAX = 10**19 // ENTRY_SIZE

_entry_structs: dict[int, struct.Struct] = {}


def pack_entries(physical_offsets: list[int], sizes: list[int], tag_codes: list[int]) -> bytes:
    """Pack consecutive entries with one struct call (a cached format per count)."""
    count = len(physical_offsets)
    packer = _entry_structs.get(count)
    if packer is None:
        packer = struct.Struct(">" + "qiq" * count)
        if len(_entry_structs) < 256:
            _entry_structs[count] = packer
    return packer.pack(*chain.from_iterable(zip(physical_offsets, sizes, tag_codes, strict=True)))


class ConsumeQueue:
    """The entries of one (topic, queue id).

    Args:
        directory: ``<root>/consumequeue/<topic>/<queueId>``, or None in memory.
        file_size: ``mapped_file_size_consume_queue`` (a multiple of 20).
        written: the set this queue adds itself to whenever it writes entries (the table's:
            the periodic flush syncs only the queues in it; ``ConsumeQueueTable``).
    """

    def __init__(self, topic: str, queue_id: int, directory: str | None, file_size: int,
                 written: set[ConsumeQueue] | None = None) -> None:
        self.topic = topic
        self._written: set[ConsumeQueue] = set() if written is None else written
        self.queue_id = queue_id
        self.queue = MappedFileQueue(directory, file_size, reserve_chunk=RESERVE_CHUNK_BYTES)
        self.file_size = file_size
        self._min_offset = 0
        # Segments made ahead by ensure_room, not yet in the queue.
        self._spares: list[MappedFile] = []
        # Store time of the newest entry written; the checkpoint's logics time uses it.
        self.last_store_timestamp = 0
        # A put jumped past max_offset (entries before it are missing): recovery rebuilds.
        self.jumped = False

    # -- offsets --------------------------------------------------------------------------------

    @property
    def max_offset(self) -> int:
        """The next queue offset to be written."""
        return self.queue.max_offset() // ENTRY_SIZE

    @property
    def min_offset(self) -> int:
        """The first readable queue offset."""
        return max(self._min_offset, self.queue.min_offset() // ENTRY_SIZE)

    def entry(self, queue_offset: int) -> tuple[int, int, int] | None:
        """(physical offset, size, tag code) at ``queue_offset``, or None if not stored."""
        byte_offset = queue_offset * ENTRY_SIZE
        mapped = self.queue.find_file(byte_offset)
        if mapped is None:
            return None
        position = byte_offset - mapped.file_from_offset
        if position + ENTRY_SIZE > mapped.write_position:
            return None
        try:
            return ENTRY.unpack_from(mapped.buffer, position)
        except ValueError:  # deleted by retention meanwhile
            return None

    def last_physical_end(self) -> int:
        """One past the last record this queue points at (0 when it has no real entry)."""
        offset = self.max_offset - 1
        if offset < self.min_offset:
            return 0
        found = self.entry(offset)
        if found is None or found[1] == FILLER_SIZE:
            return 0
        return found[0] + found[1]

    # -- writes ---------------------------------------------------------------------------------

    def adopt_first_segment(self, mapped: MappedFile) -> None:
        """Take ``mapped``, the empty first segment of this new queue made and mapped ahead
        (queue_file_preparer.py), as the queue's first segment."""
        assert self.queue.last_file() is None and mapped.file_from_offset == 0, mapped
        mapped.reserve_chunk = min(RESERVE_CHUNK_BYTES, self.file_size)
        self.queue.register(mapped)

    def ensure_room(self, entry_count: int) -> None:
        """Create (as spares) the segments ``entry_count`` more entries need and reserve
        their disk space, so a later ``put`` cannot fail half way or fault on a full disk.

        Raises:
            StoreFull / StoreError: a segment could not be created or reserved (nothing of
                the queue changed but spares, which later puts use).
        """
        last = self.queue.last_file()
        if last is not None and last.write_position + entry_count * ENTRY_SIZE <= (
            last.reserved_position
        ):
            return  # the common case: they fit the reserved part of the last segment
        end = self.queue.max_offset() + entry_count * ENTRY_SIZE
        if last is not None and end > last.file_from_offset + last.reserved_position:
            last.reserve(end - last.file_from_offset)
        start = last.file_from_offset + self.file_size if last is not None else 0
        for spare in self._spares:
            if start < end:
                spare.reserve(end - start)
            start = spare.file_from_offset + self.file_size
        while start < end:
            spare = self.queue.create_file(start, register=False)
            self._spares.append(spare)
            spare.reserve(end - start)
            start += self.file_size

    def next_offset_with_room(self, entry_count: int) -> int:
        """``max_offset`` after ``ensure_room(entry_count)``: the queue offset the next entry
        takes, with room made for ``entry_count`` entries from it.

        Raises:
            StoreFull / StoreError: as ``ensure_room``.
        """
        last = self.queue.last_file()
        if last is not None:
            position = last.write_position
            if position + entry_count * ENTRY_SIZE <= last.reserved_position:
                return (last.file_from_offset + position) // ENTRY_SIZE  # ensure_room's case
        self.ensure_room(entry_count)
        return self.max_offset

    def put(self, queue_offset: int, entries: bytes, store_timestamp: int) -> None:
        """Write packed entries whose first has ``queue_offset``.

        Entries below ``max_offset`` are already there (re-dispatch after a crash) and are
        skipped; a gap above it (a queue rebuilt from the middle) is padded with fillers.
        """
        self._written.add(self)
        mapped = self.queue.last_file()
        if mapped is not None:
            position = mapped.write_position
            if (
                position + len(entries) <= mapped.reserved_position
                and mapped.file_from_offset + position == queue_offset * ENTRY_SIZE
            ):
                # The common case (an append's entries, reserved by ensure_room): the next
                # entries, in the reserved part of the last segment, one copy.
                mapped.write(position, entries)
                self.last_store_timestamp = store_timestamp
                return
        expected = self.max_offset
        if queue_offset < expected:
            skip = (expected - queue_offset) * ENTRY_SIZE
            if skip >= len(entries):
                return
            entries = entries[skip:]
            queue_offset = expected
        elif queue_offset > expected:
            if queue_offset > QUEUE_OFFSET_MAX:
                # Only a damaged record can say this (its CRC covers the body, not the
                # header); taking it would make the queue's files unnameable.
                logger.error(
                    "not queueing a record of %s/%d with queue offset %d (above %d): the "
                    "record header is damaged", self.topic, self.queue_id, queue_offset,
                    QUEUE_OFFSET_MAX,
                )
                return
            self._jump_to(queue_offset, expected)
        self._write(entries)
        self.last_store_timestamp = store_timestamp

    def _jump_to(self, queue_offset: int, expected: int) -> None:
        # The next entry is not max_offset: the queue is rebuilt from the middle of the log,
        # or records are missing. Pad with fillers within a segment; a farther jump starts
        # the segment holding queue_offset, leaving a hole that reads as OFFSET_FOUND_NULL.
        byte_offset = queue_offset * ENTRY_SIZE
        last = self.queue.last_file()
        self.jumped = True
        if last is not None:
            logger.warning(
                "consume queue %s/%d jumps from offset %d to %d: records are missing from "
                "the commit log", self.topic, self.queue_id, expected, queue_offset,
            )
            if byte_offset < last.file_from_offset + self.file_size:
                self._write(_FILLER * (queue_offset - expected))
                return
        file_start = byte_offset - byte_offset % self.file_size
        self.queue.create_file(file_start)
        self._write(_FILLER * ((byte_offset - file_start) // ENTRY_SIZE))
        if last is None:
            self._min_offset = queue_offset

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        written = 0
        while written < len(view):
            mapped = self.queue.last_file()
            if mapped is None or mapped.free_bytes == 0:
                start = mapped.file_from_offset + self.file_size if mapped else 0
                if self._spares and self._spares[0].file_from_offset == start:
                    mapped = self._spares.pop(0)
                    self.queue.register(mapped)
                else:
                    mapped = self.queue.create_file(start)
            step = min(mapped.free_bytes, len(view) - written)
            end = mapped.write_position + step
            if end > mapped.reserved_position:
                # Re-dispatch and fillers come here without ensure_room.
                mapped.reserve(end)
            mapped.write(mapped.write_position, view[written : written + step])
            written += step

    # -- reads ----------------------------------------------------------------------------------

    def read_entries(self, queue_offset: int, max_bytes: int) -> memoryview | None:
        """Entries from ``queue_offset`` to the end of its segment's written part (at most
        ``max_bytes``), as a view of the mapping; None when that segment is missing."""
        byte_offset = queue_offset * ENTRY_SIZE
        mapped = self.queue.find_file(byte_offset)
        if mapped is None:
            return None
        position = byte_offset - mapped.file_from_offset
        end = min(mapped.write_position, position + max_bytes - max_bytes % ENTRY_SIZE)
        if end <= position:
            return None
        try:
            return mapped.buffer[position:end]
        except ValueError:
            return None

    def next_file_offset(self, queue_offset: int) -> int:
        """The queue offset where the segment after the one holding ``queue_offset`` starts."""
        byte_offset = queue_offset * ENTRY_SIZE
        return (byte_offset - byte_offset % self.file_size + self.file_size) // ENTRY_SIZE

    def first_offset_at_or_after(self, physical_offset: int) -> int:
        """The first queue offset whose entry is real and points at or after
        ``physical_offset`` (binary search; entries are in commit-log order). ``max_offset``
        when there is none. A missing segment in the middle counts as "at or after", so the
        min offset never jumps over it: reads there answer OFFSET_FOUND_NULL instead."""
        low = self.queue.min_offset() // ENTRY_SIZE
        high = best = self.max_offset
        while low < high:
            middle = (low + high) // 2
            probe = self._skip_fillers(middle, high)
            if probe >= high:  # only fillers in [middle, high)
                high = middle
                continue
            found = self.entry(probe)
            if found is not None and found[0] < physical_offset:
                low = probe + 1
            else:
                best = probe
                high = middle
        return best

    def _skip_fillers(self, queue_offset: int, limit: int) -> int:
        """The first offset in [queue_offset, limit) that is not a filler, else ``limit``.
        Compares whole runs of entries with a run of fillers (C speed): a padded or damaged
        queue may hold long runs of them."""
        while queue_offset < limit:
            byte_offset = queue_offset * ENTRY_SIZE
            mapped = self.queue.find_file(byte_offset)
            if mapped is None:
                return queue_offset
            position = byte_offset - mapped.file_from_offset
            end = min(mapped.write_position, position + (limit - queue_offset) * ENTRY_SIZE)
            buffer = mapped.buffer
            while position < end:
                step = min(end - position, len(_FILLER_RUN))
                if buffer[position : position + step] != _FILLER_RUN[:step]:
                    while buffer[position : position + ENTRY_SIZE] == _FILLER:
                        position += ENTRY_SIZE
                    return (mapped.file_from_offset + position) // ENTRY_SIZE
                position += step
            if end < mapped.file_size:  # reached the limit or the queue's end
                return min(limit, (mapped.file_from_offset + end) // ENTRY_SIZE)
            queue_offset = (mapped.file_from_offset + end) // ENTRY_SIZE
        return limit

    # -- maintenance ----------------------------------------------------------------------------

    def correct_min_offset(self, commit_log_min_offset: int) -> None:
        """Move ``min_offset`` to the first entry whose record is still in the commit log."""
        self._min_offset = self.first_offset_at_or_after(commit_log_min_offset)

    def blank_entries_in(self, physical_start: int, physical_end: int) -> int:
        """Turn every entry pointing into the commit-log range [physical_start, physical_end)
        (damaged: recovery.py) into a filler, which readers skip; return how many."""
        offset = self.first_offset_at_or_after(physical_start)
        count = 0
        while offset < self.max_offset:
            found = self.entry(offset)
            if found is None or found[1] == FILLER_SIZE:
                offset += 1
                continue
            if found[0] >= physical_end:
                break
            mapped = self.queue.find_file(offset * ENTRY_SIZE)
            assert mapped is not None
            position = offset * ENTRY_SIZE - mapped.file_from_offset
            mapped.buffer[position : position + ENTRY_SIZE] = _FILLER
            self._written.add(self)
            count += 1
            offset += 1
        if count:
            logger.warning(
                "consume queue %s/%d: %d entries point into the damaged commit-log range "
                "%d-%d; made them fillers (those messages are lost, the rest are served)",
                self.topic, self.queue_id, count, physical_start, physical_end,
            )
        return count

    def truncate_from_physical(self, physical_end: int) -> int:
        """Drop every entry whose record does not end at or before ``physical_end``; return
        how many entries were dropped."""
        max_offset = self.max_offset
        low = self.queue.min_offset() // ENTRY_SIZE
        high = max_offset
        # First entry whose record ends past physical_end (fillers never do).
        while low < high:
            middle = (low + high) // 2
            found = self.entry(middle)
            if found is None or found[1] == FILLER_SIZE or found[0] + found[1] <= physical_end:
                low = middle + 1
            else:
                high = middle
        if low < max_offset:
            self._written.add(self)
            self.queue.truncate_dirty(low * ENTRY_SIZE)
            self._min_offset = min(self._min_offset, low)
        return max_offset - low

    def delete_files_below(self, commit_log_min_offset: int) -> int:
        """Delete whole segments (never the last) whose entries all point below
        ``commit_log_min_offset``; return how many were deleted."""
        files = self.queue.files
        count = 0
        for mapped in files[:-1]:
            last_position = mapped.write_position - ENTRY_SIZE
            if last_position < 0:
                break
            physical_offset, size, _ = ENTRY.unpack_from(mapped.buffer, last_position)
            if size != FILLER_SIZE and physical_offset >= commit_log_min_offset:
                break
            count += 1
        if count:
            self.queue.delete_first_files(count)
        return count

    def recover(self) -> None:
        """Set each segment's write position from its content: scan the last few segments
        for the last entry with a size (zeros end the queue); earlier segments are full."""
        files = self.queue.files
        if not files:
            return
        start = max(0, len(files) - RECOVER_FILE_COUNT)
        for mapped in files[:start]:
            mapped.write_position = mapped.flushed_position = self.file_size
        for index in range(start, len(files)):
            mapped = files[index]
            end = _last_entry_end(mapped)
            mapped.write_position = mapped.flushed_position = end
            if end < self.file_size:
                # The queue ends here: later segments hold nothing valid.
                self.queue.truncate_dirty(mapped.file_from_offset + end)
                break
        self.queue.flushed_where = self.queue.max_offset()
        first = self.queue.first_file()
        if first is not None:
            self._min_offset = max(self._min_offset, first.file_from_offset // ENTRY_SIZE)

    def flush(self) -> int:
        """Sync written entries; return the flushed byte offset (appends go on meanwhile)."""
        return sync_mapped_files(self.queue)

    def close(self) -> None:
        """Unmap the segments (unused spares are deleted)."""
        self._drop_spares()
        self.queue.close()

    def destroy(self) -> None:
        """Delete the queue's segments and its directory."""
        self._drop_spares()
        self.queue.destroy()

    def _drop_spares(self) -> None:
        spares, self._spares = self._spares, []
        for spare in spares:
            spare.destroy()

    def segments(self) -> tuple[MappedFile, ...]:
        """The queue's segments, oldest first."""
        return self.queue.files


def _last_entry_end(mapped: MappedFile) -> int:
    # Entries are written front to back and the rest of a segment is zeros, so the written
    # part is the prefix of entries with a size (fillers included): binary search its end
    # rather than walk 300,000 entries per segment in Python.
    buffer = mapped.buffer
    low, high = 0, mapped.file_size // ENTRY_SIZE
    while low < high:
        middle = (low + high) // 2
        physical_offset, size, _ = ENTRY.unpack_from(buffer, middle * ENTRY_SIZE)
        if size > 0 and physical_offset >= 0:
            low = middle + 1
        else:
            high = middle
    return low * ENTRY_SIZE

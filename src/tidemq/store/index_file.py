"""The hash index: message keys to commit-log offsets, RocketMQ's index file byte for byte.

An index file lives at ``<storePathRootDir>/index/<yyyyMMddHHmmssSSS>``, named by the local time
it was created, and has a fixed size, so all three parts sit at known offsets. Big-endian::

    header (40 bytes)
      off  size  field
        0     8  beginTimestamp      store time (ms) of the first entry
        8     8  endTimestamp        store time (ms) of the last entry
       16     8  beginPhyOffset      commit-log offset of the first entry's message
       24     8  endPhyOffset        commit-log offset of the last entry's message
       32     4  hashSlotCount       slots in use (a statistic; nothing depends on it)
       36     4  indexCount          next entry number; starts at 1, so entry 0 is never used
    hash slots (max_hash_slot_num x 4 bytes) at 40
      slot s = int32 number of the newest entry whose keyHash % max_hash_slot_num == s,
               0 when the slot is empty
    entries (max_index_num x 20 bytes) at 40 + max_hash_slot_num * 4
      off  size  field
        0     4  keyHash             abs(Java String.hashCode("topic#key")), MIN_VALUE -> 0
        4     8  phyOffset           commit-log offset of the message
       12     4  timeDiff            seconds from beginTimestamp, clamped to [0, 2^31 - 1]
       16     4  prevIndex           the previous entry of the same slot's chain, 0 = end

    file size = 40 + max_hash_slot_num * 4 + max_index_num * 20
              = 40 + 20,000,000 + 400,000,000 = 420,000,040 bytes by default

Entry n sits at ``40 + max_hash_slot_num * 4 + n * 20``; a file is full when indexCount reaches
max_index_num, and the next key goes to a new file that starts with the previous file's end
offset and time. Files are sized sparse (truncate, never written with zeros) and mmap'd, and
their disk is reserved (``posix_fallocate``) before any page is written through the mapping:
the header and the slot table (written at random) when the file is created, the entries (written
in order) ``ENTRY_RESERVE_CHUNK_BYTES`` at a time as they fill. The store asks for room for
an append's keys before the commit-log write (``IndexService.ensure_room``), so a full disk
refuses the append instead of faulting (SIGBUS) on a write to an unallocated page.
There is no checksum: the index is derived data, rebuilt from the commit log.

A message is indexed under ``topic#UNIQ_KEY`` and ``topic#<each KEYS token>``. A batch of
messages (``put_columns``, ``put_many``) writes exactly the bytes its messages put one by one
would: its keys are hashed together (key position by key position when every message has
as many), its slots' chain heads read with one call, its entries (consecutive) written field
by field, each field of all entries one strided copy into the mapped file, and its slots
set in one loop, unless two of its keys share a slot, which then go one by one.

A query hashes ``topic#key``, reads the slot and walks the chain backwards (entries only ever
point to older entries), keeping offsets whose keyHash matches and whose time
``beginTimestamp + timeDiff * 1000`` lies in the window; hash collisions are left for the
caller, who reads the message and compares its keys. Files are searched newest first, only
those whose [begin, end] time range overlaps the window.

After a crash: the store's checkpoint records ``last_flushed_timestamp_ms``, the end time of
the index as of its last flush. An unclean ``load`` deletes every file whose endTimestamp is
newer than that (as RocketMQ does); recovery re-dispatches the commit log past its own recovery
point, and ``put`` skips messages at or below ``last_update_physical_offset``, so re-dispatch
never indexes a message twice. Entries of a deleted file that precede the recovery point are
not rebuilt (RocketMQ behaves the same): queries by key for those messages find nothing.

Threads: ``put``, ``put_columns`` and ``put_many`` run on the dispatching thread, ``query``
on request threads, ``flush`` on the flush thread and ``delete_files_below`` on retention. All
take the service's lock; a query walks at most ``max_index_num`` entries per file, so it holds
the lock for a bounded time, and ``flush`` waits for the disk outside it (a second lock keeps
files from closing meanwhile).

Disk full: see above; ``StoreFull`` names the file and what could not be reserved.

Faulting the slot table in ahead (``IndexService.prepare``, which the broker calls at start):
every key writes a slot at random, so a new file's first keys each take a page fault on the
appending thread (the event loop), ~3 us each for the table's ~4,900 pages, and the first
touch of each large page-cache folio (up to 2 MiB here) allocates and zeroes it: measured
1-3 ms each pinned, 5-8 ms for a file's first touch, tens of ms on a busy machine, about ten
of them within a new file's first few dozen keys. The broker's first message waited ~10 ms for
its index file. So a prepared service creates its first file at start and has a thread ask
the kernel (``madvise(MADV_POPULATE_WRITE)``, Linux 5.14+, called through ctypes so the GIL
is released) to fault in the header and slot table of each new file writable; the slots'
zero pages are then dirty and the next sync writes the table whole (20 MB by default), once
per file. Without the kernel's support nothing changes. Tests and tools that open a store
without preparing it keep the lazy behaviour (a file at the first key, faults as it fills).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import struct
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, repeat
from operator import itemgetter, mod
from pathlib import Path

from tidemq.errors import StoreError, StoreFull
from tidemq.protocol.message import java_string_abs_hashes, java_string_hash
from tidemq.store.key_columns import KeyColumns
from tidemq.store.mapped_file import populate_writable

log = logging.getLogger(__name__)

INDEX_HEADER_SIZE = 40  # 8 + 8 + 8 + 8 + 4 + 4
HASH_SLOT_SIZE = 4
INDEX_ENTRY_SIZE = 20  # 4 + 8 + 4 + 4

# RocketMQ's defaults (MessageStoreConfig.maxHashSlotNum / maxIndexNum): 20M keys per file at
# four entries per slot on average when full, so a query walks short chains.
MAX_HASH_SLOT_NUM_DEFAULT = 5_000_000
MAX_INDEX_NUM_DEFAULT = 20_000_000

_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")
_SLOT = struct.Struct(">i")
_pack_entry = _ENTRY.pack_into
_pack_slot = _SLOT.pack_into
_unpack_slot = _SLOT.unpack_from
_INT32_MAX = 2**31 - 1
_INT32_MIN = -(2**31)
_FILE_NAME = re.compile(r"^[0-9]{17}$")
# Entries are reserved this many bytes (52,428 entries) at a time as the file fills.
ENTRY_RESERVE_CHUNK_BYTES = 1 << 20

# A batch reads and writes its slots through a native uint32 view of the slot table (one C
# call per batch instead of one struct call per key); the file is big-endian, so on a
# little-endian machine the values are byte-swapped on the way in and out.
_SLOT_TYPECODE = "I"
assert array(_SLOT_TYPECODE).itemsize == HASH_SLOT_SIZE
_SWAP_SLOTS = sys.byteorder == "little"

# An entry is five 32-bit words: keyHash, phyOffset (high, low), timeDiff, prevIndex.
_ENTRY_WORDS = INDEX_ENTRY_SIZE // HASH_SLOT_SIZE
_OFFSET_TYPECODE = "q"
assert array(_OFFSET_TYPECODE).itemsize == 8
# Below this many keys the batch steps cost more than they save (measured: a message's two
# keys go faster one by one, eight and more faster as a batch).
_BATCH_KEYS_MIN = 8


def index_file_size(max_hash_slot_num: int, max_index_num: int) -> int:
    """Bytes of an index file with these settings (420,000,040 for the defaults)."""
    return INDEX_HEADER_SIZE + max_hash_slot_num * HASH_SLOT_SIZE + max_index_num * INDEX_ENTRY_SIZE


def index_key_hash(key: str) -> int:
    """The keyHash of an indexed key (``topic#key``): abs(Java hashCode), MIN_VALUE -> 0."""
    value = java_string_hash(key)
    return 0 if value == _INT32_MIN else abs(value)


def index_key_hashes(topic: str, keys: Sequence[str]) -> list[int]:
    """``index_key_hash(topic + "#" + key)`` for each key, computed for the whole batch."""
    return java_string_abs_hashes(keys, topic + "#")


class IndexFile:
    """One mmap'd index file. Not thread-safe: :class:`IndexService` serialises access."""

    __slots__ = (
        "_entries_base",
        "_entry_words",
        "_fd",
        "_mmap",
        "_populate_lock",
        "_slots",
        "begin_physical_offset",
        "begin_timestamp_ms",
        "end_physical_offset",
        "end_timestamp_ms",
        "hash_slot_count",
        "index_count",
        "max_hash_slot_num",
        "max_index_num",
        "path",
        "reserved_end",
    )

    def __init__(
        self, path: Path, fd: int, mapped: mmap.mmap, max_hash_slot_num: int, max_index_num: int
    ):
        self.path = path
        self._fd = fd
        self._mmap = mapped
        self.max_hash_slot_num = max_hash_slot_num
        self.max_index_num = max_index_num
        self._entries_base = INDEX_HEADER_SIZE + max_hash_slot_num * HASH_SLOT_SIZE
        # Native-order view of the slot table; released in close() so the map can be closed.
        self._slots = memoryview(mapped)[INDEX_HEADER_SIZE : self._entries_base].cast(
            _SLOT_TYPECODE
        )
        # The entries as native 32-bit words, five per entry: a batch writes each field of
        # all its entries with one strided copy (released in close() too).
        self._entry_words = memoryview(mapped)[self._entries_base :].cast(_SLOT_TYPECODE)
        (
            self.begin_timestamp_ms,
            self.end_timestamp_ms,
            self.begin_physical_offset,
            self.end_physical_offset,
            self.hash_slot_count,
            self.index_count,
        ) = _HEADER.unpack_from(mapped, 0)
        # A file created but never written reads as all zeros; entry numbering starts at 1.
        self.index_count = max(self.index_count, 1)
        # How far the file's disk is known to be reserved (0: unknown, a file from disk).
        self.reserved_end = 0
        # Held while a thread faults the mapping in (``populate``): ``close`` waits for it, so
        # the kernel is never asked about an address range that is no longer this file's.
        self._populate_lock = threading.Lock()

    @classmethod
    def create(
        cls,
        path: Path,
        max_hash_slot_num: int,
        max_index_num: int,
        *,
        end_physical_offset: int = 0,
        end_timestamp_ms: int = 0,
    ) -> IndexFile:
        """Create a sparse file that continues where the previous file ended."""
        size = index_file_size(max_hash_slot_num, max_index_num)
        # Header and slots now (slots are written at random), the first entries too.
        reserved = min(size, INDEX_HEADER_SIZE + max_hash_slot_num * HASH_SLOT_SIZE
                       + ENTRY_RESERVE_CHUNK_BYTES)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, size)  # sparse beyond what is reserved
            _reserve(fd, path, 0, reserved)
            mapped = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        index_file = cls(path, fd, mapped, max_hash_slot_num, max_index_num)
        index_file.reserved_end = reserved
        index_file.begin_physical_offset = index_file.end_physical_offset = end_physical_offset
        index_file.begin_timestamp_ms = index_file.end_timestamp_ms = end_timestamp_ms
        index_file.write_header()
        return index_file

    @classmethod
    def open(cls, path: Path, max_hash_slot_num: int, max_index_num: int) -> IndexFile:
        """Map an existing file.

        Raises:
            StoreError: the file's size does not match the settings it is opened with.
        """
        size = index_file_size(max_hash_slot_num, max_index_num)
        fd = os.open(path, os.O_RDWR)
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise StoreError(
                    f"index file {path} is {actual} bytes, but max_hash_slot_num="
                    f"{max_hash_slot_num} and max_index_num={max_index_num} make {size}; set "
                    "maxHashSlotNum and maxIndexNum back to the values it was written with, "
                    "or delete the index directory to start a new index"
                )
            mapped = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, mapped, max_hash_slot_num, max_index_num)

    def header_problem(self) -> str | None:
        """Why the header cannot be trusted, or None when it is sane."""
        if not 1 <= self.index_count <= self.max_index_num:
            return f"indexCount {self.index_count} is outside 1..{self.max_index_num}"
        if self.index_count > 1 and self.end_timestamp_ms < self.begin_timestamp_ms:
            return (
                f"endTimestamp {self.end_timestamp_ms} is before beginTimestamp "
                f"{self.begin_timestamp_ms}"
            )
        return None

    def room(self) -> int:
        """How many more entries the file takes."""
        return self.max_index_num - self.index_count

    def reserve_entries(self, count: int) -> None:
        """Reserve disk for the next ``count`` entries (at most what the file holds), in
        ``ENTRY_RESERVE_CHUNK_BYTES`` steps, before they are written.

        Raises:
            StoreFull: the volume has no room (nothing was written).
        """
        end = self._entries_base + (self.index_count + count) * INDEX_ENTRY_SIZE
        if end <= self.reserved_end:
            return
        size = self._entries_base + self.max_index_num * INDEX_ENTRY_SIZE
        target = min(size, end + ENTRY_RESERVE_CHUNK_BYTES)
        _reserve(self._fd, self.path, self.reserved_end, target - self.reserved_end)
        self.reserved_end = target

    @property
    def is_full(self) -> bool:
        """No room for another entry: the next key goes to a new file."""
        return self.index_count >= self.max_index_num

    @property
    def is_empty(self) -> bool:
        """No entry yet (entry numbers start at 1)."""
        return self.index_count <= 1

    def put_keys(
        self, key_hashes: list[int], start: int, physical_offset: int, store_timestamp_ms: int
    ) -> int:
        """Append entries for ``key_hashes[start:]`` of one message, each becoming the head of
        its slot's chain, until the file is full; then write the header.

        Returns:
            The position in ``key_hashes`` after the last one written (``len`` when all fit).
        """
        offsets = [physical_offset] * len(key_hashes)
        return self.put_entries(key_hashes, offsets, start, store_timestamp_ms)

    def put_entries(
        self,
        key_hashes: Sequence[int],
        physical_offsets: Sequence[int],
        start: int,
        store_timestamp_ms: int,
    ) -> int:
        """Append an entry per key from ``start`` on (``physical_offsets[i]`` is the offset of
        the message key ``i`` belongs to, in commit-log order), each becoming the head of its
        slot's chain, until the file is full; then write the header once.

        Returns:
            The position after the last key written (``len(key_hashes)`` when all fit).
        """
        index_count = self.index_count
        fit = min(len(key_hashes), start + self.max_index_num - index_count)
        if fit <= start:
            return start
        # Normally reserved ahead by IndexService.ensure_room; re-dispatch comes here alone.
        self.reserve_entries(fit - start)
        if index_count <= 1:
            # RocketMQ computes the first entry's timeDiff against the carried-over begin time
            # and then moves begin; setting begin first keeps the first entry's time exact.
            self.begin_physical_offset = physical_offsets[start]
            self.begin_timestamp_ms = store_timestamp_ms
        time_diff_s = (store_timestamp_ms - self.begin_timestamp_ms) // 1000
        if time_diff_s < 0:
            time_diff_s = 0
        elif time_diff_s > _INT32_MAX:
            time_diff_s = _INT32_MAX
        last_offset = physical_offsets[fit - 1]
        if fit - start < _BATCH_KEYS_MIN:
            # A few keys (one message) cost less one at a time.
            self._put_one_by_one(key_hashes, physical_offsets, start, fit, time_diff_s)
        else:
            if start or fit < len(key_hashes):
                key_hashes = key_hashes[start:fit]
                physical_offsets = physical_offsets[start:fit]
            slot_numbers = list(map(mod, key_hashes, repeat(self.max_hash_slot_num)))
            if len(set(slot_numbers)) == len(slot_numbers):
                self._put_distinct_slots(key_hashes, physical_offsets, slot_numbers, time_diff_s)
            else:
                # Two keys share a slot (often the same key twice): the later one must
                # chain to the earlier one's entry, so go one at a time.
                self._put_one_by_one(key_hashes, physical_offsets, 0, len(key_hashes),
                                     time_diff_s)
        self.end_physical_offset = last_offset
        self.end_timestamp_ms = store_timestamp_ms
        self.write_header()
        return fit

    def _put_distinct_slots(
        self,
        key_hashes: Sequence[int],
        physical_offsets: Sequence[int],
        slot_numbers: list[int],
        time_diff_s: int,
    ) -> None:
        # Every key has its own slot: read all chain heads (one itemgetter call), write each
        # field of all the entries (consecutive) with one strided copy into the entry words,
        # then point every slot at its new entry. The words are native, the file big-endian:
        # each column is byte-swapped on a little-endian machine, so the heads as read from
        # the file are already what the entries' prevIndex field holds.
        slots = self._slots
        index_count = self.index_count
        count = len(key_hashes)  # at least _BATCH_KEYS_MIN: itemgetter returns a tuple
        file_heads = array(_SLOT_TYPECODE, itemgetter(*slot_numbers)(slots))
        heads = file_heads
        if _SWAP_SLOTS:
            heads = array(_SLOT_TYPECODE, file_heads)
            heads.byteswap()
        if max(heads) >= index_count:
            # A head past the last entry (a damaged or half-rebuilt file; negative int32s read
            # as large here) starts a new chain rather than point at garbage.
            heads = array(_SLOT_TYPECODE, [h if h < index_count else 0 for h in heads])
            file_heads = array(_SLOT_TYPECODE, heads)
            if _SWAP_SLOTS:
                file_heads.byteswap()
        self.hash_slot_count += heads.count(0)
        hashes = array(_SLOT_TYPECODE, key_hashes)
        offsets = array(_OFFSET_TYPECODE, physical_offsets)
        time_diffs = array(_SLOT_TYPECODE, (time_diff_s,)) * count
        numbers = array(_SLOT_TYPECODE, range(index_count, index_count + count))
        if _SWAP_SLOTS:
            hashes.byteswap()
            offsets.byteswap()
            time_diffs.byteswap()
            numbers.byteswap()
        # Big-endian int64s seen as pairs of words: the high word first.
        offset_words = memoryview(offsets).cast("B").cast(_SLOT_TYPECODE)
        words = self._entry_words
        first = index_count * _ENTRY_WORDS
        end = first + count * _ENTRY_WORDS
        words[first:end:_ENTRY_WORDS] = hashes
        words[first + 1 : end : _ENTRY_WORDS] = offset_words[0::2]
        words[first + 2 : end : _ENTRY_WORDS] = offset_words[1::2]
        words[first + 3 : end : _ENTRY_WORDS] = time_diffs
        words[first + 4 : end : _ENTRY_WORDS] = file_heads
        offset_words.release()
        # Each slot points at its entry: one C-level map of the slots' __setitem__ (``any``
        # only drives it: every call returns None), no Python step per key.
        any(map(slots.__setitem__, slot_numbers, numbers))
        self.index_count = index_count + count

    def _put_one_by_one(
        self,
        key_hashes: Sequence[int],
        physical_offsets: Sequence[int],
        start: int,
        end: int,
        time_diff_s: int,
    ) -> None:
        # Per key: one slot read, one entry write, one slot write, all straight on the mmap.
        mapped = self._mmap
        index_count = self.index_count
        slot_num = self.max_hash_slot_num
        entries_base = self._entries_base
        for position in range(start, end):
            key_hash = key_hashes[position]
            slot_position = INDEX_HEADER_SIZE + (key_hash % slot_num) * HASH_SLOT_SIZE
            chain_head = _unpack_slot(mapped, slot_position)[0]
            if chain_head <= 0 or chain_head >= index_count:
                chain_head = 0
                self.hash_slot_count += 1
            _pack_entry(
                mapped,
                entries_base + index_count * INDEX_ENTRY_SIZE,
                key_hash,
                physical_offsets[position],
                time_diff_s,
                chain_head,
            )
            _pack_slot(mapped, slot_position, index_count)
            index_count += 1
        self.index_count = index_count

    def cut_entries_from(self, physical_offset: int,
                         timestamp_at: Callable[[int], int | None]) -> int:
        """Remove the entries of messages at or after ``physical_offset`` (the commit log was
        truncated there), newest first, each slot pointing back to the entry its removed head
        chained to; then write the header. Entries follow commit-log order, so the removed
        ones are the file's last. Idempotent (a crash part way is redone from the header).

        Args:
            timestamp_at: the store time of the message at an offset (the header's new end
                time), None when unknown (then the entry's second is used).
        Returns:
            How many entries were removed.
        """
        mapped = self._mmap
        entries_base = self._entries_base
        slot_num = self.max_hash_slot_num
        number = self.index_count
        while number > 1:
            key_hash, entry_offset, _, previous = _ENTRY.unpack_from(
                mapped, entries_base + (number - 1) * INDEX_ENTRY_SIZE)
            if entry_offset < physical_offset:
                break
            number -= 1
            slot_position = INDEX_HEADER_SIZE + (key_hash % slot_num) * HASH_SLOT_SIZE
            if _unpack_slot(mapped, slot_position)[0] == number:
                head = previous if 0 < previous < number else 0
                _pack_slot(mapped, slot_position, head)
                if head == 0:
                    self.hash_slot_count = max(0, self.hash_slot_count - 1)
        removed = self.index_count - number
        if removed == 0:
            return 0
        self.index_count = number
        if number > 1:
            _, end_offset, time_diff_s, _ = _ENTRY.unpack_from(
                mapped, entries_base + (number - 1) * INDEX_ENTRY_SIZE)
            self.end_physical_offset = end_offset
            stored = timestamp_at(end_offset)
            self.end_timestamp_ms = (stored if stored is not None
                                     else self.begin_timestamp_ms + time_diff_s * 1000)
        else:
            self.end_physical_offset = self.begin_physical_offset
            self.end_timestamp_ms = self.begin_timestamp_ms
        self.write_header()
        return removed

    def write_header(self) -> None:
        """Store the in-memory header fields into the file's first 40 bytes."""
        _HEADER.pack_into(
            self._mmap,
            0,
            self.begin_timestamp_ms,
            self.end_timestamp_ms,
            self.begin_physical_offset,
            self.end_physical_offset,
            self.hash_slot_count,
            self.index_count,
        )

    def overlaps(self, begin_ms: int, end_ms: int) -> bool:
        """Whether the file's [begin, end] store-time range meets the window [begin_ms, end_ms]."""
        return self.begin_timestamp_ms <= end_ms and begin_ms <= self.end_timestamp_ms

    def collect(
        self,
        key_hash: int,
        begin_ms: int,
        end_ms: int,
        max_count: int,
        found: list[int],
        seen: set[int],
    ) -> None:
        """Append to ``found`` the offsets of entries matching the hash and the time window.

        Stops at ``max_count`` offsets in ``found``, at the end of the chain, or at the first
        entry older than the window (the chain runs newest to oldest).
        """
        mapped = self._mmap
        index_count = self.index_count
        slot_position = INDEX_HEADER_SIZE + (key_hash % self.max_hash_slot_num) * HASH_SLOT_SIZE
        entry_number = _SLOT.unpack_from(mapped, slot_position)[0]
        entries_base = self._entries_base
        begin_timestamp_ms = self.begin_timestamp_ms
        # Entry numbers strictly decrease along a sane chain; checking that bounds the walk
        # even in a damaged file.
        while 0 < entry_number < index_count and len(found) < max_count:
            entry_hash, physical_offset, time_diff_s, previous = _ENTRY.unpack_from(
                mapped, entries_base + entry_number * INDEX_ENTRY_SIZE
            )
            entry_time_ms = begin_timestamp_ms + time_diff_s * 1000
            if (
                entry_hash == key_hash
                and begin_ms <= entry_time_ms <= end_ms
                and physical_offset not in seen
            ):
                seen.add(physical_offset)
                found.append(physical_offset)
            if entry_time_ms < begin_ms or previous >= entry_number:
                break
            entry_number = previous

    def flush(self) -> None:
        """Write the file's dirty pages to disk.

        fsync on the descriptor rather than ``mmap.flush``: on Linux both write the page cache
        that the shared mapping dirtied, but fsync releases the GIL while it waits.
        """
        os.fsync(self._fd)

    def populate(self) -> bool:
        """Fault the header and the hash-slot table in writable, without holding the GIL:
        later slot writes find their pages mapped (module docstring, "Faulting the slot table
        in ahead"). Safe beside concurrent puts (the kernel does what a write fault would,
        the bytes stay as they are); ``close`` waits for it.

        Returns:
            True when the kernel did it; False where it cannot (not Linux, a kernel before
            5.14, a closed file), which changes nothing but the faults.
        """
        if not sys.platform.startswith("linux"):
            return False
        with self._populate_lock:
            if self._mmap.closed:
                return False
            length = min(len(self._mmap), self._entries_base)
            length += -length % mmap.PAGESIZE  # whole pages; the mapping is longer anyway
            length = min(length, len(self._mmap))
            # The mapping stays mapped while the lock keeps close out.
            return populate_writable(self._mmap, length)

    def close(self) -> None:
        """Unmap the file and close its descriptor (after a ``populate`` in progress)."""
        with self._populate_lock:
            self._slots.release()
            self._entry_words.release()
            self._mmap.close()
            os.close(self._fd)

    def delete(self) -> None:
        """Close and remove the file."""
        self.close()
        self.path.unlink(missing_ok=True)


class IndexService:
    """The index files of one store: put keys as messages are dispatched, query by key and time.

    Args:
        index_dir: ``<storePathRootDir>/index``; created when missing.
        max_hash_slot_num: hash slots per file (RocketMQ ``maxHashSlotNum``).
        max_index_num: entries per file (RocketMQ ``maxIndexNum``); entry 0 is never used,
            so a file holds ``max_index_num - 1`` keys.
    """

    def __init__(
        self,
        index_dir: str | os.PathLike[str],
        *,
        max_hash_slot_num: int = MAX_HASH_SLOT_NUM_DEFAULT,
        max_index_num: int = MAX_INDEX_NUM_DEFAULT,
    ):
        if max_hash_slot_num < 1 or max_index_num < 2:
            raise ValueError(
                f"max_hash_slot_num={max_hash_slot_num} and max_index_num={max_index_num}: "
                "need at least 1 slot and 2 entries (entry 0 is never used)"
            )
        self.index_dir = Path(index_dir)
        self.max_hash_slot_num = max_hash_slot_num
        self.max_index_num = max_index_num
        self._files: list[IndexFile] = []
        self._dirty: set[IndexFile] = set()
        # _lock guards the file list and the mmaps (every method). _flush_lock is held by the
        # methods that may close a file (flush, close, destroy, load, delete_files_below) so
        # flush can fsync outside _lock without a file closing under it. Order: _flush_lock,
        # then _lock.
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._last_physical_offset = -1
        self._last_flushed_timestamp_ms = 0
        self._closed = False
        # ``prepare`` was called: each new file's slot table is faulted in by a thread.
        self._populate_new_files = False
        self._populating: list[threading.Thread] = []
        self.populated_files = 0  # files the kernel faulted in ahead (tests, logs)
        # What ``load`` found damaged (and deleted); recovery then rebuilds the whole index.
        self.load_problems: list[str] = []

    # -- state ----------------------------------------------------------------------------------

    @property
    def last_update_physical_offset(self) -> int:
        """Commit-log offset of the newest indexed message; -1 when nothing is indexed."""
        return self._last_physical_offset

    @property
    def last_update_timestamp_ms(self) -> int:
        """Store time of the newest indexed message; 0 when nothing is indexed."""
        return self._files[-1].end_timestamp_ms if self._files else 0

    @property
    def last_flushed_timestamp_ms(self) -> int:
        """``last_update_timestamp_ms`` as of the last :meth:`flush`: what the checkpoint's
        indexMsgTimestamp may record, since only flushed entries are sure to survive a crash."""
        return self._last_flushed_timestamp_ms

    @property
    def file_paths(self) -> list[Path]:
        """The index files, oldest first."""
        with self._lock:
            return [index_file.path for index_file in self._files]

    # -- lifecycle ------------------------------------------------------------------------------

    def load(self, clean_exit: bool, checkpoint_index_timestamp_ms: int) -> None:
        """Open the existing index files, oldest (by name) first.

        Args:
            clean_exit: False after a crash (the store found its ``abort`` file).
            checkpoint_index_timestamp_ms: the checkpoint's indexMsgTimestamp. After a crash,
                files with entries newer than this may be torn, so they are deleted, to be
                rebuilt by re-dispatch.

        Raises:
            StoreError: a file's size does not match max_hash_slot_num / max_index_num, or
                the directory cannot be read.
        """
        with self._flush_lock, self._lock:
            self._check_open()
            for index_file in self._files:
                index_file.close()
            self._files, self._dirty = [], set()
            try:
                self.index_dir.mkdir(parents=True, exist_ok=True)
                names = sorted(p.name for p in self.index_dir.iterdir() if _FILE_NAME.match(p.name))
            except OSError as exc:
                raise StoreError(f"cannot read index directory {self.index_dir}: {exc}") from exc
            self.load_problems = []
            size = index_file_size(self.max_hash_slot_num, self.max_index_num)
            sizes = {name: (self.index_dir / name).stat().st_size for name in names}
            for name in names:
                if sizes[name] != size:
                    # Derived data: rebuilt from the log either way (a changed setting too).
                    self._drop_damaged(
                        name, f"it is {sizes[name]} bytes, not the {size} that "
                        f"maxHashSlotNum={self.max_hash_slot_num} and maxIndexNum="
                        f"{self.max_index_num} make: cut short, or written with other settings",
                    )
                    continue
                index_file = self._open_existing(name, clean_exit, checkpoint_index_timestamp_ms)
                if index_file is not None:
                    self._files.append(index_file)
            for index_file in list(self._files[:-1]):
                if index_file.is_empty and index_file.end_timestamp_ms == 0:
                    # Only a first file starts at time 0, and a first file is never followed
                    # by an empty one: this one was zeroed.
                    self._files.remove(index_file)
                    index_file.delete()
                    self.load_problems.append(f"index file {index_file.path} is all zeros")
            self._last_physical_offset = self._indexed_end_offset()
            self._last_flushed_timestamp_ms = self.last_update_timestamp_ms

    def prepare(self) -> None:
        """Make the first file now when there is none, and have a thread fault in the header
        and slot table of it and of every file created from now on (module docstring,
        "Faulting the slot table in ahead"), so a new file's first keys cost what later ones
        do on the appending thread.

        Raises:
            StoreFull / StoreError: the first file cannot be created (nothing changed).
        """
        with self._lock:
            self._check_open()
            self._populate_new_files = True
            if not self._files:
                self._roll(None)

    def wait_prepared(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the files' faulting-in to end (tests, tools); True
        when none is in progress."""
        deadline = time.monotonic() + timeout_s
        for thread in list(self._populating):
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._populating)

    def _populate_in_background(self, index_file: IndexFile) -> None:
        def populate() -> None:
            if index_file.populate():
                with self._lock:
                    self.populated_files += 1

        thread = threading.Thread(target=populate, name="tidemq-index-populate", daemon=True)
        self._populating = [t for t in self._populating if t.is_alive()] + [thread]
        thread.start()

    def _drop_damaged(self, name: str, problem: str) -> None:
        path = self.index_dir / name
        log.warning("index file %s is damaged (%s); deleted it", path, problem)
        path.unlink(missing_ok=True)
        self.load_problems.append(f"index file {path} was damaged ({problem})")

    def _open_existing(
        self, name: str, clean_exit: bool, checkpoint_index_timestamp_ms: int
    ) -> IndexFile | None:
        """Open one file for ``load``, or delete it and return None when it cannot be trusted."""
        path = self.index_dir / name
        try:
            index_file = IndexFile.open(path, self.max_hash_slot_num, self.max_index_num)
        except OSError as exc:
            raise StoreError(f"cannot open index file {path}: {exc}") from exc
        problem = index_file.header_problem()
        if problem:
            # Derived data: dropping it loses key lookups for old messages, never messages.
            log.warning("index file %s has a damaged header (%s); deleted it", path, problem)
            index_file.delete()
            self.load_problems.append(f"index file {path} had a damaged header ({problem})")
            return None
        if not clean_exit and index_file.end_timestamp_ms > checkpoint_index_timestamp_ms:
            log.warning(
                "index file %s ends at %d, after the checkpoint's index time %d; deleted it "
                "after the unclean shutdown, re-dispatch rebuilds what follows the recovery point",
                path,
                index_file.end_timestamp_ms,
                checkpoint_index_timestamp_ms,
            )
            index_file.delete()
            return None
        return index_file

    def flush(self) -> None:
        """Write every changed page of every changed file to disk.

        Puts and queries go on meanwhile: the disk wait happens outside the index lock.

        Raises:
            StoreError: the fsync failed; the files stay marked for the next flush.
        """
        with self._flush_lock:
            self._flush_dirty()

    def _flush_dirty(self) -> None:
        with self._lock:
            if self._closed:
                return
            dirty, self._dirty = self._dirty, set()
            flushed_timestamp_ms = self.last_update_timestamp_ms
        try:
            for index_file in dirty:
                index_file.flush()
        except OSError as exc:
            with self._lock:
                self._dirty |= dirty
            raise StoreError(f"cannot flush index files in {self.index_dir}: {exc}") from exc
        self._last_flushed_timestamp_ms = flushed_timestamp_ms

    def close(self) -> None:
        """Flush and unmap every file. Further calls other than ``close`` raise StoreError."""
        with self._flush_lock:
            try:
                self._flush_dirty()
            finally:
                with self._lock:
                    for index_file in self._files:
                        index_file.close()
                    self._files, self._dirty = [], set()
                    self._closed = True

    def destroy(self) -> None:
        """Delete every index file; the service stays usable, as if on an empty directory."""
        with self._flush_lock, self._lock:
            self._check_open()
            for index_file in self._files:
                index_file.delete()
            self._files, self._dirty = [], set()
            self._last_physical_offset = -1
            self._last_flushed_timestamp_ms = 0

    def delete_files_below(self, min_physical_offset: int) -> int:
        """Delete whole files whose last entry is below ``min_physical_offset`` (retention).

        The newest file is kept even when it qualifies: it is the one being written, and its
        header carries the index's end offset and time.

        Returns:
            How many files were deleted.
        """
        with self._flush_lock, self._lock:
            self._check_open()
            expired = [f for f in self._files[:-1] if f.end_physical_offset < min_physical_offset]
            for index_file in expired:
                self._files.remove(index_file)
                self._dirty.discard(index_file)
                index_file.delete()
                log.info(
                    "deleted index file %s, below offset %d", index_file.path, min_physical_offset
                )
            return len(expired)

    def drop_from(self, physical_offset: int,
                  timestamp_at: Callable[[int], int | None] = lambda _offset: None) -> int:
        """Remove every entry of a message at or after ``physical_offset`` (the commit log
        was truncated there): files holding only such entries are deleted, the file holding
        the cut loses its entries from there on, in place (``IndexFile.cut_entries_from``),
        so no record before the cut needs indexing again. Returns how many files went.

        Args:
            timestamp_at: the store time of the message at an offset (for the header).
        """
        with self._flush_lock, self._lock:
            self._check_open()
            dropped = 0
            while self._files:
                index_file = self._files[-1]
                whole = (index_file.begin_physical_offset >= physical_offset
                         if not index_file.is_empty
                         else index_file.end_physical_offset >= physical_offset)
                if not whole:
                    if index_file.cut_entries_from(physical_offset, timestamp_at):
                        self._dirty.add(index_file)
                    break
                self._files.pop()
                self._dirty.discard(index_file)
                index_file.delete()
                dropped += 1
                log.info("deleted index file %s: it indexes only records at or after offset "
                         "%d, which a truncation removed", index_file.path, physical_offset)
            self._last_physical_offset = self._indexed_end_offset()
            self._last_flushed_timestamp_ms = min(self._last_flushed_timestamp_ms,
                                                  self.last_update_timestamp_ms)
            return dropped

    # -- the hot path ---------------------------------------------------------------------------

    def ensure_room(self, key_count: int) -> None:
        """Reserve disk for ``key_count`` more keys (creating the next file when the current
        one is full) before the commit-log append that brings them, so their ``put`` cannot
        fail or fault on a full disk.

        Raises:
            StoreFull / StoreError: no room (nothing was indexed or written).
        """
        if key_count <= 0:
            return
        with self._lock:
            self._check_open()
            index_file = self._files[-1] if self._files else None
            if index_file is None or index_file.is_full:
                index_file = self._roll(index_file)
            index_file.reserve_entries(min(key_count, index_file.room()))

    def put(
        self, topic: str, keys: Iterable[str], physical_offset: int, store_timestamp_ms: int
    ) -> None:
        """Index one message under ``topic#key`` for each non-empty key.

        A message at or below ``last_update_physical_offset`` is already indexed (recovery
        re-dispatches from a point before the index's end) and is skipped whole. Rolls to a
        new file when the current one is full.

        Raises:
            StoreError: the index file cannot be created (disk full, permissions).
        """
        # Hashed together (index_key_hashes): a trace message carries hundreds of msg ids as
        # keys, and one at a time they cost the broker twice as much.
        key_list = [key for key in keys if key]
        key_hashes = index_key_hashes(topic, key_list) if key_list else key_list
        with self._lock:
            if physical_offset <= self._last_physical_offset or not key_hashes:
                return
            self._check_open()
            self._put_hashes(key_hashes, [physical_offset] * len(key_hashes), store_timestamp_ms)

    def put_many(
        self,
        topic: str,
        entries: Iterable[tuple[int, Sequence[str]]],
        store_timestamp_ms: int,
    ) -> None:
        """Index a batch of messages stored together: ``(physical_offset, keys)`` per message,
        in commit-log order; the same as :meth:`put_columns` of those columns."""
        batch = entries if isinstance(entries, (list, tuple)) else list(entries)
        if batch:
            physical_offsets, key_lists = zip(*batch, strict=True)
            self.put_columns(topic, physical_offsets, key_lists, store_timestamp_ms)

    def put_columns(
        self,
        topic: str,
        physical_offsets: Sequence[int],
        key_lists: Sequence[Sequence[str]],
        store_timestamp_ms: int,
    ) -> None:
        """Index a batch of messages stored together, message ``i`` at ``physical_offsets[i]``
        (in commit-log order) under ``topic#key`` for each non-empty key of ``key_lists[i]``.

        The same as ``put`` for each message in turn, with the lock taken and the header
        written once for the batch, the keys hashed together and the entries written
        together. Messages at or below ``last_update_physical_offset`` are skipped whole.

        Raises:
            StoreError: the index file cannot be created (disk full, permissions); the
                messages before the failing key stay indexed.
        """
        if not physical_offsets:
            return
        with self._lock:
            last = self._last_physical_offset
            if physical_offsets[0] <= last:
                kept = [
                    (offset, keys)
                    for offset, keys in zip(physical_offsets, key_lists, strict=True)
                    if offset > last
                ]
                if not kept:
                    return
                physical_offsets, key_lists = zip(*kept, strict=True)
            hashed = self._hash_columns(topic, physical_offsets, key_lists)
            if hashed is None:
                hashed = self._hash_keys(topic, physical_offsets, key_lists)
            key_hashes, key_offsets = hashed
            if not key_hashes:
                return
            self._check_open()
            self._put_hashes(key_hashes, key_offsets, store_timestamp_ms)

    @staticmethod
    def _hash_columns(
        topic: str, physical_offsets: Sequence[int], key_lists: Sequence[Sequence[str]]
    ) -> tuple[list[int], list[int]] | None:
        # The common batch: as many non-empty keys per message (a UNIQ_KEY and a KEYS token,
        # say). Hashed key position by key position, since a column of unique keys, all of
        # one length, alphabet and head, hashes fastest (java_string_hashes); None otherwise,
        # and None for a few messages of many keys each (trace messages, ~480 msg ids each,
        # stored a few together): their columns are too short to hash as a batch, so they
        # were hashed one key at a time, at twice the cost of hashing all keys together.
        columns: Sequence[Sequence[str]]
        if type(key_lists) is KeyColumns:  # not isinstance: key_columns.key_count says why
            columns = key_lists.columns  # as the batch path made them: no zip there and back
            width = len(columns)
            if width > len(key_lists):
                return None
        else:
            width = len(key_lists[0])
            if (not width or width > len(key_lists)
                    or list(map(len, key_lists)).count(width) != len(key_lists)):
                return None
            columns = list(zip(*key_lists, strict=True))
        for column in columns:
            if "" in column:
                return None
        hashes = [index_key_hashes(topic, column) for column in columns]
        if width == 1:
            return hashes[0], list(physical_offsets)
        # Message by message, each message's keys in order: interleave the columns, each
        # with one strided list assignment.
        count = len(key_lists)
        key_hashes = [0] * (count * width)
        key_offsets = [0] * (count * width)
        for position, column_hashes in enumerate(hashes):
            key_hashes[position::width] = column_hashes
            key_offsets[position::width] = physical_offsets
        return key_hashes, key_offsets

    @staticmethod
    def _hash_keys(
        topic: str, physical_offsets: Sequence[int], key_lists: Sequence[Sequence[str]]
    ) -> tuple[list[int], list[int]]:
        # Any batch: keys flattened, each carrying its message's offset; empty keys dropped.
        counts = list(map(len, key_lists))
        keys = list(chain.from_iterable(key_lists))
        key_offsets = list(chain.from_iterable(map(repeat, physical_offsets, counts)))
        if "" in keys:
            kept = [(key, offset) for key, offset in zip(keys, key_offsets, strict=True) if key]
            keys = [key for key, _ in kept]
            key_offsets = [offset for _, offset in kept]
        return index_key_hashes(topic, keys), key_offsets

    def _put_hashes(
        self, key_hashes: list[int], key_offsets: list[int], store_timestamp_ms: int
    ) -> None:
        # Under the lock: write the entries, rolling to a new file whenever one fills up.
        files = self._files
        index_file = files[-1] if files else None
        written = 0
        while written < len(key_hashes):
            if index_file is None or index_file.is_full:
                index_file = self._roll(index_file)
            written = index_file.put_entries(key_hashes, key_offsets, written, store_timestamp_ms)
            self._dirty.add(index_file)
            self._last_physical_offset = key_offsets[written - 1]

    def _roll(self, full_file: IndexFile | None) -> IndexFile:
        if full_file is not None:
            self._dirty.add(full_file)
        path = self.index_dir / self._new_file_name()
        try:
            self.index_dir.mkdir(parents=True, exist_ok=True)
            new_file = IndexFile.create(
                path,
                self.max_hash_slot_num,
                self.max_index_num,
                end_physical_offset=full_file.end_physical_offset if full_file else 0,
                end_timestamp_ms=full_file.end_timestamp_ms if full_file else 0,
            )
        except StoreError:
            raise
        except OSError as exc:
            raise StoreError(
                f"cannot create index file {path} "
                f"({index_file_size(self.max_hash_slot_num, self.max_index_num)} bytes, "
                f"sparse): {exc}"
            ) from exc
        self._files.append(new_file)
        log.info("created index file %s", path)
        if self._populate_new_files:
            self._populate_in_background(new_file)
        return new_file

    def _new_file_name(self) -> str:
        now = time.time()
        name = time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"
        if self._files and name <= self._files[-1].path.name:
            # Two files within one millisecond (tiny test files) or a clock step back: names
            # must stay unique and in creation order, which is what load sorts by.
            name = f"{int(self._files[-1].path.name) + 1:017d}"
        return name

    # -- queries --------------------------------------------------------------------------------

    def query(self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int) -> list[int]:
        """Commit-log offsets of messages indexed under ``topic#key`` stored in [begin_ms, end_ms].

        Args:
            max_count: at most this many offsets (the broker caps it, RocketMQ uses 64).

        Returns:
            Distinct offsets, newest first. Entries of other keys with the same hash may be
            among them: read each message and compare its keys.
        """
        if max_count <= 0 or end_ms < begin_ms:
            return []
        key_hash = index_key_hash(f"{topic}#{key}")
        found: list[int] = []
        seen: set[int] = set()
        with self._lock:
            self._check_open()
            for index_file in reversed(self._files):
                if not index_file.is_empty and index_file.overlaps(begin_ms, end_ms):
                    index_file.collect(key_hash, begin_ms, end_ms, max_count, found, seen)
                # Older files end before this one begins: none can reach the window.
                if len(found) >= max_count or index_file.begin_timestamp_ms < begin_ms:
                    break
        return found

    # -- helpers --------------------------------------------------------------------------------

    def _indexed_end_offset(self) -> int:
        for index_file in reversed(self._files):
            if not index_file.is_empty:
                return index_file.end_physical_offset
        # Only empty files: a rolled file carries its predecessor's end, a first file has none.
        if self._files and self._files[-1].end_timestamp_ms > 0:
            return self._files[-1].end_physical_offset
        return -1

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"index service for {self.index_dir} is closed")


def _reserve(fd: int, path: Path, start: int, length: int) -> None:
    """Allocate [start, start + length) of an index file's disk (see the module docstring).

    Raises:
        StoreFull: no room on the volume.
        StoreError: another failure; names the file.
    """
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, start, length)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StoreFull(
                f"no room to reserve {length} bytes for index file {path}: the volume is "
                "full; free disk space; writes resume by themselves once there is room"
            ) from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise StoreError(f"cannot reserve space in index file {path}: {exc}") from exc
        # No fallocate on this file system: the file stays sparse.

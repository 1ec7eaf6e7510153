"""RecentWrites: the commit log's last appended buffers, for the readers of its tail.

Why: appends reach the log with ``os.pwrite`` and readers copy records out of the segment's
mapping (commit_log.py). A page the writer has just filled is in the page cache but not yet
in this process's page table, so the first reader to touch it takes a minor page fault.
At 20,000 msg/s a parked pull is woken right after the put that stored its records and
reads exactly those: measured (perf record -e minor-faults on the broker of
latency_bench.py at 7,500 msg/s), 98 % of the broker's minor faults were that copy, 0.12 per
message, ~4 us each on this host. The buffers the appends wrote are still in memory; a read
of bytes they hold is served from them, and the mapping's pages are never touched.

What is kept: (start, end, buffer) per append, in log order and back to back (a write that
does not start where the last kept one ended, or a truncation, starts over), at most
``RECENT_BYTES_MAX`` bytes (the oldest dropped first; the last write is always kept unless
it alone is larger). A buffer is kept only when nobody changes it after it was
written: the store's encoded batches (a fresh ``bytearray`` per batch, patched before its
write and never after). A read asks ``view(start, end)``: a view of the kept bytes when one
kept buffer holds all of [start, end), else None (the caller reads the mapping). The bytes
are the ones the write put in the file, so the answer is the same.

Threads: one writer at a time (the store's append lock); readers on any thread. The list is
changed in place (append, then the oldest dropped): a reader may find its entry shifted by a
concurrent write, so ``view`` checks that the entry it took holds the range; a kept entry
never changes, so an entry that holds it is right.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter, sub

# 3 to 6 ms of appends at 20,000 msg/s of 1 KiB (kept: between half of it and all): a
# consumer keeping up reads within it. Not more: every kept buffer is memory the allocator
# cannot hand the next batch's encoding while it is still in the cache (measured with 1 MiB:
# store_put_cost_bench 7-9 % more CPU per message; with this, 1-4 %, in the bench's noise).
RECENT_BYTES_MAX = 128 << 10

_START = itemgetter(0)


class RecentWrites:
    """The last appended buffers of a log, by log offset (module docstring)."""

    __slots__ = ("_bytes", "_entries", "limit")

    def __init__(self, limit: int = RECENT_BYTES_MAX) -> None:
        self.limit = limit
        # (start, end, buffer): the buffer's bytes are the log's [start, end).
        self._entries: list[tuple[int, int, bytes | bytearray]] = []
        self._bytes = 0

    def written(self, start: int, buffer: bytes | bytearray) -> None:
        """``buffer`` was just written at log offset ``start``; the caller never changes it
        again. A write that does not follow the last kept one drops what was kept."""
        entries = self._entries
        if entries and entries[-1][1] != start:
            entries = self._entries = []
            self._bytes = 0
        size = len(buffer)
        entries.append((start, start + size, buffer))
        self._bytes += size
        if self._bytes > self.limit:
            self._trim()

    def _trim(self) -> None:
        # The oldest first, down to half the limit (so that this runs once in many writes,
        # not at each), the newest kept unless it alone is over the limit.
        entries = self._entries
        kept = self._bytes
        dropped = 0
        last = len(entries) - 1
        while kept > self.limit // 2 and dropped < last:
            kept -= entries[dropped][1] - entries[dropped][0]
            dropped += 1
        if kept > self.limit:
            dropped, kept = len(entries), 0
        del entries[:dropped]
        self._bytes = kept

    def clear(self) -> None:
        """Forget every kept buffer (the log was cut, or written by other means)."""
        self._entries = []
        self._bytes = 0

    def view(self, start: int, end: int) -> memoryview | None:
        """A view of the log's bytes [start, end) when one kept buffer holds them all (the
        caller releases it), else None."""
        entries = self._entries
        if not entries:
            return None
        # Most reads are of the last append (a woken pull reads what woke it).
        entry_start, entry_end, buffer = entries[-1]
        if start < entry_start:
            if start < entries[0][0]:
                return None
            index = bisect_right(entries, start, key=_START) - 1
            try:
                entry_start, entry_end, buffer = entries[index]
            except IndexError:  # emptied by a concurrent write meanwhile
                return None
        if start < entry_start or end > entry_end:
            return None
        return memoryview(buffer)[start - entry_start : end - entry_start]

    def gather(self, starts: Sequence[int], ends: Sequence[int]) -> bytes | None:
        """The log's bytes [starts[i], ends[i]) for every i, back to back, when each range
        lies whole in one kept buffer; else None (the caller reads the mapping). ``starts``
        ascend, and no range ends after the next one starts (a queue's records in log
        order); neither is empty.

        Per kept buffer the ranges hold, a few steps; per range none in Python: the slices
        are made and joined by ``map`` and ``bytes.join``.
        """
        entries = self._entries[:]  # a concurrent write changes the list, not this copy
        count = len(starts)
        index = bisect_right(entries, starts[0], key=_START) - 1
        if index < 0:
            return None
        parts: list[memoryview] = []
        done = 0
        while done < count:
            if index >= len(entries):
                return None
            entry_start, entry_end, buffer = entries[index]
            index += 1
            # The ranges that start in this buffer; kept buffers are back to back, so the
            # ranges after them start in the next one.
            stop = bisect_left(starts, entry_end, done)
            if stop == done:
                continue
            if starts[done] < entry_start or ends[stop - 1] > entry_end:
                return None  # a gap in what is kept, or a range running past its buffer
            if done or stop < count:
                run_starts, run_ends = starts[done:stop], ends[done:stop]
            else:
                run_starts, run_ends = starts, ends
            parts += range_views(memoryview(buffer), entry_start, run_starts, run_ends)
            done = stop
        return b"".join(parts)


def range_views(view: memoryview, base: int, starts: Sequence[int],
                ends: Sequence[int]) -> list[memoryview]:
    """Views of ``view`` (the log's bytes from offset ``base``) over the log's ranges
    [starts[i], ends[i]), made by ``map`` with no Python step per range."""
    return list(map(view.__getitem__,
                    map(slice, map(sub, starts, repeat(base)), map(sub, ends, repeat(base)))))

"""Exactly-once halves kept as ranges: one entry per prepared batch, not one per half.

A transactional SEND_BATCH_MESSAGE of the exactly-once sink stores its halves in one put,
at consecutive half-queue offsets, all with the same batch properties (PGROUP and the
EOS_* ids; exactly_once.py). Such halves wait for their batch's commit, or for their
timeout (minutes), and nobody checks them with a producer. Tracking them one by one
(reading each in the check scan, a pending entry and a checkpoint line each) made them the
broker's largest cost per row. Instead the broker remembers each prepared batch as a
``PreparedRange``: first offset, count, the identity, and when its timeout is due.

- the check scan jumps over a range without reading it (checker.py);
- a commit verifies a writer's listed ranges against the table, without reading, and
  commits whole ranges (exactly_once.py);
- a range whose time came is committed (its batch was decided) or rolled back as a whole;
- ``progress.py`` counts a half below the scan offset as ended unless it is pending, in an
  open range, or ended by a known op record; its checkpoint lists the open ranges
  (``[first, count]``), and a restart re-reads each range's first half for the identity.

A range stored by columns (``prepare_columns``) also keeps, while a byte budget allows
(``exactlyOnceCommitCacheBytes``), its ``CommittedCopies``: every column of its committed
messages but the bodies, made when the halves were stored (the properties without the
dropped pairs come from the same merge). Its commit then reads the halves' bytes once,
takes the bodies out of them and stores; nothing is parsed again (range_ends.py).

A half of a range may still be ended on its own (an END_TRANSACTION naming it, a commit
through the one-by-one path). The range then notes it (``ended_apart``, with the lowest op
offset so a restart replays that op record), and whole-range work looks at each half.

Ownership: the broker's event loop.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator
from dataclasses import dataclass

from tidemq.store.interface import MessageBatch

# Bytes charged per committed copy besides its properties text: the list slots, the
# properties' and CRC's objects, the index keys kept alive.
COPY_OVERHEAD_BYTES = 220


@dataclass(slots=True, eq=False)
class CommittedCopies:
    """A prepared range's committed messages, all but their bodies.

    Attributes:
        physical_offset: the first half's commit-log offset; the halves fill
            ``[physical_offset, physical_offset + size)`` (one append wrote them).
        batch: the committed messages in columns (real topic and queue, commit sysflag,
            properties without the dropped pairs, the halves' body CRCs) with no bodies.
        cost: the bytes charged to the budget for them.
    """

    physical_offset: int
    size: int
    batch: MessageBatch
    cost: int

    @classmethod
    def of(cls, physical_offset: int, size: int, batch: MessageBatch) -> CommittedCopies:
        """Copies with their cost counted from ``batch``."""
        cost = sum(map(len, batch.properties)) + COPY_OVERHEAD_BYTES * len(batch.properties)
        return cls(physical_offset, size, batch, cost)


@dataclass(slots=True, eq=False)
class PreparedRange:
    """The halves of one prepared exactly-once batch: ``[first, first + count)``.

    Attributes:
        batch_text: EOS_BATCH_ID as stored (decimal text).
        due_ms: when the halves' timeout (CHECK_IMMUNITY_TIME_IN_SECONDS) comes.
        ended_apart: some half of the range ended on its own; whole-range work must look
            at each half.
        op_offset_min: the lowest op-queue offset of those separate ends (or -1).
        copies: its committed messages but the bodies, or None (module docstring).
    """

    first: int
    count: int
    query_id: str
    batch_text: str
    writer_id: str
    producer_group: str
    due_ms: int
    ended_apart: bool = False
    op_offset_min: int = -1
    copies: CommittedCopies | None = None

    @property
    def end(self) -> int:
        """The offset after the range's last half."""
        return self.first + self.count

    def identity(self) -> tuple[str, str, str]:
        """``(query id, batch id text, writer id)``, as ``eos_identity`` of a half."""
        return self.query_id, self.batch_text, self.writer_id

    def note_end(self, op_offset: int) -> None:
        """One half of the range ended on its own, by the op record at ``op_offset``."""
        self.ended_apart = True
        if self.op_offset_min < 0 or op_offset < self.op_offset_min:
            self.op_offset_min = op_offset


class PreparedRanges:
    """The open ranges, ordered by first offset, with a timeout heap (module docstring).

    Args:
        copies_max_bytes: the budget of the ranges' ``CommittedCopies`` together; a range
            added when it is spent keeps none (0: none is ever kept).
    """

    def __init__(self, copies_max_bytes: int = 0) -> None:
        self.copies_max_bytes = copies_max_bytes
        self.copies_bytes = 0
        self._firsts: list[int] = []
        self._ranges: dict[int, PreparedRange] = {}
        self._due: list[tuple[int, int]] = []  # heap of (due_ms, first offset)

    def __len__(self) -> int:
        return len(self._firsts)

    def __iter__(self) -> Iterator[PreparedRange]:
        ranges = self._ranges
        return iter([ranges[first] for first in self._firsts])

    def add(self, prepared: PreparedRange) -> None:
        """Remember ``prepared`` (it must not overlap an open range); its copies only
        while the budget allows."""
        copies = prepared.copies
        if copies is not None:
            if self.copies_bytes + copies.cost > self.copies_max_bytes:
                prepared.copies = None
            else:
                self.copies_bytes += copies.cost
        firsts = self._firsts
        if not firsts or prepared.first >= firsts[-1]:
            firsts.append(prepared.first)  # the common case: the half queue's newest put
        else:
            bisect.insort(firsts, prepared.first)
        self._ranges[prepared.first] = prepared
        heapq.heappush(self._due, (prepared.due_ms, prepared.first))

    def remove(self, prepared: PreparedRange) -> None:
        """Forget ``prepared`` (every half of it ended)."""
        if self._ranges.get(prepared.first) is not prepared:
            return
        del self._ranges[prepared.first]
        self.drop_copies(prepared)
        firsts = self._firsts
        del firsts[bisect.bisect_left(firsts, prepared.first)]

    def drop_copies(self, prepared: PreparedRange) -> None:
        """Forget the committed copies of ``prepared`` (they are used or no longer wanted)."""
        copies, prepared.copies = prepared.copies, None
        if copies is not None:
            self.copies_bytes -= copies.cost

    def lowest_first(self) -> int | None:
        """The first offset of the lowest open range, or None when there is none."""
        return self._firsts[0] if self._firsts else None

    def find(self, offset: int) -> PreparedRange | None:
        """The open range holding the half at ``offset``, or None."""
        firsts = self._firsts
        index = bisect.bisect_right(firsts, offset) - 1
        if index < 0:
            return None
        prepared = self._ranges[firsts[index]]
        return prepared if offset < prepared.end else None

    def covering(self, first: int, count: int) -> list[PreparedRange] | None:
        """The open ranges that make up exactly ``[first, first + count)``, in order, or
        None when that span is not a union of whole open ranges."""
        found: list[PreparedRange] = []
        offset, end = first, first + count
        while offset < end:
            prepared = self._ranges.get(offset)
            if prepared is None or prepared.end > end:
                return None
            found.append(prepared)
            offset = prepared.end
        return found

    def reschedule(self, prepared: PreparedRange, due_ms: int) -> None:
        """Move the range's timeout to ``due_ms``."""
        prepared.due_ms = due_ms
        heapq.heappush(self._due, (due_ms, prepared.first))

    def pop_due(self, now_ms: int) -> PreparedRange | None:
        """The next open range whose timeout came by ``now_ms``, or None."""
        due = self._due
        ranges = self._ranges
        while due and due[0][0] <= now_ms:
            when, first = heapq.heappop(due)
            prepared = ranges.get(first)
            if prepared is not None and prepared.due_ms == when:
                return prepared
        return None

    def next_due_ms(self) -> int | None:
        """When the earliest open range's timeout comes, or None."""
        due = self._due
        ranges = self._ranges
        while due:
            when, first = due[0]
            prepared = ranges.get(first)
            if prepared is not None and prepared.due_ms == when:
                return when
            heapq.heappop(due)  # ended or rescheduled since
        return None

    def spans(self) -> list[tuple[int, int]]:
        """``[(first, count)]`` of every open range, in order (the checkpoint's list)."""
        ranges = self._ranges
        return [(first, ranges[first].count) for first in self._firsts]

    def op_offset_min(self) -> int | None:
        """The lowest op offset of halves ended apart within open ranges, or None."""
        found = [r.op_offset_min for r in self._ranges.values() if r.op_offset_min >= 0]
        return min(found) if found else None

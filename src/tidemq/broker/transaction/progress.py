"""Which half messages have ended, which still wait, and the checkpoint that outlives a restart.

The half queue (RMQ_SYS_TRANS_HALF_TOPIC queue 0) is read front to back by the check scan.
Its *scan offset* S splits it in two:

- below S every half has been looked at: it either ended (an op record exists, or it was
  unreadable) or it is *pending* (in ``pending``, with its check count and next check time);
- from S on the scan has not looked yet: a half there ended only if END_TRANSACTION said so,
  which ``ended`` records (with the op record's queue offset).

Exactly-once halves are the exception: they are tracked as whole prepared batches
(``prepared``, prepared_ranges.py), never as pending halves, and the scan jumps over them. A
half in an open prepared range has not ended unless ``ended`` says so.

``ended`` also remembers the outcome of recently ended halves below S (at most
ENDED_REMEMBERED_MAX; older ones are known to have ended, their outcome no longer).

Checkpoint file ``<storePathRootDir>/config/transactionProgress.json`` (tidemq's own; a
RocketMQ broker keeps the same facts as consumer offsets of group CID_RMQ_SYS_TRANS)::

    {"halfScanOffset": 1200, "opReplayOffset": 1187, "pending": {"1042": 3, "1190": 0},
     "eosRanges": [[1100, 256], [1356, 256]]}

- ``halfScanOffset``: S;
- ``pending``: half queue offset -> checks sent so far, for every pending half below S;
- ``eosRanges``: ``[first, count]`` of every open prepared exactly-once range (absent in
  older files: none);
- ``opReplayOffset``: an op-queue offset from which replaying the op records rebuilds
  everything else: the lowest op offset among halves at or above S, or in an open range,
  that had ended, or the op queue's end when there were none.

Restart = load the checkpoint, re-read the first half of each range, replay op records from
``opReplayOffset`` (an op for a pending half, a half in a range, or one at or above S goes
to ``ended``), and scan on from S. Op records
are written on the same loop as the state changes, so a checkpoint taken there is
consistent; what happened after the last one is rebuilt by the replay (ops) and the scan
(halves). Only check counts of halves that became pending after the last checkpoint
restart from 0.

Ownership: the broker's event loop. ``snapshot`` is taken there; ``write_snapshot`` may run
in a worker thread with its bytes.
"""

from __future__ import annotations

import heapq
import itertools
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tidemq.broker.transaction.prepared_ranges import PreparedRange, PreparedRanges
from tidemq.broker.transaction.records import Outcome
from tidemq.protocol import jsonx
from tidemq.protocol.jsonx import JsonShapeError
from tidemq.store.config_file import ConfigFile

PROGRESS_FILE_NAME = "transactionProgress.json"

# Outcomes of ended halves kept for END_TRANSACTION answers that repeat or contradict one
# ("already committed"). At 10,000 transactions/s this is the last 10 s; beyond it a repeat
# is still refused as "already ended", only without naming the outcome.
ENDED_REMEMBERED_MAX = 100_000

_SCAN_FIELD = "halfScanOffset"
_REPLAY_FIELD = "opReplayOffset"
_PENDING_FIELD = "pending"
_RANGES_FIELD = "eosRanges"


@dataclass(slots=True)
class PendingHalf:
    """A half message the scan found without an outcome: it gets checked until it ends."""

    queue_offset: int
    physical_offset: int
    store_timestamp_ms: int
    producer_group: str
    transaction_id: str
    check_times: int = 0
    next_check_ms: int = 0


@dataclass(slots=True)
class Checkpoint:
    """The persisted part of the progress (module docstring)."""

    half_scan_offset: int = 0
    op_replay_offset: int = 0
    pending_check_times: dict[int, int] = field(default_factory=dict)
    prepared_ranges: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ProgressSnapshot:
    """File bytes to write, and the checkpoint they hold."""

    checkpoint: Checkpoint
    data: bytes


class TransactionProgress:
    """The in-memory state of the module docstring, and its checkpoint file.

    Args:
        path: the checkpoint file (need not exist yet).

    Raises:
        ConfigFileCorrupt: the file and its .bak are both unreadable.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file = ConfigFile(path)
        self.loaded: Checkpoint | None = self._file.load_parsed(_parse)
        self.scan_offset = 0
        self.pending: dict[int, PendingHalf] = {}
        self._pending_by_id: dict[tuple[str, str], int] = {}
        # half queue offset -> (outcome, op queue offset); None outcome: op written by
        # RocketMQ, or the op record is unknown (ended by a crash-recovery lookup).
        self.ended: dict[int, tuple[Outcome | None, int]] = {}
        self._due: list[tuple[int, int]] = []  # heap of (next_check_ms, half queue offset)
        self.prepared = PreparedRanges()
        self._forget_above = 2 * ENDED_REMEMBERED_MAX
        self._written: Checkpoint | None = self.loaded

    # -- state -----------------------------------------------------------------------------

    def lookup(self, half_offset: int) -> tuple[bool, Outcome | None]:
        """``(ended, outcome)`` of a half; outcome None when unknown or not ended."""
        found = self.ended.get(half_offset)
        if found is not None:
            return True, found[0]
        if (half_offset < self.scan_offset and half_offset not in self.pending
                and (not self.prepared or self.prepared.find(half_offset) is None)):
            return True, None
        return False, None

    def end(self, half_offset: int, outcome: Outcome | None, op_offset: int) -> None:
        """Record that a half ended (its op record is at ``op_offset``)."""
        self.ended[half_offset] = (outcome, op_offset)
        if self.prepared:
            prepared = self.prepared.find(half_offset)
            if prepared is not None:
                prepared.note_end(op_offset)
        pending = self.pending.pop(half_offset, None)
        if pending is not None:
            self._pending_by_id.pop((pending.producer_group, pending.transaction_id), None)
        if len(self.ended) > self._forget_above:
            self._forget_old_outcomes()
            # Amortized: the next pass comes after another ENDED_REMEMBERED_MAX ends, even
            # when this one could not forget anything (all of them above the scan offset).
            self._forget_above = len(self.ended) + ENDED_REMEMBERED_MAX

    def end_range(self, prepared: PreparedRange, outcome: Outcome, op_offset: int,
                  offsets: Iterable[int]) -> None:
        """Record that the halves at ``offsets`` of ``prepared`` ended by one op record, and
        forget the range (every other half of it had ended before)."""
        self.prepared.remove(prepared)
        ended = self.ended
        ended.update(dict.fromkeys(offsets, (outcome, op_offset)))
        if len(ended) > self._forget_above:
            self._forget_old_outcomes()
            self._forget_above = len(ended) + ENDED_REMEMBERED_MAX

    def add_pending(self, half: PendingHalf) -> None:
        """Track a half that waits for its outcome; it is due for a check at next_check_ms."""
        self.pending[half.queue_offset] = half
        self._pending_by_id[(half.producer_group, half.transaction_id)] = half.queue_offset
        heapq.heappush(self._due, (half.next_check_ms, half.queue_offset))

    def reschedule(self, half: PendingHalf, next_check_ms: int) -> None:
        """Move a pending half's next check to ``next_check_ms``."""
        half.next_check_ms = next_check_ms
        heapq.heappush(self._due, (next_check_ms, half.queue_offset))

    def pop_due(self, now_ms: int) -> PendingHalf | None:
        """The next pending half whose check time has come, or None."""
        due = self._due
        while due and due[0][0] <= now_ms:
            when, half_offset = heapq.heappop(due)
            half = self.pending.get(half_offset)
            if half is not None and half.next_check_ms == when:
                return half
        return None

    def next_due_ms(self) -> int | None:
        """When the earliest pending check is due, or None when nothing is pending."""
        due = self._due
        while due:
            when, half_offset = due[0]
            half = self.pending.get(half_offset)
            if half is not None and half.next_check_ms == when:
                return when
            heapq.heappop(due)  # ended or rescheduled since
        return None

    def find_pending(self, producer_group: str, transaction_id: str) -> PendingHalf | None:
        """The pending half of ``producer_group`` with ``transaction_id``, or None."""
        half_offset = self._pending_by_id.get((producer_group, transaction_id))
        return None if half_offset is None else self.pending.get(half_offset)

    def pending_halves(self) -> Iterator[PendingHalf]:
        """Every pending half, in no particular order."""
        return iter(list(self.pending.values()))

    def _forget_old_outcomes(self) -> None:
        # The oldest entries below the scan offset go; lookups of them still say "ended".
        scan = self.scan_offset
        excess = len(self.ended) - ENDED_REMEMBERED_MAX
        prepared = self.prepared
        # Oldest first (insertion order); an end within an open range is what keeps that
        # half from counting as open, so it stays.
        lowest = prepared.lowest_first()
        removable = (h for h in self.ended if h < scan and (
            lowest is None or h < lowest or prepared.find(h) is None))
        # Listed first: the dict must not change while the generator walks it. The walk
        # stops at the ``excess``-th removable entry, not at the end.
        for half_offset in list(itertools.islice(removable, max(0, excess))):
            del self.ended[half_offset]

    # -- checkpoint ------------------------------------------------------------------------

    def checkpoint(self, op_max_offset: int) -> Checkpoint:
        """The checkpoint of the current state; ``op_max_offset``: the op queue's end now."""
        scan = self.scan_offset
        replay = op_max_offset
        for half_offset, (_, op_offset) in self.ended.items():
            if half_offset >= scan and op_offset < replay:
                replay = op_offset
        apart = self.prepared.op_offset_min()  # halves of open ranges that ended on their own
        if apart is not None:
            replay = min(replay, apart)
        return Checkpoint(
            half_scan_offset=scan,
            op_replay_offset=replay,
            pending_check_times={h: p.check_times for h, p in self.pending.items()},
            prepared_ranges=self.prepared.spans(),
        )

    def snapshot(self, op_max_offset: int) -> ProgressSnapshot | None:
        """The file bytes to write now, or None when the checkpoint did not change."""
        checkpoint = self.checkpoint(op_max_offset)
        if checkpoint == self._written:
            return None
        document: dict[str, Any] = {
            _SCAN_FIELD: checkpoint.half_scan_offset,
            _REPLAY_FIELD: checkpoint.op_replay_offset,
            _PENDING_FIELD: {str(h): n for h, n in sorted(checkpoint.pending_check_times.items())},
        }
        if checkpoint.prepared_ranges:
            document[_RANGES_FIELD] = [list(span) for span in checkpoint.prepared_ranges]
        return ProgressSnapshot(checkpoint, jsonx.dumps(document, pretty=True))

    def write_snapshot(self, snapshot: ProgressSnapshot) -> None:
        """Write a snapshot atomically (may run in a worker thread).

        Raises:
            StoreFull, StoreError: the write failed; the next snapshot tries again.
        """
        self._file.save(snapshot.data)
        self._written = snapshot.checkpoint


def _parse(data: bytes) -> Checkpoint:
    document = jsonx.loads(data)
    if not isinstance(document, dict):
        raise JsonShapeError(f"expected a JSON object, found {type(document).__name__}")
    scan = _offset(document, _SCAN_FIELD)
    replay = _offset(document, _REPLAY_FIELD)
    pending_document = document.get(_PENDING_FIELD, {})
    if not isinstance(pending_document, dict):
        raise JsonShapeError(f"{_PENDING_FIELD} is not an object of offset: check count")
    pending: dict[int, int] = {}
    for key, value in pending_document.items():
        text = str(key)
        if not text.isdigit() or not isinstance(value, int) or isinstance(value, bool):
            raise JsonShapeError(
                f"{_PENDING_FIELD} entry {key!r}: {value!r} is not 'half offset': check count"
            )
        pending[int(text)] = max(0, value)
    return Checkpoint(scan, replay, pending, _spans(document.get(_RANGES_FIELD, [])))


def _spans(value: Any) -> list[tuple[int, int]]:
    if not isinstance(value, list):
        raise JsonShapeError(f"{_RANGES_FIELD} is not a list of [first offset, count]")
    spans = []
    for item in value:
        if (not isinstance(item, list) or len(item) != 2
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                           for n in item)):
            raise JsonShapeError(f"{_RANGES_FIELD} entry {item!r} is not [first offset, count]")
        spans.append((item[0], item[1]))
    return spans


def _offset(document: dict[str, Any], name: str) -> int:
    value = document.get(name, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise JsonShapeError(f"{name} is {value!r}, expected a queue offset (an integer >= 0)")
    return value

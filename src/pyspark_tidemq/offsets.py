"""Queue offsets as Spark sees them, and how offset ranges become input partitions.

Offsets are per-queue *logical* offsets (consume-queue offsets: message n of a queue has
offset n). Spark stores a streaming source's offsets as JSON in ``checkpoint/offsets/N``;
tidemq's form is the one users write in ``startingOffsets`` / ``endingOffsets``, grouped by
topic and keyed ``"brokerName:queueId"``::

    {"Orders": {"broker-a:0": 42, "broker-a:1": 17, "broker-b:0": 0}}

In options (not in checkpoints) ``-2`` means "earliest" and ``-1`` means "latest".

A range ``[start, end)`` of one queue is read by one task (``QueueRange``); ``split_ranges``
cuts large ranges for ``maxRecordsPerPartition`` and ``minPartitions``, and
``limit_by_backlog`` spreads ``maxOffsetsPerTrigger`` over queues in proportion to what each
has waiting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from pyspark.sql.datasource import InputPartition

from tidemq.client.message import MessageQueue

EARLIEST = -2  # in startingOffsets / endingOffsets JSON, as in Spark's Kafka source
LATEST = -1

QueueOffsets = dict[MessageQueue, int]


def queue_key(queue: MessageQueue) -> str:
    """``"brokerName:queueId"``, the key of a queue inside its topic's offsets object."""
    return f"{queue.broker_name}:{queue.queue_id}"


def parse_queue_key(topic: str, key: str) -> MessageQueue:
    """The queue named by ``"brokerName:queueId"`` in ``topic``.

    Raises:
        ValueError: the key is not ``brokerName:queueId`` with a non-negative integer id.
    """
    broker_name, sep, queue_id = str(key).rpartition(":")
    if not sep or not broker_name or not queue_id.isdigit():
        raise ValueError(
            f"queue key {key!r} of topic {topic!r} is not \"brokerName:queueId\" "
            "(for example \"broker-a:0\")"
        )
    return MessageQueue(topic, broker_name, int(queue_id))


def offsets_to_json(offsets: Mapping[MessageQueue, int]) -> dict[str, dict[str, int]]:
    """Group offsets by topic, keyed ``"brokerName:queueId"``, in a stable order."""
    grouped: dict[str, dict[str, int]] = {}
    for queue in sorted(offsets):
        grouped.setdefault(queue.topic, {})[queue_key(queue)] = int(offsets[queue])
    return grouped


def offsets_from_json(value: object, *, what: str = "offsets") -> QueueOffsets:
    """Read the form ``offsets_to_json`` writes (also what users give in options).

    Raises:
        ValueError: ``value`` is not an object of objects of integers with valid queue keys;
            the message names ``what``.
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a JSON object of topics, got {type(value).__name__}")
    offsets: QueueOffsets = {}
    for topic, per_queue in value.items():
        if not isinstance(per_queue, Mapping):
            raise ValueError(
                f"{what}: topic {topic!r} must map to an object of \"brokerName:queueId\": "
                f"offset, got {per_queue!r}"
            )
        for key, offset in per_queue.items():
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise ValueError(
                    f"{what}: offset of {topic!r} {key!r} is {offset!r}; it must be an integer"
                )
            try:
                queue = parse_queue_key(str(topic), key)
            except ValueError as e:
                raise ValueError(f"{what}: {e}") from None
            offsets[queue] = offset
    return offsets


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """One input partition: offsets ``[start_offset, end_offset)`` of one queue.

    Attributes:
        topic, broker_name, queue_id: the queue.
        start_offset: the first offset to read.
        end_offset: the offset to stop before.
        from_earliest: the range starts at "the queue's earliest offset" (a queue that
            appeared after the query started); a broker that has already dropped the head
            of such a queue is not data loss (for every piece of the range).
    """

    topic: str
    broker_name: str
    queue_id: int
    start_offset: int
    end_offset: int
    from_earliest: bool = False

    @property
    def queue(self) -> MessageQueue:
        """The queue as the client names it."""
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    @property
    def size(self) -> int:
        """How many offsets the range covers."""
        return self.end_offset - self.start_offset


def ranges_between(
    start: Mapping[MessageQueue, int],
    end: Mapping[MessageQueue, int],
    *,
    earliest: Mapping[MessageQueue, int] | None = None,
) -> list[QueueRange]:
    """The non-empty ranges from ``start`` to ``end``, one per queue, sorted by queue.

    A queue in ``end`` but not in ``start`` starts at its ``earliest`` offset (0 when not
    given) and is marked ``from_earliest``; so does a queue whose end is before its start (it
    was deleted and re-created, and its offsets started again).
    """
    ranges: list[QueueRange] = []
    for queue in sorted(end):
        stop = end[queue]
        if queue in start and start[queue] <= stop:
            first, from_earliest = start[queue], False
        else:
            first, from_earliest = (earliest or {}).get(queue, 0), True
        if stop > first:
            ranges.append(QueueRange(queue.topic, queue.broker_name, queue.queue_id, first,
                                     stop, from_earliest))
    return ranges


def split_ranges(
    ranges: Iterable[QueueRange],
    *,
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
) -> list[QueueRange]:
    """Cut ranges into more partitions (more tasks reading one queue in parallel).

    ``max_records_per_partition`` first: a range of n offsets becomes ceil(n / max) nearly
    equal pieces. Then, while there are fewer pieces than ``min_partitions``, each range is
    cut into a share of ``min_partitions`` proportional to its size (at least one piece, at
    most one per offset), as Spark's Kafka source does. Order is kept: pieces of one queue are
    adjacent and ascending.
    """
    pieces = list(ranges)
    if max_records_per_partition is not None:
        pieces = [part for r in pieces
                  for part in _cut(r, math.ceil(r.size / max_records_per_partition))]
    if min_partitions is not None and 0 < len(pieces) < min_partitions:
        total = sum(r.size for r in pieces)
        pieces = [part for r in pieces
                  for part in _cut(r, math.ceil(r.size * min_partitions / total))]
    return pieces


def _cut(queue_range: QueueRange, parts: int) -> list[QueueRange]:
    parts = max(1, min(parts, queue_range.size))
    if parts == 1:
        return [queue_range]
    base, extra = divmod(queue_range.size, parts)
    pieces = []
    first = queue_range.start_offset
    for index in range(parts):
        stop = first + base + (1 if index < extra else 0)
        pieces.append(replace(queue_range, start_offset=first, end_offset=stop))
        first = stop
    return pieces


def limit_by_backlog(
    start: Mapping[MessageQueue, int],
    latest: Mapping[MessageQueue, int],
    limit: int | None,
) -> QueueOffsets:
    """End offsets that read at most ``limit`` offsets in all, spread by backlog.

    Args:
        start: where each queue starts; must name every queue of ``latest``.
        latest: each queue's newest offset (its max offset).
        limit: offsets to read at most in all; None for no limit.

    Each queue's backlog is ``latest - start``. With no limit, or a total backlog within it,
    every queue ends at ``latest``. Otherwise each queue gets ``floor(limit * backlog /
    total)`` and the offsets left over go one each to the queues with the largest remainders
    (ties: queue order): the batch reads exactly ``limit`` offsets, never more. Queues
    without a backlog (or not in ``latest``) keep their start.
    """
    end: QueueOffsets = dict(start)
    waiting = {q: latest[q] - start[q] for q in sorted(latest) if latest[q] > start[q]}
    total = sum(waiting.values())
    if limit is None or total <= limit:
        for queue in waiting:
            end[queue] = latest[queue]
        return end
    shares: dict[MessageQueue, int] = {}
    remainders: list[tuple[int, MessageQueue]] = []
    for queue, size in waiting.items():
        shares[queue], remainder = divmod(limit * size, total)
        remainders.append((-remainder, queue))
    left_over = limit - sum(shares.values())
    for _, queue in sorted(remainders)[:left_over]:
        shares[queue] += 1
    for queue, share in shares.items():
        end[queue] = start[queue] + share
    return end

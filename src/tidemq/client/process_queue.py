"""ProcessQueue: the messages of one assigned queue that were pulled and are not yet consumed.

A push consumer keeps one per queue it owns (RocketMQ's ProcessQueue). Pulls put messages in,
in queue-offset order; consumption takes them out, in any order (concurrent listeners) or
from the front (orderly listeners). Three answers come from it:

- the offset that may be committed: the smallest offset still in flight, or, with nothing in
  flight, one past the largest offset pulled. Committing never passes a message that was
  pulled and not consumed, so a crash loses nothing (it may deliver some messages twice);
- flow control: how many messages and body bytes are held, and the span between the first
  and last offset in flight, which the pull loop compares with its thresholds before pulling
  more;
- for orderly consumption, the next batch from the front, and whether the broker lock of
  the queue is held.

Offsets in flight live in a dict (offset -> message) and, in pull order, in a deque. A
removal deletes from the dict only; stale offsets at the front of the deque are dropped when
the smallest offset is asked for, so each message costs O(1) however messages complete.

Pure bookkeeping: no I/O, no asyncio; the pull loop and the consume services own a
ProcessQueue and run on one event loop, so nothing here is locked.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

from tidemq.client.message import MessageQueue
from tidemq.protocol.message import MessageExt


class ProcessQueue:
    """Pulled, not yet consumed messages of one queue (see the module docstring).

    Attributes:
        queue: the queue.
        dropped: set when the queue is no longer ours (rebalance, shutdown); pulls stop,
            queued consumption is skipped and no offset is committed for it any more.
        locked: orderly consumption: this client holds the broker lock of the queue.
        last_lock_ms: when the lock was last granted or renewed (monotonic ms).
        consuming: orderly consumption: a consume task is working on this queue.
        pull_template: the consumer's ``(subscription, template or None)`` its parked pulls
            are rendered from (``broker_api.pull_request_template``), once made.
    """

    __slots__ = (
        "_messages", "_order", "consuming", "dropped", "last_lock_ms", "locked",
        "max_offset_pulled", "message_bytes", "pull_template", "queue",
    )

    def __init__(self, queue: MessageQueue) -> None:
        self.queue = queue
        self._messages: dict[int, MessageExt] = {}
        self._order: collections.deque[int] = collections.deque()
        self.message_bytes = 0
        self.max_offset_pulled = -1
        self.dropped = False
        self.locked = False
        self.last_lock_ms = 0
        self.consuming = False
        self.pull_template: tuple[Any, Any] | None = None

    @property
    def message_count(self) -> int:
        """Messages in flight."""
        return len(self._messages)

    def put(self, messages: Iterable[MessageExt]) -> list[MessageExt]:
        """Add pulled messages (ascending offsets); returns those that were new.

        A message at or below the largest offset already pulled is ignored: it is in flight
        or was consumed already.
        """
        if not isinstance(messages, list):
            messages = list(messages)
        if not messages:
            return []
        in_flight = self._messages
        order = self._order
        highest = self.max_offset_pulled
        offsets = [m.queue_offset for m in messages]
        if offsets[0] > highest and all(map(int.__lt__, offsets, offsets[1:])):
            # The usual pull: ascending offsets past everything seen, added in bulk.
            in_flight.update(zip(offsets, messages, strict=True))
            order.extend(offsets)
            self.message_bytes += sum([len(m.body) for m in messages])
            self.max_offset_pulled = offsets[-1]
            return messages
        fresh: list[MessageExt] = []
        size = 0
        for message in messages:
            offset = message.queue_offset
            if offset <= highest:
                continue
            in_flight[offset] = message
            order.append(offset)
            size += len(message.body)
            highest = offset
            fresh.append(message)
        self.max_offset_pulled = highest
        self.message_bytes += size
        return fresh

    def remove(self, messages: Iterable[MessageExt]) -> int:
        """Forget consumed messages (those not in flight are ignored).

        Returns:
            The offset that may now be committed (``commit_offset``).
        """
        in_flight = self._messages
        size = 0
        for message in messages:
            if in_flight.pop(message.queue_offset, None) is not None:
                size += len(message.body)
        self.message_bytes -= size
        return self.commit_offset

    @property
    def commit_offset(self) -> int:
        """The smallest offset in flight; with none, one past the largest pulled; -1 when
        nothing was ever pulled."""
        order = self._order
        in_flight = self._messages
        while order and order[0] not in in_flight:
            order.popleft()
        if order:
            return order[0]
        return self.max_offset_pulled + 1 if self.max_offset_pulled >= 0 else -1

    @property
    def offset_span(self) -> int:
        """Largest minus smallest offset in flight (0 when at most one is)."""
        if not self._messages:
            return 0
        return self.max_offset_pulled - self.commit_offset

    def over_threshold(self, count_max: int, bytes_max: int, span_max: int | None) -> bool:
        """True when pulling more would exceed a flow-control bound.

        Args:
            count_max: messages in flight at most (pullThresholdForQueue).
            bytes_max: body bytes in flight at most (pullThresholdSizeForQueue).
            span_max: offset span at most (consumeConcurrentlyMaxSpan); None: unbounded
                (orderly consumption, where the span is the backlog itself).
        """
        if len(self._messages) >= count_max or self.message_bytes >= bytes_max:
            return True
        return span_max is not None and self.offset_span > span_max

    def take(self, count: int) -> list[MessageExt]:
        """The first ``count`` messages in flight, in offset order, left in flight (orderly
        consumption commits them with ``remove`` once the listener succeeded)."""
        taken: list[MessageExt] = []
        in_flight = self._messages
        for offset in self._order:
            message = in_flight.get(offset)
            if message is not None:
                taken.append(message)
                if len(taken) >= count:
                    break
        return taken

    def messages(self) -> list[MessageExt]:
        """Every message in flight, in offset order."""
        return self.take(len(self._messages)) if self._messages else []

    def lock_expired(self, now_ms: int, lock_expiry_ms: int) -> bool:
        """True when the broker lock was not renewed within ``lock_expiry_ms``."""
        return now_ms - self.last_lock_ms > lock_expiry_ms

    def __repr__(self) -> str:
        return (f"ProcessQueue({self.queue}, in_flight={len(self._messages)}, "
                f"bytes={self.message_bytes}, commit_offset={self.commit_offset}, "
                f"dropped={self.dropped}, locked={self.locked})")

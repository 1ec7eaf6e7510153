"""Which queue a producer writes next: round robin, steering clear of brokers that failed.

Theory of operation. A topic's publish queues are spread over broker groups. A plain send takes
the next queue round robin (a per-topic counter, as RocketMQ's ``ThreadLocalIndex``). When a
send to a broker fails (a network error, a timeout, or a retriable error code) the broker is
marked unavailable for a while (``FaultTracker``), and later picks skip its queues until the
mark expires — RocketMQ's "latency fault tolerance". A retry also avoids the broker that just
failed. When every broker is marked, the pick falls back to round robin over all queues rather
than refusing to send: a marked broker may have recovered, and a send that fails costs no more
than a refusal.

Ordered sends choose a queue by sharding key: ``java_string_hash(key) % n`` with a negative
result made positive, over the publish queues sorted by (topic, broker name, queue id). That is
the formula of RocketMQ's ``SelectMessageQueueByHash`` with a String key, so a Java producer and
ours put the same key on the same queue, and a key keeps its queue while the queue count stays.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidemq.client.message import MessageQueue
from tidemq.protocol.message import java_string_hash

# How long a broker is avoided after a failed send. RocketMQ isolates a broker for 30 s after
# an exception when latency fault tolerance is on (MQFaultStrategy.updateFaultItem with
# isolation); a failed broker is usually down for longer than one request.
FAULT_ISOLATION_MS_DEFAULT = 30_000

# Slow but successful sends also mark the broker for a while, RocketMQ's latencyMax ->
# notAvailableDuration table: a send taking >= 550 ms avoids the broker for 30 s, and so on.
_LATENCY_STEPS_MS = ((15_000, 600_000), (3_000, 180_000), (2_000, 120_000), (1_000, 60_000),
                     (550, 30_000))


class FaultTracker:
    """Remembers which brokers failed recently and until when to avoid them.

    Args:
        isolation_ms: how long a broker is avoided after a failure.
        clock_ms: a monotonic millisecond clock (injectable for tests).
    """

    def __init__(
        self,
        isolation_ms: int = FAULT_ISOLATION_MS_DEFAULT,
        clock_ms: Callable[[], float] | None = None,
    ):
        self.isolation_ms = isolation_ms
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000.0)
        self._unavailable_until_ms: dict[str, float] = {}

    def mark_failed(self, broker_name: str, duration_ms: int | None = None) -> None:
        """Avoid ``broker_name`` for ``duration_ms`` (default ``isolation_ms``) from now."""
        duration = self.isolation_ms if duration_ms is None else duration_ms
        self._unavailable_until_ms[broker_name] = self._clock_ms() + duration

    def record_latency(self, broker_name: str, latency_ms: float) -> None:
        """Note a successful send's latency; a very slow broker is avoided for a while."""
        if latency_ms < _LATENCY_STEPS_MS[-1][0]:
            # The common case: no bookkeeping at all, and a recovered broker is forgiven.
            if self._unavailable_until_ms:
                self._unavailable_until_ms.pop(broker_name, None)
            return
        for threshold, duration in _LATENCY_STEPS_MS:
            if latency_ms >= threshold:
                self.mark_failed(broker_name, duration)
                return

    def is_available(self, broker_name: str) -> bool:
        """True unless the broker failed and its avoidance period has not run out."""
        if not self._unavailable_until_ms:
            return True
        until = self._unavailable_until_ms.get(broker_name)
        if until is None:
            return True
        if self._clock_ms() >= until:
            del self._unavailable_until_ms[broker_name]
            return True
        return False

    @property
    def any_marked(self) -> bool:
        """True when some broker is (or was, until checked) marked; cheap, for the hot path."""
        return bool(self._unavailable_until_ms)

    @property
    def unavailable_brokers(self) -> list[str]:
        """Brokers currently avoided, sorted."""
        return sorted(b for b in list(self._unavailable_until_ms) if not self.is_available(b))


class RoundRobin:
    """A per-topic counter over a publish queue list (see the module docstring)."""

    __slots__ = ("_index",)

    def __init__(self, start: int = 0):
        self._index = start

    def select(
        self,
        queues: Sequence[MessageQueue],
        faults: FaultTracker | None = None,
        avoid_broker: str | None = None,
    ) -> MessageQueue:
        """Pick the next queue, preferring available brokers other than ``avoid_broker``.

        Raises:
            ValueError: ``queues`` is empty.
        """
        count = len(queues)
        if count == 0:
            raise ValueError("no queue to select from")
        index = self._index
        self._index = index + 1
        first = queues[index % count]
        if avoid_broker is None and (faults is None or not faults.any_marked):
            return first  # the hot path: nothing to avoid
        fallback: MessageQueue | None = None
        for step in range(count):
            queue = queues[(index + step) % count]
            if queue.broker_name == avoid_broker:
                continue
            if faults is None or faults.is_available(queue.broker_name):
                self._index = index + step + 1
                return queue
            if fallback is None:
                fallback = queue
        # Every other broker is marked: any broker but the one that just failed, else any.
        return fallback if fallback is not None else first


def select_by_sharding_key(queues: Sequence[MessageQueue], sharding_key: str) -> MessageQueue:
    """The queue for ``sharding_key``: stable while the queue list stays the same.

    Raises:
        ValueError: ``queues`` is empty.
    """
    if not queues:
        raise ValueError("no queue to select from")
    ordered = sorted(queues)
    # Java's int remainder keeps the sign of the dividend; abs() as SelectMessageQueueByHash.
    value = java_string_hash(sharding_key)
    index = abs(int(_java_remainder(value, len(ordered))))
    return ordered[index]


def _java_remainder(value: int, divisor: int) -> int:
    result = abs(value) % divisor
    return -result if value < 0 else result


@dataclass(slots=True)
class PublishInfo:
    """What a producer knows about writing one topic: queues, round robin, route origin.

    ``from_default_topic`` is True when the route was borrowed from TBW102 for a topic the name
    server does not know yet (the broker creates it on the first send).
    """

    queues: list[MessageQueue]
    round_robin: RoundRobin
    from_default_topic: bool = False
    order_topic: bool = False

"""The values the admin client answers with: queue offsets and a group's progress."""

from __future__ import annotations

from dataclasses import dataclass, field

from tidemq.client.message import MessageQueue
from tidemq.client.queue_keys import message_queue_from_key
from tidemq.protocol import jsonx


@dataclass(frozen=True, slots=True)
class TopicOffset:
    """A queue's offsets as GET_TOPIC_STATS_INFO reports them."""

    min_offset: int
    max_offset: int
    last_update_timestamp: int


@dataclass(frozen=True, slots=True)
class ConsumeOffset:
    """A group's progress in one queue: the broker's max offset and the group's offset."""

    broker_offset: int
    consumer_offset: int
    last_timestamp: int

    @property
    def lag(self) -> int:
        """Messages not yet consumed (never negative)."""
        return max(0, self.broker_offset - self.consumer_offset)


@dataclass(slots=True)
class ConsumeStats:
    """GET_CONSUME_STATS over every broker: per-queue progress and consume TPS."""

    offsets: dict[MessageQueue, ConsumeOffset] = field(default_factory=dict)
    consume_tps: float = 0.0

    @property
    def total_lag(self) -> int:
        """Sum of the per-queue lags (RocketMQ's "Diff Total")."""
        return sum(o.lag for o in self.offsets.values())

    def merge(self, other: ConsumeStats) -> None:
        """Add ``other``'s queues and TPS (another broker's answer) to these."""
        self.offsets.update(other.offsets)
        self.consume_tps += other.consume_tps


def parse_consume_stats(body: bytes | None) -> ConsumeStats:
    """A GET_CONSUME_STATS body (``consumeTps``, ``offsetTable`` keyed by MessageQueue)."""
    document = jsonx.loads(body or b"{}")
    stats = ConsumeStats(consume_tps=float(document.get("consumeTps") or 0.0))
    for key, value in (document.get("offsetTable") or {}).items():
        stats.offsets[message_queue_from_key(key)] = ConsumeOffset(
            broker_offset=int(value.get("brokerOffset", 0)),
            consumer_offset=int(value.get("consumerOffset", 0)),
            last_timestamp=int(value.get("lastTimestamp", 0)),
        )
    stats.offsets = dict(sorted(stats.offsets.items()))
    return stats

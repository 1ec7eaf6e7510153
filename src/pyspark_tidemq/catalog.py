"""The driver's view of tidemq: which queues a read covers and where they start and end.

``QueueCatalog`` answers the planning questions of the batch and stream readers with the
synchronous admin client (``tidemq.sync.Admin``): the topics a ``subscribe`` /
``subscribePattern`` / ``assign`` option names, each queue's min and max offset
(GET_TOPIC_STATS_INFO, one request per broker), and the first offset stored at or after a
time. It also commits a consumer group's offsets (``consumerGroup``) with a
``tidemq.sync.PullConsumer`` that reads nothing.

It runs on the driver only and holds open connections, so readers keep it out of what they
pickle and close it when Spark stops them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark_tidemq.offsets import EARLIEST, LATEST, QueueOffsets
from pyspark_tidemq.options import OffsetKind, OffsetSpec, SourceOptions
from tidemq import sync
from tidemq.client.errors import NoRouteError
from tidemq.client.message import MessageQueue

log = logging.getLogger("pyspark_tidemq")

# Topics RocketMQ brokers make for themselves; a subscribePattern never matches them.
SYSTEM_TOPICS = frozenset({
    "TBW102", "SCHEDULE_TOPIC_XXXX", "OFFSET_MOVED_EVENT", "BenchmarkTest", "SELF_TEST_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
})
SYSTEM_TOPIC_PREFIXES = ("%RETRY%", "%DLQ%", "rmq_sys_", "RMQ_SYS_")


@dataclass(frozen=True, slots=True)
class QueueBounds:
    """A queue's offsets as last seen: ``min_offset`` (oldest kept), ``max_offset`` (next)."""

    min_offset: int
    max_offset: int


class QueueCatalog:
    """Queue discovery and offset lookups for one read, on the driver.

    Args:
        options: the read's options.
        missing_ok: True (streaming) to treat a topic that does not exist yet as one with
            no queues; False (batch) to raise.
    """

    def __init__(self, options: SourceOptions, *, missing_ok: bool):
        self.options = options
        self.missing_ok = missing_ok
        self._admin: sync.Admin | None = None
        self._committer: sync.PullConsumer | None = None
        self._missing_reported: set[str] = set()

    @property
    def admin(self) -> sync.Admin:
        """The admin client, started on first use."""
        if self._admin is None:
            admin = sync.Admin(self.options.namesrv_addr,
                               request_timeout_ms=self.options.request_timeout_ms,
                               credentials=self.options.credentials)
            admin.start()
            self._admin = admin
        return self._admin

    def close(self) -> None:
        """Close the clients (the catalog may be used again: they reopen). Idempotent."""
        admin, committer = self._admin, self._committer
        self._admin = self._committer = None
        for client in (committer, admin):
            if client is not None:
                try:
                    client.close()
                except Exception as e:  # closing must not hide the error that led here
                    log.warning("closing a tidemq client failed: %s", e)

    def __enter__(self) -> QueueCatalog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- queues ----------------------------------------------------------------------------

    def topics(self) -> list[str]:
        """The topics the read covers now (a pattern is matched against the topic list)."""
        options = self.options
        if options.subscribe:
            return list(options.subscribe)
        if options.assign:
            return sorted({q.topic for q in options.assign})
        pattern = re.compile(options.subscribe_pattern or "")
        excluded = self._excluded_topics()
        return [t for t in self.admin.topic_list()
                if pattern.fullmatch(t) and t not in excluded
                and not t.startswith(SYSTEM_TOPIC_PREFIXES)]

    def _excluded_topics(self) -> set[str]:
        # Brokers also register topics named after their cluster and broker names.
        info = self.admin.cluster_list()
        return set(SYSTEM_TOPICS) | set(info.clusters) | set(info.brokers)

    def queue_bounds(self) -> dict[MessageQueue, QueueBounds]:
        """Min and max offset of every queue the read covers, sorted by queue.

        Raises:
            NoRouteError: (batch) a subscribed topic or assigned queue does not exist.
        """
        bounds: dict[MessageQueue, QueueBounds] = {}
        for topic in self.topics():
            try:
                stats = self.admin.topic_stats(topic)
            except NoRouteError as e:
                if not self.missing_ok:
                    raise NoRouteError(
                        f"topic {topic!r} does not exist (option subscribe / assign); create it "
                        f"with 'tidemq admin updateTopic -t {topic}' or fix the name: {e}"
                    ) from None
                if topic not in self._missing_reported:
                    self._missing_reported.add(topic)
                    log.warning("topic %r does not exist yet; it is read once it does", topic)
                continue
            for queue, offsets in stats.items():
                bounds[queue] = QueueBounds(offsets.min_offset, offsets.max_offset)
        if self.options.assign:
            wanted = set(self.options.assign)
            missing = sorted(wanted - set(bounds))
            if missing and not self.missing_ok:
                raise NoRouteError(
                    "option assign names queues that do not exist: "
                    + ", ".join(map(str, missing))
                    + "; existing queues: " + (", ".join(map(str, sorted(bounds))) or "none")
                )
            bounds = {q: b for q, b in bounds.items() if q in wanted}
        return dict(sorted(bounds.items()))

    # -- offsets ---------------------------------------------------------------------------

    def resolve(
        self,
        spec: OffsetSpec,
        timestamp_ms: int | None,
        bounds: Mapping[MessageQueue, QueueBounds],
        *,
        default: OffsetKind,
    ) -> QueueOffsets:
        """Concrete offsets for every queue of ``bounds``.

        Args:
            spec: startingOffsets / endingOffsets as parsed.
            timestamp_ms: startingTimestamp / endingTimestamp; wins over ``spec`` when given.
            bounds: the queues and their current offsets.
            default: where queues a per-queue JSON leaves out go (earliest or latest).

        Raises:
            NoRouteError: a per-queue JSON names a queue that does not exist.
        """
        if timestamp_ms is not None:
            return {q: self.offset_at_time(q, timestamp_ms, b) for q, b in bounds.items()}
        if spec.kind is OffsetKind.EARLIEST:
            return {q: b.min_offset for q, b in bounds.items()}
        if spec.kind is OffsetKind.LATEST:
            return {q: b.max_offset for q, b in bounds.items()}
        unknown = sorted(set(spec.queues) - set(bounds))
        if unknown:
            raise NoRouteError(
                "offsets JSON names queues that are not read or do not exist: "
                + ", ".join(map(str, unknown))
                + "; queues read: " + (", ".join(map(str, bounds)) or "none")
            )
        resolved: QueueOffsets = {}
        for queue, queue_bounds in bounds.items():
            offset = spec.queues.get(queue, EARLIEST if default is OffsetKind.EARLIEST
                                     else LATEST)
            if offset == EARLIEST:
                offset = queue_bounds.min_offset
            elif offset == LATEST:
                offset = queue_bounds.max_offset
            resolved[queue] = offset
        return resolved

    def offset_at_time(self, queue: MessageQueue, timestamp_ms: int,
                       bounds: QueueBounds) -> int:
        """The first offset of ``queue`` whose message was stored at or after the time.

        The broker's SEARCH_OFFSET_BY_TIMESTAMP answers the offset stored *closest* to the
        time, which may be the message just before it; one message read tells which.
        Returns the max offset when every message is older.
        """
        if bounds.min_offset >= bounds.max_offset:
            return bounds.max_offset
        admin = self.admin
        offset = admin.search_offset(queue, timestamp_ms)
        offset = min(max(offset, bounds.min_offset), bounds.max_offset)
        if offset < bounds.max_offset:
            try:
                stored_at = admin.query_message_by_offset(queue, offset).store_timestamp
            except NoRouteError:  # gone meanwhile (retention): the search is close enough
                return offset
            if stored_at < timestamp_ms:
                offset += 1
        return offset

    # -- consumer group --------------------------------------------------------------------

    def commit(self, offsets: Mapping[MessageQueue, int]) -> None:
        """Store ``offsets`` as ``consumerGroup``'s offsets on the brokers (no-op without one).

        Raises:
            BrokerRejected / RemotingError / NoRouteError: a commit failed.
        """
        group = self.options.consumer_group
        if group is None or not offsets:
            return
        if self._committer is None:
            committer = sync.PullConsumer(group, self.options.namesrv_addr, auto_commit=False,
                                          request_timeout_ms=self.options.request_timeout_ms,
                                          credentials=self.options.credentials)
            committer.start()
            self._committer = committer
        self._committer.commit_sync(dict(offsets))

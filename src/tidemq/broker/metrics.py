"""The broker's Prometheus metrics (metricsExporterType=PROM; names in docs/monitoring.md).

Nothing here runs per message. The send and pull processors already count per request into
``BrokerStats`` (per topic, per topic and group, a put-latency tally); the store tallies its
commit-log syncs; the remoting dispatcher reports each request (or group of requests) to
``RequestMetrics``. ``BrokerCollector.collect`` reads all of it at scrape time, on the
broker's event loop (the exporter serves there), and computes what is derived: a group's
lag per topic from its committed offsets and the queues' max offsets (as
GET_CONSUME_STATS, so it matches ``tidemq admin consumerProgress``), the depth of dead-letter
and retry topics, the disk. Series are per topic and per (group, topic), never per queue,
so their number follows the broker's topic and group tables.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from tidemq.metrics.exporter import MetricsExporter
from tidemq.metrics.requests import RequestMetrics
from tidemq.protocol.codes import TIDEMQ_VERSION
from tidemq.store.disk_space import DiskUsage, used_percent

if TYPE_CHECKING:
    from tidemq.broker.parts import BrokerParts

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"


class BrokerCollector:
    """Collects the broker's metrics from its parts (see the module docstring).

    Args:
        parts: the broker's parts (stats, store, topics, offsets, config).
        connection_count: how many client connections the broker has now.
    """

    def __init__(self, parts: BrokerParts, connection_count: Callable[[], int]) -> None:
        self._parts = parts
        self._connection_count = connection_count

    def collect(self) -> Iterator[Metric]:
        parts = self._parts
        stats = parts.stats
        yield from self._identity()
        yield from self._traffic(stats)
        yield _histogram("tidemq_broker_put_latency_seconds",
                         "Store puts (a send, a batch, or sends stored together), their "
                         "SYNC_FLUSH wait included.", stats.put_latency)
        flush = getattr(parts.store, "flush_latency", None)
        if flush is not None:
            yield _histogram("tidemq_broker_flush_latency_seconds",
                             "Commit-log syncs to disk.", flush)
        yield from self._store_positions()
        yield from self._lag_and_depth()
        yield from self._disk()
        connections = GaugeMetricFamily("tidemq_broker_connections",
                                        "Open client connections.")
        connections.add_metric((), self._connection_count())
        yield connections
        parked = GaugeMetricFamily("tidemq_broker_pulls_parked",
                                   "Long-polling pulls held now, each waiting for a message "
                                   "or its suspend timeout.")
        parked.add_metric((), parts.pull_holds.parked_count)
        yield parked
        answered = CounterMetricFamily(
            "tidemq_broker_parked_pulls_answered", "Long-polling pulls answered after being "
            "parked, by cause: message (a message for the queue arrived), recheck (the "
            "periodic re-check found one no arrival had announced), timeout (the pull's "
            "suspend time was up).", labels=("cause",))
        for cause, count in parts.pull_holds.answered_by_cause.items():
            answered.add_metric((cause,), count)
        yield answered

    def _identity(self) -> Iterator[Metric]:
        # The role and brokerId now, not as configured: a role switch (failover) changes them.
        parts = self._parts
        config = parts.config
        role = parts.role
        info = GaugeMetricFamily("tidemq_broker_info",
                                 "This broker: cluster, name, current brokerId and role.",
                                 labels=("cluster", "broker", "broker_id", "role", "version"))
        info.add_metric((config.broker_cluster_name, config.broker_name, str(role.broker_id),
                         str(role.role.value), str(TIDEMQ_VERSION)), 1)
        yield info
        epoch = GaugeMetricFamily("tidemq_broker_master_epoch",
                                  "The master epoch this broker last took part in (0: a "
                                  "static master/slave group).")
        epoch.add_metric((), role.epoch)
        yield epoch
        writable = GaugeMetricFamily("tidemq_broker_accepts_writes",
                                     "1 when this broker takes sends now; 0 on a slave, a "
                                     "fenced master or during a role switch.")
        writable.add_metric((), 1 if role.accepts_writes else 0)
        yield writable

    def _traffic(self, stats) -> Iterator[Metric]:
        messages_in = CounterMetricFamily(
            "tidemq_broker_messages_in", "Messages stored, by topic.", labels=("topic",))
        bytes_in = CounterMetricFamily(
            "tidemq_broker_bytes_in", "Bytes stored (whole commit-log records, as RocketMQ's "
            "putMessageSizeTotal), by topic.", labels=("topic",))
        for topic, (count, size) in sorted(stats.topic_puts.items()):
            messages_in.add_metric((topic,), count)
            bytes_in.add_metric((topic,), size)
        messages_out = CounterMetricFamily(
            "tidemq_broker_messages_out", "Messages sent to consumers by pulls, by topic and "
            "group.", labels=("topic", "group"))
        bytes_out = CounterMetricFamily(
            "tidemq_broker_bytes_out", "Stored record bytes sent to consumers, by topic and "
            "group.", labels=("topic", "group"))
        for (topic, group), (count, size) in sorted(stats.topic_gets.items()):
            messages_out.add_metric((topic, group), count)
            bytes_out.add_metric((topic, group), size)
        failures = CounterMetricFamily("tidemq_broker_put_failures",
                                       "Sends the store refused.")
        failures.add_metric((), stats.put_message_failed_times)
        yield from (messages_in, bytes_in, messages_out, bytes_out, failures)

    def _store_positions(self) -> Iterator[Metric]:
        store = self._parts.store
        commit_log = GaugeMetricFamily(
            "tidemq_broker_commit_log_offset", "Commit-log positions in bytes: min (oldest "
            "kept) and max (the end; records are dispatched as they are appended).",
            labels=("position",))
        commit_log.add_metric(("min",), store.commit_log_min_offset())
        commit_log.add_metric(("max",), store.commit_log_max_offset())
        yield commit_log
        dispatched = GaugeMetricFamily(
            "tidemq_broker_topic_max_offset", "Sum over a topic's queues of the consume-queue "
            "max offset: messages dispatched to the topic and still addressable.",
            labels=("topic",))
        for topic, topic_config in sorted(self._parts.topics.all().items()):
            queues = max(topic_config.read_queue_nums, topic_config.write_queue_nums)
            dispatched.add_metric((topic,), sum(store.max_offset(topic, queue_id)
                                                for queue_id in range(queues)))
        yield dispatched

    def _lag_and_depth(self) -> Iterator[Metric]:
        store = self._parts.store
        lag = GaugeMetricFamily(
            "tidemq_broker_consumer_lag", "Messages of a topic a group has not consumed yet: "
            "per queue, max offset minus committed offset, summed (as consumerProgress).",
            labels=("group", "topic"))
        retry_depth = GaugeMetricFamily(
            "tidemq_broker_retry_depth", "Messages waiting in a group's %RETRY% topic (its lag "
            "there).", labels=("group",))
        for (topic, group), offsets in sorted(self._parts.offsets.all_offsets()):
            behind = sum(max(0, store.max_offset(topic, queue_id) - offset)
                         for queue_id, offset in offsets.items())
            lag.add_metric((group, topic), behind)
            if topic == RETRY_PREFIX + group:
                retry_depth.add_metric((group,), behind)
        yield lag
        yield retry_depth
        dlq_depth = GaugeMetricFamily(
            "tidemq_broker_dlq_depth", "Messages in a group's %DLQ% topic (max - min offset).",
            labels=("group",))
        for topic, topic_config in sorted(self._parts.topics.all().items()):
            if topic.startswith(DLQ_PREFIX):
                queues = max(topic_config.read_queue_nums, topic_config.write_queue_nums)
                dlq_depth.add_metric((topic[len(DLQ_PREFIX):],), sum(
                    store.max_offset(topic, q) - store.min_offset(topic, q)
                    for q in range(queues)))
        yield dlq_depth

    def _disk(self) -> Iterator[Metric]:
        root = self._parts.store_config.store_path_root_dir
        try:
            usage = shutil.disk_usage(root)
        except OSError:
            return
        disk = GaugeMetricFamily(
            "tidemq_broker_disk_bytes", "The store path's file system: total, used and free "
            "bytes (storePathRootDir).", labels=("kind",))
        disk.add_metric(("total",), usage.total)
        disk.add_metric(("used",), usage.used)
        disk.add_metric(("free",), usage.free)
        yield disk
        ratio = GaugeMetricFamily(
            "tidemq_broker_disk_used_ratio",
            "Used share of the store path's file system (0-1), as df and the store's "
            "retention and disk-full checks count it: used / (used + free).")
        ratio.add_metric((), used_percent(DiskUsage(usage.total, usage.used, usage.free)) / 100)
        yield ratio


def _histogram(name: str, documentation: str, tally) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation)
    family.add_metric((), tally.cumulative(), tally.sum_s)
    return family


def broker_exporter(parts: BrokerParts, connection_count: Callable[[], int],
                    requests: RequestMetrics) -> MetricsExporter:
    """The exporter of a broker configured with metricsExporterType=PROM (not started)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(parts, connection_count))
    registry.register(requests)
    config = parts.config
    return MetricsExporter(registry, config.metrics_prom_exporter_host or config.broker_ip1,
                           config.metrics_prom_exporter_port)

"""The name server's Prometheus metrics (metricsExporterType=PROM; docs/monitoring.md):
live brokers, topics, connections, and the request metrics every server keeps. Read at
scrape time from the route table, on the name server's event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from tidemq.metrics.exporter import MetricsExporter
from tidemq.metrics.requests import RequestMetrics
from tidemq.namesrv.config import NamesrvConfig
from tidemq.namesrv.route_info_manager import RouteInfoManager


class NamesrvCollector:
    """Live brokers (per cluster), topics and connections of one name server."""

    def __init__(self, route_info: RouteInfoManager,
                 connection_count: Callable[[], int]) -> None:
        self._route_info = route_info
        self._connection_count = connection_count

    def collect(self) -> Iterator[Metric]:
        route_info = self._route_info
        cluster = route_info.cluster_info()
        live = set(route_info.live_broker_addrs())
        brokers = GaugeMetricFamily(
            "tidemq_namesrv_live_brokers", "Brokers registered and not expired, by cluster "
            "and role.", labels=("cluster", "role"))
        counts: dict[tuple[str, str], int] = {}
        for data in cluster.broker_addr_table.values():
            for broker_id, address in data.broker_addrs.items():
                if address in live:
                    key = (data.cluster, "master" if broker_id == 0 else "slave")
                    counts[key] = counts.get(key, 0) + 1
        for (cluster_name, role), count in sorted(counts.items()):
            brokers.add_metric((cluster_name, role), count)
        yield brokers
        topics = GaugeMetricFamily("tidemq_namesrv_topics", "Topics with a route.")
        topics.add_metric((), len(route_info.all_topics()))
        yield topics
        connections = GaugeMetricFamily("tidemq_namesrv_connections",
                                        "Open connections (brokers and clients).")
        connections.add_metric((), self._connection_count())
        yield connections


def namesrv_exporter(config: NamesrvConfig, route_info: RouteInfoManager,
                     connection_count: Callable[[], int],
                     requests: RequestMetrics) -> MetricsExporter:
    """The exporter of a name server configured with metricsExporterType=PROM."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NamesrvCollector(route_info, connection_count))
    registry.register(requests)
    return MetricsExporter(registry, config.metrics_prom_exporter_host or config.bind_address,
                           config.metrics_prom_exporter_port)

"""Request metrics: how many requests of each code got which response code, and how long
serving them took. The remoting dispatcher reports each served request (or each group of
requests served together) to ``RequestMetrics.observe``; plain counters and tallies keep
the figures, and ``collect`` turns them into Prometheus families at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from tidemq.protocol.codes import request_code_name
from tidemq.timings import LatencyTally

NO_RESPONSE = -1  # a handler that answers later (a held pull) or a oneway request
OTHER_CODE = -2  # any request code past REQUEST_SERIES_MAX distinct (code, response) pairs
# Request codes come from clients: a peer sending every int would otherwise grow the series
# without bound. 1024 pairs is far more than the ~100 codes a broker serves.
REQUEST_SERIES_MAX = 1024


def _response_label(code: int) -> str:
    return "none" if code == NO_RESPONSE else str(code)


class RequestMetrics:
    """Counts and latencies of served requests, by request code and response code.

    Args:
        prefix: metric name prefix (``tidemq_broker`` or ``tidemq_namesrv``).
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._tallies: dict[tuple[int, int], LatencyTally] = {}

    def observe(self, request_code: int, response_code: int, seconds: float,
                times: int = 1) -> None:
        """Record ``times`` requests of ``request_code`` answered ``response_code`` after
        ``seconds`` (the dispatcher's RequestObserver)."""
        key = (request_code, response_code)
        tally = self._tallies.get(key)
        if tally is None:
            if len(self._tallies) >= REQUEST_SERIES_MAX:
                key = (OTHER_CODE, response_code)
                tally = self._tallies.get(key)
            if tally is None:
                tally = self._tallies[key] = LatencyTally()
        tally.observe(seconds, times)

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            f"{self.prefix}_requests", "Requests served, by request code and response code.",
            labels=("request_code", "request", "response_code"))
        latency = HistogramMetricFamily(
            f"{self.prefix}_request_latency_seconds",
            "Time from a request's arrival to its response, by request and response code.",
            labels=("request_code", "request", "response_code"))
        for (request_code, response_code), tally in sorted(self._tallies.items()):
            name = "other" if request_code == OTHER_CODE else request_code_name(request_code)
            labels = (str(request_code), name, _response_label(response_code))
            requests.add_metric(labels, tally.count)
            latency.add_metric(labels, tally.cumulative(), tally.sum_s)
        yield requests
        yield latency

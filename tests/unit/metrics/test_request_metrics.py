"""Latency tallies and request metrics as Prometheus families, parsed back by
prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tidemq.metrics.requests import NO_RESPONSE, REQUEST_SERIES_MAX, RequestMetrics
from tidemq.protocol.codes import RequestCode
from tidemq.timings import LatencyTally


def test_tally_buckets_are_cumulative_with_inf_last() -> None:
    tally = LatencyTally((0.001, 0.01))
    tally.observe(0.0005)
    tally.observe(0.005, times=3)  # a group of three served together
    tally.observe(5.0)
    assert tally.cumulative() == [("0.001", 1), ("0.01", 4), ("+Inf", 5)]
    assert tally.count == 5
    assert abs(tally.sum_s - (0.0005 + 0.015 + 5.0)) < 1e-9


def samples_of(metrics: RequestMetrics) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_requests_are_counted_per_request_and_response_code() -> None:
    metrics = RequestMetrics("tidemq_broker")
    metrics.observe(RequestCode.SEND_MESSAGE_V2, 0, 0.002, 4)
    metrics.observe(RequestCode.SEND_MESSAGE_V2, 17, 0.0001)
    metrics.observe(RequestCode.PULL_MESSAGE, NO_RESPONSE, 0.0)
    samples = samples_of(metrics)
    send_ok = (("request", "SEND_MESSAGE_V2"), ("request_code", "310"), ("response_code", "0"))
    assert samples[("tidemq_broker_requests_total", send_ok)] == 4
    assert samples[("tidemq_broker_request_latency_seconds_count", send_ok)] == 4
    assert samples[("tidemq_broker_request_latency_seconds_bucket",
                    (("le", "0.0025"), *send_ok))] == 4
    assert samples[("tidemq_broker_request_latency_seconds_bucket",
                    (("le", "0.001"), *send_ok))] == 0
    held = (("request", "PULL_MESSAGE"), ("request_code", "11"), ("response_code", "none"))
    assert samples[("tidemq_broker_requests_total", held)] == 1


def test_request_codes_from_peers_cannot_grow_the_series_without_bound() -> None:
    metrics = RequestMetrics("tidemq_broker")
    for code in range(REQUEST_SERIES_MAX + 500):
        metrics.observe(100_000 + code, 3, 0.0)
    counts = [value for (name, labels), value in samples_of(metrics).items()
              if name == "tidemq_broker_requests_total"]
    assert len(counts) == REQUEST_SERIES_MAX + 1  # the "other" series takes the rest
    assert sum(counts) == REQUEST_SERIES_MAX + 500

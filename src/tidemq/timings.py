"""A latency tally any layer may keep: counts per fixed bucket, a sum and a count.

It is plain data (no lock, no library): recording costs a ``bisect`` and three additions,
so hot paths (a request served, a store put, a flush) can keep one. The metrics exporter
turns it into a Prometheus histogram at scrape time (tidemq/metrics). A tally may be
written by one thread and read by another: a reader may see a count and a sum one
observation apart, which a scrape tolerates.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

# Seconds: from half a millisecond (a store put) to 10 s (a long poll, a slow disk).
LATENCY_BOUNDS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)


class LatencyTally:
    """Observations of a duration in buckets with upper bounds ``bounds_s`` (+Inf last).

    Attributes:
        counts: observations per bucket (not cumulative), the last one past every bound.
        sum_s: the sum of every observation, in seconds.
        count: how many observations.
    """

    __slots__ = ("bounds_s", "count", "counts", "sum_s")

    def __init__(self, bounds_s: Sequence[float] = LATENCY_BOUNDS_S) -> None:
        self.bounds_s = tuple(bounds_s)
        self.counts = [0] * (len(self.bounds_s) + 1)
        self.sum_s = 0.0
        self.count = 0

    def observe(self, seconds: float, times: int = 1) -> None:
        """Record ``times`` observations of ``seconds`` (a group of requests served
        together records once, with ``times`` = the group's size)."""
        self.counts[bisect.bisect_left(self.bounds_s, seconds)] += times
        self.sum_s += seconds * times
        self.count += times

    def cumulative(self) -> list[tuple[str, int]]:
        """``(upper bound, observations at or below it)`` pairs, ``+Inf`` last, as a
        Prometheus histogram's buckets."""
        total = 0
        buckets: list[tuple[str, int]] = []
        for bound, count in zip((*map(str, self.bounds_s), "+Inf"), self.counts, strict=True):
            total += count
            buckets.append((bound, total))
        return buckets

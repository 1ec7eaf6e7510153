"""``tidemq bench consume`` times consumption from its start, fetches during the seek
included: a run whose messages were all fetched while it sought its queues once reported
only the time of its last polls (``--count 2000``: an absurd msg/s)."""

from __future__ import annotations

import asyncio
import types

import pytest

from tidemq.cli import bench_command
from tidemq.client.message import MessageQueue
from tidemq.protocol.message import MessageExt

SEEK_S = 0.5  # the seek's round trips, during which the consumer already fetches
POLL_S = 0.001  # handing buffered messages over


class Clock:
    """A clock the test moves by hand: no wall-clock time in the figures."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def process_time(self) -> float:
        return self.now

    def time_ns(self) -> int:
        return int(self.now * 1e9)


class PrefetchingConsumer:
    """A PullConsumer whose fetching (started at assign) has every message buffered by the
    time the seek returns, as a real one can for a small count."""

    def __init__(self, clock: Clock, count: int) -> None:
        self.clock = clock
        self.buffered: list[MessageExt] = []
        self.count = count

    def __call__(self, *args: object, **kwargs: object) -> PrefetchingConsumer:
        return self  # stands in for the class: PullConsumer(group, namesrv, ...)

    async def __aenter__(self) -> PrefetchingConsumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def queues(self, topic: str) -> list[MessageQueue]:
        self.clock.now += 0.2  # the route lookup: set-up, not consumption
        return [MessageQueue(topic, "broker-a", 0)]

    def assign(self, queues: list[MessageQueue]) -> None:
        self.topic = queues[0].topic

    async def seek_to_beginning(self) -> None:
        self.clock.now += SEEK_S
        self.buffered = [MessageExt(self.topic, b"x" * 100) for _ in range(self.count)]

    async def poll(self, timeout_ms: int) -> list[MessageExt]:
        self.clock.now += POLL_S
        taken, self.buffered = self.buffered, []
        return taken


def consume_prefetched(monkeypatch, buffered: int, count: int) -> bench_command.Summary:
    """``run_consume`` with ``--count count`` against a consumer that has ``buffered``
    messages fetched by the time its seek returns, on a hand-moved clock."""
    clock = Clock()
    monkeypatch.setattr(bench_command, "time", types.SimpleNamespace(
        perf_counter=clock.perf_counter, process_time=clock.process_time,
        time_ns=clock.time_ns))
    monkeypatch.setattr(bench_command, "PullConsumer", PrefetchingConsumer(clock, buffered))
    return asyncio.run(bench_command.run_consume(
        "127.0.0.1:9876", "BenchTopic", "g", "first", count, None, False, False))


def test_consume_rate_counts_from_the_start_of_consumption(monkeypatch):
    summary = consume_prefetched(monkeypatch, 2000, 2000)
    assert summary.messages == 2000
    assert summary.seconds == pytest.approx(SEEK_S + POLL_S)  # not POLL_S alone
    assert summary.msgs_per_s == pytest.approx(2000 / (SEEK_S + POLL_S))  # ~3,992, not 2M
    assert summary.first_message_s == pytest.approx(SEEK_S + POLL_S)


def test_consume_stops_at_its_count_inside_a_fetched_batch(monkeypatch):
    """A poll hands over a whole fetched batch; the run counts --count messages, not the
    batch's tail past it (2,257 reported for --count 2000 before)."""
    summary = consume_prefetched(monkeypatch, 2257, 2000)
    assert summary.messages == 2000
    assert summary.size == 100
    assert summary.msgs_per_s == pytest.approx(2000 / (SEEK_S + POLL_S))

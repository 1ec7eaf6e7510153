"""Queue choice: round robin, avoiding brokers that failed, and stable sharding keys."""

from __future__ import annotations

import random

import pytest

from tidemq.client.message import MessageQueue
from tidemq.client.queue_selection import FaultTracker, RoundRobin, select_by_sharding_key

QUEUES = [MessageQueue("T", broker, i) for broker in ("a", "b") for i in range(2)]


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000.0

    def __call__(self) -> float:
        return self.now_ms


def test_round_robin_visits_every_queue_in_turn():
    picker = RoundRobin()
    picked = [picker.select(QUEUES) for _ in range(8)]
    assert picked == QUEUES + QUEUES


def test_failed_broker_is_skipped_until_its_isolation_ends():
    clock = FakeClock()
    faults = FaultTracker(isolation_ms=30_000, clock_ms=clock)
    picker = RoundRobin()
    faults.mark_failed("a")
    picked = {picker.select(QUEUES, faults).broker_name for _ in range(10)}
    assert picked == {"b"}
    assert faults.unavailable_brokers == ["a"]
    clock.now_ms += 30_000
    picked = {picker.select(QUEUES, faults).broker_name for _ in range(10)}
    assert picked == {"a", "b"}
    assert faults.unavailable_brokers == []


def test_retry_avoids_the_broker_that_just_failed():
    picker = RoundRobin()
    for _ in range(10):
        assert picker.select(QUEUES, FaultTracker(), avoid_broker="b").broker_name == "a"


def test_when_every_broker_is_marked_a_queue_is_still_chosen():
    faults = FaultTracker(clock_ms=FakeClock())
    faults.mark_failed("a")
    faults.mark_failed("b")
    picker = RoundRobin()
    assert picker.select(QUEUES, faults) in QUEUES
    # a retry still prefers the other broker over the one that just failed
    assert picker.select(QUEUES, faults, avoid_broker="a").broker_name == "b"


def test_slow_sends_mark_a_broker_and_fast_ones_forgive_it():
    clock = FakeClock()
    faults = FaultTracker(clock_ms=clock)
    faults.record_latency("a", 600)
    assert not faults.is_available("a")
    faults.record_latency("a", 3)
    assert faults.is_available("a")


def test_empty_queue_list_is_an_error():
    with pytest.raises(ValueError):
        RoundRobin().select([])
    with pytest.raises(ValueError):
        select_by_sharding_key([], "k")


def java_hash(text: str) -> int:
    """Java String.hashCode, written out independently of the code under test."""
    value = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        value = (value * 31 + int(unit, 16)) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


@pytest.mark.parametrize("key", ["o-42", "TagA", "polygenelubricants", "ключ", "x" * 50])
def test_sharding_key_follows_javas_select_by_hash(key):
    queues = [MessageQueue("T", b, i) for b in ("a", "b", "c") for i in range(4)]
    remainder = abs(java_hash(key)) % len(queues)
    expected_index = remainder  # Java: (h % n), made positive with abs
    assert select_by_sharding_key(queues, key) == sorted(queues)[expected_index]


def test_sharding_key_ignores_the_order_queues_are_listed_in():
    queues = [MessageQueue("T", b, i) for b in ("a", "b") for i in range(4)]
    shuffled = queues[:]
    random.Random(7).shuffle(shuffled)
    for key in (f"order-{n}" for n in range(50)):
        assert select_by_sharding_key(queues, key) == select_by_sharding_key(shuffled, key)


def test_sharding_keys_spread_over_queues():
    queues = [MessageQueue("T", "a", i) for i in range(8)]
    used = {select_by_sharding_key(queues, f"user-{n}") for n in range(200)}
    assert used == set(queues)

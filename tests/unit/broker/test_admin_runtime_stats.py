"""BrokerStats: the counters behind GET_BROKER_RUNTIME_INFO, on an injected clock."""

from __future__ import annotations

import datetime

from tidemq.broker.runtime_info import BrokerStats, human_bytes


class Clock:
    def __init__(self, start_ms: int) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms


def local_ms(year: int, month: int, day: int, hour: int, minute: int, second: int) -> int:
    return int(datetime.datetime(year, month, day, hour, minute, second).timestamp() * 1000)


def test_put_rates_over_the_three_windows():
    clock = Clock(local_ms(2024, 3, 1, 12, 0, 0))
    stats = BrokerStats(clock_ms=clock)
    for _ in range(120):  # two minutes at 10 messages a second
        clock.now_ms += 1000
        stats.record_put(10, 100, 1)
        stats.sample()
    assert stats.tps("put") == "10.00 10.00 10.00"
    for _ in range(10):  # ten quiet seconds
        clock.now_ms += 1000
        stats.sample()
    ten_s, one_min, ten_min = (float(x) for x in stats.tps("put").split())
    assert ten_s == 0.0
    assert one_min == round(500 / 60, 2)
    assert ten_min == round(1200 / 130, 2)  # younger than the window: its whole life


def test_get_rates_split_found_and_missed_pulls():
    clock = Clock(local_ms(2024, 3, 1, 12, 0, 0))
    stats = BrokerStats(clock_ms=clock)
    clock.now_ms += 10_000
    for _ in range(30):
        stats.record_get(4)
    for _ in range(10):
        stats.record_get(0)
    assert stats.tps("get_found").split()[0] == "3.00"
    assert stats.tps("get_miss").split()[0] == "1.00"
    assert stats.tps("get_total").split()[0] == "4.00"
    assert stats.tps("get_transferred").split()[0] == "12.00"
    assert stats.get_transferred_total == 120


def test_midnight_snapshots_give_today_and_yesterday():
    clock = Clock(local_ms(2024, 3, 1, 23, 59, 58))
    stats = BrokerStats(clock_ms=clock)
    stats.record_put(5, 50, 1)
    stats.record_get(2)
    clock.now_ms += 4000  # past midnight
    stats.sample()
    assert stats.put_total_today_morning == 5
    assert stats.put_total_yesterday_morning == 0
    assert stats.get_total_today_morning == 2
    stats.record_put(7, 70, 1)
    clock.now_ms += 86_400_000
    stats.sample()
    assert stats.put_total_today_morning == 12
    assert stats.put_total_yesterday_morning == 5


def test_slowest_put_and_failures_are_kept():
    stats = BrokerStats(clock_ms=Clock(0))
    stats.record_put(1, 10, 3)
    stats.record_put(1, 10, 9)
    stats.record_put(1, 10, 2)
    stats.record_put_failure()
    assert stats.put_message_entire_time_max_ms == 9
    assert stats.put_message_failed_times == 1
    assert stats.put_message_size_total == 30


def test_runtime_and_byte_texts_match_rocketmq():
    clock = Clock(0)
    stats = BrokerStats(clock_ms=clock)
    clock.now_ms = ((2 * 24 + 3) * 3600 + 4 * 60 + 5) * 1000
    assert stats.runtime_text() == "[ 2 days, 3 hours, 4 minutes, 5 seconds ]"
    assert human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.50 KiB"
    assert human_bytes(5 * 1024**3) == "5.00 GiB"

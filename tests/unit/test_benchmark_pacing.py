"""latency_bench's offered schedule (benchmarks/pacing.py): every due time once, none early.

The end-to-end latency figures depend on the producer offering exactly the fixed-rate schedule
(message i due at start + i / rate, a slow reply not lowering the load), whichever way its
coroutines wait for their due times. The schedule is checked against that definition here,
with senders that answer at once and senders whose replies are slow; no wall-clock bound is
asserted (only that nothing is handed out before it is due, less the documented EARLY_S).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import sys
import time

import pytest

from benchmark_runs import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))
import pacing  # benchmarks/ is not a package: its folder is put on sys.path above


async def _run_senders(rate: float, seconds: float, senders: int,
                       reply_s: float) -> tuple[float, list[tuple[float, float]]]:
    """(start, [(due time, perf_counter when it was handed out)]) of one schedule run by
    ``senders`` coroutines that each 'send' for ``reply_s`` (0: one loop iteration)."""
    schedule = pacing.Schedule(rate, seconds)
    taken: list[tuple[float, float]] = []

    async def sender() -> None:
        while True:
            slot = schedule.take()
            if slot is None:
                if schedule.finished:
                    return
                slot = await schedule.wait()
                if slot is None:
                    return
            taken.append((slot, time.perf_counter()))
            await asyncio.sleep(reply_s)

    workers = [sender() for _ in range(senders)]
    start = schedule.start()
    await asyncio.wait_for(asyncio.gather(*workers), timeout=seconds + 60)
    return start, taken


@pytest.mark.parametrize(("senders", "reply_s"), [(4, 0.0), (3, 0.02)],
                         ids=["quick-replies", "slow-replies"])
def test_schedule_hands_out_every_due_time_once_never_early(senders, reply_s):
    rate, seconds = 2000.0, 0.2
    start, taken = asyncio.run(_run_senders(rate, seconds, senders, reply_s))
    due_times = [slot for slot, _ in taken]
    count = math.ceil(seconds * rate)
    # None lost, none twice (slow replies included). They are handed out in order, but a
    # sender woken by its future may record its due time after one that took the next from
    # take() in the same loop iteration: the set is compared, not the order seen.
    assert sorted(due_times) == [start + i / rate for i in range(count)]
    assert max(due_times) < start + seconds
    assert all(handed >= slot - pacing.EARLY_S for slot, handed in taken)


def test_schedule_waiters_are_released_at_its_end():
    async def scenario() -> list[float | None]:
        schedule = pacing.Schedule(1000.0, 0.01)
        schedule.start()
        while schedule.take() is not None or not schedule.finished:
            await asyncio.sleep(0.001)
        # Every due time is out: a sender asking now learns the schedule has ended.
        return [await schedule.wait(), schedule.take()]

    assert asyncio.run(scenario()) == [None, None]


def test_schedule_refuses_a_rate_that_is_not_positive():
    async def make() -> None:
        pacing.Schedule(0, 1.0)

    with pytest.raises(ValueError, match="rate is 0 messages a second"):
        asyncio.run(make())


@pytest.mark.parametrize(("rate", "seconds"), [(7500, 15), (20000, 10), (3, 1), (2000.0, 0.2)])
def test_due_offsets_are_the_schedules_due_times_each_from_its_index(rate, seconds):
    # The sleep pacing once added 1 / rate to the last due time: from a start of 0.0, 20,000
    # msg/s for 10 s gave 200,001 due times before the end (from 12345.678, 7,500 for 15 s
    # gave 112,501): the sum's rounding error let one more in.
    offsets = list(pacing.due_offsets(rate, seconds))
    assert offsets == [i / rate for i in range(math.ceil(rate * seconds))]
    assert offsets[-1] < seconds


def test_due_offsets_shared_by_senders_hand_each_due_time_out_once():
    offsets = pacing.due_offsets(1000, 0.05)
    taken = [[], [], []]
    for turn in itertools.count():
        offset = next(offsets, None)
        if offset is None:
            break
        taken[turn % 3].append(offset)
    assert sorted(itertools.chain(*taken)) == [i / 1000 for i in range(50)]
    assert next(offsets, None) is None


def test_due_offsets_refuse_a_rate_that_is_not_positive():
    with pytest.raises(ValueError, match="rate is -1 messages a second"):
        pacing.due_offsets(-1, 1.0)

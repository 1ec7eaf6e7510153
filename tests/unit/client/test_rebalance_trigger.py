"""RebalanceTrigger: runs on its timer and on request, one at a time, never dies of a failure."""

from __future__ import annotations

import asyncio
import logging

from tidemq.client.rebalance_trigger import RebalanceTrigger

WAIT_BOUND_S = 10.0


def run(coro):
    async def bounded():
        async with asyncio.timeout(WAIT_BOUND_S):
            return await coro
    return asyncio.run(bounded())


def test_requests_fold_into_one_run_and_a_failed_run_is_logged_not_fatal(caplog):
    runs: list[int] = []

    async def rebalance() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise RuntimeError("route lookup failed")

    async def scenario() -> None:
        trigger = RebalanceTrigger("g1", 3_600_000, rebalance)  # the timer never fires here
        trigger.request()  # before arm(): dropped
        trigger.arm()
        task = asyncio.get_running_loop().create_task(trigger.loop())
        trigger.request()
        trigger.request()  # folds into the same run
        while len(runs) < 1:
            await asyncio.sleep(0.001)
        trigger.request()  # after the failed run: the loop goes on
        while len(runs) < 2:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        task.cancel()

    with caplog.at_level(logging.WARNING, logger="tidemq.client"):
        run(scenario())
    assert runs == [0, 1]
    assert "consumer g1: re-balance failed" in caplog.text


def test_the_timer_runs_without_requests():
    runs: list[str] = []

    async def rebalance() -> None:
        runs.append("run")

    async def scenario() -> None:
        trigger = RebalanceTrigger("g2", 1, rebalance)
        trigger.arm()
        task = asyncio.get_running_loop().create_task(trigger.loop())
        while len(runs) < 3:  # nobody asks: the 1 ms timer alone runs it, again and again
            await asyncio.sleep(0.001)
        task.cancel()

    run(scenario())
    assert len(runs) >= 3

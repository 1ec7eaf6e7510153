"""BackgroundSaver: changes coalesce into saves in a worker thread; failures are retried."""

from __future__ import annotations

import asyncio
import logging
import threading

from tidemq.broker.background_saver import BackgroundSaver
from tidemq.errors import StoreError

WAIT_BOUND_S = 10.0


class Table:
    """A table whose writes run in a thread and can be made to fail or to block."""

    def __init__(self) -> None:
        self.changes = 0
        self.written: list[int] = []
        self.threads: set[int] = set()
        self.fail_next = False
        self.fail_times = 0  # the next this many writes fail
        self.release = threading.Event()
        self.release.set()

    def snapshot(self) -> int | None:
        last = self.written[-1] if self.written else 0
        return self.changes if self.changes != last else None

    def write(self, snapshot: int) -> None:
        self.threads.add(threading.get_ident())
        self.release.wait(WAIT_BOUND_S)
        if self.fail_next or self.fail_times:
            self.fail_next = False
            self.fail_times = max(0, self.fail_times - 1)
            raise StoreError("no space left to save table.json; free disk space")
        self.written.append(snapshot)


async def until(condition) -> None:
    async with asyncio.timeout(WAIT_BOUND_S):
        while not condition():
            await asyncio.sleep(0.005)


def test_changes_made_during_a_save_go_into_the_next_one():
    table = Table()

    async def scenario():
        saver = BackgroundSaver(table.snapshot, table.write, "table.json", interval_s=0.0)
        saver.start()
        table.release.clear()  # the first save blocks in its thread
        table.changes = 1
        saver.schedule()
        await until(lambda: table.threads)
        for _ in range(10):  # ten changes while it is blocked
            table.changes += 1
            saver.schedule()
        table.release.set()
        await until(lambda: table.written and table.written[-1] == 11)
        await saver.stop()

    asyncio.run(scenario())
    assert table.written == [1, 11]  # one more save carried all ten
    assert threading.get_ident() not in table.threads


def test_a_failed_save_is_logged_and_retried_with_the_next_change_or_at_stop(caplog):
    table = Table()

    async def scenario():
        saver = BackgroundSaver(table.snapshot, table.write, "table.json", interval_s=0.0)
        saver.start()
        table.fail_next = True
        table.changes = 1
        saver.schedule()
        await until(lambda: "saving table.json failed" in caplog.text)
        assert table.written == []
        await saver.stop()  # the final save writes what the failed one could not

    with caplog.at_level(logging.ERROR, "tidemq.broker"):
        asyncio.run(scenario())
    assert table.written == [1]
    assert "free disk space" in caplog.text


def test_concurrent_waiters_share_one_durable_save():
    table = Table()

    async def scenario():
        # A long interval: waiters must not wait it out.
        saver = BackgroundSaver(table.snapshot, table.write, "table.json", interval_s=3600.0)
        saver.start()
        table.release.clear()  # the first save blocks in its thread
        table.changes = 1
        first = asyncio.ensure_future(saver.saved())
        await until(lambda: table.threads)
        waiters = []
        for _ in range(10):  # ten acknowledged changes while it is blocked
            table.changes += 1
            waiters.append(asyncio.ensure_future(saver.saved()))
        await asyncio.sleep(0)
        assert not first.done() and not any(w.done() for w in waiters)
        table.release.set()
        async with asyncio.timeout(WAIT_BOUND_S):
            await first
            assert table.written[0] == 1
            await asyncio.gather(*waiters)
        assert table.written == [1, 11]  # every waiter answered after the save holding it
        await saver.stop()

    asyncio.run(scenario())
    assert table.written == [1, 11]  # ten waiters, one more write


def test_a_waiter_with_nothing_left_to_write_is_answered_by_the_next_save():
    table = Table()

    async def scenario():
        saver = BackgroundSaver(table.snapshot, table.write, "table.json", interval_s=3600.0)
        saver.start()
        async with asyncio.timeout(WAIT_BOUND_S):
            await saver.saved()  # nothing changed: no write, still answered
        await saver.stop()

    asyncio.run(scenario())
    assert table.written == []


def test_a_failed_save_answers_every_waiter_with_its_error():
    table = Table()

    async def scenario():
        saver = BackgroundSaver(table.snapshot, table.write, "table.json", interval_s=3600.0)
        saver.start()
        table.release.clear()
        table.fail_times = 2  # this save and the one the waiters share
        table.changes = 1
        saver.schedule()  # an unacknowledged change starts the first failing save
        await until(lambda: table.threads)
        table.changes = 2
        waiters = [asyncio.ensure_future(saver.saved()) for _ in range(5)]
        table.release.set()
        async with asyncio.timeout(WAIT_BOUND_S):
            results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, StoreError) and "table.json" in str(r) for r in results)
        async with asyncio.timeout(WAIT_BOUND_S):
            await saver.saved()  # the next save writes the change the failed ones held
        assert table.written == [2]
        await saver.stop()

    asyncio.run(scenario())


def test_a_waiter_before_start_or_after_stop_saves_at_once():
    table = Table()

    async def scenario():
        saver = BackgroundSaver(table.snapshot, table.write, "table.json", interval_s=3600.0)
        table.changes = 1
        await saver.saved()
        saver.start()
        await saver.stop()
        table.changes = 2
        await saver.saved()

    asyncio.run(scenario())
    assert table.written == [1, 2]

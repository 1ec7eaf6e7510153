"""Sends waiting for the disk share one wake-up per sync (broker/ha/flush_waits.py)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

from tidemq.broker.ha.flush_waits import answer_when_durable, durable_status, settle_ready
from tidemq.store.flush import GroupCommitService
from tidemq.store.interface import PutStatus


def test_waiters_of_one_sync_are_answered_by_one_handoff_from_the_flush_thread():
    async def scenario():
        loop = asyncio.get_running_loop()
        handoffs = []
        real_call = loop.call_soon_threadsafe

        def counting_call(callback, *args):
            handoffs.append(threading.current_thread().name)
            return real_call(callback, *args)

        loop.call_soon_threadsafe = counting_call  # type: ignore[method-assign]
        durable: Future[PutStatus] = Future()
        waits = [asyncio.create_task(durable_status(durable, 10)) for _ in range(16)]
        await asyncio.sleep(0)
        thread = threading.Thread(target=durable.set_result, args=(PutStatus.PUT_OK,),
                                  name="flush")
        thread.start()
        statuses = await asyncio.wait_for(asyncio.gather(*waits), 10)
        thread.join()
        return statuses, handoffs

    statuses, handoffs = asyncio.run(scenario())
    assert statuses == [PutStatus.PUT_OK] * 16
    assert handoffs == ["flush"]


def test_a_sync_that_does_not_come_in_time_answers_flush_disk_timeout():
    async def scenario():
        durable: Future[PutStatus] = Future()
        late = await durable_status(durable, 0.05)
        # A later waiter of the same (still pending) future gets a timer of its own.
        again = asyncio.create_task(durable_status(durable, 10))
        await asyncio.sleep(0)
        durable.set_result(PutStatus.PUT_OK)
        return late, await asyncio.wait_for(again, 10)

    assert asyncio.run(scenario()) == (PutStatus.FLUSH_DISK_TIMEOUT, PutStatus.PUT_OK)


def test_a_cancelled_send_leaves_the_other_waiters_and_the_store_future_alone():
    async def scenario():
        durable: Future[PutStatus] = Future()
        cancelled = asyncio.create_task(durable_status(durable, 10))
        kept = asyncio.create_task(durable_status(durable, 10))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert not durable.cancelled()
        durable.set_result(PutStatus.FLUSH_DISK_TIMEOUT)
        return cancelled.cancelled(), await asyncio.wait_for(kept, 10)

    assert asyncio.run(scenario()) == (True, PutStatus.FLUSH_DISK_TIMEOUT)


def test_a_failed_or_finished_store_future_answers_at_once():
    async def scenario():
        failed: Future[PutStatus] = Future()
        failed.set_exception(OSError("disk gone"))
        done: Future[PutStatus] = Future()
        done.set_result(PutStatus.PUT_OK)
        return await durable_status(failed, 10), await durable_status(done, 10)

    assert asyncio.run(scenario()) == (PutStatus.FLUSH_DISK_TIMEOUT, PutStatus.PUT_OK)


def test_requests_before_the_next_sync_share_its_future_and_its_highest_offset():
    release = threading.Event()
    started = threading.Event()
    flushed = [0]
    targets_seen: list[int] = []

    def slow_flush():
        started.set()
        release.wait(10)
        targets_seen.append(flushed[0])
        return flushed[0]

    service = GroupCommitService(slow_flush)
    service.start()
    try:
        flushed[0] = 100
        first = service.request(100)
        assert started.wait(10)
        group = [service.request(offset) for offset in (300, 200, 400)]
        assert group[0] is group[1] is group[2]
        assert group[0] is not first
        flushed[0] = 399  # the sync falls short of the group's highest end offset
        release.set()
        assert first.result(10) is PutStatus.PUT_OK
        # Short of 400 after every pass: the group is not known durable, all of it.
        assert group[0].result(10) is PutStatus.FLUSH_DISK_TIMEOUT
    finally:
        service.stop()


class Peer:
    """What an answer writes to: counts its flushes."""

    def __init__(self) -> None:
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def test_answers_of_one_sync_run_in_one_pass_with_one_flush_per_connection():
    async def scenario():
        loop = asyncio.get_running_loop()
        durable: Future[PutStatus] = Future()
        peers = [Peer(), Peer()]
        answered: list[tuple[int, PutStatus]] = []

        def answer(n: int):
            def given(status: PutStatus) -> Peer:
                answered.append((n, status))
                return peers[n % 2]
            return given

        for n in range(6):
            answer_when_durable(durable, 10, answer(n), loop)
        assert answered == []
        threading.Thread(target=durable.set_result, args=(PutStatus.PUT_OK,)).start()
        async with asyncio.timeout(10):
            while len(answered) < 6:
                await asyncio.sleep(0.001)
        return answered, [peer.flushes for peer in peers]

    answered, flushes = asyncio.run(scenario())
    assert answered == [(n, PutStatus.PUT_OK) for n in range(6)]  # in order, once each
    assert flushes == [1, 1]


def test_settle_ready_answers_completed_syncs_oldest_first_without_the_handoff():
    async def scenario():
        loop = asyncio.get_running_loop()
        first: Future[PutStatus] = Future()
        second: Future[PutStatus] = Future()
        answered: list[str] = []
        answer_when_durable(first, 10, lambda status: answered.append("first"), loop)
        answer_when_durable(second, 10, lambda status: answered.append("second"), loop)
        second.set_result(PutStatus.PUT_OK)  # on this thread: its handoff is queued, not run
        settle_ready(loop)
        after_second = list(answered)  # the older group's sync is not known yet: nothing
        first.set_result(PutStatus.PUT_OK)
        settle_ready(loop)
        return after_second, answered

    after_second, answered = asyncio.run(scenario())
    assert after_second == []
    assert answered == ["first", "second"]

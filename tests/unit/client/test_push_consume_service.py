"""The consume services on their own: what happens to failed messages, concurrently and in
order, with a recording stand-in for the send-back and an in-memory offset store."""

from __future__ import annotations

import asyncio

from tidemq.client.consume_service import (
    ConcurrentConsumeService,
    ConsumeSettings,
    OrderlyConsumeService,
)
from tidemq.client.listener import ConsumeResult, ListenerInvoker
from tidemq.client.message import MessageQueue
from tidemq.client.process_queue import ProcessQueue
from tidemq.protocol.message import MessageExt

QUEUE = MessageQueue("T", "broker-a", 0)


class Offsets:
    def __init__(self) -> None:
        self.offsets: dict[MessageQueue, int] = {}

    def update(self, queue: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        if not increase_only or offset > self.offsets.get(queue, -1):
            self.offsets[queue] = offset


class SendBackStandIn:
    """Records what is handed back; ``fail`` makes every hand-back fail."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.handed: list[tuple[int, int, bool]] = []  # (offset, reconsume times, dead letter)
        self.sent_back = self.resent = 0

    async def send_all(self, messages, *, dead_letter: bool = False):
        if self.fail:
            return [], list(messages)
        self.handed.extend((m.queue_offset, m.reconsume_times, dead_letter) for m in messages)
        return list(messages), []


def pulled(count: int) -> tuple[ProcessQueue, list[MessageExt]]:
    process_queue = ProcessQueue(QUEUE)
    messages = [MessageExt(topic="T", body=b"m", queue_offset=i) for i in range(count)]
    process_queue.put(messages)
    return process_queue, messages


async def settle(condition, rounds: int = 300) -> None:
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


def test_concurrent_failures_are_handed_back_and_the_offset_moves_past_them(run):
    async def main():
        offsets, send_back = Offsets(), SendBackStandIn()
        service = ConcurrentConsumeService(
            ConsumeSettings("g", 1, True, 16), ListenerInvoker(
                lambda batch: None if batch[0].queue_offset % 2 else ConsumeResult.RECONSUME_LATER,
                None, "g"), offsets, send_back)
        service.start()
        process_queue, messages = pulled(6)
        service.submit(process_queue, messages)
        await service.drain(5)
        return send_back.handed, offsets.offsets[QUEUE], process_queue.message_count

    handed, offset, in_flight = run(main())
    assert handed == [(0, 0, False), (2, 0, False), (4, 0, False)]
    assert (offset, in_flight) == (6, 0)


def test_on_loop_listener_is_called_during_submit_and_an_awaitable_answer_goes_on_later(run):
    """A plain listener on the loop consumes the chunk before ``submit`` returns (no task);
    from a batch whose answer is an awaitable on, the rest is consumed in a task, in order,
    and the offset only passes a batch once it is done."""
    calls: list[int] = []
    release = asyncio.Event()

    async def later() -> ConsumeResult:
        await release.wait()
        return ConsumeResult.SUCCESS

    def listener(batch):
        calls.append(batch[0].queue_offset)
        return later() if batch[0].queue_offset == 2 else None

    async def main():
        offsets = Offsets()
        service = ConcurrentConsumeService(
            ConsumeSettings("g", 1, True, 16), ListenerInvoker(listener, None, "g"),
            offsets, SendBackStandIn())
        service.start()
        process_queue, messages = pulled(5)
        service.submit(process_queue, messages)
        during_submit = (list(calls), offsets.offsets.get(QUEUE))
        await asyncio.sleep(0)  # the task may start; it waits for the awaitable answer
        waiting = (list(calls), offsets.offsets.get(QUEUE), service.busy())
        release.set()
        await service.drain(5)
        return during_submit, waiting, calls, offsets.offsets[QUEUE], process_queue.message_count

    during_submit, waiting, calls, offset, in_flight = run(main())
    assert during_submit == ([0, 1, 2], 2)  # 0 and 1 done at once; 2 waits
    assert waiting == ([0, 1, 2], 2, True)
    assert calls == [0, 1, 2, 3, 4]
    assert (offset, in_flight) == (5, 0)


def test_concurrent_messages_that_cannot_be_handed_back_stay_in_flight_and_come_again(run):
    async def main():
        offsets, send_back = Offsets(), SendBackStandIn(fail=True)
        seen: list[tuple[int, int]] = []

        async def listener(batch):
            seen.append((batch[0].queue_offset, batch[0].reconsume_times))
            if batch[0].queue_offset == 1 and batch[0].reconsume_times == 0:
                return ConsumeResult.RECONSUME_LATER
            return ConsumeResult.SUCCESS

        settings = ConsumeSettings("g", 1, True, 16, local_retry_delay_ms=20)
        service = ConcurrentConsumeService(settings, ListenerInvoker(listener, None, "g"),
                                           offsets, send_back)
        service.start()
        process_queue, messages = pulled(3)
        service.submit(process_queue, messages)
        await settle(lambda: (1, 0) in seen and offsets.offsets.get(QUEUE) == 1)
        stuck = offsets.offsets[QUEUE]  # offset 1 failed and could not be handed back
        await settle(lambda: (1, 1) in seen)
        await service.drain(5)
        await service.stop()
        return stuck, offsets.offsets[QUEUE], settings.stats.local_retries

    stuck, final, local_retries = run(main())
    assert stuck == 1  # never past the message still to be consumed
    assert final == 3
    assert local_retries == 1


def test_broadcasting_failures_are_dropped_not_handed_back(run):
    async def main():
        offsets, send_back = Offsets(), SendBackStandIn()
        service = ConcurrentConsumeService(
            ConsumeSettings("g", 1, False, 16),
            ListenerInvoker(lambda batch: ConsumeResult.RECONSUME_LATER, None, "g"),
            offsets, send_back)
        process_queue, messages = pulled(2)
        service.submit(process_queue, messages)
        await service.drain(5)
        return send_back.handed, offsets.offsets[QUEUE]

    assert run(main()) == ([], 2)


def test_orderly_failure_retries_the_same_message_before_later_ones_then_dead_letters_it(run):
    async def main():
        offsets, send_back = Offsets(), SendBackStandIn()
        seen: list[tuple[int, int]] = []

        def listener(batch):
            message = batch[0]
            seen.append((message.queue_offset, message.reconsume_times))
            return ConsumeResult.SUSPEND_CURRENT_QUEUE_A_MOMENT if message.queue_offset == 1 \
                else ConsumeResult.SUCCESS

        async def always_locked(process_queue):
            return True

        settings = ConsumeSettings("g", 1, True, max_reconsume_times=2, suspend_ms=10)
        service = OrderlyConsumeService(settings, ListenerInvoker(listener, None, "g"), offsets,
                                        send_back, always_locked)
        process_queue, messages = pulled(3)
        service.submit(process_queue, messages)
        await settle(lambda: not service.busy())
        return seen, send_back.handed, offsets.offsets[QUEUE], settings.stats

    seen, handed, offset, stats = run(main())
    # offset 1 fails three times (reconsume times 0, 1, 2) before offset 2 is ever tried
    assert seen == [(0, 0), (1, 0), (1, 1), (1, 2), (2, 0)]
    assert handed == [(1, 2, True)]  # then to the dead letters
    assert offset == 3
    assert stats.dead_lettered == 1 and stats.consumed == 2


def test_orderly_consumption_waits_for_the_queue_lock(run):
    async def main():
        offsets, lock_held = Offsets(), asyncio.Event()
        seen: list[int] = []

        async def ensure_locked(process_queue):
            return lock_held.is_set()

        service = OrderlyConsumeService(
            ConsumeSettings("g", 2, True, 16), ListenerInvoker(
                lambda batch: seen.extend(m.queue_offset for m in batch), None, "g"),
            offsets, SendBackStandIn(), ensure_locked)
        process_queue, messages = pulled(5)
        service.submit(process_queue, messages)
        await asyncio.sleep(0.1)
        before = list(seen)
        lock_held.set()
        await settle(lambda: not service.busy())
        return before, seen

    before, seen = run(main())
    assert before == []
    assert seen == [0, 1, 2, 3, 4]

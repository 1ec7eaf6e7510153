"""Deadline slots of the long-polling hold service, on a clock the test moves.

A slot's timer stays armed when the slot's pulls are all answered early, for the pulls that
park into the same slot next (pull_hold_service.py): they must still end at their deadline,
one timer serves every cycle of the slot, and a timer that fires with nothing left in its
slot answers nothing.
"""

from __future__ import annotations

import asyncio

from tidemq.broker.pull_hold_service import DEADLINE_SLOT_MS, PullMode, PullRequestHoldService
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

TOPIC = "TopicSlots"
TIMEOUT_MS = 1_000


class SteppedClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the test says, counting the deadline slots'
    timers it starts."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000.0
        self.timers_started = 0

    def time(self) -> float:
        return self.now

    def call_at(self, when, callback, *args, context=None):
        if getattr(callback, "__name__", "") == "_expire_slot":
            self.timers_started += 1
        return super().call_at(when, callback, *args, context=context)


class AnsweredConnection:
    """What the hold service uses of a connection: the answers it is given are kept."""

    def __init__(self) -> None:
        self.is_closing = False
        self.attributes: dict = {}
        self.on_close: list = []
        self.remote_address = "127.0.0.1:1"
        self.answers: list[RemotingCommand] = []

    def send_response(self, response: RemotingCommand) -> bool:
        self.answers.append(response)
        return True

    def flush(self) -> None:
        pass


class QueueEnds:
    """The store's max offset of the one queue, as the test sets it."""

    def __init__(self) -> None:
        self.max = 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.max


def executor(runs: list[tuple[int, PullMode]]):
    """A pull executor that answers every WAKE and FINAL run (its mode in the remark)."""

    def run(request, connection, mode, parsed, shared):
        runs.append((request.opaque, mode))
        return RemotingCommand.response_to(request, ResponseCode.PULL_NOT_FOUND,
                                           remark=mode.value)

    return run


def test_a_slot_whose_pulls_were_answered_keeps_its_timer_for_the_next_pulls_deadline():
    loop = SteppedClockLoop()
    ends = QueueEnds()
    hold = PullRequestHoldService(ends)
    connection = AnsweredConnection()
    runs: list[tuple[int, PullMode]] = []

    async def turn() -> None:  # let the loop run what is due at the clock's time
        for _ in range(3):
            await asyncio.sleep(0)

    async def main() -> None:
        await hold.start()
        timers_before = loop.timers_started
        first = RemotingCommand.request(RequestCode.PULL_MESSAGE, {})
        assert hold.park(first, connection, TOPIC, 0, 0, TIMEOUT_MS, executor(runs))
        ends.max = 1
        hold.on_message_dispatched(TOPIC, 0, 1)
        await turn()
        assert runs == [(first.opaque, PullMode.WAKE)] and hold.parked_count == 0
        # The next pull parks a moment later: its deadline falls in the same slot.
        loop.now += DEADLINE_SLOT_MS / 1000 / 10
        second = RemotingCommand.request(RequestCode.PULL_MESSAGE, {})
        assert hold.park(second, connection, TOPIC, 0, 1, TIMEOUT_MS, executor(runs))
        assert loop.timers_started - timers_before == 1  # the first pull's timer serves it
        loop.now += TIMEOUT_MS / 1000 - DEADLINE_SLOT_MS / 1000 / 2
        await turn()
        assert hold.parked_count == 1  # not before its slot's end
        loop.now += 2 * DEADLINE_SLOT_MS / 1000
        await turn()
        assert runs[1:] == [(second.opaque, PullMode.FINAL)] and hold.parked_count == 0
        # A later slot's pull answered early: its kept timer fires with nothing to answer.
        third = RemotingCommand.request(RequestCode.PULL_MESSAGE, {})
        assert hold.park(third, connection, TOPIC, 0, 1, TIMEOUT_MS, executor(runs))
        ends.max = 2
        hold.on_message_dispatched(TOPIC, 0, 2)
        await turn()
        loop.now += TIMEOUT_MS / 1000 + 2 * DEADLINE_SLOT_MS / 1000
        await turn()
        assert runs[2:] == [(third.opaque, PullMode.WAKE)]
        # A pull parked after that: a new timer, and it ends at its deadline.
        fourth = RemotingCommand.request(RequestCode.PULL_MESSAGE, {})
        assert hold.park(fourth, connection, TOPIC, 0, 2, TIMEOUT_MS, executor(runs))
        loop.now += TIMEOUT_MS / 1000 + 2 * DEADLINE_SLOT_MS / 1000
        await turn()
        assert runs[3:] == [(fourth.opaque, PullMode.FINAL)] and hold.parked_count == 0
        assert [answer.remark for answer in connection.answers] == [
            "wake", "final", "wake", "final"]
        await hold.stop()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()

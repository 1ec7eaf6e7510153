"""The server's request observer (the metrics' source): told once per request answered, once
per group of requests served together (with their count), of refusals, and of requests
answered later (-1)."""

from __future__ import annotations

import asyncio

from remoting_helpers import echo, read_command

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting import RemotingServer

ECHO = RequestCode.SEND_MESSAGE_V2
GROUPED = RequestCode.SEND_MESSAGE
LATER = RequestCode.PULL_MESSAGE
UNKNOWN = 9_999


def test_observer_sees_singles_groups_refusals_and_later_answers(run):
    seen: list[tuple[int, int, int]] = []
    durations: list[float] = []

    def observer(request_code: int, response_code: int, seconds: float, count: int) -> None:
        seen.append((request_code, response_code, count))
        durations.append(seconds)

    async def grouped(requests, connection):
        return [await echo(r, connection) for r in requests]

    async def later(request, connection):
        return None  # answered later (a held pull) -- here: never

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(ECHO, echo)
            server.register(GROUPED, echo, group_handler=grouped)
            server.register(LATER, later)
            server.set_request_observer(observer)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
            requests = [RemotingCommand.request(code, {}, b"b")
                        for code in (GROUPED, GROUPED, GROUPED, ECHO, UNKNOWN, LATER)]
            writer.write(b"".join(r.encode() for r in requests))  # one read: a group of 3
            await writer.drain()
            codes = sorted([(await read_command(reader)).code for _ in range(5)])
            while len(seen) < 4:
                await asyncio.sleep(0.01)
            writer.close()
            return codes

    codes = run(main())
    assert codes == sorted([ResponseCode.SUCCESS] * 4 + [ResponseCode.REQUEST_CODE_NOT_SUPPORTED])
    assert sorted(seen) == sorted([
        (GROUPED, ResponseCode.SUCCESS, 3),  # one observation for the group
        (ECHO, ResponseCode.SUCCESS, 1),
        (UNKNOWN, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, 1),
        (LATER, -1, 1),
    ])
    assert all(d >= 0 for d in durations)

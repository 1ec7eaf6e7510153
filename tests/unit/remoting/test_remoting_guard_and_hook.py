"""The server's request guard (the ACL's place) and the client's request hook (signing)."""

from __future__ import annotations

import asyncio

from remoting_helpers import echo, read_command

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting import RemotingClient, RemotingServer

ECHO = RequestCode.SEND_MESSAGE_V2
GROUPED = RequestCode.SEND_MESSAGE


def test_guard_refusals_reach_no_handler_and_are_answered_with_its_code(run):
    handled: list[str] = []

    async def recording(request, connection):
        handled.append(request.ext_fields["n"])
        return await echo(request, connection)

    async def grouped(requests, connection):
        handled.extend(r.ext_fields["n"] for r in requests)
        return [await echo(r, connection) for r in requests]

    def guard(request, connection):
        if int(request.ext_fields["n"]) % 2:
            return ResponseCode.NO_PERMISSION, f"odd {request.ext_fields['n']} refused"
        return None

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(ECHO, recording)
            server.register(GROUPED, recording, group_handler=grouped)
            server.set_request_guard(guard)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
            # One write: the requests arrive in one read, the grouped path is taken too.
            requests = [
                RemotingCommand.request(code, {"n": str(n)}, b"b")
                for n, code in enumerate([ECHO, GROUPED, GROUPED, GROUPED, ECHO, GROUPED])
            ]
            writer.write(b"".join(r.encode() for r in requests))
            await writer.drain()
            responses = {}
            for _ in requests:
                response = await read_command(reader)
                responses[response.opaque] = response
            writer.close()
            return requests, responses

    requests, responses = run(main())
    for n, request in enumerate(requests):
        response = responses[request.opaque]
        if n % 2:
            assert response.code == ResponseCode.NO_PERMISSION
            assert response.remark == f"odd {n} refused"
        else:
            assert response.code == ResponseCode.SUCCESS
    assert sorted(handled) == ["0", "2", "4"]


def test_a_guard_that_raises_refuses_the_request(run):
    def guard(request, connection):
        raise ValueError("broken check")

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, echo)
            server.set_request_guard(guard)
            return await client.invoke(
                f"127.0.0.1:{server.bound_ports[0]}", RemotingCommand.request(ECHO, {}), 5000
            )

    response = run(main())
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "broken check" in response.remark


def test_the_request_hook_sees_every_request_before_it_is_sent(run):
    seen: list[int] = []

    def hook(command: RemotingCommand) -> None:
        seen.append(command.code)
        command.ext_fields = {**(command.ext_fields or {}), "stamped": "yes"}

    async def main():
        arrived: list[dict] = []

        async def record(request, connection):
            arrived.append(dict(request.ext_fields))
            return await echo(request, connection)

        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient(
            request_hook=hook
        ) as client:
            server.register(ECHO, record)
            addr = f"127.0.0.1:{server.bound_ports[0]}"
            response = await client.invoke(addr, RemotingCommand.request(ECHO, {"a": "1"}), 5000)
            await client.invoke_oneway(addr, RemotingCommand.request(ECHO, {"a": "2"}), 5000)
            while len(arrived) < 2:
                await asyncio.sleep(0.01)
        return response, arrived

    response, arrived = run(main())
    assert response.code == ResponseCode.SUCCESS
    assert seen == [ECHO, ECHO]
    assert arrived == [{"a": "1", "stamped": "yes"}, {"a": "2", "stamped": "yes"}]


class _Later:
    """A deferred check that refuses odd-numbered requests, noting the thread it ran in."""

    threads: list[str] = []

    def __init__(self, n: int) -> None:
        self.n = n

    def decide(self):
        import threading

        _Later.threads.append(threading.current_thread().name)
        return (ResponseCode.NO_PERMISSION, f"late {self.n}") if self.n % 2 else None


def test_deferred_checks_run_off_the_loop_and_keep_the_order_of_a_read(run):
    handled: list[str] = []

    async def grouped(requests, connection):
        handled.extend(r.ext_fields["n"] for r in requests)
        return [await echo(r, connection) for r in requests]

    async def single(request, connection):
        handled.append(request.ext_fields["n"])
        return await echo(request, connection)

    def guard(request, connection):
        n = int(request.ext_fields["n"])
        return _Later(n) if n % 3 else None  # every third request decided at once

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(GROUPED, single, group_handler=grouped)
            server.set_request_guard(guard)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
            requests = [RemotingCommand.request(GROUPED, {"n": str(n)}, b"b") for n in range(9)]
            writer.write(b"".join(r.encode() for r in requests))
            await writer.drain()
            responses = {}
            for _ in requests:
                response = await read_command(reader)
                responses[response.opaque] = response
            single_request = RemotingCommand.request(GROUPED, {"n": "7"}, b"b")
            writer.write(single_request.encode())
            await writer.drain()
            lone = await read_command(reader)
            writer.close()
            return requests, responses, lone

    requests, responses, lone = run(main())
    for n, request in enumerate(requests):
        response = responses[request.opaque]
        if n % 3 and n % 2:
            assert (response.code, response.remark) == (ResponseCode.NO_PERMISSION, f"late {n}")
        else:
            assert response.code == ResponseCode.SUCCESS
    assert handled == ["0", "2", "3", "4", "6", "8"]  # passed ones, in the order they came
    assert (lone.code, lone.remark) == (ResponseCode.NO_PERMISSION, "late 7")
    assert _Later.threads and all(t.startswith("tidemq-request-guard") for t in _Later.threads)

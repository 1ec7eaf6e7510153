"""Back-pressure: bounded requests in flight per connection, bounded write buffers both ways."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
from remoting_helpers import echo, wait_until

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting import Connection, RemotingClient, RemotingServer, RemotingTimeout

ECHO = RequestCode.SEND_MESSAGE_V2
MIB = 1024 * 1024


def address(server: RemotingServer) -> str:
    return f"127.0.0.1:{server.bound_ports[0]}"


def test_requests_in_flight_per_connection_are_bounded_and_all_get_served(run):
    async def main():
        running = peak = 0
        release = asyncio.Event()

        async def counted(request: RemotingCommand, connection: Connection) -> RemotingCommand:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await release.wait()
            running -= 1
            return await echo(request, connection)

        async with RemotingServer("127.0.0.1", [0], max_in_flight_per_connection=4) as server:
            server.register(ECHO, counted)
            server.register(RequestCode.HEART_BEAT, echo)
            async with RemotingClient() as greedy, RemotingClient() as other:
                requests = [RemotingCommand.request(ECHO, body=b"%d" % n) for n in range(40)]
                held = [
                    asyncio.ensure_future(greedy.invoke(address(server), r, 10_000))
                    for r in requests
                ]
                await wait_until(lambda: running == 4, what="four handlers running")
                await asyncio.sleep(0.05)  # give a fifth the chance to start, if it could
                peak_while_held = peak
                # Another connection is not held back by the greedy one's limit.
                beat = await other.invoke(
                    address(server), RemotingCommand.request(RequestCode.HEART_BEAT)
                )
                release.set()
                responses = await asyncio.gather(*held)
        return peak_while_held, peak, beat, requests, responses

    peak_while_held, peak, beat, requests, responses = run(main())
    assert peak_while_held == 4
    assert peak == 4
    assert beat.code == ResponseCode.SUCCESS
    assert [r.body for r in responses] == [r.body for r in requests]


def test_peer_that_never_reads_its_responses_is_aborted(run, caplog):
    async def main():
        async def large(request: RemotingCommand, connection: Connection) -> RemotingCommand:
            return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=b"r" * 4 * MIB)

        async with RemotingServer("127.0.0.1", [0], write_buffer_max_bytes=2 * MIB) as server:
            server.register(ECHO, large)
            server.register(RequestCode.HEART_BEAT, echo)
            loop = asyncio.get_running_loop()
            with socket.socket() as sock:
                # A tiny receive window, and we never read: responses pile up at the server.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                await loop.sock_connect(sock, ("127.0.0.1", server.bound_ports[0]))
                await wait_until(lambda: server.connections, what="the server to accept")
                frames = b"".join(RemotingCommand.request(ECHO).encode() for _ in range(6))
                await loop.sock_sendall(sock, frames)
                await wait_until(lambda: not server.connections, what="the abort")
            async with RemotingClient() as client:
                beat = await client.invoke(
                    address(server), RemotingCommand.request(RequestCode.HEART_BEAT)
                )
        return beat

    with caplog.at_level(logging.WARNING, logger="tidemq.remoting"):
        beat = run(main())
    assert beat.code == ResponseCode.SUCCESS  # the server serves others as before
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "not reading" in warning and "write_buffer_max_bytes=2097152" in warning


def test_requests_to_a_peer_that_does_not_read_wait_instead_of_buffering(run):
    async def main():
        accepted: list[asyncio.Transport] = []

        class DeafServer(asyncio.Protocol):
            def connection_made(self, transport):
                self.transport = transport
                accepted.append(transport)

            def data_received(self, data):
                self.transport.pause_reading()  # one read, then never again

        loop = asyncio.get_running_loop()
        deaf = await loop.create_server(DeafServer, "127.0.0.1", 0)
        addr = f"127.0.0.1:{deaf.sockets[0].getsockname()[1]}"
        try:
            async with RemotingClient() as client:
                # Connect first with a generous bound: on a busy machine connecting alone can
                # take longer than the requests' 300 ms, which is not what this test is about.
                await client.get_connection(addr, 10_000)
                requests = [RemotingCommand.request(ECHO, body=b"q" * MIB) for _ in range(40)]
                results = await asyncio.gather(
                    *(client.invoke(addr, r, timeout_ms=300) for r in requests),
                    return_exceptions=True,
                )
        finally:
            deaf.close()
            for transport in accepted:
                transport.abort()
            await deaf.wait_closed()
        return results

    results = run(main())
    assert all(isinstance(r, RemotingTimeout) for r in results)
    not_sent = [r for r in results if "not sent" in str(r)]
    # 40 MiB did not fit in the socket buffers: most requests were never written.
    assert len(not_sent) >= 20
    assert "not reading" in str(not_sent[0])


def test_slow_reader_gets_every_large_response(run):
    async def main():
        async def large(request: RemotingCommand, connection: Connection) -> RemotingCommand:
            return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=b"r" * MIB)

        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, large)
            responses = await asyncio.gather(
                *(
                    client.invoke(address(server), RemotingCommand.request(ECHO), 20_000)
                    for _ in range(24)
                )
            )
            return responses, len(server.connections)

    responses, connections = run(main())
    assert all(r.code == ResponseCode.SUCCESS and len(r.body) == MIB for r in responses)
    assert connections == 1


def test_nonsense_limits_are_rejected_when_configured():
    with pytest.raises(ValueError, match="max_in_flight_per_connection is 0"):
        RemotingServer("127.0.0.1", [0], max_in_flight_per_connection=0)
    with pytest.raises(ValueError, match="idle_timeout_s is 0"):
        RemotingClient(idle_timeout_s=0)
    with pytest.raises(ValueError, match="max_pending is 0"):
        RemotingServer("127.0.0.1", [0]).register(ECHO, echo, max_pending=0)
    with pytest.raises(ValueError, match="ports is empty"):
        RemotingServer("127.0.0.1", [])

"""A peer sending bytes that are not remoting frames loses its own connection, nobody else's."""

from __future__ import annotations

import asyncio
import logging
import struct

import pytest
from remoting_helpers import echo, read_frame

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting import RemotingClient, RemotingClosed, RemotingServer

ECHO = RequestCode.SEND_MESSAGE_V2


def _frame(header_word: int, header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), header_word) + header + body


GARBAGE = {
    "http request": b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n",
    "length 2^31-1": struct.pack(">i", 2**31 - 1) + b"\x00" * 16,
    "negative length": struct.pack(">i", -5) + b"\x00" * 16,
    "length below header word": struct.pack(">i", 2) + b"\x00\x00",
    "header word all ones": struct.pack(">iI", 8, 0xFFFFFFFF) + b"\x00" * 4,
    "header longer than frame": _frame(0x00000100, b"{}"),
    "unknown serialize type": _frame(7 << 24 | 2, b"{}"),
    "header not a json object": _frame(2, b"[]"),
    "json header without code": _frame(12, b'{"opaque":1}'),
    "truncated rocketmq header": _frame(1 << 24 | 3, b"\x00\x0a\x00"),
    "rocketmq remark length past header": _frame(
        1 << 24 | 21, struct.pack(">hBhiii", 10, 3, 409, 1, 0, 1000) + b"\x00" * 4
    ),
}


@pytest.mark.parametrize("garbage", GARBAGE.values(), ids=GARBAGE.keys())
def test_malformed_frame_closes_only_that_connection(run, caplog, garbage):
    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, echo)
            addr = f"127.0.0.1:{server.bound_ports[0]}"
            before = await client.invoke(addr, RemotingCommand.request(ECHO))

            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
            writer.write(garbage)
            answer = await read_frame(reader)  # the server closes without answering
            writer.close()

            after = await client.invoke(addr, RemotingCommand.request(ECHO))
            return before, answer, after, len(server.connections), client.connections

    with caplog.at_level(logging.WARNING, logger="tidemq.remoting"):
        before, answer, after, open_connections, client_connections = run(main())
    assert answer is None
    assert before.code == after.code == ResponseCode.SUCCESS
    assert len(client_connections) == 1  # the well-behaved client kept its connection
    assert open_connections == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "malformed frame" in warnings[0].getMessage()
    assert "127.0.0.1:" in warnings[0].getMessage()  # names the peer


def test_frame_over_frame_size_max_closes_the_connection_naming_the_limit(run, caplog):
    async def main():
        async with RemotingServer("127.0.0.1", [0], frame_size_max=1024) as server:
            server.register(ECHO, echo)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
            small = RemotingCommand.request(ECHO, body=b"x" * 100)
            large = RemotingCommand.request(ECHO, body=b"x" * 2000)
            writer.write(small.encode())
            first = await read_frame(reader)
            writer.write(large.encode())
            second = await read_frame(reader)
            writer.close()
            return first, second

    with caplog.at_level(logging.WARNING, logger="tidemq.remoting"):
        first, second = run(main())
    assert first is not None  # frames within the limit are served
    assert second is None
    assert "frame_size_max=1024" in caplog.text


def test_garbage_from_a_server_fails_the_clients_waiting_request(run):
    async def main():
        class GarbageServer(asyncio.Protocol):
            def connection_made(self, transport):
                self.transport = transport

            def data_received(self, data):
                self.transport.write(b"\xff" * 64)

        loop = asyncio.get_running_loop()
        server = await loop.create_server(GarbageServer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with RemotingClient() as client:
            addr = f"127.0.0.1:{port}"
            with pytest.raises(RemotingClosed) as failure:
                await client.invoke(addr, RemotingCommand.request(ECHO), timeout_ms=10_000)
            connections = client.connections
        server.close()
        await server.wait_closed()
        return failure.value, connections

    error, connections = run(main())
    assert isinstance(error, RemotingClosed)
    assert error.retriable
    assert "malformed frame" in str(error)
    assert connections == {}

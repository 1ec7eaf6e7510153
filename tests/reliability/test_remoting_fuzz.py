"""Hostile peers against a live RemotingServer: garbage bytes, mutated frames, abrupt resets.

Whatever a peer sends, the server answers only well-formed frames, closes that connection
when the bytes are not remoting frames, keeps serving everyone else, and leaks neither
connections nor handler tasks.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.protocol.codes import FLAG_ONEWAY, RequestCode, ResponseCode, SerializeType
from tidemq.protocol.command import RemotingCommand, decode_command
from tidemq.remoting import Connection, RemotingClient, RemotingClosed, RemotingServer
from tidemq.remoting.loop import new_event_loop

pytestmark = pytest.mark.reliability

ECHO = RequestCode.SEND_MESSAGE_V2
SOCKET_TIMEOUT_S = 10.0  # only a hung server trips it


async def _echo(request: RemotingCommand, connection: Connection) -> RemotingCommand:
    return RemotingCommand.response_to(
        request, ResponseCode.SUCCESS, ext_fields=request.ext_fields, body=request.body
    )


async def _raise(request: RemotingCommand, connection: Connection) -> RemotingCommand:
    raise RuntimeError("handler failure on purpose")


class ServerThread:
    """A RemotingServer on its own uvloop in a thread; records what its loop complains of."""

    def __init__(self) -> None:
        self.problems: list[dict[str, Any]] = []
        self.loop = new_event_loop()
        self.loop.set_exception_handler(lambda loop, context: self.problems.append(context))
        self.server = RemotingServer("127.0.0.1", [0], frame_size_max=64 * 1024)
        self.server.register(ECHO, _echo)
        self.server.register(RequestCode.HEART_BEAT, _raise)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        self.call(self.server.start())
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.call(self.server.stop(grace_s=2))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(SOCKET_TIMEOUT_S)
        self.loop.close()

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(SOCKET_TIMEOUT_S)

    @property
    def port(self) -> int:
        return self.server.bound_ports[0]

    def state(self) -> tuple[int, int]:
        async def read() -> tuple[int, int]:
            return len(self.server.connections), self.server.handlers_running

        return self.call(read())


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread() as running:
        yield running
    assert not running.problems, running.problems


def _exchange(port: int, data: bytes) -> list[RemotingCommand]:
    """Send ``data``, half-close, and decode every frame the server sends until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us mid-send: garbage was seen early
        received = bytearray()
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    commands = []
    position = 0
    while position < len(received):
        length = struct.unpack_from(">i", received, position)[0]
        frame = bytes(received[position + 4 : position + 4 + length])
        assert len(frame) == length, "the server sent a truncated frame"
        commands.append(decode_command(frame))
        position += 4 + length
    return commands


def _assert_good_client_is_served(port: int) -> None:
    request = RemotingCommand.request(ECHO, {"probe": "1"}, body=b"still alive")
    [response] = _exchange(port, request.encode())
    assert response.opaque == request.opaque and response.body == b"still alive"


# Opaques are drawn, not taken from the process counter, so examples replay exactly.
commands = st.builds(
    RemotingCommand,
    code=st.sampled_from([ECHO, RequestCode.HEART_BEAT, 999]),
    opaque=st.integers(0, 2**31 - 1),
    flag=st.sampled_from([0, FLAG_ONEWAY]),
    ext_fields=st.none() | st.dictionaries(st.text(max_size=8), st.text(max_size=16), max_size=3),
    body=st.none() | st.binary(max_size=256),
    serialize_type=st.sampled_from(list(SerializeType)),
)


@st.composite
def hostile_bytes(draw: st.DrawFn) -> bytes:
    frames = b"".join(c.encode() for c in draw(st.lists(commands, min_size=1, max_size=4)))
    kind = draw(st.sampled_from(["garbage", "flipped", "truncated", "appended", "valid"]))
    if kind == "garbage":
        return draw(st.binary(min_size=1, max_size=512))
    data = bytearray(frames)
    if kind == "flipped":
        for _ in range(draw(st.integers(1, 4))):
            index = draw(st.integers(0, len(data) - 1))
            data[index] ^= 1 << draw(st.integers(0, 7))
    elif kind == "truncated":
        del data[draw(st.integers(0, len(data) - 1)) :]
    elif kind == "appended":
        data += draw(st.binary(min_size=1, max_size=64))
    return bytes(data)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=hostile_bytes())
def test_any_bytes_get_only_well_formed_answers_and_others_stay_served(server, data):
    answers = _exchange(server.port, data)
    for answer in answers:
        assert answer.is_response
        assert answer.code in {
            ResponseCode.SUCCESS,
            ResponseCode.SYSTEM_ERROR,
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        }
    _assert_good_client_is_served(server.port)


def test_fuzzing_left_no_connections_or_handlers_behind(server):
    _assert_good_client_is_served(server.port)
    # The probe's connection closes asynchronously; poll a bounded number of times.
    for _ in range(500):
        if server.state() == (0, 0):
            break
        threading.Event().wait(0.01)
    assert server.state() == (0, 0)


def test_clients_resetting_mid_request_do_not_disturb_the_server():
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)

    async def main() -> tuple[int, int, list[Any]]:
        async def slow(request: RemotingCommand, connection: Connection) -> RemotingCommand:
            await asyncio.sleep(rng.random() / 50)
            return await _echo(request, connection)

        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(ECHO, slow)
            addr = f"127.0.0.1:{server.bound_ports[0]}"
            outcomes: list[Any] = []
            for _ in range(30):
                async with RemotingClient() as client:
                    waiting = [
                        asyncio.ensure_future(
                            client.invoke(addr, RemotingCommand.request(ECHO), 10_000)
                        )
                        for _ in range(rng.randint(1, 20))
                    ]
                    await asyncio.sleep(rng.random() / 100)
                    for connection in client.connections.values():
                        connection.abort("test resets it")
                    outcomes += await asyncio.gather(*waiting, return_exceptions=True)
            async with RemotingClient() as client:
                final = await client.invoke(addr, RemotingCommand.request(ECHO, body=b"ok"))
            for _ in range(500):  # bounded: handlers of reset peers finish within ~20 ms
                if not server.connections and not server.handlers_running:
                    break
                await asyncio.sleep(0.01)
            assert final.body == b"ok"
            return len(server.connections), server.handlers_running, outcomes

    problems: list[dict[str, Any]] = []

    async def guarded() -> tuple[int, int, list[Any]]:
        asyncio.get_running_loop().set_exception_handler(lambda _, c: problems.append(c))
        async with asyncio.timeout(60):
            return await main()

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        connections, running, outcomes = runner.run(guarded())
    assert not problems, problems
    assert (connections, running) == (0, 0)
    for outcome in outcomes:
        assert isinstance(outcome, RemotingClosed) or outcome.code == ResponseCode.SUCCESS

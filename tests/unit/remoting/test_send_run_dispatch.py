"""A read's run of SEND_MESSAGE_V2 requests (protocol/send_run.py) is served as its commands
would be: the same groups to the group handler, in order, the same answers written at the
same points, the same refusals, the same bookkeeping.

Each read is handed to two connections, one whose dispatcher takes runs and one whose
dispatcher does not (every request a command, as before runs), and what each does is
compared: the group handler's calls, every write to the transport, the requests left in
flight.
"""

from __future__ import annotations

import asyncio
import struct

import orjson
import pytest

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.send_run import RUN_FRAMES_MIN, SendRun
from tidemq.remoting.connection import Connection
from tidemq.remoting.dispatch import EncodedAnswers, LaterResponse, RequestDispatcher

SEND = int(RequestCode.SEND_MESSAGE_V2)


class _CommandsOnly(RequestDispatcher):
    """The dispatcher as it was before runs: every request a command."""

    takes_send_runs = property(lambda self: False, lambda self, value: None)


class _RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.reading: list[bool] = []  # each pause (False) and resume (True) of reading

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 45678) if name in ("peername", "sockname") else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def write(self, data) -> None:  # type: ignore[no-untyped-def]
        self.writes.append(bytes(data))

    def writelines(self, parts) -> None:  # type: ignore[no-untyped-def]
        self.writes.append(b"".join(parts))

    def pause_reading(self) -> None:
        self.reading.append(False)

    def resume_reading(self) -> None:
        self.reading.append(True)

    def abort(self) -> None:
        pass


def send_frame(opaque: int, body: bytes) -> bytes:
    header = orjson.dumps({"code": SEND, "extFields": {"n": str(opaque)}, "flag": 0,
                           "language": "PYTHON", "opaque": opaque, "version": 409},
                          option=orjson.OPT_SORT_KEYS)
    return struct.pack(">iI", 4 + len(header) + len(body), len(header)) + header + body


def answer(request: RemotingCommand) -> RemotingCommand:
    return RemotingCommand.response_to(request, ResponseCode.SUCCESS, None,
                                       {"n": request.ext_fields["n"]})


def serve_reads(dispatcher: RequestDispatcher, reads: list[bytes], how: str, *,
                max_pending: int = 10_000, max_in_flight: int = 4096,
                guard=None) -> dict:
    """Hand ``reads`` to a connection of ``dispatcher`` whose SEND route answers by ``how``;
    what the group handler was given and what was written."""
    calls: list[tuple[str, list[int]]] = []
    later: list[tuple[LaterResponse, RemotingCommand]] = []

    def serve_one(request, connection):
        calls.append(("one", [request.opaque]))
        return answer(request)

    def serve_group(requests, connection):
        # A run's opaques read from its columns: its commands are made only when needed.
        opaques = (list(requests.opaques) if type(requests) is SendRun
                   else [request.opaque for request in requests])
        calls.append((type(requests).__name__, opaques))
        if how == "raise":
            raise RuntimeError("group handler broken on purpose")
        if how == "later":  # answered once every read is in
            answers = [LaterResponse() for _ in requests]
            later.extend(zip(answers, requests, strict=True))
            return answers
        if how == "encoded":
            return EncodedAnswers(b"".join(
                RemotingCommand(ResponseCode.SUCCESS, opaque=opaque, flag=1).encode()
                for opaque in opaques), ResponseCode.SUCCESS)
        return [answer(request) for request in requests]

    async def scenario():
        dispatcher.register(SEND, serve_one, group_handler=serve_group, immediate=True,
                            max_pending=max_pending)
        dispatcher.set_guard(guard)
        connection = Connection(dispatcher, max_in_flight=max_in_flight)
        transport = _RecordingTransport()
        connection.connection_made(transport)
        for data in reads:
            connection.data_received(data)
            for _ in range(5):  # the cork's flush at the iteration's end
                await asyncio.sleep(0)
        in_flight = connection.in_flight
        pending = dispatcher._routes[SEND].pending  # the route's own count of what it serves
        for response, request in later:
            response.resolve(answer(request))
        for _ in range(5):
            await asyncio.sleep(0)
        pending_at_end = dispatcher._routes[SEND].pending
        connection.abort("done")
        connection.connection_lost(None)
        return {"calls": calls, "writes": transport.writes, "in_flight": in_flight,
                "pending": (pending, pending_at_end), "reading": transport.reading}

    return asyncio.run(scenario())


def both_ways(reads: list[bytes], how: str, **options) -> tuple[dict, dict]:
    """``serve_reads`` by a dispatcher that takes runs (with the kinds of what its group
    handler was given) and by one that does not."""
    by_runs = serve_reads(RequestDispatcher(), reads, how, **options)
    by_commands = serve_reads(_CommandsOnly(), reads, how, **options)

    def opaques_only(result: dict) -> dict:
        return {**result, "calls": [opaques for _, opaques in result["calls"]]}

    kinds = {kind for kind, _ in by_runs["calls"]}
    return {**opaques_only(by_runs), "kinds": kinds}, opaques_only(by_commands)


def read_of(count: int, body_bytes: int = 10, start: int = 0) -> bytes:
    return b"".join(send_frame(start + n, bytes([n % 251]) * (body_bytes + n % 3))
                    for n in range(count))


@pytest.mark.parametrize("how", ["encoded", "list", "raise", "later"])
@pytest.mark.parametrize("count", [1, 2, 7, 8, 31, 32, 33, 64, 65, 100])
def test_a_run_is_served_as_its_commands_would_be(count, how, caplog):
    runs, commands = both_ways([read_of(count), read_of(count, start=1000)], how)
    assert runs == {**commands, "kinds": runs["kinds"]}
    if how != "later":
        assert runs["in_flight"] == 0
        assert runs["pending"] == (0, 0)
    # A read long enough for a run reaches the group handler as columns, in every group of
    # more than one request.
    assert runs["kinds"] == ({"one"} if count == 1 else {"SendRun"} if count >= RUN_FRAMES_MIN
                             else {"list"})


@pytest.mark.parametrize("body_bytes", [3000, 16 * 1024, 40 * 1024])
def test_a_run_of_large_bodies_is_cut_into_the_same_groups(body_bytes):
    runs, commands = both_ways([read_of(40, body_bytes)], "list")
    assert runs["calls"] == commands["calls"]
    assert len(runs["calls"]) > 1
    assert runs["writes"] == commands["writes"]


def test_a_run_past_the_route_s_max_pending_is_refused_as_commands_are():
    runs, commands = both_ways([read_of(20)], "list", max_pending=8)
    assert runs["calls"] == commands["calls"]
    assert runs["writes"] == commands["writes"]
    assert any(b"REJECTREQUEST" in write for write in runs["writes"])


@pytest.mark.parametrize("max_in_flight", [8, 20, 21])
def test_a_run_at_or_past_the_connection_s_in_flight_limit_waits_as_commands_do(
        max_in_flight):
    runs, commands = both_ways([read_of(20)], "later", max_in_flight=max_in_flight)
    assert runs == {**commands, "kinds": runs["kinds"]}
    if max_in_flight == 20:  # the run fills the connection: reading paused
        assert runs["reading"][:1] == [False]
        assert runs["kinds"] == {"SendRun"}


def test_with_a_guard_every_request_is_checked_as_a_command():
    checked: list[int] = []

    def guard(request, connection):
        checked.append(request.opaque)
        return (ResponseCode.NO_PERMISSION, "no") if request.opaque % 5 == 0 else None

    runs, commands = both_ways([read_of(12)], "list", guard=guard)
    assert checked == list(range(12)) * 2
    assert runs["calls"] == commands["calls"]
    assert runs["writes"] == commands["writes"]

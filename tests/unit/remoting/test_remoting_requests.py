"""Request/response behaviour of RemotingServer and RemotingClient over real loopback sockets."""

from __future__ import annotations

import asyncio

import pytest
from remoting_helpers import echo, read_command, wait_until

from tidemq.errors import LocalProtocolError
from tidemq.protocol.codes import FLAG_RESPONSE, RequestCode, ResponseCode, SerializeType
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting import (
    Connection,
    RemotingClient,
    RemotingClosed,
    RemotingServer,
    RemotingTimeout,
)
from tidemq.remoting.dispatch import LaterResponse

ECHO = RequestCode.SEND_MESSAGE_V2
UNREGISTERED = 999


def address(server: RemotingServer, index: int = 0) -> str:
    return f"127.0.0.1:{server.bound_ports[index]}"


def test_concurrent_requests_are_matched_to_responses_by_opaque_out_of_order(run):
    count = 200
    order: list[int] = []

    async def main():
        turns = [asyncio.Event() for _ in range(count)]

        async def reverse_echo(request: RemotingCommand, connection: Connection):
            # Answer strictly last-first: request n waits for its turn, then passes it on.
            number = int(request.ext_fields["n"])
            await turns[number].wait()
            order.append(number)
            if number:
                asyncio.get_running_loop().call_soon(turns[number - 1].set)
            return await echo(request, connection)

        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, reverse_echo)
            requests = [
                RemotingCommand.request(ECHO, {"n": str(n)}, body=f"body-{n}".encode())
                for n in range(count)
            ]
            waiting = asyncio.gather(
                *(client.invoke(address(server), request, 20_000) for request in requests)
            )
            await wait_until(lambda: server.handlers_running == count, what="all requests")
            turns[-1].set()
            responses = await waiting
            assert len(client.connections) == 1
        return requests, responses

    requests, responses = run(main())
    assert order == list(reversed(range(count)))
    for request, response in zip(requests, responses, strict=True):
        assert response.code == ResponseCode.SUCCESS
        assert response.opaque == request.opaque
        assert response.is_response
        assert response.body == request.body
        assert response.ext_fields == request.ext_fields


def test_both_serialize_types_are_answered_in_the_type_of_the_request(run):
    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(ECHO, echo)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
            answers = {}
            for serialize_type in SerializeType:
                request = RemotingCommand.request(
                    ECHO, {"k": "v"}, body=b"payload", serialize_type=serialize_type
                )
                writer.write(request.encode())
                answers[serialize_type] = await read_command(reader)
            writer.close()
            await writer.wait_closed()
        return answers

    answers = run(main())
    for serialize_type, response in answers.items():
        assert response.serialize_type == serialize_type
        assert response.code == ResponseCode.SUCCESS
        assert response.ext_fields == {"k": "v"}
        assert response.body == b"payload"


def test_oneway_request_is_handled_and_gets_no_response(run):
    received: list[RemotingCommand] = []

    async def record(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        received.append(request)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)  # must be dropped

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(RequestCode.END_TRANSACTION, record)
            server.register(ECHO, echo)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
            oneway = RemotingCommand.request(RequestCode.END_TRANSACTION, {"x": "1"}, oneway=True)
            two_way = RemotingCommand.request(ECHO)
            writer.write(oneway.encode() + two_way.encode())
            first_answer = await read_command(reader)
            writer.close()
            await writer.wait_closed()
        return oneway, two_way, first_answer

    oneway, two_way, first_answer = run(main())
    assert [r.opaque for r in received] == [oneway.opaque]
    assert received[0].is_oneway
    assert first_answer.opaque == two_way.opaque  # nothing came back for the oneway request


def test_invoke_oneway_reaches_the_handler(run):
    async def main():
        got = asyncio.Event()

        async def record(request: RemotingCommand, connection: Connection) -> None:
            got.set()

        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(RequestCode.END_TRANSACTION, record)
            command = RemotingCommand.request(RequestCode.END_TRANSACTION)
            await client.invoke_oneway(address(server), command)
            await asyncio.wait_for(got.wait(), 10)
            return command

    assert run(main()).is_oneway


def test_unknown_code_is_answered_request_code_not_supported(run):
    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, echo)
            return await client.invoke(address(server), RemotingCommand.request(UNREGISTERED))

    response = run(main())
    assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED == 3
    assert response.remark == " request type 999 not supported"


def test_default_handler_serves_codes_without_their_own(run):
    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register_default(echo)
            return await client.invoke(address(server), RemotingCommand.request(UNREGISTERED))

    assert run(main()).code == ResponseCode.SUCCESS


def test_handler_exception_is_answered_system_error_with_a_remark(run, caplog):
    async def broken(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        raise KeyError("topic TopicA has no route")

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, broken)
            first = await client.invoke(address(server), RemotingCommand.request(ECHO))
            server.register(ECHO, echo)
            second = await client.invoke(address(server), RemotingCommand.request(ECHO))
            return first, second

    first, second = run(main())
    assert first.code == ResponseCode.SYSTEM_ERROR == 1
    assert "KeyError" in first.remark and "topic TopicA has no route" in first.remark
    assert "test_remoting_requests.py" in first.remark  # where it was raised
    assert second.code == ResponseCode.SUCCESS  # the connection and server carry on
    logged = [r for r in caplog.records if r.levelname == "ERROR" and r.exc_info]
    assert logged and "SEND_MESSAGE_V2" in logged[0].getMessage()


def test_full_handler_queue_is_answered_system_busy(run):
    async def main():
        release = asyncio.Event()
        started = 0

        async def blocked(request: RemotingCommand, connection: Connection) -> RemotingCommand:
            nonlocal started
            started += 1
            await release.wait()
            return await echo(request, connection)

        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, blocked, max_pending=2)
            server.register(RequestCode.HEART_BEAT, echo)
            held = [
                asyncio.ensure_future(client.invoke(address(server), RemotingCommand.request(ECHO)))
                for _ in range(2)
            ]
            while started < 2:
                await asyncio.sleep(0.01)
            busy = await client.invoke(address(server), RemotingCommand.request(ECHO))
            other_code = await client.invoke(
                address(server), RemotingCommand.request(RequestCode.HEART_BEAT)
            )
            release.set()
            finished = await asyncio.gather(*held)
            after = await client.invoke(address(server), RemotingCommand.request(ECHO))
            return busy, other_code, finished, after

    busy, other_code, finished, after = run(main())
    assert busy.code == ResponseCode.SYSTEM_BUSY == 2
    assert busy.remark.startswith("[REJECTREQUEST]system busy")
    assert "SEND_MESSAGE_V2" in busy.remark and "max_pending" in busy.remark and "2" in busy.remark
    assert other_code.code == ResponseCode.SUCCESS  # the limit is per handler
    assert [r.code for r in finished] == [ResponseCode.SUCCESS] * 2
    assert after.code == ResponseCode.SUCCESS


def test_handler_may_answer_later_with_send_response(run):
    async def main():
        parked: list[tuple[RemotingCommand, Connection]] = []

        async def long_poll(request: RemotingCommand, connection: Connection) -> None:
            parked.append((request, connection))  # answered later, like a suspended pull
            return None

        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(RequestCode.PULL_MESSAGE, long_poll)
            waiting = asyncio.ensure_future(
                client.invoke(address(server), RemotingCommand.request(RequestCode.PULL_MESSAGE))
            )
            while not parked:
                await asyncio.sleep(0.01)
            assert server.handlers_running == 0  # the handler returned; no task is held
            request, connection = parked[0]
            connection.send_response(
                RemotingCommand.response_to(request, ResponseCode.PULL_NOT_FOUND, remark="none")
            )
            return await waiting

    response = run(main())
    assert response.code == ResponseCode.PULL_NOT_FOUND
    assert response.remark == "none"


def test_plain_response_gets_opaque_flag_and_serialize_type_of_the_request(run):
    async def plain(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        return RemotingCommand(ResponseCode.SUCCESS, remark="plain")

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(ECHO, plain)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
            request = RemotingCommand.request(ECHO, serialize_type=SerializeType.ROCKETMQ)
            writer.write(request.encode())
            response = await read_command(reader)
            writer.close()
            await writer.wait_closed()
            return request, response

    request, response = run(main())
    assert response.opaque == request.opaque
    assert response.flag & FLAG_RESPONSE
    assert response.serialize_type == SerializeType.ROCKETMQ
    assert response.remark == "plain"


def test_unencodable_response_is_replaced_by_system_error(run):
    async def too_big_code(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        return RemotingCommand(70000)  # cannot be written in a ROCKETMQ (int16) header

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, too_big_code)
            request = RemotingCommand.request(ECHO, serialize_type=SerializeType.ROCKETMQ)
            return await client.invoke(address(server), request)

    response = run(main())
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "cannot be encoded" in response.remark


def test_server_listens_on_every_port_given(run):
    async def main():
        async with RemotingServer("127.0.0.1", [0, 0]) as server, RemotingClient() as client:
            server.register(ECHO, echo)
            ports = server.bound_ports
            responses = [
                await client.invoke(f"127.0.0.1:{port}", RemotingCommand.request(ECHO))
                for port in ports
            ]
            return ports, responses

    ports, responses = run(main())
    assert len(set(ports)) == 2
    assert [r.code for r in responses] == [ResponseCode.SUCCESS] * 2


def test_request_rejects_commands_that_are_not_two_way_requests(run):
    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            connection = await client.get_connection(address(server))
            with pytest.raises(LocalProtocolError, match="not a two-way request"):
                await connection.request(RemotingCommand.request(ECHO, oneway=True))
            with pytest.raises(LocalProtocolError, match="not a two-way request"):
                response = RemotingCommand.response_to(RemotingCommand.request(ECHO), 0)
                await connection.request(response)

    run(main())


@pytest.mark.parametrize("handler_delay_s", [0, 0.05])
def test_peer_that_half_closes_after_sending_still_gets_its_responses(run, handler_delay_s):
    async def delayed_echo(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        await asyncio.sleep(handler_delay_s)
        return await echo(request, connection)

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(ECHO, delayed_echo)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
            requests = [RemotingCommand.request(ECHO, body=b"%d" % n) for n in range(3)]
            writer.write(b"".join(r.encode() for r in requests))
            writer.write_eof()  # like `nc -N`: send, then half-close
            answers = [await read_command(reader) for _ in requests]
            at_end = await read_command(reader)  # then the server closes
            writer.close()
            await writer.wait_closed()
            return requests, answers, at_end

    requests, answers, at_end = run(main())
    assert [a.opaque for a in answers] == [r.opaque for r in requests]
    assert at_end is None


def test_immediate_handler_answers_in_place_and_its_failure_is_a_system_error(run):
    """An immediate handler (a plain function) is called as the request is read, with no
    task of its own: its answer, None (answered later through send_response) and an
    exception each reach the peer as from an ordinary handler."""
    held: list[tuple[RemotingCommand, Connection]] = []
    tasks_seen: list[asyncio.Task | None] = []

    def answer_now(request: RemotingCommand, connection: Connection) -> RemotingCommand | None:
        tasks_seen.append(asyncio.current_task())  # None: called from the read itself
        kind = request.ext_fields["kind"]
        if kind == "fail":
            raise ValueError("no such thing")
        if kind == "later":
            held.append((request, connection))
            return None
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, remark=kind,
                                           body=request.body)

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, answer_now, immediate=True)
            target = address(server)
            ok = await client.invoke(
                target, RemotingCommand.request(ECHO, {"kind": "now"}, body=b"b"), 5000)
            failed = await client.invoke(
                target, RemotingCommand.request(ECHO, {"kind": "fail"}), 5000)
            later = asyncio.ensure_future(client.invoke(
                target, RemotingCommand.request(ECHO, {"kind": "later"}), 5000))
            await wait_until(lambda: len(held) == 1, what="the held request")
            request, connection = held[0]
            connection.send_response(RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                                                 remark="answered later"))
            return ok, failed, await later

    ok, failed, later = run(main())
    assert (ok.code, ok.remark, ok.body) == (ResponseCode.SUCCESS, "now", b"b")
    assert failed.code == ResponseCode.SYSTEM_ERROR
    assert "no such thing" in failed.remark
    assert later.remark == "answered later"
    assert tasks_seen == [None, None, None]


def test_immediate_handler_may_leave_a_wait_and_share_its_code_with_a_group_handler(run):
    """An immediate handler that must wait returns a coroutine (run as the request's task)
    or a LaterResponse (written when resolved): both reach the peer, and the server counts
    the request as running until then. With a group handler on the same code, a request
    that came alone is served in place, requests of one read by the group handler, called
    in place too: its list of responses, or a coroutine of it, reaches the peer."""
    tasks_seen: list[asyncio.Task | None] = []
    later_answers: list[LaterResponse] = []
    gate = asyncio.Event()
    grouped: list[list[str]] = []

    async def finish(request: RemotingCommand) -> RemotingCommand:
        await gate.wait()
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, remark="awaited")

    def answer_now(request: RemotingCommand, connection: Connection):
        tasks_seen.append(asyncio.current_task())
        kind = request.ext_fields["kind"]
        if kind == "await":
            return finish(request)
        if kind == "later":
            later = LaterResponse()
            later_answers.append(later)
            return later
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, remark=kind)

    def group(requests: list[RemotingCommand], connection: Connection):
        tasks_seen.append(asyncio.current_task())
        kinds = [request.ext_fields["kind"] for request in requests]
        grouped.append(kinds)
        answers = [RemotingCommand.response_to(request, ResponseCode.SUCCESS, remark="group")
                   for request in requests]
        if kinds[0] != "wait":
            return answers

        async def after_the_gate():
            await gate.wait()
            return answers

        return after_the_gate()

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, answer_now, immediate=True, group_handler=group)
            target = address(server)
            awaited = asyncio.ensure_future(client.invoke(
                target, RemotingCommand.request(ECHO, {"kind": "await"}), 5000))
            await wait_until(lambda: len(tasks_seen) == 1, what="the first request")
            later = asyncio.ensure_future(client.invoke(
                target, RemotingCommand.request(ECHO, {"kind": "later"}), 5000))
            # The coroutine runs as a task; the LaterResponse needs none.
            await wait_until(lambda: len(later_answers) == 1 and server.handlers_running == 1,
                             what="both requests waiting")
            gate.set()
            first = await awaited
            later_answers[0].resolve(RemotingCommand(ResponseCode.SUCCESS, remark="resolved"))
            second = await later
            # Two requests in one write reach the server in one read: the group handler,
            # which answers in place or leaves a coroutine (already through its gate here).
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
            answers = []
            for kinds in (("a", "b"), ("wait", "c")):
                pair = [RemotingCommand.request(ECHO, {"kind": k}) for k in kinds]
                writer.write(b"".join(r.encode() for r in pair))
                answers += [await read_command(reader), await read_command(reader)]
            writer.close()
            await writer.wait_closed()
            return first, second, answers

    first, second, answers = run(main())
    assert (first.code, first.remark) == (ResponseCode.SUCCESS, "awaited")
    assert (second.code, second.remark) == (ResponseCode.SUCCESS, "resolved")
    assert tasks_seen == [None, None, None, None]  # all called in place, from the read
    assert grouped == [["a", "b"], ["wait", "c"]]
    assert [a.remark for a in answers] == ["group"] * 4


class _Receiver:
    """A ``request_nowait`` receiver that records what it was given and on which call."""

    def __init__(self) -> None:
        self.outcomes: list[object] = []

    def done(self) -> bool:
        return bool(self.outcomes)

    def set_result(self, response: RemotingCommand) -> None:
        self.outcomes.append(response)

    def set_exception(self, error: BaseException) -> None:
        self.outcomes.append(error)


def _echo_unless_held(held: asyncio.Event):
    """An echo handler that first waits for ``held`` when the request carries ``hold``."""

    async def hold_then_echo(request: RemotingCommand, connection: Connection):
        if request.ext_fields.get("hold"):
            await held.wait()
        return await echo(request, connection)

    return hold_then_echo


def test_request_nowait_hands_the_answer_timeout_or_close_to_its_receiver_once(run):
    async def main():
        held = asyncio.Event()
        hold_then_echo = _echo_unless_held(held)

        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, hold_then_echo)
            connection = await client.get_connection(address(server))
            assert client.open_connection(address(server)) is connection

            answered = _Receiver()
            request = RemotingCommand.request(ECHO, {"n": "1"}, body=b"x")
            assert connection.request_nowait(request, 5_000, answered)
            await wait_until(answered.done, what="the answer")

            timed_out = _Receiver()
            assert connection.request_nowait(
                RemotingCommand.request(ECHO, {"hold": "1"}), 50, timed_out)
            await wait_until(timed_out.done, what="the timeout")

            cut_off = _Receiver()
            assert connection.request_nowait(
                RemotingCommand.request(ECHO, {"hold": "1"}), 20_000, cut_off)
            connection.close("test closes it")
            await wait_until(cut_off.done, what="the close")
            refused = _Receiver()
            sent = connection.request_nowait(RemotingCommand.request(ECHO), 5_000, refused)
            held.set()  # the held requests' late answers go nowhere
            assert client.open_connection(address(server)) is None
            return request, answered, timed_out, cut_off, sent, refused

    request, answered, timed_out, cut_off, sent, refused = run(main())
    [response] = answered.outcomes
    assert response.opaque == request.opaque and response.body == b"x"
    [timeout] = timed_out.outcomes
    assert isinstance(timeout, RemotingTimeout) and "50 ms" in str(timeout)
    [closed] = cut_off.outcomes
    assert isinstance(closed, RemotingClosed)
    assert not sent and not refused.outcomes


def test_invoke_written_answers_as_invoke_does_with_the_request_written_at_the_call(run):
    async def main():
        held = asyncio.Event()
        hold_then_echo = _echo_unless_held(held)

        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, hold_then_echo)
            # No connection yet: invoke's way (connect, then the round trip).
            first = RemotingCommand.request(ECHO, {"n": "0"}, body=b"first")
            connecting = client.invoke_written(address(server), first, 5_000)
            assert asyncio.iscoroutine(connecting)
            first_answer = await connecting
            # An open connection: written before the call returns, the awaitable is the
            # answer's own future.
            connection = client.open_connection(address(server))
            assert connection is not None
            request = RemotingCommand.request(ECHO, {"n": "1"}, body=b"x")
            answer = client.invoke_written(address(server), request, 5_000)
            assert isinstance(answer, asyncio.Future) and not answer.done()
            assert connection.pending_requests == 1
            response = await answer
            with pytest.raises(RemotingTimeout, match="50 ms"):
                await client.invoke_written(
                    address(server), RemotingCommand.request(ECHO, {"hold": "1"}), 50)
            # A cancelled wait: its late answer is dropped, the connection serves on.
            cancelled = client.invoke_written(
                address(server), RemotingCommand.request(ECHO, {"hold": "1"}), 20_000)
            cancelled.cancel()
            held.set()
            await wait_until(lambda: connection.pending_requests == 0, what="the late answer")
            after = await client.invoke_written(
                address(server), RemotingCommand.request(ECHO, {"n": "2"}))
            return first, first_answer, request, response, after

    first, first_answer, request, response, after = run(main())
    assert first_answer.opaque == first.opaque and first_answer.body == b"first"
    assert response.opaque == request.opaque and response.body == b"x"
    assert after.code == ResponseCode.SUCCESS


@pytest.mark.parametrize(("body_bytes", "writes_expected"), [(70 * 1024, 3), (1024, 1)])
def test_a_large_request_leaves_at_once_while_small_ones_share_a_write(
    run, monkeypatch, body_bytes, writes_expected
):
    # Three requests written in one loop iteration: large ones (a producer's batch, ~66 KiB)
    # each leave as soon as written, so the peer can work on the first while the next is
    # encoded; small ones leave together at the end of the iteration, in one write.
    writes: list[tuple[Connection, int]] = []
    flush = Connection._flush

    def counting_flush(connection: Connection) -> None:
        if connection._corked is not None:
            writes.append((connection, len(connection._corked)))
        flush(connection)

    monkeypatch.setattr(Connection, "_flush", counting_flush)

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, echo)
            connection = await client.get_connection(address(server))
            requests = [
                RemotingCommand.request(ECHO, {"n": str(n)}, body=bytes([n]) * body_bytes)
                for n in range(3)
            ]
            writes.clear()
            responses = await asyncio.gather(
                *(client.invoke(address(server), request, 20_000) for request in requests)
            )
            return connection, requests, responses

    connection, requests, responses = run(main())
    assert [response.body for response in responses] == [r.body for r in requests]
    client_writes = [frames for written_by, frames in writes if written_by is connection]
    assert len(client_writes) == writes_expected, client_writes

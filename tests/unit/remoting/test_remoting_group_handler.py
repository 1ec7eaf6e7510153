"""Group handlers: requests of one code that arrive in one read are served by one call."""

from __future__ import annotations

import asyncio

from remoting_helpers import echo, read_command

from tidemq.protocol.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting import Connection, RemotingServer
from tidemq.remoting.dispatch import GROUP_REQUESTS_MAX, LaterResponse

SEND = RequestCode.SEND_MESSAGE_V2


def requests_numbered(count: int, body: bytes = b"b") -> list[RemotingCommand]:
    return [RemotingCommand.request(SEND, {"n": str(n)}, body=body) for n in range(count)]


async def send_in_one_write(server: RemotingServer, requests: list[RemotingCommand]):
    """Write every request in one write (one read on loopback); return the responses."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
    writer.write(b"".join(request.encode() for request in requests))
    responses = [await asyncio.wait_for(read_command(reader), 10) for _ in requests]
    writer.close()
    await writer.wait_closed()
    return responses


def group_echo(calls: list[list[int]]):
    async def serve(requests: list[RemotingCommand], connection: Connection):
        calls.append([int(request.ext_fields["n"]) for request in requests])
        return [await echo(request, connection) for request in requests]

    return serve


def test_requests_of_one_read_go_to_one_group_handler_call_in_order(run):
    calls: list[list[int]] = []
    singles: list[int] = []

    async def single(request: RemotingCommand, connection: Connection):
        singles.append(int(request.ext_fields["n"]))
        return await echo(request, connection)

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(SEND, single, group_handler=group_echo(calls))
            requests = requests_numbered(10)
            return requests, await send_in_one_write(server, requests)

    requests, responses = run(main())
    assert calls == [list(range(10))]
    assert singles == []
    by_opaque = {response.opaque: response for response in responses}
    for request in requests:
        answer = by_opaque[request.opaque]
        assert answer.code == ResponseCode.SUCCESS
        assert answer.ext_fields == request.ext_fields


def test_a_read_with_more_requests_than_a_group_holds_is_served_in_order_in_parts(run):
    calls: list[list[int]] = []
    count = 2 * GROUP_REQUESTS_MAX + 5

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(SEND, echo, group_handler=group_echo(calls))
            return await send_in_one_write(server, requests_numbered(count))

    responses = run(main())
    assert len(responses) == count
    assert all(len(call) <= GROUP_REQUESTS_MAX for call in calls)
    assert len(calls) >= 3
    assert [n for call in calls for n in call] == list(range(count))


def test_large_request_bodies_close_a_group_early(run):
    calls: list[list[int]] = []

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(SEND, echo, group_handler=group_echo(calls))
            # 40 KiB each: more than a group's body bytes, so each is its own group.
            return await send_in_one_write(server, requests_numbered(3, b"x" * 40 * 1024))

    responses = run(main())
    assert [response.code for response in responses] == [ResponseCode.SUCCESS] * 3
    assert [n for call in calls for n in call] == [0, 1, 2]
    assert all(len(call) == 1 for call in calls)


def serve_one_read(run, monkeypatch, requests: list[RemotingCommand]):
    """Hand ``requests`` to a server connection as one read; return the responses, the group
    handler's calls and the frame parts of each write of the connection."""
    writes: list[int] = []
    flush = Connection._flush

    def counting_flush(connection: Connection) -> None:
        if connection._corked is not None:
            writes.append(len(connection._corked))
        flush(connection)

    monkeypatch.setattr(Connection, "_flush", counting_flush)
    calls: list[list[int]] = []

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(SEND, echo, group_handler=group_echo(calls))
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
            async with asyncio.timeout(10):
                while not server.connections:
                    await asyncio.sleep(0.01)
            server.connections[0].data_received(
                b"".join(request.encode() for request in requests))
            responses = [await asyncio.wait_for(read_command(reader), 10) for _ in requests]
            writer.close()
            await writer.wait_closed()
            return responses

    return run(main()), calls, writes


def test_the_responses_to_several_groups_of_one_read_leave_in_one_write(run, monkeypatch):
    # Three large requests in one read make three groups; their responses are corked and
    # sent together by the last group (one write, one wake-up of the peer), not one each.
    responses, calls, writes = serve_one_read(run, monkeypatch,
                                              requests_numbered(3, b"x" * 40 * 1024))
    assert [response.code for response in responses] == [ResponseCode.SUCCESS] * 3
    assert calls == [[0], [1], [2]]
    assert len(writes) == 1, writes


def test_a_group_followed_by_a_full_group_of_the_read_is_answered_at_once(run, monkeypatch):
    # A read of two full groups and five more (a producer's window of single sends): the
    # first group's responses leave before the rest is served, so the producer works on
    # them meanwhile; the second group's wait for the last's, which follow it closely.
    count = 2 * GROUP_REQUESTS_MAX + 5
    responses, calls, writes = serve_one_read(run, monkeypatch, requests_numbered(count))
    assert len(responses) == count
    assert [len(call) for call in calls] == [GROUP_REQUESTS_MAX, GROUP_REQUESTS_MAX, 5]
    assert len(writes) == 2, writes


def test_a_lone_request_goes_to_the_plain_handler(run):
    calls: list[list[int]] = []
    singles: list[int] = []

    async def single(request: RemotingCommand, connection: Connection):
        singles.append(int(request.ext_fields["n"]))
        return await echo(request, connection)

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(SEND, single, group_handler=group_echo(calls))
            return await send_in_one_write(server, requests_numbered(1))

    responses = run(main())
    assert responses[0].code == ResponseCode.SUCCESS
    assert singles == [0]
    assert calls == []


def test_a_failing_group_handler_answers_every_request_system_error(run, caplog):
    async def broken(requests: list[RemotingCommand], connection: Connection):
        raise ValueError("group handler bug")

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(SEND, echo, group_handler=broken)
            return await send_in_one_write(server, requests_numbered(5))

    responses = run(main())
    assert [response.code for response in responses] == [ResponseCode.SYSTEM_ERROR] * 5
    assert all("group handler bug" in response.remark for response in responses)
    assert "group handler for 5 requests" in caplog.text


def test_a_group_past_max_pending_is_answered_system_busy_for_the_rest(run):
    calls: list[list[int]] = []

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(SEND, echo, max_pending=3, group_handler=group_echo(calls))
            return await send_in_one_write(server, requests_numbered(5))

    responses = run(main())
    codes = sorted(response.code for response in responses)
    assert codes == sorted([ResponseCode.SUCCESS] * 3 + [ResponseCode.SYSTEM_BUSY] * 2)
    assert calls == [[0, 1, 2]]


def test_oneway_requests_of_one_read_are_grouped_and_never_answered(run):
    # Producers end transactions oneway: those that arrive together share one call.
    calls: list[list[int]] = []

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(SEND, echo, group_handler=group_echo(calls))
            oneways = requests_numbered(6)
            for request in oneways:
                request.flag |= FLAG_ONEWAY
            marker = RemotingCommand.request(SEND, {"n": "99"}, body=b"b")
            # Responses of one group are written in order: an answered oneway would come
            # before the marker's answer.
            return await _first_response(server, [*oneways, marker]), marker

    first, marker = run(main())
    assert calls == [[0, 1, 2, 3, 4, 5, 99]]
    assert first.opaque == marker.opaque


async def _first_response(server: RemotingServer, requests: list[RemotingCommand]):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
    writer.write(b"".join(request.encode() for request in requests))
    response = await asyncio.wait_for(read_command(reader), 10)
    writer.close()
    await writer.wait_closed()
    return response



def test_later_responses_leave_when_resolved_and_count_as_running_until_then(run):
    # A SYNC_FLUSH broker answers a durable send with a LaterResponse, resolved from a
    # callback once the disk's sync is known. Until then the request stays counted (the
    # handler's pending bound, the connection's in-flight) and nothing is written; then the
    # response leaves as given, observed with its code.
    later: list[tuple[RemotingCommand, LaterResponse]] = []
    observed: list[tuple[int, int]] = []

    async def answer_later(request: RemotingCommand, connection: Connection):
        response = LaterResponse()
        later.append((request, response))
        return response

    async def group(requests: list[RemotingCommand], connection: Connection):
        return [await answer_later(request, connection) for request in requests]

    async def wait_for(condition):
        async with asyncio.timeout(10):
            while not condition():
                await asyncio.sleep(0.01)

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(SEND, answer_later, max_pending=3, group_handler=group)
            server.set_request_observer(lambda code, answer, seconds, count: observed.append(
                (answer, count)))
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
            requests = requests_numbered(3)
            writer.write(requests[0].encode() + requests[1].encode())  # one read: a group
            await wait_for(lambda: len(later) == 2)
            writer.write(requests[2].encode())  # a lone request: the plain handler
            await wait_for(lambda: len(later) == 3)
            connection = server.connections[0]
            running = connection.in_flight
            writer.write(requests_numbered(1)[0].encode())  # past max_pending=3
            busy = await asyncio.wait_for(read_command(reader), 10)
            for request, response in later:
                response.resolve(RemotingCommand.response_to(
                    request, ResponseCode.SUCCESS, ext_fields=request.ext_fields))
            connection.flush()
            answers = [await asyncio.wait_for(read_command(reader), 10) for _ in range(3)]
            await wait_for(lambda: connection.in_flight == 0)
            writer.close()
            return requests, running, busy, answers

    requests, running, busy, answers = run(main())
    assert running == 3
    assert busy.code == ResponseCode.SYSTEM_BUSY  # the first bytes back: nothing left before
    assert sorted(answer.opaque for answer in answers) == sorted(r.opaque for r in requests)
    assert all(answer.code == ResponseCode.SUCCESS for answer in answers)
    assert sorted(observed) == sorted([(ResponseCode.SYSTEM_BUSY, 1)]
                                      + [(ResponseCode.SUCCESS, 1)] * 3)


def test_a_groups_answers_leave_in_request_order_whatever_each_one_is(run):
    # One read of six requests served by one group call, answered: plainly; by a
    # LaterResponse resolved before the call returns; with a code the header cannot carry
    # (answered SYSTEM_ERROR naming the problem instead); plainly; oneway (its answer
    # dropped); plainly. The peer reads every answer of the two-way requests, in order.
    requests = requests_numbered(6)
    requests[4].flag |= FLAG_ONEWAY

    async def group(batch: list[RemotingCommand], connection: Connection):
        answers: list = []
        for request in batch:
            n = int(request.ext_fields["n"])
            response = RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                                   ext_fields=request.ext_fields)
            if n == 1:
                later = LaterResponse()
                later.resolve(response)
                response = later
            elif n == 2:
                response.code = 1 << 40  # no int32
            answers.append(response)
        return answers

    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(SEND, echo, group_handler=group)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
            writer.write(b"".join(request.encode() for request in requests))
            answers = [await asyncio.wait_for(read_command(reader), 10) for _ in range(5)]
            writer.close()
            await writer.wait_closed()
            return answers

    answers = run(main())
    assert [answer.opaque for answer in answers] == [
        requests[n].opaque for n in (0, 1, 2, 3, 5)]
    assert [answer.code for answer in answers] == [
        ResponseCode.SUCCESS, ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR,
        ResponseCode.SUCCESS, ResponseCode.SUCCESS]
    assert "cannot be encoded" in answers[2].remark
    assert [answer.ext_fields["n"] for n, answer in enumerate(answers) if n != 2] == [
        "0", "1", "3", "5"]

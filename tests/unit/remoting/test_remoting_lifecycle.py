"""Connections over time: timeouts, reconnects, idle closing, shutdown, server-sent requests."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
from remoting_helpers import echo, wait_until

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting import (
    Connection,
    ConnectionEvent,
    RemotingClient,
    RemotingClosed,
    RemotingConnectError,
    RemotingListenError,
    RemotingServer,
    RemotingTimeout,
)

ECHO = RequestCode.SEND_MESSAGE_V2
SILENT = RequestCode.PULL_MESSAGE


async def never_answer(request: RemotingCommand, connection: Connection) -> None:
    return None


def address(server: RemotingServer) -> str:
    return f"127.0.0.1:{server.bound_ports[0]}"


def test_no_response_in_time_raises_remoting_timeout_and_the_connection_stays_usable(run):
    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(SILENT, never_answer)
            server.register(ECHO, echo)
            # Connected first, with a timeout no load reaches: the 50 ms below is the
            # response's alone (a connect on a loaded machine can take longer than that).
            await client.invoke(address(server), RemotingCommand.request(ECHO))
            request = RemotingCommand.request(SILENT)
            with pytest.raises(RemotingTimeout) as timeout:
                await client.invoke(address(server), request, timeout_ms=50)
            connection = client.connections[address(server)]
            after = await client.invoke(address(server), RemotingCommand.request(ECHO))
            return timeout.value, request, connection, after, client.connections[address(server)]

    error, request, connection_before, after, connection_after = run(main())
    assert error.retriable
    assert f"opaque={request.opaque}" in str(error) and "50 ms" in str(error)
    assert after.code == ResponseCode.SUCCESS
    assert connection_after is connection_before


def test_each_request_times_out_on_its_own_deadline_whatever_the_order_sent(run):
    # One connection's requests share one expiry timer (connection.py): a short timeout
    # sent after a long one must still fire first, answered requests never time out, and
    # the long one keeps waiting until it is answered.
    async def main():
        release = asyncio.Event()

        async def held(request: RemotingCommand, connection: Connection) -> RemotingCommand:
            await release.wait()
            return await echo(request, connection)

        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(SILENT, never_answer)
            server.register(ECHO, held)
            server.register(RequestCode.HEART_BEAT, echo)
            # Connected first: a connect under load could outlast the short timeouts below.
            await client.invoke(address(server), RemotingCommand.request(RequestCode.HEART_BEAT))
            long = asyncio.ensure_future(
                client.invoke(address(server), RemotingCommand.request(ECHO), 60_000))
            # Answered well within 2 s even on a loaded machine; the short ones below are
            # due before these deadlines, so the shared timer is moved earlier for them.
            answered = [await client.invoke(address(server),
                                            RemotingCommand.request(RequestCode.HEART_BEAT),
                                            timeout_ms=2_000)
                        for _ in range(3)]
            short = RemotingCommand.request(SILENT)
            with pytest.raises(RemotingTimeout) as timeout:
                await client.invoke(address(server), short, timeout_ms=50)
            second = RemotingCommand.request(SILENT)
            with pytest.raises(RemotingTimeout):
                await client.invoke(address(server), second, timeout_ms=40)
            assert not long.done()
            release.set()
            return answered, timeout.value, short, await long

    answered, error, short, long = run(main())
    assert all(response.code == ResponseCode.SUCCESS for response in answered)
    assert f"opaque={short.opaque}" in str(error) and "50 ms" in str(error)
    assert long.code == ResponseCode.SUCCESS


def test_late_response_after_a_timeout_is_dropped(run, caplog):
    # The slow handler answers only once the request has timed out (an event, not a sleep
    # racing the 20 ms: a loaded machine could start the handler late); the client is
    # connected first, so the 20 ms is the response's alone (a connect can take longer than
    # that under load, which failed this test with RemotingConnectError).
    async def main():
        started = asyncio.Event()
        release = asyncio.Event()

        async def held(request: RemotingCommand, connection: Connection) -> RemotingCommand:
            started.set()
            await release.wait()
            return await echo(request, connection)

        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, held)
            server.register(RequestCode.HEART_BEAT, echo)
            await client.invoke(address(server), RemotingCommand.request(RequestCode.HEART_BEAT))
            late = RemotingCommand.request(ECHO)
            with pytest.raises(RemotingTimeout):
                await client.invoke(address(server), late, timeout_ms=20)
            await asyncio.wait_for(started.wait(), 10)
            release.set()
            # The held handler has answered; on one connection its late response arrives
            # before the next request's.
            await wait_until(lambda: server.handlers_running == 0, what="the held handler")
            connection = client.connections[address(server)]
            request = RemotingCommand.request(RequestCode.HEART_BEAT)
            response = await client.invoke(address(server), request)
            return connection.pending_requests, late, request, response

    with caplog.at_level(logging.DEBUG, logger="tidemq.remoting"):
        pending, late, request, response = run(main())
    assert pending == 0
    assert response.opaque == request.opaque and response.code == ResponseCode.SUCCESS
    dropped = [record.getMessage() for record in caplog.records
               if "no request waits for" in record.getMessage()]
    assert len(dropped) == 1 and f"opaque={late.opaque} from" in dropped[0], dropped


def test_client_reconnects_after_the_server_closed_the_connection(run):
    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, echo)
            first = await client.invoke(address(server), RemotingCommand.request(ECHO))
            old = client.connections[address(server)]
            for connection in server.connections:
                connection.close("test closes it")
            await asyncio.wait_for(old.wait_closed(), 10)
            second = await client.invoke(address(server), RemotingCommand.request(ECHO))
            new = client.connections[address(server)]
            return first, second, old, new

    first, second, old, new = run(main())
    assert first.code == second.code == ResponseCode.SUCCESS
    assert new is not old and new.local_address != old.local_address
    assert old.close_reason == "closed by the peer"


def test_requests_waiting_when_the_connection_closes_fail_with_remoting_closed(run):
    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(SILENT, never_answer)
            waiting = [
                asyncio.ensure_future(
                    client.invoke(address(server), RemotingCommand.request(SILENT), 10_000)
                )
                for _ in range(3)
            ]
            await wait_until(lambda: server.connections, what="the server connection")
            # The server may see the connection before the client has filed it under the
            # address (the connect task finishes a moment later): wait for both.
            await wait_until(lambda: address(server) in client.connections
                             and client.connections[address(server)].pending_requests == 3)
            server.connections[0].close("test closes it")
            return await asyncio.gather(*waiting, return_exceptions=True)

    results = run(main())
    assert all(isinstance(r, RemotingClosed) and r.retriable for r in results)


def test_concurrent_first_use_shares_one_connect_attempt(run):
    async def main():
        opened: list[Connection] = []
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, echo)
            client.connection_listeners.append(
                lambda event, c: opened.append(c) if event == ConnectionEvent.OPEN else None
            )
            responses = await asyncio.gather(
                *(client.invoke(address(server), RemotingCommand.request(ECHO)) for _ in range(20))
            )
            return opened, responses, len(server.connections)

    opened, responses, server_side = run(main())
    assert len(opened) == 1 and server_side == 1
    assert all(r.code == ResponseCode.SUCCESS for r in responses)


def test_connect_refused_raises_retriable_remoting_connect_error(run):
    # A bound but not listening socket: connecting to its port is refused.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]

        async def main():
            async with RemotingClient(connect_timeout_ms=2000) as client:
                with pytest.raises(RemotingConnectError) as refused:
                    await client.invoke(f"127.0.0.1:{port}", RemotingCommand.request(ECHO))
                return refused.value

        error = run(main())
    assert error.retriable
    assert f"127.0.0.1:{port}" in str(error)


@pytest.mark.parametrize("bad_address", ["no-port", "127.0.0.1:notaport", ":10911", "h:70000"])
def test_malformed_address_raises_a_non_retriable_connect_error(run, bad_address):
    async def main():
        async with RemotingClient() as client:
            with pytest.raises(RemotingConnectError) as failure:
                await client.invoke(bad_address, RemotingCommand.request(ECHO))
            return failure.value

    error = run(main())
    assert not error.retriable
    assert repr(bad_address) in str(error)


def test_idle_connection_is_closed_and_reopened_on_next_use(run):
    async def main():
        closed: list[Connection] = []
        async with RemotingServer("127.0.0.1", [0], idle_timeout_s=0.1) as server:
            server.register(ECHO, echo)
            server.connection_listeners.append(
                lambda event, c: closed.append(c) if event == ConnectionEvent.CLOSE else None
            )
            async with RemotingClient() as client:
                await client.invoke(address(server), RemotingCommand.request(ECHO))
                await wait_until(lambda: closed, what="the idle close")
                await wait_until(lambda: not client.connections, what="the client to notice")
                again = await client.invoke(address(server), RemotingCommand.request(ECHO))
            return closed[0], again

    idle, again = run(main())
    assert "idle" in idle.close_reason and "idle_timeout_s" in idle.close_reason
    assert again.code == ResponseCode.SUCCESS


def test_client_side_idle_timeout_closes_its_connection(run):
    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(ECHO, echo)
            async with RemotingClient(idle_timeout_s=0.1) as client:
                await client.invoke(address(server), RemotingCommand.request(ECHO))
                connection = client.connections[address(server)]
                await asyncio.wait_for(connection.wait_closed(), 10)
                return connection.close_reason, client.connections

    reason, connections = run(main())
    assert "idle" in reason
    assert connections == {}


def test_a_request_in_flight_is_not_cut_by_the_idle_timeout(run):
    async def main():
        async def slow(request: RemotingCommand, connection: Connection) -> RemotingCommand:
            await asyncio.sleep(0.5)
            return await echo(request, connection)

        async with RemotingServer("127.0.0.1", [0], idle_timeout_s=0.1) as server:
            server.register(ECHO, slow)
            async with RemotingClient() as client:
                return await client.invoke(address(server), RemotingCommand.request(ECHO))

    assert run(main()).code == ResponseCode.SUCCESS


def test_server_sends_requests_to_the_client_over_the_clients_connection(run):
    async def main():
        notified = asyncio.Event()
        connections: list[Connection] = []

        async def heartbeat(request: RemotingCommand, connection: Connection) -> RemotingCommand:
            connections.append(connection)
            return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

        async def running_info(request: RemotingCommand, connection: Connection):
            return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=b"{}")

        async def ids_changed(request: RemotingCommand, connection: Connection) -> None:
            assert request.ext_fields == {"consumerGroup": "cg"}
            notified.set()

        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(RequestCode.HEART_BEAT, heartbeat)
            client.register(RequestCode.GET_CONSUMER_RUNNING_INFO, running_info)
            client.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ids_changed)
            await client.invoke(address(server), RemotingCommand.request(RequestCode.HEART_BEAT))
            to_client = connections[0]
            info = await to_client.request(
                RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO), timeout_ms=3000
            )
            await to_client.send_oneway(
                RemotingCommand.request(
                    RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "cg"}
                )
            )
            await asyncio.wait_for(notified.wait(), 10)
            unsupported = await to_client.request(
                RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE)
            )
            return info, unsupported, to_client.remote_address, client.connections

    info, unsupported, remote, client_connections = run(main())
    assert info.code == ResponseCode.SUCCESS and info.body == b"{}"
    assert unsupported.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    [client_connection] = client_connections.values()
    assert remote == client_connection.local_address


def test_graceful_stop_lets_an_in_flight_request_finish(run):
    async def main():
        started = asyncio.Event()
        release = asyncio.Event()

        async def slow(request: RemotingCommand, connection: Connection) -> RemotingCommand:
            started.set()
            await release.wait()
            return await echo(request, connection)

        server = RemotingServer("127.0.0.1", [0])
        server.register(ECHO, slow)
        await server.start()
        addr = address(server)
        async with RemotingClient() as client:
            in_flight = asyncio.ensure_future(
                client.invoke(addr, RemotingCommand.request(ECHO, body=b"last"), 10_000)
            )
            await started.wait()
            stopping = asyncio.ensure_future(server.stop(grace_s=10))
            await asyncio.sleep(0.05)
            assert not stopping.done()
            async with RemotingClient() as late_client:
                with pytest.raises(RemotingConnectError):  # no longer accepting
                    await late_client.invoke(addr, RemotingCommand.request(ECHO), 1000)
            release.set()
            response = await in_flight
            await stopping
            await wait_until(lambda: not client.connections, what="the client to see the close")
        return response, server.connections

    response, connections = run(main())
    assert response.code == ResponseCode.SUCCESS and response.body == b"last"
    assert connections == []


def test_stop_cancels_handlers_still_running_after_the_grace_period(run, caplog):
    async def main():
        started = asyncio.Event()

        async def stuck(request: RemotingCommand, connection: Connection) -> RemotingCommand:
            started.set()
            await asyncio.sleep(3600)
            raise AssertionError("not reached")

        server = RemotingServer("127.0.0.1", [0])
        server.register(ECHO, stuck)
        await server.start()
        async with RemotingClient() as client:
            waiting = asyncio.ensure_future(
                client.invoke(address(server), RemotingCommand.request(ECHO), 10_000)
            )
            await started.wait()
            await server.stop(grace_s=0.1)
            with pytest.raises(RemotingClosed):
                await waiting
        return server.handlers_running

    with caplog.at_level(logging.WARNING, logger="tidemq.remoting"):
        assert run(main()) == 0
    assert "still running after 0.1 s" in caplog.text


def test_listening_on_a_port_in_use_raises_remoting_listen_error(run):
    async def main():
        async with RemotingServer("127.0.0.1", [0]) as first:
            port = first.bound_ports[0]
            second = RemotingServer("127.0.0.1", [0, port])
            with pytest.raises(RemotingListenError) as failure:
                await second.start()
            return port, failure.value, second.bound_ports

    port, error, bound = run(main())
    assert f"127.0.0.1:{port}" in str(error) and "listenPort" in str(error)
    assert bound == []  # the port bound before the failing one was released


def test_connection_listeners_see_open_and_close_with_attributes(run):
    async def main():
        events: list[tuple[ConnectionEvent, str]] = []

        def listener(event: ConnectionEvent, connection: Connection) -> None:
            if event == ConnectionEvent.OPEN:
                connection.attributes["client_id"] = "c-1"
            events.append((event, connection.attributes.get("client_id")))

        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(ECHO, echo)
            server.connection_listeners.append(listener)
            async with RemotingClient() as client:
                await client.invoke(address(server), RemotingCommand.request(ECHO))
            await wait_until(lambda: len(events) == 2, what="the close event")
        return events

    assert run(main()) == [(ConnectionEvent.OPEN, "c-1"), (ConnectionEvent.CLOSE, "c-1")]


def test_closed_client_refuses_new_requests(run):
    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server:
            server.register(ECHO, echo)
            client = RemotingClient()
            await client.invoke(address(server), RemotingCommand.request(ECHO))
            await client.close()
            with pytest.raises(RemotingClosed):
                await client.invoke(address(server), RemotingCommand.request(ECHO))
            return client.connections

    assert run(main()) == {}


def test_close_connection_drops_it_and_the_next_use_opens_a_new_one(run):
    async def main():
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient() as client:
            server.register(ECHO, echo)
            await client.invoke(address(server), RemotingCommand.request(ECHO))
            old = client.connections[address(server)]
            client.close_connection(address(server))
            assert address(server) not in client.connections
            response = await client.invoke(address(server), RemotingCommand.request(ECHO))
            await asyncio.wait_for(old.wait_closed(), 10)
            return old, client.connections[address(server)], response

    old, new, response = run(main())
    assert new is not old and old.close_reason == "closed by the client"
    assert response.code == ResponseCode.SUCCESS

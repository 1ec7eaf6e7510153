"""RemotingClient: request/response to many addresses, one connection each.

A connection to an address ("host:port") is opened on first use and kept; after it closes
(peer gone, idle, malformed frame) the next use opens a new one. Callers that arrive while a
connect is under way share that one attempt. The server may send requests back over the same
connection (NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE, GET_CONSUMER_RUNNING_INFO);
handlers registered here serve them, exactly as on a server.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections.abc import Awaitable, Coroutine
from typing import Any

from tidemq.limits import FRAME_SIZE_MAX
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting.connection import (
    IDLE_TIMEOUT_S,
    MAX_IN_FLIGHT_PER_CONNECTION,
    Connection,
    ConnectionEvent,
    ConnectionListener,
    RequestHook,
    check_limits,
)
from tidemq.remoting.dispatch import MAX_PENDING_PER_HANDLER, Handler, RequestDispatcher
from tidemq.remoting.errors import RemotingClosed, RemotingConnectError

log = logging.getLogger("tidemq.remoting")

# RocketMQ's connectTimeoutMillis default.
CONNECT_TIMEOUT_MS = 3000


class RemotingClient:
    """Sends requests to remoting servers by address, one lazily opened connection each.

    Args:
        connect_timeout_ms: how long opening a connection may take.
        frame_size_max: largest frame accepted from a server.
        idle_timeout_s: close a connection after this long without traffic (it is reopened
            on the next use).
        max_in_flight_per_connection: server-sent requests handled at once per connection.
        request_hook: called with every request sent, just before it is encoded (the ACL
            signature goes in here; see ``tidemq.remoting.connection.RequestHook``).
        tls: a client ``ssl.SSLContext`` to wrap every connection in TLS (see
            ``tidemq.remoting.tls.client_context``); None connects in plain TCP.

    Attributes:
        connection_listeners: callables ``(event, connection)`` told when a connection opens
            and when it has closed.
    """

    def __init__(
        self,
        *,
        connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
        frame_size_max: int = FRAME_SIZE_MAX,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_in_flight_per_connection: int = MAX_IN_FLIGHT_PER_CONNECTION,
        request_hook: RequestHook | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        check_limits(
            idle_timeout_s=idle_timeout_s, max_in_flight_per_connection=max_in_flight_per_connection
        )
        self.connect_timeout_ms = connect_timeout_ms
        self.request_hook = request_hook
        self._tls = tls
        self._frame_size_max = frame_size_max
        self._idle_timeout_s = idle_timeout_s
        self._max_in_flight = max_in_flight_per_connection
        self._dispatcher = RequestDispatcher()
        self._connections: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Task[Connection]] = {}
        self._closed = False
        self.connection_listeners: list[ConnectionListener] = []

    def register(
        self, code: int, handler: Handler, *, max_pending: int = MAX_PENDING_PER_HANDLER
    ) -> None:
        """Serve requests the server sends with ``code`` by ``handler``.

        Same contract as ``RemotingServer.register``; unknown codes are answered with
        REQUEST_CODE_NOT_SUPPORTED.
        """
        self._dispatcher.register(code, handler, max_pending=max_pending)

    def register_default(
        self, handler: Handler, *, max_pending: int = MAX_PENDING_PER_HANDLER
    ) -> None:
        """Serve every server-sent code that has no handler of its own by ``handler``."""
        self._dispatcher.register_default(handler, max_pending=max_pending)

    @property
    def connections(self) -> dict[str, Connection]:
        """The open connections by address (a copy)."""
        return dict(self._connections)

    def open_connection(self, addr: str) -> Connection | None:
        """The open connection to ``addr``, or None when there is none now (nothing is
        opened: ``get_connection`` does that)."""
        connection = self._connections.get(addr)
        if connection is None or connection.is_closing:
            return None
        return connection

    async def get_connection(self, addr: str, timeout_ms: int | None = None) -> Connection:
        """The open connection to ``addr``, opening one if there is none.

        Args:
            addr: ``"host:port"`` (``"[v6]:port"`` for IPv6 literals).
            timeout_ms: connect timeout; ``connect_timeout_ms`` when None.

        Raises:
            RemotingConnectError: the address is malformed (not retriable), or the connection
                was refused, unreachable or not made within the timeout.
            RemotingClosed: the client is closed.
        """
        connection = self._connections.get(addr)
        if connection is not None and not connection.is_closing:
            return connection
        if self._closed:
            raise RemotingClosed(f"client is closed; cannot connect to {addr}")
        attempt = self._connecting.get(addr)
        if attempt is None:
            attempt = asyncio.get_running_loop().create_task(self._connect(addr))
            self._connecting[addr] = attempt
            attempt.add_done_callback(lambda task: self._connect_finished(addr, task))
        timeout_s = (self.connect_timeout_ms if timeout_ms is None else timeout_ms) / 1000
        try:
            # shield: one caller giving up must not cancel the attempt the others share
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(attempt)
        except TimeoutError:
            raise RemotingConnectError(
                f"connecting to {addr} took longer than {timeout_s * 1000:.0f} ms "
                "(connect_timeout_ms or the request's timeout)"
            ) from None

    def invoke(
        self, addr: str, command: RemotingCommand, timeout_ms: int = 3000
    ) -> Coroutine[Any, Any, RemotingCommand]:
        """Send a request to ``addr`` and wait for its response (a coroutine to await).

        ``timeout_ms`` covers connecting (when needed) and the round trip.

        Returns:
            The response, whatever its code.

        Raises:
            RemotingConnectError: no connection could be made.
            RemotingTimeout: no response within ``timeout_ms``.
            RemotingClosed: the connection closed before the response arrived.
        """
        connection = self._connections.get(addr)
        if connection is not None and not connection.is_closing:
            # The connection's own coroutine, not one wrapping it: a coroutine frame less
            # to make and to resume on every request of every client. And the connection's
            # loop, not asyncio.get_running_loop(): on Python 3.11 every running-loop lookup
            # is a getpid system call.
            return connection._request(
                command, connection._loop.time() + timeout_ms / 1000, timeout_ms)
        return self._connect_and_invoke(addr, command, timeout_ms)

    def invoke_written(
        self, addr: str, command: RemotingCommand, timeout_ms: int = 3000
    ) -> Awaitable[RemotingCommand]:
        """``invoke`` for a client's hot path: when the connection to ``addr`` is open and
        can take the request without waiting, the request is written (to the cork) before
        this returns and the awaitable is the answer's future itself, with no coroutine
        around it to make and to resume; otherwise it is ``invoke``'s coroutine.

        The answer, the errors and ``timeout_ms`` are ``invoke``'s. One difference: a caller
        that cancels the future leaves the request waiting on the connection until its
        answer or its timeout (either drops it), as a timed-out ``invoke`` does, instead of
        forgetting it at once.

        Raises:
            LocalProtocolError: as ``invoke`` (raised here when the request is written now).
        """
        connection = self._connections.get(addr)
        # ``_closing`` is what ``is_closing`` says, without the property's call per send.
        if connection is not None and not connection._closing:
            answer: asyncio.Future[RemotingCommand] = connection._loop.create_future()
            if connection.request_nowait(command, timeout_ms, answer):
                return answer
            return connection._request(
                command, connection._loop.time() + timeout_ms / 1000, timeout_ms)
        return self._connect_and_invoke(addr, command, timeout_ms)

    async def _connect_and_invoke(
        self, addr: str, command: RemotingCommand, timeout_ms: int
    ) -> RemotingCommand:
        deadline = asyncio.get_running_loop().time() + timeout_ms / 1000
        connection = await self.get_connection(addr, min(self.connect_timeout_ms, timeout_ms))
        return await connection._request(command, deadline, timeout_ms)

    async def invoke_oneway(
        self, addr: str, command: RemotingCommand, timeout_ms: int = 3000
    ) -> None:
        """Send a request that gets no response (sets its oneway flag).

        Raises:
            RemotingConnectError: no connection could be made.
            RemotingTimeout: the connection's write buffer stayed full for ``timeout_ms``.
            RemotingClosed: the connection is closed.
        """
        connection = self._connections.get(addr)
        if connection is None or connection.is_closing:
            connection = await self.get_connection(addr, min(self.connect_timeout_ms, timeout_ms))
        await connection.send_oneway(command, timeout_ms)

    def close_connection(self, addr: str) -> None:
        """Close the connection to ``addr`` if there is one; the next use opens a new one."""
        connection = self._connections.pop(addr, None)
        if connection is not None:
            connection.close("closed by the client")

    async def close(self, grace_s: float = 1.0) -> None:
        """Close every connection and stop serving server-sent requests. Idempotent.

        Requests still waiting fail with ``RemotingClosed``.
        """
        self._closed = True
        for attempt in list(self._connecting.values()):
            attempt.cancel()
        if self._connecting:
            await asyncio.wait(list(self._connecting.values()))
        connections = list(self._connections.values())
        self._connections.clear()
        for connection in connections:
            connection.close("client closing")
        if connections:
            waits = [asyncio.ensure_future(c.wait_closed()) for c in connections]
            _, not_done = await asyncio.wait(waits, timeout=grace_s)
            for connection in connections:
                if not connection.closed.is_set():
                    connection.abort("client closing")
            if not_done:
                await asyncio.wait(not_done)
        await self._dispatcher.cancel_all()

    async def __aenter__(self) -> RemotingClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- internals -----------------------------------------------------------------------------

    async def _connect(self, addr: str) -> Connection:
        host, port = _split_address(addr)
        loop = asyncio.get_running_loop()
        factory = functools.partial(self._new_connection, addr)
        try:
            async with asyncio.timeout(self.connect_timeout_ms / 1000):
                if self._tls is None:
                    _, connection = await loop.create_connection(factory, host, port)
                else:
                    _, connection = await loop.create_connection(
                        factory, host, port, ssl=self._tls, server_hostname=host
                    )
        except TimeoutError:
            raise RemotingConnectError(
                f"connecting to {addr} took longer than connect_timeout_ms="
                f"{self.connect_timeout_ms}"
            ) from None
        except ssl.SSLError as exc:
            raise RemotingConnectError(
                f"TLS handshake with {addr} failed: {exc.reason or exc} (check the CA file "
                "the client trusts, the server's certificate and whether the server speaks TLS)"
            ) from exc
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            if self._tls is not None and not isinstance(exc, ConnectionRefusedError):
                raise RemotingConnectError(
                    f"TLS handshake with {addr} failed: {reason} (does the server serve TLS? "
                    "a plain server closes the connection on a TLS client)"
                ) from exc
            raise RemotingConnectError(f"cannot connect to {addr}: {reason}") from exc
        if self._closed:  # close() ran while we were connecting
            connection.abort("client closing")
            raise RemotingClosed(f"client is closed; connection to {addr} dropped")
        return connection

    def _connect_finished(self, addr: str, attempt: asyncio.Task[Connection]) -> None:
        if self._connecting.get(addr) is attempt:
            del self._connecting[addr]
        if attempt.cancelled():
            return
        if attempt.exception() is not None:  # retrieved here: every waiter may have left
            return
        connection = attempt.result()
        if not connection.is_closing:
            self._connections[addr] = connection

    def _new_connection(self, addr: str) -> Connection:
        return Connection(
            self._dispatcher,
            frame_size_max=self._frame_size_max,
            idle_timeout_s=self._idle_timeout_s,
            max_in_flight=self._max_in_flight,
            on_open=functools.partial(self._connection_opened, addr),
            request_hook=self.request_hook,
        )

    def _connection_opened(self, addr: str, connection: Connection) -> None:
        log.debug("connected to %s from %s", addr, connection.local_address)
        connection.on_close.append(functools.partial(self._connection_closed, addr))
        self._tell_listeners(ConnectionEvent.OPEN, connection)

    def _connection_closed(self, addr: str, connection: Connection) -> None:
        if self._connections.get(addr) is connection:
            del self._connections[addr]
        log.debug("connection to %s closed: %s", addr, connection.close_reason)
        self._tell_listeners(ConnectionEvent.CLOSE, connection)

    def _tell_listeners(self, event: ConnectionEvent, connection: Connection) -> None:
        for listener in self.connection_listeners:
            try:
                listener(event, connection)
            except Exception:
                log.exception(
                    "connection listener %r failed on %s of %s",
                    listener,
                    event,
                    connection.remote_address,
                )


def _split_address(addr: str) -> tuple[str, int]:
    host, sep, port_text = addr.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not sep or not host or not 0 < port < 65536:
        raise RemotingConnectError(
            f"address {addr!r} is not host:port (e.g. 127.0.0.1:10911)", retriable=False
        )
    return host, port

"""RemotingServer: listen on one or more ports and serve remoting requests by code.

The broker listens on ``listenPort`` and on ``listenPort - 2`` (the "VIP" channel older
clients use, docs/protocol.md §15.4), so a server takes a list of ports; every port serves the
same handlers. With ``tls`` (``tidemq.remoting.tls``) every port serves TLS only
(``enforcing``) or TLS and plain TCP side by side (``permissive``, ``SniffingListener``).
Each accepted socket becomes a ``Connection`` in the responder role (it stops
reading a peer whose responses back up); requests go to one shared ``RequestDispatcher``.

Shutdown (``stop``): stop accepting, stop reading new requests, let the requests already
being handled finish within the grace period (then cancel what is left), write their
responses, close every connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from tidemq.limits import FRAME_SIZE_MAX
from tidemq.remoting.connection import (
    IDLE_TIMEOUT_S,
    MAX_IN_FLIGHT_PER_CONNECTION,
    Connection,
    ConnectionEvent,
    ConnectionListener,
    check_limits,
)
from tidemq.remoting.dispatch import (
    MAX_PENDING_PER_HANDLER,
    GroupHandler,
    Handler,
    ImmediateHandler,
    RequestDispatcher,
    RequestGuard,
    RequestObserver,
)
from tidemq.remoting.errors import RemotingListenError
from tidemq.remoting.listening import LISTEN_BACKLOG, Listener, listen
from tidemq.remoting.tls import PLAIN, ServerTls

log = logging.getLogger("tidemq.remoting")

# After the grace period, connections still flushing get this long before being aborted.
STOP_CLOSE_WAIT_S = 1.0


class RemotingServer:
    """Serves remoting requests on ``host`` at every port in ``ports``.

    Args:
        host: the address to listen on; "127.0.0.1" by default, "0.0.0.0" for every IPv4
            interface.
        ports: the ports to listen on; 0 picks a free port (read ``bound_ports`` after start).
        frame_size_max: largest frame accepted from a peer; larger closes that connection.
        idle_timeout_s: close a connection after this long without traffic.
        max_in_flight_per_connection: requests of one connection handled at once; beyond,
            that connection is not read until half of them are done.
        write_buffer_max_bytes: responses buffered for a peer beyond this abort its
            connection (it is not reading); default four times ``frame_size_max``.
        tls: TLS mode and server context (``tidemq.remoting.tls``); plain TCP by default.

    Attributes:
        connection_listeners: callables ``(event, connection)`` told when a connection opens
            and when it has closed (e.g. to forget the clients it carried).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        ports: Sequence[int] = (0,),
        *,
        frame_size_max: int = FRAME_SIZE_MAX,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_in_flight_per_connection: int = MAX_IN_FLIGHT_PER_CONNECTION,
        write_buffer_max_bytes: int | None = None,
        tls: ServerTls = PLAIN,
    ) -> None:
        if not ports:
            raise ValueError("ports is empty; give at least one port to listen on (0 = any)")
        check_limits(
            idle_timeout_s=idle_timeout_s, max_in_flight_per_connection=max_in_flight_per_connection
        )
        self.host = host
        self.ports = list(ports)
        self._frame_size_max = frame_size_max
        self._idle_timeout_s = idle_timeout_s
        self._max_in_flight = max_in_flight_per_connection
        self._write_buffer_max_bytes = write_buffer_max_bytes
        if tls.enabled and tls.context is None:
            raise ValueError(f"TLS mode {tls.mode} needs a server context")
        self.tls = tls
        self._dispatcher = RequestDispatcher()
        self._servers: list[Listener] = []
        self._connections: set[Connection] = set()
        self._stopping = False
        self.connection_listeners: list[ConnectionListener] = []

    def register(
        self,
        code: int,
        handler: Handler | ImmediateHandler,
        *,
        max_pending: int = MAX_PENDING_PER_HANDLER,
        group_handler: GroupHandler | None = None,
        immediate: bool = False,
    ) -> None:
        """Serve requests with ``code`` by ``handler`` (see ``tidemq.remoting.dispatch``).

        ``handler(request, connection)`` returns the response, or None when it answers later
        itself with ``connection.send_response``. Over ``max_pending`` requests of this code
        being handled at once, new ones get SYSTEM_BUSY. ``group_handler(requests,
        connection)``, when given, serves the requests of ``code`` that one read brought in
        one call (one response or None per request, in order). With ``immediate``,
        ``handler`` is a plain function that never waits, called as the request is read.
        """
        self._dispatcher.register(
            code, handler, max_pending=max_pending, group_handler=group_handler,
            immediate=immediate,
        )

    def register_default(
        self, handler: Handler, *, max_pending: int = MAX_PENDING_PER_HANDLER
    ) -> None:
        """Serve every code that has no handler of its own by ``handler``."""
        self._dispatcher.register_default(handler, max_pending=max_pending)

    def set_request_guard(self, guard: RequestGuard | None) -> None:
        """Check every request with ``guard`` before any handler sees it (the ACL); a
        refusal is answered with the guard's code and remark (``tidemq.remoting.dispatch``)."""
        self._dispatcher.set_guard(guard)

    def set_request_observer(self, observer: RequestObserver | None) -> None:
        """Tell ``observer`` of every request answered or refused (the metrics; see
        ``tidemq.remoting.dispatch``)."""
        self._dispatcher.set_observer(observer)

    @property
    def bound_ports(self) -> list[int]:
        """The ports actually listened on, in the order of ``ports`` (empty before start)."""
        return [server.sockets[0].getsockname()[1] for server in self._servers]

    @property
    def connections(self) -> list[Connection]:
        """The open connections."""
        return list(self._connections)

    @property
    def handlers_running(self) -> int:
        """Requests being handled now, over all connections."""
        return self._dispatcher.running

    async def start(self) -> None:
        """Listen on every port; returns once all are bound.

        Raises:
            RemotingListenError: a port cannot be bound (in use, not permitted); ports bound
                before it are closed again.
        """
        if self._servers:
            raise RuntimeError("RemotingServer.start called twice")
        try:
            for port in self.ports:
                self._servers.append(await self._listen(port))
        except OSError as exc:
            for server in self._servers:
                server.close()
            self._servers.clear()
            raise RemotingListenError(
                f"cannot listen on {self.host}:{port}: {exc.strerror or exc} (choose another "
                "listenPort, or stop what holds the port)"
            ) from exc
        log.info(
            "listening on %s port(s) %s%s",
            self.host,
            ", ".join(str(port) for port in self.bound_ports),
            "" if not self.tls.enabled else f" (TLS {self.tls.mode})",
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop serving: let requests being handled finish, then close every connection.

        New connections are refused and no new requests are read at once. Requests already
        being handled get up to ``grace_s`` to finish and have their responses written;
        handlers still running then are cancelled. Safe to call more than once.
        """
        if self._stopping:
            return
        self._stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        for server in self._servers:
            server.close()
        for connection in list(self._connections):
            connection.hold_reading()
        left = await self._dispatcher.wait_idle(grace_s)
        if left:
            log.warning(
                "%d request handler(s) still running after %g s; cancelling them", left, grace_s
            )
            await self._dispatcher.cancel_all()
        for connection in list(self._connections):
            connection.close("server stopping")
        await self._wait_connections_closed(max(deadline - loop.time(), STOP_CLOSE_WAIT_S))
        for connection in list(self._connections):
            connection.abort("server stopping: responses not flushed in time")
        await self._wait_connections_closed(STOP_CLOSE_WAIT_S)
        for server in self._servers:
            await server.wait_closed()

    async def __aenter__(self) -> RemotingServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- internals -----------------------------------------------------------------------------

    async def _listen(self, port: int) -> Listener:
        return await listen(self.host, port, self._new_connection, self.tls,
                            backlog=LISTEN_BACKLOG)

    def _new_connection(self) -> Connection:
        return Connection(
            self._dispatcher,
            frame_size_max=self._frame_size_max,
            idle_timeout_s=self._idle_timeout_s,
            max_in_flight=self._max_in_flight,
            write_buffer_max_bytes=self._write_buffer_max_bytes,
            pause_reading_on_write_backlog=True,
            on_open=self._connection_opened,
        )

    def _connection_opened(self, connection: Connection) -> None:
        if self._stopping:
            connection.abort("server stopping")
            return
        self._connections.add(connection)
        connection.on_close.append(self._connection_closed)
        log.debug("connection from %s", connection.remote_address)
        self._tell_listeners(ConnectionEvent.OPEN, connection)

    def _connection_closed(self, connection: Connection) -> None:
        self._connections.discard(connection)
        log.debug(
            "connection from %s closed: %s", connection.remote_address, connection.close_reason
        )
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

    async def _wait_connections_closed(self, timeout_s: float) -> None:
        waits = [asyncio.ensure_future(c.wait_closed()) for c in self._connections]
        if not waits:
            return
        _, not_done = await asyncio.wait(waits, timeout=timeout_s)
        for task in not_done:
            task.cancel()
        if not_done:
            await asyncio.wait(not_done)

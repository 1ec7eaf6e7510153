"""A listening port that serves TLS and plain TCP side by side (TLS ``permissive`` mode).

asyncio's ``create_server`` decides TLS or not per port, before any byte is read. To let one
port take both, this listener accepts sockets itself, waits until the new socket is
readable, *peeks* at its first byte without consuming it (``MSG_PEEK``), and hands the socket
to the event loop with TLS when that byte is 0x16 (a TLS handshake record) or in plain TCP
otherwise (a remoting frame starts with the top byte of its length, 0x00). The protocol
object never sees the difference.

A connection that sends nothing within ``TLS_HANDSHAKE_TIMEOUT_S``, closes before its first
byte, or fails the TLS handshake is closed quietly (logged at INFO); the listener goes on.
It offers the parts of ``asyncio.Server`` that ``RemotingServer`` uses: ``sockets``,
``close`` and ``wait_closed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

from tidemq.remoting.tls import TLS_HANDSHAKE_FIRST_BYTE, TLS_HANDSHAKE_TIMEOUT_S

log = logging.getLogger("tidemq.remoting")

# After accept() fails for lack of file descriptors (EMFILE), wait this long before the next
# try instead of spinning on an error that only a closing connection can clear.
ACCEPT_RETRY_DELAY_S = 0.1


class SniffingListener:
    """Accepts on ``sock`` and serves each connection with TLS or without, by its first byte.

    Args:
        sock: a bound, listening socket; the listener owns it from now on.
        protocol_factory: makes the protocol for each connection, as for ``create_server``.
        context: the server-side TLS context for connections that start a handshake.
        handshake_timeout_s: how long a connection may take to send its first byte, and
            then to finish the TLS handshake.
    """

    def __init__(
        self,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        context: ssl.SSLContext,
        *,
        handshake_timeout_s: float = TLS_HANDSHAKE_TIMEOUT_S,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        sock.setblocking(False)
        self._sock = sock
        self._factory = protocol_factory
        self._context = context
        self._handshake_timeout_s = handshake_timeout_s
        self._pending: set[asyncio.Task[None]] = set()  # connections not yet handed over
        self._closed = False
        self._accept_task = self._loop.create_task(self._accept_loop())

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        """The listening socket (as ``asyncio.Server.sockets``)."""
        return () if self._closed else (self._sock,)

    def close(self) -> None:
        """Stop accepting; connections still being sniffed are dropped."""
        if self._closed:
            return
        self._closed = True
        self._accept_task.cancel()
        for task in self._pending:
            task.cancel()
        self._sock.close()

    async def wait_closed(self) -> None:
        """Wait until the accept loop and every sniffing task have ended."""
        tasks = [self._accept_task, *self._pending]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _accept_loop(self) -> None:
        loop = self._loop
        while not self._closed:
            try:
                connection_socket, _ = await loop.sock_accept(self._sock)
            except asyncio.CancelledError:
                raise
            except OSError as exc:
                if self._closed:
                    return
                log.warning("accept on %s failed: %s; retrying", self._sock.getsockname(), exc)
                await asyncio.sleep(ACCEPT_RETRY_DELAY_S)
                continue
            task = loop.create_task(self._serve(connection_socket))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _serve(self, connection_socket: socket.socket) -> None:
        connection_socket.setblocking(False)
        peer = _peer_of(connection_socket)
        handed_over = False
        try:
            async with asyncio.timeout(self._handshake_timeout_s):
                first = await self._peek_first_byte(connection_socket)
            if first is None:
                log.debug("connection from %s closed before sending anything", peer)
                return
            use_tls = first == TLS_HANDSHAKE_FIRST_BYTE
            await self._loop.connect_accepted_socket(
                self._factory,
                connection_socket,
                ssl=self._context if use_tls else None,
                ssl_handshake_timeout=self._handshake_timeout_s if use_tls else None,
            )
            handed_over = True
        except TimeoutError:
            log.info("closing connection from %s: nothing received within %g s", peer,
                     self._handshake_timeout_s)
        except (ssl.SSLError, OSError) as exc:
            log.info("closing connection from %s: TLS handshake failed: %s", peer, exc)
        finally:
            if not handed_over:
                with contextlib.suppress(OSError):
                    connection_socket.close()

    async def _peek_first_byte(self, connection_socket: socket.socket) -> int | None:
        """The first byte the peer sent, left in the socket; None when it closed first."""
        loop = self._loop
        fd = connection_socket.fileno()
        while True:
            try:
                data = connection_socket.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                readable: asyncio.Future[None] = loop.create_future()
                loop.add_reader(fd, _set_if_pending, readable)
                try:
                    await readable
                finally:
                    loop.remove_reader(fd)
                continue
            return data[0] if data else None


def _set_if_pending(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _peer_of(connection_socket: socket.socket) -> str:
    try:
        address = connection_socket.getpeername()
    except OSError:
        return "?"
    return f"{address[0]}:{address[1]}"

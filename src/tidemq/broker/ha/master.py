"""HAService, the master's side of the HA stream: accept slaves, stream the commit log.

Theory of operation (RocketMQ 4.x HAService / HAConnection; bytes in wire.py):

- the master listens on haListenPort (listenPort + 1 unless set) on brokerIP2 (brokerIP1
  unless set), in the broker's TLS mode (``tls``: enforcing takes TLS slaves only,
  permissive both, tidemq.remoting.listening); each accepted socket is one
  ``SlaveConnection`` with two tasks;
- the *reader* takes the slave's 8-byte offset reports. The first one says where to start:
  the slave's own end, or, when it reports 0 (an empty slave), the start of this master's
  oldest retained segment. Every later one is an acknowledgement: the slave holds every
  byte below it, which completes SYNC_MASTER waits (transfer_waits.py);
- the *writer* sends the commit log from there in chunks of up to haTransferBatchSize bytes
  (each inside one segment), as fast as the socket drains, then waits for new bytes (an
  append wakes it; it looks again every 100 ms anyway, as RocketMQ's does) and sends a
  size-0 heartbeat after haSendHeartbeatInterval of silence;
- housekeeping: a connection whose slave has not reported for haHousekeepingInterval is
  closed (the slave reconnects when it is alive).

Bad input closes that connection only, with a WARNING naming the peer and the value: a
negative report, a report beyond this master's end (a slave whose log is ahead of ours, or
garbage), a report below the slave's previous one, a start offset this master no longer has.

Events are logged once per change, not per chunk: connected, caught up (in sync), fell
behind (more than haMaxGapNotInSync bytes), back in sync, disconnected.

Owner: the event loop. The store is called from it (reads below the write position).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tidemq.broker.ha.transfer_waits import TransferWaits
from tidemq.broker.ha.wire import ReportDecoder, encode_chunk_header
from tidemq.errors import RemoteProtocolError
from tidemq.remoting.listening import Listener, listen
from tidemq.remoting.tls import PLAIN, ServerTls

log = logging.getLogger("tidemq.broker.ha")

# RocketMQ's HAConnection waits at most this long for new bytes before it looks again.
_POLL_S = 0.1
# Keep at most this many bytes queued in the socket's transport before waiting for it to
# drain: enough to keep a fast link busy, small enough that a slow slave costs little memory.
_WRITE_BUFFER_HIGH = 4 * 1024 * 1024
_READ_SIZE = 64 * 1024


@dataclass(slots=True)
class HASettings:
    """The HA keys a master and a slave use (docs/operations.md lists each with its default)."""

    transfer_batch_size: int = 32 * 1024  # haTransferBatchSize
    heartbeat_interval_s: float = 5.0  # haSendHeartbeatInterval
    housekeeping_interval_s: float = 20.0  # haHousekeepingInterval
    max_gap_not_in_sync: int = 256 * 1024 * 1024  # haMaxGapNotInSync (haSlaveFallbehindMax)


class ReplicaSource(Protocol):
    """What the master's HA side needs of the store (a ``StoreCore`` has it)."""

    def commit_log_min_offset(self) -> int: ...

    def commit_log_max_offset(self) -> int: ...

    def read_commit_log(self, physical_offset: int, max_bytes: int) -> bytes | None: ...


class SlaveConnection:
    """One slave's connection: where it is, what it acknowledged, whether it is in sync."""

    def __init__(self, peer: str, writer: asyncio.StreamWriter) -> None:
        self.peer = peer
        self.writer = writer
        self.acked_offset = -1  # -1: no report yet
        self.transfer_from = -1  # the next offset to send
        self.last_read_monotonic = time.monotonic()
        self.in_sync = False
        self.ever_in_sync = False
        self.connected_at_ms = int(time.time() * 1000)
        self.transferred_bytes = 0
        self.wake = asyncio.Event()

    def behind(self, master_max_offset: int) -> int:
        """Bytes the slave lacks (the whole log before its first report)."""
        return master_max_offset - max(self.acked_offset, 0)


class HAService:
    """Accepts slaves on the HA port and streams the commit log to each.

    Args:
        store: the master's store.
        host, port: where to listen (brokerIP2 or brokerIP1, haListenPort).
        settings: the HA keys.
        broker_name: for log lines.
        tls: the broker's TLS mode and server context (plain TCP by default).
    """

    def __init__(self, store: ReplicaSource, host: str, port: int, settings: HASettings,
                 broker_name: str = "", *, tls: ServerTls = PLAIN) -> None:
        self._store = store
        self.host = host
        self.port = port
        self.settings = settings
        self._broker_name = broker_name
        self.tls = tls
        self.waits = TransferWaits()
        # Controller mode (broker/controller_agent.py): connections -> the offset every
        # sync-state member acknowledged (None: the static rule, any one slave).
        self.ack_policy: Callable[[list[SlaveConnection]], int | None] | None = None
        self.connections: list[SlaveConnection] = []
        self._server: Listener | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on the HA port.

        Raises:
            OSError: the port is taken (the caller names haListenPort in its message).
        """
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._server = await listen(self.host, self.port, self._new_protocol, self.tls)
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]
        log.info("HA service of broker %s listening on %s:%d%s", self._broker_name, self.host,
                 self.port, f" (TLS {self.tls.mode})" if self.tls.enabled else "")

    async def stop(self) -> None:
        """Close the port and every slave connection; fail the waits."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        for connection in list(self.connections):
            connection.writer.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.waits.fail_all()

    @property
    def address(self) -> str:
        """``host:port`` the service listens on."""
        return f"{self.host}:{self.port}"

    # -- what the broker asks -------------------------------------------------------------------

    def notify_appended(self) -> None:
        """New bytes are in the commit log: wake the writers (any thread)."""
        loop = self._loop
        if loop is None or not self.connections:
            return  # nobody to wake (the common case of a master without slaves)
        if threading.get_ident() == self._loop_thread:
            self._wake_all()
        else:
            loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for connection in self.connections:
            connection.wake.set()

    def _acknowledged(self, offset: int) -> int:
        """What counts as acknowledged after a report of ``offset``: that offset, or with an
        ``ack_policy`` (controller mode: every sync-state member must hold a send) the
        policy's offset over all connections."""
        policy = self.ack_policy
        if policy is None:
            return offset
        policy_offset = policy(self.connections)
        return offset if policy_offset is None else policy_offset

    def in_sync_slave_count(self) -> int:
        """Slaves no more than haMaxGapNotInSync bytes behind this master's end."""
        end = self._store.commit_log_max_offset()
        gap = self.settings.max_gap_not_in_sync
        return sum(
            1 for c in self.connections if c.acked_offset >= 0 and end - c.acked_offset <= gap
        )

    def slave_fall_behind_bytes(self) -> int:
        """How far the most advanced slave is behind this master's end (the whole log when
        no slave is connected): RocketMQ's slaveFallBehindMuch."""
        end = self._store.commit_log_max_offset()
        acked = max((c.acked_offset for c in self.connections), default=-1)
        return end - max(acked, 0) if acked >= 0 else end

    async def wait_for_slave(self, end_offset: int, timeout_s: float) -> bool:
        """True once a slave acknowledged ``end_offset``, False after ``timeout_s``."""
        self.notify_appended()
        return await self.waits.wait(end_offset, timeout_s)

    # -- one connection -------------------------------------------------------------------------

    def _new_protocol(self) -> asyncio.StreamReaderProtocol:
        # What asyncio.start_server makes per connection, for a listener of any TLS mode.
        return asyncio.StreamReaderProtocol(asyncio.StreamReader(), self._serve)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_info = writer.get_extra_info("peername")
        peer = f"{peer_info[0]}:{peer_info[1]}" if peer_info else "?"
        connection = SlaveConnection(peer, writer)
        self.connections.append(connection)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        write_task = asyncio.get_running_loop().create_task(self._write_loop(connection))
        self._tasks.add(write_task)
        try:
            await self._read_loop(connection, reader, write_task)
        except (ConnectionError, OSError) as e:
            log.info("slave %s of broker %s: connection lost (%s)", peer, self._broker_name, e)
        except RemoteProtocolError as e:
            log.warning("closing HA connection from %s: %s", peer, e)
        except asyncio.CancelledError:
            # stop() ends the connection; ending quietly keeps asyncio's stream callback from
            # logging the cancellation as an error.
            pass
        finally:
            write_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await write_task
            self._tasks.discard(write_task)
            self._close(connection)
            self._tasks.discard(task)

    def _close(self, connection: SlaveConnection) -> None:
        with contextlib.suppress(Exception):
            connection.writer.close()
        if connection in self.connections:
            self.connections.remove(connection)
            log.info(
                "slave %s of broker %s disconnected (it had acknowledged offset %d)",
                connection.peer, self._broker_name, connection.acked_offset,
            )
        remaining = [c.acked_offset for c in self.connections if c.acked_offset >= 0]
        self.waits.reset_acked(self._acknowledged(max(remaining, default=0)))
        if not self.connections:
            self.waits.fail_all()

    async def _read_loop(self, connection: SlaveConnection, reader: asyncio.StreamReader,
                         write_task: asyncio.Task[None]) -> None:
        decoder = ReportDecoder()
        housekeeping = self.settings.housekeeping_interval_s
        while True:
            try:
                async with asyncio.timeout(housekeeping):
                    data = await reader.read(_READ_SIZE)
            except TimeoutError:
                log.warning(
                    "slave %s of broker %s sent no offset report for %g s "
                    "(haHousekeepingInterval); closing its connection",
                    connection.peer, self._broker_name, housekeeping,
                )
                return
            if not data:
                return
            if write_task.done():
                return  # the writer gave up (its reason is logged)
            connection.last_read_monotonic = time.monotonic()
            offset = decoder.feed(data)
            if offset is not None:
                self._on_report(connection, offset)

    def _on_report(self, connection: SlaveConnection, offset: int) -> None:
        end = self._store.commit_log_max_offset()
        if offset > end:
            raise RemoteProtocolError(
                f"slave reports offset {offset} but this master's commit log ends at {end}: "
                "the slave's log is ahead of ours (it was a master once, or it copied "
                "another master) or this is not a slave"
            )
        if offset < connection.acked_offset:
            raise RemoteProtocolError(
                f"slave reports offset {offset} after {connection.acked_offset}: a slave's "
                "offset never goes back on one connection"
            )
        first = connection.acked_offset < 0
        connection.acked_offset = offset
        if first:
            self._start_transfer(connection, offset, end)
        self._update_sync_state(connection, end)
        self.waits.acknowledge(self._acknowledged(offset))

    def _start_transfer(self, connection: SlaveConnection, offset: int, end: int) -> None:
        start = offset
        if offset == 0:
            # An empty slave: from this master's oldest retained segment (RocketMQ starts
            # at the last segment; copying everything retained keeps the slave whole).
            start = self._store.commit_log_min_offset()
        connection.transfer_from = start
        log.info(
            "slave %s connected to broker %s: it reports offset %d, this master ends at %d; "
            "transfer starts at %d",
            connection.peer, self._broker_name, offset, end, start,
        )
        connection.wake.set()

    def _update_sync_state(self, connection: SlaveConnection, end: int) -> None:
        behind = end - connection.acked_offset
        in_sync = behind <= self.settings.max_gap_not_in_sync
        if in_sync == connection.in_sync:
            return
        was_ever_in_sync = connection.ever_in_sync
        connection.in_sync = in_sync
        connection.ever_in_sync |= in_sync
        if in_sync:
            log.info(
                "slave %s of broker %s %s at offset %d (%d bytes behind)",
                connection.peer, self._broker_name,
                "is back in sync" if was_ever_in_sync else "caught up",
                connection.acked_offset, behind,
            )
        else:
            log.warning(
                "slave %s of broker %s fell behind: %d bytes behind (haMaxGapNotInSync=%d)",
                connection.peer, self._broker_name, behind, self.settings.max_gap_not_in_sync,
            )

    async def _write_loop(self, connection: SlaveConnection) -> None:
        writer = connection.writer
        settings = self.settings
        batch = settings.transfer_batch_size
        last_write = time.monotonic()
        while connection.transfer_from < 0:
            await connection.wake.wait()
            connection.wake.clear()
        while True:
            offset = connection.transfer_from
            data = self._store.read_commit_log(offset, batch)
            if data is None:
                self._refuse_offset(connection, offset)
                return
            if data:
                writer.write(encode_chunk_header(offset, len(data)))
                writer.write(data)
                connection.transfer_from = offset + len(data)
                connection.transferred_bytes += len(data)
                last_write = time.monotonic()
                transport = writer.transport
                if transport.get_write_buffer_size() > _WRITE_BUFFER_HIGH:
                    await writer.drain()
                continue
            if writer.transport.get_write_buffer_size():
                await writer.drain()
            idle = time.monotonic() - last_write
            if idle >= settings.heartbeat_interval_s:
                writer.write(encode_chunk_header(offset, 0))
                last_write = time.monotonic()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(_POLL_S, settings.heartbeat_interval_s - idle)):
                    await connection.wake.wait()
            connection.wake.clear()

    def _refuse_offset(self, connection: SlaveConnection, offset: int) -> None:
        low = self._store.commit_log_min_offset()
        end = self._store.commit_log_max_offset()
        if offset < low:
            reason = (
                f"this master's commit log now starts at {low} (retention deleted the "
                "segments before it); empty the slave's store so that it copies from there"
            )
        else:
            reason = f"this master's commit log ends at {end}"
        log.warning(
            "slave %s of broker %s needs offset %d, which this master does not have: %s; "
            "closing its connection", connection.peer, self._broker_name, offset, reason,
        )
        with contextlib.suppress(Exception):
            connection.writer.close()

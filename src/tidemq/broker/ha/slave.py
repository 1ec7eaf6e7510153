"""HAClient, the slave's side of the HA stream: copy the master's commit log, byte for byte.

Theory of operation (RocketMQ 4.x HAClient; bytes in wire.py, store side in
store/replication.py):

1. Where: the master's HA address is ``haMasterAddress`` when configured, else the
   haServerAddr of the name server's REGISTER_BROKER answer (``update_master``). The
   master's remoting address (for the check) is the answer's masterAddr, or with only
   haMasterAddress, its host and the HA port - 1 (RocketMQ's default layout).
2. Check (master_check.py): same brokerName and cluster, a master, and this slave's log a
   prefix of the master's. A refusal is logged once (ERROR, naming both offsets) and the
   check is repeated every ``RETRY_S``; the slave never truncates its own log.
3. Stream: connect (with TLS when given a context: the broker's tlsClient* keys,
   broker/outgoing.py), report the commit log's max offset, then for every read: append each
   chunk at exactly its offset (a chunk at another offset than this log's end closes the
   connection, naming both), report the new max offset, and wake the dispatch
   (replica_dispatch.py), which makes the whole records readable behind the copy, in
   slices, as RocketMQ's ReputMessageService does. A report also goes out every
   haSendHeartbeatInterval; a master silent for haHousekeepingInterval is dropped and the
   slave reconnects (after ``RETRY_S``).
4. Bytes that are no record (``ReplicaCorrupt``, found by the dispatch) stop the client for
   good: the slave serves what it had and says so in its log; a restart runs recovery over
   them.

Owner: the event loop. Store calls are quick writes (pwrite) and run on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tidemq.broker.ha.master import HASettings
from tidemq.broker.ha.master_check import MasterCheck, MasterUnreachable, ReplicaStore
from tidemq.broker.ha.replica_dispatch import ReplicaDispatcher
from tidemq.broker.ha.wire import ChunkDecoder, encode_report
from tidemq.errors import RemoteProtocolError, StoreError
from tidemq.store.replication import ReplicaCorrupt, ReplicaMismatch

log = logging.getLogger("tidemq.broker.ha")

# Wait between a failed or refused attempt and the next (RocketMQ's HAClient waits 5 s; a
# shorter wait gets a restarted master's slave streaming sooner and costs one connect).
RETRY_S = 1.0
_READ_SIZE = 1024 * 1024
# Replication-lag samples kept for brokerStatus (one per dispatch that made records readable):
# the last minute or so at a steady stream.
LAG_SAMPLES_MAX = 10_000


@dataclass(slots=True)
class MasterAddresses:
    """Where the master is: its HA address and its remoting address (for the check)."""

    ha_address: str
    remoting_address: str


def remoting_address_for(ha_address: str) -> str:
    """The master's remoting address when only its HA address is known: the HA port - 1."""
    host, _, port = ha_address.rpartition(":")
    return f"{host}:{int(port) - 1}"


class HAClient:
    """Keeps this slave's commit log a copy of its master's.

    Args:
        store: the slave's store.
        check: the master check (master_check.py).
        settings: the HA keys.
        configured_master: ``haMasterAddress`` (None: learn it from the name server).
        broker_name: for log lines.
        tls: a client TLS context to connect to the master's HA port with (None: plain TCP).
        reconcile: for a slave made by a role switch, ``reconcile(master remoting address)``
            run once per master before the check (reconcile.py): it truncates a divergent
            tail; returns a refusal or None, raises MasterUnreachable to be retried. None (a
            static slave): never truncate.
    """

    def __init__(self, store: ReplicaStore, check: MasterCheck, settings: HASettings,
                 configured_master: str | None = None, broker_name: str = "", *,
                 tls: ssl.SSLContext | None = None,
                 reconcile: Callable[[str], Awaitable[str | None]] | None = None) -> None:
        self._store = store
        self._tls = tls
        self._check = check
        self.settings = settings
        self._broker_name = broker_name
        self._master: MasterAddresses | None = None
        if configured_master:
            self._master = MasterAddresses(
                configured_master, remoting_address_for(configured_master))
        self._configured = bool(configured_master)
        self._reconcile = reconcile
        self._reconciled_for: str | None = None
        self._master_changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._last_problem: str | None = None
        # What brokerStatus shows.
        self.connected = False
        self.local_address: str | None = None  # this end of the HA connection, when connected
        self.refused: str | None = None
        self.stopped_reason: str | None = None
        self.last_read_ms = 0
        self.last_write_ms = 0
        self.reported_offset = -1
        self._last_report_monotonic_ms = 0.0
        # ms from a record's store time on the master to its dispatch here, the oldest record
        # of each dispatch (an upper bound for the others it carried).
        self.lag_samples_ms: deque[int] = deque(maxlen=LAG_SAMPLES_MAX)
        self.dispatcher = ReplicaDispatcher(store, self.lag_samples_ms)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start copying in the background (returns at once)."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tidemq-ha-client")
        self.dispatcher.start()

    async def stop(self) -> None:
        """Stop copying and close the connection; every whole record copied is dispatched
        when it returns."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.dispatcher.stop()

    def lag_percentiles_ms(self) -> tuple[int, int, int]:
        """(p50, p99, max) of the recent replication-lag samples (zeros without any)."""
        samples = sorted(self.lag_samples_ms)
        if not samples:
            return (0, 0, 0)
        return (samples[len(samples) // 2], samples[min(len(samples) - 1,
                                                        len(samples) * 99 // 100)], samples[-1])

    def update_master(self, ha_address: str | None, master_address: str | None) -> None:
        """The name server's REGISTER_BROKER answer named the master (haServerAddr,
        masterAddr); ignored when haMasterAddress is configured or nothing changed."""
        if self._configured or not ha_address:
            return
        remoting = master_address or remoting_address_for(ha_address)
        new = MasterAddresses(ha_address, remoting)
        if new != self._master:
            log.info("slave %s learned its master: HA %s, remoting %s", self._broker_name,
                     ha_address, remoting)
            self._master = new
            self._master_changed.set()

    def follow(self, ha_address: str, master_address: str) -> None:
        """Copy from this master from now on (a role switch's decision); name-server answers
        no longer change it."""
        self._configured = True
        new = MasterAddresses(ha_address, master_address)
        if new != self._master:
            self._master = new
            self._master_changed.set()

    @property
    def master(self) -> MasterAddresses | None:
        """The master copied from (None until known)."""
        return self._master

    # -- the loop -------------------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping:
            master = self._master
            if master is None:
                await self._pause()
                continue
            if (self._reconcile is not None
                    and self._reconciled_for != master.remoting_address):
                # A truncation must find every copied record dispatched (replica_dispatch.py).
                await self.dispatcher.settle()
                try:
                    problem = await self._reconcile(master.remoting_address)
                except MasterUnreachable as e:
                    self._note_problem(f"cannot reconcile with master: {e}", error=False)
                    await self._pause()
                    continue
                except StoreError as e:
                    self._note_problem(f"cannot truncate its divergent tail: {e}", error=True)
                    await self._pause()
                    continue
                if problem is not None:
                    self.refused = problem
                    self._note_problem(f"refuses to copy: {problem}", error=True)
                    await self._pause()
                    continue
                self._reconciled_for = master.remoting_address
            try:
                problem = await self._check.problem(master.remoting_address)
            except MasterUnreachable as e:
                self._note_problem(f"cannot check master: {e}", error=False)
                await self._pause()
                continue
            if problem is not None:
                self.refused = problem
                self._note_problem(f"refuses to copy: {problem}", error=True)
                await self._pause()
                continue
            self.refused = None
            self._last_problem = None
            try:
                await self._stream(master)
            except ReplicaCorrupt as e:
                self.stopped_reason = str(e)
                log.error(
                    "slave %s stops copying from %s: %s. It keeps serving what it has; "
                    "restart it to run recovery over its log", self._broker_name,
                    master.ha_address, e,
                )
                return
            except (OSError, RemoteProtocolError, ReplicaMismatch, StoreError, TimeoutError) as e:
                self._note_problem(f"lost its HA connection to {master.ha_address}: {e}",
                                   error=isinstance(e, ReplicaMismatch))
            finally:
                self.connected = False
            await self._pause()

    async def _pause(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(RETRY_S):
                await self._master_changed.wait()
        self._master_changed.clear()

    def _note_problem(self, text: str, *, error: bool) -> None:
        if text == self._last_problem:
            return  # once per change, not once per retry
        self._last_problem = text
        (log.error if error else log.warning)("slave %s %s", self._broker_name, text)

    async def _stream(self, master: MasterAddresses) -> None:
        host, _, port = master.ha_address.rpartition(":")
        settings = self.settings
        async with asyncio.timeout(settings.housekeeping_interval_s):
            if self._tls is None:
                reader, writer = await asyncio.open_connection(host, int(port))
            else:
                reader, writer = await asyncio.open_connection(
                    host, int(port), ssl=self._tls, server_hostname=host)
        try:
            self.connected = True
            # Our end of the connection, the peer address the master sees: a controller-mode
            # agent reports it so the master can tell which connection is which replica.
            sockname = writer.get_extra_info("sockname")
            self.local_address = f"{sockname[0]}:{sockname[1]}" if sockname else None
            log.info(
                "slave %s connected to master %s (HA %s) at offset %d", self._broker_name,
                master.remoting_address, master.ha_address, self._store.commit_log_max_offset(),
            )
            self._last_problem = None
            self._report(writer)
            await self._receive(reader, writer, master)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            log.info("slave %s disconnected from master %s", self._broker_name,
                     master.ha_address)

    async def _receive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       master: MasterAddresses) -> None:
        settings = self.settings
        decoder = ChunkDecoder()
        store = self._store
        last_read = time.monotonic()
        last_read_ms_before = self.last_read_ms
        while not self._stopping:
            if self.dispatcher.failure is not None:
                raise self.dispatcher.failure
            try:
                async with asyncio.timeout(settings.heartbeat_interval_s):
                    data = await reader.read(_READ_SIZE)
            except TimeoutError:
                data = None
            now = time.monotonic()
            if data == b"":
                if last_read_ms_before == self.last_read_ms and self._tls is None:
                    raise ConnectionResetError(
                        "the master closed the connection before sending anything (does its "
                        "HA port take TLS only? A master whose tlsServerMode is enforcing "
                        "does: set tlsClientEnable=true and tlsClientTrustCertPath on this "
                        "slave)")
                raise ConnectionResetError("the master closed the connection")
            if data is None:
                if now - last_read > settings.housekeeping_interval_s:
                    raise TimeoutError(
                        f"master sent nothing for {settings.housekeeping_interval_s:g} s "
                        "(haHousekeepingInterval)"
                    )
                self._report(writer)
                continue
            last_read = now
            self.last_read_ms = int(time.time() * 1000)
            wrote = False
            for chunk in decoder.feed(data):
                if not chunk.data:
                    continue  # a heartbeat
                end = store.commit_log_max_offset()
                empty = end == 0 and store.last_record_offset() < 0
                if chunk.offset != end and not empty:
                    raise ReplicaMismatch(
                        f"master {master.ha_address} sent bytes for offset {chunk.offset}, "
                        f"but this slave's commit log ends at {end}"
                    )
                store.append_replicated(chunk.offset, chunk.data)
                wrote = True
            if wrote:
                self.dispatcher.wake()
                self._report(writer)
            elif (now * 1000 - self._last_report_monotonic_ms
                  >= settings.heartbeat_interval_s * 1000):
                self._report(writer)
            if writer.transport.get_write_buffer_size():
                await writer.drain()

    def _report(self, writer: asyncio.StreamWriter) -> None:
        offset = self._store.commit_log_max_offset()
        writer.write(encode_report(offset))
        self.reported_offset = offset
        self.last_write_ms = int(time.time() * 1000)
        self._last_report_monotonic_ms = time.monotonic() * 1000

"""The consumption side's background work: long-polling wake-ups, offsets to disk, silent clients.

BrokerConfig fields used: flushConsumerOffsetInterval, channelExpiredTimeout.

``start()`` adds the store dispatch listener (long-polling wake-ups), starts the hold
service's re-check and the periodic tasks:

    persist consumer offsets          every flushConsumerOffsetInterval (5 s), when changed
    drop silent client channels       every 10 s (channels quiet for channelExpiredTimeout),
                                      and forget run-out queue locks

``shutdown()`` stops them, answers the parked pulls and persists the offsets.

The processors of the consumption side (pulls, offsets, clients, queries, locks) are made
by the controller from the broker's parts; this class only runs what no request drives.

Ownership: everything here is touched on the broker's event-loop thread only, except the
dispatch listener (any appending thread; it hands over to the loop) and the offsets file
write, which runs in a worker thread on a snapshot taken on the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidemq.errors import StoreError

if TYPE_CHECKING:
    from tidemq.broker.clients import Clients
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.consumer_offset_manager import ConsumerOffsetManager
    from tidemq.broker.lock_manager import RebalanceLockManager
    from tidemq.broker.pull_hold_service import PullRequestHoldService
    from tidemq.store.interface import MessageStore

log = logging.getLogger("tidemq.broker")

# RocketMQ's ClientHousekeepingService scans client channels every 10 s.
CLIENT_CHANNEL_SCAN_INTERVAL_MS = 10_000


class ConsumptionServices:
    """Starts and stops the consumption side's background work (module docstring).

    Args:
        config: flushConsumerOffsetInterval, channelExpiredTimeout.
        store: its dispatch listener wakes parked pulls.
        offsets: persisted periodically and at shutdown.
        clients: scanned for silent channels.
        locks: run-out leases are forgotten on the same scan.
        pull_holds: started and stopped here.
    """

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        offsets: ConsumerOffsetManager,
        clients: Clients,
        locks: RebalanceLockManager,
        pull_holds: PullRequestHoldService,
    ) -> None:
        self._config = config
        self._store = store
        self._offsets = offsets
        self._clients = clients
        self._locks = locks
        self._pull_holds = pull_holds
        self._tasks: list[asyncio.Task[None]] = []
        self._listening = False

    async def start(self) -> None:
        """Start long polling (store dispatch listener) and the periodic tasks."""
        await self._pull_holds.start()
        if not self._listening:
            self._store.add_dispatch_listener(self._pull_holds.on_message_dispatched)
            self._listening = True
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._every(
                self._config.flush_consumer_offset_interval_ms, self.persist_offsets,
                "persisting consumer offsets",
            )),
            loop.create_task(self._every(
                CLIENT_CHANNEL_SCAN_INTERVAL_MS, self.scan_client_channels,
                "scanning client channels",
            )),
        ]

    async def shutdown(self) -> None:
        """Stop the periodic tasks, answer parked pulls and persist the offsets (a write that
        fails with a StoreError, e.g. a full disk, is logged, not raised)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._pull_holds.stop()
        await self._clients.shutdown()
        try:
            await self.persist_offsets()
        except StoreError as exc:
            # A full disk at shutdown: say what is lost and go on, so the broker still
            # closes its store cleanly (raised, it skipped every later step of shutdown).
            log.error("persisting consumer offsets at shutdown failed: %s; consumerOffset.json "
                      "keeps the offsets of its last save, so consumers may be sent again "
                      "what they consumed since", exc)

    async def persist_offsets(self) -> None:
        """Write consumerOffset.json if offsets changed since the last write.

        The snapshot is taken on the loop; the file write and fsync run in a worker thread.
        """
        snapshot = self._offsets.snapshot_if_dirty()
        if snapshot is not None:
            await asyncio.to_thread(self._offsets.write_snapshot, snapshot)

    def scan_client_channels(self) -> None:
        """Drop consumers and producers silent for channelExpiredTimeout and close their
        connections, and forget run-out queue locks (runs every 10 s; public for tests)."""
        for channel in self._clients.scan_expired():
            channel.connection.close(
                f"no heartbeat for {self._config.channel_expired_timeout_ms} ms "
                "(channelExpiredTimeout)"
            )
        self._locks.purge_expired()

    async def _every(self, interval_ms: int, action: Callable[[], Any], what: str) -> None:
        interval_s = interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                outcome = action()
                if asyncio.iscoroutine(outcome):
                    await outcome
            except StoreError as exc:
                # A full disk or an unwritable config dir (persisting offsets): the message
                # names the file and what to do; a traceback would only say it came from here.
                log.error("%s failed: %s; trying again in %g s", what, exc, interval_s)
            except Exception:
                log.exception("%s failed; trying again in %g s", what, interval_s)

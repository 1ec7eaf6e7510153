"""The consumption side of a broker, wired together: offsets, groups, clients, pulls, locks.

BrokerConfig fields used: longPollingEnable, shortPollingTimeMills, flushConsumerOffsetInterval,
channelExpiredTimeout, notifyConsumerIdsChangedEnable, autoCreateSubscriptionGroup,
slaveReadEnable, brokerPermission, brokerRole, enablePropertyFilter, filterSupportRetry,
defaultQueryMaxNum, brokerName (remarks). StoreConfig fields used: storePathRootDir (config/ files).

``BrokerController`` builds ``ConsumptionServices(self)`` once its store and topic config
manager exist. Construction loads ``config/consumerOffset.json`` and
``config/subscriptionGroup.json`` and sets on the broker:

    consumer_offset_manager      ConsumerOffsetManager
    subscription_group_manager   SubscriptionGroupManager
    consumer_manager             ConsumerManager      (consumer groups from heartbeats)
    producer_manager             ProducerManager
    pull_hold_service            PullRequestHoldService (long polling)
    consumer_filter_table        ConsumerFilterTable    (compiled SQL92 filters by group, topic)
    lock_manager                 RebalanceLockManager   (orderly consumers' queue locks)

``register(server)`` registers the processors of PULL_MESSAGE, HEART_BEAT,
UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, CHECK_CLIENT_CONFIG,
GET_CONSUMER_CONNECTION_LIST, GET_PRODUCER_CONNECTION_LIST, QUERY/UPDATE_CONSUMER_OFFSET,
GET_MAX/MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME, QUERY_MESSAGE,
VIEW_MESSAGE_BY_ID, LOCK_BATCH_MQ and UNLOCK_BATCH_MQ. ``start()`` adds the store dispatch
listener (long-polling wake-ups) and starts the periodic tasks:

    persist consumer offsets          every flushConsumerOffsetInterval (5 s), when changed
    drop silent client channels       every 10 s (channels quiet for channelExpiredTimeout)
    long-polling re-check             every 5 s (shortPollingTimeMills without long polling)

``shutdown()`` stops them, answers the parked pulls and persists the offsets.

Ownership: everything here is touched on the broker's event-loop thread only, except the
dispatch listener (any appending thread; it hands over to the loop) and the offsets file
write, which runs in a worker thread on a snapshot taken on the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemq.broker.client_manager import ConsumerManager, ProducerManager
from tidemq.broker.client_processor import ClientManageProcessor
from tidemq.broker.consumer_offset_manager import ConsumerOffsetManager
from tidemq.broker.lock_manager import LockBatchProcessor, RebalanceLockManager, monotonic_ms
from tidemq.broker.offset_processor import ConsumerOffsetProcessor
from tidemq.broker.pull_hold_service import (
    LONG_POLLING_RECHECK_INTERVAL_MS,
    PullRequestHoldService,
)
from tidemq.broker.pull_processor import PullMessageProcessor
from tidemq.broker.query_processor import QueryMessageProcessor
from tidemq.broker.subscription_group_manager import SubscriptionGroupManager
from tidemq.filter.consumer_filters import ConsumerFilterTable
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import NotifyConsumerIdsChangedRequestHeader
from tidemq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer

log = logging.getLogger("tidemq.broker")

# RocketMQ's ClientHousekeepingService scans client channels every 10 s.
CLIENT_CHANNEL_SCAN_INTERVAL_MS = 10_000

# The re-check is only a safety net (parked pulls have their own deadline timers and are woken
# by arrivals), so a tiny shortPollingTimeMills must not make it spin.
SHORT_POLLING_RECHECK_INTERVAL_MIN_MS = 100

_WATCHED_ATTRIBUTE = "tidemq.broker.client_watch"


class ConsumptionServices:
    """Builds, registers, starts and stops the consumption side of ``broker``.

    Args:
        broker: the ``BrokerController`` (``config``, ``store_config``, ``store``,
            ``topic_config_manager``, ``broker_address``, ``stats``).
        clock_ms: a monotonic millisecond clock for channel expiry and lock leases (tests
            inject one).

    Raises:
        ConfigFileCorrupt: consumerOffset.json or subscriptionGroup.json and their .bak
            copies are unreadable.
    """

    def __init__(self, broker: Any, *, clock_ms: Callable[[], int] | None = None) -> None:
        self.broker = broker
        # Public so a test can swap in a fake clock after the controller built us; the
        # managers read it through ``_now_ms`` on every use.
        self.clock_ms: Callable[[], int] = clock_ms or monotonic_ms
        config = broker.config
        config_dir = Path(broker.store_config.store_path_root_dir) / "config"
        self.consumer_offset_manager = ConsumerOffsetManager(config_dir / "consumerOffset.json")
        self.subscription_group_manager = SubscriptionGroupManager(
            config_dir / "subscriptionGroup.json", config
        )
        self.consumer_manager = ConsumerManager(
            self._notify_group_changed, self._now_ms,
            channel_expired_ms=config.channel_expired_timeout_ms,
        )
        self.producer_manager = ProducerManager(
            self._now_ms, channel_expired_ms=config.channel_expired_timeout_ms
        )
        self.lock_manager = RebalanceLockManager(clock_ms=self._now_ms)
        self.consumer_filter_table = ConsumerFilterTable()
        self.pull_processor = PullMessageProcessor(self)
        self.pull_hold_service = PullRequestHoldService(
            broker.store,
            self.pull_processor.process,
            recheck_interval_ms=(
                LONG_POLLING_RECHECK_INTERVAL_MS if config.long_polling_enable
                else max(config.short_polling_time_ms, SHORT_POLLING_RECHECK_INTERVAL_MIN_MS)
            ),
        )
        self.client_processor = ClientManageProcessor(self)
        self.offset_processor = ConsumerOffsetProcessor(self)
        self.query_processor = QueryMessageProcessor(self)
        self.lock_processor = LockBatchProcessor(self.lock_manager)
        self._tasks: list[asyncio.Task[None]] = []
        self._notifications: set[asyncio.Task[None]] = set()
        self._listening = False
        broker.consumer_offset_manager = self.consumer_offset_manager
        broker.subscription_group_manager = self.subscription_group_manager
        broker.consumer_manager = self.consumer_manager
        broker.producer_manager = self.producer_manager
        broker.pull_hold_service = self.pull_hold_service
        broker.lock_manager = self.lock_manager
        broker.consumer_filter_table = self.consumer_filter_table

    def register(self, server: RemotingServer) -> None:
        """Register the consumption processors on ``server``."""
        clients = self.client_processor
        offsets = self.offset_processor
        queries = self.query_processor
        locks = self.lock_processor
        routes = {
            RequestCode.PULL_MESSAGE: self.pull_processor.handle,
            RequestCode.HEART_BEAT: clients.heart_beat,
            RequestCode.UNREGISTER_CLIENT: clients.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: clients.get_consumer_list_by_group,
            RequestCode.CHECK_CLIENT_CONFIG: clients.check_client_config,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: clients.get_consumer_connection_list,
            RequestCode.GET_PRODUCER_CONNECTION_LIST: clients.get_producer_connection_list,
            RequestCode.QUERY_CONSUMER_OFFSET: offsets.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: offsets.update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: offsets.get_max_offset,
            RequestCode.GET_MIN_OFFSET: offsets.get_min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: offsets.search_offset_by_timestamp,
            RequestCode.GET_EARLIEST_MSG_STORETIME: offsets.get_earliest_msg_storetime,
            RequestCode.QUERY_MESSAGE: queries.query_message,
            RequestCode.VIEW_MESSAGE_BY_ID: queries.view_message_by_id,
            RequestCode.LOCK_BATCH_MQ: locks.lock_batch,
            RequestCode.UNLOCK_BATCH_MQ: locks.unlock_batch,
        }
        for code, handler in routes.items():
            server.register(code, handler)

    async def start(self) -> None:
        """Start long polling (store dispatch listener) and the periodic tasks."""
        await self.pull_hold_service.start()
        if not self._listening:
            self.broker.store.add_dispatch_listener(self.pull_hold_service.on_message_dispatched)
            self._listening = True
        loop = asyncio.get_running_loop()
        config = self.broker.config
        self._tasks = [
            loop.create_task(self._every(
                config.flush_consumer_offset_interval_ms, self.persist_offsets,
                "persisting consumer offsets",
            )),
            loop.create_task(self._every(
                CLIENT_CHANNEL_SCAN_INTERVAL_MS, self.scan_client_channels,
                "scanning client channels",
            )),
        ]

    async def shutdown(self) -> None:
        """Stop the periodic tasks, answer parked pulls and persist the offsets."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.pull_hold_service.stop()
        notifications = list(self._notifications)
        if notifications:
            await asyncio.wait(notifications, timeout=1.0)
        await self.persist_offsets()

    async def persist_offsets(self) -> None:
        """Write consumerOffset.json if offsets changed since the last write.

        The snapshot is taken on the loop; the file write and fsync run in a worker thread.
        """
        snapshot = self.consumer_offset_manager.snapshot_if_dirty()
        if snapshot is not None:
            await asyncio.to_thread(self.consumer_offset_manager.write_snapshot, snapshot)

    def record_get(self, message_count: int) -> None:
        """Count messages handed out by pulls in the broker's statistics."""
        stats = getattr(self.broker, "stats", None)
        if stats is not None:
            stats.record_get(message_count)

    def watch_connection(self, connection: Connection) -> None:
        """Drop the connection from every client group at once when it closes."""
        if connection.attributes.get(_WATCHED_ATTRIBUTE):
            return
        connection.attributes[_WATCHED_ATTRIBUTE] = True
        connection.on_close.append(self._connection_closed)

    def scan_client_channels(self) -> None:
        """Drop consumers and producers silent for channelExpiredTimeout and close their
        connections, and forget run-out queue locks (runs every 10 s; public for tests)."""
        expired = self.consumer_manager.scan_expired() + self.producer_manager.scan_expired()
        for channel in expired:
            channel.connection.close(
                f"no heartbeat for {self.broker.config.channel_expired_timeout_ms} ms "
                "(channelExpiredTimeout)"
            )
        self.lock_manager.purge_expired()

    # -- internals ----------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return self.clock_ms()

    def _connection_closed(self, connection: Connection) -> None:
        self.consumer_manager.connection_closed(connection)
        self.producer_manager.connection_closed(connection)

    def _notify_group_changed(self, group: str, connections: list[Connection]) -> None:
        """Tell every member of ``group`` to rebalance (NOTIFY_CONSUMER_IDS_CHANGED, oneway)."""
        if not self.broker.config.notify_consumer_ids_changed_enable or not connections:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            log.debug("no event loop to notify group %s on", group)
            return
        ext_fields = NotifyConsumerIdsChangedRequestHeader(consumer_group=group).to_ext_fields()
        for connection in connections:
            if connection.is_closing:
                continue
            command = RemotingCommand.request(
                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext_fields, oneway=True
            )
            task = loop.create_task(_send_oneway(connection, command, group))
            self._notifications.add(task)
            task.add_done_callback(self._notifications.discard)

    async def _every(self, interval_ms: int, action: Callable[[], Any], what: str) -> None:
        interval_s = interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                outcome = action()
                if asyncio.iscoroutine(outcome):
                    await outcome
            except Exception:
                log.exception("%s failed; trying again in %g s", what, interval_s)


async def _send_oneway(connection: Connection, command: RemotingCommand, group: str) -> None:
    try:
        await connection.send_oneway(command)
    except RemotingError as e:
        log.info("could not tell %s that group %s changed: %s", connection.remote_address,
                 group, e)
    except Exception:
        log.exception("telling %s that group %s changed failed", connection.remote_address,
                      group)

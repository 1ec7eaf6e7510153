"""BrokerController: one broker's parts wired together, started and stopped in order.

Parts, in the order they are made:

- ``store``: the message store (a ``FileMessageStore`` under storePathRootDir unless one is
  given, e.g. a ``MemoryMessageStore`` in tests); its store host is brokerIP1:listenPort;
- ``topic_config_manager``: topics.json plus the built-in topics;
- ``server``: the remoting server on brokerIP1 at listenPort and listenPort - 2;
- ``schedule_service``: the delay levels' timers and delayOffset.json;
- ``transaction_service``: half messages, END_TRANSACTION and the transaction check task
  (broker/transaction/);
- the processors: sends (``send_processor``), send-backs of failed messages
  (``send_back_processor``), admin requests (``admin_processor``, the
  default for every code nobody else serves) and the consumption side
  (``consumption``: pulls, offsets, clients, queries, locks; it sets
  ``consumer_offset_manager``, ``subscription_group_manager``, ``consumer_manager``,
  ``producer_manager``, ``pull_hold_service`` and ``lock_manager`` on this object);
- ``registration``: REGISTER_BROKER to every name server (``namesrv_registration``).

``start``: listen, start the consumption services and the delay timers, register with the
name servers (once, waited for), then run the periodic work: registration every
registerNameServerPeriod, retention (``store.run_retention`` in a worker thread) every 10 s
and a statistics sample every second.

``shutdown``: stop the periodic work; stop accepting and let requests in flight finish;
unregister from the name servers; stop the consumption services (they persist offsets) and
the delay timers (they persist delay offsets); flush and close the store cleanly (so the
next start is a normal recovery).

Concurrency: everything runs on one event loop; the store is called from the loop thread
except for retention, which runs in a worker thread (the store serializes it with appends).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import struct
import time
from pathlib import Path
from typing import Any

from tidemq.broker.admin_processor import AdminProcessor
from tidemq.broker.config import BrokerConfig
from tidemq.broker.consumption import ConsumptionServices
from tidemq.broker.namesrv_registration import NameServerRegistration
from tidemq.broker.runtime_info import SAMPLE_INTERVAL_MS, BrokerStats
from tidemq.broker.schedule_service import ScheduleMessageService
from tidemq.broker.send_back_processor import SendBackProcessor
from tidemq.broker.send_processor import SendMessageProcessor
from tidemq.broker.topic_config_manager import TopicConfigManager
from tidemq.broker.transaction import TransactionService
from tidemq.protocol.message import POSITION_SYSFLAG, store_timestamp_position
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.server import RemotingServer
from tidemq.store.config import StoreConfig
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import MessageStore

log = logging.getLogger("tidemq.broker")

# RocketMQ runs its clean-expired-files service every 10 s (cleanResourceInterval).
RETENTION_INTERVAL_S = 10.0

# Requests in flight at shutdown get this long to finish before they are cancelled.
SHUTDOWN_GRACE_S = 5.0

CONFIG_DIR_NAME = "config"

_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


class BrokerController:
    """One broker: store, topics, remoting server, processors and name-server registration.

    Args:
        config: the broker's settings.
        store_config: the store's settings; its ``store_host`` is replaced by
            brokerIP1:listenPort, which every stored record and offset msg id carries.
        store: an open store to use instead of opening a ``FileMessageStore``; the
            controller closes it at shutdown.

    Raises:
        StoreLocked: another process holds the store directory.
        ConfigError / StoreError: the store or a config file cannot be opened.
    """

    def __init__(
        self,
        config: BrokerConfig,
        store_config: StoreConfig,
        *,
        store: MessageStore | None = None,
    ) -> None:
        self.config = config
        self.store_config = dataclasses.replace(store_config, store_host=config.broker_address)
        self.broker_address = config.broker_address
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stats = BrokerStats()
        self.config_dir = Path(self.store_config.store_path_root_dir) / CONFIG_DIR_NAME
        self.config_dir.mkdir(parents=True, exist_ok=True)
        if store is None:
            store = FileMessageStore(self.store_config)
        self.store: MessageStore = store
        try:
            self.topic_config_manager = TopicConfigManager(
                config, self.config_dir, on_change=self._topics_changed
            )
            self.server = RemotingServer(config.broker_ip1, config.listen_ports)
            self.remoting_client = RemotingClient()
            self.registration = NameServerRegistration(self, self.remoting_client)
            self.schedule_service = ScheduleMessageService(self)
            self.send_processor = SendMessageProcessor(self)
            self.send_back_processor = SendBackProcessor(self)
            self.admin_processor = AdminProcessor(self)
            # Sets consumer_offset_manager, subscription_group_manager, consumer_manager,
            # producer_manager, pull_hold_service and lock_manager on self.
            self.consumption = ConsumptionServices(self)
            self.transaction_service = TransactionService(self)
            self.register_processors(self.server)
        except BaseException:
            self.store.close()
            raise
        self._tasks: list[asyncio.Task[None]] = []
        self._retention_run: asyncio.Future[Any] | None = None
        self._started = False
        self._stopped = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, start the consumption services and register with the name servers.

        Raises:
            RemotingListenError: a port is in use (the message names it and listenPort).
        """
        if self._started:
            raise RuntimeError("BrokerController.start called twice")
        self._started = True
        self.loop = asyncio.get_running_loop()
        try:
            await self.server.start()
            if self.config.listen_port == 0:  # a test asked for any free port
                self.broker_address = f"{self.config.broker_ip1}:{self.server.bound_ports[0]}"
            await self.consumption.start()
            await self.schedule_service.start()
            await self.transaction_service.start()
            self._tasks.append(self.loop.create_task(self._retention_loop(), name="retention"))
            self._tasks.append(self.loop.create_task(self._stats_loop(), name="broker-stats"))
            await self.registration.start()
        except BaseException:
            await self.shutdown()
            raise
        log.info(
            "broker %s (cluster %s) started at %s, store %s",
            self.config.broker_name,
            self.config.broker_cluster_name,
            self.broker_address,
            self.store_config.store_path_root_dir,
        )

    async def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop serving and close the store cleanly. Safe to call more than once.

        Requests in flight get ``grace_s`` to finish; then the broker unregisters from the
        name servers, persists offsets and flushes and closes the store.
        """
        if self._stopped:
            return
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.registration.stop()
        await self.server.stop(grace_s)
        if self.registration.rounds_completed:
            await self.registration.unregister_all()
        if self._started:
            await self.consumption.shutdown()
            await self.schedule_service.shutdown()
            await self.transaction_service.shutdown()
        if self._retention_run is not None:
            # The worker thread cannot be cancelled; the store must not close under it.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._retention_run)
        self.store.close()
        await self.remoting_client.close()
        log.info("broker %s stopped", self.config.broker_name)

    async def __aenter__(self) -> BrokerController:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    def register_processors(self, server: Any) -> None:
        """Register every request handler of this broker on ``server``.

        ``server`` is anything with RemotingServer's ``register(code, handler)`` and
        ``register_default(handler)``; tests pass a table to call handlers directly.
        """
        self.send_processor.register(server)
        self.send_back_processor.register(server)
        self.transaction_service.register(server)
        self.consumption.register(server)
        self.admin_processor.register(server)  # the default: every code nobody else serves

    @property
    def ha_server_address(self) -> str:
        """``brokerIP2:haListenPort`` (haListenPort = the bound listenPort + 1 unless set)."""
        config = self.config
        if config.ha_listen_port is not None:
            return config.ha_server_address
        port = int(self.broker_address.rpartition(":")[2]) + 1
        return f"{config.broker_ip2 or config.broker_ip1}:{port}"

    @property
    def started(self) -> bool:
        """True once ``start`` was called."""
        return self._started

    @property
    def stopped(self) -> bool:
        """True once ``shutdown`` was called."""
        return self._stopped

    # -- operations used by the processors -------------------------------------------------

    async def register_with_name_servers(self) -> None:
        """Register with every name server now and wait for the round (topic created)."""
        await self.registration.register_all()

    def delete_topic(self, topic: str) -> None:
        """Forget ``topic``: its config, its consume queues and every group's offsets in it."""
        self.topic_config_manager.delete(topic)
        self.store.delete_topic(topic)
        self.consumer_offset_manager.remove_topic(topic)
        log.info("topic %s deleted from broker %s", topic, self.config.broker_name)

    def delay_offset_json(self) -> bytes:
        """delayOffset.json's content: the delay scheduler's progress per level."""
        return self.schedule_service.delay_offset_json()

    def earliest_commit_log_time_ms(self) -> int:
        """Store time of the oldest record still in the commit log; 0 when it is empty."""
        record = self.store.read_message(self.store.commit_log_min_offset())
        if record is None or len(record) < 64:
            return 0
        sysflag = _INT32.unpack_from(record, POSITION_SYSFLAG)[0]
        return _INT64.unpack_from(record, store_timestamp_position(sysflag))[0]

    # -- internals -------------------------------------------------------------------------

    def _topics_changed(self) -> None:
        # Called by the topic manager on the loop thread; before start there is no one to
        # tell (start registers the whole table anyway).
        if self._started and not self._stopped:
            self.registration.trigger()

    async def _retention_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(RETENTION_INTERVAL_S)
            now_ms = time.time_ns() // 1_000_000
            run = loop.run_in_executor(None, self.store.run_retention, now_ms)
            self._retention_run = run  # left set if we are cancelled: shutdown awaits it
            try:
                deleted = await asyncio.shield(run)
            except Exception:
                self._retention_run = None
                log.exception("retention run failed; retrying in %g s", RETENTION_INTERVAL_S)
                continue
            self._retention_run = None
            if deleted:
                log.info("retention deleted %d expired commit-log segment(s)", deleted)

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL_MS / 1000)
            self.stats.sample()

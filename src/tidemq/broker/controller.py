"""BrokerController: one broker's parts wired together, started and stopped in order.

The controller is the only place that knows every part. In ``__init__`` it

1. assembles the typed parts once (``BrokerParts.assemble``, parts.py: config, store,
   identity, role, stats, topic / offset / subscription-group tables, clients, locks, pull
   holds), the store being a ``FileMessageStore`` under storePathRootDir unless one is given
   (e.g. a ``MemoryMessageStore`` in tests), its store host brokerIP1:listenPort;
2. builds the services on them: the remoting server on brokerIP1 at listenPort and
   listenPort - 2 (TLS per the tls* keys; with aclEnable, ``acl`` checks every request
   before any processor, tidemq/acl/), name-server registration (``registration``), the
   delay levels' timers (``schedule_service``), transactions (``transaction_service``,
   broker/transaction/), exactly-once batches on them (``exactly_once``, broker/exactly_once/) and
   the consumption side's background work (``consumption``) and, on a slave, the copying
   of its master's tables (``slave_sync``);
3. builds each processor with exactly the parts it uses, and registers them.

No part or processor sees the controller; the controller's own attributes (``store``,
``topic_config_manager``, ``consumer_offset_manager``, ...) are the parts it assembled,
named for operators' tools and tests.

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
import time
from typing import Any

from tidemq.acl.acl_file import acl_file_of
from tidemq.acl.admin_requests import AclAdminProcessor
from tidemq.acl.service import AclService
from tidemq.broker.admin_processor import AdminProcessor
from tidemq.broker.background_saver import BackgroundSaver
from tidemq.broker.client_admin import ClientAdmin
from tidemq.broker.client_processor import ClientManageProcessor
from tidemq.broker.config import BrokerConfig
from tidemq.broker.consumption import ConsumptionServices
from tidemq.broker.controller_agent import ControllerAgent
from tidemq.broker.exactly_once.processor import ExactlyOnceProcessor
from tidemq.broker.exactly_once.service import ExactlyOnceService
from tidemq.broker.group_names import GroupNameChecked
from tidemq.broker.ha.flush_waits import settle_ready
from tidemq.broker.lock_manager import LockBatchProcessor
from tidemq.broker.maintenance_processor import MaintenanceProcessor
from tidemq.broker.metrics import broker_exporter
from tidemq.broker.namesrv_registration import NameServerRegistration
from tidemq.broker.offset_processor import ConsumerOffsetProcessor
from tidemq.broker.outgoing import outgoing_security
from tidemq.broker.parts import BrokerParts
from tidemq.broker.pull_processor import PullMessageProcessor
from tidemq.broker.query_processor import QueryMessageProcessor
from tidemq.broker.reply_processor import ReplyMessageProcessor
from tidemq.broker.role import ReplicationRole
from tidemq.broker.role_processor import RoleProcessor
from tidemq.broker.runtime_info import SAMPLE_INTERVAL_MS
from tidemq.broker.schedule_service import ScheduleMessageService
from tidemq.broker.send_back_processor import SendBackProcessor
from tidemq.broker.send_processor import SendMessageProcessor
from tidemq.broker.slave_sync import SlaveSynchronizer
from tidemq.broker.transaction import TransactionService
from tidemq.errors import TidemqError
from tidemq.metrics.exporter import MetricsExporter
from tidemq.metrics.requests import RequestMetrics
from tidemq.protocol.headers import MESSAGE_PATH_HEADERS, compile_codecs
from tidemq.remoting.server import RemotingServer
from tidemq.store.config import StoreConfig
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import MessageStore

log = logging.getLogger("tidemq.broker")

# RocketMQ runs its clean-expired-files service every 10 s (cleanResourceInterval).
RETENTION_INTERVAL_S = 10.0

# Requests in flight at shutdown get this long to finish before they are cancelled.
SHUTDOWN_GRACE_S = 5.0


class BrokerController:
    """One broker: its parts, remoting server, processors and name-server registration.

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
        if config.enable_controller_mode:
            # A master fenced by a lost lease stays up while every sync-state member reports
            # on the HA stream within the fence window (controller_agent.py): slaves report
            # at least every brokerHeartbeatInterval so those reports are fresh.
            heartbeat_ms = min(self.store_config.ha_send_heartbeat_interval_ms,
                               config.broker_heartbeat_interval_ms)
            self.store_config = dataclasses.replace(
                self.store_config, ha_send_heartbeat_interval_ms=heartbeat_ms)
        self.loop: asyncio.AbstractEventLoop | None = None
        if store is None:
            store = FileMessageStore(self.store_config)
        self.store: MessageStore = store
        self._tasks: list[asyncio.Task[None]] = []
        self._retention_run: asyncio.Future[Any] | None = None
        self._started = False
        self._stopped = False
        try:
            self._assemble(store)
        except BaseException:
            self.store.close()
            raise

    def _assemble(self, store: MessageStore) -> None:
        """Make the parts, the services on them and the processors (module docstring)."""
        parts = BrokerParts.assemble(
            self.config, self.store_config, store, on_topics_changed=self._topics_changed
        )
        self.parts = parts
        # The parts under the names operators' tools and tests know them by.
        self.identity = parts.identity
        self.role = parts.role
        self.stats = parts.stats
        self.config_dir = parts.config_dir
        self.topic_config_manager = parts.topics
        self.topics_saver = BackgroundSaver(
            parts.topics.snapshot_if_dirty, parts.topics.write_snapshot, "topics.json")
        self.groups_saver = BackgroundSaver(
            parts.groups.snapshot_if_dirty, parts.groups.write_snapshot, "subscriptionGroup.json")
        self.consumer_offset_manager = parts.offsets
        self.subscription_group_manager = parts.groups
        self.clients = parts.clients
        self.consumer_manager = parts.clients.consumers
        self.producer_manager = parts.clients.producers
        self.consumer_filter_table = parts.clients.filters
        self.lock_manager = parts.locks
        self.pull_hold_service = parts.pull_holds

        # ACL (a missing or broken file stops the start here) and TLS, both from the config.
        self.acl = (AclService(acl_file_of(self.config.acl_file_path))
                    if self.config.acl_enable else None)
        self.server = RemotingServer(self.config.broker_ip1, self.config.listen_ports,
                                     tls=self.config.server_tls())
        if self.acl is not None:
            self.server.set_request_guard(self.acl.guard)
        # The broker's own requests (registration, a slave's table sync) follow its
        # tlsClient* keys and innerClientAuthenticationCredentials (broker/outgoing.py).
        self.remoting_client = outgoing_security(self.config).remoting_client()
        self.registration = NameServerRegistration(
            config=parts.config, identity=parts.identity, role=parts.role, topics=parts.topics,
            client=self.remoting_client,
        )
        self.schedule_service = ScheduleMessageService(
            config=parts.config, store_config=parts.store_config, store=parts.store,
            role=parts.role, config_dir=parts.config_dir,
        )
        self.transaction_service = TransactionService(
            config=parts.config, store=parts.store, role=parts.role, stats=parts.stats,
            topics=parts.topics, producers=parts.clients.producers,
            schedule=self.schedule_service, config_dir=parts.config_dir,
            batches=lambda ledger: ExactlyOnceService(ledger, parts.config_dir),
        )
        exactly_once = self.transaction_service.batches
        assert isinstance(exactly_once, ExactlyOnceService)
        self.exactly_once = exactly_once
        self.consumption = ConsumptionServices(
            config=parts.config, store=parts.store, offsets=parts.offsets,
            clients=parts.clients, locks=parts.locks, pull_holds=parts.pull_holds,
        )
        # A slave copies its master's tables every 10 s (slave_sync.py).
        self.slave_sync = SlaveSynchronizer(
            role=parts.role, topics=parts.topics, offsets=parts.offsets, groups=parts.groups,
            schedule=self.schedule_service, client=self.remoting_client,
        ) if parts.role.is_slave else None
        # Controller mode (docs/failover.md): etcd decides the role; fenced until it has.
        self.controller_agent: ControllerAgent | None = None
        if parts.config.enable_controller_mode:
            self.controller_agent = ControllerAgent(
                parts.config, parts.role, parts.store, parts.identity,
                parts.store_config.ha_max_gap_not_in_sync)
            parts.role.fence("waiting for the controller's decision (enableControllerMode)")
            if parts.role.replication is not None:
                parts.role.replication.set_ack_policy(self.controller_agent.policy.ack_offset)
        # Role switches (issue 12, role.py): re-register, start or stop the table copy.
        parts.role.add_switch_listener(self._role_switched)
        self._processors = self._make_processors(parts)
        self.register_processors(self.server)
        # Prometheus metrics (metricsExporterType=PROM): broker/metrics.py.
        self.metrics_exporter: MetricsExporter | None = None
        if parts.config.metrics_exporter_type == "PROM":
            requests = RequestMetrics("tidemq_broker")
            self.server.set_request_observer(requests.observe)
            self.metrics_exporter = broker_exporter(
                parts, lambda: len(self.server.connections), requests)

    def _make_processors(self, parts: BrokerParts) -> list[Any]:
        """Every request processor, each given the parts it uses; the admin processor, the
        default for every code nobody else serves, comes last."""
        self.send_processor = SendMessageProcessor(
            config=parts.config, store_config=parts.store_config, store=parts.store,
            identity=parts.identity, role=parts.role, stats=parts.stats, topics=parts.topics,
            groups=parts.groups, schedule=self.schedule_service,
            transactions=self.transaction_service, exactly_once=self.exactly_once,
            pull_holds=parts.pull_holds,
        )
        self.send_back_processor = SendBackProcessor(
            config=parts.config, store=parts.store, identity=parts.identity, role=parts.role,
            topics=parts.topics, groups=parts.groups, schedule=self.schedule_service,
            register_topics=self.registration.register_topics,
        )
        self.pull_processor = PullMessageProcessor(
            config=parts.config, store=parts.store, identity=parts.identity, role=parts.role,
            stats=parts.stats, topics=parts.topics, groups=parts.groups,
            offsets=parts.offsets, clients=parts.clients, pull_holds=parts.pull_holds,
        )
        self.client_processor = ClientManageProcessor(
            config=parts.config, topics=parts.topics, groups=parts.groups,
            clients=parts.clients,
        )
        self.offset_processor = ConsumerOffsetProcessor(store=parts.store, offsets=parts.offsets)
        self.query_processor = QueryMessageProcessor(config=parts.config, store=parts.store)
        self.lock_processor = LockBatchProcessor(parts.locks)
        client_admin = ClientAdmin(
            config=parts.config, store=parts.store, topics=parts.topics,
            offsets=parts.offsets, clients=parts.clients,
        )
        self.admin_processor = AdminProcessor(
            config=parts.config, store_config=parts.store_config, store=parts.store,
            identity=parts.identity, role=parts.role, stats=parts.stats, topics=parts.topics,
            groups=parts.groups, offsets=parts.offsets, schedule=self.schedule_service,
            registration=self.registration, client_admin=client_admin,
        )
        self.acl_admin_processor = AclAdminProcessor(self.acl, self._describe_for_acl)
        self.reply_processor = ReplyMessageProcessor(
            config=parts.config, identity=parts.identity, producers=parts.clients.producers,
            send=self.send_processor,
        )
        self.maintenance_processor = MaintenanceProcessor(
            config=parts.config, store_config=parts.store_config, store=parts.store,
            topics=parts.topics, registration=self.registration, config_dir=parts.config_dir,
        )
        return [
            self.send_processor, self.send_back_processor, self.transaction_service,
            ExactlyOnceProcessor(
                eos=self.exactly_once, role=parts.role, ready=self.transaction_service.ready,
            ),
            self.pull_processor, self.client_processor, self.offset_processor,
            self.query_processor, self.lock_processor, self.acl_admin_processor,
            self.maintenance_processor, self.reply_processor,
            RoleProcessor(role=parts.role, identity=parts.identity, store=parts.store),
            self.admin_processor,
        ]

    def _describe_for_acl(self) -> tuple[str, str, str]:
        return self.identity.address, self.config.broker_name, self.config.broker_cluster_name

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
        # SYNC_FLUSH: a sync's answer reaches the loop without a store thread taking the GIL,
        # and its sends are answered as soon as it is read, not after the callbacks already
        # queued on the loop (an iteration's batch append, ~0.3 ms a batch).
        loop = self.loop
        self.store.answer_syncs_on_loop(loop.add_reader, loop.remove_reader,
                                        lambda: settle_ready(loop))
        # The first message should cost what later ones do: its index file (~10 ms on the
        # loop, made lazily) is made now, and its slot pages faulted in by a thread; the
        # queue-file thread is started (2 ms on a new topic's first send) and the send and
        # pull headers' codecs compiled (~0.3-1 ms each at their first request).
        compile_codecs(*MESSAGE_PATH_HEADERS)
        try:
            self.store.prepare_for_writes()
        except TidemqError as exc:  # a full disk: the writes will say so too
            log.warning("could not prepare the store's first files ahead: %s", exc)
        try:
            await self.server.start()
            if self.config.listen_port == 0:  # a test asked for any free port
                self.identity.bound(self.server.bound_ports[0])
            # topics.json and subscriptionGroup.json are written in the background from now
            # on, many changes a save; an admin's change waits for its save (group commit,
            # background_saver.py).
            self.topics_saver.start()
            self.topic_config_manager.defer_persistence(
                self.topics_saver.schedule, self.topics_saver.saved)
            self.groups_saver.start()
            self.subscription_group_manager.defer_persistence(
                self.groups_saver.schedule, self.groups_saver.saved)
            if self.acl is not None:
                self.acl.start()
            if self.role.replication is not None:
                await self.role.replication.start()
            await self.consumption.start()
            await self.schedule_service.start()
            await self.transaction_service.start()
            self._tasks.append(self.loop.create_task(self._retention_loop(), name="retention"))
            self._tasks.append(self.loop.create_task(self._stats_loop(), name="broker-stats"))
            if self.controller_agent is not None:
                # Before registering: a broker's first registration carries its decided role.
                await self.controller_agent.start()
            await self.registration.start()
            if self.role.is_slave or self.slave_sync is not None:
                await self._follow_role_tables()
            if self.metrics_exporter is not None:
                await self.metrics_exporter.start()
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
        if self.controller_agent is not None:
            # First: fence and give the lease back, so a controller elects at once.
            await self.controller_agent.stop()
        if self.metrics_exporter is not None:
            await self.metrics_exporter.stop()
        if self.slave_sync is not None:
            await self.slave_sync.stop()
        await self.registration.stop()
        if self.acl is not None:
            await self.acl.stop()
        await self.server.stop(grace_s)
        if self.registration.rounds_completed:
            await self.registration.unregister_all()
        if self._started:
            await self.consumption.shutdown()
            await self.schedule_service.shutdown()
            await self.transaction_service.shutdown()
        if self.role.replication is not None:
            await self.role.replication.stop()
        self.topic_config_manager.defer_persistence(None)
        await self.topics_saver.stop()  # writes what changed since its last save
        self.subscription_group_manager.defer_persistence(None)
        await self.groups_saver.stop()
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
        checked = GroupNameChecked(server)  # group names checked before any handler
        for processor in self._processors:
            processor.register(checked)

    @property
    def broker_address(self) -> str:
        """``brokerIP1:listenPort``, the port as bound once started."""
        return self.identity.address

    @property
    def ha_server_address(self) -> str:
        """``brokerIP2:haListenPort`` (haListenPort = the bound listenPort + 1 unless set)."""
        return self.identity.ha_server_address

    @property
    def started(self) -> bool:
        """True once ``start`` was called."""
        return self._started

    @property
    def stopped(self) -> bool:
        """True once ``shutdown`` was called."""
        return self._stopped

    # -- internals -------------------------------------------------------------------------

    def _topics_changed(self, topics: tuple[str, ...] | None) -> None:
        # Called by the topic manager on the loop thread with the topics created or changed
        # (None: removed); before start there is no one to tell (start registers the whole
        # table anyway).
        if self._started and not self._stopped:
            self.registration.trigger(topics)

    async def _role_switched(self, role: ReplicationRole) -> None:
        # After become_master / become_slave (role.py): a slave copies its master's tables
        # while a master does not, a master runs the delay timers and the transaction check
        # while a slave does not, and the name servers
        # learn the new brokerId (a new master is id 0; the name server drops the address's
        # old id). Before registration started (a controller-mode broker decides its role
        # first) its first round carries it.
        if not self._started or self._stopped:
            return
        await self._follow_role_tables()
        await self.schedule_service.follow_role()
        await self.transaction_service.follow_role()
        if self.registration.running:
            await self.registration.register_all()

    async def _follow_role_tables(self) -> None:
        self.consumer_offset_manager.set_remember_local_commits(self.role.is_slave)
        if self.role.is_slave:
            if self.slave_sync is None:
                parts = self.parts
                self.slave_sync = SlaveSynchronizer(
                    role=parts.role, topics=parts.topics, offsets=parts.offsets,
                    groups=parts.groups, schedule=self.schedule_service,
                    client=self.remoting_client,
                )
            await self.slave_sync.start()
        elif self.slave_sync is not None:
            await self.slave_sync.stop()

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

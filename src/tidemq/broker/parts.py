"""BrokerParts: the typed parts one broker is built from, made once by the controller.

Each processor and service takes only the parts it uses, by name and type, in its
constructor; none of them sees the controller, and nothing sets attributes on another
object after it was built. The parts, lowest first:

    config, store_config   the settings (BrokerConfig, StoreConfig)
    store                  the message store (FileMessageStore, or MemoryMessageStore in tests)
    identity               names and the address served at (BrokerIdentity)
    role                   master or slave, what is known of the master (ReplicationRole)
    stats                  put/get counters (BrokerStats)
    topics                 topics.json and the built-in topics (TopicConfigManager)
    offsets                consumerOffset.json (ConsumerOffsetManager)
    groups                 subscriptionGroup.json (SubscriptionGroupManager)
    clients                connected consumers / producers, SQL92 filters (Clients)
    locks                  orderly consumers' queue leases (RebalanceLockManager)
    pull_holds             parked long-polling pulls (PullRequestHoldService)
    config_dir             <storePathRootDir>/config, where the JSON tables live

The services built on them (the delay scheduler, the transaction service, exactly-once
batches, name-server registration) are made by the controller next, and handed to the
processors that call them, again by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tidemq.broker.clients import Clients
from tidemq.broker.config import BrokerConfig
from tidemq.broker.consumer_offset_manager import ConsumerOffsetManager
from tidemq.broker.ha.replication import Replication
from tidemq.broker.identity import BrokerIdentity
from tidemq.broker.lock_manager import RebalanceLockManager
from tidemq.broker.outgoing import outgoing_security
from tidemq.broker.pull_hold_service import (
    LONG_POLLING_RECHECK_INTERVAL_MS,
    PullRequestHoldService,
)
from tidemq.broker.role import ReplicationRole
from tidemq.broker.runtime_info import BrokerStats
from tidemq.broker.subscription_group_manager import SubscriptionGroupManager
from tidemq.broker.topic_config_manager import TopicConfigManager
from tidemq.store.config import StoreConfig
from tidemq.store.interface import MessageStore
from tidemq.store.store_core import StoreCore

CONFIG_DIR_NAME = "config"

# The re-check is only a safety net (parked pulls have their own deadline timers and are woken
# by arrivals), so a tiny shortPollingTimeMills must not make it spin.
SHORT_POLLING_RECHECK_INTERVAL_MIN_MS = 100


@dataclass(frozen=True, slots=True)
class BrokerParts:
    """The parts of one broker (module docstring); built by ``assemble``."""

    config: BrokerConfig
    store_config: StoreConfig
    store: MessageStore
    identity: BrokerIdentity
    role: ReplicationRole
    stats: BrokerStats
    topics: TopicConfigManager
    offsets: ConsumerOffsetManager
    groups: SubscriptionGroupManager
    clients: Clients
    locks: RebalanceLockManager
    pull_holds: PullRequestHoldService
    config_dir: Path

    @classmethod
    def assemble(
        cls,
        config: BrokerConfig,
        store_config: StoreConfig,
        store: MessageStore,
        *,
        on_topics_changed: Callable[[tuple[str, ...] | None], None] | None = None,
    ) -> BrokerParts:
        """Make every part; the JSON tables are loaded from ``<storePathRootDir>/config``.

        Raises:
            ConfigFileCorrupt: a table file and its .bak copy are both unreadable.
        """
        config_dir = Path(store_config.store_path_root_dir) / CONFIG_DIR_NAME
        config_dir.mkdir(parents=True, exist_ok=True)
        identity = BrokerIdentity(config)
        role = ReplicationRole(
            config, identity, _replication(config, store_config, store),
            store_config.sync_flush_timeout_ms,
            store=store if isinstance(store, StoreCore) else None,
        )
        clients = Clients(config)
        recheck_ms = (
            LONG_POLLING_RECHECK_INTERVAL_MS if config.long_polling_enable
            else max(config.short_polling_time_ms, SHORT_POLLING_RECHECK_INTERVAL_MIN_MS)
        )
        return cls(
            config=config,
            store_config=store_config,
            store=store,
            identity=identity,
            role=role,
            stats=BrokerStats(),
            topics=TopicConfigManager(config, config_dir, on_change=on_topics_changed),
            # A slave remembers what consumers commit to it (slave_sync.py hands it back).
            offsets=ConsumerOffsetManager(
                config_dir / "consumerOffset.json", remember_local_commits=role.is_slave
            ),
            groups=SubscriptionGroupManager(config_dir / "subscriptionGroup.json", config),
            clients=clients,
            locks=RebalanceLockManager(clock_ms=clients.now_ms),
            pull_holds=PullRequestHoldService(store, recheck_interval_ms=recheck_ms),
            config_dir=config_dir,
        )


def _replication(config: BrokerConfig, store_config: StoreConfig, store: MessageStore
                 ) -> Replication | None:
    """The HA side of the broker: where a master listens for slaves (brokerIP2 or brokerIP1,
    haListenPort or listenPort + 1; any free port when listenPort is 0, as in tests), in the
    broker's TLS mode; how a slave connects (its tlsClient* keys and credentials). Both are
    given whatever the configured role: a role switch (broker/role.py) makes a master of a
    slave and a slave of a master."""
    if not isinstance(store, StoreCore):
        return None  # a store without the replication API (none in tidemq today)
    port = config.ha_listen_port
    if port is None:
        port = config.listen_port + 1 if config.listen_port else 0
    return Replication(config, store_config, store, config.broker_ip2 or config.broker_ip1, port,
                       tls=config.server_tls(), outgoing=outgoing_security(config))

"""RouteInfoManager: the name server's tables of topics, brokers and clusters.

Theory of operation
-------------------
Brokers push their state here; clients pull routes. Five tables, all owned by the name
server's event loop (every method runs on it, so nothing is locked)::

    topic_queue_table    topic       -> {broker name -> QueueData}
    broker_addr_table    broker name -> BrokerData {cluster, broker name, {broker id -> addr}}
    cluster_addr_table   cluster     -> {broker names}
    broker_live_table    broker addr -> BrokerLiveInfo {last update ms, DataVersion,
                                                        connection, HA server addr}
    filter_server_table  broker addr -> [filter server addrs]   (legacy; normally empty)

A broker registers at start and every 30 s (REGISTER_BROKER). Every registration refreshes its
liveness; only a master's (broker id 0) registration changes topics, and only when its topic
table's DataVersion differs from the one last seen from that address or it is the first
registration of that id, so the 30-second re-registrations of an unchanged broker cost one
comparison. A broker leaves when it unregisters, when the connection it registered over
closes, or when it has not registered for ``broker_channel_expired_time_ms`` (found by a
periodic scan). Leaving removes its address; when a broker name has no address left, the
broker name leaves its cluster and every topic's queue data for it goes too, and a topic with
no queue data left is gone.

Several name servers run side by side without talking to each other: each broker registers
with all of them, so each builds the same tables on its own.

Time is passed in (``now_ms``) so tests drive expiry without sleeping.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from tidemq.namesrv.register_body import RegisterBrokerBody
from tidemq.namesrv.route_data import (
    MASTER_ID,
    PERM_READ,
    PERM_WRITE,
    BrokerData,
    ClusterInfo,
    DataVersion,
    QueueData,
    TopicRouteData,
)

log = logging.getLogger("tidemq.namesrv")


@dataclass(slots=True)
class BrokerLiveInfo:
    """When a broker address last registered, with what topic-table version, over what."""

    last_update_ms: int
    data_version: DataVersion
    connection: object | None
    ha_server_addr: str


@dataclass(frozen=True, slots=True)
class RegisterBrokerResult:
    """What a slave learns from registering: its master's address and HA address."""

    master_addr: str | None = None
    ha_server_addr: str | None = None


class RouteInfoManager:
    """The route tables (see the module docstring); one per name server."""

    def __init__(self) -> None:
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}
        self.filter_server_table: dict[str, list[str]] = {}

    # -- brokers -------------------------------------------------------------------------------

    def register_broker(
        self,
        *,
        cluster_name: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str,
        body: RegisterBrokerBody,
        connection: object | None,
        now_ms: int,
        delete_missing_topics: bool = False,
    ) -> RegisterBrokerResult:
        """Record a broker's registration (REGISTER_BROKER).

        Args:
            body: the broker's topic table and its DataVersion.
            connection: what the registration arrived over; when it closes, call
                ``connection_closed`` with it.
            delete_missing_topics: a master whose topic table changed also leaves the topics
                it no longer lists (only when it sent its whole table, which lists the
                broker's own topic ``<brokerName>``; an incremental registration deletes
                nothing).

        Returns:
            For a slave whose master (id 0 of the same broker name) is live, the master's
            address and HA address; otherwise an empty result.
        """
        self.cluster_addr_table.setdefault(cluster_name, set()).add(broker_name)
        broker_data = self.broker_addr_table.get(broker_name)
        first_registration = broker_data is None
        if broker_data is None:
            broker_data = BrokerData(cluster_name, broker_name, {})
            self.broker_addr_table[broker_name] = broker_data
        # An address that changes role (slave promoted to master) must not stay listed
        # under its old id too.
        for stale_id in [i for i, a in broker_data.broker_addrs.items()
                         if a == broker_addr and i != broker_id]:
            del broker_data.broker_addrs[stale_id]
        previous_addr = broker_data.broker_addrs.get(broker_id)
        broker_data.broker_addrs[broker_id] = broker_addr
        if broker_id == MASTER_ID and previous_addr not in (None, broker_addr):
            # A failover or a manual switch: routes and slaves' answers name the new master.
            log.info("%s: master address change from %s to %s", broker_name, previous_addr,
                     broker_addr)
        first_registration = first_registration or previous_addr is None

        if broker_id == MASTER_ID and (
            first_registration or self.is_topic_config_changed(broker_addr, body.data_version)
        ):
            updated = 0
            for config in body.topic_configs.values():
                updated += self._update_queue_data(
                    config.topic_name,
                    QueueData(broker_name, config.read_queue_nums, config.write_queue_nums,
                              config.perm, config.topic_sys_flag),
                )
            if updated:
                log.info("%s: %d topic route(s) new or changed (%d topics registered)",
                         broker_name, updated, len(body.topic_configs))
            # Only a whole table says which topics are gone: a broker's whole table always
            # lists the built-in topic named after the broker, an increment (the topics
            # just created or changed, RocketMQ's registerIncrementBrokerData) does not.
            if delete_missing_topics and broker_name in body.topic_configs:
                self._remove_topics_not_listed(broker_name, body.topic_configs)

        previous_live = self.broker_live_table.get(broker_addr)
        self.broker_live_table[broker_addr] = BrokerLiveInfo(
            now_ms, body.data_version, connection, ha_server_addr
        )
        if previous_live is None:
            log.info("broker registered: %s %s id %d at %s (HA %s)", cluster_name, broker_name,
                     broker_id, broker_addr, ha_server_addr or "-")
        if body.filter_server_list:
            self.filter_server_table[broker_addr] = list(body.filter_server_list)
        else:
            self.filter_server_table.pop(broker_addr, None)

        if broker_id != MASTER_ID:
            master_addr = broker_data.broker_addrs.get(MASTER_ID)
            master_live = self.broker_live_table.get(master_addr) if master_addr else None
            if master_live is not None:
                return RegisterBrokerResult(master_addr, master_live.ha_server_addr)
        return RegisterBrokerResult()

    def unregister_broker(
        self, *, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int
    ) -> None:
        """Forget one broker id of a broker name (UNREGISTER_BROKER)."""
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        broker_data = self.broker_addr_table.get(broker_name)
        if broker_data is not None:
            broker_data.broker_addrs.pop(broker_id, None)
            if not broker_data.broker_addrs:
                del self.broker_addr_table[broker_name]
                self._remove_broker_names([broker_name])
        log.info("broker unregistered: %s %s id %d at %s", cluster_name, broker_name, broker_id,
                 broker_addr)

    def connection_closed(self, connection: object) -> list[str]:
        """Drop every broker address that registered over ``connection``, now closed.

        Returns:
            The broker addresses dropped (empty when none registered over it, or a newer
            connection of theirs has replaced it).
        """
        addrs = [addr for addr, live in self.broker_live_table.items()
                 if live.connection is connection]
        for addr in addrs:
            log.info("broker %s dropped: its connection closed", addr)
            self._remove_broker_addr(addr)
        return addrs

    def scan_not_active_brokers(self, now_ms: int, expired_time_ms: int) -> list[BrokerLiveInfo]:
        """Drop the brokers that have not registered for ``expired_time_ms``.

        Returns:
            The live info of each broker dropped, so the caller can close its connection.
        """
        expired = [(addr, live) for addr, live in self.broker_live_table.items()
                   if live.last_update_ms + expired_time_ms < now_ms]
        for addr, live in expired:
            log.warning("broker %s dropped: no registration for %d ms (brokerChannelExpiredTime"
                        "=%d)", addr, now_ms - live.last_update_ms, expired_time_ms)
            self._remove_broker_addr(addr)
        return [live for _, live in expired]

    def is_topic_config_changed(self, broker_addr: str, data_version: DataVersion) -> bool:
        """True when ``broker_addr`` is unknown or last registered another DataVersion."""
        live = self.broker_live_table.get(broker_addr)
        return live is None or live.data_version != data_version

    def data_version_of(self, broker_addr: str) -> DataVersion | None:
        """The DataVersion ``broker_addr`` last registered, or None when it is not live."""
        live = self.broker_live_table.get(broker_addr)
        return live.data_version if live is not None else None

    def touch_broker(self, broker_addr: str, now_ms: int) -> None:
        """Count a QUERY_DATA_VERSION with an unchanged version as a sign of life."""
        live = self.broker_live_table.get(broker_addr)
        if live is not None:
            live.last_update_ms = now_ms

    def live_broker_addrs(self) -> list[str]:
        """The addresses of the brokers currently live, sorted."""
        return sorted(self.broker_live_table)

    # -- routes and topics ---------------------------------------------------------------------

    def topic_route(self, topic: str) -> TopicRouteData | None:
        """The route of ``topic``, or None when no live broker serves it.

        The answer is a copy: later registrations do not change it.
        """
        queue_map = self.topic_queue_table.get(topic)
        if not queue_map:
            return None
        queue_datas = [QueueData(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm,
                                 q.topic_sys_flag)
                       for _, q in sorted(queue_map.items())]
        broker_datas = [self.broker_addr_table[name].copy() for name in sorted(queue_map)
                        if name in self.broker_addr_table]
        if not broker_datas:
            return None
        filter_servers = {
            addr: list(self.filter_server_table[addr])
            for broker in broker_datas
            for addr in broker.broker_addrs.values()
            if self.filter_server_table.get(addr)
        }
        return TopicRouteData(queue_datas, broker_datas, filter_servers)

    def cluster_info(self) -> ClusterInfo:
        """Every broker name and cluster (GET_BROKER_CLUSTER_INFO), as a copy."""
        return ClusterInfo(
            {name: broker.copy() for name, broker in sorted(self.broker_addr_table.items())},
            {cluster: sorted(names) for cluster, names in sorted(self.cluster_addr_table.items())},
        )

    def all_topics(self) -> list[str]:
        """Every topic some broker serves, sorted."""
        return sorted(self.topic_queue_table)

    def topics_by_cluster(self, cluster_name: str) -> list[str]:
        """The topics served by at least one broker name of ``cluster_name``, sorted."""
        names = self.cluster_addr_table.get(cluster_name, set())
        return sorted(topic for topic, queue_map in self.topic_queue_table.items()
                      if not names.isdisjoint(queue_map))

    def delete_topic(self, topic: str, cluster_name: str | None = None) -> bool:
        """Forget ``topic`` (DELETE_TOPIC_IN_NAMESRV), or only its queues in one cluster.

        Returns:
            True when something was removed.
        """
        queue_map = self.topic_queue_table.get(topic)
        if queue_map is None:
            return False
        if not cluster_name:
            del self.topic_queue_table[topic]
            return True
        names = self.cluster_addr_table.get(cluster_name, set())
        removed = [name for name in list(queue_map) if name in names]
        for name in removed:
            del queue_map[name]
        if not queue_map:
            del self.topic_queue_table[topic]
        return bool(removed)

    def wipe_write_perm(self, broker_name: str) -> int:
        """Take write permission from every topic of ``broker_name``; returns how many."""
        count = 0
        for queue_map in self.topic_queue_table.values():
            queue_data = queue_map.get(broker_name)
            if queue_data is not None:
                queue_data.perm &= ~PERM_WRITE
                count += 1
        return count

    def add_write_perm(self, broker_name: str) -> int:
        """Give every topic of ``broker_name`` read and write permission; returns how many."""
        count = 0
        for queue_map in self.topic_queue_table.values():
            queue_data = queue_map.get(broker_name)
            if queue_data is not None:
                queue_data.perm = PERM_READ | PERM_WRITE
                count += 1
        return count

    # -- internals -----------------------------------------------------------------------------

    def _update_queue_data(self, topic: str, queue_data: QueueData) -> bool:
        """Set one broker name's queue data of ``topic``; True when it is new or changed."""
        queue_map = self.topic_queue_table.setdefault(topic, {})
        previous = queue_map.get(queue_data.broker_name)
        queue_map[queue_data.broker_name] = queue_data
        if previous == queue_data:
            return False
        # Per topic at DEBUG: a broker with thousands of topics would flood the log at INFO.
        log.debug("topic route %s on %s: %s -> %s", topic, queue_data.broker_name, previous,
                  queue_data)
        return True

    def _remove_topics_not_listed(self, broker_name: str, listed: Iterable[str]) -> None:
        listed = set(listed)
        for topic in [t for t, queue_map in self.topic_queue_table.items()
                      if broker_name in queue_map and t not in listed]:
            queue_map = self.topic_queue_table[topic]
            del queue_map[broker_name]
            log.info("topic %s left %s: its registration no longer lists it", topic, broker_name)
            if not queue_map:
                del self.topic_queue_table[topic]

    def _remove_broker_addr(self, broker_addr: str) -> None:
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        gone: list[str] = []
        for name, broker_data in list(self.broker_addr_table.items()):
            for broker_id in [i for i, a in broker_data.broker_addrs.items() if a == broker_addr]:
                del broker_data.broker_addrs[broker_id]
            if not broker_data.broker_addrs:
                del self.broker_addr_table[name]
                gone.append(name)
        self._remove_broker_names(gone)

    def _remove_broker_names(self, broker_names: list[str]) -> None:
        """Take broker names with no address left out of their clusters and topics."""
        if not broker_names:
            return
        for cluster in list(self.cluster_addr_table):
            names = self.cluster_addr_table[cluster]
            names.difference_update(broker_names)
            if not names:
                del self.cluster_addr_table[cluster]
        for topic in list(self.topic_queue_table):
            queue_map = self.topic_queue_table[topic]
            for name in broker_names:
                queue_map.pop(name, None)
            if not queue_map:
                del self.topic_queue_table[topic]

"""Replication: the HA side of one broker, as its processors and operators see it.

- on a master (SYNC_MASTER or ASYNC_MASTER) it runs the HAService on haListenPort and, for a
  SYNC_MASTER, decides a waiting send's status (``replica_status``);
- on a slave it runs the HAClient, which copies the master's commit log;
- both give the HA keys of GET_BROKER_RUNTIME_INFO (``runtime_info``), which
  ``tidemq admin brokerStatus`` prints and ``clusterList`` reads.

SYNC_MASTER (docs/protocol.md, "Master/slave replication"): a send whose producer waits
(WAIT=true, the default) is answered PUT_OK once a slave acknowledged an offset at or past
the end of its bytes; FLUSH_SLAVE_TIMEOUT when none did within syncFlushTimeout;
SLAVE_NOT_AVAILABLE at once when no slave is in sync (none connected, or every one further
behind than haMaxGapNotInSync). All three mean "stored on the master". Under SYNC_FLUSH the
disk and the slave are waited for together; a disk timeout wins.

Owner: the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tidemq.broker.config import BrokerConfig, BrokerRole
from tidemq.broker.ha.flush_waits import Answer, answer_when_durable, durable_status
from tidemq.broker.ha.master import HAService, HASettings
from tidemq.broker.ha.master_check import MasterCheck, ReplicaStore
from tidemq.broker.ha.reconcile import Reconciler
from tidemq.broker.ha.slave import HAClient
from tidemq.broker.outgoing import PLAIN_UNSIGNED, OutgoingSecurity
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.errors import RemotingListenError
from tidemq.remoting.tls import PLAIN, ServerTls
from tidemq.store.config import StoreConfig
from tidemq.store.interface import PutResult, PutStatus
from tidemq.store.truncation import Truncation

log = logging.getLogger("tidemq.broker.ha")

# How much longer than syncFlushTimeout we wait for the store's own flush timer to answer.
_DURABLE_WAIT_MARGIN_S = 1.0


def ha_settings(store_config: StoreConfig) -> HASettings:
    """The HA keys of a store config as the HA parts take them."""
    return HASettings(
        transfer_batch_size=store_config.ha_transfer_batch_size,
        heartbeat_interval_s=store_config.ha_send_heartbeat_interval_ms / 1000,
        housekeeping_interval_s=store_config.ha_housekeeping_interval_ms / 1000,
        max_gap_not_in_sync=store_config.ha_max_gap_not_in_sync,
    )


class Replication:
    """HAService on a master, HAClient on a slave (module docstring).

    Args:
        config, store_config: the broker's settings (brokerRole, names, HA keys).
        store: the broker's store.
        ha_host, ha_port: where a master listens (brokerIP2 or brokerIP1, haListenPort;
            port 0: any free port, for tests).
        client: the remoting client for a slave's master check (None: one of its own,
            made by ``outgoing``, closed by ``stop``).
        tls: a master's TLS mode on the HA port (the broker's own, tlsServerMode).
        outgoing: how a slave connects and signs (TLS to the master's HA and remoting
            ports, innerClientAuthenticationCredentials; broker/outgoing.py).
    """

    def __init__(self, config: BrokerConfig, store_config: StoreConfig, store: ReplicaStore,
                 ha_host: str, ha_port: int, client: RemotingClient | None = None, *,
                 tls: ServerTls = PLAIN, outgoing: OutgoingSecurity = PLAIN_UNSIGNED) -> None:
        self.role = config.broker_role
        self._config = config
        self._store = store
        self._sync_flush_timeout_s = store_config.sync_flush_timeout_ms / 1000
        self._settings = ha_settings(store_config)
        self._ha_host = ha_host
        self._ha_port = ha_port
        self.service: HAService | None = None
        self._ack_policy: Callable[[list[Any]], int | None] | None = None
        self.client: HAClient | None = None
        self._remoting: RemotingClient | None = client
        self._own_client: RemotingClient | None = None
        self._listening = False
        self._started = False
        self._tls = tls
        self._outgoing = outgoing
        if self.role is BrokerRole.SLAVE:
            self.client = HAClient(store, self._master_check(), self._settings,
                                   store_config.ha_master_address, config.broker_name,
                                   tls=outgoing.tls)
        else:
            self.service = self._new_service()

    def _new_service(self) -> HAService:
        service = HAService(self._store, self._ha_host, self._ha_port, self._settings,
                            self._config.broker_name, tls=self._tls)
        service.ack_policy = self._ack_policy
        return service

    def set_ack_policy(self, policy: Callable[[list[Any]], int | None] | None) -> None:
        """Controller mode: a SYNC_MASTER send is acknowledged at ``policy(connections)``
        (the offset every sync-state member holds) instead of any one slave's offset; kept
        across role switches."""
        self._ack_policy = policy
        if self.service is not None:
            self.service.ack_policy = policy

    def _remoting_client(self) -> RemotingClient:
        if self._remoting is None:
            self._remoting = self._own_client = self._outgoing.remoting_client()
        return self._remoting

    def _master_check(self) -> MasterCheck:
        config = self._config
        return MasterCheck(self._remoting_client(), config.broker_name,
                           config.broker_cluster_name, self._store)

    async def start(self) -> None:
        """Listen (master) or start copying (slave).

        Raises:
            RemotingListenError: a master's HA port is taken (the message names haListenPort).
        """
        self._started = True
        if self.service is not None:
            await self._start_service(self.service)
        if self.client is not None:
            self.client.start()

    async def _start_service(self, service: HAService) -> None:
        try:
            await service.start()
        except OSError as e:
            raise RemotingListenError(
                f"cannot listen for slaves on {service.host}:{service.port}: "
                f"{e.strerror or e} (choose another haListenPort, or stop what holds it)"
            ) from e
        # A restarted service keeps its port: slaves and the name servers know it.
        self._ha_port = service.port
        add_listener = getattr(self._store, "add_append_listener", None)
        if add_listener is not None and not self._listening:
            self._listening = True
            add_listener(self.notify_appended)

    async def stop(self) -> None:
        """Stop streaming, close connections, fail waiting sends."""
        await self.stop_client()
        if self.service is not None:
            await self.service.stop()
        if self._own_client is not None:
            await self._own_client.close()

    # -- role switches (broker/role.py) ---------------------------------------------------------

    async def stop_client(self) -> None:
        """Stop copying from a master (a slave becoming master); no-op on a master."""
        client, self.client = self.client, None
        if client is not None:
            await client.stop()

    async def run_as_master(self, role: BrokerRole) -> None:
        """Serve slaves as a ``role`` master: stop the HA client, listen on the HA port."""
        await self.stop_client()
        self.role = role
        if self.service is None:
            self.service = self._new_service()
            if self._started:
                await self._start_service(self.service)

    async def run_as_slave(self, master_address: str, master_ha_address: str,
                           on_truncation: Callable[[Truncation], None]) -> None:
        """Copy from the master at ``master_address`` / ``master_ha_address``: close the HA
        port (failing every waiting send), then start an HA client that first reconciles
        this log with the master's by epochs (reconcile.py)."""
        service, self.service = self.service, None
        if service is not None:
            await service.stop()
        await self.stop_client()
        self.role = BrokerRole.SLAVE
        reconciler = Reconciler(self._remoting_client(), self._store, self._config.broker_name,
                                on_truncation)
        client = HAClient(self._store, self._master_check(), self._settings, None,
                          self._config.broker_name, tls=self._outgoing.tls,
                          reconcile=reconciler.reconcile)
        client.follow(master_ha_address, master_address)
        self.client = client
        if self._started:
            client.start()

    @property
    def ha_port(self) -> int | None:
        """The port a master's HA service listens on (None on a slave or before start)."""
        return self.service.port if self.service is not None else None

    def learn_master(self, master_address: str | None, master_ha_address: str | None) -> None:
        """The name server's REGISTER_BROKER answer (a slave's master); no-op on a master."""
        if self.client is not None:
            self.client.update_master(master_ha_address, master_address)

    def notify_appended(self) -> None:
        """Bytes were appended: let the master's stream send them now."""
        if self.service is not None:
            self.service.notify_appended()

    # -- SYNC_MASTER ----------------------------------------------------------------------------

    @property
    def waits_for_slaves(self) -> bool:
        """True on a SYNC_MASTER: waiting sends need a slave's acknowledgement."""
        return self.role is BrokerRole.SYNC_MASTER and self.service is not None

    async def replica_status(self, result: PutResult) -> PutStatus:
        """PUT_OK once a slave holds the put's bytes; FLUSH_SLAVE_TIMEOUT after
        syncFlushTimeout; SLAVE_NOT_AVAILABLE at once when no slave is in sync."""
        service = self.service
        if service is None or self.role is not BrokerRole.SYNC_MASTER:
            return PutStatus.PUT_OK
        if service.in_sync_slave_count() == 0:
            return PutStatus.SLAVE_NOT_AVAILABLE
        end = result.physical_offset + result.wrote_bytes
        acknowledged = await service.wait_for_slave(end, self._sync_flush_timeout_s)
        return PutStatus.PUT_OK if acknowledged else PutStatus.FLUSH_SLAVE_TIMEOUT

    async def stored_status(self, result: PutResult, wait: bool) -> PutStatus:
        """The status a send is answered with (``answered_status``)."""
        return await answered_status(result, wait, self._sync_flush_timeout_s, self)

    # -- brokerStatus ---------------------------------------------------------------------------

    def runtime_info(self) -> dict[str, str]:
        """The HA keys of GET_BROKER_RUNTIME_INFO (docs/operations.md explains each)."""
        table = {"brokerRole": self.role.value}
        service = self.service
        if service is not None:
            end = self._store.commit_log_max_offset()
            table["haListenAddress"] = service.address
            table["masterCommitLogMaxOffset"] = str(end)
            table["inSyncSlaveNums"] = str(service.in_sync_slave_count())
            table["haConnectionCount"] = str(len(service.connections))
            table["slaveFallBehindMuch"] = str(service.slave_fall_behind_bytes())
            table["haConnectionInfo"] = json.dumps([
                {
                    "addr": c.peer,
                    "slaveAckOffset": c.acked_offset,
                    "diff": c.behind(end),
                    "inSync": c.in_sync,
                    "transferFromWhere": c.transfer_from,
                    "transferredBytes": c.transferred_bytes,
                }
                for c in service.connections
            ], separators=(",", ":"))
        client = self.client
        if client is not None:
            master = client.master
            table["masterAddr"] = master.remoting_address if master else ""
            table["haMasterAddress"] = master.ha_address if master else ""
            table["haClientConnected"] = "true" if client.connected else "false"
            table["haClientMaxOffset"] = str(self._store.commit_log_max_offset())
            # Copied but not yet readable (replica_dispatch.py); RocketMQ's key.
            table["dispatchBehindBytes"] = str(client.dispatcher.behind_bytes)
            table["haLastReadTimestamp"] = str(client.last_read_ms)
            table["haLastWriteTimestamp"] = str(client.last_write_ms)
            table["haRefused"] = client.refused or client.stopped_reason or ""
            p50, p99, worst = client.lag_percentiles_ms()
            table["haReplicationLagMs"] = f"p50 {p50} p99 {p99} max {worst}"
            table["haReplicationLagSamples"] = str(len(client.lag_samples_ms))
        return table


async def answered_status(result: PutResult, wait: bool, sync_flush_timeout_s: float,
                          replication: Replication | None = None) -> PutStatus:
    """The status a send is answered with: the put's own, then (when the producer waits)
    the disk's (SYNC_FLUSH, ``result.durable``) and, on a SYNC_MASTER, a slave's, waited
    for together; a disk timeout wins over a slave's answer."""
    status = result.status
    if status is not PutStatus.PUT_OK or not wait:
        return status
    durable = result.durable
    if replication is None or not replication.waits_for_slaves:
        if durable is None:
            return status
        return await _durable_status(durable, sync_flush_timeout_s)
    if durable is None:
        return await replication.replica_status(result)
    flushed, replicated = await asyncio.gather(
        _durable_status(durable, sync_flush_timeout_s), replication.replica_status(result)
    )
    return flushed if flushed is not PutStatus.PUT_OK else replicated


def answer_when_flushed(result: PutResult, sync_flush_timeout_s: float, answer: Answer,
                        loop: asyncio.AbstractEventLoop,
                        replication: Replication | None = None) -> bool:
    """``answered_status`` for a waiting send whose only wait is the disk (SYNC_FLUSH,
    no slave to wait for), given to ``answer`` on ``loop`` the moment the sync is known
    (flush_waits.py) instead of returned to an awaiting task. False, and ``answer`` never
    called, when the send has another wait (a SYNC_MASTER) or none: the caller awaits
    ``answered_status`` then."""
    durable = result.durable
    if durable is None or result.status is not PutStatus.PUT_OK or (
            replication is not None and replication.waits_for_slaves):
        return False
    answer_when_durable(durable, sync_flush_timeout_s + _DURABLE_WAIT_MARGIN_S, answer, loop)
    return True


async def _durable_status(durable: Future[PutStatus], timeout_s: float) -> PutStatus:
    # Sends sharing one sync share one wake-up from the flush thread (flush_waits.py).
    return await durable_status(durable, timeout_s + _DURABLE_WAIT_MARGIN_S)

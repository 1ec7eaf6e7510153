"""ControllerAgent: a broker in controller mode (enableControllerMode) follows etcd's records.

Theory of operation (docs/failover.md has the operator's view):

- **Start.** The broker is fenced from construction (it takes no write) until the agent has
  decided its role. The agent claims the cluster's prefix (a prefix holding another cluster
  refuses the start), takes a lease of controllerHeartBeatTimeoutMills, writes its report
  and reads its group: no master yet -> it creates the group with itself as master of epoch
  1 (compare-and-set: of brokers starting together exactly one wins); a live master ->
  ``become_slave``; a master whose process is gone -> it stays fenced, reporting, until a
  controller elected someone (maybe this broker). An etcd that does not answer at start
  refuses the start: a wrong controllerAddr is a configuration mistake.
- **Every brokerHeartbeatInterval:** renew the lease, write the report (address, HA
  address, confirmed offset = the commit log's end, epoch, and a slave's HA connection
  address), read the group and follow it: the state names this process (its brokerId *and*
  its lease) as master -> ``become_master(epoch)`` unless already (then report at once);
  another live master -> ``become_slave`` to it unless already, but only once that master's
  report says it took the epoch (a slave reconciles against the master's epoch list, which
  must hold the new epoch; a master that was replaced fences while it waits). A master
  also writes its offset to a key without a lease (for the ASYNC loss window of the next
  election) and keeps the sync-state set.
- **Fencing.** A master whose last successful renewal is older than
  controllerHeartBeatTimeoutMills - controllerFenceMarginMills calls ``fence``: etcd ends a
  lease no earlier than its TTL after the last renewal it *received*, which is after the
  moment we *sent* it, so the fence comes at least the margin before any election. One
  exception keeps a master serving through an etcd outage: while every other member of its
  sync-state set is still connected to it and has reported on the HA stream within that
  same window, no member can have been elected (a member that becomes master stops copying
  first), so it keeps acknowledging. A master stopped (SIGSTOP) past the window finds its
  slaves' reports old when it wakes, and fences.
- **The sync-state set** (master only; records.py): a member is counted by
  ``SyncStatePolicy`` and a SYNC_MASTER send is acknowledged only when every member
  acknowledged its bytes. A connected replica joins once it has acknowledged everything any
  send was acknowledged for; a member that is gone (no lease), or not caught up within
  haMaxGapNotInSync for haMaxTimeSlaveNotCatchup, leaves. Each change is a compare-and-set
  on the group's state *before* the local set changes, so nothing is acknowledged on a set
  etcd does not hold.
- **etcd unavailable:** nothing changes: the role stays, the agent logs the outage once and
  its end once, and retries every heartbeat; no election can happen meanwhile, and etcd
  renews every lease when it comes back (its leader renews them on election).

Owner: the broker's event loop; all etcd calls are awaited there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Protocol

from tidemq.broker.config import BrokerConfig, BrokerRole
from tidemq.controller.etcd import (
    ClusterMismatch,
    ControllerStore,
    ControllerUnavailable,
    GroupView,
    parse_endpoints,
)
from tidemq.controller.records import GroupState, RecordError, ReplicaReport
from tidemq.errors import ConfigError

log = logging.getLogger("tidemq.broker.controller_agent")

# At start, the group must be decided within this long (etcd answering but no decision
# possible, e.g. a dead master and no controller running, only delays the start).
START_REQUEST_ATTEMPTS = 3
# How often the fence watch looks at the lease's age.
FENCE_CHECK_S = 0.05
# While the group is between masters (the master's lease is gone, or a new master has not
# taken its epoch yet) the agent reads etcd this often instead of every heartbeat: an
# election is followed within this long, not within a heartbeat.
UNSETTLED_INTERVAL_S = 0.05


class SwitchableRole(Protocol):
    """What the agent needs of ReplicationRole (broker/role.py)."""

    epoch: int
    fenced_reason: str | None
    master_address: str | None
    replication: Any

    @property
    def is_master(self) -> bool: ...

    def fence(self, reason: str) -> None: ...

    async def become_master(self, epoch: int, master_role: BrokerRole | None = None) -> None: ...

    async def become_slave(self, epoch: int, master_addr: str, master_ha_addr: str,
                           broker_id: int) -> None: ...


class OffsetSource(Protocol):
    def commit_log_max_offset(self) -> int: ...


class AddressSource(Protocol):
    address: str

    @property
    def ha_server_address(self) -> str: ...


class SyncStatePolicy:
    """Which HA connections are members of the sync-state set, and what they all have.

    ``members`` are brokerIds (this master excluded); ``peers`` maps an HA connection's peer
    address to the brokerId that reported it (ReplicaReport.ha_client_address).
    """

    def __init__(self) -> None:
        self.members: frozenset[int] = frozenset()
        self.peers: dict[str, int] = {}

    def acked_by_member(self, connections: list[Any]) -> dict[int, int]:
        """brokerId -> acknowledged offset for every member connected now."""
        acked: dict[int, int] = {}
        for connection in connections:
            broker_id = self.peers.get(connection.peer)
            if broker_id is not None and connection.acked_offset >= 0:
                acked[broker_id] = max(acked.get(broker_id, -1), connection.acked_offset)
        return acked

    def ack_offset(self, connections: list[Any]) -> int | None:
        """The offset every member has acknowledged (-1: a member has none or is not
        connected); None when the set has no member besides the master (the static
        rule, one in-sync slave, applies)."""
        if not self.members:
            return None
        acked = self.acked_by_member(connections)
        return min(acked.get(member, -1) for member in self.members)


class ControllerAgent:
    """Keeps this broker's lease, reports and role in line with etcd (module docstring).

    Args:
        config: the controller-mode keys and this broker's names and replica id.
        role: the switchable role (become_master / become_slave / fence).
        store: for the confirmed offset.
        identity: this broker's remoting and HA addresses.
        ha_max_gap_not_in_sync: bytes a member may lag and still count as caught up.
    """

    def __init__(self, config: BrokerConfig, role: SwitchableRole, store: OffsetSource,
                 identity: AddressSource, ha_max_gap_not_in_sync: int) -> None:
        self._config = config
        self._role = role
        self._store_offsets = store
        self._identity = identity
        self._gap_max = ha_max_gap_not_in_sync
        self.broker_name = config.broker_name
        self.broker_id = config.broker_id
        self.flavour = config.broker_role
        self.ttl_s = config.controller_heart_beat_timeout_ms // 1000
        self.interval_s = config.broker_heartbeat_interval_ms / 1000
        self.fence_after_s = (config.controller_heart_beat_timeout_ms
                              - config.controller_fence_margin_ms) / 1000
        self.catchup_max_s = config.ha_max_time_slave_not_catchup_ms / 1000
        self.store = ControllerStore(parse_endpoints(config.controller_addr),
                                     config.controller_etcd_prefix)
        self.policy = SyncStatePolicy()
        self.lease = 0
        self.state: GroupState | None = None
        self._renewed_at = 0.0  # monotonic time the last successful renewal was sent
        self._etcd_down_since: float | None = None
        self._not_caught_up_since: dict[int, float] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._failsafe_logged = False
        self._waiting_logged: str | None = None
        self._unsettled = False  # between masters: read etcd every UNSETTLED_INTERVAL_S

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Claim the prefix, take a lease, decide this broker's role once, then run.

        Raises:
            ConfigError: etcd does not answer at controllerAddr, or its prefix holds another
                cluster (the message names both and the fix).
        """
        self._role.fence("waiting for the controller's decision (enableControllerMode)")
        try:
            await self.store.claim_cluster(self._config.broker_cluster_name)
            await self._new_lease()
            await self._round()
        except ClusterMismatch as e:
            await self.store.close()
            raise ConfigError(str(e)) from None
        except ControllerUnavailable as e:
            await self.store.close()
            raise ConfigError(f"controller mode cannot start: {e}") from None
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._heartbeat_loop(), name="tidemq-controller-agent"),
                       loop.create_task(self._fence_watch(), name="tidemq-fence-watch")]

    async def stop(self) -> None:
        """Stop renewing; revoke the lease so a controller elects without waiting for it."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.lease:
            # A clean stop hands mastership on at once; fence first so nothing is
            # acknowledged after the lease is gone.
            if self._role.is_master:
                self._role.fence("shutting down")
            with contextlib.suppress(ControllerUnavailable):
                await self.store.revoke(self.lease)
        await self.store.close()

    # -- the heartbeat --------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(UNSETTLED_INTERVAL_S if self._unsettled else self.interval_s)
            try:
                await self._round()
                if self._etcd_down_since is not None:
                    log.warning("etcd answers again after %.1f s; broker %s keeps following "
                                "the controller (%s)", time.monotonic() - self._etcd_down_since,
                                self.broker_name, self._describe_role())
                    self._etcd_down_since = None
                    self._failsafe_logged = False
            except ControllerUnavailable as e:
                if self._etcd_down_since is None:
                    self._etcd_down_since = time.monotonic()
                    log.error("%s; broker %s keeps its role (%s): no election can happen "
                              "while etcd is away", e, self.broker_name, self._describe_role())
            except RecordError as e:
                log.error("controller records of %s unreadable: %s", self.broker_name, e)
            except Exception:  # a bug here must not stop the heartbeat
                log.exception("controller agent round failed; trying again")

    async def _round(self) -> None:
        sent_at = time.monotonic()
        if await self.store.keep_alive(self.lease) == 0:
            await self._lease_lost()
        else:
            self._renewed_at = sent_at
        await self.store.put_report(self.broker_name, self._report(), self.lease)
        if self._role.is_master and self._role.fenced_reason is None and self.state is not None:
            await self.store.put_master_offset(self.broker_name, self._role.epoch,
                                               self._store_offsets.commit_log_max_offset())
        view = await self.store.read_group(self.broker_name)
        await self._follow(view)

    async def _new_lease(self) -> None:
        sent_at = time.monotonic()
        self.lease = await self.store.grant_lease(self.ttl_s)
        self._renewed_at = sent_at

    async def _lease_lost(self) -> None:
        # etcd let our lease expire (we were cut off or stopped too long): whatever we were,
        # a controller may have elected someone else. Fence, then start over as a new process.
        if self._role.is_master and self._role.fenced_reason is None:
            self._role.fence("its etcd lease expired; a new master may have been elected")
        log.warning("broker %s lost its etcd lease %x; taking a new one", self.broker_name,
                    self.lease)
        await self._new_lease()

    def _report(self) -> ReplicaReport:
        role = self._role
        kind = "FENCED" if role.fenced_reason else ("MASTER" if role.is_master else "SLAVE")
        return ReplicaReport(
            broker_id=self.broker_id, address=self._identity.address,
            ha_address=self._ha_address(),
            confirmed_offset=self._store_offsets.commit_log_max_offset(),
            epoch=role.epoch, role=kind, ha_client_address=self._ha_client_address(),
        )

    def _ha_address(self) -> str:
        service = getattr(self._role.replication, "service", None)
        if service is not None and getattr(service, "port", 0):
            return f"{service.host}:{service.port}"
        return self._identity.ha_server_address

    def _ha_client_address(self) -> str:
        client = getattr(self._role.replication, "client", None)
        return getattr(client, "local_address", None) or ""

    def _describe_role(self) -> str:
        role = self._role
        if role.fenced_reason:
            return f"fenced in epoch {role.epoch}: {role.fenced_reason}"
        if role.is_master:
            return f"master of epoch {role.epoch}"
        return f"slave of {role.master_address} in epoch {role.epoch}"

    # -- following the records ------------------------------------------------------------------

    async def _follow(self, view: GroupView) -> None:
        self._unsettled = False
        state = view.state
        if state is None:
            await self._bootstrap(view)
            return
        self.state = state
        role = self._role
        if state.master_broker_id == self.broker_id and state.master_lease == self.lease:
            if not role.is_master or role.epoch != state.master_epoch or role.fenced_reason:
                flavour = BrokerRole(state.master_flavour) if state.master_flavour in (
                    "SYNC_MASTER", "ASYNC_MASTER") else self.flavour
                await self._become_master(state, flavour)
            self._update_policy(view)
            await self._keep_sync_state_set(view)
            return
        if view.master_alive():
            if (role.is_master or role.epoch != state.master_epoch
                    or role.master_address != state.master_address):
                master_report = view.replicas[state.master_broker_id]
                if master_report.role != "MASTER" or master_report.epoch != state.master_epoch:
                    # The new master has not taken its epoch yet (its report says so once
                    # its epoch file holds it): following now would reconcile against an
                    # epoch list without the new epoch. Refuse writes meanwhile.
                    if role.is_master and role.fenced_reason is None:
                        role.fence(f"brokerId {state.master_broker_id} was elected master of "
                                   f"epoch {state.master_epoch}")
                    self._unsettled = True
                    return
                log.warning("broker %s (brokerId %d) follows master %s (brokerId %d) of epoch "
                            "%d", self.broker_name, self.broker_id, state.master_address,
                            state.master_broker_id, state.master_epoch)
                await role.become_slave(state.master_epoch, state.master_address,
                                        state.master_ha_address, self.broker_id)
            self._waiting_logged = None
            return
        # The records name a master process that is gone (maybe this broker's former self):
        # wait for a controller's election, reporting often so it sees fresh offsets.
        self._unsettled = True
        if role.is_master and role.fenced_reason is None:
            role.fence(f"the controller's records name another master process for epoch "
                       f"{state.master_epoch}")
        note = f"{state.master_broker_id}/{state.master_epoch}"
        if self._waiting_logged != note:
            self._waiting_logged = note
            log.warning("broker %s waits for an election: the master of epoch %d (brokerId "
                        "%d) holds no lease (is `tidemq controller` running?)",
                        self.broker_name, state.master_epoch, state.master_broker_id)

    async def _bootstrap(self, view: GroupView) -> None:
        epoch = max(self._role.epoch, 0) + 1
        state = GroupState(
            broker_name=self.broker_name, master_epoch=epoch, master_broker_id=self.broker_id,
            master_address=self._identity.address, master_ha_address=self._ha_address(),
            master_lease=self.lease, sync_state_set=frozenset({self.broker_id}),
            sync_state_set_epoch=1, master_flavour=self.flavour.value,
        )
        if await self.store.put_state(state, 0):
            log.warning("broker %s (brokerId %d) is the first of its group: master of epoch %d",
                        self.broker_name, self.broker_id, epoch)
        # Won or lost, the next read follows whoever is master now.
        await self._follow(await self.store.read_group(self.broker_name))

    async def _become_master(self, state: GroupState, flavour: BrokerRole) -> None:
        log.warning("broker %s (brokerId %d) becomes %s of epoch %d", self.broker_name,
                    self.broker_id, flavour.value, state.master_epoch)
        await self._role.become_master(state.master_epoch, flavour)
        # Tell the slaves at once: they follow a master only once its report says it took
        # the epoch (its epoch file holds it).
        await self.store.put_report(self.broker_name, self._report(), self.lease)
        history = await self.store.history(self.broker_name)
        record = next((r for r in history if r.epoch == state.master_epoch), None)
        if record is not None and record.possible_loss_bytes:
            log.warning(
                "ASYNC_MASTER failover of %s to epoch %d: the previous master (brokerId %s) had "
                "reported offset %d and this master starts at %d: up to %d bytes it "
                "acknowledged may be lost (the old master logs the dropped messages, count and "
                "msgIds, when it rejoins; tidemq admin getBrokerEpoch -b %s)",
                self.broker_name, state.master_epoch, record.previous_master_broker_id,
                record.loss_to_offset, record.loss_from_offset, record.possible_loss_bytes,
                self.broker_name)

    # -- the sync-state set (master) ------------------------------------------------------------

    def _connections(self) -> list[Any]:
        service = getattr(self._role.replication, "service", None)
        return list(service.connections) if service is not None else []

    def _update_policy(self, view: GroupView) -> None:
        state = view.state
        assert state is not None
        self.policy.peers = {r.ha_client_address: b for b, r in view.replicas.items()
                             if r.ha_client_address}
        members = state.sync_state_set - {self.broker_id}
        if members != self.policy.members:
            self._set_members(members)

    def _set_members(self, members: frozenset[int]) -> None:
        self.policy.members = members
        service = getattr(self._role.replication, "service", None)
        waits = getattr(service, "waits", None)
        if waits is not None:
            # A member that joined has not acknowledged what others did: forget the higher
            # acknowledgement so no send counts as held by it before it says so; a member
            # that left no longer holds sends back: answer those the others hold.
            connections = self._connections()
            offset = self.policy.ack_offset(connections)
            if offset is None:  # the master alone: the static rule, any one slave
                offset = max((c.acked_offset for c in connections), default=0)
            waits.reset_acked(offset)
            waits.acknowledge(offset)

    async def _keep_sync_state_set(self, view: GroupView) -> None:
        state = view.state
        assert state is not None
        now = time.monotonic()
        end = self._store_offsets.commit_log_max_offset()
        connections = self._connections()
        acked = self.policy.acked_by_member(connections)
        service = getattr(self._role.replication, "service", None)
        waits = getattr(service, "waits", None)
        acknowledged = waits.acked_offset if waits is not None else end
        members = set(state.sync_state_set)
        leave: list[tuple[int, str]] = []
        for member in sorted(members - {self.broker_id}):
            if member not in view.replicas:
                leave.append((member, "its process holds no lease"))
                continue
            offset = acked.get(member, -1)
            if offset >= 0 and end - offset <= self._gap_max:
                self._not_caught_up_since.pop(member, None)
                continue
            since = self._not_caught_up_since.setdefault(member, now)
            if now - since >= self.catchup_max_s:
                leave.append((member, f"not caught up for {now - since:.1f} s "
                                      f"(haMaxTimeSlaveNotCatchup; acknowledged {offset}, "
                                      f"master at {end})"))
        join = [b for b, offset in acked.items()
                if b not in members and b in view.replicas and offset >= acknowledged
                and end - offset <= self._gap_max]
        if not leave and not join:
            return
        new_members = (members - {b for b, _ in leave}) | set(join)
        new_state = GroupState(
            broker_name=state.broker_name, master_epoch=state.master_epoch,
            master_broker_id=state.master_broker_id, master_address=state.master_address,
            master_ha_address=state.master_ha_address, master_lease=state.master_lease,
            sync_state_set=frozenset(new_members),
            sync_state_set_epoch=state.sync_state_set_epoch + 1,
            master_flavour=state.master_flavour,
        )
        if not await self.store.put_state(new_state, view.state_revision):
            return  # someone changed the group first: the next round reads it
        self.state = new_state
        for member, why in leave:
            self._not_caught_up_since.pop(member, None)
            log.warning("brokerId %d left the sync-state set of %s: %s", member,
                        self.broker_name, why)
        for member in join:
            log.warning("brokerId %d joined the sync-state set of %s at offset %d",
                        member, self.broker_name, acked[member])
        self._set_members(frozenset(new_members - {self.broker_id}))

    # -- fencing --------------------------------------------------------------------------------

    async def _fence_watch(self) -> None:
        while True:
            await asyncio.sleep(FENCE_CHECK_S)
            self.check_fence()

    def check_fence(self) -> None:
        """Fence a master whose lease may be about to expire (module docstring)."""
        role = self._role
        if not role.is_master or role.fenced_reason is not None:
            return
        age = time.monotonic() - self._renewed_at
        if age < self.fence_after_s:
            return
        if self._members_vouch():
            if not self._failsafe_logged:
                self._failsafe_logged = True
                log.warning(
                    "broker %s could not renew its etcd lease for %.1f s but every member of "
                    "its sync-state set %s still copies from it: no other master can exist, "
                    "it keeps acknowledging", self.broker_name, age,
                    sorted(self.policy.members) or "(none besides it)")
            return
        role.fence(f"could not renew its etcd lease for {age:.1f} s "
                   f"(controllerHeartBeatTimeoutMills={self._config.controller_heart_beat_timeout_ms},"
                   f" controllerFenceMarginMills={self._config.controller_fence_margin_ms})")

    def _members_vouch(self) -> bool:
        """True when every other member of the set is connected and reported recently."""
        if not self.policy.members:
            return False  # nobody to vouch: a lone master cannot know it is still master
        fresh_after = time.monotonic() - self.fence_after_s
        fresh: set[int] = set()
        for connection in self._connections():
            broker_id = self.policy.peers.get(connection.peer)
            if broker_id is not None and connection.last_read_monotonic >= fresh_after:
                fresh.add(broker_id)
        return self.policy.members <= fresh

"""ReplicationRole: this broker's part in its master/slave group, asked by every write path.

RocketMQ's broker group is one master (brokerId 0) and slaves (brokerId > 0) under one
brokerName. With a static group the role is the config's brokerRole for the life of the
process; what changes is what the broker learns about its group: a slave learns its master's
address from the name server's REGISTER_BROKER answer (``learn_master``), and the HA service
(the replication stream, broker/ha/) is attached when one runs.

Under automatic failover (issue 12) the role changes at run time, driven by the controller
agent or by NOTIFY_BROKER_ROLE_CHANGED (role_processor.py):

- ``become_master(epoch)``: stop the HA client, cut a half-copied record off the log's end,
  record ``(epoch, log end)`` in the epoch file (store/epochs.py), start the HA service, take
  writes, re-register with the name servers as brokerId 0;
- ``become_slave(epoch, master, master HA, broker id)``: stop taking writes *first*, stop the
  HA service, reconcile with the new master by epochs (truncating a divergent tail, logged
  record by record: ha/reconcile.py), copy from it, re-register as a slave with that id;
- ``fence(reason)``: stop acknowledging writes at once (a master that lost its lease) until
  the next ``become_*``.

Sends in flight across a switch (why this is race-free): every write path asks
``write_refusal`` and then stores, with no await in between, so a write is stored under the
role it was checked against. A send that then waits (SYNC_FLUSH, a SYNC_MASTER's slave
acknowledgement) is answered through ``stored_status``, which compares the role's
*generation* (bumped by every switch and every fence) before and after the wait: a send whose
wait spanned a switch or a fence is answered SERVICE_NOT_AVAILABLE (``switched_remark``),
never SEND_OK, since its bytes may be cut by a truncation on the new master's word. A send
answered before the switch was acknowledged under the old rules, which is what they promise.

Every processor that writes (sends, send-backs, END_TRANSACTION, topic and group updates)
asks ``write_refusal`` instead of reading brokerRole itself, so the rule and its remark live
in one place.

Ownership: the broker's event loop; switches are serialised by one lock; nothing blocks but
the store's truncation (run in a worker thread).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from tidemq.broker.config import BrokerConfig, BrokerRole
from tidemq.broker.ha.flush_waits import Answer, Flushable
from tidemq.broker.ha.replication import Replication, answer_when_flushed, answered_status
from tidemq.broker.identity import BrokerIdentity
from tidemq.store.epochs import EpochFile
from tidemq.store.interface import PutResult, PutStatus
from tidemq.store.truncation import Truncation

log = logging.getLogger("tidemq.broker.role")

MASTER_ID = 0  # RocketMQ's MixAll.MASTER_ID

# Called after every switch (on the loop): re-register, start or stop the slave's table copy.
SwitchListener = Callable[["ReplicationRole"], Awaitable[None]]


class SwitchableStore(Protocol):
    """What a role switch needs of the store (a ``FileMessageStore`` has it)."""

    epochs: EpochFile | None

    def commit_log_max_offset(self) -> int: ...

    def replicated_confirmed_offset(self) -> int: ...

    def reset_replica(self) -> None: ...

    def truncate_to(self, physical_offset: int) -> Truncation: ...


class ReplicationRole:
    """Master or slave, whether writes are taken, and what is known of the master.

    Args:
        config: brokerRole and brokerId.
        identity: this broker's names and address (for remarks and registration).
        replication: the HA side (broker/ha/replication.py): the HAService on a master, the
            HAClient on a slave; None for a broker built without it (unit tests).
        sync_flush_timeout_ms: how long a waiting send waits for the disk (and a slave).
        store: the store, for the epoch file and truncation of a switch (None: switching
            is refused, as for a store without them).
    """

    def __init__(self, config: BrokerConfig, identity: BrokerIdentity,
                 replication: Replication | None = None,
                 sync_flush_timeout_ms: int = 5000,
                 store: SwitchableStore | None = None) -> None:
        self.role: BrokerRole = config.broker_role
        self._configured_role = config.broker_role
        self._identity = identity
        self.replication = replication
        self._sync_flush_timeout_s = sync_flush_timeout_ms / 1000
        self._store = store
        # Learned from the name server's REGISTER_BROKER answer (masterAddr / haServerAddr)
        # or given by become_slave; None until then, and always None on a master.
        self.master_address: str | None = None
        self.master_ha_address: str | None = None
        epochs = getattr(store, "epochs", None)
        # The master epoch this broker last took part in (0: none; a static group).
        self.epoch: int = epochs.last_epoch if epochs is not None else 0
        # Bumped by every switch and fence: a send whose wait spans a change is refused.
        self.generation = 0
        # The log's end at the latest switch or fence: a send stored below it and answered
        # only now was stored under the old role (module docstring).
        self._changed_at = 0
        self.fenced_reason: str | None = None
        self._switching: str | None = None  # what a switch in progress is doing
        self._switch_lock = asyncio.Lock()
        self._listeners: list[SwitchListener] = []
        self.last_truncation: Truncation | None = None
        self._master_given = False  # become_slave named the master

    @property
    def broker_id(self) -> int:
        """0 on a master, this slave's brokerId on a slave."""
        return self._identity.broker_id

    @property
    def is_master(self) -> bool:
        """True for SYNC_MASTER and ASYNC_MASTER."""
        return self.role is not BrokerRole.SLAVE

    @property
    def is_slave(self) -> bool:
        """True for brokerRole=SLAVE: a read-only copy of its master."""
        return self.role is BrokerRole.SLAVE

    @property
    def is_sync_master(self) -> bool:
        """True for SYNC_MASTER: a send waits for a slave to hold the message."""
        return self.role is BrokerRole.SYNC_MASTER

    @property
    def accepts_writes(self) -> bool:
        """False on a slave, a fenced master, or during a switch."""
        return not self.is_slave and self.fenced_reason is None and self._switching is None

    def write_refusal(self, what: str) -> str | None:
        """The remark refusing ``what`` (e.g. "sends to topic T") on a slave, a fenced master
        or during a switch; None when writes are taken."""
        if self.accepts_writes:
            return None
        identity = self._identity
        if self._switching is not None or self.fenced_reason is not None:
            why = self._switching or f"fenced: {self.fenced_reason}"
            return (
                f"broker {identity.broker_name} at {identity.address} takes no {what} now "
                f"({why}, epoch {self.epoch}); retry: clients follow the new master once the "
                "name servers list it"
            )
        master = f" at {self.master_address}" if self.master_address else ""
        return (
            f"broker {identity.broker_name} at {identity.address} is a slave "
            f"(brokerRole=SLAVE, brokerId={identity.broker_id}) and takes no {what}; "
            f"send them to its master{master}"
        )

    def learn_master(self, master_address: str | None, master_ha_address: str | None) -> None:
        """Record the master's addresses from a name server's answer (slaves only; a slave
        made by ``become_slave`` follows the master it was given instead)."""
        if self.is_slave and not self._master_given:
            self.master_address = master_address or None
            self.master_ha_address = master_ha_address or None
            if self.replication is not None:
                self.replication.learn_master(self.master_address, self.master_ha_address)

    async def stored_status(self, result: PutResult, wait: bool) -> PutStatus:
        """The status a send is answered with: its put's, then, when its producer waits, the
        disk's under SYNC_FLUSH and a slave's on a SYNC_MASTER (FLUSH_DISK_TIMEOUT,
        FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE all mean "stored"); SERVICE_NOT_AVAILABLE
        when the role switched or was fenced while it waited (module docstring)."""
        generation = self.generation
        status = await answered_status(result, wait, self._sync_flush_timeout_s, self.replication)
        if status is PutStatus.SERVICE_NOT_AVAILABLE:
            return status
        # Put before the latest switch or fence (a send answered after others of its read,
        # whose wait began only after the switch), or waited across one: not acknowledged.
        if self.generation != generation or (
                result.status is PutStatus.PUT_OK and result.physical_offset < self._changed_at):
            return PutStatus.SERVICE_NOT_AVAILABLE
        return status

    def answer_when_stored(self, result: PutResult, answer: Answer,
                           loop: asyncio.AbstractEventLoop) -> bool:
        """``stored_status(result, True)`` given to ``answer`` on ``loop`` the moment the
        disk's sync is known, for a send whose only wait is that sync (SYNC_FLUSH, no slave
        to wait for): its response then leaves without waiting for its task's next turn
        (broker/ha/flush_waits.py). False, and ``answer`` never called, for any other send;
        the caller awaits ``stored_status`` then."""
        generation = self.generation

        def checked(status: PutStatus) -> Flushable | None:
            # The same rule as stored_status's after its wait.
            if self.generation != generation or result.physical_offset < self._changed_at:
                status = PutStatus.SERVICE_NOT_AVAILABLE
            return answer(status)

        return answer_when_flushed(result, self._sync_flush_timeout_s, checked, loop,
                                   self.replication)

    def stored_status_now(self, result: PutResult) -> PutStatus | None:
        """``stored_status(result, True)`` when there is nothing to wait for (a put that
        failed, or no SYNC_FLUSH future and no slave to wait for), without a coroutine per
        send; None when it must be awaited."""
        status = result.status
        if status is not PutStatus.PUT_OK:
            return status
        if result.durable is not None:
            return None
        replication = self.replication
        if replication is not None and replication.waits_for_slaves:
            return None
        if result.physical_offset < self._changed_at:
            return PutStatus.SERVICE_NOT_AVAILABLE  # put before the latest switch or fence
        return status

    def stored_now(self, physical_offset: int) -> bool:
        """True when ``stored_status_now`` of a put stored at ``physical_offset`` with no
        SYNC_FLUSH future is PUT_OK (no slave to wait for, put after the latest switch or
        fence), with no ``PutResult`` made for it (a group's first record tells for all)."""
        replication = self.replication
        if replication is not None and replication.waits_for_slaves:
            return False
        return physical_offset >= self._changed_at

    def switched_remark(self) -> str:
        """The remark of a send refused because the role changed while it waited."""
        identity = self._identity
        now = (self.fenced_reason and f"fenced: {self.fenced_reason}") or self.role.value
        return (
            f"broker {identity.broker_name} at {identity.address} changed role while this send "
            f"waited for its acknowledgement (now {now}, epoch {self.epoch}); it is not "
            "acknowledged: send it again (it may be stored twice)"
        )

    def runtime_info(self) -> dict[str, str]:
        """The role and replication keys of GET_BROKER_RUNTIME_INFO."""
        table = ({"brokerRole": self.role.value} if self.replication is None
                 else self.replication.runtime_info())
        table["brokerRole"] = self.role.value
        table["masterEpoch"] = str(self.epoch)
        if self.fenced_reason:
            table["fenced"] = self.fenced_reason
        return table

    # -- switching (issue 12) -------------------------------------------------------------------

    def add_switch_listener(self, listener: SwitchListener) -> None:
        """Call ``listener(role)`` after every switch (the controller re-registers there)."""
        self._listeners.append(listener)

    def slave_confirmed_offsets(self) -> dict[str, int]:
        """Each connected slave's acknowledged offset by its HA peer address (a master; empty
        on a slave): what the controller's sync-state decisions read."""
        service = self.replication.service if self.replication is not None else None
        if service is None:
            return {}
        return {c.peer: c.acked_offset for c in service.connections if c.acked_offset >= 0}

    def fence(self, reason: str) -> None:
        """Stop acknowledging writes at once; refused with SERVICE_NOT_AVAILABLE and
        ``reason`` in the remark until ``become_master`` / ``become_slave``. Sends waiting for
        a slave are answered at once (refused, not acknowledged)."""
        if self.fenced_reason is None:
            log.warning("broker %s fenced in epoch %d: %s; it acknowledges no writes until it "
                        "is told its role", self._identity.broker_name, self.epoch, reason)
        self.fenced_reason = reason
        self._mark_change()
        service = self.replication.service if self.replication is not None else None
        if service is not None:
            service.waits.fail_all()

    async def become_master(self, epoch: int, master_role: BrokerRole | None = None) -> None:
        """Take writes as the master of ``epoch`` (module docstring).

        Args:
            epoch: the new master epoch (at least this broker's current one).
            master_role: SYNC_MASTER or ASYNC_MASTER; default: the configured brokerRole when
                it is a master's, else SYNC_MASTER (a configured slave promoted: the safe one).
        Raises:
            RoleSwitchError: the epoch is older than this broker's, or the store cannot switch.
        """
        if master_role is None:
            master_role = (self._configured_role if self._configured_role is not BrokerRole.SLAVE
                           else BrokerRole.SYNC_MASTER)
        if master_role is BrokerRole.SLAVE:
            raise RoleSwitchError("become_master needs SYNC_MASTER or ASYNC_MASTER, not SLAVE")
        async with self._switch_lock:
            self._check_epoch(epoch)
            store = self._switchable_store()
            was_slave = self.is_slave
            self._begin(f"becoming master of epoch {epoch}")
            try:
                if self.replication is not None:
                    await self.replication.stop_client()
                await asyncio.to_thread(self._take_log_as_master, store, epoch, was_slave)
                self.role = master_role
                self.epoch = epoch
                self.master_address = self.master_ha_address = None
                self._master_given = False
                self._identity.switched(MASTER_ID)
                if self.replication is not None:
                    await self.replication.run_as_master(master_role)
            finally:
                self._end()
            log.info("broker %s is %s of epoch %d from offset %d", self._identity.broker_name,
                     master_role.value, epoch, store.commit_log_max_offset())
        await self._tell_listeners()

    async def become_slave(self, epoch: int, master_addr: str, master_ha_addr: str,
                           broker_id: int) -> None:
        """Follow the master of ``epoch`` at ``master_addr`` (HA ``master_ha_addr``) as slave
        ``broker_id`` (module docstring). Returns once writes are refused and the HA client
        runs; the reconciliation (divergence, truncation) is the HA client's first step and
        is retried by it until the master answers.

        Raises:
            RoleSwitchError: the epoch is older than this broker's, the id is 0, or the store
                cannot switch.
        """
        if broker_id <= 0:
            raise RoleSwitchError(f"a slave's brokerId must be 1 or more, not {broker_id}")
        async with self._switch_lock:
            self._check_epoch(epoch)
            store = self._switchable_store()
            self._begin(f"becoming slave of {master_addr} in epoch {epoch}")
            try:
                if self.replication is not None:
                    await self.replication.stop_client()  # a slave switched to another master
                if not self.is_slave:
                    store.reset_replica()  # its own writes are past the copy's old view
                self.role = BrokerRole.SLAVE
                self.epoch = epoch
                self.master_address = master_addr
                self.master_ha_address = master_ha_addr
                self._master_given = True
                self._identity.switched(broker_id)
                if self.replication is not None:
                    await self.replication.run_as_slave(master_addr, master_ha_addr,
                                                        self._note_truncation)
            finally:
                self._end()
            log.info("broker %s is slave %d of %s (HA %s) in epoch %d",
                     self._identity.broker_name, broker_id, master_addr, master_ha_addr, epoch)
        await self._tell_listeners()

    # -- switching, internals -------------------------------------------------------------------

    def _check_epoch(self, epoch: int) -> None:
        if epoch < self.epoch:
            raise RoleSwitchError(
                f"epoch {epoch} is older than this broker's epoch {self.epoch}: a controller "
                "that is behind, or a replayed notice; ignored"
            )

    def _switchable_store(self) -> SwitchableStore:
        store = self._store
        if store is None or getattr(store, "epochs", None) is None:
            raise RoleSwitchError(
                "this broker's store has no epoch file (a memory store): it cannot switch roles"
            )
        return store

    def _begin(self, what: str) -> None:
        # Refuse writes from here on and let every waiting send fail its generation check.
        self._switching = what
        self._mark_change()
        service = self.replication.service if self.replication is not None else None
        if service is not None:
            service.waits.fail_all()

    def _mark_change(self) -> None:
        self.generation += 1
        if self._store is not None:
            self._changed_at = self._store.commit_log_max_offset()

    def _end(self) -> None:
        self._switching = None
        self.fenced_reason = None
        self.generation += 1

    def _take_log_as_master(self, store: SwitchableStore, epoch: int, was_slave: bool) -> None:
        # A worker thread, writes refused. A slave's log may end inside a record (a chunk
        # cut it): cut that half back to the last whole record before appending after it.
        end = store.commit_log_max_offset()
        confirmed = store.replicated_confirmed_offset() if was_slave else end
        if confirmed < end:
            self._note_truncation(store.truncate_to(confirmed))
            end = confirmed
        epochs = store.epochs
        assert epochs is not None
        # Entries copied from a former master that start at or after our end hold none of
        # our bytes; this epoch starts at our end.
        epochs.truncate_from(end)
        if epochs.last_epoch != epoch:  # equal: a repeated become_master
            epochs.append(epoch, end)

    def _note_truncation(self, truncation: Truncation) -> None:
        self.last_truncation = truncation
        if truncation.count or truncation.dropped_bytes:
            log.warning("broker %s dropped a divergent tail: %s", self._identity.broker_name,
                        truncation.describe())
            if truncation.count > 50:  # the first 50 are in the line above
                for line in truncation.id_lines():
                    log.warning("broker %s dropped %s", self._identity.broker_name, line)

    async def _tell_listeners(self) -> None:
        for listener in self._listeners:
            try:
                await listener(self)
            except Exception:  # a listener's bug must not undo the switch
                log.exception("role switch listener %r failed", listener)


class RoleSwitchError(Exception):
    """A role switch was refused; the message says why and what to do."""

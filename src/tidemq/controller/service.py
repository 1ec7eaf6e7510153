"""ControllerService: the loop that elects a new master when a master's lease expires.

Theory of operation. Every ``scan_interval_s`` the service reads each group of its cluster
(one etcd range read per group). A group whose master no longer holds its lease is noted
with the etcd revision of that read (``dead_since``); its election waits until every live
member of the sync-state set has written a report after that revision (so the offsets it
compares are the ones they have now that no master feeds them; agents write every
heartbeat), or ``report_wait_s`` passed. Then it commits ``election.decide``'s new state by
compare-and-set on the state key: when another controller (or an operator) decided first,
the CAS fails and the next scan sees their decision.

No state of its own: any number of controllers may run (one per name server host is a good
layout), and one may be restarted at any time. etcd unreachable: the service logs it once,
elects nobody, and goes on trying; when etcd answers again, leases that etcd kept alive
across its outage (etcd renews every lease when it elects a leader) are still valid, so a
short etcd outage causes no election.

Owner: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from tidemq.controller.election import ElectionRefused, decide
from tidemq.controller.etcd import ControllerStore, ControllerUnavailable, GroupView
from tidemq.controller.records import RecordError

log = logging.getLogger("tidemq.controller")


@dataclass(slots=True)
class ControllerSettings:
    """The controller's timing keys (docs/failover.md)."""

    # How often each group is read. 200 ms keeps detection well inside a second after the
    # lease ends, at one small etcd read per group per scan.
    scan_interval_s: float = 0.2
    # The longest an election waits for fresh reports from the candidates.
    report_wait_s: float = 2.0


class ControllerService:
    """Elects masters for the groups of one cluster (module docstring).

    Args:
        store: the cluster's records in etcd (its marker already claimed).
        settings: timing.
    """

    def __init__(self, store: ControllerStore, settings: ControllerSettings | None = None) -> None:
        self.store = store
        self.settings = settings or ControllerSettings()
        self._dead_since: dict[str, tuple[int, float]] = {}
        self._refusals: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._etcd_down_since: float | None = None
        self.elections = 0

    def start(self) -> None:
        """Run the loop in the background."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tidemq-controller")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                await self.scan_once()
                if self._etcd_down_since is not None:
                    log.warning("etcd answers again after %.1f s; elections resume",
                                time.monotonic() - self._etcd_down_since)
                    self._etcd_down_since = None
            except ControllerUnavailable as e:
                if self._etcd_down_since is None:
                    self._etcd_down_since = time.monotonic()
                    log.error("%s; no election happens until etcd answers", e)
            except Exception:  # a bug must not end the loop that keeps groups alive
                log.exception("controller scan failed; trying again")
            await asyncio.sleep(self.settings.scan_interval_s)

    async def scan_once(self) -> None:
        """Read every group once and elect where a master's lease expired."""
        for name in await self.store.group_names():
            try:
                view = await self.store.read_group(name)
            except RecordError as e:
                self._refuse_once(name, f"group {name!r} holds a value tidemq cannot read: {e}")
                continue
            await self._check(view)

    async def _check(self, view: GroupView) -> None:
        name = view.broker_name
        if view.state is None or view.master_alive():
            self._dead_since.pop(name, None)
            self._refusals.pop(name, None)
            return
        noted = self._dead_since.get(name)
        if noted is None:
            self._dead_since[name] = (view.revision, time.monotonic())
            log.warning(
                "master of broker group %s (brokerId %d, epoch %d) lost its lease; electing "
                "once the sync-state set {%s} reported again",
                name, view.state.master_broker_id, view.state.master_epoch,
                ",".join(str(b) for b in sorted(view.state.sync_state_set)),
            )
            return
        dead_revision, since = noted
        members = [r for b, r in view.replicas.items() if b in view.state.sync_state_set]
        fresh = all(r.report_revision > dead_revision for r in members)
        if not fresh and time.monotonic() - since < self.settings.report_wait_s:
            return
        try:
            election = decide(view)
        except ElectionRefused as e:
            self._refuse_once(name, e.reason)
            return
        if not await self.store.put_state(election.state, view.state_revision, election.record):
            log.info("election for %s: another decider changed the group first", name)
            return
        self.elections += 1
        self._dead_since.pop(name, None)
        self._refusals.pop(name, None)
        record = election.record
        offsets = ", ".join(f"{b}: {o}" for b, o in sorted(record.candidate_offsets.items()))
        log.warning(
            "elected brokerId %d (%s) master of %s for epoch %d (%s; candidates' confirmed "
            "offsets %s)", record.master_broker_id, record.master_address, name, record.epoch,
            record.reason, offsets or "none",
        )
        if record.possible_loss_bytes:
            log.warning(
                "ASYNC_MASTER group %s: the old master had reported offset %d, the new master "
                "starts at %d: up to %d bytes acknowledged by the old master may be lost "
                "(tidemq admin getBrokerEpoch -b %s shows it)", name, record.loss_to_offset,
                record.loss_from_offset, record.possible_loss_bytes, name,
            )

    def _refuse_once(self, name: str, reason: str) -> None:
        if self._refusals.get(name) != reason:
            self._refusals[name] = reason
            log.error("no election for %s: %s", name, reason)

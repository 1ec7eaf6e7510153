"""Who may become a group's master: the rules, as pure functions over one read of the group.

Automatic election (the controller loop, service.py) happens only when the master's process
no longer holds its lease. The candidates are the members of the sync-state set whose
processes are alive; the one with the largest confirmed offset wins (ties: the lowest
brokerId, so two deciders agree). Under SYNC_MASTER every acknowledged message is on every
member of the set (the master grows the set only through etcd, before it counts a new
member's acknowledgement, and shrinks it only through etcd, before it stops waiting for one),
so any member holds every acknowledged message; the largest offset keeps the most of the
unacknowledged tail too. A replica outside the set is never chosen automatically (Kafka's
unclean election is off): with no live member the group waits for one to come back, and an
operator may force another (``electMaster --force``), accepting the loss.

Manual election (``tidemq admin electMaster``) obeys the same rules unless forced: the chosen
replica must be alive and in the set, and a replica that is already master is refused.

The new state: epoch + 1, the chosen master with its current lease and addresses, the set
kept minus the old master (plus the new master); a forced election outside the set starts a
set of the new master alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tidemq.controller.etcd import GroupView
from tidemq.controller.records import ElectionRecord, GroupState, ReplicaReport


@dataclass(slots=True, frozen=True)
class Election:
    """A decision: the new state and its election record, to be committed by CAS."""

    state: GroupState
    record: ElectionRecord


class ElectionRefused(Exception):
    """No election: ``reason`` says why in words an operator can act on."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _best(candidates: list[ReplicaReport]) -> ReplicaReport:
    return min(candidates, key=lambda r: (-r.confirmed_offset, r.broker_id))


def decide(view: GroupView, *, requested_broker_id: int | None = None, force: bool = False,
           manual: bool = False, now_ms: int | None = None) -> Election:
    """The election to commit for ``view``.

    Args:
        view: one read of the group (etcd.py ``read_group``).
        requested_broker_id: the replica an operator asked for (None: the best candidate).
        force: allow a replica outside the sync-state set, and an election while the master
            is alive (manual only).
        manual: an operator's electMaster (the master need not be dead).

    Raises:
        ElectionRefused: nobody may be elected; the reason names the replicas and the rule.
    """
    state = view.state
    name = view.broker_name
    if state is None:
        raise ElectionRefused(
            f"broker group {name!r} has no master yet: its first broker to start in "
            "controller mode becomes master; start one (enableControllerMode=true)"
        )
    master_alive = view.master_alive()
    if master_alive and not manual:
        raise ElectionRefused(
            f"the master of {name!r} (brokerId {state.master_broker_id}) holds its lease")
    members = state.sync_state_set
    alive = {b: r for b, r in view.replicas.items()
             if not (b == state.master_broker_id and master_alive)}
    if requested_broker_id is not None:
        chosen = _requested(view, state, alive, members, requested_broker_id, force,
                            master_alive)
        reason = "electMaster" + (" --force" if force else "")
    else:
        eligible = [r for b, r in alive.items() if b in members]
        if not eligible and force:
            eligible = list(alive.values())
        if not eligible:
            in_set = ", ".join(str(b) for b in sorted(members)) or "none"
            others = ", ".join(str(b) for b in sorted(alive)) or "none"
            raise ElectionRefused(
                f"no live replica of {name!r} is in its sync-state set {{{in_set}}} "
                f"(live replicas: {others}); waiting for a member to come back "
                "(tidemq admin electMaster --force picks another and may lose "
                "acknowledged messages)"
            )
        chosen = _best(eligible)
        reason = ("master lease expired" if not manual
                  else "electMaster" + (" --force" if force else ""))
    if chosen.broker_id in members:
        new_members = (members - {state.master_broker_id}) | {chosen.broker_id}
    else:
        new_members = frozenset({chosen.broker_id})
    epoch = state.master_epoch + 1
    new_state = GroupState(
        broker_name=name,
        master_epoch=epoch,
        master_broker_id=chosen.broker_id,
        master_address=chosen.address,
        master_ha_address=chosen.ha_address,
        master_lease=chosen.lease,
        sync_state_set=frozenset(new_members),
        sync_state_set_epoch=state.sync_state_set_epoch + 1,
        master_flavour=state.master_flavour,
    )
    old_offset = _old_master_offset(view, state)
    loss_from = chosen.confirmed_offset
    loss_to = max(old_offset, loss_from) if state.master_flavour == "ASYNC_MASTER" else loss_from
    record = ElectionRecord(
        epoch=epoch,
        broker_name=name,
        master_broker_id=chosen.broker_id,
        master_address=chosen.address,
        reason=reason,
        previous_master_broker_id=state.master_broker_id,
        candidate_offsets={b: r.confirmed_offset for b, r in alive.items()},
        start_offset=chosen.confirmed_offset,
        loss_from_offset=loss_from,
        loss_to_offset=loss_to,
        flavour=state.master_flavour,
        elected_at_ms=now_ms if now_ms is not None else int(time.time() * 1000),
    )
    return Election(new_state, record)


def _requested(view: GroupView, state: GroupState, alive: dict[int, ReplicaReport],
               members: frozenset[int], broker_id: int, force: bool,
               master_alive: bool) -> ReplicaReport:
    name = view.broker_name
    if broker_id == state.master_broker_id and master_alive:
        raise ElectionRefused(
            f"brokerId {broker_id} is already the master of {name!r} (epoch "
            f"{state.master_epoch}); nothing to do")
    chosen = alive.get(broker_id)
    if chosen is None:
        known = ", ".join(str(b) for b in sorted(alive)) or "none"
        raise ElectionRefused(
            f"brokerId {broker_id} of {name!r} is not alive (no broker process holds a lease "
            f"for it; live replicas: {known}); start it in controller mode first")
    if broker_id not in members and not force:
        in_set = ", ".join(str(b) for b in sorted(members)) or "none"
        raise ElectionRefused(
            f"brokerId {broker_id} of {name!r} is not in the sync-state set {{{in_set}}}: "
            f"it may lack acknowledged messages (its confirmed offset is "
            f"{chosen.confirmed_offset}); choose a member, or add --force to accept losing "
            "what it lacks")
    return chosen


def _old_master_offset(view: GroupView, state: GroupState) -> int:
    """What the old master last said it had (its live report, else its last master offset)."""
    report = view.replicas.get(state.master_broker_id)
    if report is not None and report.epoch == state.master_epoch:
        return report.confirmed_offset
    if view.master_offset is not None and view.master_offset[0] == state.master_epoch:
        return view.master_offset[1]
    return 0

"""Election rules (controller/election.py) over hand-made group views: who may become master."""

from __future__ import annotations

import pytest

from tidemq.controller.election import ElectionRefused, decide
from tidemq.controller.etcd import GroupView
from tidemq.controller.records import ElectionRecord, GroupState, ReplicaReport


def _state(master: int = 1, members: tuple[int, ...] = (1, 2, 3), epoch: int = 4,
           flavour: str = "SYNC_MASTER") -> GroupState:
    return GroupState("broker-a", epoch, master, f"127.0.0.1:{master}0911",
                      f"127.0.0.1:{master}0912", 100 + master, frozenset(members), 7, flavour)


def _report(broker_id: int, offset: int, lease: int | None = None) -> ReplicaReport:
    return ReplicaReport(broker_id, f"127.0.0.1:{broker_id}0911", f"127.0.0.1:{broker_id}0912",
                         offset, 4, "SLAVE", lease=lease if lease is not None else 100 + broker_id)


def _view(state: GroupState | None, *reports: ReplicaReport,
          master_offset: tuple[int, int] | None = None) -> GroupView:
    return GroupView("broker-a", state, 55, {r.broker_id: r for r in reports}, 60,
                     master_offset=master_offset)


def test_dead_master_gives_way_to_the_member_with_the_largest_offset() -> None:
    view = _view(_state(), _report(2, 900), _report(3, 1200), _report(4, 5000))
    election = decide(view, now_ms=1)
    state = election.state
    assert (state.master_broker_id, state.master_epoch, state.master_lease) == (3, 5, 103)
    assert state.master_address == "127.0.0.1:30911"
    assert state.sync_state_set == {2, 3}  # the old master leaves, the non-member 4 stays out
    assert state.sync_state_set_epoch == 8
    record = election.record
    assert (record.epoch, record.previous_master_broker_id, record.start_offset) == (5, 1, 1200)
    assert record.reason == "master lease expired"
    assert record.candidate_offsets == {2: 900, 3: 1200, 4: 5000}
    assert record.possible_loss_bytes == 0  # SYNC_MASTER: no loss window
    assert ElectionRecord.from_json(record.to_json()) == record
    assert GroupState.from_json(state.to_json()) == state


def test_ties_go_to_the_lowest_broker_id() -> None:
    view = _view(_state(), _report(3, 700), _report(2, 700))
    assert decide(view).state.master_broker_id == 2


def test_a_live_master_is_not_replaced_automatically() -> None:
    view = _view(_state(), _report(1, 100), _report(2, 100))
    with pytest.raises(ElectionRefused, match="holds its lease"):
        decide(view)


def test_a_restarted_master_process_has_a_new_lease_and_is_a_candidate() -> None:
    view = _view(_state(), _report(1, 2000, lease=999), _report(2, 1500))
    assert view.master_alive() is False
    election = decide(view)
    assert (election.state.master_broker_id, election.state.master_lease) == (1, 999)
    assert election.state.sync_state_set == {1, 2, 3}


def test_no_live_member_means_no_election_unless_forced() -> None:
    view = _view(_state(members=(1, 2)), _report(3, 99_999))
    with pytest.raises(ElectionRefused) as refused:
        decide(view)
    assert "sync-state set {1, 2}" in refused.value.reason
    assert "live replicas: 3" in refused.value.reason
    assert "--force" in refused.value.reason
    forced = decide(view, force=True, manual=True)
    assert forced.state.master_broker_id == 3
    assert forced.state.sync_state_set == {3}  # outside the set: a set of its own


def test_electmaster_refuses_a_replica_outside_the_set_and_says_why() -> None:
    view = _view(_state(members=(1, 2)), _report(1, 10), _report(2, 10), _report(3, 10))
    with pytest.raises(ElectionRefused) as refused:
        decide(view, requested_broker_id=3, manual=True)
    reason = refused.value.reason
    assert "brokerId 3" in reason and "not in the sync-state set {1, 2}" in reason
    assert "--force" in reason and "confirmed offset is 10" in reason
    forced = decide(view, requested_broker_id=3, manual=True, force=True)
    assert forced.state.master_broker_id == 3 and forced.record.reason == "electMaster --force"


def test_electmaster_moves_mastership_while_the_master_lives() -> None:
    view = _view(_state(members=(1, 2)), _report(1, 10), _report(2, 10))
    election = decide(view, requested_broker_id=2, manual=True)
    assert (election.state.master_broker_id, election.state.master_epoch) == (2, 5)
    assert election.state.sync_state_set == {2}
    with pytest.raises(ElectionRefused, match="already the master"):
        decide(view, requested_broker_id=1, manual=True)
    with pytest.raises(ElectionRefused, match=r"brokerId 7 .* is not alive"):
        decide(view, requested_broker_id=7, manual=True)


def test_async_master_election_records_the_possible_loss_window() -> None:
    state = _state(flavour="ASYNC_MASTER")
    view = _view(state, _report(2, 1000), _report(3, 800), master_offset=(4, 1500))
    record = decide(view).record
    assert (record.loss_from_offset, record.loss_to_offset) == (1000, 1500)
    assert record.possible_loss_bytes == 500
    # A master offset of an older epoch says nothing about this one.
    stale = _view(state, _report(2, 1000), master_offset=(3, 1500))
    assert decide(stale).record.possible_loss_bytes == 0


def test_a_group_without_state_has_nobody_to_elect() -> None:
    with pytest.raises(ElectionRefused, match="no master yet"):
        decide(_view(None, _report(2, 1)))

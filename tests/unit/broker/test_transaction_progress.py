"""Transaction progress: which halves ended, which are pending, and the checkpoint file."""

from __future__ import annotations

import pytest

from tidemq.broker.transaction.prepared_ranges import PreparedRange
from tidemq.broker.transaction.progress import (
    ENDED_REMEMBERED_MAX,
    PendingHalf,
    TransactionProgress,
)
from tidemq.broker.transaction.records import Outcome
from tidemq.errors import ConfigFileCorrupt


def pending(offset: int, due_ms: int, *, group: str = "pg", transaction_id: str = "",
            check_times: int = 0) -> PendingHalf:
    return PendingHalf(offset, 1000 + offset, 0, group, transaction_id or f"tx-{offset}",
                       check_times, due_ms)


def test_lookup_tells_ended_pending_and_unscanned_halves_apart(tmp_path):
    progress = TransactionProgress(tmp_path / "p.json")
    progress.scan_offset = 10
    progress.add_pending(pending(3, 100))
    progress.end(12, Outcome.COMMIT, op_offset=0)

    assert progress.lookup(2) == (True, None)  # scanned, not pending: ended long ago
    assert progress.lookup(3) == (False, None)  # pending
    assert progress.lookup(12) == (True, Outcome.COMMIT)  # ended ahead of the scan
    assert progress.lookup(11) == (False, None)  # not scanned yet
    progress.end(3, Outcome.ROLLBACK, op_offset=1)
    assert progress.lookup(3) == (True, Outcome.ROLLBACK)
    assert progress.find_pending("pg", "tx-3") is None


def test_due_checks_come_in_time_order_and_skip_ended_or_moved_halves(tmp_path):
    progress = TransactionProgress(tmp_path / "p.json")
    progress.scan_offset = 10
    for offset, due in ((1, 300), (2, 100), (3, 200), (4, 150)):
        progress.add_pending(pending(offset, due))
    progress.end(4, Outcome.COMMIT, op_offset=0)
    progress.reschedule(progress.pending[3], 1000)

    assert progress.next_due_ms() == 100
    assert progress.pop_due(250).queue_offset == 2
    assert progress.pop_due(250) is None  # 4 ended, 3 moved to 1000, 1 not due yet
    assert progress.pop_due(300).queue_offset == 1
    assert progress.next_due_ms() == 1000


def test_pending_halves_are_found_by_group_and_transaction_id(tmp_path):
    progress = TransactionProgress(tmp_path / "p.json")
    progress.add_pending(pending(5, 0, group="orders", transaction_id="order-42"))
    assert progress.find_pending("orders", "order-42").queue_offset == 5
    assert progress.find_pending("other", "order-42") is None


def test_checkpoint_round_trips_and_replays_from_the_oldest_op_ahead_of_the_scan(tmp_path):
    path = tmp_path / "transactionProgress.json"
    progress = TransactionProgress(path)
    progress.scan_offset = 20
    progress.add_pending(pending(7, 0, check_times=3))
    progress.end(5, Outcome.COMMIT, op_offset=30)  # below the scan: not needed to replay
    progress.end(22, Outcome.ROLLBACK, op_offset=41)
    progress.end(21, Outcome.COMMIT, op_offset=44)

    snapshot = progress.snapshot(op_max_offset=50)
    progress.write_snapshot(snapshot)
    assert progress.snapshot(op_max_offset=50) is None  # unchanged: nothing to write

    loaded = TransactionProgress(path).loaded
    assert loaded.half_scan_offset == 20
    assert loaded.op_replay_offset == 41
    assert loaded.pending_check_times == {7: 3}


def test_checkpoint_without_ended_halves_ahead_replays_from_the_op_queue_end(tmp_path):
    progress = TransactionProgress(tmp_path / "p.json")
    progress.scan_offset = 4
    progress.end(1, Outcome.COMMIT, op_offset=9)
    assert progress.checkpoint(op_max_offset=12).op_replay_offset == 12


def test_a_corrupt_checkpoint_falls_back_to_its_backup(tmp_path):
    path = tmp_path / "transactionProgress.json"
    progress = TransactionProgress(path)
    progress.scan_offset = 3
    progress.write_snapshot(progress.snapshot(0))
    progress.scan_offset = 4
    progress.write_snapshot(progress.snapshot(0))  # the first version is now the .bak
    path.write_text('{"halfScanOffset": "four"}')

    assert TransactionProgress(path).loaded.half_scan_offset == 3


def test_a_checkpoint_and_backup_both_corrupt_name_the_files(tmp_path):
    path = tmp_path / "transactionProgress.json"
    path.write_text('{"pending": {"x": 1}}')
    (tmp_path / "transactionProgress.json.bak").write_text("not json")
    with pytest.raises(ConfigFileCorrupt, match=r"transactionProgress\.json"):
        TransactionProgress(path)


def test_old_outcomes_are_forgotten_but_still_count_as_ended(tmp_path):
    progress = TransactionProgress(tmp_path / "p.json")
    total = 2 * ENDED_REMEMBERED_MAX + 10
    progress.scan_offset = total
    for offset in range(total):
        progress.end(offset, Outcome.COMMIT, op_offset=offset)

    assert len(progress.ended) <= ENDED_REMEMBERED_MAX + 10
    assert progress.lookup(0) == (True, None)
    assert progress.lookup(total - 1) == (True, Outcome.COMMIT)


def prepared(first: int, count: int, due_ms: int = 0) -> PreparedRange:
    return PreparedRange(first, count, "q", "1", f"w{first}", "pg", due_ms)


def test_halves_of_an_open_prepared_range_are_open_below_the_scan_until_they_end(tmp_path):
    progress = TransactionProgress(tmp_path / "p.json")
    progress.prepared.add(prepared(10, 5))
    progress.scan_offset = 30
    assert progress.lookup(9) == (True, None)
    assert progress.lookup(12) == (False, None)
    progress.end(12, Outcome.ROLLBACK, op_offset=7)  # on its own: the range notes it
    assert progress.lookup(12) == (True, Outcome.ROLLBACK)
    assert progress.lookup(13) == (False, None)
    whole = progress.prepared.find(10)
    assert whole.ended_apart
    progress.end_range(whole, Outcome.COMMIT, 8, [10, 11, 13, 14])
    assert progress.lookup(14) == (True, Outcome.COMMIT)
    assert progress.prepared.find(10) is None


def test_checkpoint_keeps_open_ranges_and_replays_their_apart_ends(tmp_path):
    path = tmp_path / "transactionProgress.json"
    progress = TransactionProgress(path)
    progress.prepared.add(prepared(0, 4))
    progress.prepared.add(prepared(4, 2))
    progress.scan_offset = 6
    progress.end(5, Outcome.ROLLBACK, op_offset=3)  # below the scan, inside an open range

    progress.write_snapshot(progress.snapshot(op_max_offset=9))
    loaded = TransactionProgress(path).loaded
    assert loaded.prepared_ranges == [(0, 4), (4, 2)]
    assert loaded.op_replay_offset == 3
    assert loaded.pending_check_times == {}


def test_ends_inside_open_ranges_are_never_forgotten(tmp_path):
    progress = TransactionProgress(tmp_path / "p.json")
    total = 2 * ENDED_REMEMBERED_MAX + 10
    progress.prepared.add(prepared(5, 3))
    progress.scan_offset = total
    for offset in range(total):
        progress.end(offset, Outcome.COMMIT, op_offset=offset)
    assert progress.lookup(6) == (True, Outcome.COMMIT)
    assert progress.lookup(0) == (True, None)

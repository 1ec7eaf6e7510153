"""StoreCore.truncate_to (store/truncation.py): what it drops, that the store goes on from
the cut, and that a SIGKILL at any step of it leaves a store that finishes it on open."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tidemq.errors import StoreError
from tidemq.store.config import StoreConfig
from tidemq.store.epochs import EpochEntry
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import StoreMessage
from tidemq.store.memory_store import MemoryMessageStore
from tidemq.store.truncation import INTENT_FILE_NAME

SMALL = {"mapped_file_size_commit_log": 64 * 1024, "mapped_file_size_consume_queue": 20 * 400,
         "max_hash_slot_num": 64, "max_index_num": 256}


def config(path) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(path), **SMALL)


def put(store, i: int, queue_id: int | None = None):
    body = f"message {i} ".encode() * (5 + i % 40)
    properties = {"KEYS": f"k{i}", "UNIQ_KEY": f"id-{i}"}
    result = store.put_message(StoreMessage("Orders", i % 3 if queue_id is None else queue_id,
                                            body, properties))
    assert result.ok
    return result


def fill(store, count: int) -> list:
    return [put(store, i) for i in range(count)]


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_truncate_to_drops_exactly_the_records_after_the_cut(tmp_path, kind):
    store = (FileMessageStore(config(tmp_path)) if kind == "file"
             else MemoryMessageStore(config(tmp_path)))
    try:
        results = fill(store, 400)  # several 64 KiB segments
        cut = results[300].physical_offset
        end = store.commit_log_max_offset()
        if kind == "file":
            store.epochs.append(1, 0)
            store.epochs.append(2, results[350].physical_offset)
        truncation = store.truncate_to(cut)
        assert (truncation.new_end, truncation.old_end) == (cut, end)
        assert [r.msg_id for r in truncation.records] == [f"id-{i}" for i in range(300, 400)]
        assert [r.physical_offset for r in truncation.records] == [
            r.physical_offset for r in results[300:]]
        lines = truncation.id_lines(per_line=40)
        assert [line.split(":")[0] for line in lines] == [
            "msgIds 1-40 of 100", "msgIds 41-80 of 100", "msgIds 81-100 of 100"]
        assert all(f"id-{i}@" in "".join(lines) for i in range(300, 400))
        assert store.commit_log_max_offset() == cut
        assert [store.max_offset("Orders", q) for q in range(3)] == [100, 100, 100]
        assert store.query_messages("Orders", "k350", 8, 0, 1 << 62).records == []
        assert len(store.query_messages("Orders", "k299", 8, 0, 1 << 62).records) == 1
        if kind == "file":
            assert store.epochs.entries == [EpochEntry(1, 0)]
            assert truncation.epochs_dropped == [2]
        # The store goes on from the cut: new records take the dropped offsets and are
        # served and indexed.
        again = put(store, 1000, queue_id=1)
        assert again.physical_offset == cut and again.queue_offset == 100
        assert len(store.query_messages("Orders", "k1000", 8, 0, 1 << 62).records) == 1
        assert store.truncate_to(store.commit_log_max_offset()).count == 0
    finally:
        store.close()
    if kind == "file":
        reopened = FileMessageStore(config(tmp_path))
        try:
            assert reopened.commit_log_max_offset() == again.physical_offset + again.wrote_bytes
            assert reopened.max_offset("Orders", 1) == 101
        finally:
            reopened.close()


def test_an_offset_inside_a_record_or_outside_the_log_is_refused(tmp_path):
    store = MemoryMessageStore(config(tmp_path))
    results = fill(store, 10)
    end = store.commit_log_max_offset()
    with pytest.raises(StoreError, match="no record starts there"):
        store.truncate_to(results[5].physical_offset + 3)
    with pytest.raises(StoreError, match=f"holds offsets 0 to {end}"):
        store.truncate_to(end + 1)
    assert store.commit_log_max_offset() == end


# Steps of a truncation at which the child kills itself (after the intent file is written).
KILL_POINTS = ["epochs", "commit_log", "queues", "index", "flush"]

CHILD = textwrap.dedent("""
    import os, signal, sys
    from tidemq.store.config import StoreConfig
    from tidemq.store.file_store import FileMessageStore
    from tidemq.store import store_core, epochs, commit_log, consume_queue, index_file
    root, cut, point = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    def die(*_a, **_k):
        os.kill(os.getpid(), signal.SIGKILL)
    targets = {
        "epochs": (epochs.EpochFile, "truncate_from"),
        "commit_log": (commit_log.CommitLog, "truncate"),
        "queues": (consume_queue.ConsumeQueue, "truncate_from_physical"),
        "index": (index_file.IndexService, "drop_from"),
        "flush": (commit_log.CommitLog, "flush"),
    }
    cls, name = targets[point]
    original = getattr(cls, name)
    def step(self, *a, **k):
        if point in ("queues", "flush"):
            original(self, *a, **k)  # part of the step done, then the kill
        die()
    store = FileMessageStore(StoreConfig(store_path_root_dir=root, **SMALL))
    setattr(cls, name, step)
    store.truncate_to(cut)
    print("not killed")
""").replace("SMALL", repr(SMALL))


@pytest.mark.parametrize("point", KILL_POINTS)
def test_sigkill_during_a_truncation_then_open_finishes_it(tmp_path, point):
    store = FileMessageStore(config(tmp_path))
    results = fill(store, 200)
    store.epochs.append(1, 0)
    store.epochs.append(2, results[150].physical_offset)
    cut = results[120].physical_offset
    store.close()
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), str(cut), point],
                           capture_output=True, text=True, timeout=120, check=False)
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    assert os.path.exists(tmp_path / INTENT_FILE_NAME)
    store = FileMessageStore(config(tmp_path))
    try:
        assert not os.path.exists(tmp_path / INTENT_FILE_NAME)
        assert store.commit_log_max_offset() == cut
        assert sum(store.max_offset("Orders", q) for q in range(3)) == 120
        assert store.epochs.entries == [EpochEntry(1, 0)]
        assert store.query_messages("Orders", "k130", 8, 0, 1 << 62).records == []
        assert len(store.query_messages("Orders", "k119", 8, 0, 1 << 62).records) == 1
        again = put(store, 5000, queue_id=0)
        assert again.physical_offset == cut
    finally:
        store.close()
    checked = subprocess.run([sys.executable, "-m", "tidemq", "store", "check", str(tmp_path)],
                             capture_output=True, text=True, timeout=120, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_slave_cuts_a_half_copied_record_back_to_its_last_whole_one(tmp_path):
    master = MemoryMessageStore(config(tmp_path / "m"))
    slave = MemoryMessageStore(config(tmp_path / "s"))
    results = fill(master, 20)
    cut_inside = results[15].physical_offset + 40  # the chunk ends inside record 15
    slave.append_replicated(0, master.read_commit_log(0, cut_inside))
    slave.dispatch_replicated()
    confirmed = slave.replicated_confirmed_offset()
    assert confirmed == results[15].physical_offset < slave.commit_log_max_offset()
    truncation = slave.truncate_to(confirmed)
    assert truncation.count == 0 and truncation.dropped_bytes == 40
    assert slave.commit_log_max_offset() == confirmed
    assert put(slave, 99, queue_id=0).physical_offset == confirmed


def test_the_index_is_cut_in_place_keeping_each_keys_older_entries(tmp_path):
    store = FileMessageStore(StoreConfig(store_path_root_dir=str(tmp_path),
                                         **{**SMALL, "max_index_num": 4096}))
    try:
        for i in range(200):
            properties = {"KEYS": f"k{i} shared{i % 7}", "UNIQ_KEY": f"id-{i}"}
            result = store.put_message(StoreMessage("Orders", i % 3, b"m" * 40, properties))
            if i == 150:
                cut = result.physical_offset
        files_before = sorted(os.listdir(tmp_path / "index"))
        expected = {key: [r for r in store.query_messages("Orders", key, 64, 0, 1 << 62).records
                          if int(r.rsplit(b"id-", 1)[-1].split(b"\x02")[0]) < 150]
                    for key in (f"shared{j}" for j in range(7))}
        store.truncate_to(cut)
        # No index file rebuilt from the log (in place), every older entry still found.
        assert sorted(os.listdir(tmp_path / "index")) == files_before
        for key, records in expected.items():
            assert sorted(store.query_messages("Orders", key, 64, 0, 1 << 62).records) == sorted(
                records)
        assert store.index.last_update_physical_offset < cut
        again = put(store, 777, queue_id=2)
        assert again.physical_offset == cut
        assert len(store.query_messages("Orders", "k777", 8, 0, 1 << 62).records) == 1
    finally:
        store.close()

"""Lost, cut or zeroed files found at start-up, after a clean stop and after a crash: the
store comes up, says what it found and did, rebuilds the derived files from the commit log
and serves every intact message (STYLE 10: the recovery path is asserted to have run)."""

from __future__ import annotations

import glob
import logging
import os
import shutil

import pytest
from store_helpers import SEGMENT_SIZE, small_config
from test_store_recovery import TOPIC, bodies, reopen_after_crash, segment_path, write_messages

from tidemq.protocol.message import decode_records
from tidemq.store.check import check_store
from tidemq.store.check_derived import IndexSettings
from tidemq.store.file_store import FileMessageStore

STOPS = ["clean", "crash"]


@pytest.fixture
def config(tmp_path):
    return small_config(tmp_path / "store")


def checked(config):
    """``store check`` with the index settings of small_config."""
    return check_store(config.store_path_root_dir, index_settings=IndexSettings(64, 1000))


def test_a_clean_store_passes_the_whole_check_index_included(config):
    write_messages(config, 300, queue_count=3)
    report = checked(config)
    assert report.ok, report.problems
    assert report.index_files == 1 and report.queues == 3


def reopen(config, stop):
    return FileMessageStore(config) if stop == "clean" else reopen_after_crash(config)


def queue_dir(config, queue_id):
    return os.path.join(config.store_path_root_dir, "consumequeue", TOPIC, str(queue_id))


def queue_segments(config, queue_id):
    return sorted(glob.glob(os.path.join(queue_dir(config, queue_id), "0" * 5 + "*")))


def all_served(store, counts):
    return all(len(bodies(store, q)) == n for q, n in counts.items())


@pytest.mark.parametrize("stop", STOPS)
def test_a_deleted_consume_queue_is_rebuilt(config, stop, caplog):
    write_messages(config, 300, queue_count=3)
    shutil.rmtree(queue_dir(config, 1))
    (problem,) = checked(config).problems
    assert "consume queue Orders/1 is missing" in problem.message
    caplog.set_level(logging.WARNING)
    store = reopen(config, stop)
    try:
        assert (TOPIC, 1) in store.recovery_report.rebuilt_queues
        assert "consume queue Orders/1" in caplog.text and "rebuilding it" in caplog.text
        assert all_served(store, {0: 100, 1: 100, 2: 100})
        assert store.put_message(message_to(1)).queue_offset == 100
    finally:
        store.close()


def message_to(queue_id):
    from store_helpers import message

    return message(queue_id=queue_id, body=b"after")


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("damage", ["cut mid-entry", "zeroed", "last deleted"])
def test_a_cut_or_zeroed_consume_queue_file_is_rebuilt(config, stop, damage):
    write_messages(config, 600, queue_count=1)  # 6 queue segments of 100 entries
    segments = queue_segments(config, 0)
    assert len(segments) == 6
    if damage == "cut mid-entry":
        os.truncate(segments[2], 20 * 40 + 7)
    elif damage == "zeroed":
        with open(segments[1], "r+b") as f:
            f.write(bytes(os.path.getsize(segments[1])))
    else:
        os.unlink(segments[-1])
    report = checked(config)
    assert not report.ok
    expected = {"cut mid-entry": "(cut short)", "zeroed": "(it is zeros)",
                "last deleted": "ends at offset 500"}[damage]
    assert any(expected in p.message for p in report.problems), report.problems
    store = reopen(config, stop)
    try:
        assert (TOPIC, 0) in store.recovery_report.rebuilt_queues
        assert store.max_offset(TOPIC, 0) == 600
        assert len(bodies(store, 0)) == 600
    finally:
        store.close()


@pytest.mark.parametrize("stop", STOPS)
def test_a_commit_log_segment_cut_mid_record_keeps_its_valid_records_and_later_segments(
    config, stop, caplog
):
    results = write_messages(config, 400, queue_count=1)  # about 6 segments
    victim = next(r for r in results if r.physical_offset > SEGMENT_SIZE + SEGMENT_SIZE // 2)
    segment = segment_path(config, SEGMENT_SIZE)
    os.truncate(segment, victim.physical_offset - SEGMENT_SIZE + 30)
    lost = [r for r in results
            if r.physical_offset >= victim.physical_offset
            and r.physical_offset < 2 * SEGMENT_SIZE]
    caplog.set_level(logging.WARNING)
    store = reopen(config, stop)
    try:
        assert "shorter than the segment size" in caplog.text and "cut short" in caplog.text
        assert "configured segment size" not in caplog.text
        end = results[-1].physical_offset + results[-1].wrote_bytes
        assert store.commit_log_max_offset() == end
        (damaged,) = store.recovery_report.damaged
        assert damaged.start == victim.physical_offset
        assert len(bodies(store, 0)) == 400 - len(lost)
        assert store.put_message(message_to(0)).ok
    finally:
        store.close()


def index_file_paths(config):
    return sorted(glob.glob(os.path.join(config.store_path_root_dir, "index", "*")))


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("damage", ["deleted", "truncated", "zeroed"])
def test_a_damaged_index_file_is_rebuilt(config, stop, damage, caplog):
    write_messages(config, 300, queue_count=1)  # 600 keys: one index file of 1000 entries
    (path,) = index_file_paths(config)
    if damage == "deleted":
        os.unlink(path)
    elif damage == "truncated":
        os.truncate(path, os.path.getsize(path) // 2 + 3)
    else:
        with open(path, "r+b") as f:
            f.write(bytes(os.path.getsize(path)))
    report = checked(config)
    assert not report.ok, damage
    caplog.set_level(logging.WARNING)
    store = reopen(config, stop)
    try:
        for key, unique in (("k7", "U0007"), ("k299", "U0299")):
            found = store.query_messages(TOPIC, key, 10, 0, 2**62)
            assert [m.unique_key for m in decode_records(found.body)] == [unique]
        assert len(bodies(store, 0)) == 300
        if stop == "clean":
            # After a crash re-dispatch from the recovery point restores it anyway.
            assert store.recovery_report.index_rebuilt
    finally:
        store.close()

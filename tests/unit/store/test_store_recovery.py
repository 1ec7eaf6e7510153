"""Reopening a store: clean restarts, rebuilt derived files, torn tails and garbage (STYLE 10)."""

from __future__ import annotations

import logging
import mmap
import os
import random
import re
import resource
import shutil
import struct

import pytest
from store_helpers import SEGMENT_SIZE, message, small_config

from tidemq.protocol.message import decode_records
from tidemq.store.check import check_store
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import GetStatus

TOPIC = "Orders"


def segment_path(config, start):
    return os.path.join(config.store_path_root_dir, "commitlog", str(start).zfill(20))


def queue_files(config):
    """{relative path: bytes} of every consume-queue file."""
    root = os.path.join(config.store_path_root_dir, "consumequeue")
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = f.read()
    return found


def bodies(store, queue_id=0, offset=0):
    out = []
    for _ in range(100):
        result = store.get_messages(TOPIC, queue_id, offset, 32, 1 << 30)
        if result.status is not GetStatus.FOUND:
            return out
        out.extend(m.body for m in decode_records(result.body))
        offset = result.next_begin_offset
    raise AssertionError("queue did not end")


def write_messages(config, count, queue_count=2, body_size=400):
    """Write messages (about 5 KB per 12) and close cleanly; return their put results."""
    store = FileMessageStore(config)
    results = [
        store.put_message(
            message(queue_id=i % queue_count, body=bytes([65 + i % 26]) * body_size,
                    keys=f"k{i}", unique_key=f"U{i:04d}", tags=f"t{i % 3}")
        )
        for i in range(count)
    ]
    store.close()
    return results


def reopen_after_crash(config):
    """Open as if the last run died: the abort file is there."""
    with open(os.path.join(config.store_path_root_dir, "abort"), "wb"):
        pass
    return FileMessageStore(config)


def test_clean_reopen_keeps_every_offset_and_appends_where_it_stopped(config):
    results = write_messages(config, 300)
    store = FileMessageStore(config)
    try:
        assert store.recovery_report.clean_exit
        assert store.max_offset(TOPIC, 0) == 150
        end = results[-1].physical_offset + results[-1].wrote_bytes
        assert store.commit_log_max_offset() == end
        nxt = store.put_message(message(queue_id=1, body=b"after"))
        assert (nxt.queue_offset, nxt.physical_offset) == (150, end)
        assert bodies(store, 1)[-1] == b"after"
        assert os.path.exists(os.path.join(config.store_path_root_dir, "abort"))
    finally:
        store.close()
    assert not os.path.exists(os.path.join(config.store_path_root_dir, "abort"))


def test_deleted_consume_queues_and_index_are_rebuilt_identical(config):
    write_messages(config, 300, queue_count=3)
    before = queue_files(config)
    root = config.store_path_root_dir
    shutil.rmtree(os.path.join(root, "consumequeue"))
    shutil.rmtree(os.path.join(root, "index"))
    store = FileMessageStore(config)
    try:
        assert store.recovery_report.redispatched_records == 300
        found = store.query_messages(TOPIC, "k123", 10, 0, 2**62)
        assert [m.unique_key for m in decode_records(found.body)] == ["U0123"]
        assert len(bodies(store, 2)) == 100
    finally:
        store.close()
    assert queue_files(config) == before


def test_torn_tail_is_cut_on_recovery_and_appends_go_on(config, caplog):
    results = write_messages(config, 40)
    last = results[-1]
    # The last record was half written when the process died: its second half is zeros.
    with open(segment_path(config, 0), "r+b") as f:
        f.seek(last.physical_offset + last.wrote_bytes // 2)
        f.write(bytes(last.wrote_bytes - last.wrote_bytes // 2))
    caplog.set_level(logging.WARNING, logger="tidemq.store.recovery")
    store = reopen_after_crash(config)
    try:
        assert f"at {segment_path(config, 0)}:{last.physical_offset}" in caplog.text
        assert "truncated" in caplog.text
        assert store.commit_log_max_offset() == last.physical_offset
        assert store.max_offset(TOPIC, 1) == 19  # its queue entry went with it
        assert len(bodies(store, 0)) == 20
        again = store.put_message(message(queue_id=1, body=b"again"))
        assert (again.physical_offset, again.queue_offset) == (last.physical_offset, 19)
        assert bodies(store, 1)[-1] == b"again"
    finally:
        store.close()
    assert check_store(config.store_path_root_dir).ok


def test_garbage_after_the_last_record_is_cut(config, caplog):
    results = write_messages(config, 30)
    end = results[-1].physical_offset + results[-1].wrote_bytes
    garbage = random.Random(7).randbytes(3000)
    with open(segment_path(config, 0), "r+b") as f:
        f.seek(end)
        f.write(garbage)
    assert not check_store(config.store_path_root_dir).ok
    caplog.set_level(logging.WARNING, logger="tidemq.store.recovery")
    store = reopen_after_crash(config)
    try:
        assert f"truncated 3000 invalid bytes at {segment_path(config, 0)}:{end}" in caplog.text
        assert store.commit_log_max_offset() == end
        assert len(bodies(store, 0)) + len(bodies(store, 1)) == 30
        assert store.put_message(message(body=b"fresh")).physical_offset == end
    finally:
        store.close()
    assert check_store(config.store_path_root_dir).ok


@pytest.mark.parametrize("seed", [11, 12, 13, 14, 15, 16])
def test_garbage_from_a_random_offset_to_a_segment_end_costs_only_the_records_there(
    config, caplog, seed
):
    print(f"seed={seed}")
    rng = random.Random(seed)
    results = write_messages(config, 200)  # about 3 segments
    end = results[-1].physical_offset + results[-1].wrote_bytes
    cut = rng.randrange(results[5].physical_offset, end)
    start = cut - cut % SEGMENT_SIZE
    with open(segment_path(config, start), "r+b") as f:
        f.seek(cut - start)
        f.write(rng.randbytes(SEGMENT_SIZE - (cut - start)))
    hit = [
        i for i, r in enumerate(results)
        if r.physical_offset + r.wrote_bytes > cut and r.physical_offset < start + SEGMENT_SIZE
    ]
    caplog.set_level(logging.WARNING, logger="tidemq.store.recovery")
    store = reopen_after_crash(config)
    try:
        if end <= start + SEGMENT_SIZE:
            # The garbage is in the last segment: a torn tail, cut.
            assert "truncated" in caplog.text
            # A cut right at a segment start leaves the previous segment's blank as end.
            assert store.commit_log_max_offset() in (results[hit[0]].physical_offset, start)
        else:
            # Damage in the middle: only its records are lost, later segments are kept.
            assert "damaged commit-log range" in caplog.text
            assert store.commit_log_max_offset() == end
            (damaged,) = store.recovery_report.damaged
            assert damaged.end == start + SEGMENT_SIZE
        kept = bodies(store, 0) + bodies(store, 1)
        assert len(kept) == len(results) - len(hit)
        assert store.put_message(message(body=b"new")).ok
    finally:
        store.close()
    report = check_store(config.store_path_root_dir)
    assert report.ok == (end <= start + SEGMENT_SIZE)


def test_consume_queue_entries_past_the_log_end_are_dropped(config):
    results = write_messages(config, 20, queue_count=1)
    # The queue reached the disk but the commit log's last two records did not.
    with open(segment_path(config, 0), "r+b") as f:
        f.seek(results[18].physical_offset)
        f.write(bytes(results[18].wrote_bytes + results[19].wrote_bytes))
    store = reopen_after_crash(config)
    try:
        assert store.max_offset(TOPIC, 0) == 18
        assert store.recovery_report.dropped_queue_entries == 2
        assert store.put_message(message(body=b"x")).queue_offset == 18
    finally:
        store.close()


def test_torn_consume_queue_entry_is_dropped_and_rebuilt(config):
    write_messages(config, 10, queue_count=1)
    queue_file = os.path.join(config.store_path_root_dir, "consumequeue", TOPIC, "0", "0" * 20)
    with open(queue_file, "r+b") as f:  # the last entry's size was torn
        f.seek(9 * 20 + 8)
        f.write(struct.pack(">i", 12345))
    store = reopen_after_crash(config)
    try:
        assert store.max_offset(TOPIC, 0) == 10  # dropped, then re-dispatched from the log
        assert len(bodies(store, 0)) == 10
    finally:
        store.close()
    assert check_store(config.store_path_root_dir).ok


def test_crash_recovery_starts_from_the_checkpoint_segment(config):
    results = write_messages(config, 400)  # about 6 segments
    last_segment_start = results[-1].physical_offset // SEGMENT_SIZE * SEGMENT_SIZE
    # The checkpoint says every part was flushed well after the last store time (the
    # 3-second slack included), so only the last segment needs a scan.
    later = results[-1].store_timestamp + 10_000
    with open(os.path.join(config.store_path_root_dir, "checkpoint"), "r+b") as f:
        f.write(struct.pack(">qqq", later, later, later))
    store = reopen_after_crash(config)
    try:
        report = store.recovery_report
        assert not report.clean_exit
        assert report.scan_start == last_segment_start
        assert report.truncated_bytes == 0
        assert len(bodies(store, 0)) == 200
    finally:
        store.close()
    # Without a usable checkpoint (all zeros) the scan starts at the first segment.
    with open(os.path.join(config.store_path_root_dir, "checkpoint"), "r+b") as f:
        f.write(bytes(24))
    store = reopen_after_crash(config)
    try:
        assert store.recovery_report.scan_start == 0
        assert store.max_offset(TOPIC, 1) == 200
    finally:
        store.close()


def test_flipped_body_bit_costs_only_its_record_after_crash_recovery(config, caplog):
    results = write_messages(config, 12, queue_count=1)
    victim = results[6]
    with open(segment_path(config, 0), "r+b") as f:
        f.seek(victim.physical_offset + 100)
        byte = f.read(1)[0]
        f.seek(victim.physical_offset + 100)
        f.write(bytes([byte ^ 0x10]))
    caplog.set_level(logging.WARNING)
    store = reopen_after_crash(config)
    try:
        end = results[-1].physical_offset + results[-1].wrote_bytes
        assert store.commit_log_max_offset() == end
        assert store.max_offset(TOPIC, 0) == 12
        (damaged,) = store.recovery_report.damaged
        assert (damaged.start, damaged.end) == (
            victim.physical_offset, victim.physical_offset + victim.wrote_bytes
        )
        assert "body CRC" in damaged.problem
        assert f"{segment_path(config, 0)}:{victim.physical_offset}" in caplog.text
        assert store.recovery_report.blanked_queue_entries == 1
        kept = bodies(store, 0)
        assert len(kept) == 11 and bytes([65 + 6]) * 400 not in kept  # 12 < 26: unique
        # Never served, by any path.
        assert store.read_message(victim.physical_offset) is None
        assert store.query_messages(TOPIC, "k6", 10, 0, 2**62).records == []
        assert store.put_message(message(body=b"after")).queue_offset == 12
    finally:
        store.close()


def test_a_damaged_header_in_the_middle_resyncs_at_the_next_valid_record(config):
    results = write_messages(config, 12, queue_count=1)
    victim = results[4]
    with open(segment_path(config, 0), "r+b") as f:
        f.seek(victim.physical_offset)  # TOTALSIZE of the victim
        f.write(struct.pack(">i", 7))
    for reopen in (reopen_after_crash, FileMessageStore):
        store = reopen(config)
        try:
            assert store.commit_log_max_offset() == (
                results[-1].physical_offset + results[-1].wrote_bytes
            )
            (damaged,) = store.recovery_report.damaged
            assert (damaged.start, damaged.end) == (
                victim.physical_offset, results[5].physical_offset
            )
            assert len(bodies(store, 0)) == 11
        finally:
            store.close()


def test_queues_rebuilt_after_retention_start_at_the_first_remaining_record(config):
    store = FileMessageStore(config)
    for i in range(400):  # ~1 KB each: 7 segments
        store.put_message(message(queue_id=i % 2, body=b"z" * 900, keys=f"k{i}"))
    now_ms = store.commit_log.queue.files[-1].last_modified_ms + 100 * 3_600_000
    deleted = store.run_retention(now_ms, disk_used_ratio=90)  # a full disk: go now
    assert deleted >= 3
    first_kept = store.min_offset(TOPIC, 0)
    store.close()
    shutil.rmtree(os.path.join(config.store_path_root_dir, "consumequeue"))
    store = FileMessageStore(config)
    try:
        assert store.min_offset(TOPIC, 0) == first_kept
        assert store.max_offset(TOPIC, 0) == 200
        low = store.get_messages(TOPIC, 0, 0, 32, 1 << 20)
        assert (low.status, low.next_begin_offset) == (GetStatus.OFFSET_TOO_SMALL, first_kept)
        kept = bodies(store, 0, first_kept)
        assert len(kept) == 200 - first_kept
        assert store.put_message(message(body=b"more")).queue_offset == 200
    finally:
        store.close()
    assert check_store(config.store_path_root_dir).ok


def test_last_segment_cut_short_mid_record_is_extended_and_its_tail_cut(config, caplog):
    results = write_messages(config, 30)
    last = results[-1]
    segment = segment_path(config, 0)
    os.truncate(segment, last.physical_offset + 50)  # the file ends inside the last record
    caplog.set_level(logging.WARNING)
    store = reopen_after_crash(config)
    try:
        assert "shorter than the segment size" in caplog.text
        # N counts up to the last non-zero byte of what is left of the record.
        assert re.search(rf"truncated (49|50) invalid bytes at {segment}:{last.physical_offset}",
                         caplog.text)
        assert os.path.getsize(segment) == SEGMENT_SIZE
        assert len(bodies(store, 0)) + len(bodies(store, 1)) == 29
        assert store.put_message(message(body=b"next")).physical_offset == last.physical_offset
    finally:
        store.close()
    assert check_store(config.store_path_root_dir).ok


def test_a_damaged_header_in_a_segment_a_clean_start_did_not_scan_is_never_served(
    config, caplog
):
    results = write_messages(config, 400, queue_count=1)  # about 6 segments
    victim = results[3]  # in the first segment: a clean start scans only the last three
    with open(segment_path(config, 0), "r+b") as f:
        f.seek(victim.physical_offset + 4)  # MAGICCODE
        f.write(b"\x00\x00\x00\x01")
    caplog.set_level(logging.ERROR)
    store = FileMessageStore(config)
    try:
        assert store.recovery_report.clean_exit and not store.recovery_report.damaged
        kept = bodies(store, 0)
        assert len(kept) == 399
        assert kept.count(bytes([65 + 3]) * 400) == len(range(3, 400, 26)) - 1
        assert f"{segment_path(config, 0)}:{victim.physical_offset}" in caplog.text
        assert "was not served" in caplog.text
    finally:
        store.close()
    report = check_store(config.store_path_root_dir)
    assert not report.ok
    assert any(p.position == victim.physical_offset and "magic" in p.message
               for p in report.problems)


@pytest.mark.parametrize("crashed", [False, True])
def test_opening_a_store_does_not_read_the_unwritten_rest_of_its_last_segment(tmp_path, crashed):
    # A few KiB of log in a 256 MiB segment (the default is 1 GiB): recovery's search for a
    # record after the log's end and its cut of the tail look only at the bytes ever written.
    # Reading the zero rest faulted in the whole segment on every start (4.7 s for a 1 GiB
    # segment on the test machine). Counted in page faults, not time: the machine is shared.
    config = small_config(tmp_path / "store", mapped_file_size_commit_log=256 << 20,
                          warm_mapped_file_enable=False)
    write_messages(config, 24)
    if crashed:
        with open(os.path.join(config.store_path_root_dir, "abort"), "wb"):
            pass
    faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    store = FileMessageStore(config)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
    try:
        segment_pages = (256 << 20) // mmap.PAGESIZE
        # Reading the rest took 1,500-2,200 faults here (the kernel maps pages around each
        # fault); the store's own start takes about 10.
        assert faults < segment_pages // 256, faults
        assert len(bodies(store, 0)) + len(bodies(store, 1)) == 24
    finally:
        store.close()

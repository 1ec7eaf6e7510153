"""Retention: expired segments go at the delete hour or when the disk fills, with a fake clock."""

from __future__ import annotations

import os
import time

from store_helpers import SEGMENT_SIZE, message

from tidemq.protocol.message import decode_records
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import GetStatus

TOPIC = "Orders"
HOUR_MS = 3_600_000


def local_ms(hour, day=15):
    """A fake 'now' at the given local hour, a year ahead of any real file time."""
    year = time.localtime().tm_year + 1
    return int(time.mktime((year, 1, day, hour, 30, 0, 0, 0, -1)) * 1000)


def fill_segments(store, segment_count):
    """Write ~segment_count segments of 30 KB messages (2 per segment) on two queues."""
    results = []
    for i in range(segment_count * 2):
        results.append(store.put_message(message(queue_id=i % 2, body=b"x" * 30_000,
                                                 keys=f"k{i}")))
    return results


def segment_names(store):
    """The log's segments (the directory may also hold the next one, made ahead of need)."""
    return [os.path.basename(segment.path) for segment in store.commit_log.queue.files]


def age_segments(config, names, modified_ms):
    for name in names:
        path = os.path.join(config.store_path_root_dir, "commitlog", name)
        os.utime(path, (modified_ms / 1000, modified_ms / 1000))


def test_only_expired_segments_go_at_the_delete_hour(config):
    store = FileMessageStore(config)
    try:
        results = fill_segments(store, 5)
        names = segment_names(store)
        assert len(names) == 5
        now = local_ms(hour=4)
        age_segments(config, names[:2], now - 73 * HOUR_MS)  # older than 72 h
        age_segments(config, names[2:], now - 71 * HOUR_MS)
        assert store.run_retention(local_ms(hour=5), disk_used_ratio=10) == 0  # not the hour
        assert store.run_retention(now, disk_used_ratio=10) == 2
        assert segment_names(store) == names[2:]
        commit_log_dir = os.path.join(config.store_path_root_dir, "commitlog")
        assert not any(os.path.exists(os.path.join(commit_log_dir, n)) for n in names[:2])
        assert store.commit_log_min_offset() == 2 * SEGMENT_SIZE

        # Both queues' first two entries pointed into the deleted segments.
        assert store.min_offset(TOPIC, 0) == 2
        low = store.get_messages(TOPIC, 0, 0, 32, 1 << 20)
        assert (low.status, low.next_begin_offset) == (GetStatus.OFFSET_TOO_SMALL, 2)
        found = store.get_messages(TOPIC, 0, 2, 32, 1 << 20)
        assert [m.physical_offset for m in decode_records(found.body)] == [
            r.physical_offset for r in results[4::2]
        ]
        assert store.read_message(results[0].physical_offset) is None
        assert store.query_messages(TOPIC, "k0", 10, 0, 2**62).records == []
        assert store.earliest_message_time(TOPIC, 1) == results[5].store_timestamp
        assert store.run_retention(now, disk_used_ratio=10) == 0  # nothing else expired
    finally:
        store.close()


def test_a_full_disk_deletes_expired_segments_at_any_hour(config):
    store = FileMessageStore(config)
    try:
        fill_segments(store, 4)
        names = segment_names(store)
        now = local_ms(hour=13)
        age_segments(config, names[:3], now - 100 * HOUR_MS)
        assert store.run_retention(now, disk_used_ratio=50) == 0
        assert store.run_retention(now, disk_used_ratio=80) == 3
        assert segment_names(store) == names[3:]
    finally:
        store.close()


def test_a_nearly_full_disk_deletes_even_unexpired_segments_but_never_the_last(config):
    store = FileMessageStore(config)
    try:
        fill_segments(store, 4)
        names = segment_names(store)
        now = local_ms(hour=13)
        age_segments(config, names, now - HOUR_MS)  # nothing expired
        assert store.run_retention(now, disk_used_ratio=80) == 0
        assert store.run_retention(now, disk_used_ratio=90) == 3
        assert segment_names(store) == names[-1:]
        assert store.put_message(message(body=b"still writable")).ok
    finally:
        store.close()


def test_retention_deletes_queue_segments_below_the_log_and_survives_reopen(config):
    store = FileMessageStore(config)
    for i in range(2000):  # ~1 KB each: 32 segments; 1000 entries (10 queue segments) a queue
        store.put_message(message(queue_id=i % 2, body=b"y" * 900))
    names = segment_names(store)
    now = local_ms(hour=4)
    age_segments(config, names[:-8], now - 100 * HOUR_MS)
    age_segments(config, names[-8:], now - HOUR_MS)
    deleted = 0
    for _ in range(5):  # at most 10 segments go per run
        deleted += store.run_retention(now, disk_used_ratio=10)
    assert deleted == len(names) - 8
    min_offset = store.min_offset(TOPIC, 0)
    assert min_offset > 700
    queue_dir = os.path.join(config.store_path_root_dir, "consumequeue", TOPIC, "0")
    # Queue segments wholly below the log's new start are gone; the one holding min stays.
    assert min(int(name) for name in os.listdir(queue_dir)) // 20 == min_offset // 100 * 100
    store.close()
    store = FileMessageStore(config)
    try:
        assert store.min_offset(TOPIC, 0) == min_offset
        result = store.get_messages(TOPIC, 0, min_offset, 32, 1 << 20)
        assert result.status is GetStatus.FOUND
    finally:
        store.close()


def test_memory_store_segments_expire_by_their_last_write(store):
    fill_segments(store, 3)
    assert store.run_retention(local_ms(hour=4), disk_used_ratio=10) == 2
    assert store.min_offset(TOPIC, 0) == 2
    assert store.get_messages(TOPIC, 0, 0, 32, 1 << 20).status is GetStatus.OFFSET_TOO_SMALL


def test_the_disk_is_measured_as_df_does_so_kept_back_blocks_delete_nothing(config,
                                                                           monkeypatch):
    # A volume df shows 60 % full, with most of its free blocks kept back from us (root's
    # reserve, a quota): 80 % by total-minus-available, which wrongly deleted these.
    from collections import namedtuple

    from tidemq.store import retention

    usage = namedtuple("usage", "total used free")(1000, 300, 200)
    monkeypatch.setattr(retention.shutil, "disk_usage", lambda path: usage)
    store = FileMessageStore(config)
    try:
        fill_segments(store, 4)
        names = segment_names(store)
        now = local_ms(hour=13)
        age_segments(config, names[:3], now - 100 * HOUR_MS)
        assert retention.disk_used_ratio(config.store_path_root_dir) == 60.0
        assert store.run_retention(now) == 0
        assert segment_names(store) == names
    finally:
        store.close()


def test_a_segment_that_cannot_be_deleted_is_logged_and_retention_goes_on(
        config, monkeypatch, caplog):
    """A volume remounted read-only: unlink fails with EROFS. Retention drops the expired
    segments from use all the same, says which file stayed and why in one warning, and
    raises nothing (the broker's retention loop would print a traceback every run)."""
    import errno

    import tidemq.store.mapped_file as mapped_file_module

    store = FileMessageStore(config)
    try:
        fill_segments(store, 4)
        names = segment_names(store)
        now = local_ms(hour=4)
        age_segments(config, names[:2], now - 73 * HOUR_MS)
        age_segments(config, names[2:], now - 71 * HOUR_MS)
        real_unlink = os.unlink

        def read_only_unlink(path, *args, **kwargs):
            if os.path.basename(path) in names:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
            return real_unlink(path, *args, **kwargs)

        monkeypatch.setattr(mapped_file_module.os, "unlink", read_only_unlink)
        with caplog.at_level("WARNING", logger="tidemq.store.mapped_file"):
            assert store.run_retention(now, disk_used_ratio=10) == 2
        assert segment_names(store) == names[2:]
        assert store.commit_log_min_offset() == 2 * SEGMENT_SIZE
        warnings = [r for r in caplog.records if r.name == "tidemq.store.mapped_file"]
        assert len(warnings) == 2
        for record, name in zip(warnings, names[:2], strict=True):
            text = record.getMessage()
            assert name in text and "Read-only file system" in text
            assert "make the volume writable" in text
            assert record.exc_info is None
        commit_log_dir = os.path.join(config.store_path_root_dir, "commitlog")
        assert all(os.path.exists(os.path.join(commit_log_dir, n)) for n in names[:2])
    finally:
        store.close()

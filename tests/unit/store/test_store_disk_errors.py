"""Disk errors on the append path: a failed write or sync is answered, never lost silently,
and the store goes on (or stops, naming why) as the log's state demands.

The commit log writes every append with os.pwrite and syncs with os.fdatasync; the faults
are injected there, as the disk would report them (EIO).
"""

from __future__ import annotations

import errno
import os

import pytest
from store_helpers import SEGMENT_SIZE, message, small_config

from tidemq.errors import StoreError
from tidemq.protocol.message import decode_record
from tidemq.store import sync_worker
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import PutStatus

TOPIC = "Orders"
BODY = b"x" * 4000  # five of these make a batch written with pwrite


def batch(tag: bytes) -> list:
    return [message(body=tag + BODY) for _ in range(5)]


def failing(name: str):
    def fail(*args, **kwargs):
        raise OSError(errno.EIO, f"{name}: Input/output error")

    return fail


def test_a_failed_write_answers_unknown_error_and_leaves_the_log_as_it_was(tmp_path, monkeypatch):
    with FileMessageStore(small_config(tmp_path / "store")) as store:
        first = store.put_messages(batch(b"a"))
        end = store.commit_log_max_offset()
        monkeypatch.setattr(os, "pwrite", failing("pwrite"))
        result = store.put_messages(batch(b"b"))
        monkeypatch.undo()
        assert result.status is PutStatus.UNKNOWN_ERROR
        assert "commitlog" in result.remark and "Input/output error" in result.remark
        assert store.commit_log_max_offset() == end
        assert store.max_offset(TOPIC, 0) == 5
        # Nothing was half written: the store goes on where it was.
        after = store.put_messages(batch(b"c"))
        assert after.status is PutStatus.PUT_OK
        assert after.physical_offset == end and after.queue_offset == 5
        assert decode_record(store.read_message(first.physical_offset)).body == b"a" + BODY
        assert decode_record(store.read_message(after.physical_offset)).body == b"c" + BODY


def test_a_single_small_message_is_written_through_the_file_too(tmp_path, monkeypatch):
    # Not copied into the mapping: a page dirtied there faults again after each sync, and
    # that fault waited on a busy journal for ~18 ms (issue 18's end-to-end tail).
    with FileMessageStore(small_config(tmp_path / "store")) as store:
        assert store.put_message(message(body=b"first")).ok
        end = store.commit_log_max_offset()
        monkeypatch.setattr(os, "pwrite", failing("pwrite"))
        result = store.put_message(message(body=b"small"))
        monkeypatch.undo()
        assert result.status is PutStatus.UNKNOWN_ERROR
        assert "Input/output error" in result.remark
        assert store.commit_log_max_offset() == end
        assert store.put_message(message(body=b"after")).ok


def test_a_write_failing_half_way_through_a_batch_stops_the_store(tmp_path, monkeypatch):
    with FileMessageStore(small_config(tmp_path / "store")) as store:
        # Leave 20,000 bytes in the first segment, then a batch that needs the next one: its
        # first records are written to the first segment before the failing write.
        filler = SEGMENT_SIZE - 20_000 - (91 + len(TOPIC))
        assert store.put_message(message(body=b"f" * filler)).ok
        real_pwrite = os.pwrite
        calls = []

        def second_write_fails(fd, data, position):
            calls.append(position)
            if len(calls) > 1:
                raise OSError(errno.EIO, "Input/output error")
            return real_pwrite(fd, data, position)

        monkeypatch.setattr(os, "pwrite", second_write_fails)
        result = store.put_messages([message(body=BODY) for i in range(10)])
        monkeypatch.undo()
        assert result.status is PutStatus.UNKNOWN_ERROR
        later = store.put_message(message(body=b"later"))
        assert later.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert "half way" in later.remark


def test_a_failed_sync_answers_flush_disk_timeout_and_later_syncs_succeed(tmp_path, monkeypatch):
    config = small_config(tmp_path / "store", flush_disk_type="SYNC_FLUSH")
    # The group commit's syncs run in the sync worker process: it fails them while this
    # file exists.
    disk_fails = tmp_path / "disk-fails"
    monkeypatch.setenv(sync_worker.FAIL_ENV, str(disk_fails))
    with FileMessageStore(config) as store:
        disk_fails.touch()
        monkeypatch.setattr(os, "fdatasync", failing("fdatasync"))
        result = store.put_messages(batch(b"m"))
        assert result.status is PutStatus.PUT_OK  # stored...
        assert result.wait_durable(10) is PutStatus.FLUSH_DISK_TIMEOUT  # ...not known durable
        with pytest.raises(StoreError, match=r"cannot sync .*commitlog"):
            store.commit_log.flush()
        monkeypatch.undo()
        disk_fails.unlink()
        again = store.put_message(message(body=b"next"))
        assert again.wait_durable(10) is PutStatus.PUT_OK
        # The sync that succeeded covers the earlier bytes too.
        assert store.commit_log.flush() == store.commit_log_max_offset()

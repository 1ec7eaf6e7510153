"""Opening and closing: the lock, the abort marker, the checkpoint, SYNC_FLUSH durability."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import Future

import pytest
from store_helpers import message, small_config

from tidemq.errors import ConfigError, StoreError, StoreLocked
from tidemq.store.checkpoint import StoreCheckpoint
from tidemq.store.config import FlushDiskType, StoreConfig
from tidemq.store.file_store import FileMessageStore
from tidemq.store.flush import GroupCommitService
from tidemq.store.interface import PutResult, PutStatus


def test_second_open_of_a_directory_fails_naming_it_and_the_holder(config):
    store = FileMessageStore(config)
    try:
        with pytest.raises(StoreLocked) as raised:
            FileMessageStore(config)
        text = str(raised.value)
        assert config.store_path_root_dir in text
        assert f"process {os.getpid()}" in text
    finally:
        store.close()
    FileMessageStore(config).close()  # released on close


def test_another_process_cannot_open_a_held_store(config):
    store = FileMessageStore(config)
    try:
        child = subprocess.run(
            [sys.executable, "-c",
             "import sys\n"
             "from tidemq.store.config import StoreConfig\n"
             "from tidemq.store.file_store import FileMessageStore\n"
             "from tidemq.errors import StoreLocked\n"
             "try:\n"
             f"    FileMessageStore(StoreConfig(store_path_root_dir={config.store_path_root_dir!r},"
             " mapped_file_size_commit_log=65536))\n"
             "except StoreLocked as e:\n"
             "    print(e); sys.exit(3)\n"],
            capture_output=True, text=True, timeout=60,
        )
        assert child.returncode == 3, child.stderr
        assert f"process {os.getpid()}" in child.stdout
    finally:
        store.close()


def test_abort_marker_lives_while_open_and_checkpoint_records_flushed_times(config):
    abort = os.path.join(config.store_path_root_dir, "abort")
    store = FileMessageStore(config)
    assert os.path.exists(abort)
    result = store.put_message(message(keys="k"))
    store.close()
    assert not os.path.exists(abort)
    checkpoint = StoreCheckpoint(os.path.join(config.store_path_root_dir, "checkpoint"))
    try:
        assert checkpoint.physic_msg_timestamp == result.store_timestamp
        assert checkpoint.logics_msg_timestamp == result.store_timestamp
        assert checkpoint.index_msg_timestamp == result.store_timestamp
    finally:
        checkpoint.close()
    assert os.path.getsize(os.path.join(config.store_path_root_dir, "checkpoint")) == 4096


def test_checkpoint_syncs_through_its_file_descriptor_not_the_gil_holding_msync(
        config, monkeypatch):
    # CPython's mmap.flush (msync) holds the GIL while the disk works; the checkpoint is
    # synced every second on the flusher thread, so that stopped the broker's event loop.
    # fdatasync on the file writes the same page (one page cache) and lets the loop run.
    path = os.path.join(config.store_path_root_dir, "checkpoint")
    os.makedirs(config.store_path_root_dir, exist_ok=True)
    synced: list[str] = []
    real_sync = getattr(os, "fdatasync", os.fsync)

    def recording_sync(fd: int) -> None:
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        real_sync(fd)

    monkeypatch.setattr(os, "fdatasync" if hasattr(os, "fdatasync") else "fsync",
                        recording_sync)
    checkpoint = StoreCheckpoint(path)
    checkpoint.logics_msg_timestamp = 1234
    checkpoint.flush()
    checkpoint.close()
    assert synced == [os.path.realpath(path)] * 2  # flush, then close
    reopened = StoreCheckpoint(path)
    try:
        assert reopened.logics_msg_timestamp == 1234
    finally:
        reopened.close()


def test_async_flush_has_no_durable_future(config):
    store = FileMessageStore(config)
    try:
        result = store.put_message(message())
        assert result.durable is None
        assert result.wait_durable() is PutStatus.PUT_OK
    finally:
        store.close()


def test_sync_flush_completes_every_concurrent_put_after_its_sync(tmp_path):
    config = small_config(tmp_path / "sync", flush_disk_type="SYNC_FLUSH")
    assert config.flush_disk_type is FlushDiskType.SYNC_FLUSH
    store = FileMessageStore(config)
    statuses: list[PutStatus] = []
    lock = threading.Lock()

    def produce(worker):
        for i in range(25):
            result = store.put_message(message(queue_id=worker, body=f"{worker}-{i}".encode()))
            status = result.wait_durable(timeout_s=30)
            with lock:
                statuses.append(status)

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert statuses == [PutStatus.PUT_OK] * 100
        assert store.commit_log.queue.flushed_where == store.commit_log_max_offset()
    finally:
        store.close()


def test_periodic_flush_syncs_queues_each_round_and_the_index_only_when_due(tmp_path):
    """The consume-queue flusher records each round in the checkpoint, but syncs the index
    (and moves its checkpoint time) only every INDEX_SYNC_INTERVAL_S; ``flush`` always does."""
    config = small_config(tmp_path / "store", flush_interval_consume_queue_ms=20)
    store = FileMessageStore(config)
    checkpoint = store.checkpoint
    assert checkpoint is not None
    try:
        before = checkpoint.index_msg_timestamp
        result = store.put_message(message(keys="k"))
        for _ in range(500):  # bounded: the 20 ms flusher rounds record the new message
            if checkpoint.logics_msg_timestamp == result.store_timestamp:
                break
            threading.Event().wait(0.01)
        assert checkpoint.logics_msg_timestamp == result.store_timestamp
        assert checkpoint.index_msg_timestamp == before  # no index sync yet
        store.flush()
        assert checkpoint.index_msg_timestamp == result.store_timestamp
    finally:
        store.close()


def test_group_commit_shares_one_sync_among_waiting_requests():
    release = threading.Event()
    started = threading.Event()
    calls: list[int] = []
    flushed = [0]

    def slow_flush():
        calls.append(1)
        started.set()
        release.wait(10)
        return flushed[0]

    service = GroupCommitService(slow_flush)
    service.start()
    try:
        flushed[0] = 100
        first = service.request(100)
        assert started.wait(10)
        flushed[0] = 500
        waiting = [service.request(offset) for offset in (200, 300, 400, 500)]
        release.set()
        assert first.result(10) is PutStatus.PUT_OK
        assert [f.result(10) for f in waiting] == [PutStatus.PUT_OK] * 4
        assert len(calls) == 2  # one sync for the first, one shared by the four others
    finally:
        service.stop()


def test_group_commit_reports_a_failed_sync_as_flush_disk_timeout():
    def failing_flush():
        raise StoreError("disk gone")

    service = GroupCommitService(failing_flush)
    service.start()
    try:
        assert service.request(10).result(10) is PutStatus.FLUSH_DISK_TIMEOUT
    finally:
        service.stop()
    assert service.request(10).result(0) is PutStatus.FLUSH_DISK_TIMEOUT  # stopped


def test_wait_durable_times_out_as_flush_disk_timeout():
    never: Future[PutStatus] = Future()
    result = PutResult(PutStatus.PUT_OK, durable=never)
    assert result.wait_durable(timeout_s=0.01) is PutStatus.FLUSH_DISK_TIMEOUT


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"mapped_file_size_consume_queue": 6_000_001}, "multiple of the 20-byte"),
        ({"flush_disk_type": "SOMETIMES"}, "flush_disk_type='SOMETIMES'"),
        ({"delete_when": "25"}, "delete_when='25'"),
        ({"disk_max_used_space_ratio": 99}, "disk_max_used_space_ratio=99"),
        ({"store_host": "localhost"}, "store_host='localhost'"),
        ({"message_delay_level": "1s 5x"}, "'5x'"),
        ({"mapped_file_size_commit_log": 100}, "mapped_file_size_commit_log=100"),
    ],
)
def test_bad_settings_fail_naming_the_key(overrides, words):
    with pytest.raises(ConfigError) as raised:
        StoreConfig(**overrides)
    assert words in str(raised.value)


def test_settings_have_rocketmq_defaults():
    config = StoreConfig()
    assert config.mapped_file_size_commit_log == 1024**3
    assert config.mapped_file_size_consume_queue == 6_000_000
    assert (config.flush_interval_commit_log_ms, config.flush_interval_consume_queue_ms) == (
        500, 1000,
    )
    assert (config.file_reserved_time_hours, config.delete_when) == (72, "04")
    assert config.delete_hours() == {4}
    assert StoreConfig(delete_when="04;16").delete_hours() == {4, 16}
    assert config.delay_level_ms()[2] == 10_000
    assert config.max_message_size == 4 * 1024 * 1024


def test_segment_size_mismatch_fails_naming_the_file_and_setting(config):
    store = FileMessageStore(config)
    store.put_message(message())
    store.close()
    bigger = small_config(config.store_path_root_dir, mapped_file_size_commit_log=128 * 1024)
    with pytest.raises(StoreError) as raised:
        FileMessageStore(bigger)
    # After a clean close a size mismatch is a changed setting, never a torn file.
    assert "mapped_file_size_commit_log" in str(raised.value)
    assert "00000000000000000000" in str(raised.value)
    FileMessageStore(config).close()  # the lock was released by the failed open

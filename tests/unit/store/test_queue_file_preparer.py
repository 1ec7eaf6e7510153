"""First consume-queue files made ahead in a thread, and taken over by the queues' first puts."""

from __future__ import annotations

import os
import threading
import time

import pytest
from store_helpers import message, small_config

from tidemq.store import mapped_file
from tidemq.store.consume_queue import ENTRY_SIZE
from tidemq.store.file_store import FileMessageStore
from tidemq.store.mapped_file import PAGE_SIZE, MappedFile, file_name
from tidemq.store.memory_store import MemoryMessageStore
from tidemq.store.queue_file_preparer import QueueFilePreparer

# Big enough that a queue's segment is sized sparse and reserved in chunks, as in production.
QUEUE_FILE_SIZE = 300_000 * ENTRY_SIZE
WAIT_BOUND_S = 10.0


def segment(root, topic: str, queue_id: int):
    return root / "consumequeue" / topic / str(queue_id) / file_name(0)


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_BOUND_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.005)


@pytest.fixture
def root(tmp_path):
    return tmp_path / "store"


@pytest.fixture
def config(root):
    return small_config(root, mapped_file_size_consume_queue=QUEUE_FILE_SIZE)


def test_files_are_made_ahead_and_taken_by_the_first_put(root, config, monkeypatch):
    made_by_put: list[str] = []
    real_size_sparse = mapped_file._size_sparse

    def size_sparse(fd, path, file_size):
        # The preparer's thread makes its files the same way; only the others' count here.
        if threading.current_thread().name != "tidemq-queue-file-preparer":
            made_by_put.append(path)
        real_size_sparse(fd, path, file_size)

    monkeypatch.setattr(mapped_file, "_size_sparse", size_sparse)
    with FileMessageStore(config) as store:
        store.prepare_queue_files("Orders", 4)
        wait_until(lambda: all(segment(root, "Orders", q).exists() for q in range(4)),
                   "the prepared files")
        prepared = segment(root, "Orders", 2).stat()
        assert prepared.st_size == QUEUE_FILE_SIZE
        assert prepared.st_blocks * 512 <= PAGE_SIZE  # sparse: one page of disk
        with open("/proc/self/maps") as maps:
            mapped_paths = maps.read()
        assert not any(str(segment(root, "Orders", q)) in mapped_paths for q in range(4))
        assert store.put_message(message("Orders", 2, b"first")).ok
        # The put mapped the prepared file instead of making it again.
        assert made_by_put == []
        assert segment(root, "Orders", 2).stat().st_ino == prepared.st_ino
        assert store.put_message(message("Fresh", 0, b"unprepared")).ok
        assert made_by_put == [str(segment(root, "Fresh", 0))]
        assert store.max_offset("Orders", 2) == 1
    with FileMessageStore(config) as reopened:
        assert reopened.max_offset("Orders", 2) == 1
        assert [reopened.max_offset("Orders", q) for q in (0, 1, 3)] == [0, 0, 0]
        assert reopened.put_message(message("Orders", 3, b"later")).ok
        assert reopened.max_offset("Orders", 3) == 1


def test_a_queue_the_store_holds_is_left_alone(root, config):
    with FileMessageStore(config) as store:
        assert store.put_message(message("Orders", 0, b"a")).ok
        written = segment(root, "Orders", 0).stat()
        store.prepare_queue_files("Orders", 2)
        wait_until(lambda: segment(root, "Orders", 1).exists(), "queue 1's file")
        assert segment(root, "Orders", 0).stat().st_ino == written.st_ino
        assert store.put_message(message("Orders", 0, b"b")).ok
        assert store.max_offset("Orders", 0) == 2


def test_deleting_a_topic_drops_files_still_to_be_made(root, config):
    store = FileMessageStore(config)
    try:
        store.prepare_queue_files("Wide", 1024)
        wait_until(lambda: segment(root, "Wide", 0).exists(), "the first prepared file")
        store.delete_topic("Wide")
    finally:
        store.close()  # joins the preparing thread
    assert not (root / "consumequeue" / "Wide").exists()


def test_preparing_never_replaces_a_file_that_exists(tmp_path):
    preparer = QueueFilePreparer(str(tmp_path), QUEUE_FILE_SIZE, lambda topic, queue_id: False)
    path = tmp_path / "T" / "0" / file_name(0)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"made by the store")
    assert not preparer._make("T", 0)
    assert path.read_bytes() == b"made by the store"
    assert os.listdir(path.parent) == [file_name(0)]  # no .tmp left behind


def test_a_file_that_is_not_all_zeros_is_made_anew(tmp_path):
    # Only a prepared (all-zero) file is taken over; anything else is truncated as before.
    path = tmp_path / file_name(0)
    with open(path, "wb") as stale:
        stale.truncate(QUEUE_FILE_SIZE)
        stale.write(b"\x01" * ENTRY_SIZE)
    mapped = MappedFile.create(str(tmp_path), 0, QUEUE_FILE_SIZE, reserve_chunk=64 * 1024)
    try:
        assert mapped.read(0, ENTRY_SIZE) == bytes(ENTRY_SIZE)
    finally:
        mapped.close()


def test_memory_store_has_nothing_to_prepare(config):
    with MemoryMessageStore(config) as store:
        store.prepare_queue_files("Orders", 4)
        assert store.put_message(message("Orders", 3, b"x")).ok

"""First consume-queue files made ahead in a thread, and taken over by the queues' first puts."""

from __future__ import annotations

import os
import threading
import time

import pytest
from store_helpers import message, small_config

from tidemq.protocol.message import decode_records
from tidemq.store import mapped_file
from tidemq.store.consume_queue import ENTRY_SIZE
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import GetStatus
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


def body_at(store, topic: str, queue_id: int, offset: int) -> bytes:
    result = store.get_messages(topic, queue_id, offset, 1, 1 << 20)
    assert result.status is GetStatus.FOUND, result
    return decode_records(result.body)[0].body


def mapped_paths() -> str:
    with open("/proc/self/maps") as maps:
        return maps.read()


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
        wait_until(lambda: store._queue_files.ready_count == 4, "the prepared segments")
        prepared = segment(root, "Orders", 2).stat()
        assert prepared.st_size == QUEUE_FILE_SIZE
        assert prepared.st_blocks * 512 <= PAGE_SIZE  # sparse: one page of disk
        # Mapped ahead by the preparer: the first put opens and maps nothing.
        assert all(str(segment(root, "Orders", q)) in mapped_paths() for q in range(4))
        opened: list[str] = []
        real_open = os.open

        def recording_open(path, *args, **kwargs):
            opened.append(str(path))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", recording_open)
        assert store.put_message(message("Orders", 2, b"first")).ok
        monkeypatch.setattr(os, "open", real_open)
        assert str(segment(root, "Orders", 2)) not in opened
        assert made_by_put == []
        assert segment(root, "Orders", 2).stat().st_ino == prepared.st_ino
        assert store._queue_files.ready_count == 3
        assert store.put_message(message("Fresh", 0, b"unprepared")).ok
        assert made_by_put == [str(segment(root, "Fresh", 0))]
        assert store.max_offset("Orders", 2) == 1
        assert body_at(store, "Orders", 2, 0) == b"first"
    # Closing unmapped the segments nobody took; their files stay, as empty queues.
    assert not any(str(segment(root, "Orders", q)) in mapped_paths() for q in range(4))
    with FileMessageStore(config) as reopened:
        assert reopened.max_offset("Orders", 2) == 1
        assert body_at(reopened, "Orders", 2, 0) == b"first"
        assert [reopened.max_offset("Orders", q) for q in (0, 1, 3)] == [0, 0, 0]
        assert reopened.put_message(message("Orders", 3, b"later")).ok
        assert reopened.max_offset("Orders", 3) == 1


def test_a_queue_made_while_its_file_is_pending_or_being_made_is_not_handed_one(
        tmp_path, monkeypatch):
    # The store made queue 0 while the thread was making its file, and queue 1 before the
    # thread reached it: neither gets a segment mapped ahead (the store writes its own
    # mapping), and the thread makes no file for queue 1 at all.
    from tidemq.store import queue_file_preparer

    making = threading.Event()
    release = threading.Event()
    real_start = queue_file_preparer.start_sparse_segment

    def slow_start(fd, path, file_size):
        if f"{os.sep}0{os.sep}" in path:
            making.set()
            assert release.wait(WAIT_BOUND_S)
        real_start(fd, path, file_size)

    monkeypatch.setattr(queue_file_preparer, "start_sparse_segment", slow_start)
    preparer = QueueFilePreparer(str(tmp_path), QUEUE_FILE_SIZE, lambda topic, queue_id: False)
    try:
        preparer.request("T", 3)
        assert making.wait(WAIT_BOUND_S)
        assert preparer.take("T", 0) is None  # being made
        assert preparer.take("T", 1) is None  # pending
        release.set()
        wait_until(lambda: preparer.ready_count == 1, "queue 2's segment")
        assert not (tmp_path / "T" / "1").exists()
        assert (tmp_path / "T" / "0" / file_name(0)).exists()
        assert str(tmp_path / "T" / "0" / file_name(0)) not in mapped_paths()
        ready = preparer.take("T", 2)
        assert ready is not None and ready.file_from_offset == 0 and ready.write_position == 0
        assert ready.read(0, PAGE_SIZE) == bytes(PAGE_SIZE)
        ready.close()
        assert preparer.take("T", 2) is None  # handed over once
    finally:
        release.set()
        preparer.close()


def test_near_the_open_file_limit_files_are_made_but_not_mapped_ahead(root, config,
                                                                     monkeypatch):
    # Mapped segments hold descriptors: near the soft limit the preparer leaves the mapping
    # to the first put, so connections keep their descriptors.
    from tidemq.store import queue_file_preparer

    real_getrlimit = queue_file_preparer.resource.getrlimit

    def tight_getrlimit(which):
        soft, hard = real_getrlimit(which)
        return (1024, hard) if which == queue_file_preparer.resource.RLIMIT_NOFILE else (
            soft, hard)

    monkeypatch.setattr(queue_file_preparer.resource, "getrlimit", tight_getrlimit)
    with FileMessageStore(config) as store:
        store.prepare_queue_files("Orders", 2)
        wait_until(lambda: store._queue_files.prepared == 2, "the prepared files")
        with store._queue_files._busy:  # the last file's hand-over is over
            assert store._queue_files.ready_count == 0
        assert str(segment(root, "Orders", 1)) not in mapped_paths()
        assert store.put_message(message("Orders", 1, b"first")).ok
        assert body_at(store, "Orders", 1, 0) == b"first"


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
        wait_until(lambda: store._queue_files.ready_count > 0, "the first prepared segment")
        store.delete_topic("Wide")
        # Segments made ahead and not taken are unmapped with the topic.
        assert store._queue_files.ready_count == 0
        assert str(root / "consumequeue" / "Wide") not in mapped_paths()
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

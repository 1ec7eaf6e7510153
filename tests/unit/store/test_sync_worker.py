"""SYNC_FLUSH through the sync worker process (store/worker_group_commit.py, sync_worker.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from concurrent.futures import TimeoutError as FutureTimeout

import pytest
from store_helpers import message, small_config

from tidemq.store import sync_worker
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import PutStatus
from tidemq.store.worker_group_commit import WorkerGroupCommitService


@pytest.fixture
def held_store(tmp_path, monkeypatch):
    """A SYNC_FLUSH store whose worker waits before each sync until ``release`` exists."""
    release = tmp_path / "release"
    monkeypatch.setenv(sync_worker.HOLD_ENV, str(release))
    store = FileMessageStore(small_config(tmp_path / "store", flush_disk_type="SYNC_FLUSH"))
    try:
        yield store, release
    finally:
        release.touch()
        store.close()


def _service(store: FileMessageStore) -> WorkerGroupCommitService:
    service = store._group_commit
    assert isinstance(service, WorkerGroupCommitService)
    assert service.worker_pid is not None
    return service


def test_a_put_is_answered_only_after_the_workers_sync_returned(held_store):
    store, release = held_store
    result = store.put_message(message(body=b"durable"))
    assert result.status is PutStatus.PUT_OK
    # The worker holds its sync: no answer, the log not marked flushed.
    with pytest.raises(FutureTimeout):
        result.durable.result(timeout=0.3)
    assert store.commit_log.queue.flushed_where < store.commit_log_max_offset()
    release.touch()
    assert result.wait_durable(30) is PutStatus.PUT_OK
    assert store.commit_log.queue.flushed_where == store.commit_log_max_offset()
    assert store.checkpoint.physic_msg_timestamp == result.store_timestamp
    assert store.flush_latency.count >= 1  # the worker's sync, in the flush-latency metric


def test_commands_waiting_in_the_pipe_share_one_sync(held_store):
    store, release = held_store
    service = _service(store)
    results = [store.put_message(message(body=b"m%d" % i)) for i in range(6)]
    release.touch()
    assert [r.wait_durable(30) for r in results] == [PutStatus.PUT_OK] * 6
    # The worker read the first command (maybe more) before it held; the rest waited in
    # the pipe and were synced together: at most two syncs for six commands.
    assert 1 <= service.answers <= 2


def test_flushed_where_moves_forward_in_order_of_the_answers(tmp_path):
    store = FileMessageStore(small_config(tmp_path / "store", flush_disk_type="SYNC_FLUSH"))
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()
    queue = store.commit_log.queue
    try:
        results = []
        for i in range(40):  # a few segments of 64 KiB
            result = store.put_messages([message(body=bytes(2000) + b"%d" % i)] * 3)
            end = store.commit_log_max_offset()

            def record(_done, end=end):
                with lock:
                    seen.append((end, queue.flushed_where))

            result.durable.add_done_callback(record)
            results.append(result)
        assert [r.wait_durable(30) for r in results] == [PutStatus.PUT_OK] * 40
        with lock:
            assert len(seen) == 40
            assert [end for end, _ in seen] == sorted(end for end, _ in seen)
            assert all(flushed >= end for end, flushed in seen)
            flushed = [flushed for _, flushed in seen]
            assert flushed == sorted(flushed)
        assert len(queue.files) > 1
    finally:
        store.close()


def test_a_killed_worker_falls_back_and_every_request_is_answered(held_store, caplog):
    store, _release = held_store
    service = _service(store)
    pid = service.worker_pid
    waiting = [store.put_message(message(body=b"w%d" % i)) for i in range(3)]
    os.kill(pid, signal.SIGKILL)  # the worker this test's store started
    assert [r.wait_durable(30) for r in waiting] == [PutStatus.PUT_OK] * 3
    assert service.worker_pid is None
    assert any(f"sync worker (pid {pid}) is gone" in r.getMessage() for r in caplog.records)
    later = store.put_message(message(body=b"later"))
    assert later.wait_durable(30) is PutStatus.PUT_OK
    assert store.commit_log.queue.flushed_where == store.commit_log_max_offset()


def test_the_worker_syncs_the_file_now_at_a_name_not_the_one_it_kept_open(tmp_path,
                                                                          monkeypatch):
    # A segment cut away and made again under its name (truncation) is another inode: the
    # worker's kept descriptor of the old one must not answer for the new one's bytes.
    synced: list[int] = []
    monkeypatch.setattr(sync_worker, "_fdatasync",
                        lambda fd, fail: synced.append(os.fstat(fd).st_ino))
    commands_read, commands_write = os.pipe()
    answers_read, answers_write = os.pipe()
    worker = threading.Thread(target=sync_worker.serve, args=(commands_read, answers_write))
    worker.start()
    segment = tmp_path / "00000000000000000000"
    try:
        segment.write_bytes(b"old")
        old_inode = segment.stat().st_ino
        os.write(commands_write, f"1 {segment}\n".encode())
        assert os.read(answers_read, 100).startswith(b"OK 1 ")  # then the sync's seconds
        keep_old_inode_alive = tmp_path / "cut"
        segment.rename(keep_old_inode_alive)  # the old inode lives on: its number stays taken
        segment.write_bytes(b"new")
        new_inode = segment.stat().st_ino
        assert new_inode != old_inode
        os.write(commands_write, f"2 {segment}\n".encode())
        assert os.read(answers_read, 100).startswith(b"OK 2 ")
        assert synced == [old_inode, new_inode]
    finally:
        os.close(commands_write)
        worker.join(10)
        for fd in (commands_read, answers_read, answers_write):
            os.close(fd)


def test_answers_read_on_the_event_loop_complete_on_its_thread(tmp_path):
    store = FileMessageStore(small_config(tmp_path / "store", flush_disk_type="SYNC_FLUSH"))
    service = _service(store)
    completed_on: list[int] = []

    async def scenario() -> list[PutStatus]:
        loop = asyncio.get_running_loop()
        assert store.answer_syncs_on_loop(loop.add_reader, loop.remove_reader)
        assert not service._reader.is_alive()  # the thread handed the answers to the loop
        results = [store.put_message(message(body=b"l%d" % i)) for i in range(5)]
        for result in results:
            result.durable.add_done_callback(
                lambda _done: completed_on.append(threading.get_ident()))
        statuses = await asyncio.wait_for(
            asyncio.gather(*(asyncio.wrap_future(r.durable) for r in results)), 30)
        pending = store.put_message(message(body=b"at close"))
        store.close()  # on the loop's thread, as the broker's shutdown does
        assert pending.durable.result(0) is PutStatus.PUT_OK
        return statuses

    try:
        assert asyncio.run(scenario()) == [PutStatus.PUT_OK] * 5
    finally:
        store.close()
    assert completed_on == [threading.get_ident()] * 5


def test_the_answered_hook_settles_a_syncs_sends_inside_the_read(tmp_path):
    # The broker passes settle_ready as the hook: a sync's sends are answered inside the
    # loop's read of its answer, not after the callbacks already queued on the loop.
    from tidemq.broker.ha.flush_waits import answer_when_durable, settle_ready

    store = FileMessageStore(small_config(tmp_path / "store", flush_disk_type="SYNC_FLUSH"))
    service = _service(store)
    events: list[str] = []

    async def scenario() -> PutStatus:
        loop = asyncio.get_running_loop()

        def answered() -> None:
            events.append(f"read, durable done: {result.durable.done()}")
            settle_ready(loop)
            events.append("hook returned")

        assert store.answer_syncs_on_loop(loop.add_reader, loop.remove_reader, answered)
        result = store.put_message(message(body=b"hooked"))
        statuses: asyncio.Future[PutStatus] = loop.create_future()

        def answer(status: PutStatus) -> None:
            events.append(f"answered on the loop: {threading.get_ident() == loop_thread}")
            statuses.set_result(status)

        loop_thread = threading.get_ident()
        answer_when_durable(result.durable, 30, answer, loop)
        return await asyncio.wait_for(statuses, 30)

    try:
        assert asyncio.run(scenario()) is PutStatus.PUT_OK
    finally:
        store.close()
    assert service.answers >= 1
    assert events[:3] == ["read, durable done: True", "answered on the loop: True",
                          "hook returned"]


def test_a_killed_worker_read_on_the_loop_falls_back(held_store):
    store, _release = held_store
    service = _service(store)

    async def scenario() -> list[PutStatus]:
        loop = asyncio.get_running_loop()
        assert store.answer_syncs_on_loop(loop.add_reader, loop.remove_reader)
        results = [store.put_message(message(body=b"k%d" % i)) for i in range(3)]
        os.kill(service.worker_pid, signal.SIGKILL)  # the worker this test's store started
        return await asyncio.wait_for(
            asyncio.gather(*(asyncio.wrap_future(r.durable) for r in results)), 30)

    assert asyncio.run(scenario()) == [PutStatus.PUT_OK] * 3
    assert service.worker_pid is None
    assert store.put_message(message(body=b"after")).wait_durable(30) is PutStatus.PUT_OK


def test_the_worker_outlives_sigint_and_sigterm_and_ends_when_its_pipe_closes():
    # A service manager signals the whole process group at stop; the worker must keep
    # serving until its broker closes the pipe, or every stop would log it as gone.
    import subprocess
    import sys

    worker = subprocess.Popen([sys.executable, "-I", sync_worker.__file__],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        os.write(worker.stdin.fileno(), b"1 \n")  # a command naming no file: answered at once
        assert os.read(worker.stdout.fileno(), 100).startswith(b"OK 1")  # handlers are set
        worker.send_signal(signal.SIGINT)
        worker.send_signal(signal.SIGTERM)
        os.write(worker.stdin.fileno(), b"2 \n")
        assert os.read(worker.stdout.fileno(), 100).startswith(b"OK 2")
        worker.stdin.close()
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()  # the worker this test started
            worker.wait()
        worker.stdout.close()

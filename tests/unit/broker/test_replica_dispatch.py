"""The slave's dispatch behind the copy (broker/ha/replica_dispatch.py), on real stores."""

from __future__ import annotations

import asyncio
from collections import deque

from tidemq.broker.ha import replica_dispatch
from tidemq.broker.ha.replica_dispatch import ReplicaDispatcher
from tidemq.store.config import StoreConfig
from tidemq.store.interface import StoreMessage
from tidemq.store.memory_store import MemoryMessageStore
from tidemq.store.replication import ReplicaCorrupt

SEGMENT = 1 << 20


def stores(tmp_path):
    def open_store(name):
        return MemoryMessageStore(StoreConfig(store_path_root_dir=str(tmp_path / name),
                                              mapped_file_size_commit_log=SEGMENT))
    return open_store("master"), open_store("slave")


def fill(master, count: int) -> None:
    for start in range(0, count, 64):
        result = master.put_messages([
            StoreMessage("Orders", 0, bytes(1000), {"TAGS": "t", "KEYS": f"k{start + i}"})
            for i in range(64)
        ])
        assert result.ok, result.remark


def copy(master, slave) -> int:
    """The HA client's part: the master's bytes into the slave's log, nothing dispatched."""
    offset, end = slave.commit_log_max_offset(), master.commit_log_max_offset()
    while offset < end:
        chunk = master.read_commit_log(offset, 32 * 1024)
        if not chunk:  # the end of a segment: the next one starts at its boundary
            offset = (offset // SEGMENT + 1) * SEGMENT
            continue
        slave.append_replicated(offset, chunk)
        offset += len(chunk)
    return end


async def until(condition, what: str) -> None:
    for _ in range(2000):  # bounded: ~20 s on a busy machine
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_copied_records_become_readable_in_slices_while_the_loop_keeps_running(
        tmp_path, monkeypatch):
    monkeypatch.setattr(replica_dispatch, "DISPATCH_SLICE_BYTES", 64 * 1024)
    master, slave = stores(tmp_path)
    fill(master, 640)  # ~700 KB: about ten slices

    async def scenario():
        samples: deque[int] = deque()
        dispatcher = ReplicaDispatcher(slave, samples)
        dispatcher.start()
        end = copy(master, slave)
        assert slave.max_offset("Orders", 0) == 0  # copied is not yet readable
        assert dispatcher.behind_bytes == end
        ticks = []

        async def ticker():  # another task on the loop: it runs between slices
            while True:
                ticks.append(slave.replicated_confirmed_offset())
                await asyncio.sleep(0)

        other = asyncio.create_task(ticker())
        dispatcher.wake()
        await until(lambda: slave.replicated_confirmed_offset() == end, "the dispatch")
        other.cancel()
        await dispatcher.stop()
        return end, ticks, samples, dispatcher.behind_bytes

    end, ticks, samples, behind = asyncio.run(scenario())
    assert slave.max_offset("Orders", 0) == 640
    assert slave.query_messages("Orders", "k600", 4, 0, 1 << 62).records
    # The other task saw the dispatch part done, more than once: it ran between slices.
    assert len({tick for tick in ticks if 0 < tick < end}) >= 5
    assert samples and behind == 0


def test_stop_dispatches_what_was_copied(tmp_path):
    master, slave = stores(tmp_path)
    fill(master, 640)

    async def scenario():
        dispatcher = ReplicaDispatcher(slave, deque())
        dispatcher.start()
        end = copy(master, slave)
        dispatcher.wake()
        await dispatcher.stop()  # before the task had its turn
        return end

    end = asyncio.run(scenario())
    assert slave.replicated_confirmed_offset() == end
    assert slave.max_offset("Orders", 0) == 640


def test_bytes_that_are_no_record_stop_the_dispatch_with_the_offset(tmp_path):
    master, slave = stores(tmp_path)
    fill(master, 64)

    async def scenario():
        dispatcher = ReplicaDispatcher(slave, deque())
        dispatcher.start()
        end = copy(master, slave)
        slave.append_replicated(end, b"\x00\x00\x01\x00garbage!" + bytes(300))
        dispatcher.wake()
        await until(lambda: dispatcher.failure is not None, "the failure")
        await dispatcher.stop()
        return end, dispatcher.failure

    end, failure = asyncio.run(scenario())
    assert isinstance(failure, ReplicaCorrupt)
    assert f"offset {end}" in str(failure)
    assert slave.max_offset("Orders", 0) == 64  # the records before it are readable

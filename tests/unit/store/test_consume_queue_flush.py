"""The periodic consume-queue flush syncs the queues written since its last pass, not all."""

from __future__ import annotations

import os

import pytest
from store_helpers import message, small_config

from tidemq.errors import StoreError
from tidemq.store import flush
from tidemq.store.consume_queue import ENTRY_SIZE, pack_entries
from tidemq.store.consume_queue_table import ConsumeQueueTable
from tidemq.store.file_store import FileMessageStore

QUEUE_FILE_SIZE = 1_000 * ENTRY_SIZE


@pytest.fixture
def table(tmp_path):
    table = ConsumeQueueTable(str(tmp_path / "consumequeue"), QUEUE_FILE_SIZE)
    yield table
    table.close()


def put(table: ConsumeQueueTable, queue_id: int, count: int = 1) -> None:
    queue = table.get_or_create("T", queue_id)
    offset = queue.max_offset
    queue.ensure_room(count)
    queue.put(offset, pack_entries([100 + offset + i for i in range(count)], [50] * count,
                                   [0] * count), 0)


def flushed(table: ConsumeQueueTable, queue_id: int) -> int:
    return table.get_or_create("T", queue_id).queue.flushed_where


def test_only_written_queues_are_synced_and_each_once(table, monkeypatch):
    synced: list[int] = []
    real_fdatasync = flush._fdatasync

    def counting_fdatasync(fd: int) -> None:
        synced.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr(flush, "_fdatasync", counting_fdatasync)
    for queue_id in range(8):
        put(table, queue_id)
    assert table.flush_written() == 8
    assert len(synced) == 8
    assert [flushed(table, q) for q in range(8)] == [ENTRY_SIZE] * 8
    synced.clear()
    assert table.flush_written() == 0  # nothing written: no queue visited, nothing synced
    assert synced == []
    put(table, 3, count=2)
    put(table, 3)
    assert table.flush_written() == 1
    assert len(synced) == 1 and flushed(table, 3) == 4 * ENTRY_SIZE


def test_a_queue_whose_sync_failed_is_synced_again_next_time(table, monkeypatch):
    put(table, 0)

    def failing_fdatasync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(flush, "_fdatasync", failing_fdatasync)
    with pytest.raises(StoreError, match="cannot sync"):
        table.flush_written()
    assert flushed(table, 0) == 0
    monkeypatch.undo()
    assert table.flush_written() == 1
    assert flushed(table, 0) == ENTRY_SIZE


def test_the_store_flush_syncs_every_queue_and_the_data_survives(tmp_path):
    config = small_config(tmp_path / "store")
    with FileMessageStore(config) as store:
        for queue_id in range(4):
            assert store.put_message(message("Orders", queue_id, b"m")).ok
        store.queues.written.clear()  # even a queue the periodic pass would skip
        store.flush()
        assert all(queue.queue.flushed_where == ENTRY_SIZE for queue in store.queues.all())
    with FileMessageStore(config) as reopened:
        assert [reopened.max_offset("Orders", q) for q in range(4)] == [1] * 4
    assert os.path.isdir(tmp_path / "store" / "consumequeue" / "Orders")

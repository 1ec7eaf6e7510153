"""ConsumeQueue.next_offset_with_room: max_offset after ensure_room, in one call."""

from __future__ import annotations

import pytest

from tidemq.store.consume_queue import ENTRY_SIZE, RESERVE_CHUNK_BYTES, pack_entries
from tidemq.store.consume_queue_table import ConsumeQueueTable

SEGMENT_ENTRIES = 100  # small segments: a run of entries crosses into new ones


@pytest.fixture(params=["file", "memory"])
def table(request, tmp_path):
    directory = str(tmp_path / "consumequeue") if request.param == "file" else None
    table = ConsumeQueueTable(directory, SEGMENT_ENTRIES * ENTRY_SIZE)
    yield table
    table.close()


def write(queue, offset: int, count: int) -> None:
    queue.put(offset, pack_entries([1_000 + offset + i for i in range(count)], [50] * count,
                                   [0] * count), 0)


@pytest.mark.parametrize("runs", [[1, 1, 3], [99, 1, 1], [150, 7], [1, 250, 2], [
    RESERVE_CHUNK_BYTES // ENTRY_SIZE + 5, 3]])
def test_each_run_starts_at_max_offset_and_fits_without_failing(table, runs):
    queue = table.get_or_create("T", 0)
    expected = 0
    for count in runs:
        first = queue.next_offset_with_room(count)
        assert first == queue.max_offset == expected
        write(queue, first, count)
        expected += count
        assert queue.max_offset == expected
        assert queue.entry(expected - 1) == (1_000 + expected - 1, 50, 0)


def test_it_makes_room_as_ensure_room_does(table):
    queue = table.get_or_create("T", 1)
    other = table.get_or_create("T", 2)
    for count in (1, 120, 99, 30):
        first = queue.next_offset_with_room(count)
        start = other.max_offset
        other.ensure_room(count)
        assert first == start
        write(queue, first, count)
        write(other, start, count)
        assert [f.reserved_position for f in queue.queue.files] == [
            f.reserved_position for f in other.queue.files]
    assert queue.max_offset == other.max_offset == 250

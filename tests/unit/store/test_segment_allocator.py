"""The segment allocator warms the log's next segment at the pace the log writes."""

from __future__ import annotations

import time

from tidemq.store.segment_allocator import WARM_CHUNK_BYTES, SegmentAllocator

FILE_SIZE = 16 * WARM_CHUNK_BYTES
LEAD = FILE_SIZE // 8  # WARM_LEAD_FRACTION
WAIT_BOUND_S = 10.0


def wait_until(condition) -> None:
    deadline = time.monotonic() + WAIT_BOUND_S
    while not condition():
        assert time.monotonic() < deadline, "the allocator did not get there in time"
        time.sleep(0.005)


def test_the_spare_is_warmed_an_eighth_of_a_segment_ahead_of_the_logs_writing(tmp_path):
    allocator = SegmentAllocator(str(tmp_path), FILE_SIZE)
    allocator.start()
    try:
        allocator.note_written(0)
        allocator.request(FILE_SIZE)
        wait_until(lambda: allocator.warmed_bytes == LEAD)
        time.sleep(0.05)  # it waits there: the log wrote nothing more
        assert allocator.warmed_bytes == LEAD
        allocator.note_written(3 * WARM_CHUNK_BYTES)
        wait_until(lambda: allocator.warmed_bytes == LEAD + 3 * WARM_CHUNK_BYTES)
        allocator.note_written(FILE_SIZE)
        wait_until(lambda: allocator.warmed_bytes == FILE_SIZE)
        spare = allocator.take(FILE_SIZE)
        assert spare is not None and spare.file_from_offset == FILE_SIZE
        with open(spare.path, "rb") as warmed:
            assert warmed.read() == bytes(FILE_SIZE)
        spare.close()
    finally:
        allocator.close()


def test_a_spare_waiting_for_the_log_is_taken_and_closed_at_once(tmp_path):
    allocator = SegmentAllocator(str(tmp_path), FILE_SIZE)
    allocator.start()
    allocator.note_written(0)
    allocator.request(0)
    wait_until(lambda: allocator.warmed_bytes == LEAD)
    spare = allocator.take(0)  # the log got there before the warming: it writes the rest
    assert spare is not None
    allocator.note_written(FILE_SIZE)
    time.sleep(0.05)
    assert allocator.warmed_bytes == LEAD  # never touched once taken
    allocator.request(FILE_SIZE)
    wait_until(lambda: allocator.warmed_bytes > 0)
    allocator.close()  # returns though the warming waits for the log; the spare is deleted
    assert not (tmp_path / f"{FILE_SIZE:020d}").exists()
    spare.close()

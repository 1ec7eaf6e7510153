"""The segment allocator warms the log's next segment at the pace the log writes."""

from __future__ import annotations

import os
import threading
import time

import pytest

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


def _voluntary_switches(thread_id: int) -> int:
    with open(f"/proc/self/task/{thread_id}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


@pytest.mark.skipif(not os.path.exists("/proc/self/task"),
                    reason="counts wake-ups from Linux /proc")
def test_warming_ahead_of_an_idle_log_sleeps_until_the_log_writes(tmp_path):
    # A broker that writes nothing must not wake the thread: each wake-up takes a core and
    # the GIL from a busy event loop (it polled 100 times a second).
    allocator = SegmentAllocator(str(tmp_path), FILE_SIZE)
    allocator.start()
    try:
        allocator.note_written(0)
        allocator.request(FILE_SIZE)
        wait_until(lambda: allocator.warmed_bytes == LEAD)
        (thread,) = [t for t in threading.enumerate() if t.name == "tidemq-segment-allocator"]
        before = _voluntary_switches(thread.native_id)
        time.sleep(0.3)
        assert _voluntary_switches(thread.native_id) - before <= 2
        allocator.note_written(0)  # no progress: no chunk more
        time.sleep(0.05)
        assert allocator.warmed_bytes == LEAD
        allocator.note_written(1)  # the log moved: the next chunk is due, and only that one
        wait_until(lambda: allocator.warmed_bytes == LEAD + WARM_CHUNK_BYTES)
        time.sleep(0.05)
        assert allocator.warmed_bytes == LEAD + WARM_CHUNK_BYTES
    finally:
        allocator.close()

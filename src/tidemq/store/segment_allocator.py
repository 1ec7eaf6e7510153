"""SegmentAllocator: create and warm the commit log's next segment on a background thread.

Why: the first write to each page of a fresh segment takes a page fault (allocate a page-cache
page, convert the file system's unwritten extent). Measured here, that costs ~2 us of CPU and
~4 us of wall time per 1 KiB message, more than encoding it, and it happens on the append
path with the GIL held. This thread writes zeros over the next segment with ``os.pwrite``
(which releases the GIL) while the current one is being filled, so the appender later writes
to pages that are already in the page cache. RocketMQ does the same in its
AllocateMappedFileService with ``warmMapedFileEnable``. The price is writing each segment's
zeros once in the background. Since appends are pwrites (commit_log.py), that price is
higher than what it saves (1.2-2 us of CPU per 1 KiB message on this thread, up to 3.9 under
SYNC_FLUSH, to save the appender ~0.15 us), so ``warm_mapped_file_enable`` is off by default,
as in RocketMQ, and this thread only runs when it is turned on.

Pacing: the log reports how far its current segment is written (``note_written``), and the
thread warms the spare no further than that plus ``WARM_LEAD_FRACTION`` of a segment: a
segment's warming is spread over the writing of the one before (its cost comes with the bytes
written, not as one burst of a core for seconds, 128 MiB at most), and ends that far before the
log needs it; the lead is the thread's slack when it shares busy cores. While it is that far
ahead the thread sleeps until the log's writing reaches the point where its next chunk may
go (``note_written`` wakes it then, one comparison per append otherwise), not on a timer: a
broker that writes slowly or not at all does not wake it (a 100 Hz poll did, 60-100 times a
second, each wake-up a grab of the GIL and a core on a shared machine).

Protocol (no byte of a segment is ever written by both threads):
- ``request(offset)``: the log will want the segment starting at ``offset`` next;
- the thread creates it (not yet in the log's segment list) and warms it 1 MiB at a time,
  each chunk under ``_warm_lock`` and only while the segment is still the spare;
- ``take(offset)``: the log claims the spare. It stops being the spare at once, and ``take``
  waits for the chunk in flight (at most 1 MiB), so the warmer never touches it again.

A spare left at a crash is an all-zero last segment, which recovery handles like any empty
segment; a clean close deletes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

from tidemq.errors import StoreError
from tidemq.store.mapped_file import MappedFile

logger = logging.getLogger(__name__)

WARM_CHUNK_BYTES = 1 << 20
_ZEROS = bytes(WARM_CHUNK_BYTES)
# How far (a fraction of a segment) warming runs ahead of the log's writing.
WARM_LEAD_FRACTION = 1 / 8
# No wake-up is wanted: note_written compares every position against this.
_NEVER = 1 << 62


class SegmentAllocator:
    """Prepares one spare segment at a time for the log in ``directory``."""

    def __init__(self, directory: str, file_size: int) -> None:
        self.directory = directory
        self.file_size = file_size
        self._condition = threading.Condition(threading.Lock())
        self._wanted: int | None = None
        self._preparing: int | None = None  # the offset being created right now
        self._spare: MappedFile | None = None
        self._warm_lock = threading.Lock()
        self._stopping = threading.Event()
        # How far the log's current segment is written (note_written); read by the thread.
        self._written = 0
        # The thread waits on _resume until the log's writing reaches _resume_at (note_written
        # sets it then); request, take, discard and close set it too, so a wait ends when the
        # spare it paces is no longer wanted.
        self._resume = threading.Event()
        self._resume_at = _NEVER
        # Bytes of the spare warmed so far (for tests and diagnostics).
        self.warmed_bytes = 0
        self._thread = threading.Thread(
            target=self._run, name="tidemq-segment-allocator", daemon=True
        )

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def request(self, file_from_offset: int) -> None:
        """Prepare the segment that starts at ``file_from_offset`` (replacing an older wish)."""
        with self._condition:
            spare = self._spare
            if spare is not None and spare.file_from_offset == file_from_offset:
                return
            self._wanted = file_from_offset
            self._condition.notify()
        self._resume.set()

    def note_written(self, position: int) -> None:
        """The log's current segment is written up to ``position`` (module docstring)."""
        self._written = position
        if position >= self._resume_at:
            self._resume_at = _NEVER
            self._resume.set()

    def take(self, file_from_offset: int) -> MappedFile | None:
        """The prepared segment for ``file_from_offset``, or None (then create it yourself).

        A spare for another offset (the log was truncated meanwhile) is deleted.
        """
        with self._condition:
            if self._wanted == file_from_offset:
                self._wanted = None  # too late: the caller creates it now
            while self._preparing == file_from_offset:
                self._condition.wait()
            spare, self._spare = self._spare, None
        self._resume.set()
        if spare is None:
            return None
        with self._warm_lock:
            pass  # the chunk in flight, if any, is done; the warmer sees no spare now
        if spare.file_from_offset != file_from_offset:
            spare.destroy()
            return None
        return spare

    def discard(self) -> None:
        """Forget the wish and delete the spare (the log is about to be truncated: a spare
        for the old next offset would be a segment after a hole if the process died now)."""
        with self._condition:
            self._wanted = None
            while self._preparing is not None:
                self._condition.wait()
            spare, self._spare = self._spare, None
        self._resume.set()
        if spare is not None:
            with self._warm_lock:
                pass  # the chunk in flight, if any, is done
            spare.destroy()

    def close(self) -> None:
        """Stop the thread and delete an unused spare."""
        with self._condition:
            self._stopping.set()
            self._condition.notify()
        self._resume.set()
        if self._thread.is_alive():
            self._thread.join()
        spare = self.take(-1)
        assert spare is None

    def _run(self) -> None:
        while True:
            with self._condition:
                while self._wanted is None and not self._stopping.is_set():
                    self._condition.wait()
                if self._stopping.is_set():
                    return
                wanted, self._wanted = self._wanted, None
                self._preparing = wanted
            self._prepare(wanted)

    def _prepare(self, file_from_offset: int) -> None:
        try:
            os.makedirs(self.directory, exist_ok=True)
            mapped = MappedFile.create(
                self.directory, file_from_offset, self.file_size, exclusive=True
            )
        except StoreError as e:
            # The appender creates it itself when it gets there and reports any error then.
            logger.info("could not prepare segment %d ahead: %s", file_from_offset, e)
            with self._condition:
                self._preparing = None
                self._condition.notify_all()
            return
        with self._condition:
            previous, self._spare = self._spare, mapped
            self._preparing = None
            self._condition.notify_all()
        if previous is not None:
            with self._warm_lock:
                pass
            previous.destroy()
        self.warmed_bytes = 0
        self._warm(mapped)

    def _warm(self, mapped: MappedFile) -> None:
        assert mapped.path is not None
        try:
            fd = os.open(mapped.path, os.O_WRONLY)
        except OSError:
            return
        try:
            lead = int(self.file_size * WARM_LEAD_FRACTION)
            for position in range(0, self.file_size, WARM_CHUNK_BYTES):
                self._wait_for_log(position - lead, mapped)
                with self._warm_lock:
                    if self._spare is not mapped or self._stopping.is_set():
                        return
                    size = min(WARM_CHUNK_BYTES, self.file_size - position)
                    os.pwrite(fd, _ZEROS[:size], position)
                    self.warmed_bytes = position + size
        except OSError as e:
            logger.warning("could not warm segment %s: %s", mapped.path, e)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _wait_for_log(self, position: int, mapped: MappedFile) -> None:
        # Sleep until the log's writing passes ``position``, the spare stops being ``mapped``
        # or the allocator stops. Clear, then publish the mark, then look: a note_written
        # after the look finds the mark and sets the event, one before it is seen by the look.
        while self._written <= position and self._spare is mapped and not self._stopping.is_set():
            self._resume.clear()
            self._resume_at = position + 1
            if self._written > position or self._spare is not mapped or self._stopping.is_set():
                break
            self._resume.wait()
        self._resume_at = _NEVER

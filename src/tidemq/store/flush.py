"""Flush services: the threads that move written bytes to disk.

- ``PeriodicFlusher``: runs an action every N ms (ASYNC_FLUSH commit log every
  flush_interval_commit_log_ms; consume queues, index and checkpoint every
  flush_interval_consume_queue_ms) and once more when stopped.
- ``GroupCommitService`` (SYNC_FLUSH): each append asks for its end offset to be synced and
  gets a Future. Every request made while no sync has started yet gets the same Future (the
  group's): the thread takes the group, syncs once up to the end of the log, and completes
  the group's one Future, PUT_OK when the sync reached the group's highest end offset. So
  appends that arrive together share one sync and one completion: the flush thread takes
  the GIL once per sync to answer them, not once per append (with the event loop holding
  the GIL for most of a busy broker's time, each of those handoffs was a wait). A failed
  sync completes its group with FLUSH_DISK_TIMEOUT (the broker's answer for "stored but not
  known durable").
- ``sync_mapped_files``: what both call to sync a log (the commit log, a consume queue):
  ``fdatasync`` on each segment's file rather than ``mmap.flush``. On Linux both write the
  file's dirty pages (written through the mapping or not) and wait for the disk, but
  CPython's ``mmap.flush`` (msync) holds the GIL for the whole wait, stopping every
  appender for as long as the disk takes; ``os.fdatasync`` releases it, so appends go on
  while the group commit waits.
- ``SegmentSyncer``: keeps the file of the segment a log synced last open, so syncing the
  segment being written again is one system call (``fdatasync``) instead of three (open,
  fdatasync, close). Every blocking call on the flush thread gives the GIL back, and taking
  it again from a busy event loop can wait up to the interpreter's switch interval (5 ms),
  delaying the answer to every send of the group. Most of a sync is still the disk's
  (fdatasync p50 0.5, p90 3.6 ms on the shared test volume; benchmarks/RESULTS.md).

Threads: each service owns one daemon thread. The waiting group is guarded by the service's
condition; the thread is the only one that completes futures.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future

from tidemq.errors import StoreError
from tidemq.store.interface import PutStatus
from tidemq.store.mapped_file import MappedFile
from tidemq.store.mapped_file_queue import MappedFileQueue

logger = logging.getLogger(__name__)


def _fdatasync(fd: int) -> None:
    # fdatasync skips metadata the data does not need (mtime); macOS lacks it. Looked up
    # per call, so a test can make it fail.
    getattr(os, "fdatasync", os.fsync)(fd)


# A request whose bytes sit in a segment that was not wholly synced in one pass (the flushed
# offset stops at the first incomplete segment) needs another pass; two more always suffice.
_FLUSH_PASSES_MAX = 3


class PeriodicFlusher:
    """Run ``action`` every ``interval_ms`` on a daemon thread, and once more on ``stop``."""

    def __init__(self, name: str, interval_ms: int, action: Callable[[], None]) -> None:
        self._interval_s = interval_ms / 1000
        self._action = action
        self._stopping = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            self._run_once()

    def _run_once(self) -> None:
        try:
            self._action()
        except StoreError as e:
            # Log the first failure of a streak, not one line per interval.
            if not self._failing:
                logger.error("%s failed: %s", self._thread.name, e)
            self._failing = True
        else:
            if self._failing:
                logger.warning("%s works again", self._thread.name)
            self._failing = False

    def stop(self) -> None:
        """Stop the thread and run the action one last time on the caller's thread."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        self._run_once()


class GroupCommitService:
    """Sync on request; ``flush`` syncs the log and returns the synced end offset."""

    def __init__(self, flush: Callable[[], int]) -> None:
        self._flush = flush
        self._condition = threading.Condition(threading.Lock())
        # The group waiting for the next sync: its shared Future and highest end offset.
        self._pending: Future[PutStatus] | None = None
        self._pending_target = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tidemq-group-commit", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def request(self, end_offset: int) -> Future[PutStatus]:
        """A Future that resolves to PUT_OK once the log is synced to ``end_offset``
        (FLUSH_DISK_TIMEOUT when the sync failed or the service stopped first). Requests
        made before the next sync starts share one Future (module docstring)."""
        with self._condition:
            if self._stopping:
                stopped: Future[PutStatus] = Future()
                stopped.set_result(PutStatus.FLUSH_DISK_TIMEOUT)
                return stopped
            future = self._pending
            if future is None:
                future = self._pending = Future()
                self._pending_target = end_offset
                self._condition.notify()
            elif end_offset > self._pending_target:
                self._pending_target = end_offset
            return future

    def _take(self) -> tuple[Future[PutStatus] | None, int]:
        # Under the condition: the waiting group, now no longer open to new requests.
        group, target = self._pending, self._pending_target
        self._pending = None
        return group, target

    def _run(self) -> None:
        while True:
            with self._condition:
                while self._pending is None and not self._stopping:
                    self._condition.wait()
                group, target = self._take()
                stopping = self._stopping
            if group is not None:
                self._commit(group, target)
            if stopping:
                return

    def _commit(self, group: Future[PutStatus], target: int) -> None:
        try:
            flushed = self._flush()
            passes = 1
            while flushed < target and passes < _FLUSH_PASSES_MAX:
                flushed = self._flush()
                passes += 1
        except StoreError as e:
            logger.error("group commit sync failed, answering FLUSH_DISK_TIMEOUT: %s", e)
            flushed = -1
        group.set_result(PutStatus.PUT_OK if target <= flushed else PutStatus.FLUSH_DISK_TIMEOUT)

    def stop(self) -> None:
        """Serve the requests already queued, then stop the thread."""
        with self._condition:
            self._stopping = True
            self._condition.notify()
        if self._thread.is_alive():
            self._thread.join()
        with self._condition:
            leftover, target = self._take()
        if leftover is not None:
            self._commit(leftover, target)


class SegmentSyncer:
    """Syncs segments of one log, keeping the last one's file open (module docstring).

    Thread-safe: syncs of one log (the flush thread's, a shutdown's or a truncation's on the
    loop) take turns under a lock, so none closes the file another is syncing. The file is
    held by segment *object*: a segment made again under the same name (after a truncation)
    is another object and gets its own open.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mapped: MappedFile | None = None
        self._fd = -1

    def sync(self, mapped: MappedFile) -> int:
        """``_sync_segment`` through the kept file; returns the segment's flushed position.

        Raises:
            StoreError: the open or the sync failed; names the file.
        """
        with self._lock:
            write_position = mapped.write_position
            flushed = mapped.flushed_position
            if write_position <= flushed or mapped.closed or mapped.path is None:
                return _sync_segment(mapped)
            try:
                if self._mapped is not mapped:
                    self._close_file()
                    self._fd = os.open(mapped.path, os.O_RDWR)
                    self._mapped = mapped
                _fdatasync(self._fd)
            except OSError as e:
                self._close_file()
                if mapped.closed:  # deleted by retention or truncation while we synced
                    return flushed
                raise StoreError(f"cannot sync {mapped.path}: {e}") from e
            if mapped.closed:  # cut or deleted meanwhile: its bytes are not the log's any more
                return flushed
            mapped.flushed_position = write_position
            return write_position

    def close(self) -> None:
        """Close the kept file (the log is closing)."""
        with self._lock:
            self._close_file()

    def _close_file(self) -> None:
        fd, self._fd, self._mapped = self._fd, -1, None
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def sync_mapped_files(queue: MappedFileQueue, syncer: SegmentSyncer | None = None) -> int:
    """Sync every segment of ``queue`` from its flushed point to its write end, without
    holding the GIL while the disk works; return the new flushed offset of the log.
    ``syncer`` given: through its kept file (``SegmentSyncer``).

    The same contract as ``MappedFileQueue.flush``: the flushed offset moves only over
    contiguous synced bytes, stopping in the first segment that is not wholly written.

    Raises:
        StoreError: a sync failed (the disk or the volume is gone); names the file.
    """
    files = queue.files
    if not files:
        return queue.flushed_where
    starts = [mapped.file_from_offset for mapped in files]
    first = max(0, bisect.bisect_right(starts, queue.flushed_where) - 1)
    sync = _sync_segment if syncer is None else syncer.sync
    for mapped in files[first:]:
        sync(mapped)
    flushed_where = contiguous_synced_offset(files, first)
    queue.flushed_where = flushed_where
    return flushed_where


def contiguous_synced_offset(files: list[MappedFile], first: int) -> int:
    """The log offset up to which ``files[first:]`` are synced with no gap: the flushed point
    of the first of them not wholly synced, or the last one's (``MappedFileQueue.flush``'s
    rule). ``files`` is not empty."""
    for mapped in files[first:]:
        if mapped.flushed_position < mapped.file_size:
            return mapped.file_from_offset + mapped.flushed_position
    return files[-1].file_from_offset + files[-1].flushed_position


def _sync_segment(mapped: MappedFile) -> int:
    # Everything written before the sync starts is on disk once it returns: take the write
    # position first, and only then move the flushed position up to it.
    write_position = mapped.write_position
    flushed = mapped.flushed_position
    if write_position <= flushed or mapped.closed:
        return flushed
    if mapped.path is not None:
        try:
            fd = os.open(mapped.path, os.O_RDWR)
            try:
                _fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            if mapped.closed:  # deleted by retention or truncation while we synced
                return flushed
            raise StoreError(f"cannot sync {mapped.path}: {e}") from e
    mapped.flushed_position = write_position
    return write_position

"""The checkpoint file: how far each part of the store is known to be on disk.

Layout (docs/protocol.md §10.4): ``<storePathRootDir>/checkpoint``, 4096 bytes, memory-mapped,
big-endian longs::

    off  size  field
      0     8  physicMsgTimestamp   store time of the newest record flushed in the commit log
      8     8  logicsMsgTimestamp   store time of the newest entry flushed in the consume queues
     16     8  indexMsgTimestamp    store time of the newest key flushed in the index
     24  4072  zeros (RocketMQ 5.x puts masterFlushedOffset and confirmPhyOffset at 24 and 32)
    CHECKPOINT_FILE_SIZE = 4096 (one page, so a sync writes it whole)

After a crash, recovery replays the commit log from the last segment whose first record is
no newer than the smallest of these times (minus 3 s of slack, as RocketMQ does): everything
older is known to be on disk in every part.

Threads: the flush threads set the times; the consume-queue flush syncs the file, once a
flush interval, with ``fdatasync`` on its descriptor (``flush``): CPython's ``mmap.flush``
(msync) holds the GIL while the disk works, which stopped the broker's event loop once a
second for as long as the sync took.
"""

from __future__ import annotations

import mmap
import os
import struct

from tidemq.errors import StoreError

CHECKPOINT_FILE_SIZE = 4096
_LONG = struct.Struct(">q")
_PHYSIC_AT = 0
_LOGICS_AT = 8
_INDEX_AT = 16
# RocketMQ steps back 3 s from the checkpoint: store times are taken before the flush that
# the checkpoint records, and clocks are not exact.
RECOVERY_SLACK_MS = 3000


class StoreCheckpoint:
    """The mapped checkpoint file; created zeroed when missing.

    Raises:
        StoreError: the file cannot be created or mapped.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if os.fstat(fd).st_size < CHECKPOINT_FILE_SIZE:
                    os.ftruncate(fd, CHECKPOINT_FILE_SIZE)
                self._mmap = mmap.mmap(fd, CHECKPOINT_FILE_SIZE)
            except BaseException:
                os.close(fd)
                raise
        except OSError as e:
            raise StoreError(f"cannot open checkpoint file {path}: {e.strerror}") from e
        self._fd = fd  # kept open for ``flush``; closed by ``close``

    def _get(self, position: int) -> int:
        return _LONG.unpack_from(self._mmap, position)[0]

    def _put(self, position: int, value: int) -> None:
        _LONG.pack_into(self._mmap, position, value)

    @property
    def physic_msg_timestamp(self) -> int:
        """Store time of the newest record flushed in the commit log."""
        return self._get(_PHYSIC_AT)

    @physic_msg_timestamp.setter
    def physic_msg_timestamp(self, value: int) -> None:
        self._put(_PHYSIC_AT, value)

    @property
    def logics_msg_timestamp(self) -> int:
        """Store time of the newest entry flushed in the consume queues."""
        return self._get(_LOGICS_AT)

    @logics_msg_timestamp.setter
    def logics_msg_timestamp(self, value: int) -> None:
        self._put(_LOGICS_AT, value)

    @property
    def index_msg_timestamp(self) -> int:
        """Store time of the newest key flushed in the index."""
        return self._get(_INDEX_AT)

    @index_msg_timestamp.setter
    def index_msg_timestamp(self, value: int) -> None:
        self._put(_INDEX_AT, value)

    def min_timestamp(self, with_index: bool) -> int:
        """The time before which every part is on disk, minus RocketMQ's slack."""
        times = [self.physic_msg_timestamp, self.logics_msg_timestamp]
        if with_index:
            times.append(self.index_msg_timestamp)
        return min(times) - RECOVERY_SLACK_MS

    def flush(self) -> None:
        """Sync the page to disk, letting other threads run meanwhile.

        ``fdatasync`` on the file, not ``mmap.flush``: on Linux both write the page the
        shared mapping dirtied (one page cache), but ``mmap.flush`` holds the GIL for the
        whole disk wait, and this runs every second on the consume-queue flusher thread, so
        each sync stopped the event loop (0.2-0.7 ms on an idle disk, 5-50 ms on a busy one;
        benchmarks/RESULTS.md, owner tail).

        Raises:
            StoreError: the sync failed (the disk or the volume is gone); names the file.
        """
        try:
            # fdatasync skips metadata the data does not need (the mtime a mapped write
            # updates); macOS lacks it.
            getattr(os, "fdatasync", os.fsync)(self._fd)
        except OSError as e:
            raise StoreError(f"cannot sync checkpoint file {self.path}: {e.strerror}") from e

    def close(self) -> None:
        """Sync, unmap and close the file."""
        if not self._mmap.closed:
            try:
                self.flush()
            finally:
                self._mmap.close()
                os.close(self._fd)

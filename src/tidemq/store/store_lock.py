"""The store directory's ``lock`` and ``abort`` files (docs/protocol.md §10.4).

- ``lock``: held with ``fcntl.flock`` (exclusive, non-blocking) for as long as a store is
  open, so two processes never write one directory. The holder writes its pid into it, so a
  second opener can say who holds it. The kernel drops the lock when the holder dies, even
  by SIGKILL, so a crash never leaves a stale lock behind.
- ``abort``: created when a store opens and removed when it closes cleanly. Finding it at
  open means the last run crashed, and recovery must verify the commit log's tail.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

from tidemq.errors import StoreError, StoreLocked

LOCK_FILE_NAME = "lock"
ABORT_FILE_NAME = "abort"


class StoreLock:
    """An exclusive lock on a store directory; ``acquire`` before touching any file."""

    def __init__(self, root_dir: str) -> None:
        self.root_dir = root_dir
        self.path = os.path.join(root_dir, LOCK_FILE_NAME)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock.

        Raises:
            StoreLocked: another process (or another open store in this one) holds it; the
                message names the directory and the holder's pid when known.
            StoreError: the lock file cannot be created.
        """
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StoreError(f"cannot create lock file {self.path}: {e.strerror}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise StoreLocked(
                f"store directory {self.root_dir} is in use by {holder} (it holds {self.path}); "
                "stop that broker or give this one another storePathRootDir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays, empty of meaning until the next holder)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"process {text}" if text.isdigit() else "another process"


def abort_file_path(root_dir: str) -> str:
    """Path of the crash marker."""
    return os.path.join(root_dir, ABORT_FILE_NAME)


def crashed_last_time(root_dir: str) -> bool:
    """True when the previous run did not close the store cleanly (``abort`` is there)."""
    return os.path.exists(abort_file_path(root_dir))


def create_abort_file(root_dir: str) -> None:
    """Mark the store as open (removed again by ``remove_abort_file`` on a clean close)."""
    path = abort_file_path(root_dir)
    with open(path, "wb") as marker:
        os.fsync(marker.fileno())


def remove_abort_file(root_dir: str) -> None:
    """Mark the store as cleanly closed."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(abort_file_path(root_dir))

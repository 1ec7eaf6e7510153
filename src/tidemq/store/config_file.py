"""A config file saved atomically with a ``.bak`` copy, read back with a fallback to that copy.

The broker keeps its tables (topics, consumer offsets, subscription groups, delay offsets) as
JSON files under ``<storePathRootDir>/config/`` (docs/protocol.md §10.5). Saving one::

    1. write <file>.tmp and fsync it            a crash here leaves <file> as it was
    2. hard-link <file> as <file>.bak           the previous good version, kept for step 1
                                                of the next save going wrong on disk
    3. rename <file>.tmp over <file>            atomic on POSIX: readers see old or new
    4. fsync the directory                      the link and the rename survive a power cut

RocketMQ deletes ``<file>`` before the rename; replacing it in one step leaves no moment
without a main file. RocketMQ copies the old file to ``.bak``; a hard link gives the same
file for the price of a directory entry: a save never writes into an existing file (step 3
puts a new inode in place), so once a save is done ``.bak`` is the previous version and the
main file a different one. At 10,000 topics the copy was half the cost of a save (read and
write 2.5 MB, one more fsync). A file system without hard links gets the copy. The first
save of a ``ConfigFile`` fsyncs the main file before linking it, since another process may
have written it without an fsync (a copy made then would have been synced).

Loading reads ``<file>``; when it is missing, unreadable or rejected by the validator, the
``.bak`` copy is used and a WARNING names both files; when both are bad,
:class:`~tidemq.errors.ConfigFileCorrupt` says which files and what to do. A ``.tmp`` left by
a crash is ignored and overwritten by the next save.

One writer at a time: saves of one ``ConfigFile`` are serialized by a lock, since the broker
saves from worker threads (``asyncio.to_thread``) and a periodic save may still run when the
final one at shutdown starts; both would otherwise write the same ``.tmp`` (one rename then
fails, or a mix of the two is renamed into place). A save may carry the table ``version`` its
bytes hold: a save older than one already written is skipped, so a periodic save that loses
the race to the final save cannot put older offsets back.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tidemq.errors import ConfigFileCorrupt, StoreError, StoreFull
from tidemq.protocol import jsonx

log = logging.getLogger(__name__)

T = TypeVar("T")


class _Missing(Exception):
    """The file does not exist."""


class _Empty(Exception):
    """The file exists with no bytes: a torn write (RocketMQ treats it as absent)."""


class ConfigFile:
    """One JSON (or any bytes) config file with its ``.bak`` and ``.tmp`` companions.

    Args:
        path: the main file, e.g. ``<storePathRootDir>/config/topics.json``.
        validator: called with the file's bytes on load; raising anything means the content
            is corrupt and the ``.bak`` copy is tried. ``load_json`` also rejects bytes that
            are not JSON.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        validator: Callable[[bytes], object] | None = None,
    ):
        self.path = Path(path)
        self.backup_path = self.path.with_name(self.path.name + ".bak")
        self.temp_path = self.path.with_name(self.path.name + ".tmp")
        self.validator = validator
        # Set when the last load found the main file corrupt: the next save must not copy
        # that corrupt file over the good .bak it was loaded from.
        self._main_is_corrupt = False
        self._save_lock = threading.Lock()
        self._saved_version: int | None = None  # the newest version a save wrote
        # False until a save fsync'd the main file (or wrote it): see the module docstring.
        self._main_synced = False

    # -- loading --------------------------------------------------------------------------------

    def load(self) -> bytes | None:
        """The content of the main file, or of ``.bak`` when the main file is bad.

        Returns:
            The bytes, or None when neither file exists (a new store).

        Raises:
            ConfigFileCorrupt: no good copy exists; the message names the files and the fix.
        """
        return self.load_parsed(self._validated)

    def load_json(self) -> Any:
        """Like :meth:`load`, parsed with :func:`tidemq.protocol.jsonx.loads` (fastjson's
        unquoted integer keys are accepted); None when neither file exists."""
        return self.load_parsed(lambda data: jsonx.loads(self._validated(data)))

    def load_parsed(self, parse: Callable[[bytes], T]) -> T | None:
        """Load through ``parse``, which decodes the bytes and raises when they are bad.

        This is the general form of :meth:`load` and :meth:`load_json`: the config tables
        pass their decoder, so a file that is JSON but not the table's shape falls back too.
        """
        main_problem = backup_problem = None
        try:
            result = parse(self._read(self.path))
            self._main_is_corrupt = False
            return result
        except _Missing:
            main_problem = "missing"
        except Exception as exc:  # the validator's contract: raising anything means corrupt
            main_problem = _describe(exc)
            self._main_is_corrupt = True
        try:
            result = parse(self._read(self.backup_path))
        except _Missing:
            if main_problem == "missing":
                return None
            backup_problem = "missing"
        except Exception as exc:
            backup_problem = _describe(exc)
        else:
            log.warning(
                "config file %s is %s; loaded the backup %s instead (the next save rewrites %s)",
                self.path,
                main_problem,
                self.backup_path,
                self.path.name,
            )
            return result
        raise ConfigFileCorrupt(
            f"config file {self.path} is {main_problem} and its backup {self.backup_path} is "
            f"{backup_problem}; restore {self.path.name} from a copy, or delete both files to "
            "start this table empty (topics, offsets or groups in it are then lost)"
        )

    def _validated(self, data: bytes) -> bytes:
        if self.validator is not None:
            self.validator(data)
        return data

    @staticmethod
    def _read(path: Path) -> bytes:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise _Missing() from None
        if not data:
            raise _Empty()
        return data

    # -- saving ---------------------------------------------------------------------------------

    def save(self, data: bytes | Sequence[bytes | memoryview], *,
             version: int | None = None) -> bool:
        """Replace the file's content atomically, keeping the previous content as ``.bak``.

        Safe to call from several threads: saves run one at a time.

        Args:
            data: the new content, or pieces of it written one after another (a large
                table's cached entries, never copied into one buffer).
            version: the table version ``data`` holds (it only grows). When a save of a
                newer version already wrote the file, this one is skipped.

        Returns:
            True when written; False when skipped as older than what the file holds.

        Raises:
            StoreFull: the disk has no room (ENOSPC, EDQUOT); the old file is intact.
            StoreError: any other I/O failure, naming the file; the old file is intact.
        """
        with self._save_lock:
            if (version is not None and self._saved_version is not None
                    and version < self._saved_version):
                log.debug("skipped saving version %d of %s: version %d is already written",
                          version, self.path, self._saved_version)
                return False
            self._save_locked(data)
            if version is not None:
                self._saved_version = version
            return True

    def _save_locked(self, data: bytes | Sequence[bytes | memoryview]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _write_synced(self.temp_path, data)
            if not self._main_is_corrupt:
                self._keep_main_as_backup()
            os.replace(self.temp_path, self.path)
            _fsync_path(self.path.parent)
            self._main_synced = True
        except OSError as exc:
            # A partial .tmp would only hold disk space; the next save rewrites it anyway.
            with contextlib.suppress(OSError):
                self.temp_path.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                size = len(data) if isinstance(data, bytes) else sum(map(len, data))
                raise StoreFull(
                    f"no space left to save config file {self.path} ({size} bytes): {exc}; "
                    "free disk space on that volume"
                ) from exc
            raise StoreError(f"cannot save config file {self.path}: {exc}") from exc
        self._main_is_corrupt = False

    def _keep_main_as_backup(self) -> None:
        """Make ``.bak`` the current main file (a hard link; a synced copy where links are
        not supported). An empty or missing main file leaves ``.bak`` as it is."""
        try:
            if os.stat(self.path).st_size == 0:
                return
        except FileNotFoundError:
            return
        if not self._main_synced:
            _fsync_path(self.path)
        self.backup_path.unlink(missing_ok=True)
        try:
            os.link(self.path, self.backup_path)
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK,
                                 errno.EXDEV):
                raise
            _write_synced(self.backup_path, self.path.read_bytes())

    def save_json(self, obj: Any, *, version: int | None = None) -> bool:
        """Save ``obj`` as pretty-printed JSON (keys sorted, integer keys quoted); ``version``
        and the result as for :meth:`save`."""
        return self.save(jsonx.dumps(obj, pretty=True), version=version)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return f"unreadable ({exc.strerror or exc})"
    if isinstance(exc, _Empty):
        return "empty"
    return f"corrupt ({exc})"


# Pieces per writev call (POSIX guarantees at least 16; Linux takes 1,024).
_IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024)


def _write_synced(path: Path, data: bytes | Sequence[bytes | memoryview]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if isinstance(data, bytes):
            _write_all(fd, data)
        else:
            for start in range(0, len(data), _IOV_MAX):
                chunk = data[start : start + _IOV_MAX]
                written = os.writev(fd, chunk)
                if written < sum(map(len, chunk)):  # a short write: the rest plainly
                    _write_all(fd, memoryview(b"".join(chunk))[written:])
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_path(path: Path) -> None:
    """fsync a file or a directory by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

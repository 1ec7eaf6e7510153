"""Cutting the log back: what a truncation drops, and its crash-safe intent file.

A broker that was master and comes back as a slave may hold a tail its new master never had
(records it appended after its last slave acknowledgement; under SYNC_MASTER none of them was
answered SEND_OK). ``StoreCore.truncate_to(offset)`` makes ``offset`` the end of the commit
log and removes everything derived from the dropped records: consume-queue entries, index
entries (the index files holding any are rebuilt from the log), the epoch file's entries
starting in the dropped range.

Crash safety: before anything is cut, the target offset is written to
``<storePathRootDir>/truncateIntent`` (written to a temporary file, fsynced, renamed, the
directory fsynced). The store removes the file only once every part is cut and flushed. A
store opened with the file present (a crash or SIGKILL during a truncation) finishes the
truncation right after recovery, before it serves anything; every step is idempotent, so a
truncation cut short at any point ends the same as one that ran through.

The dropped records are named (``DroppedRecord``: physical offset, topic, queue, queue offset,
message id) so the broker can log exactly what it dropped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tidemq.errors import StoreError
from tidemq.protocol.message import PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
from tidemq.store.commit_log import CommitLog
from tidemq.store.record_check import dispatch_fields

INTENT_FILE_NAME = "truncateIntent"


@dataclass(frozen=True, slots=True)
class DroppedRecord:
    """One record a truncation removed."""

    physical_offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str  # the producer's unique id (UNIQ_KEY) or, without one, the offset msg id


@dataclass(slots=True)
class Truncation:
    """What ``truncate_to`` did: the log went from ``old_end`` to ``new_end``."""

    new_end: int
    old_end: int
    records: list[DroppedRecord] = field(default_factory=list)
    epochs_dropped: list[int] = field(default_factory=list)

    @property
    def count(self) -> int:
        """How many records were dropped."""
        return len(self.records)

    @property
    def dropped_bytes(self) -> int:
        """How many bytes of log were cut (blank segment ends included)."""
        return self.old_end - self.new_end

    def describe(self, ids_max: int = 50) -> str:
        """One line for the log: the range, the count and (up to ``ids_max``) the msgIds."""
        ids = [record.msg_id for record in self.records[:ids_max]]
        more = f" and {self.count - ids_max} more" if self.count > ids_max else ""
        epochs = ",".join(map(str, self.epochs_dropped))
        return (
            f"commit log cut from {self.old_end} back to {self.new_end} "
            f"({self.dropped_bytes} bytes, {self.count} records"
            f"{', epochs ' + epochs if epochs else ''}"
            f"); msgIds: {', '.join(ids) or '-'}{more}"
        )

    def id_lines(self, per_line: int = 100) -> list[str]:
        """Every dropped record, ``per_line`` to a line: "msgIds 101-200 of 250:
        <msgId>@<offset>/<topic>/<queue>/<queue offset>, ...", so the log holds all of them
        (``describe`` names only the first ones)."""
        lines = []
        for start in range(0, self.count, per_line):
            part = self.records[start:start + per_line]
            lines.append(f"msgIds {start + 1}-{start + len(part)} of {self.count}: " + ", ".join(
                f"{r.msg_id}@{r.physical_offset}/{r.topic}/{r.queue_id}/{r.queue_offset}"
                for r in part))
        return lines


def dropped_records(commit_log: CommitLog, offset: int,
                    offset_msg_id: Callable[[int], str]) -> Iterator[DroppedRecord]:
    """The records from ``offset`` (a record boundary) to the end of the log."""
    for mapped, position in commit_log.iter_positions(offset):
        buffer = mapped.buffer
        size = int.from_bytes(buffer[position : position + 4], "big")
        fields = dispatch_fields(buffer, position)
        physical_offset = mapped.file_from_offset + position
        msg_id = fields.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or offset_msg_id(
            physical_offset)
        yield DroppedRecord(physical_offset, size, fields.topic, fields.queue_id,
                            fields.queue_offset, msg_id)


def sync_file(path: str | None) -> None:
    """fdatasync one file (a segment whose tail was zeroed: its flushed position does not
    cover the zeroed bytes, so the flush services would not sync them)."""
    if path is None:
        return
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            getattr(os, "fdatasync", os.fsync)(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise StoreError(f"cannot sync {path} after truncating it: {e}") from e


class TruncateIntent:
    """The intent file of one store directory (module docstring)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, INTENT_FILE_NAME)

    def pending(self) -> int | None:
        """The offset of a truncation that did not finish, or None.

        Raises:
            StoreError: the file exists but holds no offset (the message names the fix).
        """
        try:
            with open(self.path, "rb") as f:
                text = f.read(64).decode("ascii", "replace").strip()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreError(f"cannot read {self.path}: {e}") from e
        if not text.isdigit():
            raise StoreError(
                f"{self.path} holds {text!r}, not a commit-log offset: a truncation was "
                "interrupted and its target is unknown. Remove the file to start without "
                "finishing it (the broker's next role change truncates again if needed)"
            )
        return int(text)

    def record(self, offset: int) -> None:
        """Write ``offset`` durably before a truncation begins."""
        tmp = self.path + ".tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, f"{offset}\n".encode("ascii"))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            self._sync_directory()
        except OSError as e:
            raise StoreError(f"cannot write {self.path}: {e}; nothing was truncated") from e

    def clear(self) -> None:
        """Remove the file once the truncation is complete and flushed."""
        try:
            os.unlink(self.path)
            self._sync_directory()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StoreError(f"cannot remove {self.path}: {e}") from e

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

"""The epoch file: which master epoch wrote which part of the commit log.

A broker group under automatic failover (issue 12) numbers its masters: every election bumps
the *master epoch*. Each broker keeps, beside its commit log, the list of epochs it took part
in and the physical offset each one started at (Kafka's leader-epoch checkpoint, RocketMQ 5's
epoch cache). Two brokers' logs agree up to the end of the last epoch they share (the smaller
of the two ends), so a returning old master can find where its log stopped being a copy of
the new master's and truncate exactly the tail after it (``divergence_offset``).

File ``<storePathRootDir>/epochFileCheckpoint`` (UTF-8 text, ``\\n`` line ends)::

    tidemq-epochs 1
    <epoch> <startOffset>
    <epoch> <startOffset>
    ...
    crc <crc32 of every byte above this line, 8 lowercase hex digits>

- entries in ascending order of epoch; epochs strictly increase, start offsets never decrease;
- the bytes from an entry's start offset to the next entry's start offset (or the log's end,
  for the last entry) were written while that epoch's master was the master;
- bytes before the first entry belong to the implicit epoch 0 (a log written before the
  group had a controller, or by a static master): every broker has epoch 0 from offset 0.

Written whole, atomically: a temporary file in the same directory is written, fsynced and
renamed over the old one, then the directory is fsynced. A crash leaves the old file or the
new one, never a mix; a leftover ``.tmp`` is ignored and replaced. A file that does not parse
or whose CRC does not match raises ``EpochFileCorrupt`` naming the file and the fix.

Changes: ``append`` when this broker becomes master (epoch, the log's end then);
``truncate_from`` when the log is truncated (entries starting at or after the cut go).

Threads: the broker's event loop calls ``append``; the store's truncation calls
``truncate_from`` under its append lock. Each call writes the file before it returns.
"""

from __future__ import annotations

import itertools
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from tidemq.errors import StoreError

EPOCH_FILE_NAME = "epochFileCheckpoint"  # RocketMQ 5's name for its epoch cache file
_HEADER = "tidemq-epochs 1"
# A broker group sees one epoch per election; 100,000 elections is far beyond any real
# history and keeps a corrupt or hostile file from costing more than a few MB to read.
ENTRIES_MAX = 100_000


class EpochFileCorrupt(StoreError):
    """The epoch file does not parse or fails its CRC (the message names file and fix)."""


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """One master epoch and the commit-log offset where its records begin."""

    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class EpochRange:
    """An epoch's part of a log: ``[start_offset, end_offset)``."""

    epoch: int
    start_offset: int
    end_offset: int


def epoch_ranges(entries: Sequence[EpochEntry], log_end: int) -> list[EpochRange]:
    """Each epoch's range of a log ending at ``log_end``, the implicit epoch 0 first."""
    ranges = []
    starts = [EpochEntry(0, 0), *entries] if not entries or entries[0].epoch != 0 else entries
    for i, entry in enumerate(starts):
        end = starts[i + 1].start_offset if i + 1 < len(starts) else log_end
        start = min(entry.start_offset, log_end)
        ranges.append(EpochRange(entry.epoch, start, max(start, min(end, log_end))))
    return ranges


def divergence_offset(local: Sequence[EpochEntry], local_end: int,
                      remote: Sequence[EpochEntry], remote_end: int) -> int:
    """Where the local log stops being a copy of the remote one, judged by epochs.

    The last epoch both logs hold (from the local side's newest back) was written by one
    master; both logs agree on it up to the smaller of their two ends of it, and on every
    earlier epoch. Past that point the local log holds bytes the remote never had (an old
    master's unreplicated tail) or holds an epoch the remote does not. The result is at most
    ``local_end``; equal to it means nothing to truncate.

    Epoch 0 (bytes before any entry) is shared by every log, so the result is always defined;
    whether the bytes of epoch 0 are really the same is for the byte check that follows
    (broker/ha/master_check.py compares the last record).
    """
    remote_ranges = {r.epoch: r for r in epoch_ranges(remote, remote_end)}
    for mine in reversed(epoch_ranges(local, local_end)):
        theirs = remote_ranges.get(mine.epoch)
        if theirs is None:
            continue
        if theirs.start_offset != mine.start_offset:
            # One epoch, two starts: impossible for one master; trust neither past the
            # earlier start.
            return min(mine.start_offset, theirs.start_offset, local_end)
        return min(mine.end_offset, theirs.end_offset, local_end)
    return 0


class EpochFile:
    """The epoch file of one store directory (module docstring).

    Args:
        directory: the store's root directory (storePathRootDir).

    Raises:
        EpochFileCorrupt: the file exists but does not parse or fails its CRC.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, EPOCH_FILE_NAME)
        self._entries: list[EpochEntry] = self._load()

    @property
    def entries(self) -> list[EpochEntry]:
        """The entries, oldest first (a copy)."""
        return list(self._entries)

    @property
    def last_epoch(self) -> int:
        """The newest epoch recorded (0 when none is)."""
        return self._entries[-1].epoch if self._entries else 0

    def append(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` begins at ``start_offset`` and write the file.

        Appending the newest entry again is a no-op (a repeated become_master).

        Raises:
            ValueError: ``epoch`` is not newer than the last one, or ``start_offset`` is
                before the last one's start (a caller's bug: epochs only grow).
        """
        last = self._entries[-1] if self._entries else None
        if last is not None and last == EpochEntry(epoch, start_offset):
            return
        if epoch <= 0 or start_offset < 0:
            raise ValueError(f"epoch {epoch} at offset {start_offset}: both must be positive")
        if last is not None and (epoch <= last.epoch or start_offset < last.start_offset):
            raise ValueError(
                f"epoch {epoch} at offset {start_offset} cannot follow epoch {last.epoch} at "
                f"offset {last.start_offset}: epochs strictly increase and start offsets never "
                "go back"
            )
        self._write([*self._entries, EpochEntry(epoch, start_offset)])

    def truncate_from(self, offset: int) -> list[EpochEntry]:
        """Drop the entries starting at or after ``offset`` (the log is cut there); write the
        file when something changed; return the dropped entries."""
        keep = [entry for entry in self._entries if entry.start_offset < offset]
        dropped = self._entries[len(keep):]
        if dropped:
            self._write(keep)
        return dropped

    def replace(self, entries: Sequence[EpochEntry]) -> None:
        """Take ``entries`` (a master's, once this slave's log is a prefix of its log) and
        write the file when they differ.

        Raises:
            ValueError: the entries break the order (epochs strictly increase, starts never
                go back).
        """
        entries = list(entries)
        for before, after in itertools.pairwise(entries):
            if after.epoch <= before.epoch or after.start_offset < before.start_offset:
                raise ValueError(f"epoch entries out of order: {before} then {after}")
        if entries != self._entries:
            self._write(entries)

    # -- the file -------------------------------------------------------------------------------

    def _load(self) -> list[EpochEntry]:
        try:
            with open(self.path, "rb") as f:
                data = f.read(ENTRIES_MAX * 48)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise StoreError(f"cannot read the epoch file {self.path}: {e}") from e
        return parse(data, self.path)

    def _write(self, entries: list[EpochEntry]) -> None:
        data = render(entries)
        tmp = self.path + ".tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as e:
            raise StoreError(
                f"cannot write the epoch file {self.path}: {e} (check the store directory's "
                "space and permissions)"
            ) from e
        self._entries = entries


def render(entries: Sequence[EpochEntry]) -> bytes:
    """The file's bytes for ``entries`` (module docstring)."""
    body = "".join([_HEADER, "\n", *(f"{e.epoch} {e.start_offset}\n" for e in entries)])
    raw = body.encode("ascii")
    return raw + f"crc {zlib.crc32(raw):08x}\n".encode("ascii")


def parse(data: bytes, path: str = EPOCH_FILE_NAME) -> list[EpochEntry]:
    """The entries of an epoch file's bytes.

    Raises:
        EpochFileCorrupt: the bytes are not an epoch file, fail the CRC or break the order.
    """
    fix = (
        "restore it from a backup, or delete it if this broker's log should be judged by its "
        "bytes alone (it then shares only epoch 0 with its master)"
    )
    text = data.decode("ascii", "replace")
    body, sep, trailer = text.rstrip("\n").rpartition("\n")
    if not sep or not trailer.startswith("crc ") or not body.startswith(_HEADER):
        raise EpochFileCorrupt(f"epoch file {path} is not a tidemq epoch file (no header or "
                               f"no crc line); {fix}")
    expected = trailer[4:].strip()
    actual = f"{zlib.crc32((body + chr(10)).encode('ascii', 'replace')):08x}"
    if expected != actual:
        raise EpochFileCorrupt(f"epoch file {path} fails its CRC (stored {expected}, computed "
                               f"{actual}); {fix}")
    entries: list[EpochEntry] = []
    for number, line in enumerate(body.split("\n")[1:], start=2):
        fields = line.split()
        if len(fields) != 2 or not all(field.isdigit() for field in fields):
            raise EpochFileCorrupt(f"epoch file {path} line {number}: {line!r} is not "
                                   f"'<epoch> <startOffset>'; {fix}")
        entry = EpochEntry(int(fields[0]), int(fields[1]))
        if entries and (entry.epoch <= entries[-1].epoch
                        or entry.start_offset < entries[-1].start_offset):
            raise EpochFileCorrupt(f"epoch file {path} line {number}: epoch {entry.epoch} at "
                                   f"{entry.start_offset} does not follow epoch "
                                   f"{entries[-1].epoch} at {entries[-1].start_offset}; {fix}")
        entries.append(entry)
        if len(entries) > ENTRIES_MAX:
            raise EpochFileCorrupt(f"epoch file {path} holds more than {ENTRIES_MAX} entries; "
                                   f"{fix}")
    return entries

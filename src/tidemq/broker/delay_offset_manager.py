"""Delay offsets: how far the delay scheduler got in each level, kept in delayOffset.json.

File shape (docs/protocol.md §10.6), plus one field of tidemq's::

    {"offsetTable":{"1":0,"2":5,"3":12},"tailScanPhysicalOffset":1048576}

- ``offsetTable``: delay level -> the next queue offset to deliver in queue ``level - 1``
  of SCHEDULE_TOPIC_XXXX (RocketMQ's DelayOffsetSerializeWrapper). A level missing from the
  table has delivered nothing yet (offset 0). GET_ALL_DELAY_OFFSET answers with this field
  only, so admin tools see RocketMQ's shape.
- ``tailScanPhysicalOffset``: the end of the commit log at the moment the offsets were
  snapshotted. Every delivery stored below it is counted in ``offsetTable``; deliveries made
  after the snapshot are found again by scanning the commit log from here (see
  schedule_service.py). RocketMQ's loader skips the unknown field; a file without it (one
  written by RocketMQ) means "scan nothing".

The scheduler changes offsets on the event loop; ``snapshot`` is taken there, and
``write_snapshot`` may run in a worker thread with those bytes. The file is replaced
atomically with a ``.bak`` copy (config_file.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tidemq.protocol import jsonx
from tidemq.protocol.jsonx import JsonShapeError
from tidemq.store.config_file import ConfigFile
from tidemq.store.config_tables import DelayOffsetTable

TAIL_SCAN_FIELD = "tailScanPhysicalOffset"


@dataclass(frozen=True, slots=True)
class DelayOffsetSnapshot:
    """The file bytes to write, and the state they hold (to know when it is written)."""

    version: int
    tail_scan_physical_offset: int
    data: bytes


class DelayOffsetManager:
    """Next offset to deliver per delay level, with the commit-log position they cover.

    Args:
        path: the delayOffset.json file (need not exist yet).

    Raises:
        ConfigFileCorrupt: the file and its .bak are both unreadable.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file = ConfigFile(path)
        loaded = self._file.load_parsed(_parse)
        if loaded is None:
            self._table = DelayOffsetTable()
            self._loaded_tail_scan: int | None = None
        else:
            self._table, self._loaded_tail_scan = loaded
        self._persisted: tuple[int, int | None] = (
            self._table.data_version.counter,
            self._loaded_tail_scan,
        )

    @property
    def loaded_tail_scan_physical_offset(self) -> int | None:
        """Where a restart scans the commit log from; None when the file did not say."""
        return self._loaded_tail_scan

    def offset(self, level: int) -> int:
        """The next queue offset to deliver in ``level``'s queue (0 when never advanced)."""
        found = self._table.query(level)
        return 0 if found is None else found

    def commit(self, level: int, offset: int) -> None:
        """Record ``level``'s next queue offset to deliver (levels count from 1)."""
        self._table.commit(level, offset)

    def advance_to(self, level: int, offset: int) -> bool:
        """Move ``level`` forward to ``offset`` unless it is already there or past it.

        Returns:
            True when the offset moved.
        """
        if offset <= self.offset(level):
            return False
        self._table.commit(level, offset)
        return True

    def replace(self, table: DelayOffsetTable) -> bool:
        """Take ``table``'s offsets instead of ours (a slave copying its master's); True when
        any offset changed."""
        if table.to_json_object() == self._table.to_json_object():
            return False
        version = self._table.data_version.counter + 1
        self._table = DelayOffsetTable(
            {level: table.query(level) or 0 for level in table.levels()})
        self._table.data_version.counter = version
        return True

    def offsets(self) -> dict[int, int]:
        """level -> next offset, for every level that ever advanced."""
        return {level: self.offset(level) for level in self._table.levels()}

    def to_json(self) -> bytes:
        """RocketMQ's table as compact JSON: the GET_ALL_DELAY_OFFSET body."""
        return self._table.to_json()

    def snapshot(self, tail_scan_physical_offset: int) -> DelayOffsetSnapshot | None:
        """The file bytes to write now, or None when neither offsets nor position changed.

        Args:
            tail_scan_physical_offset: the commit log's end now; the caller takes it on the
                same thread, with no delivery in between, as the offsets.
        """
        version = self._table.data_version.counter
        if self._persisted == (version, tail_scan_physical_offset):
            return None
        obj = self._table.to_json_object()
        obj[TAIL_SCAN_FIELD] = tail_scan_physical_offset
        return DelayOffsetSnapshot(version, tail_scan_physical_offset,
                                   jsonx.dumps(obj, pretty=True))

    def write_snapshot(self, snapshot: DelayOffsetSnapshot) -> None:
        """Write a snapshot atomically (may run in a worker thread).

        Raises:
            StoreFull, StoreError: the write failed; the next snapshot tries again.
        """
        if self._file.save(snapshot.data, version=snapshot.version):  # skips an older one
            self._persisted = (snapshot.version, snapshot.tail_scan_physical_offset)

    def persist(self, tail_scan_physical_offset: int) -> None:
        """Write the file now (on the calling thread) if anything changed."""
        snapshot = self.snapshot(tail_scan_physical_offset)
        if snapshot is not None:
            self.write_snapshot(snapshot)


def _parse(data: bytes) -> tuple[DelayOffsetTable, int | None]:
    obj: Any = jsonx.loads(data)
    table = DelayOffsetTable.from_json_object(obj)
    tail_scan = obj.get(TAIL_SCAN_FIELD) if isinstance(obj, dict) else None
    if tail_scan is not None and (
        not isinstance(tail_scan, int) or isinstance(tail_scan, bool) or tail_scan < 0
    ):
        raise JsonShapeError(
            f"{TAIL_SCAN_FIELD} is {tail_scan!r}, expected a commit-log offset (an integer >= 0)"
        )
    return table, tail_scan

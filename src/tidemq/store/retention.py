"""Retention: which commit-log segments to delete, and when (RocketMQ's CleanCommitLogService).

A segment is *expired* when its last modification is more than ``file_reserved_time_hours``
old. Expired segments are deleted
- during the hours named by ``delete_when`` ("04", "04;16": quiet hours), or
- at any hour while the store's volume is fuller than ``disk_max_used_space_ratio`` percent.
Above ``disk_space_clean_forcibly_ratio`` percent the oldest segments go even before they
expire, since a full disk would stop every write (unless ``clean_file_forcibly_enable`` is
false). Above ``disk_space_warning_level_ratio`` writes stop (disk_space.py).

Only a prefix of the log is ever deleted (the log stays contiguous), never the segment being
written, and at most ``DELETE_FILES_BATCH_MAX`` segments per run so one run does not stall the
disk; the broker runs retention periodically (RocketMQ: every 10 s).
After the commit log, the derived files follow: consume-queue segments and index files
wholly below the new commit-log minimum are deleted and each queue's min offset moves up.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tidemq.store.config import StoreConfig
from tidemq.store.disk_space import DiskUsage, used_percent
from tidemq.store.mapped_file import MappedFile

# RocketMQ's DELETE_FILES_BATCH_MAX: bounds the I/O of one retention run.
DELETE_FILES_BATCH_MAX = 10

_HOUR_MS = 3_600_000


@dataclass(slots=True, frozen=True)
class RetentionPolicy:
    """The retention settings of a store, and the decision they imply."""

    reserved_ms: int
    delete_hours: frozenset[int]
    disk_max_used_space_ratio: float
    disk_space_clean_forcibly_ratio: float
    clean_file_forcibly_enable: bool = True

    @classmethod
    def from_config(cls, config: StoreConfig) -> RetentionPolicy:
        """The policy ``config`` describes."""
        return cls(
            reserved_ms=config.file_reserved_time_hours * _HOUR_MS,
            delete_hours=config.delete_hours(),
            disk_max_used_space_ratio=config.disk_max_used_space_ratio,
            disk_space_clean_forcibly_ratio=config.disk_space_clean_forcibly_ratio,
            clean_file_forcibly_enable=config.clean_file_forcibly_enable,
        )

    def segments_to_delete(
        self, segments: Sequence[MappedFile], now_ms: int, disk_used_ratio: float
    ) -> int:
        """How many of the oldest ``segments`` to delete now.

        Args:
            segments: the commit log's segments, oldest first (the last is never deleted).
            now_ms: the current time.
            disk_used_ratio: percent of the volume in use.
        """
        in_delete_hour = time.localtime(now_ms / 1000).tm_hour in self.delete_hours
        space_short = disk_used_ratio > self.disk_max_used_space_ratio
        forced = (
            self.clean_file_forcibly_enable
            and disk_used_ratio > self.disk_space_clean_forcibly_ratio
        )
        if not (in_delete_hour or space_short or forced):
            return 0
        expire_before_ms = now_ms - self.reserved_ms
        count = 0
        for segment in segments[:-1]:
            if count >= DELETE_FILES_BATCH_MAX:
                break
            if not forced and last_modified_ms(segment) > expire_before_ms:
                break
            count += 1
        return count


def last_modified_ms(segment: MappedFile) -> int:
    """When the segment was last written (the file's mtime; the last write in memory)."""
    if segment.path is None:
        return segment.last_modified_ms
    try:
        return int(os.stat(segment.path).st_mtime * 1000)
    except OSError:
        return segment.last_modified_ms


def disk_used_ratio(path: str) -> float:
    """Percent of the volume holding ``path`` that is in use (``disk_space.used_percent``:
    as ``df`` and RocketMQ count it)."""
    usage = shutil.disk_usage(path)
    return used_percent(DiskUsage(usage.total, usage.used, usage.free))

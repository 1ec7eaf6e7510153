"""DiskSpaceGuard: stop taking writes before the store's volume is full, resume when it is not.

Three ratios of the volume holding the store (percent in use) decide what happens as it
fills, after RocketMQ's MessageStoreConfig and CleanCommitLogService:

- above ``diskMaxUsedSpaceRatio`` (75) retention deletes *expired* commit-log segments at any
  hour, not only at ``deleteWhen`` (retention.py);
- above ``diskSpaceCleanForciblyRatio`` (85) it deletes the oldest segments even before they
  expire, unless ``cleanFileForciblyEnable`` is false (retention.py);
- above ``diskSpaceWarningLevelRatio`` (90) the store refuses every write with
  SERVICE_NOT_AVAILABLE and a remark naming the store path and its usage (this module). Reads
  go on. The guard looks again at most every ``CHECK_INTERVAL_S``, so writes resume by
  themselves within that once space is freed.

The guard is policy; the mechanism that keeps a full disk from killing the broker is that
every file's space is reserved before it is written (mapped_file.py): a reservation that
fails raises ``StoreFull``, the append is refused and the guard is told (``note_full``), so
the next writes are refused at once instead of each trying again.

Threads: ``refusal`` runs on appending threads, ``note_full`` under the append lock; both
only swap immutable values, so a reader sees an old or a new verdict, never a mix.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from typing import NamedTuple

logger = logging.getLogger(__name__)

# RocketMQ checks the disk every 10 s (CleanCommitLogService); a tenth of a second keeps the
# cost to one statvfs per 100 ms under any load and lets writes resume promptly.
CHECK_INTERVAL_S = 0.1

_MIB = 1024 * 1024


class DiskUsage(NamedTuple):
    """What ``shutil.disk_usage`` returns (bytes)."""

    total: int
    used: int
    free: int


def used_percent(usage: DiskUsage) -> float:
    """Percent of the volume in use, as ``df`` and RocketMQ count it: used bytes over used
    plus available ones, rounded up to a whole percent.

    Not ``(total - free) / total``: ``free`` is what an unprivileged process may still use,
    so blocks the file system keeps back (ext4 reserves 5 % for root; some volumes far more)
    would count as used, and retention would delete segments of a volume ``df`` shows as
    a third full. RocketMQ's ``getDiskPartitionSpaceUsedPercent`` is ``used / (used +
    usable)``, rounded up (docs/protocol.md, store retention).
    """
    entire = usage.used + usage.free
    if entire <= 0:
        return 0.0
    return float(-(-usage.used * 100 // entire))


class DiskSpaceGuard:
    """Says whether the store under ``path`` may take writes now.

    Args:
        path: the store's root directory (its volume is the one measured).
        warning_ratio: ``diskSpaceWarningLevelRatio``, percent in use above which writes stop.
        usage: measures the volume (``shutil.disk_usage``; tests pass a fake).
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        path: str,
        warning_ratio: float,
        *,
        usage: Callable[[str], DiskUsage] = shutil.disk_usage,  # type: ignore[assignment]
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.warning_ratio = warning_ratio
        self._usage = usage
        self._clock = clock
        self._next_check = 0.0
        self._refusal: str | None = None

    def refusal(self) -> str | None:
        """Why writes are refused now (a remark for the client), or None when they may go.

        Measures the volume at most every ``CHECK_INTERVAL_S``; in between it answers the
        last verdict (a clock read and a comparison).
        """
        now = self._clock()
        if now < self._next_check:
            return self._refusal
        self._next_check = now + CHECK_INTERVAL_S
        try:
            usage = self._usage(self.path)
        except OSError as e:
            # The volume cannot be measured: refusing every write would be a guess; the
            # reservations still stop a write that has no room.
            logger.warning("cannot measure the volume of %s: %s", self.path, e)
            self._refusal = None
            return None
        ratio = used_percent(usage)
        if ratio > self.warning_ratio:
            self._refusal = (
                f"disk full: the store {self.path} is on a volume {ratio:.1f}% used "
                f"({usage.free / _MIB:.1f} MiB free of {usage.total / _MIB:.1f} MiB), above "
                f"diskSpaceWarningLevelRatio={self.warning_ratio:g}; writes resume by "
                "themselves once it drops below (free disk space; retention deletes expired "
                "segments above diskMaxUsedSpaceRatio)"
            )
        else:
            self._refusal = None
        return self._refusal

    def note_full(self, detail: str) -> str:
        """A reservation failed for lack of space: refuse writes until the next measure says
        otherwise; return the remark to answer with."""
        remark = f"disk full: {detail}"
        self._refusal = remark
        self._next_check = self._clock() + CHECK_INTERVAL_S
        return remark

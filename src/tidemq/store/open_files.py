"""The broker process's open-file budget: raise the soft limit, say when it is too low.

Every mapped file holds one file descriptor while it is mapped (CPython's ``mmap`` keeps a
duplicate of the descriptor it was made from): each consume-queue file, each commit-log
segment and each index file, besides one per client connection. Under the soft limit many
systems start processes with (1,024), a broker with a thousand busy queues runs out, and
the next queue file cannot be created ("Too many open files").

So, as RocketMQ's start scripts do with ``ulimit -n``, the broker raises its soft limit to
the hard limit when it starts (``raise_open_file_limit``), and warns with the numbers when
even that leaves less room than its queues need (``open_file_shortage``). A descriptor
shortage met later is reported by ``describe_open_file_error`` in words an operator can act
on, never as a bare errno.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
from dataclasses import dataclass

log = logging.getLogger("tidemq.store")

# Descriptors a broker needs besides its mapped files: client and name-server connections,
# config files being saved, the store lock, logs. RocketMQ's guidance for busy brokers is a
# limit of 655,350; this is only the floor below which a warning is due.
DESCRIPTORS_FOR_CONNECTIONS = 1024


@dataclass(frozen=True, slots=True)
class OpenFileLimit:
    """The process's RLIMIT_NOFILE before and after ``raise_open_file_limit``."""

    soft_before: int
    soft: int
    hard: int

    @property
    def raised(self) -> bool:
        """True when the soft limit was raised."""
        return self.soft > self.soft_before


def _show(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)


def raise_open_file_limit() -> OpenFileLimit:
    """Raise the soft open-file limit to the hard limit (an unprivileged process may).

    Returns:
        The limits before and after. When the raise is refused (a container may forbid it),
        the soft limit stays and a WARNING says so; nothing raises.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return OpenFileLimit(soft, soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open-file soft limit from %s to the hard limit %s: "
                    "%s; raise it before starting the broker (ulimit -n %s)",
                    _show(soft), _show(hard), exc, _show(hard))
        return OpenFileLimit(soft, soft, hard)
    log.info("raised the open-file soft limit from %s to the hard limit %s",
             _show(soft), _show(hard))
    return OpenFileLimit(soft, hard, hard)


def open_file_shortage(limit: OpenFileLimit, descriptors_in_use: int) -> str | None:
    """A warning when ``limit`` leaves less room than the ``descriptors_in_use`` (the opened
    store's mapped files, mostly) plus ``DESCRIPTORS_FOR_CONNECTIONS`` need; None when it
    is enough."""
    if limit.soft == resource.RLIM_INFINITY:
        return None
    needed = descriptors_in_use + DESCRIPTORS_FOR_CONNECTIONS
    if limit.soft >= needed:
        return None
    return (
        f"the open-file limit is {limit.soft} (hard limit {_show(limit.hard)}): the opened "
        f"store already holds {descriptors_in_use} descriptors (one per consume-queue file, "
        f"commit-log segment and index file) and {DESCRIPTORS_FOR_CONNECTIONS} are kept for "
        f"connections, so new queues will soon fail with 'too many open files'. Raise the "
        f"hard limit (ulimit -Hn, LimitNOFILE= in a systemd unit, --ulimit nofile= for a "
        f"container) to at least {needed * 2} and restart the broker"
    )


def is_open_file_shortage(exc: BaseException) -> bool:
    """True for the errors of a process (EMFILE) or system (ENFILE) out of descriptors."""
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


def describe_open_file_error(what: str, exc: OSError) -> str:
    """``what`` failed for want of file descriptors: the limits, and how to raise them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    scope = "system-wide file table is full" if exc.errno == errno.ENFILE else (
        f"the broker has used all {_show(soft)} file descriptors its open-file limit allows")
    return (
        f"{what}: too many open files ({scope}; hard limit {_show(hard)}). Each consume-queue "
        f"file and commit-log segment holds one descriptor: raise the limit (ulimit -n, "
        f"LimitNOFILE=) and restart the broker, or use fewer queues"
    )


def count_open_descriptors() -> int | None:
    """Descriptors this process has open now (Linux /proc), None where unknown."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None

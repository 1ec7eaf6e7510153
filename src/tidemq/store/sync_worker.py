"""The sync worker process: fdatasyncs for a SYNC_FLUSH store, under its own GIL.

Run as a program (``SyncWorker`` in worker_group_commit.py starts it with
``sys.executable -I <this file>``; it imports only the standard library, so it starts in
milliseconds and holds no copy of the broker). The broker's appender writes, right after
its bytes are in the segment, one line per sync request to the worker's stdin::

    <token> <path>[\\t<path>...]\\n

Tokens grow by one per command. The worker reads every command waiting in the pipe, syncs
each named file once with ``fdatasync`` (the page cache is per inode: a sync through the
worker's own descriptor writes the pages the broker wrote through its mapping), and then
answers on stdout with one line for all of them::

    OK <last token> <seconds>\\n
    ERR <last token> <seconds> <path>\\t<error>[\\t<path>\\t<error>...]\\n   (those failed; the
                                                 other files of the batch were synced)

Every command up to the last token is covered by that sync: its bytes were written before
it was sent, and the sync started after it was read. The worker keeps the last file it
synced open between batches (normally the segment being written), reopening it when the
name now holds another file. It ends at EOF on stdin and ignores SIGINT and SIGTERM.

Test hook: with ``TIDEMQ_SYNC_WORKER_HOLD=<path>`` in its environment the worker waits
before each batch's syncs until ``<path>`` exists (a test proves that no answer comes before
the sync has run); with ``TIDEMQ_SYNC_WORKER_FAIL=<path>`` every sync fails with EIO while
``<path>`` exists (a test of a failing disk).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import time

HOLD_ENV = "TIDEMQ_SYNC_WORKER_HOLD"
FAIL_ENV = "TIDEMQ_SYNC_WORKER_FAIL"
_READ_SIZE = 1 << 16


def _fdatasync(fd: int, fail: str | None) -> None:
    if fail is not None and os.path.exists(fail):
        raise OSError(errno.EIO, f"Input/output error (test hook {FAIL_ENV})")
    getattr(os, "fdatasync", os.fsync)(fd)


def _same_file(path: str, fd: int) -> bool:
    # The kept descriptor is still the file at ``path``: a segment cut away and made again
    # under its name (a truncation, a role switch) is another inode, and syncing the old one
    # would answer OK for bytes that are not on disk. Two stats per batch, against a sync.
    try:
        named, kept = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (named.st_ino, named.st_dev) == (kept.st_ino, kept.st_dev)


def _wait_for_release(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.001)


def serve(commands: int, answers: int, hold: str | None = None,
          fail: str | None = None) -> None:
    """Answer commands read from fd ``commands`` on fd ``answers`` until EOF."""
    buffered = b""
    kept_path: str | None = None
    kept_fd = -1
    while True:
        chunk = os.read(commands, _READ_SIZE)
        if not chunk:
            break
        buffered += chunk
        end = buffered.rfind(b"\n")
        if end < 0:
            continue
        lines, buffered = buffered[:end].split(b"\n"), buffered[end + 1:]
        paths: list[str] = []
        last_token = b""
        for line in lines:
            token, _, named = line.partition(b" ")
            last_token = token
            for path in named.decode().split("\t"):
                if path and path not in paths:
                    paths.append(path)
        if hold is not None:
            _wait_for_release(hold)
        failures: list[str] = []
        started = time.perf_counter()
        for path in paths:
            try:
                if path != kept_path or not _same_file(path, kept_fd):
                    if kept_fd >= 0:
                        os.close(kept_fd)
                    kept_fd, kept_path = -1, None
                    kept_fd = os.open(path, os.O_RDWR)
                    kept_path = path
                _fdatasync(kept_fd, fail)
            except OSError as e:
                if kept_fd >= 0:
                    os.close(kept_fd)
                kept_fd, kept_path = -1, None
                failures.append(f"{path}\t{e}".replace("\n", " "))
        # <seconds>: how long the batch's syncs took (the broker's flush-latency metric).
        took = f" {time.perf_counter() - started:.6f}".encode()
        if failures:
            os.write(answers, b"ERR " + last_token + took + b" "
                     + "\t".join(failures).encode() + b"\n")
        else:
            os.write(answers, b"OK " + last_token + took + b"\n")
    if kept_fd >= 0:
        os.close(kept_fd)


if __name__ == "__main__":
    # The worker ends when its broker closes the pipe (stop, or the broker's death), not on
    # the terminal's Ctrl-C or a service manager's SIGTERM to the whole process group
    # (systemd's default), which reach it before the broker has answered what it has in
    # flight: the broker would log the worker as gone at every stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
        serve(sys.stdin.fileno(), sys.stdout.fileno(), os.environ.get(HOLD_ENV),
              os.environ.get(FAIL_ENV))

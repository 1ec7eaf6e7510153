"""Waiting for a server process to go idle before a timed run (Linux /proc).

A tidemq broker keeps working after a run: it warms the next commit-log segment (on a fresh
virtual machine about two seconds of one core per GiB, the first touch of each page) and
flushes. A run started at once would pay for the one before, or for the start-up, so the
harnesses start each timed run once the server has been quiet for a moment.
"""

from __future__ import annotations

import os
import time

IDLE_CPU_SHARE = 0.1  # quiet: under this share of one core...
IDLE_SAMPLE_S = 0.5  # ...for two intervals this long...
IDLE_WAIT_BOUND_S = 60.0  # ...waiting at most this long.


def process_cpu_s(pid: int, *, thread: int | None = None) -> float:
    """User + system CPU seconds of process ``pid`` (or of its thread ``thread``) so far
    (0.0 when /proc lacks it)."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        with open(path) as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_process_idle(pid: int | None, bound_s: float = IDLE_WAIT_BOUND_S) -> None:
    """Return once process ``pid`` has used under IDLE_CPU_SHARE of a core for two
    IDLE_SAMPLE_S intervals in a row, or after ``bound_s`` (None: at once)."""
    if pid is None:
        return
    deadline = time.monotonic() + bound_s
    quiet = 0
    last = process_cpu_s(pid)
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(IDLE_SAMPLE_S)
        now = process_cpu_s(pid)
        quiet = quiet + 1 if now - last < IDLE_CPU_SHARE * IDLE_SAMPLE_S else 0
        last = now


def main_thread_sched_s(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of process ``pid``'s main
    thread so far, from /proc/<pid>/schedstat; (0.0, 0.0) when the kernel lacks it.

    The second figure is what the machine, not the code, adds to a latency: a thread that
    was ready to run and waited for a core because other processes held both."""
    try:
        with open(f"/proc/{pid}/schedstat") as stat:
            on_cpu_ns, waiting_ns, _ = stat.read().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(on_cpu_ns) / 1e9, int(waiting_ns) / 1e9

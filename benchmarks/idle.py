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


def process_counts(pid: int) -> tuple[int, int, int]:
    """(main-thread wake-ups, read system calls, write system calls) of process ``pid`` so
    far; zeros when /proc lacks them.

    Wake-ups are the main thread's voluntary context switches (each a sleep ended by an
    event or a timer); reads and writes are /proc/<pid>/io's syscr and syscw, every thread
    (read, readv, recv... and write, writev, pwrite, send...; epoll waits are not in them)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            wake_ups = next(int(line.split(":", 1)[1]) for line in status
                            if line.startswith("voluntary_ctxt_switches"))
        with open(f"/proc/{pid}/io") as io:
            fields = dict(line.split(":", 1) for line in io if ":" in line)
        return wake_ups, int(fields["syscr"]), int(fields["syscw"])
    except (OSError, KeyError, ValueError, StopIteration):
        return 0, 0, 0


def thread_table(pid: int) -> dict[int, tuple[str, float, int, int]]:
    """Every thread of process ``pid`` now: {thread id: (name, CPU seconds, voluntary
    context switches, involuntary ones)} from /proc/<pid>/task (empty when /proc lacks it).

    Voluntary switches count how often a thread went to sleep (each one a wake-up later);
    involuntary ones how often the scheduler took its core away."""
    table: dict[int, tuple[str, float, int, int]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return table
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/stat") as stat:
                head, tail = stat.read().rsplit(")", 1)
            with open(f"/proc/{pid}/task/{thread}/status") as status:
                lines = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue  # the thread ended meanwhile
        fields = tail.split()
        # Python 3.11 does not give its threads a kernel name: tell the main one apart.
        name = head.split("(", 1)[1] + (" (main)" if int(thread) == pid else "")
        table[int(thread)] = (name, (int(fields[11]) + int(fields[12])) / tick,
                              int(lines["voluntary_ctxt_switches"]),
                              int(lines["nonvoluntary_ctxt_switches"]))
    return table


def thread_costs(before: dict, after: dict,
                 seconds: float) -> list[tuple[str, float, float, float]]:
    """Per thread alive at the end: (name, CPU share of a core, voluntary and involuntary
    context switches per second) between two ``thread_table`` snapshots ``seconds`` apart,
    busiest first."""
    rows = []
    for thread, (name, cpu_s, voluntary, involuntary) in after.items():
        _, cpu_then, voluntary_then, involuntary_then = before.get(thread, (name, 0.0, 0, 0))
        rows.append((name, (cpu_s - cpu_then) / seconds, (voluntary - voluntary_then) / seconds,
                     (involuntary - involuntary_then) / seconds))
    rows.sort(key=lambda row: (-row[1], -row[2]))
    return rows

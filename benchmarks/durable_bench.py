"""Durable throughput (issue 18): SYNC_FLUSH beside ASYNC_FLUSH batch produce, A/B by source.

    .venv/bin/python benchmarks/durable_bench.py [--runs 3] [--messages 200000]
        [--size 1024] [--src B=/path/to/other/src ...] [--json]

Each run starts, for every source tree (``A`` is this checkout; ``--src NAME=DIR`` adds
another, e.g. ``git archive <commit> src | tar -x -C /tmp/before`` then
``--src before=/tmp/before/src``; ``--no-checkout`` leaves this checkout out), a fresh
``tidemq dev`` with ASYNC_FLUSH and one with SYNC_FLUSH, in turn, and measures batch produce
on each (64 x 1 KiB per request, 16 requests
in flight, ``tidemq bench`` in its own process, started once the broker is idle). The order
of the servers rotates from run to run, so a neighbour's burst of load does not always land
on the same side. Printed per source: the median msg/s and broker CPU µs per message of
each flush type and the two ratios the issue asks for, SYNC over ASYNC in msg/s (same run)
and in messages per broker CPU second (the steadier figure on a shared machine), with the
load average at the start and the end.

``--helpers-fifo PRIO`` (run the harness under ``chrt -f`` with a lower priority): each
broker's threads other than its event loop (the group commit, the flushers, the segment
allocator) get SCHED_FIFO ``PRIO``. Under ``chrt -f`` alone they share the loop's priority,
and FIFO threads of one priority never preempt each other, so the group commit waits for a
core until the loop or the client blocks, which no quiet machine does to it (CFS runs a
thread that slept at once): SYNC_FLUSH only is penalised. These threads block between
short bursts of work, so a higher FIFO priority cannot starve anyone. The broker's child
processes (the SYNC_FLUSH sync worker, store/sync_worker.py) are helpers too: all their
threads get ``PRIO``, and their CPU is counted in the broker's (``worker`` beside it: the
children's share of it, over the calibration and measured messages).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from broker_bench import CALIBRATION_MESSAGES, DevServer, produce_with_cpu
from idle import process_cpu_s
from latency_bench import load_average
from store_bench import machine_description

FLUSH_TYPES = ("ASYNC_FLUSH", "SYNC_FLUSH")


def child_pids(pid: int) -> list[int]:
    """The processes that process ``pid`` started (its threads' children)."""
    children: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as listed:
            children.extend(int(child) for child in listed.read().split())
    return children


def raise_helpers(pid: int, priority: int) -> None:
    """SCHED_FIFO ``priority`` for every thread of process ``pid`` but its main one, and
    for every thread of its child processes."""
    tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid]
    for child in child_pids(pid):
        with contextlib.suppress(OSError):
            tids.extend(int(tid) for tid in os.listdir(f"/proc/{child}/task"))
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that just ended
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(priority))


def measure(work_dir: str, src: str | None, flush: str, messages: int, size: int,
            helpers_fifo: int = 0) -> dict:
    """One batch-produce run against a fresh ``tidemq dev`` of source ``src`` (None: this
    checkout) with ``flush``: msg/s and broker CPU µs per message."""
    previous = os.environ.get("PYTHONPATH")
    if src is not None:
        os.environ["PYTHONPATH"] = src
    try:
        server = DevServer(work_dir, extra_args=["--flushDiskType", flush])
    finally:
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous
    if helpers_fifo:
        raise_helpers(server.process.pid, helpers_fifo)
    children = child_pids(server.process.pid)
    try:
        before = sum(process_cpu_s(child) for child in children)
        summary = produce_with_cpu(server, "Durable", messages, "-s", str(size), "-b", "64",
                                   "-c", "16")
        worker_s = sum(process_cpu_s(child) for child in children) - before
    finally:
        server.stop()
    worker_us = worker_s / (messages + CALIBRATION_MESSAGES) * 1e6
    return {"msgs_per_s": summary["msgs_per_s"],
            "broker_cpu_us": summary["broker_cpu_us_per_msg"] + worker_us,
            "worker_cpu_us": worker_us}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--src", action="append", default=[],
                        help="NAME=DIR: also measure the source tree DIR (its src/ folder)")
    parser.add_argument("--no-checkout", action="store_true",
                        help="measure only the --src trees, not this checkout")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--helpers-fifo", type=int, default=0, metavar="PRIO",
                        help="SCHED_FIFO PRIO for the broker's threads but its loop "
                             "(module docstring; run under chrt -f with a lower one)")
    args = parser.parse_args()
    sources: list[tuple[str, str | None]] = [] if args.no_checkout else [("A", None)]
    for item in args.src:
        name, _, path = item.partition("=")
        sources.append((name, os.path.abspath(path)))
    os.makedirs(args.dir, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    cells = [(name, src, flush) for name, src in sources for flush in FLUSH_TYPES]
    runs: list[dict[str, dict]] = []
    for run in range(args.runs):
        shift = run % len(cells)
        figures: dict[str, dict] = {}
        for name, src, flush in cells[shift:] + cells[:shift]:
            work_dir = tempfile.mkdtemp(prefix="durable-", dir=args.dir)
            try:
                figures[f"{name} {flush}"] = measure(work_dir, src, flush, args.messages,
                                                     args.size, args.helpers_fifo)
            finally:
                shutil.rmtree(work_dir, ignore_errors=True)
            if not args.json:
                got = figures[f"{name} {flush}"]
                print(f"run {run + 1} {name} {flush}: {got['msgs_per_s']:,.0f} msg/s, "
                      f"broker {got['broker_cpu_us']:.1f} us/msg (worker "
                      f"{got['worker_cpu_us']:.1f})", flush=True)
        for name, _ in sources:
            sync, asynchronous = figures[f"{name} SYNC_FLUSH"], figures[f"{name} ASYNC_FLUSH"]
            figures[f"{name} ratio"] = {
                "msgs_per_s": sync["msgs_per_s"] / asynchronous["msgs_per_s"],
                "per_cpu": asynchronous["broker_cpu_us"] / sync["broker_cpu_us"],
            }
        runs.append(figures)
    load_after = load_average()
    if args.json:
        print(json.dumps({"started": started, "machine": machine_description(),
                          "load_average": [load_before, load_after], "runs": runs}))
        return 0
    print(f"\n{started}, {machine_description()}; load average {load_before} -> {load_after}")
    print(f"{args.messages} x {args.size} B, batches of 64, 16 in flight; median of "
          f"{args.runs} (runs)")
    for name, _ in sources:
        for flush in FLUSH_TYPES:
            rates = [r[f"{name} {flush}"]["msgs_per_s"] for r in runs]
            cpus = [r[f"{name} {flush}"]["broker_cpu_us"] for r in runs]
            print(f"{name} {flush}: {statistics.median(rates):,.0f} msg/s "
                  f"({'; '.join(f'{x:,.0f}' for x in rates)}), broker "
                  f"{statistics.median(cpus):.1f} us/msg ({'; '.join(f'{x:.1f}' for x in cpus)})")
        ratios = [r[f"{name} ratio"]["msgs_per_s"] for r in runs]
        per_cpu = [r[f"{name} ratio"]["per_cpu"] for r in runs]
        print(f"{name} SYNC/ASYNC: {statistics.median(ratios):.2f} in msg/s "
              f"({'; '.join(f'{x:.2f}' for x in ratios)}), {statistics.median(per_cpu):.2f} "
              f"per broker CPU ({'; '.join(f'{x:.2f}' for x in per_cpu)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

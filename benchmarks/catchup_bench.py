"""Slave catch-up (issue 11), A/B by source tree:

    .venv/bin/python benchmarks/catchup_bench.py [--runs 3] [--messages 200000] [--size 1024]
        [--src NAME=DIR ...] [--no-checkout] [--json]

Each run starts a name server and an ASYNC_MASTER (this checkout), fills it with
``--messages`` messages in batches of 64 (``tidemq bench``), waits until it is idle, then,
for every source tree in turn (``A`` is this checkout, ``--src NAME=DIR`` adds the tree whose
``src/`` is DIR; the order rotates from run to run), starts a slave of it from an empty
disk and measures, from the moment it is ready:

- ``copied``: until its commit log ends where the master's does (brokerStatus'
  commitLogMaxOffset; the bytes are on the slave, what a SYNC_MASTER waits for);
- ``readable``: until its dispatch is done too (dispatchBehindBytes 0; a slave without that
  key dispatches before it reads on, so for it readable is copied);
- the slave's CPU seconds until readable (/proc), the steadier figure on a shared machine.

Printed: MB/s of commit log for both, and MB per slave CPU second, median of the runs, with
the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from ha_bench import Server, bench, broker, runtime
from idle import process_cpu_s, wait_process_idle
from latency_bench import load_average
from store_bench import machine_description

WAIT_BOUND_S = 900


def start_slave(work_dir: str, name: str, namesrv: Server, src: str | None) -> Server:
    previous = os.environ.get("PYTHONPATH")
    if src is not None:
        os.environ["PYTHONPATH"] = src
    try:
        return broker(work_dir, name, namesrv, brokerRole="SLAVE", brokerId="1")
    finally:
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


def catch_up(work_dir: str, name: str, namesrv: Server, master: Server, src: str | None
             ) -> dict[str, float]:
    """One slave from an empty disk: seconds until copied and until readable, CPU seconds."""
    target = int(runtime(master.addr)["commitLogMaxOffset"])
    copied_bytes = target - int(runtime(master.addr)["commitLogMinOffset"])
    slave = start_slave(work_dir, name, namesrv, src)
    try:
        start = slave.ready_at
        cpu_before = process_cpu_s(slave.process.pid)
        deadline = time.monotonic() + WAIT_BOUND_S
        copied_at = None
        while True:
            table = runtime(slave.addr)
            now = time.monotonic()
            if copied_at is None and int(table["commitLogMaxOffset"]) >= target:
                copied_at = now
            if copied_at is not None and int(table.get("dispatchBehindBytes", "0")) == 0:
                break
            if now > deadline:
                raise RuntimeError(f"slave {name} did not catch up within {WAIT_BOUND_S} s")
            time.sleep(0.02)
        cpu = process_cpu_s(slave.process.pid) - cpu_before
    finally:
        slave.stop()
    mb = copied_bytes / 1e6
    return {"copied_mb_per_s": mb / (copied_at - start),
            "readable_mb_per_s": mb / (now - start),
            "mb_per_slave_cpu_s": mb / max(cpu, 1e-6), "mb": mb}


def one_run(args: argparse.Namespace, sources: list[tuple[str, str | None]], run: int
            ) -> dict[str, dict[str, float]]:
    work_dir = tempfile.mkdtemp(prefix="catchup-", dir=args.dir)
    servers: list[Server] = []
    try:
        namesrv = Server(work_dir, "namesrv", "namesrv", [])
        servers.append(namesrv)
        master = broker(work_dir, "master", namesrv, brokerRole="ASYNC_MASTER")
        servers.append(master)
        bench(namesrv, "produce", "-t", "CatchUp", "-s", str(args.size), "-b", "64", "-c",
              "16", "--count", str(args.messages))
        wait_process_idle(master.process.pid)
        shift = run % len(sources)
        figures = {}
        for index, (name, src) in enumerate(sources[shift:] + sources[:shift]):
            figures[name] = catch_up(work_dir, f"slave-{name}-{index}", namesrv, master, src)
            shutil.rmtree(os.path.join(work_dir, f"slave-{name}-{index}"), ignore_errors=True)
            wait_process_idle(master.process.pid)
        return figures
    finally:
        for server in reversed(servers):
            server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--src", action="append", default=[],
                        help="NAME=DIR: also measure a slave of the source tree DIR")
    parser.add_argument("--no-checkout", action="store_true",
                        help="measure only the --src trees' slaves, not this checkout's")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sources: list[tuple[str, str | None]] = [] if args.no_checkout else [("A", None)]
    for item in args.src:
        name, _, path = item.partition("=")
        sources.append((name, os.path.abspath(path)))
    os.makedirs(args.dir, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    runs = []
    for run in range(args.runs):
        runs.append(one_run(args, sources, run))
        if not args.json:
            for name, got in runs[-1].items():
                print(f"run {run + 1} {name}: " + ", ".join(f"{k} {v:,.1f}"
                                                           for k, v in got.items()), flush=True)
    load_after = load_average()
    if args.json:
        print(json.dumps({"started": started, "machine": machine_description(),
                          "load_average": [load_before, load_after], "runs": runs}))
        return 0
    print(f"\n{started}, {machine_description()}; load average {load_before} -> {load_after}")
    print(f"{args.messages} x {args.size} B; median of {args.runs} (runs)")
    for name, _ in sources:
        line = []
        for key in ("copied_mb_per_s", "readable_mb_per_s", "mb_per_slave_cpu_s"):
            values = [r[name][key] for r in runs]
            line.append(f"{key} {statistics.median(values):,.1f} "
                        f"({'; '.join(f'{v:,.1f}' for v in values)})")
        print(f"{name}: " + ", ".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())

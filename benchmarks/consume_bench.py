"""One PullConsumer process reading a backlog (issue 18, "Consume"), runnable by anyone:

    .venv/bin/python benchmarks/consume_bench.py [--runs 3] [--messages 300000]
        [--pull-batch-sizes 32,256] [--baseline-src DIR] [--fifo 5]

Starts its own ``tidemq dev`` (ASYNC_FLUSH, fresh store, free loopback ports, no console or
metrics), fills one topic with ``--messages`` x ``--size`` bytes (batches of 64), then runs
``tidemq bench consume --from first`` over the whole backlog ``--runs`` times for each
client variant, the variants taking turns within each run so that all see the same
neighbours. A variant is a pull batch size (``--pull-batch-sizes``; ``default`` is the
PullConsumer's own) with this checkout's client, and, with ``--baseline-src DIR`` (the
``src`` folder of another checkout, e.g. from ``git archive main src | tar -x -C /tmp/base``),
that client code with its own default pull batch size (``PYTHONPATH=DIR``; the broker is
always this checkout's), so one run gives an A/B.

For each variant it prints the median msg/s, the client's CPU µs per message (the
``cpu_s`` that ``tidemq bench consume --json`` reports for its measured window; a client too
old to report it is measured from ``RUSAGE_CHILDREN`` less a run of ``CALIBRATION_MESSAGES``
messages, so the interpreter's start-up is not counted) and the broker's (from
``/proc/<pid>/stat`` around the run): on a shared machine the CPU per message is the steadier
figure. The load average is printed at the start and the end.

``--fifo N`` runs the broker and the consumers under SCHED_FIFO priority N (root only; what
``chrt -f N`` does), to stand in for a quiet machine when neighbours load the cores; the
output says so. Keep such runs short: the backlog is filled before the priority is raised.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from broker_bench import TIDEMQ, DevServer, children_cpu_s
from idle import process_cpu_s, wait_process_idle
from store_bench import machine_description

CALIBRATION_MESSAGES = 256
DEFAULT = "default"  # the client's own pull_batch_size (older clients lack the option)
# No console or metrics; and the backlog must outlive the run: on this shared volume other
# work fills the disk past 85 % now and then, and retention then deleted the backlog's
# segments under the consumer (which waited for its --count until the harness timed out).
QUIET = ["--consolePort", "off", "--metricsExporterType", "DISABLE",
         "--diskMaxUsedSpaceRatio", "95", "--diskSpaceCleanForciblyRatio", "95"]


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def set_fifo(pid: int, priority: int) -> None:
    """Put every thread of ``pid`` under SCHED_FIFO ``priority`` (threads made later by them
    inherit it)."""
    for thread in os.listdir(f"/proc/{pid}/task"):
        os.sched_setscheduler(int(thread), os.SCHED_FIFO, os.sched_param(priority))


def consume(namesrv: str, topic: str, group: str, count: int, pull_batch_size: str,
            src: str | None, fifo: int | None = None) -> tuple[dict, float]:
    """One ``tidemq bench consume`` from the first offset; its summary and CPU seconds."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    batch = [] if pull_batch_size == DEFAULT else ["--pull-batch-size", pull_batch_size]
    before = children_cpu_s()
    out = subprocess.run(
        [TIDEMQ, "bench", "consume", "-n", namesrv, "-t", topic, "-g", group, "--from",
         "first", "--count", str(count), *batch, "--json"],
        capture_output=True, text=True, timeout=600, check=False, env=env,
        preexec_fn=None if fifo is None else (lambda: set_fifo(os.getpid(), fifo)),
    )
    cpu = children_cpu_s() - before
    if out.returncode != 0:
        raise RuntimeError(f"tidemq bench consume failed: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1]), cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--pull-batch-sizes", default=DEFAULT,
                        help="comma-separated pull batch sizes (or 'default'), each a variant")
    parser.add_argument("--baseline-src", help="src folder of the client to compare with")
    parser.add_argument("--dir", help="parent folder of the temporary store")
    parser.add_argument("--fifo", type=int, metavar="N",
                        help="run broker and consumers under SCHED_FIFO priority N (root)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [size.strip() for size in args.pull_batch_sizes.split(",")]
    variants: list[tuple[str, str, str | None]] = [(f"this b={size}", size, None)
                                                   for size in sizes]
    if args.baseline_src:
        variants.append((f"baseline b={DEFAULT}", DEFAULT, os.path.abspath(args.baseline_src)))
    load_start = load_average()
    if not args.json:
        print(f"machine: {machine_description()}")
        print(f"messages {args.messages} x {args.size} B, runs {args.runs}, "
              f"variants {[name for name, _, _ in variants]}, load average {load_start}")
        if args.fifo is not None:
            print(f"broker and consumers under SCHED_FIFO priority {args.fifo} (chrt -f)")
    work_dir = tempfile.mkdtemp(prefix="consume-bench-", dir=args.dir)
    server = DevServer(work_dir, QUIET)
    rates: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    cpus: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    broker_cpus: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    try:
        filled = subprocess.run([TIDEMQ, "bench", "produce", "-n", server.namesrv, "-t",
                                 "Backlog", "-s", str(args.size), "-b", "64", "-c", "16",
                                 "--count", str(args.messages), "--json"],
                                capture_output=True, text=True, timeout=900, check=True)
        produced = json.loads(filled.stdout.strip().splitlines()[-1])
        if produced["errors"]:
            # A short backlog would leave every consumer waiting for its --count until the
            # harness's timeout (seen at load 15: 19,455 of 600,000 sends failed).
            raise RuntimeError(f"filling the backlog: {produced['errors']} of {args.messages} "
                               f"sends failed ({produced['first_error']}); run again")
        broker_pid = server.process.pid
        wait_process_idle(broker_pid)
        if args.fifo is not None:
            set_fifo(broker_pid, args.fifo)
        group = 0
        for run in range(args.runs):
            # Each run starts with a different variant, so none always goes first.
            shift = run % len(variants)
            for name, size, src in variants[shift:] + variants[:shift]:
                group += 1
                broker_before = process_cpu_s(broker_pid)
                summary, cpu = consume(server.namesrv, "Backlog", f"BENCH_{group}",
                                       args.messages, size, src, args.fifo)
                broker_cpus[name].append((process_cpu_s(broker_pid) - broker_before)
                                         / summary["messages"] * 1e6)
                if summary.get("cpu_s") is not None:
                    cpus[name].append(summary["cpu_s"] / summary["messages"] * 1e6)
                else:  # an older client: less a short run's CPU (start-up)
                    calibration, calibration_cpu = consume(
                        server.namesrv, "Backlog", f"CAL_{group}", CALIBRATION_MESSAGES, size,
                        src, args.fifo)
                    extra = summary["messages"] - calibration["messages"]
                    cpus[name].append((cpu - calibration_cpu) / extra * 1e6)
                rates[name].append(summary["msgs_per_s"])
                if not args.json:
                    print(f"  run {run + 1} {name}: {summary['msgs_per_s']:,.0f} msg/s, "
                          f"client {cpus[name][-1]:.2f} us/msg, broker "
                          f"{broker_cpus[name][-1]:.2f} us/msg (load {load_average()})",
                          flush=True)
    finally:
        server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    result = {
        "load_average_start": load_start, "load_average_end": load_average(),
        "fifo": args.fifo,
        "variants": {name: {"msgs_per_s": rates[name], "client_cpu_us_per_msg": cpus[name],
                            "broker_cpu_us_per_msg": broker_cpus[name],
                            "median_msgs_per_s": statistics.median(rates[name]),
                            "median_client_cpu_us_per_msg": statistics.median(cpus[name]),
                            "median_broker_cpu_us_per_msg": statistics.median(
                                broker_cpus[name])}
                     for name, _, _ in variants},
    }
    if args.json:
        print(json.dumps(result))
        return 0
    for name, figures in result["variants"].items():
        print(f"{name}: median {figures['median_msgs_per_s']:,.0f} msg/s, client "
              f"{figures['median_client_cpu_us_per_msg']:.2f} us/msg, broker "
              f"{figures['median_broker_cpu_us_per_msg']:.2f} us/msg")
    print(f"load average at the end {result['load_average_end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

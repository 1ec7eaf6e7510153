"""The whole figure set in one command, as a regression guard for speed:

    .venv/bin/python benchmarks/figures.py [--runs 3] [--messages 200000] [--quick] [--json]

Each run starts a fresh ``tidemq dev`` with ASYNC_FLUSH and one with SYNC_FLUSH side by side
(free loopback ports, stores in a temporary directory), and measures against them, clients in
their own processes (``tidemq bench`` and ``latency_bench.py``), 1 KiB messages:

throughput (ASYNC_FLUSH)
  ``produce_batch`` (64 per request, 16 in flight), ``produce_single`` (64 in flight),
  ``consume_pull`` (one PullConsumer process reading the batch topic from its first offset);
many queues (ASYNC_FLUSH)
  ``queues_1024_vs_1``: batch produce to a new topic of 1024 queues over the same to a new
  topic of 1 queue (first messages to every queue included);
latency (``latency_bench.measure``: nanosecond stamps in the bodies)
  ``e2e_pull_2000`` / ``e2e_push_2000``: p99 and p999 at 2,000 msg/s offered by a producer
  with 16 sends in flight (paced by one timer, latency_bench's default since 5edfb5f; the
  tables before it paced by a sleep per message), PullConsumer (long polling, 100 ms
  polls) or PushConsumer;
  ``e2e_pull_20000``: p99 at 20,000 msg/s; ``e2e_pull_2000_sync``: p99 with SYNC_FLUSH;
durable
  ``sync_vs_async_batch``: SYNC_FLUSH batch produce over ASYNC_FLUSH batch produce of the
  same run, measured in alternation (ASYNC, SYNC, then SYNC, ASYNC; each broker idle while
  the other works), so a neighbour's burst or the host's speed, which moves by a factor of
  1.5 within a day, falls on both sides (``produce_batch`` and ``produce_batch_sync`` are the
  mean rates of the two rounds of each).

Next to some figures, the broker's (and the latency consumer's) CPU per message: the
steadier figure on a shared machine. The table gives the median over runs, every run's
figure, the target of issue 18 and whether it is met, and the load average at the start
and the end (the machine is shared: compare figures of one table, or tables of similar
load). It also prints the host's speed at the start (codec_bench's calibration, CPU µs; the
same code measured 1.4x slower at 5.8 than at 4.2): compare tables of similar calibration.
``--quick``: one run, fewer messages and shorter latency runs, for a check while working.

Diagnostics (they change nothing a row measures, nor the order of the steps): after the
table, the conditions each row's step started in, per run: the 1-minute load average, the
machine's dirty and under-writeback page cache and its free memory (MB) (figures measured
after heavy rounds meet the writeback and the page-cache state those rounds left); the host's
speed is measured again at the end. ``--host-check`` runs ``page_cache_bench.py`` (4 x 256
MiB) before everything and prints what a write into new page cache costs now (0.2 us/KiB
on a plain host, ~2.2 once a ballooned VM's backed memory is used up: throughput figures are
comparable only between tables whose host check reads alike); it is off by default because
it writes 1 GiB of page cache itself before the runs.
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

from broker_bench import DevServer, bench, calibration_us, produce_with_cpu
from idle import wait_process_idle
from latency_bench import load_average, measure
from store_bench import machine_description

# name -> (unit, target text, is the target met by this median?)
TARGETS: dict[str, tuple[str, str, object]] = {
    "produce_batch": ("msg/s", ">= 200,000", lambda v: v >= 200_000),
    "produce_batch_broker_cpu": ("us/msg", "", None),
    "produce_single": ("msg/s", "", None),
    "produce_single_broker_cpu": ("us/msg", "", None),
    "consume_pull": ("msg/s", ">= 300,000", lambda v: v >= 300_000),
    "queues_1024_vs_1": ("ratio", ">= 0.9", lambda v: v >= 0.9),
    "e2e_pull_2000_p99": ("ms", "<= 2", lambda v: v <= 2),
    "e2e_pull_2000_broker_cpu": ("us/msg", "", None),
    "e2e_pull_2000_consumer_cpu": ("us/msg", "", None),
    "e2e_pull_2000_p999": ("ms", "<= 5", lambda v: v <= 5),
    "e2e_push_2000_p99": ("ms", "<= 2", lambda v: v <= 2),
    "e2e_push_2000_p999": ("ms", "<= 5", lambda v: v <= 5),
    "e2e_pull_20000_p99": ("ms", "<= 5", lambda v: v <= 5),
    "e2e_pull_2000_sync_p99": ("ms", "<= 3", lambda v: v <= 3),
    "produce_batch_sync": ("msg/s", "", None),
    "produce_batch_sync_broker_cpu": ("us/msg", "", None),
    "sync_vs_async_batch": ("ratio", ">= 0.8", lambda v: v >= 0.8),
    # The same ratio in messages per broker CPU second: steadier on a shared machine.
    "sync_vs_async_batch_per_cpu": ("ratio", "", None),
}


# Conditions each step started in, by step name, for the run in progress (diagnostics only).
_conditions: dict[str, dict[str, float]] = {}


def note_conditions(step: str) -> None:
    """Record the load average and the machine's page-cache state as ``step`` starts."""
    with open("/proc/meminfo") as meminfo:
        fields = {name: int(rest.split()[0]) / 1024
                  for name, rest in (line.split(":", 1) for line in meminfo)}
    _conditions.setdefault(step, {"load": os.getloadavg()[0], "dirty_mb": fields["Dirty"],
                                  "writeback_mb": fields["Writeback"],
                                  "free_mb": fields["MemFree"]})


def create_topic(namesrv: str, topic: str, queues: int) -> None:
    import subprocess

    tidemq = os.path.join(os.path.dirname(sys.executable), "tidemq")
    subprocess.run([tidemq, "admin", "updateTopic", "-n", namesrv, "-c", "DefaultCluster",
                    "-t", topic, "-r", str(queues), "-w", str(queues)],
                   check=True, capture_output=True, timeout=120)


def latency_figures(namesrv: str, work_dir: str, prefix: str, seconds: float,
                    **kwargs: object) -> dict[str, float]:
    note_conditions(prefix)
    result = measure(namesrv, work_dir, seconds=seconds, **kwargs)  # type: ignore[arg-type]
    return {f"{prefix}_p99": result["latency_ms_p99"],
            f"{prefix}_p999": result["latency_ms_p999"],
            f"{prefix}_broker_cpu": result.get("broker_cpu_us_per_msg"),
            f"{prefix}_consumer_cpu": result["consumer_cpu_us_per_msg"]}


def produce_figures(server: DevServer, name: str, topic: str, count: int,
                    *args: str) -> dict[str, float]:
    note_conditions(name)
    summary = produce_with_cpu(server, topic, count, *args)
    return {name: summary["msgs_per_s"],
            f"{name}_broker_cpu": summary["broker_cpu_us_per_msg"]}


# Rounds of the alternating SYNC_FLUSH / ASYNC_FLUSH batch-produce pair in each run.
DURABLE_ROUNDS = 2


def durable_figures(async_server: DevServer, sync_server: DevServer, count: int,
                    size: int) -> dict[str, float]:
    """Batch produce on both brokers in alternation: the rates and broker CPU per message of
    each (mean over the rounds) and their ratio within this run."""
    sides: dict[str, list[dict[str, float]]] = {"produce_batch": [], "produce_batch_sync": []}
    for round_index in range(DURABLE_ROUNDS):
        order = [("produce_batch", async_server), ("produce_batch_sync", sync_server)]
        for name, server in order if round_index % 2 == 0 else reversed(order):
            # A topic per round: each round writes new queues, as the first round did.
            sides[name].append(produce_figures(server, name, f"FigBatch{round_index}", count,
                                               "-s", str(size), "-b", "64", "-c", "16"))
    figures = {}
    for name, rounds in sides.items():
        for key in (name, f"{name}_broker_cpu"):
            figures[key] = statistics.fmean(figure[key] for figure in rounds)
    figures["sync_vs_async_batch"] = figures["produce_batch_sync"] / figures["produce_batch"]
    figures["sync_vs_async_batch_per_cpu"] = (
        figures["produce_batch_broker_cpu"] / figures["produce_batch_sync_broker_cpu"])
    return figures


def async_figures(args: argparse.Namespace, work_dir: str,
                  server: DevServer) -> dict[str, float]:
    namesrv, pid = server.namesrv, server.process.pid
    size = str(args.size)
    figures = produce_figures(server, "produce_single", "FigSingle", args.messages // 4,
                              "-s", size, "-b", "0", "-c", "64")
    wait_process_idle(pid)
    note_conditions("consume_pull")
    figures["consume_pull"] = bench(namesrv, "consume", "-t", "FigBatch0", "--from", "first",
                                    "--count", str(args.messages))["msgs_per_s"]
    rates = {}
    for queues in (1, 1024):
        topic = f"FigQueues{queues}"
        create_topic(namesrv, topic, queues)
        wait_process_idle(pid)
        note_conditions(f"queues_{queues}")
        rates[queues] = bench(namesrv, "produce", "-t", topic, "-s", size, "-b", "64",
                              "-c", "16", "--count", str(args.messages),
                              timeout_s=600)["msgs_per_s"]
    figures["queues_1024_vs_1"] = rates[1024] / rates[1]
    wait_process_idle(pid)
    figures.update(latency_figures(namesrv, work_dir, "e2e_pull_2000",
                                   args.latency_seconds, consumer_kind="pull",
                                   broker_pid=pid))
    figures.update(latency_figures(namesrv, work_dir, "e2e_push_2000",
                                   args.latency_seconds, consumer_kind="push"))
    figures.update(latency_figures(namesrv, work_dir, "e2e_pull_20000",
                                   args.latency_seconds, consumer_kind="pull",
                                   rate=20_000, concurrency=64))
    return figures


def one_run(args: argparse.Namespace) -> dict[str, float]:
    work_dir = tempfile.mkdtemp(prefix="figures-", dir=args.dir)
    servers: list[DevServer] = []
    _conditions.clear()
    try:
        for side in ("async", "sync"):
            os.makedirs(os.path.join(work_dir, side))
        servers.append(DevServer(os.path.join(work_dir, "async")))
        servers.append(DevServer(os.path.join(work_dir, "sync"),
                                 extra_args=["--flushDiskType", "SYNC_FLUSH"]))
        async_server, sync_server = servers
        figures = durable_figures(async_server, sync_server, args.messages, args.size)
        sync_server.stop()  # idle from here on; stopped so it costs the latency runs nothing
        figures.update(async_figures(args, work_dir, async_server))
        async_server.stop()
        sync_server = DevServer(os.path.join(work_dir, "sync"),
                                extra_args=["--flushDiskType", "SYNC_FLUSH"])
        servers.append(sync_server)
        wait_process_idle(sync_server.process.pid)
        figures.update(latency_figures(sync_server.namesrv, work_dir, "e2e_pull_2000_sync",
                                       args.latency_seconds, consumer_kind="pull"))
        figures["conditions"] = dict(_conditions)  # type: ignore[assignment]
        return figures
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)


def table(runs: list[dict[str, float]]) -> str:
    lines = ["| figure | median | runs | target | met |", "|---|---|---|---|---|"]
    for name, (unit, target, check) in TARGETS.items():
        values = [run[name] for run in runs if run.get(name) is not None]
        if not values:
            continue
        median = statistics.median(values)

        def show(value: float, unit: str = unit) -> str:
            return (f"{value:,.0f}" if unit == "msg/s" else f"{value:.1f}" if unit == "us/msg"
                    else f"{value:.2f}")

        met = "" if check is None else ("yes" if check(median) else "**no**")
        lines.append(f"| {name} ({unit}) | **{show(median)}** | "
                     f"{'; '.join(show(v) for v in values)} | {target} | {met} |")
    return "\n".join(lines)


def conditions_table(runs: list[dict]) -> str:
    """Per step, the conditions it started in, run by run (load 1 min / dirty MB /
    writeback MB / free GB)."""
    steps = list(dict.fromkeys(step for run in runs for step in run.get("conditions", {})))
    lines = ["| step | load / dirty MB / writeback MB / free GB at its start, per run |",
             "|---|---|"]
    for step in steps:
        cells = []
        for run in runs:
            noted = run.get("conditions", {}).get(step)
            cells.append("-" if noted is None else
                         f"{noted['load']:.1f} / {noted['dirty_mb']:,.0f} / "
                         f"{noted['writeback_mb']:,.0f} / {noted['free_mb'] / 1024:.1f}")
        lines.append(f"| {step} | {'; '.join(cells)} |")
    return "\n".join(lines)


def host_check(directory: str) -> list[dict[str, float]]:
    """page_cache_bench.py's files (4 x 256 MiB): what a write into new page cache costs."""
    import subprocess

    out = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(__file__), "page_cache_bench.py"),
         "--files", "4", "--file-mib", "256", "--dir", directory, "--json"],
        capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout)["files"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--latency-seconds", type=float, default=15)
    parser.add_argument("--quick", action="store_true",
                        help="one run, 50,000 messages, 8 s latency runs")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--host-check", action="store_true",
                        help="run page_cache_bench.py (4 x 256 MiB) first and print it")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.messages, args.latency_seconds = 1, 50_000, 8
    os.makedirs(args.dir, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    host = host_check(args.dir) if args.host_check else None
    calibration = calibration_us()
    runs = [one_run(args) for _ in range(args.runs)]
    load_after = load_average()
    calibration_after = calibration_us()
    if args.json:
        print(json.dumps({"started": started, "machine": machine_description(),
                          "calibration_cpu_us": calibration,
                          "calibration_cpu_us_after": calibration_after, "host_check": host,
                          "load_average": [load_before, load_after], "runs": runs}))
        return 0
    print(f"figure set: {args.runs} run(s), {args.messages} x {args.size} B, latency runs "
          f"{args.latency_seconds:g} s; {started}")
    print(f"machine: {machine_description()}; host speed: codec_bench send_request_decode "
          f"{calibration:.2f} CPU us")
    print(f"load average (1, 5, 15 min): {load_before} at the start, {load_after} at the end")
    if host is not None:
        print("host check (page_cache_bench.py, 4 x 256 MiB of new page cache): system "
              + ", ".join(f"{f['system_us_per_kib']:.2f}" for f in host) + " us/KiB")
    print(table(runs))
    print(f"\nhost speed at the end: {calibration_after:.2f} CPU us (start {calibration:.2f})")
    print(conditions_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""figures.py's many-queues row alone, phase by phase, with what the machine did meanwhile:

    .venv/bin/python benchmarks/queue_ratio_bench.py [--runs 3] [--messages 200000]
        [--prefill 0] [--sequence 1,1024] [--sequence 1024,1] [--src NAME=TREE ...] [--json]

figures.py's ``queues_1024_vs_1`` is one ``tidemq bench produce -s 1024 -b 64 -c 16`` to a
new topic of 1 queue, then the same to a new topic of 1,024 queues (every queue's first
message in the run), on the ASYNC_FLUSH broker that already took its produce rounds (~450 MB
of its own, ~400 MB of the SYNC broker's beside it). This runs that pair on a fresh
``tidemq dev`` (ASYNC_FLUSH), after ``--prefill`` messages to another topic (the heavy rounds'
stand-in), in each ``--sequence`` of queue counts (``1,1024`` is figures.py's order;
``1024,1`` says what the order does; more than 1,024 queues are scale_bench.py's equal
topics, one client sending each batch to the next queue, at least one batch per queue),
every run a fresh broker, the sequences rotated run by run. With
``--src NAME=TREE[,--key,value...]`` (a tree whose ``src/`` holds tidemq, or ``.``, and
``tidemq dev`` arguments) every sequence runs for every tree: an A/B alternated in one run.

``--latency-after SECONDS`` then measures figures.py's next row on the same broker (2,000
msg/s end to end, a PullConsumer; latency_bench.measure), as figures.py does after its queue
round.

Per phase it prints msg/s and, per message of the run, the broker's CPU (all threads), its
event loop's (main thread) CPU and the system part of it, the other threads' CPU, the loop's
minor faults, the machine's free memory and dirty page cache at the phase's start and what the
machine wrote to disk during it, and the loop's share of the run waiting for a core
(``runq``). Each sequence's ratio is every phase's rate over its first one-queue phase (as
figures.py divides).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from broker_bench import TIDEMQ, DevServer, bench, children_cpu_s
from idle import wait_process_idle
from latency_bench import load_average, measure
from produce_ab_bench import _PythonPath
from produce_sequence_bench import _snapshot
from scale_bench import QUEUES_PER_TOPIC_MAX, produce_round_robin, queue_layout
from store_bench import machine_description


def free_mb() -> float:
    """The machine's free memory (MemFree), MB."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemFree:"):
                return int(line.split()[1]) / 1024
    return 0.0


def create_topic(namesrv: str, topic: str, queues: int) -> None:
    subprocess.run([TIDEMQ, "admin", "updateTopic", "-n", namesrv, "-c", "DefaultCluster",
                    "-t", topic, "-r", str(queues), "-w", str(queues)],
                   check=True, capture_output=True, timeout=120)


def phase(server: DevServer, topic: str, queues: int, messages: int) -> dict[str, float]:
    """One of figures.py's queue phases: a new topic, the idle wait, the timed produce.

    More than 1,024 queues (a topic's most) are scale_bench.py's: equal topics, one client
    sending each batch to the next queue, every queue's first message in the run."""
    pid = server.process.pid
    layout = queue_layout(queues) if queues > QUEUES_PER_TOPIC_MAX else [(topic, queues)]
    for name, count in layout:
        create_topic(server.namesrv, name, count)
    wait_process_idle(pid)
    memory_free = free_mb()
    before = _snapshot(pid, None)
    client_before = children_cpu_s() + _own_cpu_s()
    if queues > QUEUES_PER_TOPIC_MAX:
        messages = max(messages, 64 * queues)
        result = asyncio.run(produce_round_robin(server.namesrv, layout, messages, 64, 16))
        summary = {"msgs_per_s": result["msgs_per_s"], "messages": messages,
                   "seconds": messages / result["msgs_per_s"]}
    else:
        summary = bench(server.namesrv, "produce", "-t", topic, "-s", "1024", "-b", "64",
                        "-c", "16", "--count", str(messages), timeout_s=600)
    after = _snapshot(pid, None)
    client_s = children_cpu_s() + _own_cpu_s() - client_before
    n = summary["messages"]
    delta = {key: after[key] - before[key] for key in after}
    span = summary["seconds"]
    return {
        "queues": queues,
        "msgs_per_s": summary["msgs_per_s"],
        "broker_us": delta["cpu"] / n * 1e6,
        "main_us": delta["main_cpu"] / n * 1e6,
        "main_sys_us": delta["main_sys"] / n * 1e6,
        "others_us": (delta["cpu"] - delta["main_cpu"]) / n * 1e6,
        "main_faults": delta["main_minor"] / n,
        "free_mb": memory_free,
        "dirty_mb": before["dirty_mb"],
        "written_mb": delta["written_mb"],
        "runq_pct": delta["waiting"] / span * 100,
        "client_us": client_s / n * 1e6,
    }


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def one_sequence(work_dir: str, src: str | None, dev_args: list[str], sequence: list[int],
                 messages: int, prefill: int, latency_s: float = 0.0
                 ) -> list[dict[str, float]]:
    with _PythonPath(src):
        server = DevServer(work_dir, extra_args=dev_args)
    try:
        if prefill:
            wait_process_idle(server.process.pid)
            bench(server.namesrv, "produce", "-t", "QueuePrefill", "-s", "1024", "-b", "64",
                  "-c", "16", "--count", str(prefill), timeout_s=600)
        phases = [phase(server, f"FigQueues{queues}x{index}", queues, messages)
                  for index, queues in enumerate(sequence)]
        if latency_s:
            # figures.py's next row on the same broker: 2,000 msg/s end to end, PullConsumer.
            wait_process_idle(server.process.pid)
            result = measure(server.namesrv, work_dir, seconds=latency_s, consumer_kind="pull",
                             broker_pid=server.process.pid)
            phases[0]["e2e_p99_ms"] = result["latency_ms_p99"]
            phases[0]["e2e_p999_ms"] = result["latency_ms_p999"]
    finally:
        server.stop()
    base = next((p["msgs_per_s"] for p in phases if p["queues"] == 1), phases[0]["msgs_per_s"])
    for figures in phases:
        figures["vs_1"] = figures["msgs_per_s"] / base
    return phases


COLUMNS = (("msgs_per_s", "msg/s", "{:,.0f}"), ("vs_1", "vs 1", "{:.2f}"),
           ("broker_us", "broker", "{:.2f}"), ("main_us", "loop", "{:.2f}"),
           ("main_sys_us", "of it sys", "{:.2f}"), ("others_us", "others", "{:.2f}"),
           ("main_faults", "loop flt", "{:.3f}"), ("free_mb", "free MB", "{:,.0f}"),
           ("dirty_mb", "dirty MB", "{:.0f}"), ("written_mb", "disk MB", "{:.0f}"),
           ("runq_pct", "runq %", "{:.1f}"), ("client_us", "client", "{:.2f}"))


def describe(figures: dict) -> str:
    return " | ".join(f"{label} {fmt.format(figures[key])}" for key, label, fmt in COLUMNS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--latency-after", type=float, default=0, metavar="SECONDS",
                        help="then measure figures.py's 2,000 msg/s pull latency this long")
    parser.add_argument("--prefill", type=int, default=0,
                        help="messages to another topic before the sequence")
    parser.add_argument("--sequence", action="append", default=[],
                        help="queue counts in order, e.g. 1,1024 (figures.py's)")
    parser.add_argument("--src", action="append", default=[],
                        help="NAME=TREE[,--key,value...]: a tree whose src/ holds tidemq (. = "
                             "this checkout) and tidemq dev arguments")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sequences = [[int(q) for q in text.split(",")] for text in args.sequence or ["1,1024"]]
    trees: list[tuple[str, str | None, list[str]]] = []
    for text in args.src or ["now=."]:
        name, _, rest = text.partition("=")
        tree, *dev_args = rest.split(",")
        trees.append((name, None if tree in ("", ".") else os.path.join(os.path.abspath(tree),
                                                                         "src"), dev_args))
    os.makedirs(args.dir, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    combos = [(sequence, name, src, dev_args) for sequence in sequences
              for name, src, dev_args in trees]
    results: dict[str, list[list[dict]]] = {}
    for run in range(args.runs):
        shift = run % len(combos)
        for sequence, name, src, dev_args in combos[shift:] + combos[:shift]:
            key = f"{','.join(map(str, sequence))}/{name}"
            work_dir = tempfile.mkdtemp(prefix="queue-ratio-", dir=args.dir)
            try:
                phases = one_sequence(work_dir, src, dev_args, sequence, args.messages,
                                      args.prefill, args.latency_after)
            finally:
                shutil.rmtree(work_dir, ignore_errors=True)
            results.setdefault(key, []).append(phases)
            if not args.json:
                for figures in phases:
                    print(f"run {run + 1} {key} {figures['queues']:>5} queues: "
                          f"{describe(figures)} | load {load_average()}", flush=True)
                if "e2e_p99_ms" in phases[0]:
                    print(f"run {run + 1} {key} then 2,000 msg/s pull: p99 "
                          f"{phases[0]['e2e_p99_ms']:.2f} p999 {phases[0]['e2e_p999_ms']:.2f} ms",
                          flush=True)
    load_after = load_average()
    if args.json:
        print(json.dumps({"started": started, "machine": machine_description(),
                          "load_average": [load_before, load_after], "results": results}))
        return 0
    print(f"\n{started}, {machine_description()}; load average {load_before} -> {load_after}")
    print(f"{args.messages} x 1 KiB per phase, batches of 64, 16 in flight, prefill "
          f"{args.prefill}; CPU in us per message; medians of {args.runs} runs")
    for key, runs in results.items():
        for index in range(len(runs[0])):
            medians = {column: statistics.median(r[index][column] for r in runs)
                       for column, _, _ in COLUMNS}
            print(f"{key:16s} phase {index} ({runs[0][index]['queues']} queues): "
                  f"{describe(medians)}")
        if "e2e_p99_ms" in runs[0][0]:
            p99s = [r[0]["e2e_p99_ms"] for r in runs]
            p999s = [r[0]["e2e_p999_ms"] for r in runs]
            print(f"{key:16s} then 2,000 msg/s pull: p99 {statistics.median(p99s):.2f} "
                  f"({'; '.join(f'{v:.2f}' for v in p99s)}), p999 "
                  f"{statistics.median(p999s):.2f} ({'; '.join(f'{v:.2f}' for v in p999s)}) ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

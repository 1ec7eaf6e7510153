"""Batch produce, A/B: where the broker's CPU per message goes, variant against variant.

    .venv/bin/python benchmarks/produce_ab_bench.py [--runs 3] [--messages 400000]
        [--warmup 100000] [--batch 64] [--concurrency 16] [--client-src this|variant]
        --variant NAME=SRC[,--key,value...] [--variant ...] [--json]

Each ``--variant`` is a source tree and ``tidemq dev`` arguments: ``SRC`` is ``.`` for this
checkout or another tree's ``src/`` folder (``git archive <commit> src | tar -x -C
/tmp/before`` then ``before=/tmp/before/src``); what follows each comma is passed to
``tidemq dev`` (``nowarm=.,--warmMapedFileEnable,true``). With no ``--variant`` it measures
this checkout alone (``A=.``).

Each run starts a fresh ``tidemq dev`` (ASYNC_FLUSH unless a variant says otherwise) per
variant in turn, rotating the order from run to run; sends ``--warmup`` messages to another
topic (the first touches of the index and the queues are not measured), waits until the
broker is idle, then times ``tidemq bench produce`` of ``--messages`` 1 KiB messages,
``--batch`` per request (64; 0 sends single messages), ``--concurrency`` requests in flight
(16). Printed per run and as medians per variant: msg/s, and per
message the broker's CPU (all threads), its main thread's (the event loop: user and system
apart), the other threads' together, the broker's minor page faults, and the client's CPU;
and as shares of the run's time, the event loop's time waiting for a core (``runq``, from the
kernel's schedstat: other processes held both cores) and its time with nothing to do
(``idle``: neither running nor waiting for a core; the loop waited for the producer). The
CPU figures are the steady ones on a shared machine; compare variants within one run.
``--client-src variant`` runs ``tidemq bench`` from each variant's tree too (for a change on
the client side); by default the client is always this checkout's.
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

from broker_bench import DevServer, bench
from idle import wait_process_idle
from latency_bench import load_average
from store_bench import machine_description

TOPIC = "ProduceAB"
WARMUP_TOPIC = "ProduceABWarmup"


def parse_variant(text: str) -> tuple[str, str | None, list[str]]:
    """``NAME=SRC[,arg...]`` -> (name, src or None for this checkout, dev arguments)."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--variant {text!r}: expected NAME=SRC[,--key,value...]")
    src, *dev_args = rest.split(",")
    return name, None if src in ("", ".") else os.path.abspath(src), dev_args


def main_thread_stat(pid: int) -> tuple[float, float, int]:
    """(user s, system s, minor faults) of process ``pid``'s main thread so far."""
    return _stat(f"/proc/{pid}/task/{pid}/stat")


def main_thread_schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a core, seconds runnable but waiting for one) of ``pid``'s main thread."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as stat:
        on_core_ns, waiting_ns, _ = stat.read().split()
    return int(on_core_ns) / 1e9, int(waiting_ns) / 1e9


def process_stat(pid: int) -> tuple[float, float, int]:
    """(user s, system s, minor faults) of process ``pid`` (all threads) so far."""
    return _stat(f"/proc/{pid}/stat")


def _stat(path: str) -> tuple[float, float, int]:
    with open(path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7])


class _PythonPath:
    """``PYTHONPATH`` set to ``src`` (None: left as it is) inside the block, restored after."""

    def __init__(self, src: str | None) -> None:
        self.src = src
        self.previous = os.environ.get("PYTHONPATH")

    def __enter__(self) -> None:
        if self.src is not None:
            os.environ["PYTHONPATH"] = self.src

    def __exit__(self, *_: object) -> None:
        if self.previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = self.previous


def measure(work_dir: str, src: str | None, dev_args: list[str], messages: int,
            warmup: int, batch: int = 64, concurrency: int = 16,
            client_src: str | None = None) -> dict:
    """One timed produce against a fresh ``tidemq dev`` of ``src`` with ``dev_args``; the
    timed ``tidemq bench`` runs from ``client_src`` (None: this checkout)."""
    with _PythonPath(src):
        server = DevServer(work_dir, extra_args=dev_args)
    pid = server.process.pid
    try:
        wait_process_idle(pid)
        if warmup:
            bench(server.namesrv, "produce", "-t", WARMUP_TOPIC, "-b", "64", "-c", "16",
                  "--count", str(warmup))
            wait_process_idle(pid)
        main_before, all_before = main_thread_stat(pid), process_stat(pid)
        sched_before = main_thread_schedstat(pid)
        with _PythonPath(client_src):
            summary = bench(server.namesrv, "produce", "-t", TOPIC, "-b", str(batch),
                            "-c", str(concurrency), "--count", str(messages))
        main_after, all_after = main_thread_stat(pid), process_stat(pid)
        sched_after = main_thread_schedstat(pid)
    finally:
        server.stop()
    count = summary["messages"]

    def per_message_us(seconds: float) -> float:
        return seconds / count * 1e6

    main_user = main_after[0] - main_before[0]
    main_system = main_after[1] - main_before[1]
    broker = sum(all_after[:2]) - sum(all_before[:2])
    # Shares of the client's timed span (the broker idles while the client starts, but that
    # adds nothing to its time on a core or waiting for one).
    span_s = summary["seconds"]
    on_core_s = sched_after[0] - sched_before[0]
    waiting_s = sched_after[1] - sched_before[1]
    return {
        "msgs_per_s": summary["msgs_per_s"],
        "broker_cpu_us": per_message_us(broker),
        "main_cpu_us": per_message_us(main_user + main_system),
        "main_user_us": per_message_us(main_user),
        "main_system_us": per_message_us(main_system),
        "other_threads_us": per_message_us(broker - main_user - main_system),
        "minor_faults": (all_after[2] - all_before[2]) / count,
        "main_runq_pct": waiting_s / span_s * 100,
        "main_idle_pct": max(0.0, 100 - (on_core_s + waiting_s) / span_s * 100),
        # The client's own figure (tidemq bench's cpu_s) leaves out its start-up.
        "client_cpu_us": per_message_us(summary.get("cpu_s") or summary["client_cpu_s"]),
    }


COLUMNS = (("msgs_per_s", "msg/s", "{:,.0f}"), ("broker_cpu_us", "broker", "{:.2f}"),
           ("main_cpu_us", "main", "{:.2f}"), ("main_user_us", "usr", "{:.2f}"),
           ("main_system_us", "sys", "{:.2f}"), ("other_threads_us", "others", "{:.2f}"),
           ("minor_faults", "faults", "{:.3f}"), ("client_cpu_us", "client", "{:.2f}"),
           ("main_runq_pct", "runq %", "{:.1f}"), ("main_idle_pct", "idle %", "{:.1f}"))


def describe(figures: dict) -> str:
    return " | ".join(f"{label} {fmt.format(figures[key])}" for key, label, fmt in COLUMNS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--warmup", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=64,
                        help="messages per request of the timed produce (0: single sends)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=SRC[,--key,value...]: SRC is . or another tree's src/")
    parser.add_argument("--client-src", choices=("this", "variant"), default="this",
                        help="run the timed client from this checkout or from each variant's tree")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    variants = [parse_variant(text) for text in args.variant or ["A=."]]
    os.makedirs(args.dir, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    runs: list[dict[str, dict]] = []
    for run in range(args.runs):
        shift = run % len(variants)
        figures: dict[str, dict] = {}
        for name, src, dev_args in variants[shift:] + variants[:shift]:
            work_dir = tempfile.mkdtemp(prefix="produce-ab-", dir=args.dir)
            try:
                figures[name] = measure(
                    work_dir, src, dev_args, args.messages, args.warmup, args.batch,
                    args.concurrency, src if args.client_src == "variant" else None)
            finally:
                shutil.rmtree(work_dir, ignore_errors=True)
            if not args.json:
                print(f"run {run + 1} {name:10s} {describe(figures[name])}", flush=True)
        runs.append(figures)
    load_after = load_average()
    if args.json:
        print(json.dumps({"started": started, "machine": machine_description(),
                          "load_average": [load_before, load_after], "runs": runs}))
        return 0
    print(f"\n{started}, {machine_description()}; load average {load_before} -> {load_after}")
    print(f"{args.messages} x 1 KiB, batches of {args.batch}, {args.concurrency} in flight; "
          "CPU in us per message; the event loop's runq and idle in % of the run; "
          f"median of {args.runs} runs")
    for name, _, _ in variants:
        medians = {key: statistics.median(r[name][key] for r in runs) for key, _, _ in COLUMNS}
        print(f"{name:10s} {describe(medians)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

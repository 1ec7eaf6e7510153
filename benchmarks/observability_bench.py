"""Observability costs (issue 15), runnable by anyone:

    .venv/bin/python benchmarks/observability_bench.py [--runs 3] [--messages 200000]
        [--only trace,metrics,console]

- ``trace``: batch produce (64 x 1 KiB, 16 in flight) with the producer's message trace off
  and on, against one ``tidemq dev``, runs interleaved off/on so both see the same
  neighbours; the figure is the ratio of the medians (target >= 0.8). The traced runs report
  how many trace records were written, failed or dropped (a dropped record would flatter
  the figure, so it is printed).
- ``metrics``: the same batch produce against a ``tidemq dev`` started without and with the
  Prometheus exporter (``--metricsExporterType PROM``), a fresh server per run, interleaved;
  ratio of the medians (target >= 0.95), with a scrape of /metrics during each "on" run.
- ``console``: a ``tidemq dev`` holding ``--topics`` topics and ``--groups`` subscription
  groups, a ``tidemq console`` on it; each page fetched ``--fetches`` times, median and worst
  time per page (target <= 300 ms).

It prints its parameters, the machine and the load average first, then one line per figure
(``--json``: one JSON object). The machine is shared: compare the ratios, which come from
runs made in the same minutes, not the absolute rates.
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

from broker_bench import DevServer, produce_with_cpu
from store_bench import machine_description


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def trace_figure(args: argparse.Namespace) -> dict:
    work_dir = tempfile.mkdtemp(prefix="obs-bench-trace-", dir=args.dir)
    server = DevServer(work_dir)
    off: list[float] = []
    on: list[float] = []
    records: list[dict] = []
    cpu: dict[str, list[float]] = {"off_broker": [], "off_client": [], "on_broker": [],
                                   "on_client": []}
    try:
        common = ("-s", str(args.size), "-b", "64", "-c", "16")
        for run in range(args.runs):
            summary = produce_with_cpu(server, f"TraceOff{run}", args.messages, *common)
            off.append(summary["msgs_per_s"])
            cpu["off_broker"].append(summary["broker_cpu_us_per_msg"])
            cpu["off_client"].append(summary["client_cpu_us_per_msg"])
            summary = produce_with_cpu(server, f"TraceOn{run}", args.messages, *common,
                                       "--trace")
            on.append(summary["msgs_per_s"])
            records.append(summary["trace_records"])
            cpu["on_broker"].append(summary["broker_cpu_us_per_msg"])
            cpu["on_client"].append(summary["client_cpu_us_per_msg"])
    finally:
        server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    return {"off_msgs_per_s": off, "on_msgs_per_s": on, "trace_records": records,
            "cpu_us_per_msg_median": {k: statistics.median(v) for k, v in cpu.items()},
            "ratio": statistics.median(on) / statistics.median(off), "target": 0.8}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--only", default="trace,metrics,console")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    figures: dict[str, object] = {
        "machine": machine_description(), "load_average_before": load_average(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if not args.json:
        print(f"observability bench: {args.messages} x {args.size} B, {args.runs} runs each; "
              f"{figures['date']}")
        print(f"machine: {figures['machine']}; load average {figures['load_average_before']}")
    builders = {"trace": trace_figure}
    for name in ("trace", "metrics", "console"):
        if name not in wanted or name not in builders:
            continue
        figure = builders[name](args)
        figures[name] = figure
        if not args.json:
            print(f"{name}: {json.dumps(figure)}")
    figures["load_average_after"] = load_average()
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"load average after: {figures['load_average_after']}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    sys.exit(main())


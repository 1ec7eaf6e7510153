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
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

from broker_bench import DevServer, produce_with_cpu
from store_bench import machine_description


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def trace_figure(args: argparse.Namespace) -> dict:
    work_dir = tempfile.mkdtemp(prefix="obs-bench-trace-", dir=args.dir)
    server = DevServer(work_dir, QUIET)
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


# The "off" server of the metrics figure, and every server here: no console (its sampler
# would be noise), metrics only where the figure wants them.
QUIET = ["--consolePort", "off", "--metricsExporterType", "DISABLE"]


def metrics_figure(args: argparse.Namespace) -> dict:
    off: list[float] = []
    on: list[float] = []
    cpu: dict[str, list[float]] = {"off_broker": [], "on_broker": []}
    scraped: list[int] = []
    common = ("-s", str(args.size), "-b", "64", "-c", "16")
    for run in range(args.runs):
        for enabled in (False, True):
            work_dir = tempfile.mkdtemp(prefix="obs-bench-metrics-", dir=args.dir)
            extra = (["--consolePort", "off", "--metricsExporterType", "PROM",
                      "--metricsPromExporterPort", "0"] if enabled else QUIET)
            server = DevServer(work_dir, extra)
            try:
                scraper = _Scraper(work_dir) if enabled else None
                summary = produce_with_cpu(server, f"Metrics{run}", args.messages, *common)
                if scraper is not None:
                    scraped.append(scraper.stop())
            finally:
                server.stop()
                shutil.rmtree(work_dir, ignore_errors=True)
            (on if enabled else off).append(summary["msgs_per_s"])
            cpu["on_broker" if enabled else "off_broker"].append(
                summary["broker_cpu_us_per_msg"])
    return {"off_msgs_per_s": off, "on_msgs_per_s": on, "scrapes_during_on_runs": scraped,
            "cpu_us_per_msg_median": {k: statistics.median(v) for k, v in cpu.items()},
            "ratio": statistics.median(on) / statistics.median(off), "target": 0.95}


class _Scraper:
    """Scrapes the dev server's broker /metrics once a second (what Prometheus would do,
    five times as often as its usual 5 s) while a run goes on."""

    def __init__(self, work_dir: str) -> None:
        log_path = os.path.join(work_dir, "dev.log")
        deadline = time.monotonic() + 60
        self.url = None
        while self.url is None:
            with open(log_path, errors="replace") as log:
                match = re.search(r"metrics (http://\S+/metrics) \(broker\)", log.read())
            if match:
                self.url = match.group(1)
            elif time.monotonic() > deadline:
                raise RuntimeError("tidemq dev printed no metrics URL")
            else:
                time.sleep(0.1)
        self.count = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(1.0):
            with urllib.request.urlopen(self.url, timeout=30) as response:
                response.read()
            self.count += 1

    def stop(self) -> int:
        self._stopping.set()
        self._thread.join()
        return self.count


def console_figure(args: argparse.Namespace) -> dict:
    """Page times of a console over a dev server with --topics topics and --groups groups."""
    work_dir = tempfile.mkdtemp(prefix="obs-bench-console-", dir=args.dir)
    server = DevServer(work_dir, ["--consolePort", "0", "--metricsExporterType", "DISABLE"])
    try:
        asyncio.run(_fill(server.namesrv, args.topics, args.groups))
        url = _console_url(work_dir)
        pages = {
            "cluster": "", "topics": "topics", "topics_with_system": "topics?system=1",
            "topic": f"topic?topic=ObsTopic{args.topics // 2:04d}", "groups": "groups",
            "group": f"group?group=obs_group_{args.groups // 2:04d}", "message_search_by_key":
                "messages?key_topic=ObsTopic0001&key=k-1",
            "message_search_by_time": "messages?range_topic=ObsTopic0001&begin=0&end=now",
            "dlq": "dlq?group=obs_group_0001", "trace": "trace?id=NOSUCHID",
        }
        times: dict[str, dict[str, float]] = {}
        for name, path in pages.items():
            samples = []
            for _ in range(args.fetches):
                started = time.perf_counter()
                with urllib.request.urlopen(url + path, timeout=60) as response:
                    response.read()
                samples.append((time.perf_counter() - started) * 1000)
            times[name] = {"median_ms": statistics.median(samples), "max_ms": max(samples)}
    finally:
        server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    return {"topics": args.topics, "groups": args.groups, "fetches": args.fetches,
            "pages": times, "target_ms": 300,
            "worst_median_ms": max(t["median_ms"] for t in times.values())}


async def _fill(namesrv: str, topics: int, groups: int) -> None:
    from tidemq.client import Admin, Message, Producer
    from tidemq.remoting.errors import RemotingTimeout

    async with Admin(namesrv, request_timeout_ms=30_000) as admin:
        # One create at a time: concurrent creates lost some topics at the name server
        # (incremental registration, 2026-11-26; reported), which is not what is measured here.
        semaphore = asyncio.Semaphore(1)

        async def retried(action) -> None:
            for attempt in range(5):  # a busy machine may time a create out; it is idempotent
                try:
                    async with semaphore:
                        await action()
                    return
                except RemotingTimeout:
                    if attempt == 4:
                        raise

        async def topic(i: int) -> None:
            await retried(lambda: admin.create_topic(f"ObsTopic{i:04d}", 4))

        async def group(i: int) -> None:
            await retried(lambda: admin.update_subscription_group(f"obs_group_{i:04d}"))

        await asyncio.gather(*(topic(i) for i in range(topics)))
        await asyncio.gather(*(group(i) for i in range(groups)))
        deadline = time.monotonic() + 120
        while len(await admin.topic_list()) < topics:
            if time.monotonic() > deadline:
                raise RuntimeError("the name server never routed every topic")
            await asyncio.sleep(0.5)
    async with Producer("obs_bench_producer", namesrv) as producer:
        await producer.send_batch([Message("ObsTopic0001", f"m-{i}", keys=[f"k-{i % 10}"])
                                   for i in range(200)])


def _console_url(work_dir: str) -> str:
    deadline = time.monotonic() + 60
    while True:
        with open(os.path.join(work_dir, "dev.log"), errors="replace") as log:
            match = re.search(r"console (http://\S+/)[,;]", log.read())
        if match:
            return match.group(1)
        if time.monotonic() > deadline:
            raise RuntimeError("tidemq dev printed no console URL")
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--only", default="trace,metrics,console")
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--fetches", type=int, default=5)
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
    builders = {"trace": trace_figure, "metrics": metrics_figure, "console": console_figure}
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


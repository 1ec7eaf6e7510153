"""Cost as a deployment grows: growth curves of topics, consumer groups, connections, queues.

    .venv/bin/python benchmarks/scale_bench.py [--topics 2000] [--groups 500]
        [--connections 1000] [--queues 1,64,1024] [--only topics,groups,...] [--json]
        [--topic-concurrency 1]

Starts its own ``tidemq dev`` (fresh store, free loopback ports) and grows it, one thing at
a time, as an operator or an application would:

- topics: ``Admin.create_topic`` (UPDATE_AND_CREATE_TOPIC, 8 queues) one after another (or
  ``--topic-concurrency`` at a time, as a provisioning script would); the wall time of each
  create, as the mean of the 50 creates before each checkpoint. A create is answered once
  topics.json durably holds it, and creates in flight together share one save (group
  commit), so the curve at concurrency 1 carries one whole-file save per create;
- groups: a new consumer group's first HEART_BEAT (the broker creates its retry topic and
  tells the name server); the time of each, at checkpoints;
- connections: that many connections kept open, each sending one HEART_BEAT; the time of a
  heartbeat at checkpoints and the broker's resident memory per connection;
- queues: batch produce (``tidemq bench produce -b 64 -c 16``, 50,000 x 1 KiB) to a new
  topic of each queue count, first messages to every queue included, as a ratio to one queue.

A flat curve is the goal: the 10,000th topic should cost about what the 100th does. It
prints the broker's CPU seconds per phase and the load average next to each curve (the
machine is shared; compare within one run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from broker_bench import DevServer, bench
from idle import process_cpu_s, wait_process_idle
from latency_bench import load_average
from store_bench import machine_description

WINDOW = 50  # creates or heartbeats averaged before each checkpoint


def checkpoints(total: int) -> list[int]:
    marks = [m for m in (100, 250, 500, 1000, 2000, 5000, 10_000, 20_000) if m <= total]
    return marks if marks and marks[-1] == total else [*marks, total]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def topic_curve(namesrv: str, total: int, concurrency: int = 1) -> list[dict]:
    from tidemq.client.admin import Admin

    curve, times = [], []
    marks = checkpoints(total)
    began = time.perf_counter()
    next_index = 0

    async def create_next(admin: Admin) -> None:
        nonlocal next_index
        while next_index < total:
            next_index += 1
            index = next_index
            started = time.perf_counter()
            await admin.create_topic(f"Scale{index:06d}", 8, cluster="DefaultCluster")
            times.append((time.perf_counter() - started) * 1000)
            if len(times) in marks:
                curve.append({"count": len(times), "ms_per_create": statistics.mean(
                    times[-WINDOW:]), "elapsed_s": time.perf_counter() - began,
                    "load": load_average()})

    async with Admin(namesrv, request_timeout_ms=60_000) as admin:
        await asyncio.gather(*(create_next(admin) for _ in range(concurrency)))
    return curve


def heartbeat_body(client_id: str, group: str | None) -> bytes:
    consumers = [] if group is None else [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"topic": "ScaleGroups", "subString": "*", "tagsSet": [],
                                 "codeSet": [], "subVersion": 1, "classFilterMode": False,
                                 "expressionType": "TAG"}],
    }]
    return json.dumps({"clientID": client_id, "consumerDataSet": consumers,
                       "producerDataSet": []}).encode()


async def group_curve(broker: str, total: int) -> list[dict]:
    from tidemq.protocol.codes import RequestCode
    from tidemq.protocol.command import RemotingCommand
    from tidemq.remoting.client import RemotingClient

    curve, times = [], []
    marks = checkpoints(total)
    async with RemotingClient() as client:
        for index in range(1, total + 1):
            body = heartbeat_body(f"127.0.0.1@scale{index}", f"ScaleGroup{index:06d}")
            started = time.perf_counter()
            await client.invoke(broker, RemotingCommand.request(RequestCode.HEART_BEAT,
                                                                None, body), 60_000)
            times.append((time.perf_counter() - started) * 1000)
            if index in marks:
                curve.append({"count": index, "ms_per_first_heartbeat":
                              statistics.mean(times[-WINDOW:]), "load": load_average()})
    return curve


async def connection_curve(broker: str, total: int, broker_pid: int) -> list[dict]:
    from tidemq.protocol.codes import RequestCode
    from tidemq.protocol.command import RemotingCommand
    from tidemq.remoting.client import RemotingClient

    curve, times = [], []
    marks = checkpoints(total)
    clients: list[RemotingClient] = []
    rss_before = rss_kib(broker_pid)
    try:
        for index in range(1, total + 1):
            client = RemotingClient()
            clients.append(client)
            body = heartbeat_body(f"127.0.0.1@conn{index}", None)
            started = time.perf_counter()
            await client.invoke(broker, RemotingCommand.request(RequestCode.HEART_BEAT,
                                                                None, body), 60_000)
            times.append((time.perf_counter() - started) * 1000)
            if index in marks:
                curve.append({"count": index, "ms_per_heartbeat": statistics.mean(
                    times[-WINDOW:]), "broker_rss_kib_per_connection":
                    (rss_kib(broker_pid) - rss_before) / index, "load": load_average()})
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    return curve


def queue_curve(server: DevServer, queue_counts: list[int]) -> list[dict]:
    import subprocess

    tidemq = os.path.join(os.path.dirname(sys.executable), "tidemq")
    curve = []
    for queues in queue_counts:
        topic = f"ScaleQueues{queues}"
        subprocess.run([tidemq, "admin", "updateTopic", "-n", server.namesrv, "-c",
                        "DefaultCluster", "-t", topic, "-r", str(queues), "-w", str(queues)],
                       check=True, capture_output=True, timeout=300)
        wait_process_idle(server.process.pid)
        summary = bench(server.namesrv, "produce", "-t", topic, "-b", "64", "-c", "16",
                        "--count", "50000", timeout_s=900)
        curve.append({"queues": queues, "msgs_per_s": summary["msgs_per_s"],
                      "load": load_average()})
    for point in curve:
        point["vs_one_queue"] = point["msgs_per_s"] / curve[0]["msgs_per_s"]
    return curve


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=2000)
    parser.add_argument("--topic-concurrency", type=int, default=1,
                        help="topic creates in flight at once")
    parser.add_argument("--groups", type=int, default=500)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--queues", default="1,64,1024")
    parser.add_argument("--only", default="topics,groups,connections,queues")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    only = set(args.only.split(","))
    os.makedirs(args.dir, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="scale-bench-", dir=args.dir)
    server = DevServer(work_dir)
    broker = f"127.0.0.1:{server.broker_port}"
    results: dict[str, object] = {"machine": machine_description(),
                                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        phases = [
            ("topics", lambda: asyncio.run(topic_curve(server.namesrv, args.topics,
                                                      args.topic_concurrency))),
            ("groups", lambda: asyncio.run(group_curve(broker, args.groups))),
            ("connections", lambda: asyncio.run(
                connection_curve(broker, args.connections, server.process.pid))),
            ("queues", lambda: queue_curve(server, [int(q) for q in args.queues.split(",")])),
        ]
        for name, run in phases:
            if name not in only:
                continue
            wait_process_idle(server.process.pid)
            cpu_before = process_cpu_s(server.process.pid)
            curve = run()
            cpu_s = process_cpu_s(server.process.pid) - cpu_before
            results[name] = {"curve": curve, "broker_cpu_s": cpu_s}
            if not args.json:
                print(f"{name} (broker CPU {cpu_s:.1f} s):")
                for point in curve:
                    print("  " + ", ".join(
                        f"{k} {v:,.2f}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in point.items()))
    finally:
        server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

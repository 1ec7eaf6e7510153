"""Cost as a deployment grows: growth curves of topics, consumer groups, connections, queues.

    .venv/bin/python benchmarks/scale_bench.py [--topics 2000] [--admin-groups 2000]
        [--groups 500] [--connections 1000] [--queues 1,64,1024,10000]
        [--queue-messages 100000] [--only topics,admin_groups,groups,...] [--json]
        [--topic-concurrency 1]

Starts its own ``tidemq dev`` (fresh store, free loopback ports) and grows it, one thing at
a time, as an operator or an application would:

- topics: ``Admin.create_topic`` (UPDATE_AND_CREATE_TOPIC, 8 queues) one after another (or
  ``--topic-concurrency`` at a time, as a provisioning script would); the wall time of each
  create, as the mean of the 50 creates before each checkpoint. A create is answered once
  topics.json durably holds it, and creates in flight together share one save (group
  commit), so the curve at concurrency 1 carries one whole-file save per create; with the
  broker's CPU per create so far;
- admin_groups: the same with ``Admin.update_subscription_group``
  (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, answered once subscriptionGroup.json holds it);
- groups: a new consumer group's first HEART_BEAT (the broker creates its retry topic and
  tells the name server); the time of each, at checkpoints;
- connections: that many connections kept open, each sending one HEART_BEAT; the time of a
  heartbeat at checkpoints and the broker's resident memory per connection;
- queues: batch produce (64 x 1 KiB a batch, 16 in flight, ``--queue-messages`` and at
  least one batch per queue) to new queues of each count, each batch to the next queue in
  turn, so every queue's first message is included; as a ratio to one queue in the same run,
  with the broker's CPU per message. A topic has at most 1,024 queues, so more queues are
  spread over equal topics (10,000 = 10 topics of 1,000); one client sends to all of them.

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

from broker_bench import DevServer
from idle import process_cpu_s, wait_process_idle
from latency_bench import load_average
from store_bench import machine_description

WINDOW = 50  # creates or heartbeats averaged before each checkpoint


def checkpoints(total: int) -> list[int]:
    marks = [m for m in (100, 250, 500, 1000, 2000, 5000, 10_000, 20_000) if m <= total]
    return marks if marks and marks[-1] == total else [*marks, total]


def loop_cpu_s(pid: int) -> float:
    """CPU seconds of the process's main thread (the broker's event loop) so far."""
    return process_cpu_s(pid, thread=pid)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def admin_create_curve(namesrv: str, total: int, what: str, concurrency: int = 1,
                             broker_pid: int | None = None) -> list[dict]:
    """Create ``total`` topics (``what`` = "topics") or subscription groups ("groups") one
    after another (``concurrency`` in flight) through the admin API; each create is answered
    once the broker's file durably holds it."""
    from tidemq.client.admin import Admin

    curve, times = [], []
    marks = checkpoints(total)
    began = time.perf_counter()
    cpu_before = process_cpu_s(broker_pid) if broker_pid else 0.0
    next_index = 0

    async def create_next(admin: Admin) -> None:
        nonlocal next_index
        while next_index < total:
            next_index += 1
            index = next_index
            started = time.perf_counter()
            if what == "topics":
                await admin.create_topic(f"Scale{index:06d}", 8, cluster="DefaultCluster")
            else:
                await admin.update_subscription_group(f"ScaleAdminGroup{index:06d}",
                                                      cluster="DefaultCluster")
            times.append((time.perf_counter() - started) * 1000)
            if len(times) in marks:
                point = {"count": len(times), "ms_per_create": statistics.mean(
                    times[-WINDOW:]), "elapsed_s": time.perf_counter() - began}
                if broker_pid:
                    point["broker_cpu_ms_per_create"] = (
                        (process_cpu_s(broker_pid) - cpu_before) * 1000 / len(times))
                point["load"] = load_average()
                curve.append(point)

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


QUEUES_PER_TOPIC_MAX = 1024  # a topic's queues are capped (TOPIC_QUEUE_NUMS_MAX)


def queue_layout(queues: int) -> list[tuple[str, int]]:
    """(topic, queue count) holding ``queues`` queues: one topic up to 1,024, else the
    fewest topics of equal size (10,000 = 10 topics of 1,000)."""
    topics = -(-queues // QUEUES_PER_TOPIC_MAX)
    return [(f"ScaleQueues{queues}x{index}", queues // topics + (index < queues % topics))
            for index in range(topics)]


async def produce_round_robin(namesrv: str, layout: list[tuple[str, int]], count: int,
                              batch: int, concurrency: int) -> dict:
    """Send ``count`` messages of 1 KiB in batches, each batch to the next queue of every
    queue of ``layout`` in turn (``concurrency`` batches in flight); so the first batches
    are the first messages of their queues. Returns msg/s and how many queues were written."""
    from tidemq.client import Message, MessageQueue, Producer

    body = (os.urandom(64) * 16)[:1024]
    queues = [MessageQueue(topic, "broker-a", queue_id)
              for queue_id in range(max(n for _, n in layout)) for topic, n in layout
              if queue_id < n]
    claimed = 0
    async with Producer("SCALE_BENCH_PRODUCER", namesrv, send_timeout_ms=30_000) as producer:
        for topic, _ in layout:  # learn the routes before the clock starts
            await producer.send(Message(topic, body), queue=MessageQueue(topic, "broker-a", 0))
        started = time.perf_counter()

        async def worker() -> None:
            nonlocal claimed
            while claimed < count:
                take = min(batch, count - claimed)
                queue = queues[(claimed // batch) % len(queues)]
                claimed += take
                await producer.send_batch([Message(queue.topic, body) for _ in range(take)],
                                          queue=queue)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return {"msgs_per_s": count / seconds,
            "queues_written": min(len(queues), -(-count // batch))}


def queue_curve(server: DevServer, queue_counts: list[int], messages: int) -> list[dict]:
    """Batch produce (64 x 1 KiB, 16 in flight) to new topics of each queue count, every
    queue in turn, first messages included (at least one batch per queue); as a ratio to
    one queue in the same run."""
    import subprocess

    tidemq = os.path.join(os.path.dirname(sys.executable), "tidemq")
    curve = []
    for queues in queue_counts:
        layout = queue_layout(queues)
        for topic, queue_count in layout:
            subprocess.run([tidemq, "admin", "updateTopic", "-n", server.namesrv, "-c",
                            "DefaultCluster", "-t", topic, "-r", str(queue_count),
                            "-w", str(queue_count)], check=True, capture_output=True,
                           timeout=300)
        wait_process_idle(server.process.pid)
        count = max(messages, 64 * queues)  # every queue gets its first batch
        pid = server.process.pid
        cpu_before, loop_before = process_cpu_s(pid), loop_cpu_s(pid)
        result = asyncio.run(produce_round_robin(server.namesrv, layout, count, 64, 16))
        result["broker_cpu_us_per_msg"] = (process_cpu_s(pid) - cpu_before) * 1e6 / count
        # The event loop's share: work moved to a helper thread leaves it.
        result["loop_cpu_us_per_msg"] = (loop_cpu_s(pid) - loop_before) * 1e6 / count
        curve.append({"queues": queues, "messages": count, **result, "load": load_average()})
    for point in curve:
        point["vs_one_queue"] = point["msgs_per_s"] / curve[0]["msgs_per_s"]
    return curve


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=2000)
    parser.add_argument("--topic-concurrency", type=int, default=1,
                        help="topic or admin group creates in flight at once")
    parser.add_argument("--groups", type=int, default=500)
    parser.add_argument("--admin-groups", type=int, default=2000,
                        help="subscription groups created through the admin API")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--queues", default="1,64,1024")
    parser.add_argument("--queue-messages", type=int, default=100_000,
                        help="messages per queue count (64 a batch, each batch to the next "
                             "queue)")
    parser.add_argument("--only", default="topics,admin_groups,groups,connections,queues")
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
            ("topics", lambda: asyncio.run(admin_create_curve(
                server.namesrv, args.topics, "topics", args.topic_concurrency,
                server.process.pid))),
            ("admin_groups", lambda: asyncio.run(admin_create_curve(
                server.namesrv, args.admin_groups, "groups", args.topic_concurrency,
                server.process.pid))),
            ("groups", lambda: asyncio.run(group_curve(broker, args.groups))),
            ("connections", lambda: asyncio.run(
                connection_curve(broker, args.connections, server.process.pid))),
            ("queues", lambda: queue_curve(server, [int(q) for q in args.queues.split(",")],
                                           args.queue_messages)),
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

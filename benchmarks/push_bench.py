"""Push-consumer throughput: how fast a PushConsumer hands stored messages to a no-op listener.

The harness fills a topic with ``--messages`` messages of ``--size`` bytes (tags, keys and a
UNIQ_KEY each, like real traffic), then, for each listener mode, starts a PushConsumer of a
fresh group from the first offset and times it until every message reached the listener:

    batch     a plain-function listener given up to ``--batch-size`` messages per call
    single    a plain-function listener given one message per call (RocketMQ's default)
    async     a coroutine listener given one message per call (runs on the consumer's loop)

The figure is messages per second between the first and the last message delivered (start-up
and the first rebalance excluded; they are printed apart), with the consumer process's CPU
time over the same span and the messages per CPU-second it implies: on a shared machine a
CPU time far below the wall time means another process (often the broker, on the same
host) had the core, and the per-CPU-second figure is what the consumer itself can do. The
broker runs in its own process (``tidemq dev``, started in a temporary folder unless
``--namesrv`` points at a running cluster), so the consumer's figures are its own.

Usage::

    .venv/bin/python benchmarks/push_bench.py [--messages 200000] [--size 1024]
        [--queues 8] [--modes batch,single,async] [--batch-size 32]
        [--pull-batch-size 256] [--namesrv host:port] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from broker_bench import DevServer
from tidemq.client import Admin, Message, Producer, PushConsumer
from tidemq.remoting.loop import new_event_loop

START_TIMEOUT_S = 60.0
CONSUME_TIMEOUT_S = 600.0
PRODUCE_BATCH = 64
PRODUCE_IN_FLIGHT = 8


@dataclass
class Run:
    """One listener mode's result."""

    mode: str
    messages: int
    seconds: float
    msgs_per_s: float
    mb_per_s: float
    cpu_seconds: float
    msgs_per_cpu_s: float
    broker_cpu_seconds: float | None
    startup_ms: float
    listener_calls: int


@dataclass
class Report:
    """Everything a run measured, with its parameters and the machine."""

    messages: int
    size: int
    queues: int
    batch_size: int
    pull_batch_size: int
    produce_msgs_per_s: float
    runs: list[Run] = field(default_factory=list)
    machine: dict[str, object] = field(default_factory=lambda: {
        "python": platform.python_version(), "platform": platform.platform(),
        "cpus": os.cpu_count(), "loop": "uvloop",
    })


def process_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system) a process used so far, from /proc; None where unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def dev_server() -> Iterator[tuple[str, int]]:
    """A ``tidemq dev`` process (name server + broker; broker_bench's DevServer) in a
    temporary folder; yields the name server address and the process id, and stops the
    process (by its PID) afterwards."""
    server = DevServer(start_new_session=True)
    try:
        yield server.namesrv, server.process.pid
    finally:
        server.stop()


async def fill(namesrv: str, topic: str, messages: int, size: int, queues: int) -> float:
    """Create ``topic`` and store ``messages`` messages; returns the produce rate (msg/s)."""
    async with Admin(namesrv) as admin:
        await admin.create_topic(topic, queues)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with contextlib.suppress(Exception):
                await admin.topic_route(topic)
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {topic} never got a route")
            await asyncio.sleep(0.1)
    body = os.urandom(size // 2).hex().encode()[:size]
    started = time.perf_counter()
    async with Producer("push_bench_producer", namesrv) as producer:
        semaphore = asyncio.Semaphore(PRODUCE_IN_FLIGHT)

        async def send(first: int) -> None:
            async with semaphore:
                await producer.send_batch([
                    Message(topic, body, tags="bench", keys=[f"k{first + i}"])
                    for i in range(min(PRODUCE_BATCH, messages - first))
                ])

        await asyncio.gather(*(send(first) for first in range(0, messages, PRODUCE_BATCH)))
    return messages / (time.perf_counter() - started)


async def consume(namesrv: str, topic: str, mode: str, messages: int, size: int,
                  batch_size: int, pull_batch_size: int, broker_pid: int | None) -> Run:
    """Time one listener mode over every stored message."""
    count = 0
    calls = 0
    first_at = last_at = 0.0
    done = asyncio.Event()
    consumer = PushConsumer(f"push_bench_{mode}_{os.getpid()}", namesrv, consume_from="FIRST",
                            consume_message_batch_max_size=batch_size if mode == "batch" else 1,
                            pull_batch_size=pull_batch_size)
    consumer.subscribe(topic, "*")

    def record(batch: list) -> None:
        nonlocal count, calls, first_at, last_at
        if not count:
            first_at = time.perf_counter()
        count += len(batch)
        calls += 1
        if count >= messages:
            last_at = time.perf_counter()
            done.set()

    if mode == "async":
        @consumer.listener
        async def on_messages_async(batch):
            record(batch)
    else:
        @consumer.listener
        def on_messages(batch):
            record(batch)

    started = time.perf_counter()
    await consumer.start()
    cpu_before = time.process_time()
    broker_before = process_cpu_s(broker_pid)
    try:
        await asyncio.wait_for(done.wait(), CONSUME_TIMEOUT_S)
    finally:
        cpu = time.process_time() - cpu_before
        broker_after = process_cpu_s(broker_pid)
        await consumer.close()
    broker_cpu = (round(broker_after - broker_before, 2)
                  if broker_before is not None and broker_after is not None else None)
    seconds = last_at - first_at
    return Run(mode=mode, messages=count, seconds=round(seconds, 3),
               msgs_per_s=round(count / seconds), mb_per_s=round(count * size / seconds / 1e6, 1),
               cpu_seconds=round(cpu, 3), msgs_per_cpu_s=round(count / cpu) if cpu else 0.0,
               broker_cpu_seconds=broker_cpu, startup_ms=round((first_at - started) * 1000, 1),
               listener_calls=calls)


async def bench(namesrv: str, broker_pid: int | None, args: argparse.Namespace) -> Report:
    topic = f"PushBench{os.getpid()}"
    rate = await fill(namesrv, topic, args.messages, args.size, args.queues)
    report = Report(args.messages, args.size, args.queues, args.batch_size,
                    args.pull_batch_size, round(rate))
    for mode in args.modes.split(","):
        report.runs.append(await consume(namesrv, topic, mode.strip(), args.messages,
                                         args.size, args.batch_size, args.pull_batch_size,
                                         broker_pid))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--modes", default="batch,single,async")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="messages per listener call in the batch mode")
    parser.add_argument("--pull-batch-size", type=int, default=256,
                        help="messages asked for per pull (the broker sends up to 1024)")
    parser.add_argument("--namesrv", help="use this running cluster instead of tidemq dev")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()

    def run(namesrv: str, broker_pid: int | None) -> Report:
        loop = new_event_loop()
        try:
            return loop.run_until_complete(bench(namesrv, broker_pid, args))
        finally:
            loop.close()

    if args.namesrv:
        report = run(args.namesrv, None)
    else:
        with dev_server() as (namesrv, pid):
            report = run(namesrv, pid)
    if args.json:
        print(orjson.dumps(asdict(report)).decode())
        return
    print(f"push consumer: {report.messages} messages of {report.size} B on {report.queues} "
          f"queues, listener batch {report.batch_size}, pull batch {report.pull_batch_size} "
          f"(filled at {report.produce_msgs_per_s} msg/s); {report.machine}")
    for r in report.runs:
        print(f"  {r.mode:7s} {r.msgs_per_s:>9,} msg/s  {r.mb_per_s:7.1f} MB/s  "
              f"{r.seconds:6.2f} s wall  {r.cpu_seconds:6.2f} s CPU "
              f"({r.msgs_per_cpu_s:>9,} msg per CPU-s)  "
              f"{r.listener_calls:>8,} listener calls  start-up {r.startup_ms:.0f} ms"
              + (f"  broker {r.broker_cpu_seconds:.2f} s CPU"
                 if r.broker_cpu_seconds is not None else ""))


if __name__ == "__main__":
    main()

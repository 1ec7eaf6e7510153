"""Transactional send benchmark (issue: transactional messages), runnable by anyone:

    .venv/bin/python benchmarks/transaction_bench.py [--messages 20000] [--size 128]
        [--concurrency 64] [--runs 3] [--namesrv HOST:PORT] [--json]

Unless ``--namesrv`` names a running cluster, it starts ``tidemq dev`` (name server and
broker in one process, ASYNC_FLUSH, its own store in a temporary folder; broker_bench's
DevServer) on free loopback ports and stops it at the end. The client runs in this process,
so broker and client each have their own interpreter, as in production.

Two figures per run, each on a fresh topic, the median of ``--runs`` runs reported:

- ``transaction``: ``TransactionProducer.send_in_transaction`` with a no-op local transaction
  (it returns COMMIT), ``--concurrency`` coroutines sending ``--messages`` in all: the half
  message, then END_TRANSACTION (oneway), as the Java client does;
- ``plain``: ``Producer.send`` of the same messages, the baseline a transaction adds to.

Each line gives messages per second of wall time, latency percentiles of one call, and CPU:
the client's (this process) and, when the broker is ours, the broker process's from
/proc (``broker CPU µs/msg``). The shared machines these run on make wall-clock rates move
with the neighbours' load; broker CPU per message is the figure to compare across sessions,
and ``msg per broker-CPU s`` is the rate one idle core would give the broker. After the
transaction runs it checks that every committed message is in the topic (queue max offsets).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from dataclasses import asdict, dataclass

from broker_bench import DevServer
from idle import process_cpu_s
from tidemq.client import Admin, Message, Producer
from tidemq.client.transaction_producer import TransactionProducer, TransactionState
from tidemq.remoting.loop import run


@dataclass(slots=True)
class Figure:
    """One run of one figure."""

    name: str
    messages: int
    wall_s: float
    client_cpu_s: float
    broker_cpu_s: float | None
    p50_ms: float
    p99_ms: float

    @property
    def msg_per_s(self) -> float:
        return self.messages / self.wall_s

    @property
    def broker_cpu_us_per_msg(self) -> float | None:
        if self.broker_cpu_s is None:
            return None
        return self.broker_cpu_s / self.messages * 1e6


def _commit(message: Message) -> TransactionState:
    return TransactionState.COMMIT  # the no-op local transaction


async def _measure(name: str, namesrv: str, topic: str, messages: int, size: int,
                   concurrency: int, server: DevServer | None) -> Figure:
    body = os.urandom(size)
    transactional = name == "transaction"
    producer_class = TransactionProducer if transactional else Producer
    async with producer_class(f"bench-{name}", namesrv) as producer:
        async def one() -> None:
            if transactional:
                await producer.send_in_transaction(Message(topic, body), _commit)
            else:
                await producer.send(Message(topic, body))

        await one()  # route lookup, topic creation, connections: not measured
        latencies: list[float] = []
        left = messages

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                started = time.perf_counter()
                await one()
                latencies.append(time.perf_counter() - started)

        broker_before = process_cpu_s(server.process.pid) if server else None
        client_before = time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall_s = time.perf_counter() - started
        client_cpu_s = time.process_time() - client_before
        await asyncio.sleep(0.2)  # the last END_TRANSACTIONs are oneway: let the broker act
        broker_cpu_s = (process_cpu_s(server.process.pid) - broker_before
                        if server and broker_before is not None else None)
    latencies.sort()
    return Figure(
        name, messages, wall_s, client_cpu_s, broker_cpu_s,
        latencies[len(latencies) // 2] * 1000, latencies[int(len(latencies) * 0.99)] * 1000,
    )


async def _stored_count(namesrv: str, topic: str, expected: int) -> int:
    """Messages in ``topic`` (sum of its queues' max offsets), waiting (bounded) for
    ``expected``: the ends are oneway, so the last commits may still be on their way."""
    async with Admin(namesrv) as admin:
        count = 0
        for _ in range(100):
            stats = await admin.topic_stats(topic)
            count = sum(offsets.max_offset for offsets in stats.values())
            if count >= expected:
                break
            await asyncio.sleep(0.1)
        return count


def _median(figures: list[Figure]) -> Figure:
    return sorted(figures, key=lambda f: f.msg_per_s)[len(figures) // 2]


def machine_description() -> str:
    """CPU model, core count, Python and OS: what a reader needs to compare figures."""
    model = platform.processor() or "unknown cpu"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{model}, {os.cpu_count()} cores, load average {load:.1f}, Python "
            f"{platform.python_version()}, {platform.system()} {platform.release()}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=128, help="body bytes")
    parser.add_argument("--concurrency", type=int, default=64, help="sends in flight")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--namesrv", help="use this running cluster instead of tidemq dev")
    parser.add_argument("--json", action="store_true", help="one JSON object as output")
    args = parser.parse_args(argv)
    # Started before the try: a DevServer that fails to start stops itself.
    server = None if args.namesrv else DevServer(log_level="warning")
    try:
        namesrv = args.namesrv or server.namesrv  # type: ignore[union-attr]
        if not args.json:
            print(f"machine: {machine_description()}")
            print(f"messages {args.messages} x {args.size} B, concurrency {args.concurrency}, "
                  f"runs {args.runs}, broker {'tidemq dev (ASYNC_FLUSH)' if server else namesrv}")
        results: dict[str, list[Figure]] = {"transaction": [], "plain": []}
        missing = 0
        for run_index in range(args.runs):
            for name in results:
                topic = f"TxBench{name.title()}{run_index}-{os.getpid()}"
                figure = run(_measure(name, namesrv, topic, args.messages, args.size,
                                      args.concurrency, server))
                results[name].append(figure)
                if name == "transaction":
                    expected = args.messages + 1  # the warm-up transaction too
                    missing += expected - run(_stored_count(namesrv, topic, expected))
        summary = {name: _median(figures) for name, figures in results.items()}
        if args.json:
            print(json.dumps({
                "machine": machine_description(), "parameters": vars(args),
                "missing_committed_messages": missing,
                "figures": {name: {**asdict(f), "msg_per_s": f.msg_per_s,
                                   "broker_cpu_us_per_msg": f.broker_cpu_us_per_msg}
                            for name, f in summary.items()},
            }))
            return
        for name, figure in summary.items():
            broker = ""
            if figure.broker_cpu_us_per_msg is not None:
                broker = (f", broker CPU {figure.broker_cpu_us_per_msg:.0f} µs/msg "
                          f"({1e6 / figure.broker_cpu_us_per_msg:,.0f} msg per broker-CPU s)")
            print(f"{name:12s} {figure.msg_per_s:10,.0f} msg/s, p50 {figure.p50_ms:.1f} ms, "
                  f"p99 {figure.p99_ms:.1f} ms, client CPU "
                  f"{figure.client_cpu_s / figure.messages * 1e6:.0f} µs/msg{broker}")
        print(f"committed messages missing from their topic: {missing}")
    finally:
        if server:
            server.stop()


if __name__ == "__main__":
    main()

"""Batch produce, tidemq against Redis Streams in one harness (issue 18, "Durable throughput"):

    .venv/bin/python benchmarks/redis_compare.py [--runs 3] [--messages 200000] [--size 1024]
        [--batch 64] [--concurrency 16] [--redis-server PATH] [--redis-client resp|redis-py]
        [--json]

Each run measures, in turn (the order alternates from run to run, so a neighbour's burst
does not always land on the same side):

- ``tidemq``: a fresh ``tidemq dev`` with ASYNC_FLUSH (broker_bench.DevServer), driven by
  ``tidemq bench produce -b BATCH -c CONCURRENCY`` in its own process: batches of ``--batch``
  messages of ``--size`` bytes per request, ``--concurrency`` requests in flight;
- ``redis``: a fresh ``redis-server`` (Debian's package; ``apt-get install redis-server``) on a
  free loopback port with its own directory, appendonly with ``appendfsync everysec`` (the
  durability of ASYNC_FLUSH: up to a second lost on a power cut), no RDB snapshots and no
  automatic AOF rewrite (a rewrite of the growing stream would fork and copy it in the
  middle of the run; leaving it out favours Redis), driven by this script's ``--client``
  mode in its own process: ``--concurrency`` connections, each sending ``--batch`` XADDs of
  one ``--size``-byte field pipelined per round trip and reading every reply before its next
  round trip; one stream (Redis runs a stream on one thread either way). RESP is encoded
  here (a few lines) so the benchmark needs no client library. At the end the client reads
  XLEN: every acknowledged entry must be in the stream.

``--redis-client`` chooses Redis's client: ``resp`` (the default) is the minimal encoder above,
the least client work Redis can be driven with from Python; ``redis-py`` is Redis's own Python
client (``redis`` with the ``hiredis`` parser, pinned below, each connection a non-transaction
pipeline of ``--batch`` XADDs), what a Python user of Redis runs. redis-py is not a tidemq
dependency: on first use the harness installs it into a folder of its own under ``--dir``
(``pip install --target``, from PyPI) and runs the Redis client with that folder on its path.

Both clients are Python on an asyncio loop (uvloop where installed) and create a message's
request from the same body each time. Printed: both rates, the ratio tidemq/Redis per run
and its median, each server's CPU µs per message (from /proc/<pid>/stat, the steadier figure
on a shared machine), and the load average at the start and the end. Servers are stopped by
PID. Servers and clients inherit the harness's scheduling: ``chrt -f 5 .venv/bin/python
benchmarks/redis_compare.py`` stands in for a quiet machine (say so when quoting figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from broker_bench import (
    DevServer,
    children_cpu_s,
    free_port,
    produce_with_cpu,
    stop_process,
)
from idle import process_cpu_s, wait_process_idle
from latency_bench import load_average
from store_bench import machine_description

STREAM = b"tidemq-compare"
# Calibration runs this short cost about the client's start-up alone; their CPU is
# subtracted from the measured run's, as broker_bench does for tidemq.
CALIBRATION_MESSAGES = 256


def resp_command(*parts: bytes) -> bytes:
    """One RESP array of bulk strings (the request encoding of every Redis command)."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


def count_replies(buffer: bytearray, start: int, wanted: int) -> tuple[int, int]:
    """Complete RESP replies (simple, integer, bulk) in ``buffer`` from ``start``, at most
    ``wanted``: (replies, position after the last). An error reply raises RuntimeError."""
    got, position = 0, start
    while got < wanted:
        end = buffer.find(b"\r\n", position)
        if end < 0:
            break
        kind = buffer[position]
        if kind == 0x2D:  # '-': an error reply
            raise RuntimeError(f"redis answered {bytes(buffer[position:end]).decode()!r}")
        if kind == 0x24:  # '$': a bulk string, its length first
            length = int(buffer[position + 1:end])
            stop = end + 2 + (length + 2 if length >= 0 else 0)
            if len(buffer) < stop:
                break
            position = stop
        else:  # '+' or ':'
            position = end + 2
        got += 1
    return got, position


async def _round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      request: bytes, replies: int) -> bytearray:
    writer.write(request)
    buffer = bytearray()
    got = position = 0
    while got < replies:
        data = await reader.read(1 << 16)
        if not data:
            raise ConnectionError("redis closed the connection")
        buffer += data
        more, position = count_replies(buffer, position, replies - got)
        got += more
    return buffer


async def redis_produce(port: int, count: int, size: int, batch: int,
                        concurrency: int) -> dict:
    """XADD ``count`` entries of ``size`` bytes: ``concurrency`` connections, ``batch``
    commands pipelined per round trip. Returns msgs_per_s, seconds, messages, stream_length."""
    body = (os.urandom(64) * (size // 64 + 1))[:size]
    head = b"*5\r\n$4\r\nXADD\r\n$%d\r\n%s\r\n$1\r\n*\r\n$1\r\nb\r\n$%d\r\n" % (
        len(STREAM), STREAM, size)
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(concurrency)]
    claimed = [0]
    done = [0]

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            take = min(batch, count - claimed[0])
            if take <= 0:
                return
            claimed[0] += take
            # A request per batch built from the body each time, as the tidemq client
            # builds its batch from Message objects.
            request = b"".join([head, body, b"\r\n"] * take)
            await _round_trip(reader, writer, request, take)
            done[0] += take

    await _round_trip(*connections[0], resp_command(b"XADD", STREAM, b"*", b"b", body), 1)
    started = time.perf_counter()
    await asyncio.gather(*(worker(r, w) for r, w in connections))
    seconds = time.perf_counter() - started
    reply = await _round_trip(*connections[0], resp_command(b"XLEN", STREAM), 1)
    stream_length = int(bytes(reply[1:reply.find(b"\r\n")]))
    for _, writer in connections:
        writer.close()
    return {"msgs_per_s": done[0] / seconds, "seconds": seconds, "messages": done[0],
            "stream_length": stream_length}


async def redis_py_produce(port: int, count: int, size: int, batch: int,
                           concurrency: int) -> dict:
    """As ``redis_produce``, through redis-py: one client per connection, ``batch`` XADDs
    per non-transaction pipeline."""
    import redis.asyncio as redis_asyncio  # from redis_py_dir (REDIS_PY_REQUIREMENTS)

    body = (os.urandom(64) * (size // 64 + 1))[:size]
    clients = [redis_asyncio.Redis(host="127.0.0.1", port=port, single_connection_client=True)
               for _ in range(concurrency)]
    claimed = [0]
    done = [0]

    async def worker(client: redis_asyncio.Redis) -> None:
        while True:
            take = min(batch, count - claimed[0])
            if take <= 0:
                return
            claimed[0] += take
            pipe = client.pipeline(transaction=False)
            for _ in range(take):
                pipe.xadd(STREAM, {b"b": body})
            await pipe.execute()
            done[0] += take

    await clients[0].xadd(STREAM, {b"b": body})
    started = time.perf_counter()
    await asyncio.gather(*(worker(client) for client in clients))
    seconds = time.perf_counter() - started
    stream_length = await clients[0].xlen(STREAM)
    for client in clients:
        await client.aclose()
    return {"msgs_per_s": done[0] / seconds, "seconds": seconds, "messages": done[0],
            "stream_length": stream_length}


# redis-py with its C reply parser, pinned; installed beside, not into, the environment.
REDIS_PY_REQUIREMENTS = ("redis==8.1.0", "hiredis==3.5.0")


def redis_py_dir(base_dir: str) -> str:
    """A folder holding REDIS_PY_REQUIREMENTS (``pip install --target``), made on first use;
    the Redis client runs with it first on its PYTHONPATH."""
    target = os.path.join(base_dir, "redis-py")
    marker = os.path.join(target, "tidemq-bench-requirements.txt")
    wanted = "\n".join(REDIS_PY_REQUIREMENTS)
    if os.path.exists(marker):
        with open(marker) as file:
            if file.read() == wanted:
                return target
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", target,
                    *REDIS_PY_REQUIREMENTS], check=True, timeout=600)
    with open(marker, "w") as file:
        file.write(wanted)
    return target


def wait_for_port(port: int, timeout_s: float = 60,
                  process: subprocess.Popen | None = None) -> None:
    """Wait until redis-server accepts connections on ``port`` (bounded). For Redis that is
    readiness: a fresh, empty data directory has nothing to load first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"redis-server exited ({process.returncode}) before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"redis-server did not listen on port {port} within {timeout_s:g} s")


class RedisServer:
    """A ``redis-server`` on a free loopback port with its own directory; stopped by PID."""

    def __init__(self, binary: str, work_dir: str):
        self.port = free_port()
        self.log = open(os.path.join(work_dir, "redis.log"), "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port),
             "--dir", work_dir, "--daemonize", "no", "--save", "", "--appendonly", "yes",
             "--appendfsync", "everysec", "--auto-aof-rewrite-percentage", "0",
             "--protected-mode", "no", "--logfile", ""],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=work_dir,
        )
        try:
            wait_for_port(self.port, process=self.process)
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        stop_process(self.process, self.log, grace_s=20)


def scheduling() -> str:
    """This process's scheduling policy (children inherit it): what the figures ran under."""
    policy = os.sched_getscheduler(0)
    if policy == os.SCHED_FIFO:
        return f"SCHED_FIFO {os.sched_getparam(0).sched_priority} (chrt -f)"
    return f"SCHED_OTHER nice {os.nice(0)}" if policy == os.SCHED_OTHER else str(policy)


def run_client(port: int, count: int, args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    if args.redis_client == "redis-py":  # main() installed it before any measurement
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [redis_py_dir(args.dir), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, __file__, "--client", str(port), "--messages",
         str(count), "--size", str(args.size), "--batch", str(args.batch), "--concurrency",
         str(args.concurrency), "--redis-client", args.redis_client],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"redis client failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_redis(args: argparse.Namespace, work_dir: str) -> dict:
    server = RedisServer(args.redis_server, work_dir)
    try:
        pid = server.process.pid
        wait_process_idle(pid)
        figures = []
        for count in (CALIBRATION_MESSAGES, args.messages):
            cpu, client = process_cpu_s(pid), children_cpu_s()
            summary = run_client(server.port, count, args)
            summary["server_cpu_s"] = process_cpu_s(pid) - cpu
            summary["client_cpu_s"] = children_cpu_s() - client
            figures.append(summary)
        calibration, summary = figures
        if summary["stream_length"] != calibration["messages"] + summary["messages"] + 2:
            raise RuntimeError(f"redis stream holds {summary['stream_length']} entries, "
                               f"{calibration['messages'] + summary['messages'] + 2} were "
                               "acknowledged")
        extra = summary["messages"] - calibration["messages"]
        return {"msgs_per_s": summary["msgs_per_s"],
                "server_cpu_us": (summary["server_cpu_s"] - calibration["server_cpu_s"])
                / extra * 1e6,
                "client_cpu_us": (summary["client_cpu_s"] - calibration["client_cpu_s"])
                / extra * 1e6}
    finally:
        server.stop()


def measure_tidemq(args: argparse.Namespace, work_dir: str) -> dict:
    server = DevServer(work_dir, extra_args=["--flushDiskType", "ASYNC_FLUSH"])
    try:
        summary = produce_with_cpu(server, "Compare", args.messages, "-s", str(args.size),
                                   "-b", str(args.batch), "-c", str(args.concurrency))
    finally:
        server.stop()
    return {"msgs_per_s": summary["msgs_per_s"],
            "server_cpu_us": summary["broker_cpu_us_per_msg"],
            "client_cpu_us": summary["client_cpu_us_per_msg"]}


def run_redis_client(coroutine: object) -> dict:
    """Run the client on uvloop where installed, as tidemq's client runs."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)  # type: ignore[arg-type]
    return uvloop.run(coroutine)  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    parser.add_argument("--redis-client", choices=("resp", "redis-py"), default="resp",
                        help="Redis's client: this harness's minimal RESP encoder, or redis-py "
                             "(installed in a side environment on first use)")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--client", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client is not None:
        produce = redis_produce if args.redis_client == "resp" else redis_py_produce
        print(json.dumps(run_redis_client(produce(args.client, args.messages, args.size,
                                                  args.batch, args.concurrency))))
        return 0
    if shutil.which(args.redis_server) is None:
        print(f"redis-server not found at {args.redis_server!r}: install Debian's package "
              "(apt-get install -y redis-server) or pass --redis-server PATH", file=sys.stderr)
        return 2
    os.makedirs(args.dir, exist_ok=True)
    if args.redis_client == "redis-py":
        redis_py_dir(args.dir)  # installs on first use, outside every measured run's CPU
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = load_average()
    sides = {"tidemq": measure_tidemq, "redis": measure_redis}
    runs: list[dict[str, dict]] = []
    for run in range(args.runs):
        order = list(sides) if run % 2 == 0 else list(reversed(sides))
        figures: dict[str, dict] = {}
        for side in order:
            work_dir = tempfile.mkdtemp(prefix=f"compare-{side}-", dir=args.dir)
            try:
                figures[side] = sides[side](args, work_dir)
            finally:
                shutil.rmtree(work_dir, ignore_errors=True)
            if not args.json:
                got = figures[side]
                print(f"run {run + 1} {side}: {got['msgs_per_s']:,.0f} msg/s, server "
                      f"{got['server_cpu_us']:.1f} us/msg, client {got['client_cpu_us']:.1f} "
                      "us/msg", flush=True)
        figures["ratio"] = {"msgs_per_s": figures["tidemq"]["msgs_per_s"]
                            / figures["redis"]["msgs_per_s"]}
        runs.append(figures)
    load_after = load_average()
    if args.json:
        print(json.dumps({"started": started, "machine": machine_description(),
                          "load_average": [load_before, load_after], "scheduling": scheduling(),
                          "redis_client": args.redis_client,
                          "runs": runs}))
        return 0
    print(f"\n{started}, {machine_description()}; load average {load_before} -> {load_after}"
          f"; scheduling policy {scheduling()}")
    print(f"{args.messages} x {args.size} B, batches of {args.batch}, {args.concurrency} in "
          f"flight; Redis client {args.redis_client}; median of {args.runs} (runs)")
    for side in sides:
        rates = [r[side]["msgs_per_s"] for r in runs]
        cpus = [r[side]["server_cpu_us"] for r in runs]
        clients = [r[side]["client_cpu_us"] for r in runs]
        print(f"{side}: {statistics.median(rates):,.0f} msg/s "
              f"({'; '.join(f'{x:,.0f}' for x in rates)}), server "
              f"{statistics.median(cpus):.1f} us/msg ({'; '.join(f'{x:.1f}' for x in cpus)}), "
              f"client {statistics.median(clients):.1f} us/msg")
    ratios = [r["ratio"]["msgs_per_s"] for r in runs]
    print(f"tidemq/redis: {statistics.median(ratios):.2f} "
          f"({'; '.join(f'{x:.2f}' for x in ratios)}); target >= 1.5")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Broker benchmarks (issue: name server, broker and client), runnable by anyone:

    .venv/bin/python benchmarks/broker_bench.py [--runs 3] [--messages 200000] [--size 1024]

Starts its own ``tidemq dev`` (name server + broker, ASYNC_FLUSH, a fresh store in a temporary
directory, free loopback ports) and drives it with ``tidemq bench`` in separate processes, so
client and broker each have a process, as a user would run them. Figures, median of ``--runs``:

- ``produce_batch``: batches of 64 x 1 KiB, 16 requests in flight, msg/s;
- ``produce_async_single``: single messages, 64 in flight, msg/s;
- ``consume_pull``: pull everything from the first offset, msg/s;
- ``e2e_latency_at_2000``: a consumer waits at the end of a fresh topic while a producer offers
  2,000 single messages a second for ``--latency-seconds``; p50/p99/p999 of now - born time.

It prints its parameters and the machine first, then one line per figure (``--json``: one JSON
object).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from store_bench import machine_description

VENV_BIN = os.path.dirname(sys.executable)
TIDEMQ = os.path.join(VENV_BIN, "tidemq")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"tidemq dev did not listen on port {port} within {timeout_s} s")


class DevServer:
    """A ``tidemq dev`` process on free ports with its own store; stopped by PID."""

    def __init__(self, work_dir: str):
        self.namesrv_port = free_port()
        broker_port = free_port()
        while broker_port - 2 == self.namesrv_port:
            broker_port = free_port()
        self.log = open(os.path.join(work_dir, "dev.log"), "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [TIDEMQ, "dev", "--namesrvPort", str(self.namesrv_port),
             "--listenPort", str(broker_port),
             "--storePathRootDir", os.path.join(work_dir, "store")],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=work_dir,
        )
        wait_for_port(broker_port)
        self.namesrv = f"127.0.0.1:{self.namesrv_port}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def bench(namesrv: str, *args: str, timeout_s: float = 300) -> dict:
    """Run ``tidemq bench ... --json`` and return its summary."""
    out = subprocess.run(
        [TIDEMQ, "bench", *args, "-n", namesrv, "--json"],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"tidemq bench {' '.join(args)} failed: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def one_run(args: argparse.Namespace, run: int) -> dict[str, dict]:
    work_dir = tempfile.mkdtemp(prefix="broker-bench-", dir=args.dir)
    server = DevServer(work_dir)
    try:
        size = str(args.size)
        results = {
            "produce_batch": bench(server.namesrv, "produce", "-t", "BenchBatch", "-s", size,
                                   "-b", "64", "-c", "16", "--count", str(args.messages)),
            "produce_async_single": bench(server.namesrv, "produce", "-t", "BenchSingle",
                                          "-s", size, "-b", "0", "-c", "64",
                                          "--count", str(args.messages // 4)),
            "consume_pull": bench(server.namesrv, "consume", "-t", "BenchBatch", "--from",
                                  "first", "--count", str(args.messages)),
        }
        bench(server.namesrv, "produce", "-t", "BenchLatency", "-b", "0", "-c", "1",
              "--count", "1")  # creates the topic so the consumer finds its queues
        # The consumer must be waiting at the end of the topic before the paced producer starts.
        consumer = subprocess.Popen(
            [TIDEMQ, "bench", "consume", "-n", server.namesrv, "-t", "BenchLatency", "-g",
             f"LATENCY_{run}", "--from", "last", "--latency", "--seconds",
             str(args.latency_seconds + 6), "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        time.sleep(4)
        bench(server.namesrv, "produce", "-t", "BenchLatency", "-s", size, "-b", "0",
              "-c", "16", "--rate", "2000", "--seconds", str(args.latency_seconds))
        stdout, stderr = consumer.communicate(timeout=args.latency_seconds + 60)
        if consumer.returncode != 0:
            raise RuntimeError(f"latency consumer failed: {stderr.strip()}")
        results["e2e_latency_at_2000"] = json.loads(stdout.strip().splitlines()[-1])
        return results
    finally:
        server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--latency-seconds", type=float, default=10)
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    if not args.json:
        print(f"broker bench: {args.messages} x {args.size} B, median of {args.runs}, "
              f"tidemq dev with ASYNC_FLUSH; {time.strftime('%Y-%m-%d')}")
        print(f"machine: {machine_description()}")
    runs = [one_run(args, run) for run in range(args.runs)]
    figures: dict[str, object] = {"machine": machine_description(),
                                  "date": time.strftime("%Y-%m-%d"), "runs": args.runs}
    for name in ("produce_batch", "produce_async_single", "consume_pull"):
        rates = [r[name]["msgs_per_s"] for r in runs]
        figures[name] = statistics.median(rates)
        if not args.json:
            print(f"{name}: {statistics.median(rates):,.0f} msg/s "
                  f"(runs: {', '.join(f'{x:,.0f}' for x in rates)})")
    latency = {q: statistics.median(r["e2e_latency_at_2000"][f"latency_ms_{q}"] for r in runs)
               for q in ("p50", "p99", "p999")}
    figures["e2e_latency_at_2000_ms"] = latency
    if not args.json:
        print(f"e2e latency at 2,000 msg/s: p50 {latency['p50']:.1f} ms, p99 "
              f"{latency['p99']:.1f} ms, p999 {latency['p999']:.1f} ms")
    else:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replication benchmarks (issue 11), runnable by anyone:

    .venv/bin/python benchmarks/ha_bench.py [--runs 3] [--messages 100000] [--size 1024]

Each run starts its own processes on free loopback ports (a name server, brokers, and
``tidemq bench`` clients, each in its own process, as a user would run them), with fresh
stores in a temporary directory, ASYNC_FLUSH everywhere, and measures, in this order:

- ``lag_at_2000`` (ASYNC_MASTER + a slave): a producer offers 2,000 single 1 KiB messages a
  second for ``--lag-seconds``; the slave's ``haReplicationLagMs`` (brokerStatus) gives p50 /
  p99 / max of "dispatched on the slave" minus "stored on the master" over that time (each
  sample is the oldest record of one dispatch, an upper bound for the others in it), and how
  long the master's and the slave's event loops waited for a core meanwhile (ms per s);
- ``produce_batch_async`` (the same pair): batches of 64 x ``--size``, 16 in flight, msg/s;
- ``catch_up`` (the same master): a second slave starts from an empty disk; commit-log bytes
  copied per second from its start (ready to serve) until it holds the master's end, and per
  CPU second of the slave and of the master (/proc/<pid>/stat), the steadier figures when
  the machine is shared: wall-clock speed is what is left of two cores after everyone else;
  ``catch_up_readable``: the same until its dispatch is done too (dispatchBehindBytes 0: the
  slave dispatches behind the copy, broker/ha/replica_dispatch.py);
- ``produce_batch_sync`` (SYNC_MASTER + a slave, fresh): as produce_batch_async;
- ``produce_batch_single`` (one ASYNC_MASTER, no slave): as produce_batch_async, the
  single-broker figure beside the replicated ones.

Ratios (sync / async, async / single) are taken within each run, then the median of the
runs is printed: the machine is shared and noisy, absolute figures move between runs. It
prints its parameters, the machine and the load average first.
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
from pathlib import Path

from broker_bench import free_port, stop_process
from idle import main_thread_sched_s, process_cpu_s, wait_process_idle
from store_bench import machine_description
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.frame import FrameDecoder

VENV_BIN = os.path.dirname(sys.executable)
TIDEMQ = os.path.join(VENV_BIN, "tidemq")
READY_MARKER = "Ctrl-C to stop"
SEGMENT_BYTES = 256 * 1024 * 1024  # fewer rolls than the tests' 16 MiB, less than 1 GiB of disk


class Server:
    """One ``tidemq namesrv|broker`` process; stopped by PID."""

    def __init__(self, work_dir: str, name: str, kind: str, args: list[str]) -> None:
        # Below the ephemeral range, with a broker's VIP (-2) and HA (+1) ports free too.
        self.port = free_port(neighbours=(-2, 1))
        self.addr = f"127.0.0.1:{self.port}"
        self.log_path = os.path.join(work_dir, f"{name}.log")
        self.log = open(self.log_path, "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [TIDEMQ, kind, "--listenPort", str(self.port), *args],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=work_dir,
        )
        deadline = time.monotonic() + 60
        while READY_MARKER not in Path(self.log_path).read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: see {self.log_path}")
            time.sleep(0.02)
        self.ready_at = time.monotonic()

    def stop(self) -> None:
        stop_process(self.process, self.log, grace_s=30)


def broker(work_dir: str, name: str, namesrv: Server, **settings: str) -> Server:
    args = ["-n", namesrv.addr, "--brokerName", "broker-a",
            "--storePathRootDir", os.path.join(work_dir, name),
            "--mappedFileSizeCommitLog", str(SEGMENT_BYTES)]
    for key, value in settings.items():
        args += [f"--{key}", value]
    return Server(work_dir, name, "broker", args)


def runtime(addr: str) -> dict[str, str]:
    """GET_BROKER_RUNTIME_INFO over one plain socket (what ``tidemq admin brokerStatus``
    prints), without starting a process per poll."""
    host, _, port = addr.rpartition(":")
    request = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
    decoder = FrameDecoder()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request.encode())
        while True:
            data = sock.recv(65536)
            if not data:
                raise RuntimeError(f"{addr} closed the connection without answering")
            commands = decoder.feed(data)
            if commands:
                return {str(k): str(v)
                        for k, v in jsonx.loads(commands[0].body or b"{}")["table"].items()}


def wait_caught_up(master: Server, slave: Server, timeout_s: float = 600) -> float:
    """Seconds from now until the slave's commit log ends where the master's does."""
    target = int(runtime(master.addr)["commitLogMaxOffset"])
    deadline = time.monotonic() + timeout_s
    while int(runtime(slave.addr)["commitLogMaxOffset"]) < target:
        if time.monotonic() > deadline:
            raise RuntimeError(f"slave did not catch up within {timeout_s} s")
        time.sleep(0.05)
    return time.monotonic()


def bench(namesrv: Server, *args: str, timeout_s: float = 600) -> dict:
    out = subprocess.run([TIDEMQ, "bench", *args, "-n", namesrv.addr, "--json"],
                         capture_output=True, text=True, timeout=timeout_s, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"tidemq bench {' '.join(args)} failed: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def produce_batch(namesrv: Server, master: Server, args: argparse.Namespace, topic: str
                  ) -> float:
    bench(namesrv, "produce", "-t", topic, "-s", str(args.size), "-b", "64", "--count", "256")
    wait_process_idle(master.process.pid)
    summary = bench(namesrv, "produce", "-t", topic, "-s", str(args.size), "-b", "64",
                    "-c", "16", "--count", str(args.messages))
    return summary["msgs_per_s"]


def one_run(args: argparse.Namespace) -> dict[str, float]:
    work_dir = tempfile.mkdtemp(prefix="ha-bench-", dir=args.dir)
    servers: list[Server] = []
    results: dict[str, float] = {}
    try:
        namesrv = Server(work_dir, "namesrv", "namesrv", [])
        servers.append(namesrv)
        master = broker(work_dir, "async-master", namesrv, brokerRole="ASYNC_MASTER")
        servers.append(master)
        slave = broker(work_dir, "async-slave", namesrv, brokerRole="SLAVE", brokerId="1")
        servers.append(slave)
        bench(namesrv, "produce", "-t", "BenchLag", "-s", "1024", "-b", "0", "--count", "16")
        wait_caught_up(master, slave, 120)
        wait_process_idle(master.process.pid)
        wait_process_idle(slave.process.pid)
        waits = {name: main_thread_sched_s(server.process.pid)[1]
                 for name, server in (("master", master), ("slave", slave))}
        started = time.monotonic()
        bench(namesrv, "produce", "-t", "BenchLag", "-s", "1024", "-b", "0", "-c", "16",
              "--rate", "2000", "--seconds", str(args.lag_seconds))
        # How long each broker's event loop was ready to run and waited for a core: the
        # machine's share of the lag, not the code's.
        elapsed = time.monotonic() - started
        for name, server in (("master", master), ("slave", slave)):
            results[f"lag_{name}_core_wait_ms_per_s"] = (
                main_thread_sched_s(server.process.pid)[1] - waits[name]) * 1000 / elapsed
        wait_caught_up(master, slave, 120)
        lag = runtime(slave.addr)["haReplicationLagMs"].split()
        results.update(lag_p50_ms=float(lag[1]), lag_p99_ms=float(lag[3]),
                       lag_max_ms=float(lag[5]))
        if args.lag_only:
            return results
        results["produce_batch_async"] = produce_batch(namesrv, master, args, "BenchAsync")
        wait_caught_up(master, slave)
        wait_process_idle(master.process.pid)
        wait_process_idle(slave.process.pid)
        fresh = broker(work_dir, "fresh-slave", namesrv, brokerRole="SLAVE", brokerId="2")
        servers.append(fresh)
        start = fresh.ready_at
        slave_cpu = process_cpu_s(fresh.process.pid)
        master_cpu = process_cpu_s(master.process.pid)
        copied = int(runtime(master.addr)["commitLogMaxOffset"]) - int(
            runtime(master.addr)["commitLogMinOffset"])
        done = wait_caught_up(master, fresh)
        results["catch_up_mb_per_s"] = copied / (done - start) / 1e6
        deadline = time.monotonic() + 600
        while int(runtime(fresh.addr).get("dispatchBehindBytes", "0")) > 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the fresh slave's dispatch did not finish within 600 s")
            time.sleep(0.02)
        results["catch_up_readable_mb_per_s"] = copied / (time.monotonic() - start) / 1e6
        results["catch_up_mb"] = copied / 1e6
        # The steadier figures on a shared machine: MB copied per CPU second of each side.
        results["catch_up_mb_per_slave_cpu_s"] = copied / 1e6 / max(
            1e-6, process_cpu_s(fresh.process.pid) - slave_cpu)
        results["catch_up_mb_per_master_cpu_s"] = copied / 1e6 / max(
            1e-6, process_cpu_s(master.process.pid) - master_cpu)
        for server in (fresh, slave, master):
            server.stop()
            servers.remove(server)
        master = broker(work_dir, "sync-master", namesrv, brokerRole="SYNC_MASTER")
        servers.append(master)
        slave = broker(work_dir, "sync-slave", namesrv, brokerRole="SLAVE", brokerId="1")
        servers.append(slave)
        bench(namesrv, "produce", "-t", "BenchSync", "-s", "1024", "-b", "0", "--count", "16")
        wait_caught_up(master, slave, 120)
        results["produce_batch_sync"] = produce_batch(namesrv, master, args, "BenchSync")
        for server in (slave, master):
            server.stop()
            servers.remove(server)
        single = broker(work_dir, "single", namesrv, brokerRole="ASYNC_MASTER",
                        brokerName="broker-b")
        servers.append(single)
        results["produce_batch_single"] = produce_batch(namesrv, single, args, "BenchSingle")
        results["sync_over_async"] = results["produce_batch_sync"] / results[
            "produce_batch_async"]
        results["async_over_single"] = results["produce_batch_async"] / results[
            "produce_batch_single"]
        return results
    finally:
        for server in reversed(servers):
            server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--lag-seconds", type=float, default=10)
    parser.add_argument("--lag-only", action="store_true",
                        help="measure only the replication lag at 2,000 msg/s (the first figure)")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    header = (f"ha bench: {args.messages} x {args.size} B batches of 64, median of {args.runs}, "
              f"ASYNC_FLUSH; {time.strftime('%Y-%m-%d')}; load average at start "
              f"{os.getloadavg()[0]:.2f}")
    if not args.json:
        print(header)
        print(f"machine: {machine_description()}")
    runs = []
    for _ in range(args.runs):
        runs.append(one_run(args))
        if not args.json:
            print("run: " + ", ".join(f"{k} {v:,.2f}" for k, v in runs[-1].items()), flush=True)
    figures = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    figures["load_average_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"header": header, "machine": machine_description(), **figures}))
    else:
        for key, value in figures.items():
            print(f"{key}: {value:,.2f} (runs: {', '.join(f'{r[key]:,.2f}' for r in runs)})"
                  if key in runs[0] else f"{key}: {value:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

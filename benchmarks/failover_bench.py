"""Automatic failover benchmarks (issue 12), runnable by anyone with etcd installed:

    .venv/bin/python benchmarks/failover_bench.py [--rounds 10] [--runs 3] [--messages 50000]

Two figures, each on its own processes on free loopback ports (etcd, a name server, a
``tidemq controller`` and brokers of one group, in a temporary directory; tests/failover_group.py
starts them):

- ``failover_ms``: three SYNC_MASTER + SYNC_FLUSH brokers in controller mode with the
  documented default timings (controllerHeartBeatTimeoutMills 3000, brokerHeartbeatInterval
  500, controllerFenceMarginMills 1000; the controller scans every 100 ms), two producers
  sending single messages. Each round SIGKILLs the master and measures the time from the kill
  to the first SEND_OK whose offset msg id names another broker; the killed broker is
  started again and the round ends when it is back in the sync-state set. The distribution
  over ``--rounds`` is printed (min, median, p90, max), and how many rounds met the issue's
  10 s bound.
- ``produce_ratio``: batches of 64 x 1 KiB, 16 in flight (``tidemq bench produce``) to a
  SYNC_MASTER + one slave (ASYNC_FLUSH), once as a static pair and once in controller mode,
  alternating, ``--runs`` times each; the ratio controller / static of msg/s and of the
  master's CPU time per message (/proc, the steadier figure on a shared machine) is taken
  within each pair of runs and the medians printed, with the load average beside each.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from failover_group import FailoverGroup, Workload  # noqa: E402
from idle import process_cpu_s, wait_process_idle  # noqa: E402
from server_processes import ServerProcess, start_cluster, wait_until  # noqa: E402
from store_bench import machine_description  # noqa: E402

DEFAULT_TIMINGS = {"controllerHeartBeatTimeoutMills": "3000", "brokerHeartbeatInterval": "500",
                   "controllerFenceMarginMills": "1000", "haMaxTimeSlaveNotCatchup": "15000"}
# Issue 12: a new master takes writes within 10 s of the SIGKILL (every round), median <= 5 s.
# tests/integration/test_failover.py checks that writes resume at all (a generous bound);
# the time is this benchmark's figure.
WRITES_RESUME_GOAL_MS = 10_000
TIDEMQ = os.path.join(os.path.dirname(sys.executable), "tidemq")


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def failover_rounds(work: Path, rounds: int) -> list[float]:
    processes: list[ServerProcess] = []
    group = FailoverGroup.start(work, processes, overrides=DEFAULT_TIMINGS)
    workload = Workload(group.cluster.namesrv_addr, consume=False).start()
    took: list[float] = []
    try:
        wait_until(lambda: len(workload.acked) >= 100, 120, 0.05, "100 SEND_OK")
        for number in range(1, rounds + 1):
            state = group.state()
            assert state is not None
            master_id = state.master_broker_id
            killed_at = time.monotonic() * 1000
            group.brokers[master_id].kill(signal.SIGKILL)
            new = group.wait_master(other_than=master_id)
            address = group.brokers[new.master_broker_id].addr

            def first_ok(address: str = address, killed_at: float = killed_at) -> float | None:
                times = [at for at, host, _ in list(workload.acked.values())
                         if host == address and at > killed_at]
                return min(times) if times else None

            wait_until(lambda: first_ok() is not None, 120, 0.01, "a SEND_OK on the new master")
            ms = first_ok() - killed_at  # type: ignore[operator]
            took.append(ms)
            print(f"  round {number}: brokerId {master_id} killed, brokerId "
                  f"{new.master_broker_id} took writes after {ms:.0f} ms ({load()})", flush=True)
            group.brokers[master_id].start()
            group.wait(lambda s: s is not None and len(s.sync_state_set) == 3,
                       "every broker back in the sync-state set", 120)
    finally:
        workload.stop()
        for process in reversed(processes):
            process.stop()
        group.stop_outside()
    return took


def produce(namesrv: str, master_pid: int, messages: int) -> tuple[float, float]:
    """msg/s of ``tidemq bench produce`` and the master's CPU microseconds per message."""
    def bench(count: int) -> dict:
        out = subprocess.run([TIDEMQ, "bench", "produce", "-n", namesrv, "-t", "BenchTopic",
                              "-s", "1024", "-b", "64", "-c", "16", "--count", str(count),
                              "--json"], capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        return json.loads(out.stdout.strip().splitlines()[-1])

    bench(2048)  # warm-up: the topic exists and routes are known
    wait_process_idle(master_pid)
    cpu_before = process_cpu_s(master_pid)
    rate = bench(messages)["msgs_per_s"]
    cpu_us = (process_cpu_s(master_pid) - cpu_before) * 1e6 / messages
    return rate, cpu_us


def produce_static(work: Path, messages: int) -> tuple[float, float]:
    processes: list[ServerProcess] = []
    try:
        settings = {"brokerName": "broker-a", "haSendHeartbeatInterval": "500",
                    "mappedFileSizeCommitLog": str(256 * 1024 * 1024)}
        cluster = start_cluster(work, processes, brokers=("master", "slave"), broker_overrides={
            "master": {**settings, "brokerRole": "SYNC_MASTER"},
            "slave": {**settings, "brokerRole": "SLAVE", "brokerId": 1}})
        return produce(cluster.namesrv_addr, cluster.broker("master").pid, messages)
    finally:
        for process in reversed(processes):
            process.stop()


def produce_controller(work: Path, messages: int) -> tuple[float, float]:
    processes: list[ServerProcess] = []
    group = FailoverGroup.start(work, processes, count=2, overrides={
        **DEFAULT_TIMINGS, "flushDiskType": "ASYNC_FLUSH",
        "mappedFileSizeCommitLog": str(256 * 1024 * 1024)})
    try:
        return produce(group.cluster.namesrv_addr, group.master().pid, messages)
    finally:
        for process in reversed(processes):
            process.stop()
        group.stop_outside()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--skip-failover", action="store_true")
    parser.add_argument("--skip-produce", action="store_true")
    args = parser.parse_args()
    print(f"failover_bench: {machine_description()}; {load()}")
    with tempfile.TemporaryDirectory(prefix="failover-bench-") as tmp:
        base = Path(tmp)
        if not args.skip_failover:
            took = failover_rounds(base / "failover", args.rounds)
            ordered = sorted(took)
            p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
            within = sum(1 for t in took if t <= WRITES_RESUME_GOAL_MS)
            print(f"failover_ms over {len(took)} rounds: min {ordered[0]:.0f}, median "
                  f"{statistics.median(took):.0f}, p90 {p90:.0f}, max {ordered[-1]:.0f} "
                  f"(all: {', '.join(f'{t:.0f}' for t in took)}); {load()}")
            print(f"writes resumed within {WRITES_RESUME_GOAL_MS / 1000:.0f} s (issue 12's "
                  f"test goal): {within} of {len(took)} rounds")
        if not args.skip_produce:
            ratios, cpu_ratios = [], []
            for run in range(args.runs):
                static, static_cpu = produce_static(base / f"static-{run}", args.messages)
                controller, controller_cpu = produce_controller(base / f"controller-{run}",
                                                                args.messages)
                ratios.append(controller / static)
                cpu_ratios.append(controller_cpu / static_cpu)
                print(f"  run {run + 1}: static {static:,.0f} msg/s ({static_cpu:.1f} us of "
                      f"master CPU/msg), controller mode {controller:,.0f} msg/s "
                      f"({controller_cpu:.1f} us/msg), ratio {controller / static:.3f} "
                      f"({load()})", flush=True)
            print(f"produce_ratio controller/static: median {statistics.median(ratios):.3f} "
                  f"(runs: {', '.join(f'{r:.3f}' for r in ratios)}); master CPU per message "
                  f"controller/static: median {statistics.median(cpu_ratios):.3f} "
                  f"(runs: {', '.join(f'{r:.3f}' for r in cpu_ratios)}); {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

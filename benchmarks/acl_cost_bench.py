"""What the ACL costs batch produce per request, and whether a change of its code helped:

    .venv/bin/python benchmarks/acl_cost_bench.py [--rounds 6] [--messages 150000]
        [--in-flight 16] [--rate MSG_PER_S] [--fifo PRIORITY] [--baseline-src DIR]

It starts a plain ``tidemq dev`` (ACL off), one with ``aclEnable=true`` (one account, no
white list: every request signed by the client and verified by the broker) and, with
``--baseline-src`` (a ``src`` folder of other code, e.g. ``git archive <commit> src | tar -x
-C /tmp/base``), a second ACL server whose broker and client both run that code. Each round
takes one batch produce figure per server (64 x ``--size`` bytes per request, ``tidemq bench
produce`` in its own process, started once the broker is idle; the broker's CPU read to the
nanosecond with a short calibration run's subtracted, the client's as it counts itself over
its timed part) in an order that alternates from round to round, and gives broker and client
CPU µs **per request** beside the rate and the load average. The summary: the median, over
the rounds, of each ACL server's extra CPU per request over the plain one in the same round,
and of the CPU ratio (plain over ACL, broker plus client).

``--rate`` paces every figure to that many messages per second, so plain and ACL do the
same work in the same time: what the ACL costs per request, without the rate of the figure
(a slower figure pays more per request for whatever a process does per second) mixed in.
The rate ratio is then 1 by construction and the CPU ratio is the figure to read.

``--fifo PRIORITY`` runs each figure's broker (all its threads) and client under
``SCHED_FIFO`` at that priority (``chrt``; root), back to ``SCHED_OTHER`` between figures: on
a machine shared with other jobs it stands in for a quiet one, so the rate ratio says what
the ACL costs the pipeline rather than what share of the cores each figure happened to get.
Keep such runs short: the kernel leaves other processes 5 % of each core at most.

``--in-flight 1`` takes requests one at a time: no request shares a read, a wake-up or a
write with another, so per-request costs (a hop to a thread) show without the batching that
makes a 2-core machine shared with other jobs so noisy at 16 in flight.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

from broker_bench import CALIBRATION_MESSAGES, TIDEMQ, DevServer, children_cpu_s
from idle import wait_process_idle
from security_bench import ACCESS_KEY, ACL_YAML, SECRET_KEY
from store_bench import machine_description

BATCH = 64


def broker_cpu_s(pid: int) -> float:
    """CPU seconds of every thread of process ``pid`` so far, to the nanosecond
    (/proc/<pid>/task/*/schedstat; /proc/<pid>/stat counts 10 ms ticks, a tenth of a figure's
    ACL cost at a few hundred requests)."""
    total_ns = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total_ns += int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total_ns / 1e9


def produce(server: DevServer, topic: str, messages: int, args: argparse.Namespace,
            env: dict[str, str]) -> dict:
    """One ``tidemq bench produce``: its rate and requests, the broker's CPU seconds meanwhile,
    the client's own CPU count over its timed part (``client_s``; None from a client of older
    code, --baseline-src) and the whole client process's (``process_s``, start-up included)."""
    broker_before, children_before = broker_cpu_s(server.process.pid), children_cpu_s()
    fifo = ["chrt", "-f", str(args.fifo)] if args.fifo else []
    out = subprocess.run(
        [*fifo, TIDEMQ, "bench", "produce", "-t", topic, "-s", str(args.size), "-b", str(BATCH),
         "-c", str(args.in_flight), "--count", str(messages), "-n", server.namesrv, "--json",
         *(["--rate", str(args.rate)] if args.rate else [])],
        capture_output=True, text=True, timeout=120 if args.fifo else 600, check=False,
        env={**os.environ, **env})
    if out.returncode != 0:
        raise RuntimeError(f"tidemq bench produce failed: {out.stderr.strip()}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    if summary.get("errors"):
        raise RuntimeError(f"tidemq bench produce had errors: {summary.get('first_error')}")
    return {"msgs_per_s": summary["msgs_per_s"], "requests": summary["requests"],
            "broker_s": broker_cpu_s(server.process.pid) - broker_before,
            "client_s": summary.get("cpu_s"), "process_s": children_cpu_s() - children_before}


def set_fifo(pid: int, priority: int) -> None:
    """Put every thread of process ``pid`` under SCHED_FIFO at ``priority`` (0: back to
    SCHED_OTHER)."""
    policy = ["-f", "-p", str(priority)] if priority else ["-o", "-p", "0"]
    subprocess.run(["chrt", "-a", *policy, str(pid)], check=True, capture_output=True)


def figure(server: DevServer, topic: str, args: argparse.Namespace,
           env: dict[str, str]) -> dict:
    """One figure: rate, broker and client CPU µs per request, load average before it."""
    wait_process_idle(server.process.pid)
    load = os.getloadavg()[0]
    if args.fifo:
        set_fifo(server.process.pid, args.fifo)
    try:
        calibration = produce(server, topic, CALIBRATION_MESSAGES, args, env)
        timed = produce(server, topic, args.messages, args, env)
    finally:
        if args.fifo:
            set_fifo(server.process.pid, 0)
    # The broker's share of a client's start and end (connections, routes, heartbeats) is
    # in both runs: the difference is what the extra requests cost.
    requests = timed["requests"] - calibration["requests"]
    if timed["client_s"] is not None:
        client_us = timed["client_s"] / timed["requests"] * 1e6
    else:
        client_us = (timed["process_s"] - calibration["process_s"]) / requests * 1e6
    return {"msgs_per_s": timed["msgs_per_s"],
            "broker_us": (timed["broker_s"] - calibration["broker_s"]) / requests * 1e6,
            "client_us": client_us, "load_average": load}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--messages", type=int, default=150_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--rate", type=float, help="offer this many messages per second "
                        "(paced) instead of as many as possible")
    parser.add_argument("--fifo", type=int, default=0, metavar="PRIORITY",
                        help="run each figure's broker and client under chrt -f PRIORITY")
    parser.add_argument("--baseline-src", help="a src folder to run the 'baseline' ACL server "
                        "and its client from (PYTHONPATH)")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    print(f"acl_cost_bench: {args.rounds} rounds, {args.messages} x {args.size} B per figure, "
          f"batches of {BATCH}, {args.in_flight} in flight"
          + (f", paced at {args.rate:,.0f} msg/s" if args.rate else "")
          + (f", chrt -f {args.fifo}" if args.fifo else "") + "; " + machine_description(),
          flush=True)
    work_dir = tempfile.mkdtemp(prefix="acl-cost-", dir=args.dir)
    acl_file = os.path.join(work_dir, "plain_acl.yml")
    with open(acl_file, "w") as handle:
        handle.write(ACL_YAML)
    acl_args = ["--aclEnable", "true", "--aclFilePath", acl_file]
    credentials = {"TIDEMQ_ACCESS_KEY": ACCESS_KEY, "TIDEMQ_SECRET_KEY": SECRET_KEY}
    envs = {"plain": {}, "acl": credentials}
    if args.baseline_src:
        envs["baseline"] = {**credentials, "PYTHONPATH": os.path.abspath(args.baseline_src)}
    servers: dict[str, DevServer] = {}
    results: dict[str, list[dict]] = {name: [] for name in envs}
    try:
        for name, env in envs.items():
            os.makedirs(os.path.join(work_dir, name))
            saved = os.environ.get("PYTHONPATH")
            if "PYTHONPATH" in env:  # the server runs the baseline code too
                os.environ["PYTHONPATH"] = env["PYTHONPATH"]
            try:
                servers[name] = DevServer(os.path.join(work_dir, name),
                                          acl_args if name != "plain" else [])
            finally:
                if saved is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = saved
        for round_index in range(args.rounds):
            order = list(envs) if round_index % 2 == 0 else list(reversed(envs))
            for name in order:
                results[name].append(figure(servers[name], f"AclCost{name}", args, envs[name]))
            print(f"round {round_index + 1}: " + "; ".join(
                f"{name} {results[name][-1]['msgs_per_s']:,.0f} msg/s (broker "
                f"{results[name][-1]['broker_us']:.0f} / client "
                f"{results[name][-1]['client_us']:.0f} us per request, load "
                f"{results[name][-1]['load_average']:.1f})" for name in order), flush=True)
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    summary: dict[str, float | list[float]] = {}
    plain = results["plain"]
    for name in envs:
        runs = results[name]
        summary[f"{name}_msgs_per_s"] = statistics.median(r["msgs_per_s"] for r in runs)
        summary[f"{name}_broker_us"] = statistics.median(r["broker_us"] for r in runs)
        summary[f"{name}_client_us"] = statistics.median(r["client_us"] for r in runs)
        if name == "plain":
            continue
        summary[f"{name}_extra_broker_us"] = statistics.median(
            r["broker_us"] - p["broker_us"] for p, r in zip(plain, runs, strict=True))
        summary[f"{name}_extra_client_us"] = statistics.median(
            r["client_us"] - p["client_us"] for p, r in zip(plain, runs, strict=True))
        summary[f"cpu_ratio_plain_over_{name}"] = statistics.median(
            (p["broker_us"] + p["client_us"]) / (r["broker_us"] + r["client_us"])
            for p, r in zip(plain, runs, strict=True))
        summary[f"rate_ratio_{name}_over_plain"] = statistics.median(
            r["msgs_per_s"] / p["msgs_per_s"] for p, r in zip(plain, runs, strict=True))
    summary["load_average_at_end"] = list(os.getloadavg())
    print("median: " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

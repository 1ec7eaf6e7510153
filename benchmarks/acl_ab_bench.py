"""ACL on against ACL off for batch produce, A/B interleaved finely enough that a shared
machine's swings hit both alike (issue 14):

    .venv/bin/python benchmarks/acl_ab_bench.py [--runs 5] [--bursts 10] [--burst-requests 128]
        [--in-flight 16] [--fifo PRIORITY]

It starts a plain ``tidemq dev`` (ACL off) and one with ``aclEnable=true`` (one account, no
white list: every request signed by the client and checked by the broker), and one client
process (this one) with two producers: one without credentials for the plain server, one
with them for the ACL server. A run sends ``--bursts`` bursts to each, alternately (plain,
ACL, ACL, plain, ...), each burst ``--burst-requests`` requests of 64 x ``--size`` bytes with
``--in-flight`` of them in flight, so both see the same load from the rest of the machine
within a second or two; the same number of requests go to each (fixed work). A burst starts
with an empty pipeline and ends draining it, where one side waits for the other; 128
requests with 16 in flight keep that to an eighth of the burst (bursts of 32 made half of
each one ramp and drain, and the rate ratio then followed the sum of both sides' CPU, not
the pipeline's bottleneck: 0.87 where 128 gave 0.94 in the same quarter of an hour).

Per run and side it gives: the rate (messages over the seconds its bursts took), the
broker's CPU per request (every thread of the server process, to the nanosecond from
/proc/<pid>/task/*/schedstat, over the whole run: its idle time while the other side sends
is the same small amount for both) and the client's CPU per request (this process's
``CLOCK_PROCESS_CPUTIME_ID`` over its own bursts), and the context switches per request of
each (all threads, /proc). The **speed ratio** is ACL's rate over
plain's, the **CPU ratio** plain's broker + client CPU per request over ACL's; the summary
is the median of each over the runs.

``--fifo PRIORITY`` puts both servers (all threads) and this process under ``SCHED_FIFO``
(``chrt``; root) for the runs: on a machine shared with other jobs each process then gets a
core when it wants one, as on a quiet machine. Keep such runs short (each run is a few
seconds; the kernel leaves other processes 5 % of each core at most).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from acl_cost_bench import broker_cpu_s, set_fifo
from broker_bench import DevServer
from idle import wait_process_idle
from security_bench import ACCESS_KEY, ACL_YAML, SECRET_KEY
from store_bench import machine_description
from tidemq.client.message import Message
from tidemq.client.producer import Producer
from tidemq.client.security import Credentials
from tidemq.remoting.loop import run as run_on_loop

BATCH = 64
SIDES = ("plain", "acl")


async def burst(producer: Producer, topic: str, body: bytes, requests: int,
                in_flight: int) -> None:
    """Send ``requests`` batch requests with ``in_flight`` of them at a time."""
    left = [requests]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            await producer.send_batch([Message(topic, body) for _ in range(BATCH)])

    await asyncio.gather(*(worker() for _ in range(min(in_flight, requests))))


def context_switches(pid: int) -> int:
    """Context switches (voluntary and not) of every thread of process ``pid`` so far."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as status:
                for line in status:
                    if "ctxt_switches:" in line:
                        total += int(line.split()[-1])
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return total


async def one_run(producers: dict[str, Producer], servers: dict[str, DevServer],
                  args: argparse.Namespace, body: bytes) -> dict:
    """``--bursts`` bursts per side, alternated; rates and CPU per request per side."""
    seconds = dict.fromkeys(SIDES, 0.0)
    client_cpu = dict.fromkeys(SIDES, 0.0)
    broker_before = {side: broker_cpu_s(servers[side].process.pid) for side in SIDES}
    switches_before = {side: context_switches(servers[side].process.pid) for side in SIDES}
    client_switches = dict.fromkeys(SIDES, 0)
    for index in range(args.bursts):
        order = SIDES if index % 2 == 0 else tuple(reversed(SIDES))
        for side in order:
            cpu_0, wall_0 = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID), time.perf_counter()
            switches_0 = context_switches(os.getpid())
            await burst(producers[side], f"AclAb{side}", body, args.burst_requests,
                        args.in_flight)
            seconds[side] += time.perf_counter() - wall_0
            client_cpu[side] += time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID) - cpu_0
            client_switches[side] += context_switches(os.getpid()) - switches_0
    requests = args.bursts * args.burst_requests
    result: dict = {"load_average": os.getloadavg()[0]}
    for side in SIDES:
        broker_s = broker_cpu_s(servers[side].process.pid) - broker_before[side]
        result[side] = {"msgs_per_s": requests * BATCH / seconds[side],
                        "broker_us": broker_s / requests * 1e6,
                        "client_us": client_cpu[side] / requests * 1e6,
                        "broker_switches": (context_switches(servers[side].process.pid)
                                            - switches_before[side]) / requests,
                        "client_switches": client_switches[side] / requests}
    plain, acl = result["plain"], result["acl"]
    result["speed_ratio"] = acl["msgs_per_s"] / plain["msgs_per_s"]
    result["cpu_ratio"] = ((plain["broker_us"] + plain["client_us"])
                           / (acl["broker_us"] + acl["client_us"]))
    result["extra_broker_us"] = acl["broker_us"] - plain["broker_us"]
    result["extra_client_us"] = acl["client_us"] - plain["client_us"]
    return result


async def bench(servers: dict[str, DevServer], args: argparse.Namespace) -> list[dict]:
    body = (os.urandom(64) * (args.size // 64 + 1))[: args.size]
    producers = {
        "plain": Producer("ACL_AB_PLAIN", servers["plain"].namesrv, instance_name="ab-plain"),
        "acl": Producer("ACL_AB_ACL", servers["acl"].namesrv, instance_name="ab-acl",
                        credentials=Credentials(ACCESS_KEY, SECRET_KEY)),
    }
    results = []
    for producer in producers.values():
        await producer.start()
    try:
        for side in SIDES:  # routes learned, connections open, code paths warm
            await burst(producers[side], f"AclAb{side}", body, args.in_flight, args.in_flight)
        for run in range(args.runs):
            for server in servers.values():
                wait_process_idle(server.process.pid)
            result = await one_run(producers, servers, args, body)
            results.append(result)
            print(f"run {run + 1} (load {result['load_average']:.1f}): " + "; ".join(
                f"{side} {result[side]['msgs_per_s']:,.0f} msg/s (broker "
                f"{result[side]['broker_us']:.0f} / client {result[side]['client_us']:.0f} us "
                f"per request; context switches per request {result[side]['broker_switches']:.1f}"
                f" / {result[side]['client_switches']:.1f})" for side in SIDES)
                + f"; speed ratio {result['speed_ratio']:.3f}, CPU ratio "
                f"{result['cpu_ratio']:.3f}", flush=True)
    finally:
        for producer in producers.values():
            await producer.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--bursts", type=int, default=10, help="bursts per side and run")
    parser.add_argument("--burst-requests", type=int, default=128)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--fifo", type=int, default=0, metavar="PRIORITY",
                        help="run the servers and this client under chrt -f PRIORITY")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    print(f"acl_ab_bench: {args.runs} runs of {args.bursts} bursts per side x "
          f"{args.burst_requests} requests of {BATCH} x {args.size} B, {args.in_flight} in "
          f"flight" + (f", chrt -f {args.fifo}" if args.fifo else "") + "; "
          + machine_description(), flush=True)
    work_dir = tempfile.mkdtemp(prefix="acl-ab-", dir=args.dir)
    acl_file = os.path.join(work_dir, "plain_acl.yml")
    with open(acl_file, "w") as handle:
        handle.write(ACL_YAML)
    servers: dict[str, DevServer] = {}
    try:
        for side in SIDES:
            os.makedirs(os.path.join(work_dir, side))
            servers[side] = DevServer(
                os.path.join(work_dir, side),
                ["--aclEnable", "true", "--aclFilePath", acl_file] if side == "acl" else [])
        if args.fifo:
            for server in servers.values():
                set_fifo(server.process.pid, args.fifo)
            subprocess.run(["chrt", "-a", "-f", "-p", str(args.fifo), str(os.getpid())],
                           check=True, capture_output=True)
        results = run_on_loop(bench(servers, args))
    finally:
        if args.fifo:
            subprocess.run(["chrt", "-a", "-o", "-p", "0", str(os.getpid())], check=False,
                           capture_output=True)
        for server in servers.values():
            server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    summary = {
        "speed_ratio": statistics.median(r["speed_ratio"] for r in results),
        "cpu_ratio": statistics.median(r["cpu_ratio"] for r in results),
        "extra_broker_us": statistics.median(r["extra_broker_us"] for r in results),
        "extra_client_us": statistics.median(r["extra_client_us"] for r in results),
        **{f"{side}_{key}": statistics.median(r[side][key] for r in results)
           for side in SIDES for key in ("msgs_per_s", "broker_us", "client_us")},
        "load_average_at_end": list(os.getloadavg()),
    }
    print("median: " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

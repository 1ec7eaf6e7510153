"""CPU per message on the low-rate path, one message at a time (a deterministic shape):

    .venv/bin/python benchmarks/request_cost_bench.py [--cycles 2000] [--runs 3]
        [--flush ASYNC_FLUSH|SYNC_FLUSH] [--consumer raw|pull] [--json]

At 2,000 msg/s every request reaches the broker alone, so what a message costs is the fixed
cost of its requests, not of its bytes: the send, the re-run of the long poll it wakes, and
the consumer's next pull that parks again. latency_bench.py reports CPU per message too, but
there how many messages share a request depends on the scheduling of the run (a late run
batches more and costs less per message). Here each cycle is exactly those three requests:

1. one 1 KiB message is sent (``Producer.send``, one queue) and its acknowledgement awaited;
2. the pull parked for it (PULL_MESSAGE with SUSPEND, a raw request; with ``--consumer
   pull`` tidemq's PullConsumer, assigned the queue and waiting in ``poll``) is answered;
3. the next pull is written, and after a short pause (0.3 ms: it reaches the broker and
   parks) the next cycle starts.

It starts its own ``tidemq dev`` (fresh store, free loopback ports) and prints the broker's
main-thread CPU per cycle (``/proc/<pid>/task/<pid>/schedstat``, nanoseconds), the broker
process's (all its threads, clock ticks) and this client's (producer and consumer in one
process), each run and the median. Compare two source trees by running it with
``PYTHONPATH=<other tree>/src`` alternately: the figure moves with the code, far less with
the machine's load than a latency does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from broker_bench import TIDEMQ, DevServer
from idle import process_cpu_s, wait_process_idle

TOPIC = "RequestCost"
GROUP = "REQUEST_COST_C"
BODY = b"x" * 1024
WARM_UP_CYCLES = 300
PARK_PAUSE_S = 0.0003  # the next pull reaches the broker and parks before the next send
PULL_SUSPEND_MS = 20_000


def main_thread_cpu_ns(pid: int) -> int:
    """Nanoseconds on a CPU of process ``pid``'s main thread so far (0 when unknown)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as stat:
            return int(stat.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


async def _cycles(namesrv: str, address: str, broker_pid: int, cycles: int,
                  consumer_kind: str = "raw") -> dict:
    from tidemq import Message, Producer, PullConsumer
    from tidemq.protocol.codes import RequestCode
    from tidemq.protocol.command import RemotingCommand
    from tidemq.remoting.client import RemotingClient

    async with Producer("REQUEST_COST_P", namesrv) as producer:
        first = await producer.send(Message(TOPIC, BODY))
        queue = first.queue
        client = RemotingClient()
        next_offset = first.queue_offset + 1
        answered = asyncio.Event()

        async def consume() -> None:
            nonlocal next_offset
            while True:
                response = await client.invoke(address, RemotingCommand.request(
                    RequestCode.PULL_MESSAGE, {
                        "consumerGroup": GROUP, "topic": TOPIC,
                        "queueId": str(queue.queue_id), "queueOffset": str(next_offset),
                        "maxMsgNums": "32", "sysFlag": "6", "commitOffset": "0",
                        "suspendTimeoutMillis": str(PULL_SUSPEND_MS), "subscription": "*",
                        "subVersion": "0", "expressionType": "TAG"}), PULL_SUSPEND_MS + 10_000)
                if response.code == 0:
                    next_offset = int(response.ext_fields["nextBeginOffset"])
                    answered.set()

        async def poll() -> None:
            async with PullConsumer(GROUP, namesrv, auto_commit=False) as pull_consumer:
                pull_consumer.assign([queue])
                await pull_consumer.seek(queue, next_offset)
                while True:
                    if await pull_consumer.poll(PULL_SUSPEND_MS):
                        answered.set()

        consumer = asyncio.ensure_future(consume() if consumer_kind == "raw" else poll())
        try:
            figures: dict = {}
            for count, measured in ((WARM_UP_CYCLES, False), (cycles, True)):
                thread_ns = main_thread_cpu_ns(broker_pid)
                process_s = process_cpu_s(broker_pid)
                client_s = time.process_time()
                for _ in range(count):
                    answered.clear()
                    await producer.send(Message(TOPIC, BODY), queue=queue)
                    await asyncio.wait_for(answered.wait(), 30)
                    await asyncio.sleep(PARK_PAUSE_S)
                if measured:
                    figures = {
                        "broker_main_thread_us_per_cycle":
                            (main_thread_cpu_ns(broker_pid) - thread_ns) / count / 1e3,
                        "broker_process_us_per_cycle":
                            (process_cpu_s(broker_pid) - process_s) / count * 1e6,
                        "client_us_per_cycle": (time.process_time() - client_s) / count * 1e6,
                    }
            return figures
        finally:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            await client.close()


def run_once(flush: str, cycles: int, work_root: str | None, consumer_kind: str = "raw") -> dict:
    """One run against a fresh ``tidemq dev``: the figures of ``cycles`` measured cycles."""
    from tidemq.remoting.loop import run as run_on_loop

    work_dir = tempfile.mkdtemp(prefix="request-cost-", dir=work_root)
    server = DevServer(work_dir, extra_args=["--flushDiskType", flush])
    try:
        subprocess.run([TIDEMQ, "admin", "updateTopic", "-n", server.namesrv, "-c",
                        "DefaultCluster", "-t", TOPIC, "-r", "1", "-w", "1"],
                       check=True, capture_output=True, timeout=60)
        wait_process_idle(server.process.pid)
        figures = run_on_loop(_cycles(server.namesrv, f"127.0.0.1:{server.broker_port}",
                                      server.process.pid, cycles, consumer_kind))
    finally:
        server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    figures["load_average"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--flush", choices=("ASYNC_FLUSH", "SYNC_FLUSH"), default="ASYNC_FLUSH")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--consumer", choices=("raw", "pull"), default="raw",
                        help="the consumer: raw PULL_MESSAGE requests or tidemq's PullConsumer")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    runs = [run_once(args.flush, args.cycles, args.dir, args.consumer) for _ in range(args.runs)]
    keys = ("broker_main_thread_us_per_cycle", "broker_process_us_per_cycle",
            "client_us_per_cycle")
    median = {key: statistics.median(run[key] for run in runs) for key in keys}
    if args.json:
        print(json.dumps({"flush": args.flush, "cycles": args.cycles, "median": median,
                          "runs": runs}))
        return 0
    print(f"request cost bench: {args.cycles} cycles of send + woken pull + parked pull, "
          f"1 KiB, {args.flush}, {args.consumer} consumer")
    for number, run in enumerate(runs):
        print(f"run {number}: broker main thread {run[keys[0]]:.0f} us/cycle, broker process "
              f"{run[keys[1]]:.0f}, client {run[keys[2]]:.0f}; load {run['load_average']}")
    print(f"median of {len(runs)}: broker main thread {median[keys[0]]:.0f} us/cycle, broker "
          f"process {median[keys[1]]:.0f}, client {median[keys[2]]:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

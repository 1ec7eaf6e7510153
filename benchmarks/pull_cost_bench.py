"""CPU per pull in the broker, the network taken out, tree against tree:

    .venv/bin/python benchmarks/pull_cost_bench.py [--pulls 8000] [--runs 3]
        [--variant NAME=SRC ...] [--messages 4] [--queues 8] [--per-read 1]
        [--mode parked|found] [--interleaved] [--json]

At 20,000 msg/s (latency_bench.py, 64 sends in flight, one PullConsumer with long polling,
8 queues) the consumer's pulls reach the broker, mostly find nothing new and park, and are
answered by the long poll's wake a moment later with the few messages (~3.5) sent meanwhile:
each message delivered costs the broker a share of a pull's decode, checks, park, wake,
re-read and answer. How many messages share a pull moves with the machine's load from run
to run, so this measures one pull's work with the shape fixed.

A broker is started in this process (its store in a temporary directory, no client
connected) and a remoting connection of its own server is put on a socket stand-in that
drops what it is given, as send_cost_bench.py ``--connection`` does. Each cycle, per queue:

- ``--mode parked`` (default): the consumer's pull (tidemq's PullConsumer's request:
  SUBSCRIPTION, SUSPEND and LITE_PULL flags, the expression ``*``, 32 messages at most,
  ``--per-read`` pulls to one read) is handed to the connection as its socket would
  (frame decode, dispatch, the pull processor, which parks it); then ``--messages``
  messages per queue are stored (not timed) and the hold service's wake runs as a send's
  does (``wake_now``): every parked pull is re-read and answered, and the answers written;
- ``--mode found``: the messages are stored first, so each pull is answered as it arrives.

The messages of a cycle are stored queue by queue (each queue's records adjacent in the
commit log), or with ``--interleaved`` spread over the queues in turn, as a producer's queue
selection spreads its sends at 20,000 msg/s (each queue's records apart: a pull's records are
sliced one by one).

Timed (``time.thread_time``): the reads of pulls handed to the connection and the wake with
its answers; the stores in between are not. Each variant (``NAME=SRC``; ``.`` is this
checkout) runs in its own process, alternating run by run; each process times ``--pulls``
pulls five times and reports the median and the least. Printed: microseconds of broker CPU
per pull, per run, and per variant the median over runs and the least of every timing (on
a shared machine the least disturbed: another process on the sibling core slows this one's
CPU too, and its time is counted).
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

from answering_peer import CountingTransport
from variants import rotated, src_variants

TOPIC = "PullCost"
GROUP = "PULL_COST_C"
BODY = os.urandom(1024)
REPEATS = 5
WARM_UP_CYCLES = 50
PULL_BATCH = 32
SUSPEND_MS = 20_000


async def _broker_child(work_dir: str, pulls: int, messages: int, queues: int, per_read: int,
                        mode: str, interleaved: bool) -> tuple[float, float]:
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.controller import BrokerController
    from tidemq.broker.topic_config_manager import TopicConfig
    from tidemq.protocol.command import RemotingCommand
    from tidemq.protocol.msgid import new_unique_key
    from tidemq.store.config import StoreConfig
    from tidemq.store.file_store import FileMessageStore
    from tidemq.store.interface import StoreMessage

    answered = [0]
    config = BrokerConfig(listen_port=0)
    store_config = StoreConfig(store_path_root_dir=work_dir, store_host=config.broker_address)
    store = FileMessageStore(store_config)
    broker = BrokerController(config, store_config, store=store)
    await broker.start()
    try:
        broker.topic_config_manager.update(TopicConfig(TOPIC, queues, queues))
        holds = broker.pull_hold_service
        socket = CountingTransport(answered)
        served = broker.server._new_connection()
        served.connection_made(socket)
        offsets = [0] * queues
        version = str(int(time.time() * 1000))

        def pull_frame(queue_id: int) -> bytes:
            # tidemq's PullConsumer's request (client/broker_api.py pull_request_fields).
            fields = {
                "consumerGroup": GROUP, "topic": TOPIC, "queueId": str(queue_id),
                "queueOffset": str(offsets[queue_id]), "maxMsgNums": str(PULL_BATCH),
                "sysFlag": str(0x4 | 0x2 | 0x10), "commitOffset": "0",
                "suspendTimeoutMillis": str(SUSPEND_MS), "subscription": "*",
                "subVersion": version, "expressionType": "TAG",
            }
            return RemotingCommand.request(11, fields).encode()

        def store_messages() -> None:
            if interleaved:
                order = [queue_id for _ in range(messages) for queue_id in range(queues)]
            else:
                order = [queue_id for queue_id in range(queues) for _ in range(messages)]
            batch = [StoreMessage(TOPIC, queue_id, BODY, {"UNIQ_KEY": new_unique_key()})
                     for queue_id in order]
            holds.wake_after_put()
            store.put_message_group(batch)
            for queue_id in range(queues):
                offsets[queue_id] += messages

        async def cycle() -> float:
            """One pull per queue answered; the broker CPU seconds of the timed parts."""
            wanted = answered[0] + queues
            reads = [b"".join(pull_frame(queue_id) for queue_id in range(start, min(
                start + per_read, queues))) for start in range(0, queues, per_read)]
            spent = 0.0
            if mode == "found":
                store_messages()
                holds.wake_now()
            started = time.thread_time()
            for read in reads:
                served.data_received(read)
            spent += time.thread_time() - started
            if mode == "parked":
                await asyncio.sleep(0)  # the cork's write, as at the end of the iteration
                store_messages()
                started = time.thread_time()
                holds.wake_now()
                spent += time.thread_time() - started
            await asyncio.sleep(0)  # the corked answers leave
            if answered[0] != wanted:
                raise SystemExit(f"pull_cost_bench: {answered[0]} answers, expected {wanted}"
                                 " (a pull was not answered as the bench assumes)")
            return spent

        for _ in range(WARM_UP_CYCLES):
            await cycle()
        cycles = max(1, pulls // queues)
        costs = []
        for _ in range(REPEATS):
            spent = 0.0
            for _ in range(cycles):
                spent += await cycle()
            costs.append(spent / (cycles * queues) * 1e6)
        return statistics.median(costs), min(costs)
    finally:
        await broker.shutdown(grace_s=1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pulls", type=int, default=8000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=SRC: a source tree to measure ('.' is this checkout)")
    parser.add_argument("--messages", type=int, default=4,
                        help="messages each pull is answered with")
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--per-read", type=int, default=1, help="pulls that arrive in one read")
    parser.add_argument("--mode", choices=("parked", "found"), default="parked")
    parser.add_argument("--interleaved", action="store_true",
                        help="store a cycle's messages over the queues in turn")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child-store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_store:
        from tidemq.remoting.loop import run

        cost, least = run(_broker_child(args.child_store, args.pulls, args.messages,
                                        args.queues, args.per_read, args.mode,
                                        args.interleaved))
        print(json.dumps({"us_per_pull": cost, "least_us_per_pull": least}))
        return 0
    variants = src_variants(args.variant)
    os.makedirs(args.dir, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="pull-cost-", dir=args.dir)
    costs: dict[str, list[float]] = {name: [] for name, _ in variants}
    leasts: dict[str, list[float]] = {name: [] for name, _ in variants}
    try:
        for run in range(args.runs):
            for name, src in rotated(variants, run):
                store = os.path.join(work_dir, f"store-{run}-{name}")
                done = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--pulls", str(args.pulls),
                     "--messages", str(args.messages), "--queues", str(args.queues),
                     "--per-read", str(args.per_read), "--mode", args.mode,
                     *(["--interleaved"] if args.interleaved else []),
                     "--child-store", store],
                    env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True,
                    timeout=600)
                if done.returncode:  # its traceback, not only "exit status 1"
                    sys.stderr.write(done.stderr)
                    raise SystemExit(f"pull_cost_bench: variant {name} ({src}) exited "
                                     f"{done.returncode}; its output is above")
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                cost = figures["us_per_pull"]
                costs[name].append(cost)
                leasts[name].append(figures["least_us_per_pull"])
                if not args.json:
                    print(f"run {run + 1} {name:<10} {cost:.2f} us per pull (least "
                          f"{figures['least_us_per_pull']:.2f})", flush=True)
                shutil.rmtree(store, ignore_errors=True)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in costs.items()}
    least = {name: min(values) for name, values in leasts.items()}
    if args.json:
        print(json.dumps({"pulls": args.pulls, "median": medians, "least": least,
                          "runs": costs}))
    else:
        load = " ".join(f"{value:.1f}" for value in os.getloadavg())
        layout = "interleaved" if args.interleaved else "queue by queue"
        print(f"broker, --mode {args.mode}, {args.messages} messages per pull ({layout}), "
              f"{args.per_read} pulls per read: {args.pulls} pulls x {REPEATS} per run, "
              f"median of {args.runs} runs (load average {load}):")
        for name, value in medians.items():
            print(f"{name:<10} {value:.2f} us per pull (least {least[name]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

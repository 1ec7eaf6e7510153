"""The broker's CPU per message of batch sends, the network taken out, tree against tree:

    .venv/bin/python benchmarks/batch_cost_bench.py [--requests 1500] [--batch 64]
        [--per-read 3] [--runs 3] [--variant NAME=SRC ...] [--json]

Batch produce (``tidemq bench produce -b 64 -c 16``) is bound by the broker's event loop, and
its CPU per message moves with the machine's load from run to run by more than a code change
of a few per cent. This measures only the broker's code: a broker started in the process (its
store in a temporary directory, no client connected) is handed reads of ``--per-read``
SEND_BATCH_MESSAGE requests of ``--batch`` 1 KiB messages each (the bodies ``Producer.
send_batch`` encodes, over 8 queues), each read fed to a ``FrameDecoder`` and served by the
send processor's group handler, the batches appended together at the end of the loop
iteration as the broker does, and every response encoded: the broker's Python work per
message, store append, consume queue and index included. Each ``--variant`` (``NAME=SRC``:
``.`` for this checkout or another tree's ``src/``, e.g. ``git archive <commit> src | tar -x
-C /tmp/before`` then ``before=/tmp/before/src``) runs in its own process, the variants
alternating run by run; each process times ``--requests`` requests five times
(``time.thread_time``) and reports the median. Printed: microseconds per message per run, and
the median over runs.
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

from answering_peer import AnsweringPeer
from variants import rotated, src_variants

TOPIC = "BatchCost"
QUEUES = 8
REPEATS = 5
WARM_UP_READS = 100
DISTINCT_READS = 40  # reads made ahead and served in turn (their keys repeat after these)


async def _child(work_dir: str, requests: int, batch: int, per_read: int) -> float:
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.controller import BrokerController
    from tidemq.broker.topic_config_manager import TopicConfig
    from tidemq.client.batch import split_batch
    from tidemq.client.message import Message
    from tidemq.protocol.codes import RequestCode
    from tidemq.protocol.command import RemotingCommand
    from tidemq.protocol.frame import FrameDecoder
    from tidemq.store.config import StoreConfig
    from tidemq.store.file_store import FileMessageStore

    body = (os.urandom(64) * 16)[:1024]
    opaque = 0

    def read_of_batches(first_queue: int) -> bytes:
        nonlocal opaque
        frames = []
        for index in range(per_read):
            chunk = split_batch([Message(TOPIC, body) for _ in range(batch)])[0]
            opaque += 1
            fields = {"a": "BATCH_COST_P", "b": TOPIC, "c": "TBW102", "d": "4",
                      "e": str((first_queue + index) % QUEUES), "f": "0",
                      "g": str(time.time_ns() // 1_000_000), "h": "0", "m": "true",
                      "n": "broker-a"}
            frames.append(RemotingCommand(
                int(RequestCode.SEND_BATCH_MESSAGE), opaque, 0, None, fields, chunk.body
            ).encode())
        return b"".join(frames)

    config = BrokerConfig(listen_port=0)
    store_config = StoreConfig(store_path_root_dir=work_dir, store_host=config.broker_address)
    broker = BrokerController(config, store_config, store=FileMessageStore(store_config))
    await broker.start()
    try:
        broker.topic_config_manager.update(TopicConfig(TOPIC, QUEUES, QUEUES))
        processor = broker.send_processor
        producer = AnsweringPeer()
        producer.loop = producer._loop = asyncio.get_running_loop()  # type: ignore[attr-defined]
        decoder = FrameDecoder()
        reads = [read_of_batches(index * per_read) for index in range(DISTINCT_READS)]

        async def serve(count: int) -> None:
            for index in range(count):
                received = decoder.feed(reads[index % len(reads)])
                responses = await processor.handle_group(received, producer)
                for request, response in zip(received, responses, strict=True):
                    response.opaque = request.opaque  # as the dispatcher answers
                    response.flag |= 1
                    response.encode_parts()

        rounds = max(1, requests // per_read)
        await serve(min(WARM_UP_READS, rounds))
        costs = []
        for _ in range(REPEATS):
            started = time.thread_time()
            await serve(rounds)
            costs.append((time.thread_time() - started) / (rounds * per_read * batch) * 1e6)
        return statistics.median(costs)
    finally:
        await broker.shutdown(grace_s=1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1500, help="timed requests per repeat")
    parser.add_argument("--batch", type=int, default=64, help="messages per request")
    parser.add_argument("--per-read", type=int, default=3, help="requests per read")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=SRC: SRC is . or another tree's src/")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child-store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_store:
        cost = asyncio.run(_child(args.child_store, args.requests, args.batch, args.per_read))
        print(json.dumps({"us_per_message": cost}))
        return 0
    variants = src_variants(args.variant)
    os.makedirs(args.dir, exist_ok=True)
    runs: dict[str, list[float]] = {name: [] for name, _ in variants}
    for run in range(args.runs):
        for name, src in rotated(variants, run):
            env = {**os.environ, "PYTHONPATH": src}
            store = tempfile.mkdtemp(prefix="batch-cost-", dir=args.dir)
            try:
                out = subprocess.run(
                    [sys.executable, __file__, "--child-store", store, "--requests",
                     str(args.requests), "--batch", str(args.batch), "--per-read",
                     str(args.per_read)],
                    env=env, capture_output=True, text=True, timeout=600, check=False)
            finally:
                shutil.rmtree(store, ignore_errors=True)
            if out.returncode != 0:
                raise SystemExit(f"variant {name} failed:\n{out.stderr[-3000:]}")
            cost = json.loads(out.stdout.strip().splitlines()[-1])["us_per_message"]
            runs[name].append(cost)
            if not args.json:
                print(f"run {run + 1} {name:10s} {cost:.3f} us/msg", flush=True)
    medians = {name: statistics.median(costs) for name, costs in runs.items()}
    if args.json:
        print(json.dumps({"runs": runs, "median": medians}))
        return 0
    print(f"{args.batch} x 1 KiB per request, {args.per_read} requests per read, "
          f"{args.requests} requests x {REPEATS} repeats per run; median of {args.runs} runs")
    for name, value in medians.items():
        print(f"{name:10s} {value:.3f} us/msg")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The producer's CPU per single send, the network taken out, source tree against source tree:

    .venv/bin/python benchmarks/send_cost_bench.py [--sends 20000] [--runs 3]
        [--variant NAME=SRC ...] [--json]

At 20,000 single sends a second the producer process spends ~25 us of CPU per message, and
how many answers share a read (and so the event loop's and the kernel's part) moves with the
machine's load from run to run by more than a code change of a microsecond. This measures
only the code: ``Producer.send`` of a 1 KiB message with the broker's connection replaced by
a function that encodes the request as the connection would and returns the decoded frame of
a canned SEND answer (the real broker's fields), so every send does all of its Python work
(checks, properties, header, queue choice, request encode, answer decode, SendResult) and
nothing else. It starts one ``tidemq dev`` (for the route only), then runs each ``--variant``
(``NAME=SRC``: ``.`` for this checkout or another tree's ``src/``, e.g. ``git archive <commit>
src | tar -x -C /tmp/before`` then ``before=/tmp/before/src``) in its own process, alternating
the variants run by run; each process times ``--sends`` sends five times (``time.thread_time``)
and reports the median. Printed: microseconds per send per run, and the median over runs.
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

from broker_bench import DevServer

TOPIC = "SendCost"
BODY = os.urandom(1024)
WARM_UP_SENDS = 2000
REPEATS = 5


async def _child(namesrv: str, sends: int) -> float:
    from tidemq import Message, Producer
    from tidemq.protocol.command import RemotingCommand
    from tidemq.protocol.frame import FrameDecoder

    async with Producer("SEND_COST_P", namesrv) as producer:
        await producer.send(Message(TOPIC, BODY))
        decoder = FrameDecoder()
        answers: dict[str, bytes] = {}

        async def canned_invoke(address: str, request: RemotingCommand,
                                timeout_ms: int = 3000) -> RemotingCommand:
            request.encode_parts()  # what the connection's write does
            queue_id = request.ext_fields["e"]
            frame = answers.get(queue_id)
            if frame is None:
                frame = answers[queue_id] = RemotingCommand(0, request.opaque, 1, None, {
                    "MSG_REGION": "DefaultRegion", "TRACE_ON": "true",
                    "msgId": "7F00000100002A9F0000000000ABCDEF", "queueId": queue_id,
                    "queueOffset": "123456"}).encode()
            return decoder.feed(frame)[0]

        producer._instance.remoting.invoke = canned_invoke  # type: ignore[method-assign]
        for _ in range(WARM_UP_SENDS):
            await producer.send(Message(TOPIC, BODY))
        costs = []
        for _ in range(REPEATS):
            started = time.thread_time()
            for _ in range(sends):
                await producer.send(Message(TOPIC, BODY))
            costs.append((time.thread_time() - started) / sends * 1e6)
        return statistics.median(costs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sends", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=SRC: a source tree to measure ('.' is this checkout)")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child-namesrv", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_namesrv:
        print(json.dumps({"us_per_send": asyncio.run(_child(args.child_namesrv, args.sends))}))
        return 0
    variants = []
    for text in args.variant or ["A=."]:
        name, _, src = text.partition("=")
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
        variants.append((name, os.path.abspath(here if src == "." else src)))
    os.makedirs(args.dir, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="send-cost-", dir=args.dir)
    server = DevServer(work_dir)
    costs: dict[str, list[float]] = {name: [] for name, _ in variants}
    try:
        for run in range(args.runs):
            order = variants[run % len(variants):] + variants[:run % len(variants)]
            for name, src in order:
                done = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--sends", str(args.sends),
                     "--child-namesrv", server.namesrv],
                    env={**os.environ, "PYTHONPATH": src}, check=True, capture_output=True,
                    text=True, timeout=600)
                cost = json.loads(done.stdout.strip().splitlines()[-1])["us_per_send"]
                costs[name].append(cost)
                if not args.json:
                    print(f"run {run + 1} {name:<10} {cost:.2f} us per send", flush=True)
    finally:
        server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in costs.items()}
    if args.json:
        print(json.dumps({"sends": args.sends, "median": medians, "runs": costs}))
    else:
        load = " ".join(f"{value:.1f}" for value in os.getloadavg())
        print(f"{args.sends} sends x {REPEATS} per run, median of {args.runs} runs "
              f"(load average {load}):")
        for name, value in medians.items():
            print(f"{name:<10} {value:.2f} us per send")
    return 0


if __name__ == "__main__":
    sys.exit(main())

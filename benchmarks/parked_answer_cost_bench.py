"""CPU of a PullConsumer taking its parked pulls' answers, the broker and network taken out,
tree against tree:

    .venv/bin/python benchmarks/parked_answer_cost_bench.py [--reads 2000] [--runs 3]
        [--variant NAME=SRC ...] [--messages 6] [--queues 8] [--json]

At 20,000 msg/s (latency_bench.py, 64 sends in flight, 8 queues) a PullConsumer keeping up
has one pull parked per queue; each read of its connection brings an answer for most of the
queues with the few messages sent meanwhile (~6 each, one read for ~8 answers, on this
session's host: RESULTS.md), and the consumer decodes them in the read callback, writes the
next pulls and hands the messages to the waiting ``poll``. How many messages share an answer
moves with the machine's load from run to run, so this measures that work with the shape
fixed, and ``--messages 1`` against the default separates what an answer costs from what a
message costs.

In one process: a PullConsumer (not started: no name server or broker) assigned ``--queues``
queues of one broker, whose connection is a real remoting connection on a socket stand-in
that counts the frames written and drops them (answering_peer.py). Its pulls are parked as
in the steady state. Each cycle hands that connection one read holding an answer (code 0,
the broker's four header fields, ``--messages`` stored records of 1 KiB) to every parked
pull, as its socket would; a task waiting in ``poll`` takes the messages; the next pulls
leave through the cork. Timed (wall clock, so run it pinned: ``chrt -f 5``): from the read
handed over until the poll has every message and the cork is flushed; building the read is
not. Each variant (``NAME=SRC``; ``.`` is this checkout) runs in its own process,
alternating run by run, and reports the median of its blocks of 100 cycles and the least.
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
from typing import Any

from answering_peer import CountingTransport
from variants import rotated, src_variants

TOPIC = "ParkedAnswerCost"
BROKER = "broker-a"
ADDRESS = "127.0.0.1:10911"
BODY = os.urandom(1024)
WARM_UP_CYCLES = 200
BLOCK_CYCLES = 100


class _InterpreterSteps:
    """A trace function counting the Python calls (coroutine resumptions included) and the
    bytecode instructions executed while it is set: figures that do not move with the
    host's speed (C work, a body's copy or CRC, is not in them)."""

    def __init__(self) -> None:
        self.calls = 0
        self.opcodes = 0

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            self.opcodes += 1
        elif event == "call":
            self.calls += 1
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
        return self


async def _consumer_child(reads: int, messages: int, queues: int,
                          count_steps: bool = False) -> tuple[float, float]:
    """µs of this process per message: the median of the blocks of ``BLOCK_CYCLES`` cycles,
    and the least block; with ``count_steps``, Python opcodes and calls per message over
    ``reads`` cycles instead (traced, so not timed)."""
    import tidemq.client.pull_consumer as pull_consumer
    from tidemq import PullConsumer
    from tidemq.client.message import MessageQueue
    from tidemq.client.subscription import parse_subscription
    from tidemq.protocol.command import FLAG_RESPONSE, RemotingCommand
    from tidemq.protocol.message import encode_properties, encode_record
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.dispatch import RequestDispatcher

    properties = encode_properties({"UNIQ_KEY": "7F000001000012345678ABCDEF012345",
                                    "WAIT": "true"}).encode()

    def records(queue_id: int, start: int) -> bytes:
        return b"".join(bytes(encode_record(
            topic=TOPIC.encode(), body=BODY, properties=properties, queue_id=queue_id,
            queue_offset=offset, physical_offset=offset * 1200,
            born_timestamp=1_700_000_000_000, store_timestamp=1_700_000_000_001))
            for offset in range(start, start + messages))

    consumer = PullConsumer("PARKED_ANSWER_COST", "127.0.0.1:9", auto_commit=False)
    instance = consumer._instance
    written = [0]
    connection = Connection(RequestDispatcher())
    connection.connection_made(CountingTransport(written))
    instance.broker_addresses[BROKER] = {0: ADDRESS}
    instance.remoting.open_connection = lambda address: connection  # type: ignore[method-assign]
    # As start() and assign() leave it, without the name server's route.
    consumer._state = "running"
    consumer._mode = "assign"
    subscription = parse_subscription(TOPIC, "*", "TAG")
    consumer._subscriptions = {TOPIC: subscription}
    for queue_id in range(queues):
        state = pull_consumer._QueueState(MessageQueue(TOPIC, BROKER, queue_id), subscription)
        state.fetch_offset = state.consumed_offset = 0
        consumer._states[state.queue] = state
        if not consumer._park(state, state.epoch):
            raise SystemExit("parked_answer_cost_bench: the first pull was not parked")
    await asyncio.sleep(0)
    polled = [0]

    async def poller() -> None:
        while True:
            polled[0] += len(await consumer.poll(1000))

    task = asyncio.ensure_future(poller())
    await asyncio.sleep(0)

    def read_of_answers() -> bytes:
        answers = []
        for opaque, (parked, *_) in list(connection._pending.items()):
            offset = parked.offset
            answers.append(RemotingCommand(
                0, opaque, FLAG_RESPONSE, None,
                {"suggestWhichBrokerId": "0", "nextBeginOffset": str(offset + messages),
                 "minOffset": "0", "maxOffset": str(offset + messages)},
                records(parked.owner.queue.queue_id, offset)).encode())
        if len(answers) != queues:
            raise SystemExit(f"parked_answer_cost_bench: {len(answers)} pulls parked, "
                             f"{queues} expected")
        return b"".join(answers)

    per_cycle = queues * messages
    if count_steps:
        steps = _InterpreterSteps()
        for cycle in range(WARM_UP_CYCLES + reads):
            read = read_of_answers()
            wanted = polled[0] + per_cycle
            counted = cycle >= WARM_UP_CYCLES
            if counted:  # from the read handed over to the cork's flush, as the timing
                sys.settrace(steps)
            connection.data_received(read)
            while polled[0] < wanted:
                await asyncio.sleep(0)
            await asyncio.sleep(0)  # the cork's flush
            if counted:
                sys.settrace(None)
        task.cancel()
        return steps.opcodes / reads / per_cycle, steps.calls / reads / per_cycle
    cycles_ns = []
    for _ in range(WARM_UP_CYCLES + reads):
        read = read_of_answers()
        wanted = polled[0] + per_cycle
        started = time.perf_counter_ns()
        connection.data_received(read)
        while polled[0] < wanted:
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # the cork's flush
        cycles_ns.append(time.perf_counter_ns() - started)
    task.cancel()
    timed = cycles_ns[WARM_UP_CYCLES:]
    blocks = [statistics.fmean(timed[i:i + BLOCK_CYCLES]) / per_cycle / 1000
              for i in range(0, len(timed) - BLOCK_CYCLES + 1, BLOCK_CYCLES)]
    return statistics.median(blocks), min(blocks)


def _count_steps(variants: list[tuple[str, str]], args: argparse.Namespace) -> int:
    """Each variant's Python opcodes and calls per message and per answer (one run each:
    the counts do not vary)."""
    figures = {}
    for name, src in variants:
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--reads", str(args.reads),
             "--messages", str(args.messages), "--queues", str(args.queues), "--steps",
             "--child"],
            env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True,
            timeout=600)
        if done.returncode:
            sys.stderr.write(done.stderr)
            raise SystemExit(f"parked_answer_cost_bench: variant {name} ({src}) exited "
                             f"{done.returncode}; its output is above")
        figures[name] = json.loads(done.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps({"messages": args.messages, "queues": args.queues, "steps": figures}))
        return 0
    print(f"consumer, {args.queues} answers per read, {args.messages} messages each, "
          f"{args.reads} reads traced (Python opcodes and calls, the harness's own few "
          "included):")
    for name, counted in figures.items():
        opcodes, calls = counted["opcodes_per_message"], counted["calls_per_message"]
        print(f"{name:<10} {opcodes:.1f} opcodes and {calls:.2f} calls per message, "
              f"{opcodes * args.messages:.0f} and {calls * args.messages:.1f} per answer")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=2000, help="timed reads per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=SRC (a src/ folder, or . for this checkout)")
    parser.add_argument("--messages", type=int, default=6,
                        help="messages in each answer")
    parser.add_argument("--queues", type=int, default=8,
                        help="queues parked, each answered in every read")
    parser.add_argument("--steps", action="store_true",
                        help="count Python opcodes and calls per message instead of timing "
                             "(the same in every run, whatever the host's speed)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reads < BLOCK_CYCLES:
        raise SystemExit(f"--reads {args.reads}: at least {BLOCK_CYCLES} (one block)")
    if args.child:
        from tidemq.remoting.loop import run

        if args.steps:
            opcodes, calls = run(_consumer_child(args.reads, args.messages, args.queues,
                                                 count_steps=True))
            print(json.dumps({"opcodes_per_message": opcodes, "calls_per_message": calls}))
            return 0
        cost, least = run(_consumer_child(args.reads, args.messages, args.queues))
        print(json.dumps({"us_per_message": cost, "least_us_per_message": least}))
        return 0
    variants = src_variants(args.variant)
    if args.steps:
        return _count_steps(variants, args)
    costs: dict[str, list[float]] = {name: [] for name, _ in variants}
    leasts: dict[str, list[float]] = {name: [] for name, _ in variants}
    work_dir = tempfile.mkdtemp(prefix="parked-answer-cost-")
    try:
        for run in range(args.runs):
            for name, src in rotated(variants, run):
                done = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--reads", str(args.reads),
                     "--messages", str(args.messages), "--queues", str(args.queues),
                     "--child"],
                    env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True,
                    timeout=600, cwd=work_dir)
                if done.returncode:  # its traceback, not only "exit status 1"
                    sys.stderr.write(done.stderr)
                    raise SystemExit(f"parked_answer_cost_bench: variant {name} ({src}) "
                                     f"exited {done.returncode}; its output is above")
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                costs[name].append(figures["us_per_message"])
                leasts[name].append(figures["least_us_per_message"])
                if not args.json:
                    print(f"run {run + 1} {name:<10} {figures['us_per_message']:.3f} us per "
                          f"message (least {figures['least_us_per_message']:.3f})", flush=True)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in costs.items()}
    least = {name: min(values) for name, values in leasts.items()}
    if args.json:
        print(json.dumps({"reads": args.reads, "messages": args.messages,
                          "queues": args.queues, "median": medians, "least": least,
                          "runs": costs}))
    else:
        load = " ".join(f"{value:.1f}" for value in os.getloadavg())
        print(f"consumer, {args.queues} answers per read, {args.messages} messages each: "
              f"{args.reads} reads per run, median of {args.runs} runs (load average {load}):")
        for name, value in medians.items():
            print(f"{name:<10} {value:.3f} us per message, {value * args.messages:.2f} per "
                  f"answer (least {least[name]:.3f} per message)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

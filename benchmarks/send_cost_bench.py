"""CPU per single send in the producer or the broker, the network taken out, tree against tree:

    .venv/bin/python benchmarks/send_cost_bench.py [--side producer|broker] [--sends 20000]
        [--runs 3] [--variant NAME=SRC ...] [--json] [--window 0]   (--side producer)
        [--per-read 32] [--pause-ms 0] [--dispatcher] [--connection]   (--side broker)

At 20,000 single sends a second the producer process spends ~25 us of CPU per message, and
how many answers share a read (and so the event loop's and the kernel's part) moves with the
machine's load from run to run by more than a code change of a microsecond. This measures
only the code: ``Producer.send`` of a 1 KiB message with the broker's connection replaced by
a function that encodes the request as the connection would and returns the decoded frame of
a canned SEND answer (the real broker's fields), so every send does all of its Python work
(checks, properties, header, queue choice, request encode, answer decode, SendResult) and
nothing else. ``--side broker`` measures the other end the same way: a broker started in the
process (its store in a temporary directory, no client connected) is handed reads of 32
SEND_MESSAGE_V2 frames of 1 KiB (a producer's half window at 20,000 msg/s, 8 queues), each
fed to a ``FrameDecoder``, served by the send processor's group handler and every response
encoded, as the connection does: the broker's Python work per single send, store append
included. ``--per-read 1`` or ``2`` gives the reads of a 2,000 msg/s producer; with
``--dispatcher`` each read goes through the remoting dispatcher as a connection's would (the
send handlers as the broker registers them: a task per group, or served in place); with
``--connection`` each read is handed to a remoting connection of the broker's own server as
its socket would hand it over (frame decode, the dispatcher with the broker's observer, the
answers' encode, the cork and its ``writelines`` to a stand-in transport that drops the
bytes: the broker's whole request path but the system calls). ``--pause-ms`` sleeps before
each read so that the core runs other processes in between and
the broker's code and data are cold when it is served, as at low rates. It starts one
``tidemq dev`` (for the producer's route only), then runs each ``--variant``
(``NAME=SRC``: ``.`` for this checkout or another tree's ``src/``, e.g. ``git archive <commit>
src | tar -x -C /tmp/before`` then ``before=/tmp/before/src``) in its own process, alternating
the variants run by run; each process times ``--sends`` sends five times (``time.thread_time``)
and reports the median. ``--window N`` (producer side) keeps N sends in flight through the
producer's real broker connection instead of the canned answer: the socket is replaced by a
transport that answers every write (a loop iteration's corked frames) in the next iteration
with one read of SEND answers, so the cork, the frame decode, the futures and the task
wake-ups of a window of concurrent sends are measured too (what latency_bench's 64 senders
at 20,000 msg/s pay); the fake broker's own time is left out. Printed: microseconds per send
per run, and the median over runs.
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

from answering_peer import AnsweringPeer, CountingTransport
from broker_bench import DevServer
from variants import rotated, src_variants

TOPIC = "SendCost"
BODY = os.urandom(1024)
WARM_UP_SENDS = 2000
REPEATS = 5


async def _child(namesrv: str, sends: int, window: int = 0) -> float:
    from tidemq import Message, Producer
    from tidemq.protocol.command import RemotingCommand
    from tidemq.protocol.frame import FrameDecoder

    async with Producer("SEND_COST_P", namesrv) as producer:
        await producer.send(Message(TOPIC, BODY))
        if window:
            return await _window_cost(producer, sends, window)
        decoder = FrameDecoder()
        answers: dict[str, bytes] = {}

        async def canned_invoke(address: str, request: RemotingCommand,
                                timeout_ms: int = 3000) -> RemotingCommand:
            head = request.encode_parts()[0]  # what the connection's write does
            # The queue id from the encoded header, not ``request.ext_fields``: a request
            # rendered from a template decodes those only when read (and is then encoded the
            # general way), which the connection never does.
            start = head.index(b'"e":"') + 5
            queue_id = head[start:head.index(b'"', start)].decode()
            frame = answers.get(queue_id)
            if frame is None:
                frame = answers[queue_id] = RemotingCommand(0, request.opaque, 1, None, {
                    "MSG_REGION": "DefaultRegion", "TRACE_ON": "true",
                    "msgId": "7F00000100002A9F0000000000ABCDEF", "queueId": queue_id,
                    "queueOffset": "123456"}).encode()
            return decoder.feed(frame)[0]

        remoting = producer._instance.remoting
        remoting.invoke = canned_invoke  # type: ignore[method-assign]
        # The send's own path (a tree that has it) writes through invoke_written.
        remoting.invoke_written = canned_invoke  # type: ignore[method-assign]
        for _ in range(WARM_UP_SENDS):
            await producer.send(Message(TOPIC, BODY))
        costs = []
        for _ in range(REPEATS):
            started = time.thread_time()
            for _ in range(sends):
                await producer.send(Message(TOPIC, BODY))
            costs.append((time.thread_time() - started) / sends * 1e6)
        return statistics.median(costs)


class _AnsweringTransport:
    """Stands in for the producer's socket to the broker (``--window``): whatever one
    ``writelines`` carries (the cork's frames of one loop iteration) is answered, in the next
    loop iteration, by one ``data_received`` holding a SEND answer per request, as a broker
    answering a read would. The time it spends making the answers is its own (``spent_s``),
    so the caller can leave it out of the producer's."""

    def __init__(self, connection: Any) -> None:
        import orjson

        self._loads = orjson.loads
        self._connection = connection
        self._loop = connection.loop
        self._answers: dict[str, bytes] = {}  # queue id -> the answer's frame, opaque 0
        self.spent_s = 0.0

    def writelines(self, parts: list) -> None:
        started = time.thread_time()
        frames = []
        body_next = False
        for part in parts:
            if body_next:  # the body of the frame before
                body_next = False
                continue
            body_next = int.from_bytes(part[:4], "big") + 4 > len(part)
            header = self._loads(part[8:])
            fields = header.get("extFields") or {}
            frames.append(self._answer(fields.get("e", "0"), header["opaque"]))
        self._loop.call_soon(self._deliver, b"".join(frames))
        self.spent_s += time.thread_time() - started

    def _deliver(self, data: bytes) -> None:
        self._connection.data_received(data)

    def _answer(self, queue_id: str, opaque: int) -> bytes:
        from tidemq.protocol.command import RemotingCommand

        return RemotingCommand(0, opaque, 1, None, {
            "MSG_REGION": "DefaultRegion", "TRACE_ON": "true",
            "msgId": "7F00000100002A9F0000000000ABCDEF", "queueId": queue_id,
            "queueOffset": "123456"}).encode()

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


async def _window_cost(producer: Any, sends: int, window: int) -> float:
    """``--window``: ``window`` coroutines sending one after another through the producer's
    real connection (cork, frame decode, futures, task wake-ups), its socket replaced by an
    ``_AnsweringTransport``; the producer's thread time per send, the fake broker's left out."""

    queue = (await producer.queues(TOPIC))[0]
    address = producer._instance.master_address(queue.broker_name)
    connection = producer._instance.remoting.connections[address]
    transport = _AnsweringTransport(connection)
    socket_transport, connection._transport = connection._transport, transport
    try:
        return await _window_runs(producer, sends, window, transport)
    finally:
        connection._transport = socket_transport


async def _window_runs(producer: Any, sends: int, window: int,
                       transport: _AnsweringTransport) -> float:
    from tidemq import Message

    async def run(count: int) -> None:
        left = [count]

        async def sender() -> None:
            while left[0] > 0:
                left[0] -= 1
                await producer.send(Message(TOPIC, BODY))

        await asyncio.gather(*(sender() for _ in range(window)))

    await run(WARM_UP_SENDS)
    costs = []
    for _ in range(REPEATS):
        transport.spent_s = 0.0
        started = time.thread_time()
        await run(sends)
        costs.append((time.thread_time() - started - transport.spent_s) / sends * 1e6)
    return statistics.median(costs)


SENDS_PER_READ = 32


async def _broker_child(work_dir: str, sends: int, per_read: int = SENDS_PER_READ,
                        pause_ms: float = 0, dispatcher: bool = False,
                        connection: bool = False) -> float:
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.controller import BrokerController
    from tidemq.broker.topic_config_manager import TopicConfig
    from tidemq.protocol.command import RemotingCommand
    from tidemq.protocol.frame import FrameDecoder
    from tidemq.protocol.message import encode_properties
    from tidemq.protocol.msgid import new_unique_key
    from tidemq.remoting.dispatch import RequestDispatcher
    from tidemq.store.config import StoreConfig
    from tidemq.store.file_store import FileMessageStore

    answered = [0]
    producer = AnsweringPeer(answered)

    def read_of_sends() -> bytes:
        frames = []
        for index in range(per_read):
            fields = {"a": "SEND_COST_P", "b": TOPIC, "c": "TBW102", "d": "4",
                      "e": str(index % 8), "f": "0", "g": str(time.time_ns() // 1_000_000),
                      "h": "0", "i": encode_properties({"UNIQ_KEY": new_unique_key()}),
                      "n": "broker-a"}
            frames.append(RemotingCommand.request(310, fields, BODY).encode())
        return b"".join(frames)

    config = BrokerConfig(listen_port=0)
    store_config = StoreConfig(store_path_root_dir=work_dir, store_host=config.broker_address)
    broker = BrokerController(config, store_config, store=FileMessageStore(store_config))
    await broker.start()
    try:
        broker.topic_config_manager.update(TopicConfig(TOPIC, 8, 8))
        processor = broker.send_processor
        producer.loop = producer._loop = asyncio.get_running_loop()  # type: ignore[attr-defined]
        decoder = FrameDecoder()
        reads = [read_of_sends() for _ in range(20)]
        rounds = max(1, sends // per_read)
        routes = RequestDispatcher()
        processor.register(routes)  # type: ignore[arg-type]  # it takes register() alone

        if connection:  # a connection of the broker's own server, on a socket stand-in
            socket = CountingTransport(answered)
            served = broker.server._new_connection()
            served.connection_made(socket)

        async def serve(count: int) -> None:
            for index in range(count):
                if connection:  # the read as the transport hands it over
                    if pause_ms:
                        time.sleep(pause_ms / 1000)
                    wanted = answered[0] + per_read
                    served.data_received(reads[index % len(reads)])
                    while answered[0] < wanted:
                        await asyncio.sleep(0)
                    continue
                requests = decoder.feed(reads[index % len(reads)])
                if pause_ms:  # the core goes to other processes between reads
                    time.sleep(pause_ms / 1000)
                if dispatcher:  # as a connection's read: tasks or in place, as registered
                    wanted = answered[0] + len(requests)
                    routes.dispatch_many(requests, producer)  # type: ignore[arg-type]
                    while answered[0] < wanted:
                        await asyncio.sleep(0)
                    continue
                responses = await processor.handle_group(requests, producer)
                for request, response in zip(requests, responses, strict=True):
                    response.opaque = request.opaque  # as the dispatcher answers
                    response.flag |= 1
                    response.encode_parts()

        await serve(max(1, WARM_UP_SENDS // per_read))
        costs = []
        for _ in range(REPEATS):
            started = time.thread_time()
            await serve(rounds)
            costs.append((time.thread_time() - started) / (rounds * per_read) * 1e6)
        return statistics.median(costs)
    finally:
        await broker.shutdown(grace_s=1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=("producer", "broker"), default="producer")
    parser.add_argument("--sends", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=SRC: a source tree to measure ('.' is this checkout)")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--per-read", type=int, default=SENDS_PER_READ,
                        help="--side broker: single sends per read")
    parser.add_argument("--pause-ms", type=float, default=0,
                        help="--side broker: sleep this long before each read is served (the "
                        "core runs other processes meanwhile, as at low rates: caches go cold)")
    parser.add_argument("--dispatcher", action="store_true",
                        help="--side broker: serve each read through the remoting dispatcher "
                        "(a task per group, or in place, as the server registers the sends)")
    parser.add_argument("--window", type=int, default=0,
                        help="--side producer: this many sends in flight through the real "
                        "connection (cork, frame decode, futures, task wake-ups), its socket "
                        "answering each write in the next loop iteration, instead of a canned "
                        "answer returned in place (0)")
    parser.add_argument("--connection", action="store_true",
                        help="--side broker: hand each read to a remoting connection of the "
                        "broker's own server, as its socket would (frame decode, dispatch, "
                        "answers, the cork and its write; the write itself is dropped)")
    parser.add_argument("--child-namesrv", help=argparse.SUPPRESS)
    parser.add_argument("--child-store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_namesrv or args.child_store:
        # On tidemq's loop (uvloop where installed), as servers, clients and latency_bench run.
        from tidemq.remoting.loop import run

        cost = (run(_child(args.child_namesrv, args.sends, args.window)) if args.child_namesrv
                else run(_broker_child(args.child_store, args.sends, args.per_read,
                                       args.pause_ms, args.dispatcher, args.connection)))
        print(json.dumps({"us_per_send": cost}))
        return 0
    variants = src_variants(args.variant)
    os.makedirs(args.dir, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="send-cost-", dir=args.dir)
    server = DevServer(work_dir) if args.side == "producer" else None
    costs: dict[str, list[float]] = {name: [] for name, _ in variants}
    try:
        for run in range(args.runs):
            order = rotated(variants, run)
            for name, src in order:
                if server is not None:
                    child = ["--child-namesrv", server.namesrv, "--window", str(args.window)]
                else:
                    store = os.path.join(work_dir, f"store-{run}-{name}")
                    child = ["--child-store", store, "--per-read", str(args.per_read),
                             "--pause-ms", str(args.pause_ms),
                             *(["--dispatcher"] if args.dispatcher else []),
                             *(["--connection"] if args.connection else [])]
                done = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--sends", str(args.sends),
                     *child],
                    env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True,
                    timeout=600)
                if done.returncode:  # its traceback, not only "exit status 1"
                    sys.stderr.write(done.stderr)
                    raise SystemExit(f"send_cost_bench: variant {name} ({src}) exited "
                                     f"{done.returncode}; its output is above")
                cost = json.loads(done.stdout.strip().splitlines()[-1])["us_per_send"]
                costs[name].append(cost)
                if not args.json:
                    print(f"run {run + 1} {name:<10} {cost:.2f} us per send", flush=True)
                if server is None:
                    shutil.rmtree(store, ignore_errors=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work_dir, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in costs.items()}
    if args.json:
        print(json.dumps({"sends": args.sends, "median": medians, "runs": costs}))
    else:
        load = " ".join(f"{value:.1f}" for value in os.getloadavg())
        print(f"{args.side}: {args.sends} sends x {REPEATS} per run, median of {args.runs} runs "
              f"(load average {load}):")
        for name, value in medians.items():
            print(f"{name:<10} {value:.2f} us per send")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU per single send from a read's send columns to its answers written, tree against tree:

    .venv/bin/python benchmarks/put_answer_cost_bench.py [--group 32] [--groups 400]
        [--repeats 5] [--runs 3] [--variant NAME=SRC ...] [--dir benchmarks/out] [--json]

At 20,000 msg/s with 64 sends in flight a broker's read carries ~10-60 plain single sends,
served as one group: their columns read from the frames (broker/plain_sends.py), then stored
together (``put_send_columns``: encode, queue offsets, one commit-log write, consume-queue
and index dispatch, msg ids) and answered together (``encode_send_answers``, the
dispatcher's ``_answer_encoded``, the connection's cork and its write). This measures that
second half alone, as the broker runs it: a broker started in the process (its file store in
a temporary directory, ASYNC_FLUSH, no client connected), a connection of its own server on
a socket stand-in that drops the bytes, and each group of ``--group`` SEND_MESSAGE_V2
requests of 1 KiB (8 queues, a UNIQ_KEY each, as tidemq's producer sends them) handed to
the send route's group handler as the dispatcher hands a read's group (its observer, the
flush of the cork). The read of the columns (``read_plain_sends`` and ``send_columns``) is
done for every group before the clock starts and handed over ready, so what is timed is
the checks of the group, the store's put and the answers. ``--groups`` groups timed
``--repeats`` times (``time.thread_time``), the median reported; then, deterministically,
the Python and C function calls one message takes (cProfile over 100 groups), the figure
that does not move with the machine's load. Each ``--variant`` (``NAME=SRC``: ``.`` for
this checkout or another tree's ``src/``) runs in its own process, alternated run by run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import statistics
import sys
import time
from typing import Any

from answering_peer import CountingTransport
from variants import cost_medians, print_cost_medians, run_variant_children, src_variants

TOPIC = "PutAnswerCost"
BODY = os.urandom(1024)
QUEUES = 8
WARM_UP_GROUPS = 300
PROFILED_GROUPS = 100
SEND_MESSAGE_V2 = 310


class _DroppingTransport(CountingTransport):
    """A socket stand-in whose writes are dropped uncounted (no Python work per frame)."""

    def writelines(self, parts) -> None:  # type: ignore[no-untyped-def]
        pass


async def _child(work_dir: str, group: int, groups: int, repeats: int) -> dict[str, float]:
    from tidemq.broker import send_processor
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.controller import BrokerController
    from tidemq.broker.topic_config_manager import TopicConfig
    from tidemq.protocol.command import RemotingCommand
    from tidemq.protocol.frame import FrameDecoder
    from tidemq.protocol.message import encode_properties
    from tidemq.protocol.msgid import new_unique_key
    from tidemq.store.config import StoreConfig
    from tidemq.store.file_store import FileMessageStore

    config = BrokerConfig(listen_port=0)
    store_config = StoreConfig(store_path_root_dir=work_dir, store_host=config.broker_address)
    broker = BrokerController(config, store_config, store=FileMessageStore(store_config))
    await broker.start()
    decoder = FrameDecoder()
    opaque = [0]

    def group_of_sends(index: int) -> list[Any]:
        frames = []
        born = str(time.time_ns() // 1_000_000)
        for k in range(group):
            fields = {"a": "PUT_ANSWER_COST_P", "b": TOPIC, "c": "TBW102", "d": "4",
                      "e": str((index * group + k) % QUEUES), "f": "0", "g": born,
                      "h": "0", "i": encode_properties({"UNIQ_KEY": new_unique_key()}),
                      "n": "broker-a"}
            request = RemotingCommand.request(SEND_MESSAGE_V2, fields, BODY)
            opaque[0] += 1
            request.opaque = opaque[0]
            frames.append(request.encode())
        return decoder.feed(b"".join(frames))

    try:
        broker.topic_config_manager.update(TopicConfig(TOPIC, QUEUES, QUEUES))
        dispatcher = broker.server._dispatcher
        route = dispatcher._routes[SEND_MESSAGE_V2]
        connection = broker.server._new_connection()
        connection.connection_made(_DroppingTransport([0]))
        total = WARM_UP_GROUPS + PROFILED_GROUPS + groups * repeats
        work = [group_of_sends(index) for index in range(total)]
        # The read of the columns, done ahead: the group handler finds each group's ready.
        read_sends = send_processor.read_plain_sends
        make_columns = send_processor.send_columns
        sends_of: dict[int, Any] = {}
        columns_of: dict[int, Any] = {}
        for requests in work:
            sends = read_sends(requests)
            if sends is None:
                raise SystemExit("put_answer_cost_bench: the sends were not read as plain")
            sends_of[id(requests)] = sends
            columns_of[id(sends)] = make_columns(
                sends, config.broker_cluster_name, False, connection.remote_address)
        send_processor.read_plain_sends = lambda requests: sends_of[id(requests)]
        send_processor.send_columns = lambda sends, *_: columns_of[id(sends)]
        serve = dispatcher._serve_group_now
        stored = broker.store.put_send_columns

        def store_checked(columns: Any) -> Any:  # the first groups: the columns path taken?
            put = stored(columns)
            if put is None:
                raise SystemExit("put_answer_cost_bench: the store did not take the columns")
            return put

        def serve_all(requests_list: list[Any]) -> None:
            for requests in requests_list:
                # What the dispatcher does before the group handler: count the requests.
                route.pending += group
                connection._in_flight += group
                serve(route, requests, connection, True)

        broker.store.put_send_columns = store_checked  # type: ignore[method-assign]
        serve_all(work[:WARM_UP_GROUPS])
        broker.store.put_send_columns = stored  # type: ignore[method-assign]
        gc.collect()
        gc.freeze()  # the prepared requests are not the broker's garbage to scan
        profiler = cProfile.Profile()
        profiler.enable()
        serve_all(work[WARM_UP_GROUPS:WARM_UP_GROUPS + PROFILED_GROUPS])
        profiler.disable()
        calls = pstats.Stats(profiler).total_calls / (PROFILED_GROUPS * group)  # type: ignore[attr-defined]
        costs = []
        start = WARM_UP_GROUPS + PROFILED_GROUPS
        for _ in range(repeats):
            started = time.thread_time()
            serve_all(work[start:start + groups])
            costs.append((time.thread_time() - started) / (groups * group) * 1e6)
            start += groups
        written = broker.store.max_offset(TOPIC, 0) + broker.store.max_offset(TOPIC, 1)
        if written < (total * group) // QUEUES:
            raise SystemExit(f"put_answer_cost_bench: only {written} messages in queues 0-1")
        return {"us_per_message": statistics.median(costs), "calls_per_message": calls}
    finally:
        await broker.shutdown(grace_s=1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", type=int, default=32, help="single sends per group")
    parser.add_argument("--groups", type=int, default=400, help="groups timed per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=SRC: a source tree to measure ('.' is this checkout)")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child-store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_store:
        print(json.dumps(asyncio.run(_child(args.child_store, args.group, args.groups,
                                            args.repeats))))
        return 0
    variants = src_variants(args.variant)
    results = run_variant_children(
        "put_answer_cost_bench", __file__, variants, args.runs, args.dir,
        ["--group", str(args.group), "--groups", str(args.groups),
         "--repeats", str(args.repeats)], quiet=args.json)
    medians = cost_medians(results)
    if args.json:
        print(json.dumps({"group": args.group, "median": medians, "runs": results}))
    else:
        print_cost_medians(f"put and answers of groups of {args.group}: {args.groups} groups x "
                           f"{args.repeats} per run, median of {args.runs} runs", medians)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU per single send in the store's put, tree against tree, with its Python call count:

    .venv/bin/python benchmarks/store_put_cost_bench.py [--group 1] [--puts 600] [--repeats 5]
        [--runs 3] [--variant NAME=SRC ...] [--dir benchmarks/out] [--json] [--columns]

A broker hands the store the single sends of one read together (``put_message_group``): one
at a time at 2,000 msg/s, ~20 of one topic over 8 queues at 20,000 msg/s. This measures that
call alone, on a file store in a temporary directory under ASYNC_FLUSH: ``--group`` 1 KiB
messages shaped as the send processor shapes a client's (UNIQ_KEY and CLUSTER properties, an
IPv4 born host, queue ids round robin over 8), ``--puts`` groups timed ``--repeats`` times
(``time.thread_time``), the median reported; then, deterministically, the number of Python
and C function calls one group takes (cProfile), the figure that does not move with the
machine's load. Each ``--variant`` (``NAME=SRC``: ``.`` for this checkout, or another tree's
``src/``, e.g. ``git archive <commit> src | tar -x -C /tmp/before`` then
``before=/tmp/before/src``) runs in its own process, alternated run by run. Printed:
microseconds per message per run, calls per message, and the medians. ``--columns`` hands
each group to the store as a broker's plain sends reach it now: in columns
(``put_send_columns``, with the CLUSTER-suffixed properties text, tags and index keys), or, in
a tree without that call, as the StoreMessages its broker made (``put_message_group``; their
making is not timed).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import sys
import time

from variants import cost_medians, print_cost_medians, run_variant_children, src_variants

BODY = os.urandom(1024)
QUEUES = 8
WARM_UP_PUTS = 500
PROFILED_PUTS = 100


def _child(store_dir: str, group: int, puts: int, repeats: int,
           columns: bool = False) -> dict[str, float]:
    from tidemq.protocol.msgid import new_unique_key
    from tidemq.store import interface
    from tidemq.store.config import StoreConfig
    from tidemq.store.file_store import FileMessageStore
    from tidemq.store.interface import StoreMessage

    def groups(count: int, start: int) -> list[list[StoreMessage]]:
        born = int(time.time() * 1000)
        return [
            [StoreMessage("StorePutCost", (start + n * group + k) % QUEUES, BODY,
                          {"UNIQ_KEY": key, "CLUSTER": "DefaultCluster"},
                          0, 0, born, "127.0.0.1:45678", 0, 0, None,
                          f"UNIQ_KEY\x01{key}\x02CLUSTER\x01DefaultCluster")
             for k in range(group) for key in (new_unique_key(),)]
            for n in range(count)
        ]

    def as_columns(messages: list[StoreMessage]):  # what the broker's plain path hands over
        return interface.SendColumns(  # type: ignore[attr-defined]
            messages[0].topic, [m.queue_id for m in messages], [m.body for m in messages],
            [m.properties_text for m in messages], [m.flag for m in messages],
            [m.sysflag for m in messages], [m.born_timestamp for m in messages],
            messages[0].born_host, None,
            [(m.properties_text.split("\x02")[0].split("\x01")[1],) for m in messages])

    store = FileMessageStore(StoreConfig(store_path_root_dir=store_dir,
                                         store_host="127.0.0.1:10911"))
    put = store.put_message_group
    work: list = groups(WARM_UP_PUTS + PROFILED_PUTS + puts * repeats, 0)
    if columns and hasattr(interface, "SendColumns"):
        put_columns = store.put_send_columns  # type: ignore[attr-defined]

        def put(sends):  # type: ignore[no-redef]
            if put_columns(sends) is None:
                raise SystemExit("store_put_cost_bench: the store did not take the columns")

        work = list(map(as_columns, work))
    try:
        gc.collect()
        gc.freeze()  # the prepared messages are not the store's garbage to scan
        for messages in work[:WARM_UP_PUTS]:
            put(messages)
        profiler = cProfile.Profile()
        profiler.enable()
        for messages in work[WARM_UP_PUTS:WARM_UP_PUTS + PROFILED_PUTS]:
            put(messages)
        profiler.disable()
        calls = pstats.Stats(profiler).total_calls / (PROFILED_PUTS * group)  # type: ignore[attr-defined]
        costs = []
        start = WARM_UP_PUTS + PROFILED_PUTS
        for _ in range(repeats):
            started = time.thread_time()
            for messages in work[start:start + puts]:
                put(messages)
            costs.append((time.thread_time() - started) / (puts * group) * 1e6)
            start += puts
        return {"us_per_message": statistics.median(costs), "calls_per_message": calls}
    finally:
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", type=int, default=1, help="single sends per put")
    parser.add_argument("--puts", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=SRC: a source tree to measure ('.' is this checkout)")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--columns", action="store_true",
                        help="hand each group over as the broker's plain path does (docstring)")
    parser.add_argument("--child-store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_store:
        print(json.dumps(_child(args.child_store, args.group, args.puts, args.repeats,
                                args.columns)))
        return 0
    variants = src_variants(args.variant)
    results = run_variant_children(
        "store_put_cost_bench", __file__, variants, args.runs, args.dir,
        ["--group", str(args.group), "--puts", str(args.puts), "--repeats",
         str(args.repeats), *(["--columns"] if args.columns else [])], quiet=args.json)
    medians = cost_medians(results)
    if args.json:
        print(json.dumps({"group": args.group, "median": medians, "runs": results}))
    else:
        print_cost_medians(f"store put of groups of {args.group}: {args.puts} puts x "
                           f"{args.repeats} per run, median of {args.runs} runs", medians)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Event-loop stalls that a message store's own threads cause, at a low message rate:

    .venv/bin/python benchmarks/loop_stall_bench.py [--rate 2000] [--seconds 10] [--runs 3]
        [--flush ASYNC_FLUSH|SYNC_FLUSH] [--json]

A broker appends on its event loop while the store's threads flush (ASYNC_FLUSH: the commit
log every 500 ms; the consume queues, the index and the checkpoint every second). A thread
that holds the GIL while the disk works (CPython's ``mmap.flush`` does) stops the loop for as
long as the disk takes, once per flush: a periodic stall of every message in flight then.

This opens a ``FileMessageStore`` with the broker's default settings in a fresh directory
(``--dir``), and on an asyncio loop (uvloop where installed, as the broker runs) stores
``--rate`` 1 KiB messages a second over 8 queues from a paced task, while a probe task sleeps
1 ms at a time and records how late each wake-up is. It prints, per run and as the median
over runs, the probe's lateness p99 / p999 / max and how many wake-ups per second were more
than 2 ms late (uvloop's timers have millisecond resolution): the loop's own stalls, without
a network or other processes in the way. ``--idle-queues N`` first writes one message to each
of N other queues and syncs them, as a broker holds after figures.py's 1,024-queue round:
queues that exist but are not written during the run.
Compare two source trees with ``PYTHONPATH=<other tree>/src``, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

PROBE_PERIOD_S = 0.001
QUEUES = 8
# uvloop keeps timers in whole milliseconds: a 1 ms sleep wakes up to ~1 ms late anyway.
LATE_MS = 2.0


async def _run(rate: float, seconds: float, flush: str, root: str, idle_queues: int = 0
               ) -> dict:
    from tidemq.store.config import StoreConfig
    from tidemq.store.file_store import FileMessageStore
    from tidemq.store.interface import StoreMessage

    store = FileMessageStore(StoreConfig(store_path_root_dir=root, flush_disk_type=flush))
    loop = asyncio.get_running_loop()
    body = os.urandom(1024)
    late_ms: list[float] = []
    stored = [0]
    try:
        for queue_id in range(idle_queues):
            store.put_message(StoreMessage(
                f"LoopStallIdle{queue_id // 1000}", queue_id % 1000, body, {},
                born_timestamp=int(time.time() * 1000), born_host="127.0.0.1:50000"))
        store.flush()
        deadline = loop.time() + seconds

        async def produce() -> None:
            interval = 1.0 / rate
            due = loop.time()
            while due < deadline:
                due += interval
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                store.put_message(StoreMessage(
                    "LoopStall", stored[0] % QUEUES, body, {},
                    born_timestamp=int(time.time() * 1000), born_host="127.0.0.1:50000"))
                stored[0] += 1

        async def probe() -> None:
            while loop.time() < deadline:
                due = loop.time() + PROBE_PERIOD_S
                await asyncio.sleep(PROBE_PERIOD_S)
                late_ms.append(max(0.0, loop.time() - due) * 1000)

        await asyncio.gather(produce(), probe())
    finally:
        store.close()
    late_ms.sort()

    def pick(fraction: float) -> float:
        return late_ms[min(len(late_ms) - 1, int(fraction * len(late_ms)))]

    return {"stored": stored[0], "probe_wake_ups": len(late_ms),
            "late_ms_p99": pick(0.99), "late_ms_p999": pick(0.999), "late_ms_max": late_ms[-1],
            "late_over_1ms_per_s": sum(1 for x in late_ms if x > LATE_MS) / seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--flush", choices=("ASYNC_FLUSH", "SYNC_FLUSH"), default="ASYNC_FLUSH")
    parser.add_argument("--idle-queues", type=int, default=0,
                        help="queues written once before the run (not during it)")
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from tidemq.remoting.loop import run as run_on_loop

    os.makedirs(args.dir, exist_ok=True)
    runs = []
    for _ in range(args.runs):
        root = tempfile.mkdtemp(prefix="loop-stall-", dir=args.dir)
        try:
            runs.append(run_on_loop(_run(args.rate, args.seconds, args.flush, root,
                                         args.idle_queues)))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    median = {key: statistics.median(run[key] for run in runs)
              for key in ("late_ms_p99", "late_ms_p999", "late_ms_max", "late_over_1ms_per_s")}
    if args.json:
        print(json.dumps({"runs": runs, "median": median, "load_average": load}))
        return 0
    print(f"loop stall bench: {args.rate:g} msg/s of 1 KiB for {args.seconds:g} s, {args.flush}, "
          f"{args.idle_queues} idle queues, probe every {PROBE_PERIOD_S * 1000:g} ms; "
          f"load {load}")
    for number, run in enumerate(runs):
        print(f"run {number}: {run['stored']} stored; probe late p99 {run['late_ms_p99']:.2f} "
              f"p999 {run['late_ms_p999']:.2f} max {run['late_ms_max']:.2f} ms; "
              f"{run['late_over_1ms_per_s']:.1f} wake-ups/s over {LATE_MS:g} ms late")
    print(f"median of {len(runs)}: p99 {median['late_ms_p99']:.2f} p999 "
          f"{median['late_ms_p999']:.2f} max {median['late_ms_max']:.2f} ms; "
          f"{median['late_over_1ms_per_s']:.1f} wake-ups/s over {LATE_MS:g} ms late")
    return 0


if __name__ == "__main__":
    sys.exit(main())

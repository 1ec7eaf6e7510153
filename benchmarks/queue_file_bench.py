"""What a new consume queue costs: its first file and first entry (issue 18: "a new
consume-queue file must cost microseconds, not milliseconds"; issue 13: space reserved first).

    .venv/bin/python benchmarks/queue_file_bench.py [--queues 512] [--rounds 3] [--dir D]

Creates ``--queues`` consume queues (6,000,000-byte segments, the default) and writes one entry
to each, the way the store does for the first message of a queue (``ensure_room`` then
``put``), then 4,000 more entries to 16 of them. Two ways, alternating, ``--rounds`` times:

- ``whole``: the segment's 6 MB reserved (posix_fallocate) at creation, written through the
  mapping (how tidemq made consume-queue files before);
- ``chunks``: sized sparse, one page reserved and warmed (pwrite zeros) at creation, then 64 KiB
  at a time before the entries that need them (now).

Prints wall and CPU time per new queue, per later entry, and the disk each queue holds (median
over the rounds), the machine's CPU count and load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from tidemq.store.consume_queue import ConsumeQueue, pack_entries

SEGMENT = 6_000_000
LATER_QUEUES = 16  # these get the 4,000 later entries; the disk held is read from the rest


def run(whole: bool, queues: int, base: str | None) -> tuple[float, float, float, float]:
    directory = tempfile.mkdtemp(prefix="tidemq-queue-bench-", dir=base)
    try:
        made = [ConsumeQueue("T", i, os.path.join(directory, str(i)), SEGMENT)
                for i in range(queues)]
        if whole:
            for queue in made:
                queue.queue.reserve_chunk = None
        entry = pack_entries([1], [100], [0])
        wall, cpu = time.perf_counter(), time.process_time()
        for queue in made:
            queue.ensure_room(1)
            queue.put(0, entry, 0)
        new_wall = (time.perf_counter() - wall) / queues * 1e6
        new_cpu = (time.process_time() - cpu) / queues * 1e6
        wall = time.perf_counter()
        for offset in range(1, 4000):
            for queue in made[:LATER_QUEUES]:
                queue.ensure_room(1)
                queue.put(offset, entry, 0)
        later = (time.perf_counter() - wall) / (3999 * LATER_QUEUES) * 1e6
        held = statistics.mean(
            os.stat(queue.segments()[0].path).st_blocks * 512 for queue in made[LATER_QUEUES:]
        )
        for queue in made:
            queue.close()
        return new_wall, new_cpu, later, held
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    if args.queues <= LATER_QUEUES:
        parser.error(f"--queues {args.queues} is too few: the first {LATER_QUEUES} get later "
                     "entries and the disk a new queue holds is read from the others; give "
                     f"--queues {LATER_QUEUES + 1} or more")
    print(f"queue_file_bench: {args.queues} new queues, {SEGMENT}-byte segments; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    results: dict[str, list[tuple[float, float, float, float]]] = {"whole": [], "chunks": []}
    for _ in range(args.rounds):
        for name in results:
            results[name].append(run(name == "whole", args.queues, args.dir))
    for name, runs in results.items():
        new_wall, new_cpu, later, held = (
            statistics.median(column) for column in zip(*runs, strict=True)
        )
        print(f"  {name:6s} new queue + first entry {new_wall:8.1f} us wall, {new_cpu:7.1f} us "
              f"CPU; later entries {later:5.2f} us each; disk per new queue {held / 1024:6.0f} "
              "KiB")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

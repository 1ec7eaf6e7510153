"""How long a thread handed a GIL-free write waits to start it while the event loop is busy:

    .venv/bin/python benchmarks/gil_handoff_bench.py [--switch-ms 5 --switch-ms 0.5]
        [--handoffs 300] [--work-us 2000] [--write-kib 1024] [--dir benchmarks/out]

Issue 18 asks to move work off the event loop's thread where the GIL is released (a
commit-log ``pwrite`` copies into the page cache without it). A writer thread must still take
the GIL to start the call and to return from it, and a thread woken while another runs Python
gets it only when the runner blocks or when the switch interval (``sys.setswitchinterval``,
5 ms by default) forces a hand-over. This stands in for a saturated broker: the main thread
hands a ``--write-kib`` ``pwrite`` to a writer thread every ``--work-us`` microseconds of busy
Python, ``--handoffs`` times, per ``--switch-ms`` value. Printed: the delay from hand-over to
the write starting (median and p90) and how many writes were done within the next stretch
of work. A file of 1 GiB is written (round robin) in a temporary folder under ``--dir`` and
removed.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import tempfile
import threading
import time

FILE_SIZE = 1 << 30


def measure(path: str, switch_s: float, handoffs: int, work_us: int, write_kib: int
            ) -> tuple[float, float, int]:
    """(median start delay s, p90 start delay s, writes done within the next work stretch)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(switch_s)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, FILE_SIZE)
        data = os.urandom(write_kib * 1024)
        jobs: queue.SimpleQueue[float | None] = queue.SimpleQueue()
        delays: list[float] = []
        done = [0]

        def writer() -> None:
            position = 0
            while True:
                handed_at = jobs.get()
                if handed_at is None:
                    return
                delays.append(time.perf_counter() - handed_at)
                os.pwrite(fd, data, position)
                position = (position + len(data)) % FILE_SIZE
                done[0] += 1

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        in_time = 0
        for _ in range(handoffs):
            before = done[0]
            jobs.put(time.perf_counter())
            end = time.perf_counter() + work_us / 1e6
            spins = 0
            while time.perf_counter() < end:  # the loop's Python work, holding the GIL
                spins += 1
            in_time += done[0] > before
        jobs.put(None)
        thread.join()
    finally:
        os.close(fd)
        sys.setswitchinterval(previous)
    ordered = sorted(delays)
    return statistics.median(ordered), ordered[int(0.9 * len(ordered))], in_time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--switch-ms", type=float, action="append",
                        help="switch intervals to try (default: 5 and 0.5)")
    parser.add_argument("--handoffs", type=int, default=300)
    parser.add_argument("--work-us", type=int, default=2000)
    parser.add_argument("--write-kib", type=int, default=1024)
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    print(f"{args.handoffs} hand-overs of a {args.write_kib} KiB pwrite, one per "
          f"{args.work_us} us of busy Python; load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="gil-handoff-", dir=args.dir) as folder:
        path = os.path.join(folder, "data")
        for switch_ms in args.switch_ms or [5.0, 0.5]:
            median_s, p90_s, in_time = measure(path, switch_ms / 1000, args.handoffs,
                                               args.work_us, args.write_kib)
            print(f"switch interval {switch_ms:g} ms: start delay median {median_s * 1e6:,.0f} us,"
                  f" p90 {p90_s * 1e6:,.0f} us; written within the next {args.work_us} us: "
                  f"{in_time}/{args.handoffs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

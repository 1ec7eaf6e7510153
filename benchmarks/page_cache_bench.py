"""What a write into new page cache costs on this machine now, file after file:

    .venv/bin/python benchmarks/page_cache_bench.py [--files 8] [--file-mib 256] [--dir DIR]
        [--json]

The broker appends to its commit log with ``os.pwrite`` into a preallocated segment
(store/commit_log.py): each new page of the log is a new page-cache page, and the kernel time
of that write is on the event loop. This writes ``--files`` files of ``--file-mib`` MiB the same
way (``posix_fallocate``, then 200 KiB ``pwrite`` calls, as a broker's batch appends), keeping
every file until the end, and prints each file's MB/s and system CPU per KiB written. On a
plain machine every file costs the same (~0.2 us/KiB here). In a virtual machine whose host
takes back the guest's free memory (a free-page-reporting balloon, as this one has), the files
written after the guest's still-backed free memory is used up cost ~10x as much (measured
0.2 -> 2.1-2.5 us/KiB after ~900 MB, with no reclaim in /proc/vmstat): the host faults each
page in again. A broker pays that as ~2 us of system time per 1 KiB message on its event loop,
a quarter to a third of what a batched message costs; figures.py's produce_batch round 1,
written after three other rounds (~700 MB), met it on this machine (benchmarks/RESULTS.md).
Run it before comparing throughput figures taken at different times. The files are deleted
at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

CHUNK = os.urandom(200 * 1024)


def write_file(path: str, size: int) -> dict[str, float]:
    """Write ``size`` bytes to a new preallocated file at ``path``: MB/s and system µs/KiB."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        started, before = time.perf_counter(), os.times()
        position = 0
        while position + len(CHUNK) <= size:
            os.pwrite(fd, CHUNK, position)
            position += len(CHUNK)
        seconds, after = time.perf_counter() - started, os.times()
    finally:
        os.close(fd)
    kib = position / 1024
    return {"mb_per_s": position / seconds / 1e6,
            "system_us_per_kib": (after.system - before.system) / kib * 1e6,
            "user_us_per_kib": (after.user - before.user) / kib * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--file-mib", type=int, default=256)
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="page-cache-", dir=args.dir)
    results = []
    try:
        for index in range(args.files):
            figures = write_file(os.path.join(work_dir, f"f{index}"), args.file_mib << 20)
            results.append(figures)
            if not args.json:
                print(f"file {index} ({(index + 1) * args.file_mib} MiB written so far): "
                      f"{figures['mb_per_s']:,.0f} MB/s, system "
                      f"{figures['system_us_per_kib']:.3f} us/KiB", flush=True)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    if args.json:
        print(json.dumps({"file_mib": args.file_mib, "files": results,
                          "load_average": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

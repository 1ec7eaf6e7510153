"""Store start-up time: recovery after SIGKILL (CRC included) and a clean start (issue 13).

    .venv/bin/python benchmarks/recovery_bench.py [--gib 4] [--size 1024] [--runs 3] [--dir D]

Writes a store of ``--gib`` GiB of ``--size``-byte messages (1 GiB segments, the default
layout, 8 queues, one key each) once, closes it cleanly, then opens it repeatedly:

- ``clean``: as left by the clean close (no full-log scan: the last three segments and the
  consume-queue consistency check);
- ``crash (checkpoint)``: with the ``abort`` file put back, as after a SIGKILL: the scan starts
  at the checkpoint's segment;
- ``crash (whole log)``: ``abort`` back and the checkpoint zeroed, so recovery scans and
  CRC-checks the whole log and re-dispatches every record: the worst case; its read rate is
  log bytes / open time.

Prints the parameters, the machine, every run and the median (``--json``: one object). The store
is deleted at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

from tidemq.store.config import StoreConfig
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import StoreMessage

BATCH = 256
QUEUES = 8


def write_store(root: str, gib: float, size: int) -> tuple[int, int]:
    """Fill a store with ``gib`` GiB of messages; return (log bytes, messages)."""
    config = StoreConfig(store_path_root_dir=root, warm_mapped_file_enable=False)
    target = int(gib * (1 << 30))
    body = b"r" * size
    count = 0
    with FileMessageStore(config) as store:
        while store.commit_log_max_offset() < target:
            queue_id = count // BATCH % QUEUES
            batch = [
                StoreMessage("Recovery", queue_id, body, {"KEYS": f"k{count + i}"})
                for i in range(BATCH)
            ]
            result = store.put_messages(batch)
            assert result.ok, result.remark
            count += BATCH
        end = store.commit_log_max_offset()
    return end, count


def open_once(root: str, mode: str) -> float:
    if mode != "clean":
        with open(os.path.join(root, "abort"), "wb"):
            pass
    if mode == "crash (whole log)":
        with open(os.path.join(root, "checkpoint"), "r+b") as f:
            f.write(bytes(24))
    started = time.perf_counter()
    store = FileMessageStore(StoreConfig(store_path_root_dir=root, warm_mapped_file_enable=False))
    elapsed = time.perf_counter() - started
    store.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write the store (a temp dir)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="tidemq-recovery-", dir=args.dir)
    try:
        started = time.perf_counter()
        log_bytes, messages = write_store(root, args.gib, args.size)
        written_s = time.perf_counter() - started
        load = os.getloadavg()
        print(f"recovery_bench: {log_bytes / (1 << 30):.2f} GiB log, {messages} messages of "
              f"{args.size} B, 1 GiB segments, {QUEUES} queues, written in {written_s:.0f} s; "
              f"{os.cpu_count()} CPUs, load average {load[0]:.1f}")
        results: dict[str, list[float]] = {}
        for _ in range(args.runs):
            for mode in ("clean", "crash (checkpoint)", "crash (whole log)"):
                results.setdefault(mode, []).append(open_once(root, mode))
        summary = {}
        for mode, times in results.items():
            median = statistics.median(times)
            rate = log_bytes / median / 1e6 if mode == "crash (whole log)" else None
            summary[mode] = {"runs_s": times, "median_s": median, "log_mb_per_s": rate}
            extra = f", {rate:.0f} MB/s of log" if rate else ""
            print(f"  {mode:20s} open {median:7.2f} s (runs {', '.join(f'{t:.2f}' for t in times)})"
                  f"{extra}")
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
        if args.json:
            print(json.dumps({"log_bytes": log_bytes, "messages": messages, **summary}))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Store start-up time: recovery after SIGKILL (CRC included) and a clean start (issue 13).

    .venv/bin/python benchmarks/recovery_bench.py [--gib 4] [--size 1024] [--runs 3] [--dir D]
        [--segment-mib 1024]

Writes a store of ``--gib`` GiB of ``--size``-byte messages (``--segment-mib`` MiB segments:
1 GiB, the default layout, unless told; 8 queues, one key each) once, closes it cleanly, then
opens it repeatedly:

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
DEFAULT_SEGMENT_BYTES = StoreConfig().mapped_file_size_commit_log


def store_config(root: str, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> StoreConfig:
    """The store's settings for this bench: defaults but the segment size, no warming."""
    return StoreConfig(store_path_root_dir=root, warm_mapped_file_enable=False,
                       mapped_file_size_commit_log=segment_bytes)


def write_store(root: str, gib: float, size: int,
                segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> tuple[int, int]:
    """Fill a store with ``gib`` GiB of messages; return (log bytes, messages)."""
    config = store_config(root, segment_bytes)
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


def open_once(root: str, mode: str,
              segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> tuple[float, float, int]:
    """(open seconds, commit-log scan seconds, bytes scanned) of one open in ``mode``."""
    if mode != "clean":
        with open(os.path.join(root, "abort"), "wb"):
            pass
    if mode == "crash (whole log)":
        with open(os.path.join(root, "checkpoint"), "r+b") as f:
            f.write(bytes(24))
    started = time.perf_counter()
    store = FileMessageStore(store_config(root, segment_bytes))
    elapsed = time.perf_counter() - started
    report = store.recovery_report
    scanned = report.commit_log_end - report.scan_start
    store.close()
    return elapsed, report.scan_seconds, scanned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write the store (a temp dir)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--reuse", default=None, help="open this store instead of writing one")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--segment-mib", type=int, default=DEFAULT_SEGMENT_BYTES >> 20,
                        help="commit-log segment size in MiB (a tiny store opens in seconds "
                        "with small segments; figures are taken with the default)")
    args = parser.parse_args()
    segment_bytes = args.segment_mib << 20
    root = args.reuse or tempfile.mkdtemp(prefix="tidemq-recovery-", dir=args.dir)
    try:
        started = time.perf_counter()
        if args.reuse:
            with FileMessageStore(store_config(root, segment_bytes)) as store:
                log_bytes, messages = store.commit_log_max_offset(), 0
        else:
            log_bytes, messages = write_store(root, args.gib, args.size, segment_bytes)
        written_s = time.perf_counter() - started
        load = os.getloadavg()
        print(f"recovery_bench: {log_bytes / (1 << 30):.2f} GiB log, {messages} messages of "
              f"{args.size} B, {args.segment_mib} MiB segments, {QUEUES} queues, "
              f"written in {written_s:.0f} s; "
              f"{os.cpu_count()} CPUs, load average {load[0]:.1f}")
        results: dict[str, list[tuple[float, float, int]]] = {}
        for _ in range(args.runs):
            for mode in ("clean", "crash (checkpoint)", "crash (whole log)"):
                results.setdefault(mode, []).append(open_once(root, mode, segment_bytes))
        summary = {}
        for mode, runs in results.items():
            times = [run[0] for run in runs]
            median = statistics.median(times)
            rates = [run[2] / run[1] / 1e6 for run in runs if run[1] > 0]
            rate = statistics.median(rates) if rates else 0.0
            scanned = runs[0][2]
            summary[mode] = {"runs_s": times, "median_s": median, "scanned_bytes": scanned,
                             "scan_mb_per_s": rate}
            print(f"  {mode:20s} open {median:7.2f} s (runs {', '.join(f'{t:.2f}' for t in times)})"
                  f"; scanned {scanned / (1 << 20):.0f} MiB of log at {rate:.0f} MB/s "
                  "(magic, sizes, offsets, CRC)")
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
        if args.json:
            print(json.dumps({"log_bytes": log_bytes, "messages": messages, **summary}))
    finally:
        if not args.keep and not args.reuse:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

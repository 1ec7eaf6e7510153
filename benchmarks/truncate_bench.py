"""What a divergent-tail truncation costs an old master rejoining as a slave (issue 12):
``StoreCore.truncate_to`` on a file store of ``--messages`` 1 KiB messages with the default
index settings (one index file covers them all), cutting the last ``--tail`` records.

    .venv/bin/python benchmarks/truncate_bench.py [--messages 300000] [--tail 50] [--rounds 3]

Each round cuts the tail, then appends as many records again (so every round cuts the same
amount off a log of the same size). Prints the wall time of each cut, their median, the log
size, the machine's CPU count and load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from tidemq.store.config import StoreConfig
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import StoreMessage

BODY = b"x" * 1024


def put(store: FileMessageStore, i: int) -> int:
    result = store.put_message(StoreMessage("Bench", i % 8, BODY,
                                            {"KEYS": f"k{i}", "UNIQ_KEY": f"u{i}"}))
    assert result.ok, result.remark
    return result.physical_offset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--tail", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="tidemq-truncate-bench-", dir=args.dir)
    try:
        store = FileMessageStore(StoreConfig(store_path_root_dir=root,
                                             mapped_file_size_commit_log=256 * 1024 * 1024))
        offsets = [put(store, i) for i in range(args.messages)]
        cut_s = []
        for round_number in range(args.rounds):
            cut = offsets[-args.tail]
            started = time.perf_counter()
            truncation = store.truncate_to(cut)
            cut_s.append(time.perf_counter() - started)
            assert truncation.count == args.tail
            base = args.messages + round_number * args.tail
            offsets[-args.tail:] = [put(store, base + i) for i in range(args.tail)]
        size_mib = store.commit_log_max_offset() / 2**20
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{args.messages} messages ({size_mib:.0f} MiB of log), cut {args.tail} records: "
          f"{', '.join(f'{s:.3f}' for s in cut_s)} s; median {statistics.median(cut_s):.3f} s "
          f"(cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()

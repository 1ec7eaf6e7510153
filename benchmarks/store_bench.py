"""Message-store benchmarks (issue: the store and the codec), runnable by anyone:

    .venv/bin/python benchmarks/store_bench.py [--messages 200000] [--size 1024] [--batch 64]
                                               [--runs 3] [--dir benchmarks/out] [--only NAME]
                                               [--properties-text] [--json]

Three figures, each the median of ``--runs`` runs on a fresh store:
- ``append_async``: put_messages (batches of ``--batch``) + dispatch to consume queue and index
  under ASYNC_FLUSH, in msg/s;
- ``append_sync``: 8 threads appending batches under SYNC_FLUSH, each waiting for its batch
  to be durable, in MB/s of record bytes, next to the disk's sequential fsync'd write
  bandwidth measured just before on the same volume (the same bytes written with one fsync);
- ``read_queue``: a sequential read of one queue through the consume queue with
  get_messages (32 messages a call, as a push consumer pulls), in msg/s.

CPU time next to wall time: the machines these run on are shared, so a wall-clock rate says
as much about the neighbours as about the store. Each figure also reports the CPU time the
work took: ``main CPU`` is the measuring thread's own (``time.thread_time``: the append or
read path itself), ``process CPU`` the whole process's (``time.process_time``: flush, group
commit and segment-allocator threads included). ``msg per main-CPU s`` is the rate the path
would reach on an idle core, and is the figure to compare before and after a change; compare
both in the same session, as the machine's load moves from minute to minute.

It prints its parameters and the machine first, then one line per figure; ``--json`` prints
one JSON object instead, for RESULTS.md tooling.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

from tidemq.protocol.message import encode_properties
from tidemq.protocol.msgid import new_unique_key
from tidemq.store.config import FlushDiskType, StoreConfig
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import StoreMessage

TOPIC = "BenchTopic"
SYNC_APPENDERS = 8


@dataclass(slots=True)
class Run:
    """One run of one figure: the work done, the wall time and the CPU time it took."""

    messages: int
    record_bytes: int
    wall_s: float
    main_cpu_s: float  # time.thread_time of the measuring thread
    process_cpu_s: float  # time.process_time: every thread of the process

    @property
    def msg_per_s(self) -> float:
        return self.messages / self.wall_s

    @property
    def mb_per_s(self) -> float:
        return self.record_bytes / self.wall_s / 1e6

    @property
    def msg_per_main_cpu_s(self) -> float:
        return self.messages / max(self.main_cpu_s, 1e-9)

    @property
    def process_cpu_us_per_msg(self) -> float:
        return self.process_cpu_s / self.messages * 1e6


class Stopwatch:
    """Wall, thread and process clocks started together (``with Stopwatch() as watch``)."""

    def __enter__(self) -> Stopwatch:
        self._wall = time.perf_counter()
        self._thread = time.thread_time()
        self._process = time.process_time()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.wall_s = time.perf_counter() - self._wall
        self.main_cpu_s = time.thread_time() - self._thread
        self.process_cpu_s = time.process_time() - self._process

    def run(self, messages: int, record_bytes: int) -> Run:
        return Run(messages, record_bytes, self.wall_s, self.main_cpu_s, self.process_cpu_s)


def machine_description() -> str:
    """CPU model, core count, Python and OS: what a reader needs to compare figures."""
    model = platform.processor() or "unknown cpu"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )


def make_batches(
    count: int, size: int, batch: int, queue_id: int = 0, with_text: bool = False
) -> list[list[StoreMessage]]:
    """Messages as a producer sends them: a body, TAGS, one KEYS token and a UNIQ_KEY.

    ``with_text`` also hands the store the rendered properties string
    (``StoreMessage.properties_text``), as a broker forwarding the client's string would.
    """
    body = os.urandom(size)
    batches = []
    for start in range(0, count, batch):
        messages = []
        for index in range(start, min(start + batch, count)):
            properties = {"TAGS": "bench", "KEYS": f"k{index}", "UNIQ_KEY": new_unique_key()}
            messages.append(
                StoreMessage(
                    topic=TOPIC,
                    queue_id=queue_id,
                    body=body,
                    properties=properties,
                    born_timestamp=int(time.time() * 1000),
                    born_host="127.0.0.1:50000",
                    properties_text=encode_properties(properties) if with_text else None,
                )
            )
        batches.append(messages)
    return batches


def open_store(directory: str, flush_disk_type: FlushDiskType) -> FileMessageStore:
    shutil.rmtree(directory, ignore_errors=True)
    return FileMessageStore(
        StoreConfig(store_path_root_dir=directory, flush_disk_type=flush_disk_type)
    )


def bench_append_async(args: argparse.Namespace, directory: str) -> Run:
    batches = make_batches(args.messages, args.size, args.batch, with_text=args.properties_text)
    store = open_store(directory, FlushDiskType.ASYNC_FLUSH)
    wrote = 0
    try:
        with Stopwatch() as watch:
            for messages in batches:
                result = store.put_messages(messages)
                if not result.ok:
                    raise RuntimeError(f"append failed: {result.status} {result.remark}")
                wrote += result.wrote_bytes
    finally:
        store.close()
    return watch.run(args.messages, wrote)


def disk_fsync_bandwidth(directory: str, total_bytes: int) -> float:
    """MB/s writing ``total_bytes`` sequentially to a new file with one fsync at the end."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "fsync-baseline")
    chunk = os.urandom(1 << 20)
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        while written < total_bytes:
            written += os.write(fd, chunk[: min(len(chunk), total_bytes - written)])
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - started
    os.unlink(path)
    return total_bytes / elapsed / 1e6


def bench_append_sync(args: argparse.Namespace, directory: str) -> tuple[Run, float]:
    """(the store's run, disk baseline MB/s) with SYNC_APPENDERS threads under SYNC_FLUSH.

    The baseline writes as many bytes as the store will and is measured just before it, on
    the same volume, so both see the same disk (and the same neighbours).
    """
    per_thread = args.messages // SYNC_APPENDERS
    work = [
        make_batches(per_thread, args.size, args.batch, i, with_text=args.properties_text)
        for i in range(SYNC_APPENDERS)
    ]
    # One message's record size, from a throwaway in-memory encode, sizes the baseline.
    expected_bytes = per_thread * SYNC_APPENDERS * _record_size(work[0][0][0])
    baseline = disk_fsync_bandwidth(os.path.join(directory, "..", "baseline"), expected_bytes)
    store = open_store(directory, FlushDiskType.SYNC_FLUSH)
    wrote = [0] * SYNC_APPENDERS
    failures: list[str] = []

    def appender(index: int) -> None:
        for messages in work[index]:
            result = store.put_messages(messages)
            status = result.wait_durable(30)
            if status.name != "PUT_OK":
                failures.append(f"{status} {result.remark}")
                return
            wrote[index] += result.wrote_bytes

    threads = [threading.Thread(target=appender, args=(i,)) for i in range(SYNC_APPENDERS)]
    try:
        with Stopwatch() as watch:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        store.close()
    if failures:
        raise RuntimeError(f"sync append failed: {failures[0]}")
    return watch.run(per_thread * SYNC_APPENDERS, sum(wrote)), baseline


def _record_size(message: StoreMessage) -> int:
    from tidemq.store.memory_store import MemoryMessageStore

    with MemoryMessageStore() as memory:
        return memory.put_message(message).wrote_bytes


def bench_read_queue(args: argparse.Namespace, directory: str) -> Run:
    store = open_store(directory, FlushDiskType.ASYNC_FLUSH)
    try:
        for messages in make_batches(args.messages, args.size, args.batch):
            store.put_messages(messages)
        offset = 0
        read = 0
        read_bytes = 0
        with Stopwatch() as watch:
            while True:
                result = store.get_messages(TOPIC, 0, offset, 32, 1 << 20)
                if result.message_count == 0:
                    break
                read += result.message_count
                read_bytes += len(result.body)
                offset = result.next_begin_offset
    finally:
        store.close()
    if read != args.messages:
        raise RuntimeError(f"read {read} messages, expected {args.messages}")
    return watch.run(read, read_bytes)


def _median_run(runs: list[Run]) -> Run:
    """A Run whose every field is the median of that field over ``runs``."""
    return Run(
        messages=runs[0].messages,
        record_bytes=runs[0].record_bytes,
        wall_s=statistics.median(r.wall_s for r in runs),
        main_cpu_s=statistics.median(r.main_cpu_s for r in runs),
        process_cpu_s=statistics.median(r.process_cpu_s for r in runs),
    )


def _cpu_text(run: Run) -> str:
    return (
        f"{run.msg_per_main_cpu_s:,.0f} msg per main-CPU s "
        f"(main CPU {run.main_cpu_s:.2f} s, process CPU {run.process_cpu_s:.2f} s = "
        f"{run.process_cpu_us_per_msg:.2f} us/msg, wall {run.wall_s:.2f} s)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--only", choices=["append_async", "append_sync", "read_queue"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--properties-text", action="store_true",
        help="also pass each message's rendered properties (StoreMessage.properties_text)",
    )
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="store-bench-", dir=args.dir)
    store_dir = os.path.join(work_dir, "store")
    figures: dict[str, object] = {
        "machine": machine_description(),
        "messages": args.messages,
        "size": args.size,
        "batch": args.batch,
        "runs": args.runs,
        "properties_text": args.properties_text,
        "date": time.strftime("%Y-%m-%d"),
    }
    if not args.json:
        print(f"store bench: {args.messages} x {args.size} B, batch {args.batch}, "
              f"median of {args.runs}"
              f"{', properties_text given' if args.properties_text else ''}; dir {work_dir}")
        print(f"machine: {figures['machine']}")
    try:
        if args.only in (None, "append_async"):
            runs = [bench_append_async(args, store_dir) for _ in range(args.runs)]
            median = _median_run(runs)
            figures["append_async_msg_per_s"] = statistics.median(r.msg_per_s for r in runs)
            figures["append_async_msg_per_main_cpu_s"] = median.msg_per_main_cpu_s
            figures["append_async_runs"] = [asdict(r) for r in runs]
            if not args.json:
                print(f"append_async: {figures['append_async_msg_per_s']:,.0f} msg/s wall; "
                      f"{_cpu_text(median)} "
                      f"(runs: {', '.join(f'{r.msg_per_s:,.0f}' for r in runs)})")
        if args.only in (None, "append_sync"):
            pairs = [bench_append_sync(args, store_dir) for _ in range(args.runs)]
            store_mb = statistics.median(p[0].mb_per_s for p in pairs)
            disk_mb = statistics.median(p[1] for p in pairs)
            median = _median_run([p[0] for p in pairs])
            figures["append_sync_mb_per_s"] = store_mb
            figures["disk_fsync_mb_per_s"] = disk_mb
            figures["append_sync_process_cpu_us_per_msg"] = median.process_cpu_us_per_msg
            figures["append_sync_runs"] = [dict(asdict(p[0]), disk_mb_per_s=p[1]) for p in pairs]
            if not args.json:
                print(f"append_sync ({SYNC_APPENDERS} appenders): {store_mb:,.1f} MB/s = "
                      f"{100 * store_mb / disk_mb:.0f}% of the disk's {disk_mb:,.1f} MB/s; "
                      f"process CPU {median.process_cpu_s:.2f} s = "
                      f"{median.process_cpu_us_per_msg:.2f} us/msg, wall {median.wall_s:.2f} s "
                      f"(runs store/disk MB/s: "
                      f"{', '.join(f'{p[0].mb_per_s:.1f}/{p[1]:.1f}' for p in pairs)})")
        if args.only in (None, "read_queue"):
            runs = [bench_read_queue(args, store_dir) for _ in range(args.runs)]
            median = _median_run(runs)
            figures["read_queue_msg_per_s"] = statistics.median(r.msg_per_s for r in runs)
            figures["read_queue_msg_per_main_cpu_s"] = median.msg_per_main_cpu_s
            figures["read_queue_runs"] = [asdict(r) for r in runs]
            if not args.json:
                print(f"read_queue: {figures['read_queue_msg_per_s']:,.0f} msg/s wall; "
                      f"{_cpu_text(median)} "
                      f"(runs: {', '.join(f'{r.msg_per_s:,.0f}' for r in runs)})")
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU per single send of the broker's read, from a read's bytes to the send columns, tree
against tree:

    .venv/bin/python benchmarks/send_read_bench.py [--per-read 32] [--reads 2000] [--runs 5]
        [--variant NAME=SRC ...]

What a broker does with a read of SEND_MESSAGE_V2 frames before the store is touched: the
read is handed to a remoting ``Connection`` as its socket would hand it over (frame decode,
the in-flight count, the dispatcher's grouping, the route's bookkeeping), the group handler
reads each group's columns as the send processor does (``plain_sends``: ``read_send_run``
where the tree has it, else ``read_plain_sends``) and answers with an empty
``EncodedAnswers`` (no store, no answer encode: those are send_cost_bench.py's). The frames
are what tidemq's producer sends: 1 KiB bodies, ten extFields, a UNIQ_KEY alone, 8 queues.
Each ``--variant`` (``NAME=SRC``: ``.`` for this checkout or another tree's ``src/``) runs in
its own process, alternated run by run; each process times ``--reads`` reads five times
(``time.thread_time``) and reports the median. Printed: microseconds per send per run, and
the median over runs. Run it pinned (``chrt -f 5``) on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from variants import rotated, src_variants

BODY = bytes(range(256)) * 4
TOPIC = "SendReadTopic"
REPEATS = 5


class _DroppingTransport(asyncio.Transport):
    """The socket stand-in: nothing read, writes dropped."""

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 45678) if name in ("peername", "sockname") else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def write(self, data: Any) -> None:
        pass

    def writelines(self, parts: Any) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _load_tree(src: str | None) -> dict[str, Any]:
    """The names the bench uses, from this process's ``tidemq`` or, with ``src``, from a
    second copy imported from there (then this process's modules are put back, so both
    stay usable side by side, as codec_bench.py's ``--baseline`` does)."""
    names = ["tidemq.broker.plain_sends", "tidemq.protocol.command", "tidemq.protocol.message",
             "tidemq.protocol.msgid", "tidemq.remoting.connection", "tidemq.remoting.dispatch"]
    saved = {name: module for name, module in sys.modules.items()
             if name == "tidemq" or name.startswith("tidemq.")}
    saved_path = list(sys.path)
    try:
        if src is not None:
            for name in saved:
                del sys.modules[name]
            sys.path.insert(0, src)
        modules = {name.rsplit(".", 1)[1]: importlib.import_module(name) for name in names}
        try:
            modules["send_run"] = importlib.import_module("tidemq.protocol.send_run")
        except ImportError:
            modules["send_run"] = None
        origin = os.path.dirname(sys.modules["tidemq"].__file__ or "")
    finally:
        if src is not None:
            for name in [name for name in sys.modules if name.split(".")[0] == "tidemq"]:
                del sys.modules[name]
            sys.modules.update(saved)
            sys.path[:] = saved_path
    if src is not None and not origin.startswith(os.path.abspath(src)):
        raise SystemExit(f"send_read_bench: imported tidemq from {origin}, not {src}")
    return modules


def _reader(tree: dict[str, Any], per_read: int) -> tuple[Any, list[bytes], list[int]]:
    """A connection of ``tree`` whose SEND route reads each group's columns, the reads it
    is fed, and the count of sends read."""
    plain_sends = tree["plain_sends"]
    read_send_run = getattr(plain_sends, "read_send_run", None)
    read_plain_sends = plain_sends.read_plain_sends
    send_run = tree["send_run"]
    run_class = send_run.SendRun if send_run is not None else None
    columns_read = [0]

    def serve_group(requests: Any, connection: Any) -> Any:
        if run_class is not None and type(requests) is run_class:
            sends = read_send_run(requests)  # type: ignore[misc]
        else:
            sends = read_plain_sends(requests)
        if sends is None:
            raise SystemExit("send_read_bench: a group was not read as plain sends")
        columns_read[0] += len(sends.opaques)
        return tree["dispatch"].EncodedAnswers(b"", 0)

    def serve_one(request: Any, connection: Any) -> Any:
        raise SystemExit("send_read_bench: a send was served alone")

    def read_of_sends() -> bytes:
        frames = []
        for index in range(per_read):
            fields = {"a": "SEND_READ_P", "b": TOPIC, "c": "TBW102", "d": "4",
                      "e": str(index % 8), "f": "0", "g": str(time.time_ns() // 1_000_000),
                      "h": "0",
                      "i": tree["message"].encode_properties(
                          {"UNIQ_KEY": tree["msgid"].new_unique_key()}),
                      "n": "broker-a"}
            frames.append(tree["command"].RemotingCommand.request(310, fields, BODY).encode())
        return b"".join(frames)

    dispatcher = tree["dispatch"].RequestDispatcher()
    dispatcher.register(310, serve_one, group_handler=serve_group, immediate=True)
    connection = tree["connection"].Connection(dispatcher, max_in_flight=4096)
    connection.connection_made(_DroppingTransport())
    return connection, [read_of_sends() for _ in range(20)], columns_read


def _timed(connection: Any, samples: list[bytes], reads: int) -> float:
    """CPU seconds of ``reads`` reads fed to ``connection``."""
    started = time.thread_time()
    for index in range(reads):
        connection.data_received(samples[index % 20])
    return time.thread_time() - started


async def _child(per_read: int, reads: int) -> float:
    connection, samples, columns_read = _reader(_load_tree(None), per_read)
    _timed(connection, samples, 100)  # warm up
    times = [_timed(connection, samples, reads) / (reads * per_read) * 1e6
             for _ in range(REPEATS)]
    if columns_read[0] != (reads * REPEATS + 100) * per_read or connection.in_flight:
        raise SystemExit(f"send_read_bench: {columns_read[0]} sends read, "
                         f"{connection.in_flight} in flight")
    return statistics.median(times)


async def _in_process(variants: list[tuple[str, str]], per_read: int, reads: int,
                      chunks: int) -> dict[str, list[float]]:
    """Every variant's tree loaded side by side, timed chunk by chunk in turn (each chunk
    ``reads`` reads), so that all see the host in the same state."""
    readers = [(name, *_reader(_load_tree(src), per_read)) for name, src in variants]
    for _, connection, samples, _ in readers:
        _timed(connection, samples, 100)  # warm up
    costs: dict[str, list[float]] = {name: [] for name, _ in variants}
    for chunk in range(chunks):
        for name, connection, samples, _ in rotated(readers, chunk):  # type: ignore[arg-type]
            costs[name].append(_timed(connection, samples, reads) / (reads * per_read) * 1e6)
    return costs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-read", type=int, default=32)
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--in-process", type=int, default=0, metavar="CHUNKS",
                        help="load every variant's tree in one process and time CHUNKS chunks "
                             "of --reads reads each, the variants in turn")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(_child(args.per_read, args.reads))))
        return 0
    variants = src_variants(args.variant)
    if args.in_process:
        print(f"send_read_bench: {args.per_read} SEND_MESSAGE_V2 of {len(BODY)} B a read, "
              f"in one process, {args.in_process} chunks of {args.reads} reads a variant; "
              f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
        chunked = asyncio.run(_in_process(variants, args.per_read, args.reads,
                                          args.in_process))
        first = variants[0][0]
        for name, values in chunked.items():
            won = sum(value < base for value, base in zip(values, chunked[first], strict=True))
            print(f"{name}: median {statistics.median(values):.3f} us/send over "
                  f"{len(values)} chunks; lower than {first} in {won}")
        return 0
    print(f"send_read_bench: {args.per_read} SEND_MESSAGE_V2 of {len(BODY)} B a read, "
          f"{args.reads} reads x {REPEATS} a process, {args.runs} runs; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    costs: dict[str, list[float]] = {name: [] for name, _ in variants}
    for run in range(args.runs):
        for name, src in rotated(variants, run):
            env = dict(os.environ, PYTHONPATH=src)
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--per-read", str(args.per_read),
                 "--reads", str(args.reads)], env=env, capture_output=True, text=True,
                timeout=600)
            if out.returncode != 0:
                raise SystemExit(f"send_read_bench: variant {name} ({src}) exited "
                                 f"{out.returncode}: {out.stderr[-2000:]}")
            costs[name].append(json.loads(out.stdout))
            print(f"run {run + 1} {name}: {costs[name][-1]:.3f} us/send", flush=True)
    for name, values in costs.items():
        print(f"{name}: median {statistics.median(values):.3f} us/send "
              f"({', '.join(f'{value:.3f}' for value in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

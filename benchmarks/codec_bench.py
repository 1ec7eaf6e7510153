"""Micro-benchmarks of the protocol codec: the per-request CPU cost of broker and client.

Each case times one operation a broker or client does per request, through public APIs only:

    send_request_encode       client: SEND_MESSAGE_V2 extFields -> RemotingCommand -> frame parts
    send_request_decode       broker: one whole frame fed to a FrameDecoder + typed send header
    send_response_encode      broker: SEND response extFields -> frame parts
    send_response_decode      client: frame fed to a FrameDecoder + SendMessageResponseHeader
    pull_request_encode       client: PULL_MESSAGE extFields -> frame parts
    pull_request_decode       broker: frame fed + PullMessageRequestHeader
    pull_response_encode      broker: PullMessageResponseHeader -> response frame parts
    pull_response_decode      client: frame (header + 32-record body) fed + response header
    frames_64_in_one_read     one read holding 64 SEND responses fed to a FrameDecoder (per frame)
    batch_body_encode_64      client: 64 BatchEntry of 1 KiB -> SEND_BATCH_MESSAGE body
    batch_body_decode_64      broker: that body -> 64 BatchEntry
    pull_body_decode_32       client: a 32-record pull body through iter_records
    pull_receive_256          client: a 256-record pull answer (~300 KB) fed in 64 KiB reads,
                              then its records decoded as a PullConsumer does (CRC checked)

Figures are microseconds per operation (and per message or frame where an operation holds
several): the median of ``--runs`` runs, each a loop long enough to take about
``--min-time-s``. Wall-clock time and process CPU time are both printed: the machine is shared,
so a wall figure far above its CPU figure means another process took the core. Messages are
1 KiB with TAGS, KEYS and UNIQ_KEY properties, as in the broker's targets.

Usage::

    .venv/bin/python benchmarks/codec_bench.py [--runs 5] [--only send_] [--json]
    .venv/bin/python benchmarks/codec_bench.py --baseline /path/to/old/src

``--baseline`` loads a second copy of ``tidemq.protocol`` from another source tree (say a
``git worktree`` of an older commit) into the same process and times the two alternately, run
by run, so both see the same machine load; it prints both figures and the speed-up.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import orjson

import tidemq
from tidemq.protocol.codes import LanguageCode, RequestCode, ResponseCode

# The protocol modules a case uses; ``load_codec`` gives the same names from another tree.
_CODEC_MODULES = (
    "tidemq.protocol.command",
    "tidemq.protocol.frame",
    "tidemq.protocol.headers",
    "tidemq.protocol.message",
    "tidemq.protocol.pulled_records",
)

BODY_SIZE_BYTES = 1024
BATCH_MESSAGES = 64
PULL_MESSAGES = 32
RECEIVE_MESSAGES = 256  # a large pull answer, as with --pull-batch-size 256
RECEIVE_READ_BYTES = 64 * 1024  # what one socket read hands over
FRAMES_PER_READ = 64


@dataclass
class Case:
    """One benchmark: ``operation`` is timed; it handles ``items`` messages or frames."""

    name: str
    operation: Callable[[], object]
    items: int = 1
    item_name: str = ""


def _unique_key(index: int) -> str:
    return f"7F00000100012A9F1B2C3D4E{index:08X}"


def _message_properties(index: int) -> dict[str, str]:
    return {
        "KEYS": f"order-{index}",
        "TAGS": "paid",
        "WAIT": "true",
        "UNIQ_KEY": _unique_key(index),
    }


def _send_fields(properties_text: str) -> dict[str, str]:
    # What tidemq's producer (and, with j..n, a Java 4.9.5 client) puts in a SEND v2 request.
    return {
        "a": "bench-producer-group",
        "b": "BenchTopic",
        "c": "TBW102",
        "d": "4",
        "e": "2",
        "f": "0",
        "g": "1731400000123",
        "h": "0",
        "i": properties_text,
        "j": "0",
        "k": "false",
        "m": "false",
        "n": "broker-a",
    }


def _pull_fields() -> dict[str, str]:
    return {
        "consumerGroup": "bench-consumer-group",
        "topic": "BenchTopic",
        "queueId": "2",
        "queueOffset": "123456",
        "maxMsgNums": "32",
        "sysFlag": "6",
        "commitOffset": "0",
        "suspendTimeoutMillis": "15000",
        "subscription": "*",
        "subVersion": "1731400000000",
        "expressionType": "TAG",
    }


def _stored_records(codec: SimpleNamespace, count: int) -> bytes:
    records = []
    for index in range(count):
        properties = _message_properties(index)
        del properties["WAIT"]
        properties["CLUSTER"] = "DefaultCluster"
        records.append(
            codec.encode_record(
                topic=b"BenchTopic",
                body=bytes([index % 251]) * BODY_SIZE_BYTES,
                properties=codec.encode_properties(properties).encode(),
                queue_id=2,
                queue_offset=123456 + index,
                physical_offset=1_000_000 + index * 1200,
                born_timestamp=1731400000123,
                born_host=(b"\x7f\x00\x00\x01", 53012),
                store_timestamp=1731400000125,
                store_host=(b"\x7f\x00\x00\x01", 10911),
            )
        )
    return b"".join(records)


def load_codec(src_dir: str | None = None) -> SimpleNamespace:
    """The names the cases use from ``tidemq.protocol``: this process's own copy, or a second
    copy imported from the ``tidemq`` package under ``src_dir`` (the modules are imported
    fresh from there, then this process's modules are put back, so both stay usable)."""
    if src_dir is None:
        modules = [importlib.import_module(name) for name in _CODEC_MODULES]
    else:
        saved = {name: module for name, module in sys.modules.items()
                 if name == "tidemq" or name.startswith("tidemq.")}
        saved_path = list(sys.path)
        try:
            for name in saved:
                del sys.modules[name]
            sys.path.insert(0, src_dir)
            modules = [importlib.import_module(name) for name in _CODEC_MODULES]
            origin = os.path.dirname(sys.modules["tidemq"].__file__ or "")
        finally:
            for name in [name for name in sys.modules if name.split(".")[0] == "tidemq"]:
                del sys.modules[name]
            sys.modules.update(saved)
            sys.path[:] = saved_path
        if not origin.startswith(os.path.abspath(src_dir)):
            raise SystemExit(f"--baseline {src_dir}: imported tidemq from {origin} instead")
    namespace = SimpleNamespace()
    for module in modules:
        for name in dir(module):
            if not name.startswith("_"):
                setattr(namespace, name, getattr(module, name))
    return namespace


def _feed_one(codec: SimpleNamespace, frame: bytes) -> Callable[[], object]:
    decoder = codec.FrameDecoder()

    def feed() -> object:
        (command,) = decoder.feed(frame)
        return command

    return feed


def build_cases(codec: SimpleNamespace) -> list[Case]:
    """Every benchmark case on ``codec``, inputs prepared outside the timed operation."""
    RemotingCommand = codec.RemotingCommand
    BatchEntry = codec.BatchEntry
    body = bytes(range(256)) * (BODY_SIZE_BYTES // 256)
    properties_text = codec.encode_properties(_message_properties(0))
    send_fields = _send_fields(properties_text)
    send_request = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, send_fields, body)
    send_request.language = LanguageCode.JAVA
    send_frame = send_request.encode()
    send_response_fields = {
        "MSG_REGION": "DefaultRegion",
        "TRACE_ON": "true",
        "msgId": "7F00000100002A9F00000000000F4240",
        "queueId": "2",
        "queueOffset": "123456",
    }
    send_response = RemotingCommand.response_to(
        send_request, ResponseCode.SUCCESS, None, send_response_fields
    )
    send_response_frame = send_response.encode()

    pull_fields = _pull_fields()
    pull_request = RemotingCommand.request(RequestCode.PULL_MESSAGE, pull_fields)
    pull_request_frame = pull_request.encode()
    pull_body = _stored_records(codec, PULL_MESSAGES)
    pull_response_header = codec.PullMessageResponseHeader(
        suggest_which_broker_id=0, next_begin_offset=123488, min_offset=0, max_offset=200000
    )
    pull_response_frame = RemotingCommand.response_to(
        pull_request, ResponseCode.SUCCESS, None, pull_response_header.to_ext_fields(), pull_body
    ).encode()

    many_frames = send_response_frame * FRAMES_PER_READ
    batch_entries = [
        BatchEntry(body, codec.encode_properties(_message_properties(index)), 0)
        for index in range(BATCH_MESSAGES)
    ]
    batch_body = codec.encode_batch_body(batch_entries)

    def send_request_encode() -> object:
        fields = {**send_fields, "g": str(time.time_ns() // 1_000_000)}
        return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, fields, body).encode_parts()

    send_request_feed = _feed_one(codec, send_frame)

    def send_request_decode() -> object:
        command = send_request_feed()
        return codec.SendMessageRequestHeader.from_ext_fields(command.ext_fields, command.code)

    def send_response_encode() -> object:
        fields = dict(send_response_fields)
        return RemotingCommand.response_to(
            send_request, ResponseCode.SUCCESS, None, fields
        ).encode_parts()

    send_response_feed = _feed_one(codec, send_response_frame)

    def send_response_decode() -> object:
        return codec.SendMessageResponseHeader.from_ext_fields(send_response_feed().ext_fields)

    def pull_request_encode() -> object:
        return RemotingCommand.request(RequestCode.PULL_MESSAGE, pull_fields).encode_parts()

    pull_request_feed = _feed_one(codec, pull_request_frame)

    def pull_request_decode() -> object:
        return codec.PullMessageRequestHeader.from_ext_fields(pull_request_feed().ext_fields)

    def pull_response_encode() -> object:
        return RemotingCommand.response_to(
            pull_request, ResponseCode.SUCCESS, None, pull_response_header.to_ext_fields(),
            pull_body,
        ).encode_parts()

    pull_response_feed = _feed_one(codec, pull_response_frame)

    def pull_response_decode() -> object:
        command = pull_response_feed()
        return codec.PullMessageResponseHeader.from_ext_fields(command.ext_fields), command.body

    receive_body = _stored_records(codec, RECEIVE_MESSAGES)
    receive_frame = RemotingCommand.response_to(
        pull_request, ResponseCode.SUCCESS, None, pull_response_header.to_ext_fields(),
        receive_body,
    ).encode()
    receive_reads = [receive_frame[start : start + RECEIVE_READ_BYTES]
                     for start in range(0, len(receive_frame), RECEIVE_READ_BYTES)]

    def pull_receive() -> object:
        decoder = codec.FrameDecoder()
        for read in receive_reads:
            commands = decoder.feed(read)
        (command,) = commands
        return codec.decode_pulled_records(command.body, "broker-a", damaged=[],
                                           decompress=True)

    many_decoder = codec.FrameDecoder()

    def frames_in_one_read() -> object:
        return many_decoder.feed(many_frames)

    return [
        Case("send_request_encode", send_request_encode),
        Case("send_request_decode", send_request_decode),
        Case("send_response_encode", send_response_encode),
        Case("send_response_decode", send_response_decode),
        Case("pull_request_encode", pull_request_encode),
        Case("pull_request_decode", pull_request_decode),
        Case("pull_response_encode", pull_response_encode),
        Case("pull_response_decode", pull_response_decode),
        Case(f"frames_{FRAMES_PER_READ}_in_one_read", frames_in_one_read, FRAMES_PER_READ, "frame"),
        Case(
            f"batch_body_encode_{BATCH_MESSAGES}",
            lambda: codec.encode_batch_body(batch_entries),
            BATCH_MESSAGES,
            "msg",
        ),
        Case(
            f"batch_body_decode_{BATCH_MESSAGES}",
            lambda: codec.decode_batch_body(batch_body),
            BATCH_MESSAGES,
            "msg",
        ),
        Case(
            f"pull_body_decode_{PULL_MESSAGES}",
            lambda: list(codec.iter_records(pull_body)),
            PULL_MESSAGES,
            "msg",
        ),
        Case(f"pull_receive_{RECEIVE_MESSAGES}", pull_receive, RECEIVE_MESSAGES, "msg"),
    ]


def _loop_count(operation: Callable[[], object], min_time_s: float) -> int:
    """Loops of ``operation`` that take at least ``min_time_s`` (doubling from 1)."""
    loops = 1
    while True:
        started = time.perf_counter()
        for _ in range(loops):
            operation()
        if time.perf_counter() - started >= min_time_s / 4 or loops >= 1 << 24:
            return max(1, int(loops * min_time_s / max(time.perf_counter() - started, 1e-9)))
        loops *= 2


def measure(versions: list[Case], runs: int, min_time_s: float) -> list[dict[str, object]]:
    """Time one case in one or more versions, alternating run by run.

    Each run is a loop calibrated on the first version (the same loop count for all), so
    the versions share the machine's load as fairly as a shared machine allows. Returns
    one result per version: median (and min) µs per operation, wall clock and CPU time.
    """
    for version in versions:
        version.operation()  # warm caches (lru caches, compiled readers) outside the timing
    loops = _loop_count(versions[0].operation, min_time_s)
    wall_us: list[list[float]] = [[] for _ in versions]
    cpu_us: list[list[float]] = [[] for _ in versions]
    for _ in range(runs):
        for index, version in enumerate(versions):
            operation = version.operation
            gc.collect()
            cpu_started = time.process_time()
            started = time.perf_counter()
            for _ in range(loops):
                operation()
            wall_us[index].append((time.perf_counter() - started) / loops * 1e6)
            cpu_us[index].append((time.process_time() - cpu_started) / loops * 1e6)
    results = []
    for version, walls, cpus in zip(versions, wall_us, cpu_us, strict=True):
        wall = statistics.median(walls)
        result: dict[str, object] = {
            "name": version.name,
            "loops": loops,
            "us_per_op": round(wall, 3),
            "cpu_us_per_op": round(statistics.median(cpus), 3),
            "min_us_per_op": round(min(walls), 3),
            "runs_us_per_op": [round(value, 3) for value in walls],
        }
        if version.items > 1:
            result[f"us_per_{version.item_name}"] = round(wall / version.items, 4)
            result[f"{version.item_name}_per_s"] = round(version.items / wall * 1e6)
        results.append(result)
    return results


def _per_item(case: Case, result: dict[str, object]) -> str:
    if case.items == 1:
        return ""
    return (
        f"{result[f'us_per_{case.item_name}']:.3f} us/{case.item_name} "
        f"({result[f'{case.item_name}_per_s']:,} {case.item_name}/s)"
    )


def machine() -> dict[str, object]:
    """What the figures were measured on."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": model,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "orjson": orjson.__version__,
        "tidemq_from": os.path.dirname(tidemq.__file__),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per case; median reported")
    parser.add_argument("--min-time-s", type=float, default=0.2, help="length of one run")
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    parser.add_argument("--baseline", metavar="SRC", help="also time tidemq from SRC/tidemq")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    about = machine()
    parameters = {
        "body_size_bytes": BODY_SIZE_BYTES,
        "batch_messages": BATCH_MESSAGES,
        "pull_messages": PULL_MESSAGES,
        "frames_per_read": FRAMES_PER_READ,
        "runs": args.runs,
        "min_time_s": args.min_time_s,
        "baseline": args.baseline,
    }
    cases = build_cases(load_codec())
    baseline_cases = build_cases(load_codec(args.baseline)) if args.baseline else None
    if not args.json:
        print(" ".join(f"{key}={value}" for key, value in about.items()))
        print(" ".join(f"{key}={value}" for key, value in parameters.items()))
        if baseline_cases:
            print(f"{'case':28} {'base us/op':>10} {'cpu':>8} {'us/op':>10} {'cpu':>8} "
                  f"{'speed-up':>8}  per item")
        else:
            print(f"{'case':28} {'us/op':>10} {'cpu us/op':>10}  per item")
    results = []
    for index, case in enumerate(cases):
        if args.only not in case.name:
            continue
        if baseline_cases:
            base, result = measure([baseline_cases[index], case], args.runs, args.min_time_s)
            result["baseline"] = base
            result["speed_up_cpu"] = round(
                float(base["cpu_us_per_op"]) / float(result["cpu_us_per_op"]), 2  # type: ignore[arg-type]
            )
        else:
            (result,) = measure([case], args.runs, args.min_time_s)
        results.append(result)
        if args.json:
            continue
        if baseline_cases:
            print(
                f"{case.name:28} {base['us_per_op']:10.2f} {base['cpu_us_per_op']:8.2f} "
                f"{result['us_per_op']:10.2f} {result['cpu_us_per_op']:8.2f} "
                f"{result['speed_up_cpu']:7.2f}x  {_per_item(case, result)}",
                flush=True,
            )
        else:
            print(
                f"{case.name:28} {result['us_per_op']:10.2f} {result['cpu_us_per_op']:10.2f}  "
                f"{_per_item(case, result)}",
                flush=True,
            )
    if args.json:
        document = {"machine": about, "parameters": parameters, "results": results}
        print(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

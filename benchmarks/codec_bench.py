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

Figures are microseconds per operation (and per message or frame where an operation holds
several): the median of ``--runs`` runs, each a loop long enough to take about
``--min-time-s``. Wall-clock time and process CPU time are both printed: the machine is shared,
so a wall figure far above its CPU figure means another process took the core. Messages are
1 KiB with TAGS, KEYS and UNIQ_KEY properties, as in the broker's targets.

Usage::

    .venv/bin/python benchmarks/codec_bench.py [--runs 5] [--only send_] [--json]

Compare two versions of the code in the same sitting by putting one's ``src`` first on
PYTHONPATH (``PYTHONPATH=/path/to/old/src python benchmarks/codec_bench.py``).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

import tidemq
from tidemq.protocol.codes import LanguageCode, RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.frame import FrameDecoder
from tidemq.protocol.headers import (
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
)
from tidemq.protocol.message import (
    BatchEntry,
    decode_batch_body,
    encode_batch_body,
    encode_properties,
    encode_record,
    iter_records,
)

BODY_SIZE_BYTES = 1024
BATCH_MESSAGES = 64
PULL_MESSAGES = 32
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


def _stored_records(count: int) -> bytes:
    records = []
    for index in range(count):
        properties = _message_properties(index)
        del properties["WAIT"]
        properties["CLUSTER"] = "DefaultCluster"
        records.append(
            encode_record(
                topic=b"BenchTopic",
                body=bytes([index % 251]) * BODY_SIZE_BYTES,
                properties=encode_properties(properties).encode(),
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


def _feed_one(frame: bytes) -> Callable[[], RemotingCommand]:
    decoder = FrameDecoder()

    def feed() -> RemotingCommand:
        (command,) = decoder.feed(frame)
        return command

    return feed


def build_cases() -> list[Case]:
    """Every benchmark case, with its inputs prepared outside the timed operation."""
    body = bytes(range(256)) * (BODY_SIZE_BYTES // 256)
    properties_text = encode_properties(_message_properties(0))
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
    pull_body = _stored_records(PULL_MESSAGES)
    pull_response_header = PullMessageResponseHeader(
        suggest_which_broker_id=0, next_begin_offset=123488, min_offset=0, max_offset=200000
    )
    pull_response_frame = RemotingCommand.response_to(
        pull_request, ResponseCode.SUCCESS, None, pull_response_header.to_ext_fields(), pull_body
    ).encode()

    many_frames = send_response_frame * FRAMES_PER_READ
    batch_entries = [
        BatchEntry(body, encode_properties(_message_properties(index)), 0)
        for index in range(BATCH_MESSAGES)
    ]
    batch_body = encode_batch_body(batch_entries)

    def send_request_encode() -> object:
        fields = {**send_fields, "g": str(time.time_ns() // 1_000_000)}
        return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, fields, body).encode_parts()

    send_request_feed = _feed_one(send_frame)

    def send_request_decode() -> object:
        command = send_request_feed()
        return SendMessageRequestHeader.from_ext_fields(command.ext_fields, command.code)

    def send_response_encode() -> object:
        fields = dict(send_response_fields)
        return RemotingCommand.response_to(
            send_request, ResponseCode.SUCCESS, None, fields
        ).encode_parts()

    send_response_feed = _feed_one(send_response_frame)

    def send_response_decode() -> object:
        return SendMessageResponseHeader.from_ext_fields(send_response_feed().ext_fields)

    def pull_request_encode() -> object:
        return RemotingCommand.request(RequestCode.PULL_MESSAGE, pull_fields).encode_parts()

    pull_request_feed = _feed_one(pull_request_frame)

    def pull_request_decode() -> object:
        return PullMessageRequestHeader.from_ext_fields(pull_request_feed().ext_fields)

    def pull_response_encode() -> object:
        return RemotingCommand.response_to(
            pull_request, ResponseCode.SUCCESS, None, pull_response_header.to_ext_fields(),
            pull_body,
        ).encode_parts()

    pull_response_feed = _feed_one(pull_response_frame)

    def pull_response_decode() -> object:
        command = pull_response_feed()
        return PullMessageResponseHeader.from_ext_fields(command.ext_fields), command.body

    many_decoder = FrameDecoder()

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
            lambda: encode_batch_body(batch_entries),
            BATCH_MESSAGES,
            "msg",
        ),
        Case(
            f"batch_body_decode_{BATCH_MESSAGES}",
            lambda: decode_batch_body(batch_body),
            BATCH_MESSAGES,
            "msg",
        ),
        Case(
            f"pull_body_decode_{PULL_MESSAGES}",
            lambda: list(iter_records(pull_body)),
            PULL_MESSAGES,
            "msg",
        ),
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


def measure(case: Case, runs: int, min_time_s: float) -> dict[str, object]:
    """Time ``case``: ``runs`` runs of a calibrated loop; medians in µs per operation."""
    operation = case.operation
    operation()  # warm caches (lru caches, first-call imports) outside the timing
    loops = _loop_count(operation, min_time_s)
    wall_us: list[float] = []
    cpu_us: list[float] = []
    for _ in range(runs):
        gc.collect()
        cpu_started = time.process_time()
        started = time.perf_counter()
        for _ in range(loops):
            operation()
        wall_us.append((time.perf_counter() - started) / loops * 1e6)
        cpu_us.append((time.process_time() - cpu_started) / loops * 1e6)
    wall, cpu = statistics.median(wall_us), statistics.median(cpu_us)
    result: dict[str, object] = {
        "name": case.name,
        "loops": loops,
        "us_per_op": round(wall, 3),
        "cpu_us_per_op": round(cpu, 3),
        "runs_us_per_op": [round(value, 3) for value in wall_us],
    }
    if case.items > 1:
        result[f"us_per_{case.item_name}"] = round(wall / case.items, 4)
        result[f"{case.item_name}_per_s"] = round(case.items / wall * 1e6)
    return result


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
    }
    if not args.json:
        print(" ".join(f"{key}={value}" for key, value in about.items()))
        print(" ".join(f"{key}={value}" for key, value in parameters.items()))
        print(f"{'case':28} {'us/op':>10} {'cpu us/op':>10}  per item")
    results = []
    for case in build_cases():
        if args.only not in case.name:
            continue
        result = measure(case, args.runs, args.min_time_s)
        results.append(result)
        if not args.json:
            per_item = ""
            if case.items > 1:
                per_item = (
                    f"{result[f'us_per_{case.item_name}']:.3f} us/{case.item_name} "
                    f"({result[f'{case.item_name}_per_s']:,} {case.item_name}/s)"
                )
            print(
                f"{case.name:28} {result['us_per_op']:10.2f} {result['cpu_us_per_op']:10.2f}  "
                f"{per_item}",
                flush=True,
            )
    if args.json:
        document = {"machine": about, "parameters": parameters, "results": results}
        print(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Frames real third-party RocketMQ 4.x clients sent (tests/data/frames) decode as captured."""

import json
import random
from pathlib import Path

import pytest

from data_paths import CLIENT_FRAMES_DIR
from tidemq.protocol import jsonx
from tidemq.protocol.codes import LanguageCode, RequestCode, SerializeType
from tidemq.protocol.command import decode_command
from tidemq.protocol.frame import FrameDecoder
from tidemq.protocol.headers import (
    REQUEST_HEADERS,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
    read_request_header,
)

ORACLE_FRAMES = CLIENT_FRAMES_DIR
FRAME_FILES = sorted(ORACLE_FRAMES.glob("*/*.bin"))
CAPTURES = sorted({path.parent for path in FRAME_FILES})


def test_the_oracle_frames_are_there():
    # A missing folder must fail loudly rather than leave the tests below with nothing to run.
    assert len(FRAME_FILES) >= 300, f"expected the oracle frames under {ORACLE_FRAMES}"


def captured(path: Path) -> tuple[bytes, dict]:
    return path.read_bytes(), json.loads(path.with_suffix(".json").read_text())


def java_string(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def captured_body(record: dict) -> bytes | None:
    body = record["body"]
    if body is None:
        return None
    if "utf8" in body:
        return body["utf8"].encode()
    return bytes.fromhex(body["hex"])


@pytest.mark.parametrize("path", FRAME_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_oracle_frame_decodes_to_the_captured_header(path):
    frame, record = captured(path)
    expected = record["header"]
    assert int.from_bytes(frame[:4], "big") == record["totalLength"] == len(frame) - 4

    command = decode_command(frame[4:])

    assert command.serialize_type == SerializeType(record["serializeType"])
    assert command.code == expected["code"]
    assert command.opaque == expected["opaque"]
    assert command.flag == expected["flag"]
    assert command.version == expected["version"]
    assert command.language == LanguageCode[expected["language"]]
    assert command.remark == expected.get("remark")
    if expected["extFields"] is None:
        assert command.ext_fields is None
    else:
        assert command.ext_fields == {
            key: java_string(value) for key, value in expected["extFields"].items()
        }
    assert command.body == captured_body(record)
    assert len(command.body or b"") == record["bodyLength"]
    assert not command.is_response
    assert command.is_oneway == bool(expected["flag"] & 2)


def test_the_captures_include_oneway_null_ext_fields_and_typed_values():
    records = [captured(path)[1]["header"] for path in FRAME_FILES]
    assert any(header["flag"] == 2 for header in records)
    assert any(header["extFields"] is None for header in records)
    values = [v for header in records for v in (header["extFields"] or {}).values()]
    assert any(isinstance(v, bool) for v in values)
    assert any(isinstance(v, int) and not isinstance(v, bool) for v in values)


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_a_whole_captured_session_splits_into_the_same_frames(capture):
    frames = [path.read_bytes() for path in sorted(capture.glob("*.bin"))]
    stream = b"".join(frames)
    rng = random.Random(capture.name)
    decoder = FrameDecoder()
    commands = []
    position = 0
    while position < len(stream):
        size = rng.choice([1, 3, 17, 200, 4096])
        commands += decoder.feed(stream[position : position + size])
        position += size
    assert [command.opaque for command in commands] == [
        decode_command(frame[4:]).opaque for frame in frames
    ]
    assert decoder.buffered_bytes == 0


TYPED_FRAMES = [
    path for path in FRAME_FILES
    if int(path.stem.rpartition("code")[2]) in REQUEST_HEADERS
]


@pytest.mark.parametrize("path", TYPED_FRAMES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_oracle_frame_reads_as_its_typed_header(path):
    command = decode_command(path.read_bytes()[4:])
    header = read_request_header(command.code, command.ext_fields)
    assert isinstance(header, REQUEST_HEADERS[command.code])
    # Every field the client sent under a name the header knows comes back the same,
    # except that Java booleans written as 0/1 (the C++ client) read as false/true.
    written = header.to_ext_fields() if command.code != RequestCode.SEND_MESSAGE else (
        header.to_ext_fields(v2=False)
    )
    sent_known = {key: value for key, value in command.ext_fields.items() if key in written}
    assert sent_known, "no extField of the capture was understood"
    for key, sent in sent_known.items():
        assert written[key] in (sent, {"0": "false", "1": "true"}.get(sent)), key


def test_typed_headers_cover_send_pull_and_route_captures():
    codes = {int(path.stem.rpartition("code")[2]) for path in TYPED_FRAMES}
    assert {10, 11, 14, 15, 17, 30, 35, 38, 105, 310} <= codes


def test_send_v2_capture_reads_the_short_keys():
    path = ORACLE_FRAMES / "nodecpp_produce_consume" / "0005_c2s_code310.bin"
    command = decode_command(path.read_bytes()[4:])
    header = SendMessageRequestHeader.from_ext_fields(command.ext_fields, command.code)
    assert header.producer_group == "pg_capture"
    assert header.topic == "TopicTest"
    assert header.default_topic == "TBW102"
    assert header.default_topic_queue_nums == 4
    assert header.born_timestamp == 1795361042913
    assert header.max_reconsume_times == 1
    assert header.unit_mode is False and header.batch is False
    assert "UNIQ_KEY\x017F0000016BF92E6959896F7389E10000" in header.properties


def test_send_v1_capture_from_the_cpp_client_reads_its_zero_booleans():
    path = ORACLE_FRAMES / "cpp_orderly" / "0005_c2s_code10.bin"
    command = decode_command(path.read_bytes()[4:])
    header = SendMessageRequestHeader.from_ext_fields(command.ext_fields, command.code)
    assert header.topic == "TopicOrd"
    assert header.batch is False and header.unit_mode is False
    assert header.reconsume_times == 0


def test_pull_capture_reads_every_field():
    path = ORACLE_FRAMES / "alions_ordered_small" / "0040_c2s_code11.bin"
    command = decode_command(path.read_bytes()[4:])
    header = PullMessageRequestHeader.from_ext_fields(command.ext_fields)
    assert header == PullMessageRequestHeader(
        consumer_group="oracle_ocg_cap2", topic="OracleOrder_cap2", queue_id=0, queue_offset=0,
        max_msg_nums=32, sys_flag=6, commit_offset=0, suspend_timeout_millis=15000,
        subscription="*", sub_version=1795361014241,
    )


HEART_BEATS = [path for path in FRAME_FILES if path.stem.endswith("code34")]


@pytest.mark.parametrize("path", HEART_BEATS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_heart_beat_bodies_parse_as_json(path):
    command = decode_command(path.read_bytes()[4:])
    assert command.code == RequestCode.HEART_BEAT
    heartbeat = jsonx.loads(command.body)
    assert isinstance(heartbeat["clientID"], str) and heartbeat["clientID"]
    assert isinstance(heartbeat.get("consumerDataSet", []), list)
    assert isinstance(heartbeat.get("producerDataSet", []), list)

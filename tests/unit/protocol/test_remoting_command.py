"""RemotingCommand: JSON and ROCKETMQ headers, both ways, and what peers really send."""

import struct
import tracemalloc

import orjson
import pytest

from tidemq.errors import LocalProtocolError, RemoteProtocolError
from tidemq.protocol.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    TIDEMQ_VERSION,
    LanguageCode,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from tidemq.protocol.command import RemotingCommand, decode_command

JSON = SerializeType.JSON
ROCKETMQ = SerializeType.ROCKETMQ


def json_frame(header: bytes | str, body: bytes = b"") -> bytes:
    """Everything after the length prefix: header word (type JSON), header, body."""
    if isinstance(header, str):
        header = header.encode()
    return struct.pack(">I", len(header)) + header + body


def binary_frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I", 1 << 24 | len(header)) + header + body


def binary_header(
    *, code=10, language=0, version=409, opaque=1, flag=0, remark=b"", ext=b""
) -> bytes:
    return (
        struct.pack(">hBhii", code, language, version, opaque, flag)
        + struct.pack(">i", len(remark))
        + remark
        + struct.pack(">i", len(ext))
        + ext
    )


def ext_entry(key: bytes, value: bytes) -> bytes:
    return struct.pack(">h", len(key)) + key + struct.pack(">i", len(value)) + value


# -- encoding ---------------------------------------------------------------------------------


def test_json_header_is_written_as_fastjson_writes_it():
    command = RemotingCommand(
        code=RequestCode.GET_ROUTEINFO_BY_TOPIC,
        opaque=1,
        ext_fields={"topic": "TBW102"},
        language=LanguageCode.JAVA,
        version=401,
    )
    frame = command.encode()
    expected_header = (
        b'{"code":105,"extFields":{"topic":"TBW102"},"flag":0,"language":"JAVA","opaque":1,'
        b'"serializeTypeCurrentRPC":"JSON","version":401}'
    )
    assert frame == struct.pack(">ii", 4 + len(expected_header), len(expected_header)) + (
        expected_header
    )


def test_json_header_omits_null_remark_and_ext_fields():
    response = RemotingCommand(code=0, opaque=1, flag=FLAG_RESPONSE, language=LanguageCode.JAVA,
                               version=403)
    assert response.encode()[8:] == (
        b'{"code":0,"flag":1,"language":"JAVA","opaque":1,'
        b'"serializeTypeCurrentRPC":"JSON","version":403}'
    )


def test_our_commands_say_python_and_version_409():
    header = orjson.loads(RemotingCommand.request(RequestCode.HEART_BEAT).encode()[8:])
    assert header["language"] == "PYTHON"
    assert header["version"] == TIDEMQ_VERSION == 409


def test_json_ext_field_values_are_always_written_as_strings():
    command = RemotingCommand(code=15, ext_fields={"queueId": 3, "unitMode": False, "x": None})
    header = orjson.loads(command.encode()[8:])
    assert header["extFields"] == {"queueId": "3", "unitMode": "false"}


def test_binary_header_layout_matches_rocketmq_serializable():
    command = RemotingCommand(
        code=310, opaque=7, flag=FLAG_ONEWAY, remark="hé", ext_fields={"a": "pg"},
        language=LanguageCode.JAVA, version=409, serialize_type=ROCKETMQ, body=b"xyz",
    )
    header = binary_header(
        code=310, language=0, version=409, opaque=7, flag=2, remark="hé".encode(),
        ext=ext_entry(b"a", b"pg"),
    )
    assert command.encode() == struct.pack(">iI", 4 + len(header) + 3, 1 << 24 | len(header)) + (
        header + b"xyz"
    )


def test_encode_parts_hands_the_body_over_uncopied():
    body = bytes(100_000)
    command = RemotingCommand(code=11, body=body)
    parts = command.encode_parts()
    assert len(parts) == 2
    assert parts[1] is body
    assert b"".join(parts) == command.encode()
    assert len(RemotingCommand(code=11).encode_parts()) == 1


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (RemotingCommand(code=1 << 15, serialize_type=ROCKETMQ), "int16"),
        (RemotingCommand(code=10, version=70000, serialize_type=ROCKETMQ), "int16"),
        (RemotingCommand(code=1 << 31), "int32"),
        (RemotingCommand(code=10, opaque=-(1 << 31) - 1), "int32"),
        (RemotingCommand(code=10, remark="\ud800"), "JSON"),
        (RemotingCommand(code=10, remark="\ud800", serialize_type=ROCKETMQ), "UTF-8"),
        (RemotingCommand(code=10, serialize_type=7), "serialize type"),
    ],
)
def test_commands_the_protocol_cannot_carry_raise_local_protocol_error(command, words):
    with pytest.raises(LocalProtocolError, match=words):
        command.encode()


# -- requests and responses -------------------------------------------------------------------


def test_requests_get_distinct_opaques_and_responses_echo_them():
    first = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "pg"}, b"body")
    second = RemotingCommand.request(RequestCode.PULL_MESSAGE, serialize_type=ROCKETMQ)
    assert first.opaque != second.opaque
    assert 0 <= first.opaque < 1 << 31
    assert not first.is_response and not first.is_oneway
    response = RemotingCommand.response_to(second, ResponseCode.PULL_NOT_FOUND, "no message")
    assert response.opaque == second.opaque
    assert response.serialize_type == ROCKETMQ
    assert response.is_response and not response.is_oneway
    assert response.remark == "no message"
    decoded = RemotingCommand.decode(response.encode()[4:])
    assert decoded.is_response and decoded.opaque == second.opaque
    assert decoded == decode_command(response.encode()[4:])


def test_oneway_request_sets_the_oneway_bit():
    command = RemotingCommand.request(RequestCode.END_TRANSACTION, oneway=True)
    assert command.flag == FLAG_ONEWAY
    assert command.is_oneway
    assert decode_command(command.encode()[4:]).is_oneway


def test_request_copies_ext_fields_so_later_edits_do_not_leak():
    ext = {"topic": "T"}
    command = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, ext)
    ext["topic"] = "other"
    assert command.ext_fields == {"topic": "T"}


def test_describe_names_the_code_and_never_dumps_the_body():
    request = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, body=b"SECRET" * 100)
    text = request.describe()
    assert "SEND_MESSAGE_V2(310)" in text
    assert f"opaque={request.opaque}" in text
    assert "SECRET" not in text
    response = RemotingCommand.response_to(request, ResponseCode.TOPIC_NOT_EXIST, "no topic T")
    assert "TOPIC_NOT_EXIST(17)" in response.describe()
    assert "no topic T" in response.describe()
    assert "code 9999" in RemotingCommand(code=9999).describe()


# -- tolerant JSON reading --------------------------------------------------------------------


def test_json_language_may_be_a_name_or_a_number():
    def language_of(value) -> int:
        header = orjson.dumps({"code": 10, "opaque": 1, "language": value})
        return decode_command(json_frame(header)).language

    assert language_of("CPP") == LanguageCode.CPP
    assert language_of(1) == LanguageCode.CPP
    assert language_of("NODE_JS") == LanguageCode.NODE_JS
    assert language_of("KLINGON") == LanguageCode.OTHER
    assert language_of(99) == LanguageCode.OTHER
    assert decode_command(json_frame('{"code":10,"opaque":1}')).language == LanguageCode.JAVA


def test_json_ext_field_values_of_any_type_become_java_strings():
    header = (
        '{"code":310,"opaque":2,"extFields":{"d":4,"k":false,"m":true,"x":1.5,"n":null,'
        '"s":"str","big":1795361807572}}'
    )
    command = decode_command(json_frame(header))
    assert command.ext_fields == {
        "d": "4", "k": "false", "m": "true", "x": "1.5", "s": "str", "big": "1795361807572",
    }


def test_json_null_or_missing_ext_fields_and_remark_read_as_none():
    command = decode_command(json_frame('{"code":34,"opaque":5,"extFields":null,"remark":null}'))
    assert command.ext_fields is None
    assert command.remark is None
    assert command.flag == 0 and command.version == 0
    assert decode_command(json_frame('{"code":34,"opaque":5}')).ext_fields is None


def test_json_header_with_body_keeps_the_body():
    command = decode_command(json_frame('{"code":34,"opaque":5,"flag":0}', b"{}"))
    assert command.body == b"{}"
    assert decode_command(json_frame('{"code":34,"opaque":5}')).body is None


@pytest.mark.parametrize(
    ("header", "words"),
    [
        (b"[1,2]", "list, expected an object"),
        (b'"code"', "str, expected an object"),
        (b"42", "int, expected an object"),
        (b"{not json", "not valid UTF-8 JSON"),
        (b'{"code":10,"remark":"\xff\xfe"}', "not valid UTF-8 JSON"),
        (b"", "not valid UTF-8 JSON"),
        (b'{"opaque":1}', "no 'code'"),
        (b'{"code":10}', "no 'opaque'"),
        (b'{"code":"10","opaque":1}', "'code' is '10'"),
        (b'{"code":true,"opaque":1}', "'code' is True"),
        (b'{"code":10,"opaque":1.5}', "'opaque' is 1.5"),
        (b'{"code":10,"opaque":4294967296}', "'opaque' is 4294967296"),
        (b'{"code":10,"opaque":1,"flag":"x"}', "'flag'"),
        (b'{"code":10,"opaque":1,"extFields":[1]}', "extFields is a list"),
    ],
)
def test_malformed_json_headers_raise_remote_protocol_error(header, words):
    with pytest.raises(RemoteProtocolError, match=words):
        decode_command(json_frame(header))


# -- ROCKETMQ binary reading ------------------------------------------------------------------


def test_binary_header_decodes_every_field():
    header = binary_header(
        code=11, language=9, version=373, opaque=-5, flag=1, remark=b"ok",
        ext=ext_entry(b"topic", "Tö".encode()) + ext_entry(b"empty", b""),
    )
    command = decode_command(binary_frame(header, b"payload"))
    assert command == RemotingCommand(
        code=11, opaque=-5, flag=1, remark="ok", ext_fields={"topic": "Tö", "empty": ""},
        body=b"payload", language=LanguageCode.GO, version=373, serialize_type=ROCKETMQ,
    )


def test_binary_header_with_no_remark_and_no_ext_fields_reads_as_none():
    command = decode_command(binary_frame(binary_header(language=200)))
    assert command.remark is None
    assert command.ext_fields is None
    assert command.language == LanguageCode.OTHER


@pytest.mark.parametrize(
    ("header", "words"),
    [
        (binary_header()[:12], "shorter than its 21 fixed bytes"),
        (binary_header(remark=b"abcdef")[:-5], "remark length is 6"),
        (binary_header()[:13] + struct.pack(">i", 2**31 - 1) + bytes(4), "remark length"),
        (binary_header()[:13] + struct.pack(">i", -1) + bytes(4), "remark length is -1"),
        (binary_header(ext=ext_entry(b"k", b"v"))[:-2], "extFields block length is 8"),
        (binary_header()[:17] + struct.pack(">i", 2**31 - 1), "extFields block length"),
        (binary_header()[:17] + struct.pack(">i", -8), "extFields block length is -8"),
        (binary_header(ext=b"\x00"), "inside a key length"),
        (binary_header(ext=struct.pack(">h", 50) + b"k" + bytes(4)), "key length is 50"),
        (binary_header(ext=struct.pack(">h", -3) + bytes(8)), "key length is -3"),
        (
            binary_header(ext=struct.pack(">h", 1) + b"k" + struct.pack(">i", 2**31 - 1)),
            "value length is 2147483647",
        ),
        (binary_header(ext=struct.pack(">h", 1) + b"k" + bytes(2)), "key length is 1"),
        (binary_header(remark=b"\xff\xfe"), "remark is not valid UTF-8"),
        (binary_header(ext=ext_entry(b"\xc3", b"v")), "key is not valid UTF-8"),
        (binary_header(ext=ext_entry(b"k", b"\xed\xa0\x80")), "value is not valid UTF-8"),
    ],
)
def test_malformed_binary_headers_raise_remote_protocol_error(header, words):
    with pytest.raises(RemoteProtocolError, match=words):
        decode_command(binary_frame(header, b"body"))


@pytest.mark.parametrize(
    ("frame", "words"),
    [
        (b"", "too short"),
        (b"\x00\x00", "too short"),
        (struct.pack(">I", 2 << 24), "serialize type 2"),
        (struct.pack(">I", 50) + b"{}", "header is 50 bytes"),
    ],
)
def test_malformed_frames_raise_remote_protocol_error(frame, words):
    with pytest.raises(RemoteProtocolError, match=words):
        decode_command(frame)


def test_lying_binary_lengths_allocate_nothing_large():
    header = binary_header()[:13] + struct.pack(">i", 2**31 - 1) + bytes(4)
    frame = binary_frame(header, b"body")
    tracemalloc.start()
    try:
        with pytest.raises(RemoteProtocolError):
            decode_command(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000

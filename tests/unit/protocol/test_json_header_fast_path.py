"""The JSON header's fast paths answer as the general code does, on random headers and reads.

``decode_json_header`` reads what Java and tidemq peers send with type checks only and makes
the command without its class call; ``FrameDecoder`` decodes a read's JSON frames without
``decode_checked_frame``; ``JsonRequestTemplate.render`` makes its request without the class
call either. Each is held here to the general code it stands in for: the tolerant reader
``_decode_json_fields`` (same command, or the same error and message), ``decode_command``
frame by frame (same commands, or the same first error), and a ``TemplateRequest`` made by
its class.
"""

import dataclasses
import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import RemoteProtocolError
from tidemq.protocol import command as command_module
from tidemq.protocol.codes import LanguageCode
from tidemq.protocol.command import (
    JsonRequestTemplate,
    RemotingCommand,
    TemplateRequest,
    decode_command,
    decode_json_header,
)
from tidemq.protocol.frame import FrameDecoder

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)
numbers = st.integers(INT32_MIN, INT32_MAX)
odd_values = (st.none() | st.booleans() | numbers
              | st.sampled_from([INT32_MIN - 1, INT32_MAX + 1, 2**63 - 1, -(2**63)])
              | st.sampled_from([INT32_MIN, INT32_MAX, 0, 1]) | st.floats(allow_nan=False,
              allow_infinity=False) | text | st.lists(numbers, max_size=2)
              | st.dictionaries(text, numbers, max_size=2))
language_values = (st.sampled_from([*LanguageCode.__members__, "KLINGON", ""])
                   | st.integers(-2, 20) | odd_values)


@st.composite
def headers(draw) -> dict:
    """Header objects of every kind: mostly well-formed, often with odd or missing fields."""
    header = {
        "code": draw(numbers),
        "extFields": draw(st.none() | st.dictionaries(text, text, max_size=5)),
        "flag": draw(numbers),
        "language": draw(language_values),
        "opaque": draw(numbers),
        "remark": draw(st.none() | text),
        "serializeTypeCurrentRPC": "JSON",
        "version": draw(numbers),
    }
    for name in sorted(header):  # each field kept (14 in 16), left out or made odd
        choice = draw(st.integers(0, 15))
        if choice == 0:
            del header[name]
        elif choice == 1 and name == "extFields":
            header[name] = draw(st.dictionaries(text, text | odd_values, min_size=1,
                                                max_size=4))
        elif choice == 1:
            header[name] = draw(odd_values)
    order = draw(st.permutations(list(header)))
    return {name: header[name] for name in order}


def general_decode(header_bytes: bytes) -> RemotingCommand | str:
    """What the general reader answers: the command, or the error's message."""
    try:
        fields = orjson.loads(header_bytes)
    except orjson.JSONDecodeError as e:
        return f"JSON header is not valid UTF-8 JSON: {e}"
    try:
        return command_module._decode_json_fields(fields)
    except RemoteProtocolError as e:
        return str(e)


def fast_decode(header_bytes: bytes) -> RemotingCommand | str:
    try:
        return decode_json_header(header_bytes)
    except RemoteProtocolError as e:
        return str(e)


def assert_whole_command(command: RemotingCommand) -> None:
    """Every field of the dataclass is stored (a command made without its class call)."""
    for field in dataclasses.fields(RemotingCommand):
        getattr(command, field.name)
    repr(command)


@settings(max_examples=300, deadline=None)
@given(headers())
def test_a_json_header_decodes_as_the_general_reader_reads_it(header):
    header_bytes = orjson.dumps(header)
    fast = fast_decode(header_bytes)
    assert fast == general_decode(header_bytes)
    if isinstance(fast, RemotingCommand):
        assert_whole_command(fast)
        assert type(fast) is RemotingCommand
        assert type(fast.language) is LanguageCode


ODD_VALUES = [
    "missing", None, True, False, 0, 1, -1, INT32_MAX, INT32_MIN, INT32_MAX + 1, INT32_MIN - 1,
    2**63 - 1, 1.0, 1.5, "", "7", "JAVA", "PYTHON", "KLINGON", 0.0, [], ["JAVA"], {}, {"a": "b"},
    {"a": 1}, {"a": None}, {"a": True}, {"a": 1.5}, {"a": ["x"]}, {"a": {"b": "c"}},
]
WELL_FORMED = {
    "code": 310, "extFields": {"a": "pg", "b": "T"}, "flag": 0, "language": "PYTHON",
    "opaque": 7, "remark": "ok", "serializeTypeCurrentRPC": "JSON", "version": 409,
}


@pytest.mark.parametrize("name", sorted(WELL_FORMED))
def test_each_field_odd_or_missing_decodes_as_the_general_reader_reads_it(name):
    # Every guard of the fast path in turn: one field made odd (or left out), the rest fine.
    for value in ODD_VALUES:
        header = dict(WELL_FORMED)
        if value == "missing":
            del header[name]
        else:
            header[name] = value
        header_bytes = orjson.dumps(header)
        assert fast_decode(header_bytes) == general_decode(header_bytes), header


@pytest.mark.parametrize("header_bytes", [
    b"", b"{", b"[]", b"7", b'"x"', b"null", b"\xff\xfe", b'{"code":1,"opaque":2}x',
    b'{"code":1,"opaque":2,"extFields":[]}', b'{"code":true,"opaque":2}',
    b'{"code":1,"opaque":2,"language":["JAVA"]}', b'{"code":1,"opaque":2,"language":{}}',
])
def test_malformed_json_headers_are_refused_with_the_general_readers_message(header_bytes):
    assert fast_decode(header_bytes) == general_decode(header_bytes)


frames = st.tuples(headers(), st.binary(max_size=40))


def frame_of(header: dict, body: bytes) -> bytes:
    header_bytes = orjson.dumps(header)
    return struct.pack(">iI", 4 + len(header_bytes) + len(body), len(header_bytes)) + (
        header_bytes + body)


def one_by_one(frames_bytes: list[bytes]) -> tuple[list[RemotingCommand], str | None]:
    """decode_command frame by frame until the first error (the general path)."""
    commands = []
    for frame in frames_bytes:
        try:
            commands.append(decode_command(frame[4:]))
        except RemoteProtocolError as e:
            return commands, str(e)
    return commands, None


@settings(max_examples=200, deadline=None)
@given(st.lists(frames, min_size=1, max_size=8), st.sampled_from([bytes, bytearray, memoryview]),
       st.integers(1, 64))
def test_a_read_of_json_frames_decodes_as_each_frame_alone(frame_list, kind, chunk):
    frames_bytes = [frame_of(header, body) for header, body in frame_list]
    expected, error = one_by_one(frames_bytes)
    data = b"".join(frames_bytes)
    # All in one read, then the same stream cut into reads of ``chunk`` bytes.
    for reads in ([data], [data[start:start + chunk] for start in range(0, len(data), chunk)]):
        decoder = FrameDecoder()
        commands: list[RemotingCommand] = []
        try:
            for read in reads:
                commands += decoder.feed(kind(read))
        except RemoteProtocolError as e:
            assert error == str(e)
            # A read's commands before the error are dropped with it: a prefix of them.
            assert commands == expected[:len(commands)]
        else:
            assert error is None
            assert commands == expected
            for command in commands:
                assert_whole_command(command)
                assert command.body is None or type(command.body) is bytes


names = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8)
plain_values = st.text("abcdefghijklmnopqrstuvwxyzABC0123456789_%|-", max_size=12)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(names, st.one_of(st.none(), plain_values), max_size=6), st.data(),
       st.integers(0, INT32_MAX), st.one_of(st.none(), st.binary(min_size=1, max_size=16)))
def test_a_rendered_request_is_the_template_request_its_class_makes(fields, data, opaque,
                                                                    body):
    template = JsonRequestTemplate(310, fields)
    values = tuple(data.draw(plain_values) for _ in template.variable_names)
    rendered = template.render(opaque, values, body)
    head = rendered.encode_parts()[0]
    made = TemplateRequest(310, opaque, head, body)
    assert type(rendered) is TemplateRequest
    assert rendered.encode_parts() == made.encode_parts()
    assert rendered == made
    assert_whole_command(rendered)

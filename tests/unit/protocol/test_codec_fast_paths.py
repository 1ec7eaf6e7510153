"""The codec's fast paths answer exactly as the documented rules say, whatever the input.

The JSON header codec, the typed header readers and writers, the stored-record decoder and
the batch-body decoder each have a fast path for what Java and tidemq peers send, and a
careful path for everything else. These properties feed both kinds of input and compare the
answers with small models of the rules written from docs/protocol.md (§1.2, §4, §6.1, §6.5), so
a fast path that disagrees with the rules in any corner fails here.
"""

import dataclasses
import re
import struct
import typing

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import HeaderFieldError, LocalProtocolError, RemoteProtocolError
from tidemq.protocol import command as command_module
from tidemq.protocol import headers
from tidemq.protocol.codes import LanguageCode, RequestCode, SerializeType
from tidemq.protocol.command import RemotingCommand, decode_command, decode_frame_view
from tidemq.protocol.frame import FrameDecoder
from tidemq.protocol.message import (
    BatchEntry,
    MessageExt,
    decode_batch_body,
    decode_properties,
    decode_record,
    decode_records,
    encode_batch_body,
    encode_record,
    iter_records,
    unpack_host,
)
from tidemq.protocol.pulled_records import decode_pulled_records

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
int32 = st.integers(INT32_MIN, INT32_MAX)
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)


def java_string(value) -> str:
    """String.valueOf of a JSON value, as docs/protocol.md §1.2 says a Java peer sees it."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return orjson.dumps(value).decode()


# -- JSON header, decoding ----------------------------------------------------------------------


def expected_command(header) -> RemotingCommand | None:
    """The command the tolerant JSON rules read from ``header``; None when it is malformed."""
    if not isinstance(header, dict):
        return None
    numbers = {}
    for name, required in (("code", True), ("opaque", True), ("flag", False), ("version", False)):
        value = header.get(name)
        if value is None:
            if required:
                return None
            value = 0
        if type(value) is not int or not INT32_MIN <= value <= INT32_MAX:
            return None
        numbers[name] = value
    ext = header.get("extFields")
    if ext is not None:
        if not isinstance(ext, dict):
            return None
        ext = {key: java_string(value) for key, value in ext.items() if value is not None}
    language = header.get("language")
    if language is None:
        language = LanguageCode.JAVA
    elif isinstance(language, str):
        language = LanguageCode.__members__.get(language, LanguageCode.OTHER)
    elif type(language) is int and 0 <= language < len(LanguageCode):
        language = LanguageCode(language)
    else:
        language = LanguageCode.OTHER
    remark = header.get("remark")
    return RemotingCommand(
        code=numbers["code"],
        opaque=numbers["opaque"],
        flag=numbers["flag"],
        remark=None if remark is None else java_string(remark),
        ext_fields=ext,
        language=language,
        version=numbers["version"],
        serialize_type=SerializeType.JSON,
    )


odd_json_values = json_scalars | st.sampled_from([2**31, -(2**31) - 1, 2**63, 1.0]) | st.lists(
    text, max_size=2
)
language_names = st.sampled_from([*LanguageCode.__members__, "KLINGON", ""])


@st.composite
def json_headers(draw) -> dict:
    """Header objects as peers send them: well-formed, then 0-2 fields dropped or made odd."""
    header = {
        "code": draw(int32),
        "extFields": draw(st.none() | st.dictionaries(text, text, max_size=6)),
        "flag": draw(int32),
        "language": draw(language_names),
        "opaque": draw(int32),
        "remark": draw(st.none() | text),
        "serializeTypeCurrentRPC": "JSON",
        "version": draw(int32),
    }
    if header["remark"] is None and draw(st.booleans()):
        del header["remark"]
    odd_ext_fields = st.dictionaries(text, text | json_scalars, min_size=1, max_size=4)
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(sorted(header)))
        if draw(st.integers(0, 3)) == 0:
            del header[name]
        elif name == "extFields" and draw(st.booleans()):
            header[name] = draw(odd_ext_fields)
        else:
            header[name] = draw(odd_json_values)
    order = draw(st.permutations(list(header)))
    return {name: header[name] for name in order}


def json_frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I", len(header)) + header + body


@settings(max_examples=400, deadline=None)
@given(json_headers())
def test_json_header_decodes_as_the_tolerant_rules_say(header):
    expected = expected_command(header)
    frame = json_frame(orjson.dumps(header))
    if expected is None:
        with pytest.raises(RemoteProtocolError):
            decode_command(frame)
    else:
        assert decode_command(frame) == expected


ODD_JSON_VALUES = [
    None, True, False, 0, 1, -1, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1, 2**63, 1.0, 1.5,
    "", "7", "JAVA", "KLINGON", [], ["a"], {}, {"a": "b"}, {"a": 1}, {"a": None}, {"a": True},
    {"a": 1.5}, {"a": ["x"]}, {"a": {"b": "c"}},
]
WELL_FORMED_HEADER = {
    "code": 310, "extFields": {"a": "pg", "b": "T"}, "flag": 0, "language": "JAVA",
    "opaque": 7, "remark": "ok", "serializeTypeCurrentRPC": "JSON", "version": 409,
}


@pytest.mark.parametrize("name", sorted(WELL_FORMED_HEADER))
def test_json_header_with_one_field_odd_or_missing_decodes_as_the_rules_say(name):
    # Every guard of the fast path in turn: one field made odd (or left out), the rest fine.
    for value in [*ODD_JSON_VALUES, "missing"]:
        header = dict(WELL_FORMED_HEADER)
        if value == "missing":
            del header[name]
        else:
            header[name] = value
        expected = expected_command(header)
        frame = json_frame(orjson.dumps(header))
        if expected is None:
            with pytest.raises(RemoteProtocolError):
                decode_command(frame)
        else:
            assert decode_command(frame) == expected, header


def test_json_header_of_a_java_client_takes_the_fast_path_unchanged():
    header = (
        b'{"code":310,"extFields":{"a":"pg","b":"T","d":"4"},"flag":0,"language":"JAVA",'
        b'"opaque":9,"serializeTypeCurrentRPC":"JSON","version":409}'
    )
    command = decode_command(json_frame(header, b"body"))
    assert command == RemotingCommand(
        code=310, opaque=9, ext_fields={"a": "pg", "b": "T", "d": "4"}, body=b"body",
        language=LanguageCode.JAVA, version=409,
    )


# -- JSON header, encoding ----------------------------------------------------------------------


def expected_json_header(command: RemotingCommand) -> bytes | None:
    """What fastjson writes for ``command``; None when a number is outside int32."""
    numbers = (command.code, command.flag, command.opaque, command.version)
    if not all(INT32_MIN <= number <= INT32_MAX for number in numbers):
        return None
    header = {
        "code": int(command.code),
        "flag": int(command.flag),
        "language": LanguageCode(command.language).name
        if command.language in set(LanguageCode)
        else command.language,
        "opaque": int(command.opaque),
        "serializeTypeCurrentRPC": "JSON",
        "version": int(command.version),
    }
    if command.remark is not None:
        header["remark"] = command.remark
    if command.ext_fields is not None:
        header["extFields"] = {
            key: java_string(value) for key, value in command.ext_fields.items()
            if value is not None
        }
    return orjson.dumps(header, option=orjson.OPT_SORT_KEYS)


wide_int = int32 | st.sampled_from([2**31, -(2**31) - 1, 2**40])


@st.composite
def commands_to_encode(draw) -> RemotingCommand:
    number = int32 | st.sampled_from(list(RequestCode)) | wide_int | st.booleans()
    return RemotingCommand(
        code=draw(number),
        opaque=draw(int32 | wide_int),
        flag=draw(st.integers(0, 3) | wide_int | st.booleans()),
        remark=draw(st.none() | text),
        ext_fields=draw(
            st.none()
            | st.dictionaries(text, text, max_size=6)
            | st.dictionaries(text, text | st.integers() | st.booleans() | st.none(), max_size=4)
        ),
        language=draw(st.sampled_from(list(LanguageCode)) | st.integers(0, 300)),
        version=draw(int32 | wide_int),
    )


@settings(max_examples=400, deadline=None)
@given(commands_to_encode(), st.none() | st.binary(min_size=1, max_size=16))
def test_json_header_is_encoded_as_fastjson_writes_it(command, body):
    command.body = body
    expected = expected_json_header(command)
    if expected is None:
        with pytest.raises(LocalProtocolError, match="int32"):
            command.encode()
        return
    frame = command.encode()
    assert frame == struct.pack(">ii", 4 + len(expected) + len(body or b""), len(expected)) + (
        expected + (body or b"")
    )


def test_json_header_of_a_code_enum_member_takes_the_fast_path_as_its_number(monkeypatch):
    # A RequestCode member where an int is expected wrote the same bytes through the careful
    # encoder, about 1 us more per request (every pull of a consumer, once).
    fields = {"topic": "T", "queueId": "0"}
    by_number = RemotingCommand(code=int(RequestCode.PULL_MESSAGE), opaque=7,
                                ext_fields=dict(fields)).encode()

    def refuse(command):
        raise AssertionError(f"{command.describe()} took the careful encoder")

    monkeypatch.setattr(command_module, "_encode_json_header_checked", refuse)
    by_member = RemotingCommand(code=RequestCode.PULL_MESSAGE, opaque=7,
                                ext_fields=dict(fields)).encode()
    assert by_member == by_number
    assert b'"code":11' in by_member


@pytest.mark.parametrize(
    "command",
    [
        RemotingCommand(code=10, remark="\ud800"),
        RemotingCommand(code=10, ext_fields={"k": "\udfff"}),
        RemotingCommand(code=10, ext_fields={1: "v"}),  # type: ignore[dict-item]
    ],
)
def test_json_header_that_json_cannot_carry_raises_local_protocol_error(command):
    with pytest.raises(LocalProtocolError, match="not encodable as JSON"):
        command.encode()


# -- typed headers ------------------------------------------------------------------------------

_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")


def model_parse(kind: type, value) -> object:
    """docs/protocol.md §4 / the headers module docstring: how one extField value reads."""
    value = str(value)
    if kind is str:
        return value
    if kind is int:
        if not _INTEGER.fullmatch(value) or not -(2**63) <= int(value) < 2**63:
            raise ValueError(value)
        return int(value)
    if kind is bool:
        if value.lower() in ("true", "1"):
            return True
        if value.lower() in ("false", "0"):
            return False
        raise ValueError(value)
    raise AssertionError(kind)


def field_kind(annotation) -> type:
    kinds = (annotation, *typing.get_args(annotation))
    return next(kind for kind in (str, int, bool) if kind in kinds)


def model_read(cls, ext: dict, short: bool) -> tuple[str, object]:
    """("ok", header) or ("error", the extField key at fault)."""
    hints = typing.get_type_hints(cls)
    values = {}
    for item in dataclasses.fields(cls):
        short_name = item.metadata["short_name"]
        key = short_name if short and short_name else item.metadata["ext_name"]
        kind = field_kind(hints[item.name])
        value = ext.get(key)
        if value is None or (value == "" and kind is not str):
            if item.default is dataclasses.MISSING:
                return "error", key
            values[item.name] = item.default
            continue
        try:
            values[item.name] = model_parse(kind, value)
        except ValueError:
            return "error", key
    return "ok", cls(**values)


EDGE_VALUES = [
    "", "007", "+5", "-0", " 4", "4 ", "4.0", "1_000", "\u0664", "\u00b2", "0x10", "true", "TRUE",
    "False", "false", "1", "0", "yes", "9" * 18, "9" * 19, str(2**63), str(2**63 - 1),
    str(-(2**63)), str(-(2**63) - 1), "1" + "0" * 18, "00", "-1", "1023", "1024", "01023",
]
edge_values = st.sampled_from(EDGE_VALUES)
odd_values = (
    edge_values
    | st.integers(-(2**64), 2**64).map(str)
    | text
    | st.integers(-5, 5)  # not a string at all: read as its decimal text
)
HEADER_FORMS = [
    (headers.SendMessageRequestHeader, True),
    (headers.SendMessageRequestHeader, False),
    (headers.PullMessageRequestHeader, False),
    (headers.PullMessageResponseHeader, False),
    (headers.SendMessageResponseHeader, False),
    (headers.CreateTopicRequestHeader, False),
    (headers.ConsumerSendMsgBackRequestHeader, False),
]


@st.composite
def ext_fields_for(draw, cls, short: bool) -> dict:
    """A header's extFields, well-formed, then 0-2 values dropped or made odd."""
    hints = typing.get_type_hints(cls)
    ext, keys = {}, []
    for item in dataclasses.fields(cls):
        short_name = item.metadata["short_name"]
        key = short_name if short and short_name else item.metadata["ext_name"]
        keys.append(key)
        if item.default is not dataclasses.MISSING and draw(st.booleans()):
            continue  # an optional field left out
        # Small numbers too: the fast reader looks their canonical texts up in a table.
        value = {str: text,
                 int: (st.integers(-(2**63), 2**63 - 1) | st.integers(-2, 1100)).map(str),
                 bool: st.sampled_from(["true", "false"])}[field_kind(hints[item.name])]
        ext[key] = draw(value)
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(keys))
        if draw(st.integers(0, 3)) == 0:
            ext.pop(key, None)
        else:
            ext[key] = draw(odd_values)
    if draw(st.booleans()):
        ext["bname"] = "broker-a"  # unknown keys are ignored
    return ext


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_typed_headers_read_as_the_rules_say(data):
    cls, short = data.draw(st.sampled_from(HEADER_FORMS))
    ext = data.draw(ext_fields_for(cls, short))
    outcome, expected = model_read(cls, ext, short)
    if cls is headers.SendMessageRequestHeader:
        code = RequestCode.SEND_MESSAGE_V2 if short else RequestCode.SEND_MESSAGE

        def read():
            return cls.from_ext_fields(ext, code)
    else:

        def read():
            return cls.from_ext_fields(ext)

    if outcome == "error":
        with pytest.raises(HeaderFieldError) as caught:
            read()
        assert caught.value.field == expected
    else:
        assert read() == expected
        assert read() == expected  # and again, through the reader compiled by the first call


@pytest.mark.parametrize(("cls", "short"), HEADER_FORMS)
def test_typed_headers_with_one_value_odd_or_missing_read_as_the_rules_say(cls, short):
    # Every field of the header in turn takes every edge value; the others stay well-formed.
    hints = typing.get_type_hints(cls)
    well_formed = {}
    for item in dataclasses.fields(cls):
        short_name = item.metadata["short_name"]
        key = short_name if short and short_name else item.metadata["ext_name"]
        well_formed[key] = {str: "x", int: "42", bool: "true"}[field_kind(hints[item.name])]
    for key in well_formed:
        for value in [*EDGE_VALUES, 7, None]:
            ext = {**well_formed, key: value}
            if value is None:
                del ext[key]
            outcome, expected = model_read(cls, ext, short)
            code = RequestCode.SEND_MESSAGE_V2 if short else RequestCode.SEND_MESSAGE
            args = (ext, code) if cls is headers.SendMessageRequestHeader else (ext,)
            if outcome == "error":
                with pytest.raises(HeaderFieldError) as caught:
                    cls.from_ext_fields(*args)
                assert caught.value.field == expected
            else:
                assert cls.from_ext_fields(*args) == expected, ext


@pytest.mark.parametrize(("cls", "short"), HEADER_FORMS)
def test_typed_header_value_that_cannot_be_hashed_is_refused_naming_its_field(cls, short):
    # A JSON array or object where a number belongs (extFields of a hand-made Mapping; the
    # command decoder gives strings only): read as its text, which is no number.
    hints = typing.get_type_hints(cls)
    well_formed, int_keys = {}, []
    for item in dataclasses.fields(cls):
        short_name = item.metadata["short_name"]
        key = short_name if short and short_name else item.metadata["ext_name"]
        kind = field_kind(hints[item.name])
        well_formed[key] = {str: "x", int: "42", bool: "true"}[kind]
        if kind is int:
            int_keys.append(key)
    code = RequestCode.SEND_MESSAGE_V2 if short else RequestCode.SEND_MESSAGE
    for key in int_keys:
        for value in ([4], {"a": 1}):
            ext = {**well_formed, key: value}
            args = (ext, code) if cls is headers.SendMessageRequestHeader else (ext,)
            with pytest.raises(HeaderFieldError) as caught:
                cls.from_ext_fields(*args)
            assert caught.value.field == key


def model_write(header, short: bool) -> dict[str, str]:
    ext = {}
    for item in dataclasses.fields(header):
        value = getattr(header, item.name)
        if value is None:
            continue
        short_name = item.metadata["short_name"]
        key = short_name if short and short_name else item.metadata["ext_name"]
        ext[key] = java_string(value)
    return ext


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_typed_headers_write_what_java_writes(data):
    cls, short = data.draw(st.sampled_from(HEADER_FORMS))
    hints = typing.get_type_hints(cls)
    values = {}
    for item in dataclasses.fields(cls):
        kind = field_kind(hints[item.name])
        strategy = {str: text, int: st.integers(-(2**63), 2**63 - 1) | st.booleans(),
                    bool: st.booleans()}[kind]
        if item.default is not dataclasses.MISSING:
            strategy = st.none() | strategy
        values[item.name] = data.draw(strategy)
    header = cls(**values)
    if cls is headers.SendMessageRequestHeader:
        written = header.to_ext_fields(v2=short)
    else:
        written = header.to_ext_fields()
    assert written == model_write(header, short)
    assert list(written) == list(model_write(header, short))  # field order kept


# -- stored records -----------------------------------------------------------------------------


def model_decode_record(data: bytes, position: int) -> MessageExt:
    """Read the record at ``position`` field by field from the §6.1 table."""
    def cut(what):
        raise RemoteProtocolError(what)

    if len(data) - position < 8:
        cut("short")
    total, magic = struct.unpack_from(">ii", data, position)
    if magic != -626843481:
        cut("magic")
    sysflag = struct.unpack_from(">i", data, position + 36)[0] if len(data) - position >= 40 else 0
    born = 16 if sysflag & 0x10 else 4
    store = 16 if sysflag & 0x20 else 4
    layout = struct.Struct(f">iiiiiqqiq{born}siq{store}siiqi")
    end = position + total
    if total < layout.size + 3 or end > len(data):
        cut("size")
    fields = layout.unpack_from(data, position)
    cursor = position + layout.size
    body_length = fields[16]
    if body_length < 0 or cursor + body_length + 3 > end:
        cut("body")
    body = data[cursor : cursor + body_length]
    cursor += body_length
    topic_length = data[cursor]
    cursor += 1
    if cursor + topic_length + 2 > end:
        cut("topic")
    topic = data[cursor : cursor + topic_length].decode("utf-8", "replace")
    cursor += topic_length
    properties_length = struct.unpack_from(">h", data, cursor)[0]
    cursor += 2
    if properties_length < 0 or cursor + properties_length != end:
        cut("properties")
    return MessageExt(
        topic=topic, body=body, flag=fields[4],
        properties=decode_properties(data[cursor:end].decode("utf-8", "replace")),
        queue_id=fields[3], queue_offset=fields[5], physical_offset=fields[6],
        sysflag=fields[7], born_timestamp=fields[8], born_host=unpack_host(fields[9], fields[10]),
        store_timestamp=fields[11], store_host=unpack_host(fields[12], fields[13]),
        reconsume_times=fields[14], prepared_transaction_offset=fields[15], body_crc=fields[2],
        store_size=total,
    )


def model_decode_records(data: bytes) -> list[MessageExt]:
    messages, position = [], 0
    while position < len(data):
        message = model_decode_record(data, position)
        messages.append(message)
        position += message.store_size
    return messages


hosts = st.sampled_from([(b"\x7f\x00\x00\x01", 10911), (b"\x0a\x00\x00\x07", 1), (bytes(16), 9)])
property_texts = (
    st.dictionaries(
        st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=8),
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
                min_size=1, max_size=12),
        max_size=4,
    ).map(lambda d: "\x02".join(f"{k}\x01{v}" for k, v in d.items()))
    | st.text(st.sampled_from("ab\x01\x02é"), max_size=12)  # malformed pieces too
)


@st.composite
def records(draw) -> bytes:
    return bytes(
        encode_record(
            topic=draw(st.text(max_size=10)).encode()[:127],
            body=draw(st.binary(max_size=40)),
            properties=draw(property_texts).encode(),
            queue_id=draw(int32),
            flag=draw(int32),
            queue_offset=draw(st.integers(0, 2**40)),
            physical_offset=draw(st.integers(0, 2**40)),
            sysflag=draw(st.sampled_from([0, 1, 2, 8, 0x300])),
            born_timestamp=draw(st.integers(0, 2**42)),
            born_host=draw(hosts),
            store_timestamp=draw(st.integers(0, 2**42)),
            store_host=draw(hosts),
            reconsume_times=draw(st.integers(0, 16)),
        )
    )


def outcome(decode, data):
    try:
        return decode(data)
    except RemoteProtocolError:
        return RemoteProtocolError


@settings(max_examples=300, deadline=None)
@given(st.lists(records(), min_size=1, max_size=4), st.data())
def test_records_decode_as_the_layout_says_even_when_corrupted(stored, data):
    body = bytearray(b"".join(stored))
    if data.draw(st.booleans()):  # corrupt: flip bytes, cut the tail or add garbage
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(0, len(body) - 1))
            body[at] = data.draw(st.integers(0, 255))
        if data.draw(st.booleans()):
            del body[data.draw(st.integers(0, len(body))) :]
    body = bytes(body)
    expected = outcome(model_decode_records, body)
    assert outcome(decode_records, body) == expected
    assert outcome(lambda b: list(iter_records(b)), body) == expected
    assert outcome(decode_records, bytearray(body)) == expected
    assert outcome(decode_pulled_records, body) == expected
    assert outcome(decode_pulled_records, memoryview(body)) == expected
    assert outcome(lambda b: list(iter_records(memoryview(b))), body) == expected
    assert outcome(lambda b: decode_record(b, 0), body) == outcome(
        lambda b: model_decode_record(b, 0), body
    )


def size_field_edits(length: int, correct: int, size: int) -> list[int]:
    """Values to write over a size field: around the right one, the ends, the extremes."""
    values = {0, 1, -1, correct - 1, correct + 1, correct + 3, length, length + 1, 2**15 - 1,
              -(2**15), 2 ** (size * 8 - 1) - 1, -(2 ** (size * 8 - 1))}
    if size == 1:
        return sorted(value & 0xFF for value in values)
    return sorted(values)


def test_records_with_one_size_field_wrong_decode_as_the_layout_says():
    # Each size field of the second of two records, in turn, takes values around and far
    # from the right one; the decoders must answer as the field-by-field model does.
    first = bytes(encode_record(topic=b"T", body=b"first", properties=b"A\x01b", queue_id=1))
    second = bytes(
        encode_record(topic=b"Topic", body=b"0123456789", properties=b"TAGS\x01x\x02K\x01v",
                      queue_id=2)
    )
    body_end = 88 + 10
    fields = {  # offset in the record: (size in bytes, right value)
        0: (4, len(second)),
        84: (4, 10),
        body_end: (1, 5),
        body_end + 1 + 5: (2, len(second) - body_end - 1 - 5 - 2),
    }
    formats = {1: ">B", 2: ">h", 4: ">i"}
    for offset, (size, correct) in fields.items():
        for value in size_field_edits(len(second), correct, size):
            record = bytearray(second)
            struct.pack_into(formats[size], record, offset, value)
            data = first + bytes(record)
            expected = outcome(model_decode_records, data)
            assert outcome(decode_records, data) == expected, (offset, value)
            assert outcome(decode_pulled_records, data) == expected, (offset, value)
            assert outcome(lambda b: list(iter_records(memoryview(b))), data) == expected
            assert outcome(lambda b: decode_record(b, len(first)), data) == outcome(
                lambda b: model_decode_record(b, len(first)), data
            )


def test_batch_entries_with_one_size_field_wrong_decode_as_the_layout_says():
    entries = [BatchEntry(b"first", "A\x01b", 1), BatchEntry(b"0123456789", "TAGS\x01x", 2)]
    body = encode_batch_body(entries)
    second_at = 22 + 5 + 5
    second_size = len(body) - second_at
    fields = {0: (4, second_size), 16: (4, 10), 20 + 10: (2, len("TAGS\x01x"))}
    formats = {2: ">h", 4: ">i"}
    for offset, (size, correct) in fields.items():
        for value in size_field_edits(second_size, correct, size):
            data = bytearray(body)
            struct.pack_into(formats[size], data, second_at + offset, value)
            data = bytes(data)
            expected = outcome(model_decode_batch_body, data)
            assert outcome(decode_batch_body, data) == expected, (offset, value)
            assert outcome(decode_batch_body, memoryview(data)) == expected


@pytest.mark.parametrize(
    "decode",
    [decode_record, decode_records, lambda data: list(iter_records(data)), decode_batch_body,
     decode_command],
    ids=["decode_record", "decode_records", "iter_records", "decode_batch_body", "decode_command"],
)
def test_decoding_leaves_no_view_on_the_callers_buffer_even_after_an_error(decode):
    # A bytearray with a live export cannot grow; a decoder that kept its view (say, in the
    # traceback of the error it raised) would leave the caller's buffer stuck.
    good = {
        decode_command: RemotingCommand(code=10, opaque=1).encode()[4:],
        decode_batch_body: encode_batch_body([BatchEntry(b"x", "", 0)]),
    }.get(decode, bytes(encode_record(topic=b"T", body=b"x", properties=b"A\x01b", queue_id=0)))
    buffer = bytearray(good)
    decode(buffer)
    buffer += b"grows"  # raises BufferError if a view were still alive
    bad = bytearray(b"\x00\x00\x00\x30" + bytes(20))  # a size that does not add up
    with pytest.raises(RemoteProtocolError) as caught:
        decode(bad)
    assert caught.value.__traceback__ is not None  # the frames are still referenced here
    bad += b"grows"


# -- batch bodies -------------------------------------------------------------------------------


def model_decode_batch_body(data: bytes) -> list[BatchEntry]:
    entries, position = [], 0
    while position < len(data):
        if len(data) - position < 22:
            raise RemoteProtocolError("cut")
        total, _, _, flag, body_length = struct.unpack_from(">iiiii", data, position)
        if body_length < 0 or total < 22 + body_length or position + total > len(data):
            raise RemoteProtocolError("size")
        cursor = position + 20 + body_length
        properties_length = struct.unpack_from(">h", data, cursor)[0]
        if properties_length < 0 or cursor + 2 + properties_length != position + total:
            raise RemoteProtocolError("properties")
        entries.append(
            BatchEntry(
                data[position + 20 : cursor],
                data[cursor + 2 : position + total].decode("utf-8", "replace"),
                flag,
            )
        )
        position += total
    return entries


batch_entries = st.lists(
    st.builds(BatchEntry, st.binary(max_size=30), property_texts, int32), min_size=1, max_size=6
)


@settings(max_examples=300, deadline=None)
@given(batch_entries, st.data())
def test_batch_bodies_decode_as_the_layout_says_even_when_corrupted(entries, data):
    assert_batch_body_decodes_as_the_model(entries, data, max_flips=3)


def assert_batch_body_decodes_as_the_model(entries, data, max_flips: int) -> None:
    """Encode ``entries``, maybe flip up to ``max_flips`` bytes and cut the tail, and check
    that decode_batch_body (from bytes, bytearray, memoryview) answers as the model does."""
    body = bytearray(encode_batch_body(entries))
    corrupt = data.draw(st.booleans())
    if corrupt:
        for _ in range(data.draw(st.integers(1, max_flips))):
            at = data.draw(st.integers(0, len(body) - 1))
            body[at] = data.draw(st.integers(0, 255))
        if data.draw(st.booleans()):
            del body[data.draw(st.integers(0, len(body))) :]
    body = bytes(body)
    expected = outcome(model_decode_batch_body, body)
    if not corrupt:
        assert expected == entries
    assert outcome(decode_batch_body, body) == expected
    assert outcome(decode_batch_body, bytearray(body)) == expected
    assert outcome(decode_batch_body, memoryview(body)) == expected


# -- frames -------------------------------------------------------------------------------------


def test_many_small_frames_in_one_read_decode_from_any_buffer_type():
    sent = [
        RemotingCommand(
            code=310 if index % 3 else 11, opaque=index, flag=index % 2,
            ext_fields={"a": "pg", "queueOffset": str(index)} if index % 5 else None,
            body=bytes([index % 256]) * (index % 7) or None,
            serialize_type=SerializeType.ROCKETMQ if index % 4 == 0 else SerializeType.JSON,
        )
        for index in range(500)
    ]
    stream = b"".join(command.encode() for command in sent)
    expected = [
        dataclasses.replace(command, ext_fields=command.ext_fields or None) for command in sent
    ]
    for kind in (bytes, bytearray, memoryview):
        decoder = FrameDecoder()
        assert decoder.feed(kind(stream)) == expected
        assert decoder.buffered_bytes == 0
    # The same read with half a frame in front of it goes through the decoder's buffer.
    decoder = FrameDecoder()
    assert decoder.feed(stream[:5]) == []
    assert decoder.feed(stream[5:] + stream[:9]) == expected
    assert decoder.buffered_bytes == 9


def test_decode_frame_view_reads_bytes_and_memoryviews_alike():
    command = RemotingCommand(code=11, opaque=3, ext_fields={"topic": "T"}, body=b"abc")
    frame = b"junk" + command.encode()[4:] + b"more"
    end = len(frame) - 4
    assert decode_frame_view(frame, 4, end) == command
    with memoryview(frame) as view:
        assert decode_frame_view(view, 4, end) == command


@settings(max_examples=300, deadline=None)
@given(
    count=st.integers(1, 12),
    body_length=st.integers(0, 40),
    properties=st.text(alphabet="ab\x01\x02\u00e9", max_size=12),
    flags=st.lists(int32, min_size=12, max_size=12),
    data=st.data(),
)
def test_batch_bodies_of_like_entries_decode_as_the_layout_says(count, body_length, properties,
                                                                flags, data):
    # Entries of one layout (same body and properties lengths) are cut as a run
    # (message.py's _decode_same_layout); a corrupted one must come out as the model says.
    entries = [BatchEntry(bytes([n]) * body_length, properties, flags[n]) for n in range(count)]
    assert_batch_body_decodes_as_the_model(entries, data, max_flips=2)

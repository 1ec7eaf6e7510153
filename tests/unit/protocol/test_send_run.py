"""A read's run of SEND_MESSAGE_V2 frames decoded as columns (protocol/send_run.py) says what
the general decoder says, and is a run exactly when every frame is one a run may hold.

``FrameDecoder.feed_requests`` is held to ``FrameDecoder.feed`` on random reads of mostly
plain sends with odd frames among them (every header field odd or missing, other codes and
flags, ROCKETMQ headers, no body, keys in another order, broken JSON): the same commands in
the same order, or the same error; and to a plain model of the run's rules (``run_frame``):
a ``SendRun`` comes back exactly when every whole frame of the read passes them, so a guard
of the fast path left out fails here even where the commands would still come out alike.
"""

from __future__ import annotations

import dataclasses
import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import ProtocolError
from tidemq.protocol.codes import LanguageCode, SerializeType
from tidemq.protocol.command import RemotingCommand, decode_command
from tidemq.protocol.frame import FrameDecoder
from tidemq.protocol.send_run import RUN_FRAMES_MIN, SendRun, decode_send_run

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)
odd_values = st.sampled_from([
    None, True, False, 0, 1, -1, INT32_MAX + 1, INT32_MIN - 1, 310.0, 1.5, "", "310", "PYTHON",
    "KLINGON", [], ["JAVA"], {}, {"a": "b"}, {"a": 1}, {"a": None}, {"a": True}, 7,
])


def frame_of(header: bytes, body: bytes, serialize_type: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body),
                       serialize_type << 24 | len(header)) + header + body


def plain_header(opaque: int) -> dict:
    return {"code": 310, "extFields": {"a": "pg", "b": "T", "i": f"UNIQ_KEY\x01{opaque}"},
            "flag": 0, "language": "PYTHON", "opaque": opaque,
            "serializeTypeCurrentRPC": "JSON", "version": 409}


@st.composite
def frames(draw) -> bytes:
    """A frame a producer may send: mostly a plain SEND_MESSAGE_V2, often with one thing
    odd about it."""
    opaque = draw(st.integers(INT32_MIN, INT32_MAX))
    header = plain_header(opaque)
    header["language"] = draw(st.sampled_from(["PYTHON", "JAVA", "CPP", "GO"]))
    header["version"] = draw(st.integers(INT32_MIN, INT32_MAX))
    header["extFields"] = draw(st.dictionaries(text, text, min_size=1, max_size=4))
    if draw(st.booleans()):
        header["remark"] = draw(text)
    body = draw(st.binary(min_size=1, max_size=40))
    kind = draw(st.integers(0, 11))
    if kind == 0:  # one field odd or missing
        name = draw(st.sampled_from(sorted(header)))
        value = draw(odd_values | st.just("missing"))
        if value == "missing":
            del header[name]
        else:
            header[name] = value
    elif kind == 1:  # an extFields value odd
        header["extFields"][draw(text)] = draw(odd_values)
    elif kind == 2:
        header["code"] = draw(st.sampled_from([10, 11, 320, 34, 0, -310, INT32_MAX]))
    elif kind == 3:
        header["flag"] = draw(st.sampled_from([1, 2, 3, -1]))
    elif kind == 4:
        body = b""
    elif kind == 5:  # keys in another order: not how fastjson or tidemq write them
        order = draw(st.permutations(sorted(header)))
        header = {name: header[name] for name in order}
    elif kind == 6:  # a ROCKETMQ header
        command = RemotingCommand(code=header["code"], opaque=opaque, ext_fields={"a": "b"},
                                  body=body, serialize_type=SerializeType.ROCKETMQ)
        return command.encode()
    elif kind == 7:  # a header whose JSON is cut, or followed by more
        raw = orjson.dumps(header, option=orjson.OPT_SORT_KEYS)
        raw = draw(st.sampled_from([raw[:-1], raw + b" ", raw + b"x", raw + b"{}"]))
        return frame_of(raw, body)
    elif kind == 8:  # a key given twice: the last one counts, as orjson reads it
        raw = orjson.dumps(header, option=orjson.OPT_SORT_KEYS)
        extra = draw(st.sampled_from([b'"code":10', b'"flag":1', b'"opaque":1.0',
                                      b'"extFields":null', b'"code":310']))
        return frame_of(raw[:-1] + b"," + extra + b"}", body)
    raw = orjson.dumps(header, option=orjson.OPT_SORT_KEYS)
    return frame_of(raw, body)


def run_frame(frame: bytes) -> bool:
    """The model: may ``frame`` (whole) be in a run (protocol/send_run.py's rules)?"""
    length, word = struct.unpack_from(">iI", frame)
    header_length = word & 0xFFFFFF
    if word >> 24 or header_length >= length - 4:
        return False
    header = frame[8:8 + header_length]
    if not header.startswith(b'{"code":310,'):
        return False
    try:
        fields = orjson.loads(header)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(fields, dict):
        return False
    for name in ("code", "opaque", "flag", "version"):
        value = fields.get(name)
        if type(value) is not int or not INT32_MIN <= value <= INT32_MAX:
            return False
    ext_fields = fields.get("extFields")
    remark = fields.get("remark")
    return (fields["code"] == 310 and fields["flag"] == 0
            and type(fields.get("language")) is str
            and fields["language"] in LanguageCode.__members__
            and (remark is None or type(remark) is str)
            and type(ext_fields) is dict
            and all(type(value) is str for value in ext_fields.values()))


def decoded(decoder: FrameDecoder, data, requests: bool):
    """What one feed gives: ("run", commands), ("list", commands) or ("error", message)."""
    try:
        if not requests:
            return "list", decoder.feed(data)
        result = decoder.feed_requests(data)
    except ProtocolError as e:
        return "error", f"{type(e).__name__}: {e}"
    if type(result) is SendRun:
        commands = result.commands()
        assert result.commands() is commands  # made once
        assert list(result) == commands and len(result) == len(commands)
        assert result.opaques == [command.opaque for command in commands]
        assert result.ext_fields == [command.ext_fields for command in commands]
        assert result.bodies == [command.body for command in commands]
        for command in commands:
            for field in dataclasses.fields(RemotingCommand):
                getattr(command, field.name)  # every field stored
            assert type(command.language) is LanguageCode
        return "run", commands
    return "list", result


def general(data: bytes):
    try:
        return FrameDecoder().feed(data)
    except ProtocolError as e:
        return f"{type(e).__name__}: {e}"


@settings(max_examples=400, deadline=None)
@given(st.lists(frames(), min_size=1, max_size=6), st.sampled_from([bytes, bytearray,
                                                                    memoryview]))
def test_a_read_decodes_as_the_general_decoder_and_is_a_run_when_every_frame_may_be(
        read_frames, kind):
    data = b"".join(read_frames)
    expected = general(data)
    how, got = decoded(FrameDecoder(send_run_frames_min=1), kind(data), requests=True)
    if isinstance(expected, str):
        assert (how, got) == ("error", expected)
        return
    assert got == expected
    assert got == [decode_command(frame[4:]) for frame in read_frames]
    assert how == ("run" if all(map(run_frame, read_frames)) else "list")


@settings(max_examples=200, deadline=None)
@given(st.lists(frames(), min_size=1, max_size=6), st.data())
def test_a_read_cut_anywhere_decodes_as_the_general_decoder_does(read_frames, data):
    stream = b"".join(read_frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    plain, by_requests = FrameDecoder(), FrameDecoder(send_run_frames_min=1)
    for piece in pieces:
        expected = decoded(plain, piece, requests=False)
        how, got = decoded(by_requests, piece, requests=True)
        if "error" in (how, expected[0]):
            assert (how, got) == expected
            return
        assert got == expected[1]
        assert by_requests.buffered_bytes == plain.buffered_bytes


def test_plain_sends_come_as_one_run_with_their_columns():
    read_frames = [frame_of(orjson.dumps(plain_header(n), option=orjson.OPT_SORT_KEYS),
                            b"body%d" % n) for n in range(5)]
    data = b"".join(read_frames)
    decoded_run = decode_send_run(data, 0, 1 << 24, frames_min=1)
    assert decoded_run is not None
    run, position = decoded_run
    assert position == len(data)
    assert run.opaques == list(range(5))
    assert run.bodies == [b"body%d" % n for n in range(5)]
    assert run.ext_fields[3] == plain_header(3)["extFields"]
    part = run.part(1, 3)
    assert part.opaques == [1, 2] and part.commands() == run.commands()[1:3]


def test_a_run_ends_before_a_frame_not_all_there():
    whole = frame_of(orjson.dumps(plain_header(1), option=orjson.OPT_SORT_KEYS), b"x")
    decoder = FrameDecoder(send_run_frames_min=1)
    first = decoder.feed_requests(whole + whole[:10])
    assert type(first) is SendRun and len(first) == 1
    assert decoder.buffered_bytes == 10
    second = decoder.feed_requests(whole[10:])
    assert type(second) is SendRun and second.commands() == first.commands()
    assert decoder.buffered_bytes == 0


def test_a_bad_length_after_a_run_is_refused_as_the_general_decoder_refuses_it():
    whole = frame_of(orjson.dumps(plain_header(1), option=orjson.OPT_SORT_KEYS), b"x")
    data = whole + struct.pack(">i", 2**30)
    with pytest.raises(ProtocolError) as general_error:
        FrameDecoder().feed(data)
    with pytest.raises(ProtocolError) as run_error:
        FrameDecoder(send_run_frames_min=1).feed_requests(data)
    assert str(run_error.value) == str(general_error.value)


def _plain_raw(change=None) -> bytes:
    header = plain_header(5)
    if change is not None:
        change(header)
    return orjson.dumps(header, option=orjson.OPT_SORT_KEYS)


def _set(name, value):
    return lambda header: header.__setitem__(name, value)


def _drop(name):
    return lambda header: header.pop(name)


# One frame a run must not hold, each for one of the run's rules (module docstring).
ODD_FRAMES = {
    "ROCKETMQ type, JSON bytes": frame_of(_plain_raw(), b"x", 1),
    "ROCKETMQ header": RemotingCommand(code=310, opaque=5, ext_fields={"a": "b"}, body=b"x",
                                       serialize_type=SerializeType.ROCKETMQ).encode(),
    "keys in another order": frame_of(
        orjson.dumps(dict(reversed(list(plain_header(5).items())))), b"x"),
    "no body": frame_of(_plain_raw(), b""),
    "code 10": frame_of(_plain_raw(_set("code", 10)), b"x"),
    "code 320": frame_of(_plain_raw(_set("code", 320)), b"x"),
    "code 10 given after 310": frame_of(_plain_raw()[:-1] + b',"code":10}', b"x"),
    "code 310.0 given after 310": frame_of(_plain_raw()[:-1] + b',"code":310.0}', b"x"),
    "flag 1": frame_of(_plain_raw(_set("flag", 1)), b"x"),
    "flag 2": frame_of(_plain_raw(_set("flag", 2)), b"x"),
    "flag missing": frame_of(_plain_raw(_drop("flag")), b"x"),
    "opaque above int32": frame_of(_plain_raw(_set("opaque", INT32_MAX + 1)), b"x"),
    "opaque below int32": frame_of(_plain_raw(_set("opaque", INT32_MIN - 1)), b"x"),
    "opaque 1.0": frame_of(_plain_raw(_set("opaque", 1.0)), b"x"),
    "opaque true": frame_of(_plain_raw(_set("opaque", True)), b"x"),
    "opaque missing": frame_of(_plain_raw(_drop("opaque")), b"x"),
    "version above int32": frame_of(_plain_raw(_set("version", INT32_MAX + 1)), b"x"),
    "version below int32": frame_of(_plain_raw(_set("version", INT32_MIN - 1)), b"x"),
    "version 1.5": frame_of(_plain_raw(_set("version", 1.5)), b"x"),
    "version missing": frame_of(_plain_raw(_drop("version")), b"x"),
    "language a number": frame_of(_plain_raw(_set("language", 6)), b"x"),
    "language unknown": frame_of(_plain_raw(_set("language", "KLINGON")), b"x"),
    "language a list": frame_of(_plain_raw(_set("language", ["JAVA"])), b"x"),
    "language missing": frame_of(_plain_raw(_drop("language")), b"x"),
    "remark a number": frame_of(_plain_raw(_set("remark", 7)), b"x"),
    "remark a list": frame_of(_plain_raw(_set("remark", ["r"])), b"x"),
    "extFields null": frame_of(_plain_raw(_set("extFields", None)), b"x"),
    "extFields missing": frame_of(_plain_raw(_drop("extFields")), b"x"),
    "extFields a list": frame_of(_plain_raw(_set("extFields", ["a"])), b"x"),
    "an extFields value a number": frame_of(_plain_raw(_set("extFields", {"a": 4})), b"x"),
    "an extFields value null": frame_of(_plain_raw(_set("extFields", {"a": None})), b"x"),
    "an extFields value true": frame_of(_plain_raw(_set("extFields", {"a": True})), b"x"),
    "JSON cut": frame_of(_plain_raw()[:-1], b"x"),
    "JSON followed by more": frame_of(_plain_raw() + b"{}", b"x"),
}


@pytest.mark.parametrize("name", sorted(ODD_FRAMES))
@pytest.mark.parametrize("where", ["alone", "first", "last"])
def test_a_read_with_one_odd_frame_is_no_run_and_decodes_as_the_general_decoder(name, where):
    plain = [frame_of(_plain_raw(_set("opaque", n)), b"b%d" % n) for n in range(3)]
    read_frames = {"alone": [ODD_FRAMES[name]], "first": [ODD_FRAMES[name], *plain],
                   "last": [*plain, ODD_FRAMES[name]]}[where]
    assert not run_frame(ODD_FRAMES[name])
    data = b"".join(read_frames)
    expected = general(data)
    how, got = decoded(FrameDecoder(send_run_frames_min=1), data, requests=True)
    if isinstance(expected, str):
        assert (how, got) == ("error", expected)
    else:
        assert (how, got) == ("list", expected)


def test_a_plain_frame_with_a_remark_or_another_language_is_in_the_run():
    frames_ = [frame_of(_plain_raw(_set("remark", "r")), b"x"),
               frame_of(_plain_raw(_set("language", "JAVA")), b"x"),
               frame_of(_plain_raw(_set("remark", None)), b"x")]
    assert all(map(run_frame, frames_))
    how, got = decoded(FrameDecoder(send_run_frames_min=1), b"".join(frames_), requests=True)
    assert how == "run"
    assert got == general(b"".join(frames_))


def test_a_read_of_fewer_frames_than_a_run_takes_is_decoded_the_general_way():
    frame = frame_of(_plain_raw(), b"body")
    for count in (1, RUN_FRAMES_MIN - 1, RUN_FRAMES_MIN):
        got = FrameDecoder().feed_requests(frame * count)
        assert type(got) is (SendRun if count >= RUN_FRAMES_MIN else list)
        assert list(got) == FrameDecoder().feed(frame * count)

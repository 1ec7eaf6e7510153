"""Fuzz the frame decoder: whatever a peer sends, only ProtocolError subclasses may escape.

A server feeds every byte a client sends into ``FrameDecoder``; anything other than a
``ProtocolError`` (IndexError, struct.error, UnicodeDecodeError, MemoryError, ...) would take
down more than that one connection. Hypothesis prints the failing input; rerun with
``--hypothesis-seed`` to reproduce.
"""

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.errors import HeaderFieldError, ProtocolError
from tidemq.protocol.codes import LanguageCode, SerializeType
from tidemq.protocol.command import RemotingCommand, decode_command
from tidemq.protocol.frame import FrameDecoder
from tidemq.protocol.headers import read_request_header

pytestmark = pytest.mark.reliability

FRAME_SIZE_MAX = 64 * 1024  # small, so random length prefixes often hit the limit
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)


@st.composite
def commands(draw) -> RemotingCommand:
    serialize_type = draw(st.sampled_from(list(SerializeType)))
    return RemotingCommand(
        code=draw(st.sampled_from([10, 11, 14, 15, 34, 105, 310, 320]) | st.integers(0, 400)),
        opaque=draw(st.integers(0, 2**31 - 1)),
        flag=draw(st.integers(0, 3)),
        remark=draw(st.none() | text),
        ext_fields=draw(
            st.none()
            | st.dictionaries(
                st.sampled_from(["a", "b", "topic", "queueId", "queueOffset", "sysFlag"]) | text,
                text | st.integers(-5, 2**40).map(str),
                max_size=6,
            )
        ),
        body=draw(st.none() | st.binary(min_size=1, max_size=40)),
        language=draw(st.sampled_from(list(LanguageCode))),
        serialize_type=serialize_type,
    )


@st.composite
def mutated_streams(draw) -> bytes:
    stream = bytearray(
        b"".join(command.encode() for command in draw(st.lists(commands(), min_size=1, max_size=4)))
    )
    for _ in range(draw(st.integers(1, 6))):
        if not stream:
            break
        at = draw(st.integers(0, len(stream) - 1))
        action = draw(st.sampled_from(["flip", "overwrite", "insert", "delete", "truncate"]))
        if action == "flip":
            stream[at] ^= 1 << draw(st.integers(0, 7))
        elif action == "overwrite":
            garbage = draw(st.binary(min_size=1, max_size=8))
            stream[at : at + len(garbage)] = garbage
        elif action == "insert":
            stream[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del stream[at : at + draw(st.integers(1, 8))]
        else:
            del stream[at:]
    return bytes(stream)


def feed_everything(stream: bytes, cuts: list[int]) -> None:
    """Feed ``stream`` split at ``cuts``; exercise every decoded command like a server would."""
    decoder = FrameDecoder(frame_size_max=FRAME_SIZE_MAX)
    decoded: list[RemotingCommand] = []
    previous = 0
    try:
        for cut in [*sorted(cuts), len(stream)]:
            decoded += decoder.feed(stream[previous:cut])
            previous = cut
            assert decoder.buffered_bytes <= FRAME_SIZE_MAX + 4
    except ProtocolError:
        # The decoder is dead now: it must keep saying so, and hold nothing.
        with pytest.raises(ProtocolError):
            decoder.feed(b"\x00")
        assert decoder.buffered_bytes == 0
    for command in decoded:
        exercise(command)


def exercise(command: RemotingCommand) -> None:
    command.describe()
    with contextlib.suppress(HeaderFieldError):
        read_request_header(command.code, command.ext_fields)
    # Whatever we accepted we can answer and echo: it re-encodes and decodes to itself.
    again = decode_command(command.encode()[4:])
    assert again.code == command.code and again.opaque == command.opaque


@FUZZ
@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=5))
def test_random_bytes_raise_only_protocol_errors(stream, cuts):
    feed_everything(stream, cuts)


@FUZZ
@given(mutated_streams(), st.lists(st.integers(0, 600), max_size=5))
def test_mutated_valid_frames_raise_only_protocol_errors(stream, cuts):
    feed_everything(stream, cuts)


@FUZZ
@given(st.data())
def test_garbled_headers_inside_well_framed_frames_raise_only_protocol_errors(data):
    # Keep the framing right and garble only the header, so the header codecs get the hits.
    serialize_type = data.draw(st.sampled_from([0, 1]))
    if serialize_type == 1 and data.draw(st.booleans()):
        valid = data.draw(commands().filter(lambda c: c.serialize_type == 1)).encode()
        header_length = int.from_bytes(valid[5:8], "big")
        header = bytearray(valid[8 : 8 + header_length])
        for _ in range(data.draw(st.integers(1, 4))):
            at = data.draw(st.integers(0, len(header) - 1))
            header[at] = data.draw(st.integers(0, 255))
    else:
        header = data.draw(
            st.binary(max_size=80)
            | st.sampled_from([b"{}", b"[]", b"null", b'{"code":1}', b'{"code":1,"opaque":"x"}'])
        )
    body = data.draw(st.binary(max_size=20))
    frame = (
        (4 + len(header) + len(body)).to_bytes(4, "big")
        + (serialize_type << 24 | len(header)).to_bytes(4, "big")
        + bytes(header)
        + body
    )
    feed_everything(frame, [])

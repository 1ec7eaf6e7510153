"""FrameDecoder: any chunking in, the same commands out; bad lengths fail before buffering."""

import struct
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import FrameTooLarge, RemoteProtocolError
from tidemq.limits import FRAME_SIZE_MAX
from tidemq.protocol.codes import LanguageCode, RequestCode, SerializeType
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.frame import FrameDecoder, encode_frame

JSON = SerializeType.JSON
ROCKETMQ = SerializeType.ROCKETMQ


def sample_commands() -> list[RemotingCommand]:
    return [
        RemotingCommand(code=310, opaque=1, ext_fields={"a": "pg", "b": "T"}, body=b"hello"),
        RemotingCommand(code=34, opaque=2, body=b'{"clientID":"x"}', serialize_type=ROCKETMQ),
        RemotingCommand(code=0, opaque=1, flag=1, remark="ok", ext_fields={"msgId": "AB"}),
        RemotingCommand(code=11, opaque=3, flag=2, serialize_type=ROCKETMQ),
    ]


def stream_of(commands: list[RemotingCommand]) -> bytes:
    return b"".join(encode_frame(command) for command in commands)


def feed_in_chunks(decoder: FrameDecoder, data: bytes, sizes) -> list[RemotingCommand]:
    out: list[RemotingCommand] = []
    position = 0
    for size in sizes:
        out += decoder.feed(data[position : position + size])
        position += size
    out += decoder.feed(data[position:])
    return out


def test_frames_fed_whole_decode_in_order():
    commands = sample_commands()
    decoder = FrameDecoder()
    assert decoder.feed(stream_of(commands)) == commands
    assert decoder.buffered_bytes == 0


def test_frames_fed_one_byte_at_a_time_decode_in_order():
    commands = sample_commands()
    data = stream_of(commands)
    decoder = FrameDecoder()
    out = []
    for index in range(len(data)):
        out += decoder.feed(data[index : index + 1])
        assert decoder.buffered_bytes == index + 1 - sum(len(c.encode()) for c in out)
    assert out == commands
    assert decoder.buffered_bytes == 0


def test_trailing_bytes_of_the_next_frame_wait_for_the_rest():
    first, second = sample_commands()[:2]
    second_frame = encode_frame(second)
    decoder = FrameDecoder()
    assert decoder.feed(encode_frame(first) + second_frame[:9]) == [first]
    assert decoder.buffered_bytes == 9
    assert decoder.feed(second_frame[9:-1]) == []
    assert decoder.feed(second_frame[-1:]) == [second]
    assert decoder.buffered_bytes == 0


def test_empty_feed_returns_nothing():
    decoder = FrameDecoder()
    assert decoder.feed(b"") == []
    decoder.feed(b"\x00\x00")
    assert decoder.feed(b"") == []
    assert decoder.buffered_bytes == 2


def test_feed_accepts_bytearray_and_memoryview():
    command = sample_commands()[0]
    frame = encode_frame(command)
    assert FrameDecoder().feed(bytearray(frame)) == [command]
    assert FrameDecoder().feed(memoryview(frame)) == [command]


def test_many_small_frames_through_the_buffer_decode_correctly():
    # A half frame is kept first, so every later chunk goes through the buffer and its
    # occasional compaction; 3000 frames cross the compaction threshold several times.
    commands = [
        RemotingCommand(code=15, opaque=i, ext_fields={"commitOffset": str(i)})
        for i in range(3000)
    ]
    data = stream_of(commands)
    decoder = FrameDecoder()
    out = feed_in_chunks(decoder, data, [50] + [7001] * (len(data) // 7001))
    assert out == commands
    assert decoder.buffered_bytes == 0


def test_a_frame_of_exactly_frame_size_max_is_accepted():
    body = bytes(1000)
    command = RemotingCommand(code=10, opaque=1, body=body)
    frame = encode_frame(command)
    decoder = FrameDecoder(frame_size_max=len(frame) - 4)
    assert decoder.feed(frame) == [command]
    with pytest.raises(FrameTooLarge):
        FrameDecoder(frame_size_max=len(frame) - 5).feed(frame)


def test_too_large_length_prefix_fails_at_once_naming_value_and_limit():
    decoder = FrameDecoder()
    with pytest.raises(FrameTooLarge) as caught:
        decoder.feed(struct.pack(">i", 20 * 1024 * 1024))
    assert str(caught.value).startswith(
        f"frame is 20971520 bytes, larger than frame_size_max={FRAME_SIZE_MAX}"
    )
    assert isinstance(caught.value, RemoteProtocolError)


def test_int32_max_length_prefix_is_refused_without_allocating():
    decoder = FrameDecoder()
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLarge, match="2147483647"):
            decoder.feed(struct.pack(">i", 2**31 - 1) + b"\x00" * 100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


@pytest.mark.parametrize("length", [-1, -(2**31), 0, 3])
def test_length_below_the_header_word_is_refused(length):
    with pytest.raises(RemoteProtocolError, match=f"frame length is {length}"):
        FrameDecoder().feed(struct.pack(">i", length))


def test_header_longer_than_frame_is_refused_before_the_body_arrives():
    decoder = FrameDecoder()
    with pytest.raises(RemoteProtocolError, match="header is 500 bytes"):
        decoder.feed(struct.pack(">iI", 100, 500))


def test_unknown_serialize_type_is_refused_before_the_body_arrives():
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">i", 100))
    with pytest.raises(RemoteProtocolError, match="serialize type 5"):
        decoder.feed(struct.pack(">I", 5 << 24 | 10))


def test_a_dead_decoder_raises_the_same_error_again():
    decoder = FrameDecoder()
    good = encode_frame(sample_commands()[0])
    with pytest.raises(RemoteProtocolError) as caught:
        decoder.feed(struct.pack(">iI", 10, 2 << 24))
    with pytest.raises(RemoteProtocolError) as again:
        decoder.feed(good)
    assert again.value is caught.value
    assert decoder.buffered_bytes == 0


def test_malformed_header_inside_a_complete_frame_kills_the_decoder():
    header = b"[]"
    frame = struct.pack(">iI", 4 + len(header), len(header)) + header
    decoder = FrameDecoder()
    good = encode_frame(sample_commands()[0])
    assert decoder.feed(good[:5]) == []
    with pytest.raises(RemoteProtocolError, match="expected an object"):
        decoder.feed(good[5:] + frame)
    with pytest.raises(RemoteProtocolError, match="expected an object"):
        decoder.feed(b"")


# -- property: encode, concatenate, split anywhere, decode --------------------------------------

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@st.composite
def commands(draw) -> RemotingCommand:
    serialize_type = draw(st.sampled_from([JSON, ROCKETMQ]))
    small = serialize_type == ROCKETMQ
    int16 = st.integers(-(2**15), 2**15 - 1)
    int32 = st.integers(-(2**31), 2**31 - 1)
    return RemotingCommand(
        code=draw(int16 if small else int32),
        opaque=draw(int32),
        flag=draw(st.integers(0, 3) | int32),
        remark=draw(st.none() | text),
        ext_fields=draw(st.none() | st.dictionaries(text, text, max_size=5)),
        body=draw(st.none() | st.binary(min_size=1, max_size=64)),
        language=draw(st.sampled_from(list(LanguageCode))),
        version=draw(int16 if small else int32),
        serialize_type=serialize_type,
    )


def after_round_trip(command: RemotingCommand) -> RemotingCommand:
    """What the peer sees: ROCKETMQ cannot tell an empty remark or ext block from none."""
    if command.serialize_type == ROCKETMQ:
        return RemotingCommand(
            code=command.code, opaque=command.opaque, flag=command.flag,
            remark=command.remark or None, ext_fields=command.ext_fields or None,
            body=command.body, language=command.language, version=command.version,
            serialize_type=command.serialize_type,
        )
    return command


@settings(max_examples=200, deadline=None)
@given(st.lists(commands(), min_size=1, max_size=6), st.data(),
       st.sampled_from([None, 1, 40]), st.sampled_from([bytes, bytearray, memoryview]))
def test_any_commands_split_anywhere_decode_to_the_same_commands(sent, data, large, kind):
    # large: frames from this size on take the collect-and-join path (None: the default,
    # which these small frames never reach); kind: what the reads are handed over as.
    stream = stream_of(sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = FrameDecoder() if large is None else FrameDecoder(large_frame_bytes=large)
    received = []
    decoded_bytes = 0
    previous = 0
    for cut in [*cuts, len(stream)]:
        chunk = bytearray(stream[previous:cut])
        commands = decoder.feed(kind(chunk) if kind is not bytearray else chunk)
        chunk[:] = b"\xee" * len(chunk)  # a caller reusing its buffer must not change frames
        received += commands
        decoded_bytes += sum(len(c.encode()) for c in commands)
        assert decoder.buffered_bytes == cut - decoded_bytes
        previous = cut
    assert received == [after_round_trip(command) for command in sent]
    assert decoder.buffered_bytes == 0


def test_a_large_frame_over_many_reads_is_joined_once_and_what_follows_decodes():
    # A pull answer of ~300 KB arriving in 64 KiB reads, with a small frame and the start
    # of the next large one in its last read (what a consumer's connection sees).
    body = bytes(range(256)) * 1200
    large = RemotingCommand(code=0, opaque=7, flag=1, ext_fields={"nextBeginOffset": "256"},
                            body=body)
    small = sample_commands()[0]
    data = stream_of([large, small, large, large])
    decoder = FrameDecoder()
    out = feed_in_chunks(decoder, data, [65536] * (len(data) // 65536))
    assert out == [large, small, large, large]
    assert decoder.buffered_bytes == 0
    # The same through one reused read buffer (as recv_into): nothing may point into it.
    decoder = FrameDecoder()
    buffer = bytearray(65536)
    out = []
    for position in range(0, len(data), 65536):
        read = data[position : position + 65536]
        buffer[: len(read)] = read
        out += decoder.feed(memoryview(buffer)[: len(read)])
    assert out == [large, small, large, large]


@settings(max_examples=50, deadline=None)
@given(commands())
def test_encode_then_decode_command_is_identity(command):
    decoder = FrameDecoder()
    assert decoder.feed(command.encode()) == [after_round_trip(command)]


def test_request_codes_survive_both_serialize_types():
    for serialize_type in (JSON, ROCKETMQ):
        for code in RequestCode:
            command = RemotingCommand(code=code, opaque=5, serialize_type=serialize_type)
            (decoded,) = FrameDecoder().feed(command.encode())
            assert decoded.code == code

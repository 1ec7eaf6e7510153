"""FrameDecoder: bytes from a connection in, RemotingCommands out (sans-IO).

Theory of operation: ``feed`` takes whatever a socket read returned, in any chunking, and
returns every command completed by it. Bytes of an unfinished frame wait in a buffer with a
read position; whole frames are decoded straight out of the buffer (or out of the fed bytes
when nothing was waiting, the common case), and the consumed front of the buffer is dropped
only now and then, so many small frames in one feed cost no repeated copying. A read holding
many small frames costs one unpack of length and header word per frame, checked inline, and
the header decode; a ``bytes`` read (what a transport hands over) is sliced without a view.

A large frame (``large_frame_bytes`` or more, e.g. a pull answer of hundreds of records)
arrives over several reads. Its reads are kept as they came (views of the transport's
``bytes``, nothing copied) until the last one is in; then the header is decoded from the
first read and the body is made by one join of the reads. Through the buffer the same frame
was copied three times (into the buffer, out of it as the body, and again when compacting).

A frame's 4-byte length is checked as soon as it arrives, before the decoder waits for the
rest: below 4 (no room for the header word) or above ``frame_size_max`` is an error. The header
word is checked as soon as its 4 bytes arrive (known serialize type, header no longer than the
frame). So a garbage prefix can never make the decoder wait for, or hold, more than
``frame_size_max`` bytes of one frame.

``feed_requests`` (a broker's connection) decodes the same way, except that a read whose
whole frames are all SEND_MESSAGE_V2 requests of the usual shape comes back as one
``SendRun`` (protocol/send_run.py): their columns, with no command made per request.

After an error the decoder is dead: the stream has lost its framing and cannot be resynced,
so every later ``feed`` raises the same error and the connection must be closed.
See ``tidemq.protocol.command`` for the frame layout.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from tidemq import limits
from tidemq.errors import FrameTooLarge, ProtocolError, RemoteProtocolError
from tidemq.protocol.command import (
    FRAME_PREFIX_SIZE,
    HEADER_LENGTH_MAX,
    HEADER_WORD_SIZE,
    RemotingCommand,
    check_header_word,
    decode_checked_frame,
    decode_json_header,
)
from tidemq.protocol.send_run import RUN_FRAMES_MIN, SendRun, decode_send_run

_INT32 = struct.Struct(">i")
_FRAME_HEAD = struct.Struct(">iI")  # length, header word
_FRAME_HEAD_SIZE = FRAME_PREFIX_SIZE + HEADER_WORD_SIZE
_SERIALIZE_TYPE_MAX = 1  # 0 JSON, 1 ROCKETMQ

# Drop the consumed front of the buffer once it is this large and at least half the buffer:
# compaction then moves at most as many bytes as were consumed since the last one.
_COMPACT_THRESHOLD_BYTES = 64 * 1024

# A frame at least this long (its whole length, prefix included) whose header is in hand but
# whose body is not is collected read by read and joined once (module docstring).
LARGE_FRAME_BYTES = 64 * 1024


class FrameDecoder:
    """Split a byte stream into RemotingCommands.

    Args:
        frame_size_max: largest accepted frame length (the prefix's value: header word, header
            and body). Defaults to ``limits.FRAME_SIZE_MAX`` (16 MiB), RocketMQ's default.
        large_frame_bytes: frames at least this long (prefix included) are collected read by
            read and joined once instead of going through the buffer (module docstring).
        send_run_frames_min: ``feed_requests`` decodes a read shorter than this many frames
            the size of its first the general way (``send_run.RUN_FRAMES_MIN``).
    """

    def __init__(self, frame_size_max: int = limits.FRAME_SIZE_MAX,
                 large_frame_bytes: int = LARGE_FRAME_BYTES,
                 send_run_frames_min: int = RUN_FRAMES_MIN) -> None:
        self.frame_size_max = frame_size_max
        self.large_frame_bytes = large_frame_bytes
        self.send_run_frames_min = send_run_frames_min
        self._buffer = bytearray()
        self._position = 0  # bytes of _buffer already decoded
        self._checked_frame_at = -1  # buffer position whose length and header word passed
        self._error: ProtocolError | None = None
        # The reads of an unfinished large frame (its first holds the whole header), their
        # total size and the frame's size; None when no large frame is being collected.
        self._parts: list[bytes | memoryview] | None = None
        self._parts_bytes = 0
        self._large_size = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as part of a command."""
        return len(self._buffer) - self._position + self._parts_bytes

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        """Take the next bytes of the stream; return the commands they complete, in order.

        Args:
            data: any number of bytes; empty is allowed and returns nothing.

        Returns:
            The commands whose last byte was in ``data`` (often none, or several).

        Raises:
            FrameTooLarge: a length prefix is above ``frame_size_max``.
            RemoteProtocolError: a length below 4, an unknown serialize type, a header longer
                than its frame, or a malformed header. The decoder is dead afterwards and
                raises the same error on every later call; close the connection. Commands
                completed earlier in the same call are dropped with it.
        """
        return self._feed(data, self._decode_available)  # type: ignore[return-value]

    def feed_requests(self, data: bytes | bytearray | memoryview
                      ) -> list[RemotingCommand] | SendRun:
        """``feed``, except that when the whole frames completed by ``data`` are a run of
        SEND_MESSAGE_V2 requests (protocol/send_run.py) they come as one ``SendRun`` (its
        columns; as a sequence, the very commands ``feed`` would have returned) instead of
        a list. Same buffering, same errors: a read that is not such a run is decoded as
        ``feed`` decodes it."""
        if (self._position == len(self._buffer) and self._parts is None
                and len(data) >= FRAME_PREFIX_SIZE
                and len(data) < self.send_run_frames_min * (FRAME_PREFIX_SIZE
                                                            + _INT32.unpack_from(data)[0])):
            # Too short for a run (``decode_send_run``), told before any of it is set up:
            # most reads at low rates.
            return self._feed(data, self._decode_available)  # type: ignore[return-value]
        return self._feed(data, self._decode_requests)

    def _feed(self, data: bytes | bytearray | memoryview,
              decode: Callable[[bytes | memoryview, int],
                               tuple[list[RemotingCommand] | SendRun, int]],
              ) -> list[RemotingCommand] | SendRun:
        if self._error is not None:
            raise self._error
        if not data:
            return []
        try:
            if self._parts is not None:
                return self._feed_large(data)
            if self._position == len(self._buffer):
                # Nothing waiting: decode straight from ``data``, keep only its unfinished tail.
                if self._buffer:
                    self._buffer.clear()
                    self._position = 0
                self._checked_frame_at = -1
                if type(data) is bytes:  # what a transport hands over: sliced without a view
                    commands, consumed = decode(data, 0)
                else:
                    with memoryview(data) as view:
                        commands, consumed = decode(view, 0)
                # The tail's length and header word were checked by _decode_available.
                if consumed < len(data) and not self._start_large(data, consumed):
                    self._buffer += memoryview(data)[consumed:]
                    # Positions were counted in ``data``; the tail now starts the buffer.
                    self._checked_frame_at = 0 if self._checked_frame_at == consumed else -1
                return commands
            self._buffer += data
            with memoryview(self._buffer) as view:
                commands, self._position = decode(view, self._position)
            self._compact()
            # A checked large frame now starting the buffer: collect the rest read by read
            # (_start_large copies the buffer's bytes only when it takes the frame).
            if (self._position == 0 and self._checked_frame_at == 0
                    and self._start_large(self._buffer, 0)):
                self._buffer.clear()
                self._checked_frame_at = -1
            return commands
        except ProtocolError as e:
            self._error = e
            self._buffer = bytearray()  # nothing more will be decoded; free the memory
            self._position = 0
            self._parts = None
            self._parts_bytes = 0
            raise

    def _start_large(self, data: bytes | bytearray | memoryview, start: int) -> bool:
        """Begin collecting the large frame that starts at ``data[start]`` (its length and
        header word already checked) when its whole header is there; False if not large or
        the header is not all there yet."""
        if len(data) - start < _FRAME_HEAD_SIZE:
            return False
        length, word = _FRAME_HEAD.unpack_from(data, start)
        size = length + FRAME_PREFIX_SIZE
        if size < self.large_frame_bytes or (
            len(data) - start < _FRAME_HEAD_SIZE + (word & HEADER_LENGTH_MAX)
        ):
            return False
        tail: bytes | memoryview = memoryview(data)[start:]
        if not _immutable(data):  # a caller's buffer may change once feed returns
            tail = bytes(tail)
        self._parts = [tail]
        self._parts_bytes = len(tail)
        self._large_size = size
        return True

    def _feed_large(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        """``feed`` while a large frame is being collected."""
        parts = self._parts
        assert parts is not None
        missing = self._large_size - self._parts_bytes
        if len(data) < missing:
            parts.append(data if _immutable(data) else bytes(data))
            self._parts_bytes += len(data)
            return []
        view = memoryview(data)
        parts.append(view[:missing])
        self._parts = None
        self._parts_bytes = 0
        first = parts[0]
        word = _FRAME_HEAD.unpack_from(first, 0)[1]
        header_end = _FRAME_HEAD_SIZE + (word & HEADER_LENGTH_MAX)
        command = decode_checked_frame(first, word >> 24, _FRAME_HEAD_SIZE, header_end,
                                       header_end)
        parts[0] = memoryview(first)[header_end:]
        body = b"".join(parts)
        if body:
            command.body = body
        if missing == len(data):
            return [command]
        rest: bytes | memoryview = view[missing:]
        if not _immutable(data):
            rest = bytes(rest)  # the caller's buffer may change once feed returns
        return [command, *self.feed(rest)]

    def _decode_requests(
        self, source: bytes | memoryview, position: int
    ) -> tuple[list[RemotingCommand] | SendRun, int]:
        """``_decode_available``, or the run of SEND_MESSAGE_V2 requests the whole frames
        from ``position`` are (``decode_send_run``)."""
        decoded = decode_send_run(source, position, self.frame_size_max,
                                  self.send_run_frames_min)
        if decoded is None:
            return self._decode_available(source, position)
        run, position = decoded
        # What follows the run is a frame not all there (or nothing): its length and header
        # word checked now, as _decode_available checks them; it decodes no frame.
        _, position = self._decode_available(source, position)
        return run, position

    def _decode_available(
        self, source: bytes | memoryview, position: int
    ) -> tuple[list[RemotingCommand], int]:
        """Decode every whole frame in ``source`` from ``position``; return them and the new
        position. Checks the next frame's length and header word even when it is incomplete.

        The inner loop of a read holding many small frames: one unpack of the length and
        header word per frame, the checks inline, and a JSON header (what every tidemq and
        Java peer sends) decoded straight from ``source`` by ``decode_json_header``, its body
        sliced here: what ``decode_checked_frame`` does, one Python call less per frame.
        """
        commands: list[RemotingCommand] = []
        append = commands.append
        unpack_head = _FRAME_HEAD.unpack_from
        decode_json = decode_json_header
        frame_size_max = self.frame_size_max
        checked_at = self._checked_frame_at
        # A slice of bytes is a copy already; a memoryview's slice must be copied out.
        source_is_bytes = type(source) is bytes
        end = len(source)
        while end - position >= _FRAME_HEAD_SIZE:
            length, word = unpack_head(source, position)
            serialize_type = word >> 24
            header_length = word & HEADER_LENGTH_MAX
            if position != checked_at and (
                not HEADER_WORD_SIZE <= length <= frame_size_max
                or serialize_type > _SERIALIZE_TYPE_MAX
                or header_length > length - HEADER_WORD_SIZE
            ):
                self._check_length(length)
                check_header_word(serialize_type, header_length, length)
            header_start = position + _FRAME_HEAD_SIZE
            frame_end = header_start - HEADER_WORD_SIZE + length
            if frame_end > end:
                self._checked_frame_at = position
                return commands, position
            header_end = header_start + header_length
            if serialize_type:  # ROCKETMQ
                append(decode_checked_frame(source, serialize_type, header_start, header_end,
                                            frame_end))
            else:
                command = decode_json(source[header_start:header_end])
                if header_end < frame_end:
                    command.body = (source[header_end:frame_end] if source_is_bytes
                                    else bytes(source[header_end:frame_end]))
                append(command)
            position = frame_end
        if end - position >= FRAME_PREFIX_SIZE and position != checked_at:
            # The length is here but not the header word: check what can be checked.
            self._check_length(_INT32.unpack_from(source, position)[0])
        return commands, position

    def _check_length(self, length: int) -> None:
        if length < HEADER_WORD_SIZE:
            raise RemoteProtocolError(
                f"frame length is {length}; at least {HEADER_WORD_SIZE} is needed for the "
                "header word (is the peer speaking the RocketMQ remoting protocol?)"
            )
        if length > self.frame_size_max:
            raise FrameTooLarge(
                f"frame is {length} bytes, larger than frame_size_max={self.frame_size_max} "
                "(set remoting.frame_size_max)"
            )

    def _compact(self) -> None:
        position = self._position
        if position == len(self._buffer):
            self._buffer.clear()
            self._position = 0
            self._checked_frame_at = -1
        elif position >= _COMPACT_THRESHOLD_BYTES and position * 2 >= len(self._buffer):
            del self._buffer[:position]
            self._position = 0
            if self._checked_frame_at == position:
                self._checked_frame_at = 0
            else:
                self._checked_frame_at = -1


def _immutable(data: bytes | bytearray | memoryview) -> bool:
    """True for ``bytes`` and views of ``bytes``: safe to keep a view of after ``feed``."""
    return type(data) is bytes or (type(data) is memoryview and type(data.obj) is bytes)


def encode_frame(command: RemotingCommand) -> bytes:
    """The whole frame of ``command``, length prefix included (same as ``command.encode()``)."""
    return command.encode()

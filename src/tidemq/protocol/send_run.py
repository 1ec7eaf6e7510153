"""A read's run of SEND_MESSAGE_V2 requests decoded as columns, with no command per request.

A producer with many sends in flight has a read's worth of SEND_MESSAGE_V2 frames arrive
together, all alike; a broker serving them as columns (broker/plain_sends.py) needs their
opaques, extFields and bodies, not a ``RemotingCommand`` each. ``decode_send_run`` reads the
whole frames of a read straight into those columns when every one is such a request in the
shape Java and tidemq peers write (below), and returns None, having changed nothing, as soon
as one is not: the caller then decodes the read the general way (``FrameDecoder``), which
gives every command, and every error, as before.

A run's frames, each of them:

- JSON serialize type, a length and header word the general decoder accepts, a body;
- a header that starts ``{"code":310,`` (keys sorted, as fastjson and tidemq write them;
  a cheap test that lets any other request fail at once, before its parse), parses as one
  JSON object, and passes the general decoder's fast path: ``code``, ``opaque``, ``flag``,
  ``version`` ints within int32, ``language`` a known name, ``remark`` absent or a string,
  and extFields an object of strings (here also required);
- flag 0: a two-way request.

So a run's commands (``SendRun.commands``, made on first use, once) are exactly what
``decode_command`` makes of its frames; tests/unit/protocol/test_send_run.py checks it on
random and odd frames. A ``SendRun`` is also a sequence of those commands, so a handler that
reads its requests one by one (any fallback) works unchanged.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from itertools import chain, repeat
from operator import itemgetter
from typing import Any, overload

import orjson

from tidemq.protocol.codes import LanguageCode, RequestCode, SerializeType
from tidemq.protocol.command import (
    FRAME_PREFIX_SIZE,
    HEADER_LENGTH_MAX,
    HEADER_WORD_SIZE,
    RemotingCommand,
)

_FRAME_HEAD = struct.Struct(">iI")  # length, header word
_INT32 = struct.Struct(">i")
_FRAME_HEAD_SIZE = FRAME_PREFIX_SIZE + HEADER_WORD_SIZE
_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)
# How every run header begins (module docstring); 12 bytes.
_HEADER_PREFIX = b'{"code":%d,' % _SEND_V2
_HEADER_PREFIX_SIZE = len(_HEADER_PREFIX)
_FIXED_FIELDS = itemgetter("code", "opaque", "flag", "version", "language")
_LANGUAGE_BY_NAME = {member.name: member for member in LanguageCode}
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_REMARK_TYPES = frozenset({type(None), str})
# A read shorter than this many frames the size of its first is decoded the general way: the
# run's checks are a fixed ~15 C-level passes, which cost more than a command each saves
# for a few sends (a read of 2 was 3 % dearer as a run, of 8 level, of 32 15 % cheaper).
RUN_FRAMES_MIN = 8
_JSON = SerializeType.JSON
_loads = orjson.loads
_new_command = object.__new__


class SendRun(Sequence[RemotingCommand]):
    """The SEND_MESSAGE_V2 requests of one read (module docstring), as columns in arrival
    order: ``opaques``, ``ext_fields`` (each an object of strings) and ``bodies`` (each
    non-empty). As a sequence it is their commands, made on first use."""

    __slots__ = ("_commands", "_headers", "bodies", "ext_fields", "opaques")

    def __init__(self, headers: list[dict[str, Any]], opaques: list[int],
                 ext_fields: list[dict[str, str]], bodies: list[bytes]) -> None:
        self._headers = headers  # the parsed JSON headers, for the commands
        self.opaques = opaques
        self.ext_fields = ext_fields
        self.bodies = bodies
        self._commands: list[RemotingCommand] | None = None

    def __len__(self) -> int:
        return len(self.bodies)

    @overload
    def __getitem__(self, index: int) -> RemotingCommand: ...

    @overload
    def __getitem__(self, index: slice) -> list[RemotingCommand]: ...

    def __getitem__(self, index: int | slice) -> RemotingCommand | list[RemotingCommand]:
        return self.commands()[index]

    def __iter__(self) -> Iterator[RemotingCommand]:
        return iter(self.commands())

    def part(self, start: int, stop: int) -> SendRun:
        """The requests ``start`` to ``stop`` (excluded) as a run of their own."""
        return SendRun(self._headers[start:stop], self.opaques[start:stop],
                       self.ext_fields[start:stop], self.bodies[start:stop])

    def commands(self) -> list[RemotingCommand]:
        """The requests as commands, what ``decode_command`` makes of their frames; the same
        list (and commands) on every call."""
        commands = self._commands
        if commands is None:
            commands = self._commands = list(map(_command, self._headers, self.bodies))
        return commands


def _command(header: dict[str, Any], body: bytes) -> RemotingCommand:
    # Stored field by field as decode_json_header's fast path stores them.
    command = _new_command(RemotingCommand)
    command.code = header["code"]
    command.opaque = header["opaque"]
    command.flag = header["flag"]
    command.remark = header.get("remark")
    command.ext_fields = header["extFields"]
    command.body = body
    command.language = _LANGUAGE_BY_NAME[header["language"]]
    command.version = header["version"]
    command.serialize_type = _JSON
    return command


def decode_send_run(source: bytes | memoryview, position: int, frame_size_max: int,
                    frames_min: int = RUN_FRAMES_MIN) -> tuple[SendRun, int] | None:
    """The run of the whole frames in ``source`` from ``position`` and the position after
    its last frame, when there is at least one whole frame and every whole frame is a run's
    (module docstring); else None, also when what is there is shorter than ``frames_min``
    frames the size of the first. A frame not all there ends the run (the caller keeps its
    bytes and checks its length and header word)."""
    # First, before anything is set up: most reads at low rates are too short.
    available = len(source) - position
    if available < _FRAME_HEAD_SIZE or (
            available < frames_min * (FRAME_PREFIX_SIZE + _INT32.unpack_from(source, position)[0])):
        return None
    headers: list[dict[str, Any]] = []
    bodies: list[bytes] = []
    add_header = headers.append
    add_body = bodies.append
    unpack_head = _FRAME_HEAD.unpack_from
    loads = _loads
    prefix = _HEADER_PREFIX
    prefix_size = _HEADER_PREFIX_SIZE
    source_is_bytes = type(source) is bytes
    end = len(source)
    try:
        while end - position >= _FRAME_HEAD_SIZE:
            length, word = unpack_head(source, position)
            header_length = word & HEADER_LENGTH_MAX
            # word >> 24 (the serialize type) must be 0: JSON, so word is the header length.
            if (word != header_length or not HEADER_WORD_SIZE <= length <= frame_size_max
                    or header_length >= length - HEADER_WORD_SIZE):  # >=: a body is required
                return None
            header_start = position + _FRAME_HEAD_SIZE
            frame_end = header_start - HEADER_WORD_SIZE + length
            if frame_end > end:
                break
            header_end = header_start + header_length
            if source[header_start:header_start + prefix_size] != prefix:
                return None
            add_header(loads(source[header_start:header_end]))
            add_body(source[header_end:frame_end] if source_is_bytes
                     else bytes(source[header_end:frame_end]))
            position = frame_end
    except orjson.JSONDecodeError:
        return None
    if not headers:
        return None
    return _checked_run(headers, bodies, position)


def _checked_run(headers: list[dict[str, Any]], bodies: list[bytes], position: int
                 ) -> tuple[SendRun, int] | None:
    """The run of ``headers`` when each passes the checks of the module docstring."""
    try:
        codes, opaques, flags, versions, languages = zip(*map(_FIXED_FIELDS, headers),
                                                         strict=True)
        ext_fields = list(map(dict.get, headers, repeat("extFields")))
        remarks = list(map(dict.get, headers, repeat("remark")))
        if (
            set(map(type, chain(codes, opaques, flags, versions))) != {int}
            or set(codes) != {_SEND_V2}
            or set(flags) != {0}
            or min(chain(opaques, versions)) < _INT32_MIN
            or max(chain(opaques, versions)) > _INT32_MAX
            or not _LANGUAGE_BY_NAME.keys() >= set(languages)  # TypeError: a list, an object
            or not set(map(type, remarks)) <= _REMARK_TYPES
        ):
            return None
        # TypeError unless every extFields is an object (no None) and every value a string.
        "".join(chain.from_iterable(map(dict.values, ext_fields)))
    except (KeyError, TypeError):  # a field missing, a header that is no object, ...
        return None
    return SendRun(headers, list(opaques), ext_fields, bodies), position

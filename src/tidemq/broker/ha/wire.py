"""The HA stream's two byte formats (RocketMQ 4.x HAService, docs/protocol.md), sans-IO.

Raw TCP on the master's haListenPort, no remoting frames, no handshake. Big-endian.

Slave -> master, an *offset report*, sent on connect, after applying data and at least every
``haSendHeartbeatInterval``::

    off size field
      0    8 offset   the slave's commit-log max offset (everything below it is written)
    REPORT_SIZE = 8

The master reads in 8-byte units and acts on the last complete one; a report is only ever
8 bytes, so a read of 12 bytes is one report and half of the next.

Master -> slave, a *chunk*, repeated::

    off size field
      0    8 offset   the commit-log physical offset of the first body byte
      8    4 size     body size; 0 is a heartbeat (sent when idle)
     12 size body     raw commit-log bytes, up to haTransferBatchSize, inside one segment
    CHUNK_HEADER_SIZE = 8 + 4 = 12

Limits: a chunk body larger than ``chunk_size_max`` (RocketMQ's slave reads into a 4 MiB
buffer, so no real master sends more) and a negative size or offset are a protocol error
(``RemoteProtocolError``): the reader closes the connection.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tidemq.errors import RemoteProtocolError

REPORT = struct.Struct(">q")
REPORT_SIZE = REPORT.size
CHUNK_HEADER = struct.Struct(">qi")
CHUNK_HEADER_SIZE = CHUNK_HEADER.size
assert (REPORT_SIZE, CHUNK_HEADER_SIZE) == (8, 12)

# RocketMQ's HAClient reads into a 4 MiB buffer (READ_MAX_BUFFER_SIZE): no master of its
# sends a larger chunk; anything larger is not a master speaking.
CHUNK_SIZE_MAX = 4 * 1024 * 1024


def encode_report(offset: int) -> bytes:
    """The 8 bytes a slave sends to report ``offset``."""
    return REPORT.pack(offset)


def encode_chunk_header(offset: int, size: int) -> bytes:
    """The 12-byte header of a chunk of ``size`` bytes at ``offset`` (size 0: heartbeat)."""
    return CHUNK_HEADER.pack(offset, size)


class ReportDecoder:
    """Turns the bytes a slave sends into its offset reports."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> int | None:
        """Take ``data``; return the last complete report in it (None: none completed).

        Raises:
            RemoteProtocolError: a report is negative (no offset is).
        """
        data = self._pending + data if self._pending else data
        whole = len(data) - len(data) % REPORT_SIZE
        self._pending = data[whole:]
        if whole == 0:
            return None
        # Every report is checked, not only the last: garbage is garbage wherever it sits.
        offsets = struct.unpack(f">{whole // REPORT_SIZE}q", data[:whole])
        if min(offsets) < 0:
            raise RemoteProtocolError(
                f"offset report {min(offsets)} is negative: not a slave's report"
            )
        return offsets[-1]


@dataclass(slots=True)
class Chunk:
    """One chunk of the master's stream (``data`` empty for a heartbeat)."""

    offset: int
    data: bytes | memoryview


class ChunkDecoder:
    """Turns the bytes a master sends into chunks; checks sizes before buffering a body.

    Args:
        chunk_size_max: the largest body accepted.
    """

    def __init__(self, chunk_size_max: int = CHUNK_SIZE_MAX) -> None:
        self._buffer = bytearray()
        self._chunk_size_max = chunk_size_max

    def feed(self, data: bytes) -> list[Chunk]:
        """Take ``data``; return the chunks completed by it, in order.

        Bodies that lie wholly in ``data`` are returned as views of it (no copy: bytes do
        not change); only a chunk split across reads is copied together.

        Raises:
            RemoteProtocolError: a header with a negative offset or size, or a size above
                ``chunk_size_max``; the stream cannot be trusted after it.
        """
        if self._buffer:
            self._buffer += data
            source: bytes | bytearray = self._buffer
        else:
            source = data
        view = memoryview(source)
        chunks: list[Chunk] = []
        position = 0
        end = len(source)
        try:
            while end - position >= CHUNK_HEADER_SIZE:
                offset, size = CHUNK_HEADER.unpack_from(source, position)
                if offset < 0 or size < 0 or size > self._chunk_size_max:
                    raise RemoteProtocolError(
                        f"chunk header says {size} bytes at offset {offset}: not a master's "
                        f"chunk (sizes are 0..{self._chunk_size_max}, offsets >= 0)"
                    )
                body_start = position + CHUNK_HEADER_SIZE
                if end - body_start < size:
                    break
                if source is data:
                    chunks.append(Chunk(offset, view[body_start : body_start + size]))
                else:  # a copy: the bytearray is cut below
                    chunks.append(Chunk(offset, view[body_start : body_start + size].tobytes()))
                position = body_start + size
            rest = bytes(view[position:]) if source is data else None
        finally:
            if source is not data:
                view.release()  # the bytearray can be resized again
        if rest is not None:
            self._buffer = bytearray(rest)
        elif position:
            del self._buffer[:position]
        return chunks

    @property
    def buffered(self) -> int:
        """Bytes held for a chunk not yet complete."""
        return len(self._buffer)

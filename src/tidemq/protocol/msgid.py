"""Message ids: the broker's offset message id and the client's unique key (docs/protocol.md §8).

Offset message id (SEND response ``msgId``, ``offsetMsgId`` to users), uppercase hex of::

    size (IPv4 | IPv6)  field
       4 | 16           store host address
       4                store host port, int32
       8                commit-log physical offset, int64, big-endian
    = 16 | 28 bytes     = 32 | 56 hex characters

It says where a message lives, so "view message by id" connects to the address inside it and
asks for that physical offset.

Client unique key (the ``UNIQ_KEY`` property, ``SendResult.msgId`` to users), uppercase hex of::

    size  field
       4  client IPv4 address (random bytes when none is found)
       2  low 16 bits of the process id
       4  random per process (Java: the class loader's hash)
       4  ms since the start of the current month, local time, int32
       2  low 16 bits of a per-process counter
    = 16 bytes = 32 hex characters

The first 10 bytes are fixed per process, so they are rendered to hex once.
"""

from __future__ import annotations

import itertools
import operator
import os
import re
import socket
import struct
import threading
import time

from tidemq.errors import InvalidMessageId, LocalProtocolError
from tidemq.protocol.message import pack_host, unpack_host

_PORT_OFFSET = struct.Struct(">iq")
_OFFSET_MSG_ID = re.compile(r"[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56}")
OFFSET_MSG_ID_LENGTH_IPV4 = 32
OFFSET_MSG_ID_LENGTH_IPV6 = 56


def encode_offset_msg_id(store_host: str, physical_offset: int) -> str:
    """The offset message id of the record at ``physical_offset`` on ``store_host``.

    Args:
        store_host: the broker's ``"ip:port"`` (``"[v6]:port"`` or ``"v6:port"`` for IPv6).
        physical_offset: the record's commit-log offset.

    Returns:
        32 uppercase hex characters for an IPv4 host, 56 for IPv6.

    Raises:
        LocalProtocolError: the host is not an IP literal with a port, or a number is out of
            range.
    """
    address, port, _ = pack_host(store_host)
    try:
        tail = _PORT_OFFSET.pack(port, physical_offset)
    except struct.error:
        raise LocalProtocolError(
            f"store host port {port} or physical offset {physical_offset} is out of range"
        ) from None
    return (address + tail).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """Split an offset message id into the store host ``"ip:port"`` and the physical offset.

    Raises:
        InvalidMessageId: not 32 (IPv4) or 56 (IPv6) hex characters. A unique key (UNIQ_KEY)
            has the same shape as an IPv4 offset id; only the broker can tell them apart.
    """
    if not isinstance(msg_id, str) or not _OFFSET_MSG_ID.fullmatch(msg_id):
        shown = msg_id[:80] if isinstance(msg_id, str) else msg_id
        raise InvalidMessageId(
            f"message id {shown!r} is not an offset message id: expected 32 (IPv4) or 56 "
            "(IPv6) hex characters"
        )
    raw = bytes.fromhex(msg_id)
    address_length = len(raw) - _PORT_OFFSET.size
    port, offset = _PORT_OFFSET.unpack_from(raw, address_length)
    return unpack_host(raw[:address_length], port), offset


# -- unique keys --------------------------------------------------------------------------------


def _local_ipv4() -> bytes:
    # Connecting a UDP socket sends nothing; it only asks the kernel which local address
    # would route out. 192.0.2.1 is TEST-NET-1, never a real host.
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))
            address = probe.getsockname()[0]
        packed = socket.inet_aton(address)
        if packed != b"\x00\x00\x00\x00":
            return packed
    except OSError:
        pass
    return os.urandom(4)


def _month_bounds_ms(now_ms: int) -> tuple[int, int]:
    """Start of the local month containing ``now_ms`` and start of the next one, in ms."""
    local = time.localtime(now_ms // 1000)
    year, month = local.tm_year, local.tm_mon
    next_year, next_month = (year + 1, 1) if month == 12 else (year, month + 1)
    start = time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1))
    end = time.mktime((next_year, next_month, 1, 0, 0, 0, 0, 0, -1))
    return int(start * 1000), int(end * 1000)


class _UniqueKeyState:
    """The per-process part of unique keys; rebuilt after fork so children differ."""

    def __init__(self) -> None:
        prefix = _local_ipv4() + struct.pack(">H", os.getpid() & 0xFFFF) + os.urandom(4)
        self.prefix_hex = prefix.hex().upper()
        self.counter = itertools.count(int.from_bytes(os.urandom(2), "big"))
        self.month = (0, 0)  # (start ms, next start ms); (0, 0) forces a first computation
        # (ms, the key head made then): sends of one millisecond share the formatting. One
        # attribute, so a thread reads a matching pair.
        self.head_at: tuple[int, str] = (-1, "")
        self.lock = threading.Lock()


_state: _UniqueKeyState | None = None


def _reset_state() -> None:
    global _state
    _state = None


os.register_at_fork(after_in_child=_reset_state)


# The two uppercase hex digits of each byte value: a key's counter part as two lookups. A
# ``:04X`` format spec is parsed again on every call: ~0.3 us more per key (pinned, 2026-11-27).
_BYTE_HEX = tuple(f"{value:02X}" for value in range(256))


def new_unique_key(now_ms: int | None = None) -> str:
    """A new client message id (UNIQ_KEY): 32 uppercase hex characters, unique per process.

    Args:
        now_ms: the current time in ms since the epoch (``time.time_ns() // 1_000_000``), for
            a caller that has just read the clock for its own use (a send's born timestamp);
            read here when None.

    Safe to call from several threads: the counter is an ``itertools.count`` (atomic under
    the GIL), and only the monthly recomputation of the time base takes a lock.
    """
    state, head = _key_head(now_ms)
    counter = next(state.counter)
    return f"{head}{_BYTE_HEX[(counter >> 8) & 0xFF]}{_BYTE_HEX[counter & 0xFF]}"


def new_unique_keys(count: int) -> list[str]:
    """``count`` new unique keys made together (a producer's batch): the same keys as
    ``count`` calls of ``new_unique_key``, sharing one clock reading, with the counter
    part rendered for all of them at once. Thread-safe like ``new_unique_key``; an empty
    list for ``count <= 0``.
    """
    if count <= 0:
        return []
    state, head = _key_head()
    # The counter run, masked to 16 bits, packed big-endian and hexed with a space every
    # 2 bytes: one split gives every key's last 4 characters.
    counters = map(operator.and_, itertools.islice(state.counter, count), itertools.repeat(0xFFFF))
    packed = struct.pack(f">{count}H", *counters)
    return list(map(head.__add__, packed.hex(" ", 2).upper().split(" ")))


def _key_head(now_ms: int | None = None) -> tuple[_UniqueKeyState, str]:
    # The state and the first 28 characters of a key made at ``now_ms`` (now when None):
    # process part, then the ms since the start of the month.
    global _state
    state = _state
    if state is None:
        state = _state = _UniqueKeyState()
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    head_ms, head = state.head_at
    if head_ms == now_ms:
        return state, head
    start, end = state.month
    if not start <= now_ms < end:
        with state.lock:
            state.month = _month_bounds_ms(now_ms)
            start = state.month[0]
    head = f"{state.prefix_hex}{(now_ms - start) & 0xFFFFFFFF:08X}"
    state.head_at = (now_ms, head)
    return state, head


def unique_key_timestamp(key: str, now_ms: int | None = None) -> int | None:
    """Roughly when a unique key was made (ms since the epoch), or None if it is not one.

    The key holds ms since the start of its month in the maker's local time; like Java's
    ``MessageClientIDSetter.getNearlyTimeFromID`` this assumes our time zone and picks the
    current month, or the previous one when that would put the key in the future.

    Args:
        key: a 32- or 56-character unique key.
        now_ms: "now" for the month choice; the current time when None.
    """
    if not isinstance(key, str) or not _OFFSET_MSG_ID.fullmatch(key):
        return None
    time_at = len(key) - 12  # 4 bytes of time, then 2 bytes of counter, at the end
    elapsed = int(key[time_at : time_at + 8], 16)
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    start, _ = _month_bounds_ms(now_ms)
    if start + elapsed <= now_ms:
        return start + elapsed
    previous_start, _ = _month_bounds_ms(start - 1)
    return previous_start + elapsed

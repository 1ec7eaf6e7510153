"""Decoding a pull's records for a consumer: one pass, few objects, rare fields on first use.

A consumer pulls hundreds of thousands of records a second and mostly reads a message's body,
topic, queue and offset; its properties, hosts, timestamps and the record's bookkeeping
(sizes, CRC, commit-log offset) are read far less often. Storing seventeen fields on each of
those objects was most of the cost of decoding a record, so a pulled record sets only the
common ones (``topic``, ``body``, ``queue_id``, ``queue_offset``, ``broker_name``) and keeps
the bytes of the record's fixed part and of its PROPERTIES; any other field is made from
them when first read (the fixed part's fields are properties over its bytes, unpacked on
the first read of any of them; the hosts and the properties come from
``PulledMessageExt.__getattr__`` and are then stored like any other field), and a value a
caller assigns is never overwritten. The pass itself unpacks only the seven fixed
fields it needs.

The pass does in the same loop what a consumer needs done to each record: the body's CRC is
checked against BODYCRC (a record that fails is set aside, never handed out as intact), a
zlib-compressed body is inflated, ``broker_name`` is set, and a run of records of one topic
shares one topic string.

A record that is not the common kind (v1 magic, IPv4 hosts) or whose sizes do not add up goes
to ``message``'s field-by-field reader, which names what is wrong.

Records of one size. A pull of a backlog of like messages (same body size, same topic, same
kind of properties: a benchmark, sensor readings, a fixed schema) is a run of records that all
have one layout. Such a body is decoded without stepping from record to record in Python:
``struct.iter_unpack`` cuts every record into its fixed part, body, topic and properties bytes
and the three integers a message needs, and the CRCs are computed and compared as whole
columns (``map``). It is taken only when the body is a whole number (``SAME_SIZE_RECORDS_MIN``
at least) of records of the first record's size and every record has the first one's framing:
the bytes of TOTALSIZE, MAGICCODE, SYSFLAG and BODYLENGTH are equal in every record (checked
with one strided slice per byte) and so are TOPICLENGTH, TOPIC and PROPERTIESLENGTH (compared
record by record).
Anything else (a compressed or IPv6 record, a record of another size or topic, a length that
does not add up) is left to the record-by-record pass, which decodes it as before; the two
give equal messages (tests/unit/protocol/test_pulled_records.py). In process, a 256-record
answer of 1 KiB messages: 1.42 -> 0.92 µs per record, CRC check included (RESULTS.md).
"""

from __future__ import annotations

import functools
import struct
import zlib
from itertools import repeat
from operator import and_, attrgetter, itemgetter
from typing import Any

from tidemq.errors import RemoteProtocolError
from tidemq.protocol.crc import crc32 as body_crc32
from tidemq.protocol.message import (
    _HOSTS_V6,
    _INT16,
    _INT32,
    MAGIC_V1,
    RECORD_FIXED_SIZE_IPV4,
    RECORD_PREFIX_IPV4,
    RECORD_PREFIX_SIZE_IPV4,
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_TYPE_MASK,
    SYSFLAG_COMPRESSION_ZLIB,
    MessageExt,
    _decode_record_checked,
    decode_properties,
    unpack_host,
)

__all__ = ["PulledMessageExt", "decode_pulled_records", "decompress_body"]

_unpack_int16 = _INT16.unpack_from
_unpack_prefix = RECORD_PREFIX_IPV4.unpack

# The seven fields of the fixed part a pull needs for every record, the rest skipped (an
# unpack of all seventeen made ten integers per record no consumer asked for): TOTALSIZE,
# MAGICCODE, BODYCRC, QUEUEID, (FLAG), QUEUEOFFSET, (PHYSICALOFFSET), SYSFLAG,
# (BORNTIMESTAMP ... PREPAREDTRANSACTIONOFFSET), BODYLENGTH.
_PULL_FIELDS = struct.Struct(">iiii4xq8xi44xi")
assert _PULL_FIELDS.size == RECORD_PREFIX_SIZE_IPV4
_unpack_pull_fields = _PULL_FIELDS.unpack_from

# Where each field made on first use sits in the unpacked fixed part (RECORD_PREFIX_IPV4's 17
# values: TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG,
# BORNTIMESTAMP, BORNHOST address, BORNHOST port, STORETIMESTAMP, STOREHOST address,
# STOREHOST port, RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET, BODYLENGTH).
_PREFIX_INDEX = {
    "store_size": 0,
    "body_crc": 2,
    "flag": 4,
    "physical_offset": 6,
    "sysflag": 7,
    "born_timestamp": 8,
    "store_timestamp": 11,
    "reconsume_times": 14,
    "prepared_transaction_offset": 15,
}
_HOST_INDEX = {"born_host": 9, "store_host": 12}  # address; the port follows it

# Records of one size (module docstring): the byte ranges of the fixed part that must be
# equal in every record (TOTALSIZE and MAGICCODE, SYSFLAG, BODYLENGTH) ...
_SAME_IN_EVERY_RECORD = ((0, 8), (36, 40), (84, 88))
# ... and the SYSFLAG bits the one-size pass does not handle (another layout, inflating).
_NOT_SAME_SIZE_SYSFLAGS = _HOSTS_V6 | SYSFLAG_COMPRESSED
_CRC_MASK = 0x7FFFFFFF  # BODYCRC keeps 31 bits (docs/protocol.md §6.1)
# ... and the fewest records it takes: its checks and column set-up cost a fixed ~5 us, so
# a short answer (a consumer keeping up gets 1-10 records a pull) is decoded faster record
# by record. In process, 1 KiB records, one pass against the other: 1 record 7.4 / 2.9 us,
# 4: 9.4 / 6.6, 8: 12.9 / 11.8, 12: 16.7 / 17.3, 32: 38.7 / 47.1 (RESULTS.md, client).
SAME_SIZE_RECORDS_MIN = 10
_SAME_SIZE_BYTES_MIN = SAME_SIZE_RECORDS_MIN * RECORD_FIXED_SIZE_IPV4
_unpack_int32 = _INT32.unpack_from
# The topic names of the records pulled, by their TOPICLENGTH and TOPIC bytes: every answer
# starts a new run of one topic, and decoding its name was ~10 % of decoding a one-record
# answer. A consumer reads a few topics; the table is emptied past TOPIC_NAMES_MAX names.
_TOPIC_NAMES: dict[bytes, str] = {}
TOPIC_NAMES_MAX = 1024
_get_body = attrgetter("body")
_first = itemgetter(0)


def _topic_name(framing: bytes) -> str:
    """The topic name of a record's TOPICLENGTH and TOPIC bytes, kept in ``_TOPIC_NAMES``."""
    if len(_TOPIC_NAMES) >= TOPIC_NAMES_MAX:
        _TOPIC_NAMES.clear()
    name = _TOPIC_NAMES[framing] = str(framing[1:], "utf-8", "replace")
    return name


def _field_codes(struct_format: str) -> list[str]:
    """A struct format's field codes in order (``">iq4s"`` -> ``["i", "q", "4s"]``)."""
    codes: list[str] = []
    count = ""
    for char in struct_format.lstrip("<>!=@"):
        if char.isdigit():
            count += char
        else:
            codes.append(count + char)
            count = ""
    return codes


_PREFIX_CODES = _field_codes(RECORD_PREFIX_IPV4.format)
assert len(_PREFIX_CODES) == 17 and struct.calcsize(">" + "".join(_PREFIX_CODES)) == (
    RECORD_PREFIX_SIZE_IPV4)


def _fixed_field(name: str, index: int) -> property:
    """The field ``name`` of a pulled record's fixed part, item ``index`` of its values: a
    property instead of the base class's slot. Until the fixed part is unpacked (a host
    read, an assignment) a read unpacks only this field from the kept bytes; after, it is an
    index into the unpacked values. Either is far less than a failed slot read, its
    AttributeError and ``__getattr__`` (~1 µs a message for a consumer reading each
    message's store timestamp, RESULTS.md). An assignment replaces the item; later reads
    return it."""
    offset = struct.calcsize(">" + "".join(_PREFIX_CODES[:index]))
    unpack_field = struct.Struct(">" + _PREFIX_CODES[index]).unpack_from

    def read(self: PulledMessageExt) -> Any:
        prefix = self._prefix
        if type(prefix) is bytes:
            return unpack_field(prefix, offset)[0]
        return prefix[index]

    def write(self: PulledMessageExt, value: Any) -> None:
        try:
            prefix = self._fixed_part()
        except AttributeError:  # made by the constructor (dataclasses.replace): no bytes kept
            prefix = self._prefix = [0] * len(_PREFIX_CODES)
        prefix[index] = value

    return property(read, write, doc=f"The record's {name} (read from its bytes).")


class PulledMessageExt(MessageExt):
    """A ``MessageExt`` decoded from a pull; its less used fields are made on first read.

    It is a ``MessageExt`` in every way a caller can see: the same fields with the same
    values, equal to a ``MessageExt`` with those values, picklable, and every field can be
    read and assigned; ``properties`` is a dict once read. The fields of the record's fixed
    part (``_PREFIX_INDEX``: timestamps, flags, sizes, offsets) are properties over the
    record's fixed part, unpacked on the first read of any of them; the hosts and the
    properties are made by ``__getattr__`` on first read and stored in their slots.
    """

    __slots__ = ("_prefix", "_properties_raw")

    def __getattr__(self, name: str) -> Any:
        # Called only when the slot ``name`` is unset: a field not made yet (or not a field).
        if name == "properties":
            value = decode_properties(str(self._properties_raw, "utf-8", "replace"))
        elif name in _HOST_INDEX:
            index = _HOST_INDEX[name]
            prefix = self._fixed_part()
            value = unpack_host(prefix[index], prefix[index + 1])
        else:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        setattr(self, name, value)
        return value

    def _fixed_part(self) -> list[Any]:
        """The record's fixed part unpacked (RECORD_PREFIX_IPV4's 17 values, as a list the
        fixed-part fields' setters assign into), unpacked on the first call from the kept
        bytes."""
        prefix = self._prefix
        if type(prefix) is bytes:
            prefix = self._prefix = list(_unpack_prefix(prefix))
        return prefix

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageExt):
            return NotImplemented
        return _field_values(self) == _field_values(other)

    __hash__ = None  # type: ignore[assignment]  # as MessageExt: mutable, unhashable


for _name, _index in _PREFIX_INDEX.items():
    setattr(PulledMessageExt, _name, _fixed_field(_name, _index))
del _name, _index


_FIELD_NAMES = tuple(MessageExt.__dataclass_fields__)


def _field_values(message: MessageExt) -> tuple[Any, ...]:
    return tuple(getattr(message, name) for name in _FIELD_NAMES)


def decode_pulled_records(
    data: bytes | bytearray | memoryview,
    broker_name: str = "",
    *,
    damaged: list[MessageExt] | None = None,
    decompress: bool = False,
) -> list[MessageExt]:
    """All records of a pull body, in order, decoded in one pass (module docstring).

    Args:
        data: the concatenated stored records of a PULL_MESSAGE response body.
        broker_name: set on every message (a record does not name its broker group).
        damaged: when given, a record whose body does not match its BODYCRC (checked on the
            stored bytes, before inflating), or whose body is flagged compressed but does not
            inflate, is appended here instead of to the result.
        decompress: inflate zlib-compressed bodies (``decompress_body``).

    Raises:
        RemoteProtocolError: a record is malformed or the bytes end inside one (as
            ``message.decode_records``), or (without ``damaged``) a compressed body does not
            inflate.
    """
    source = data if type(data) is bytes else bytes(data)
    end = len(source)
    # The one-size pass only for bytes that may hold SAME_SIZE_RECORDS_MIN records of the
    # first one's size: a consumer keeping up gets a few records an answer, and the pass's
    # own first checks were ~15 % of decoding a one-record answer.
    if end >= _SAME_SIZE_BYTES_MIN:
        first_size = _unpack_int32(source, 0)[0]
        if first_size > 0 and end >= first_size * SAME_SIZE_RECORDS_MIN:
            same_size = _decode_same_size(source, broker_name, damaged)
            if same_size is not None:
                return same_size
    messages: list[MessageExt] = []
    append = messages.append
    check_crc = damaged is not None
    crc32 = body_crc32
    new = object.__new__
    cls = PulledMessageExt
    topic_bytes = b"\x00"  # TOPICLENGTH and TOPIC of the last record: an empty topic first
    topic = ""
    topic_names = _TOPIC_NAMES
    position = 0
    while position < end:
        available = end - position
        if available >= RECORD_FIXED_SIZE_IPV4:
            total, magic, body_crc, queue_id, queue_offset, sysflag, body_length = (
                _unpack_pull_fields(source, position))
            body_start = position + RECORD_PREFIX_SIZE_IPV4
            body_end = body_start + body_length
            record_end = position + total
            if (
                magic == MAGIC_V1
                and not sysflag & _HOSTS_V6
                and total <= available
                and body_start <= body_end
                and body_end + 3 <= record_end  # so TOPICLENGTH is inside
            ):
                topic_end = body_end + 1 + source[body_end]
                properties_start = topic_end + 2
                if (
                    properties_start <= record_end
                    and properties_start + _unpack_int16(source, topic_end)[0] == record_end
                ):
                    message = new(cls)
                    body = source[body_start:body_end]
                    message.body = body
                    # The topic bytes are compared with the previous record's (with its
                    # length byte), so a pull of one topic makes one topic string.
                    if not source.startswith(topic_bytes, body_end):
                        topic_bytes = source[body_end:topic_end]
                        topic = topic_names.get(topic_bytes)  # type: ignore[assignment]
                        if topic is None:
                            topic = _topic_name(topic_bytes)
                    message.topic = topic
                    message.queue_id = queue_id
                    message.queue_offset = queue_offset
                    message.broker_name = broker_name
                    message._prefix = source[position:body_start]
                    message._properties_raw = source[properties_start:record_end]
                    position = record_end
                    if check_crc and crc32(body) & 0x7FFFFFFF != body_crc:
                        damaged.append(message)  # type: ignore[union-attr]
                        continue
                    if sysflag & SYSFLAG_COMPRESSED and decompress and not _inflated(
                            message, damaged):
                        continue
                    append(message)
                    continue
        checked = _decode_record_checked(source, position, end)
        checked.broker_name = broker_name
        position += checked.store_size
        if check_crc and crc32(checked.body) & 0x7FFFFFFF != checked.body_crc:
            damaged.append(checked)  # type: ignore[union-attr]
            continue
        if checked.sysflag & SYSFLAG_COMPRESSED and decompress and not _inflated(
                checked, damaged):
            continue
        append(checked)
    return messages


@functools.lru_cache(maxsize=64)
def _same_size_layout(record_size: int, body_length: int,
                      framing_length: int) -> tuple[struct.Struct, struct.Struct]:
    """The two record structs of the one-size pass: BODYCRC, QUEUEID and QUEUEOFFSET as
    integers; the fixed part, BODY, TOPICLENGTH+TOPIC+PROPERTIESLENGTH and PROPERTIES as bytes.
    (A few sizes recur in a consumer's life; the cache keeps their structs.)"""
    numbers = struct.Struct(f">8xii4xq{record_size - 28}x")
    parts = struct.Struct(
        f"{RECORD_PREFIX_SIZE_IPV4}s{body_length}s{framing_length}s"
        f"{record_size - RECORD_PREFIX_SIZE_IPV4 - body_length - framing_length}s")
    return numbers, parts


def _decode_same_size(source: bytes, broker_name: str,
                      damaged: list[MessageExt] | None) -> list[MessageExt] | None:
    """Decode ``source`` when all its records have one layout (module docstring); None when
    they do not, and then nothing was decoded or set aside."""
    end = len(source)
    if end < RECORD_FIXED_SIZE_IPV4:
        return None
    size, magic, _, _, _, sysflag, body_length = _unpack_pull_fields(source, 0)
    if (size < RECORD_FIXED_SIZE_IPV4 or end < size * SAME_SIZE_RECORDS_MIN or end % size
            or magic != MAGIC_V1
            or sysflag & _NOT_SAME_SIZE_SYSFLAGS or body_length < 0):
        return None
    body_end = RECORD_PREFIX_SIZE_IPV4 + body_length
    if body_end + 3 > size:
        return None
    topic_end = body_end + 1 + source[body_end]
    if topic_end + 2 > size or topic_end + 2 + _unpack_int16(source, topic_end)[0] != size:
        return None
    count = end // size
    for start, stop in _SAME_IN_EVERY_RECORD:
        for position in range(start, stop):
            # This byte of every record (a slice with the record size as its step).
            if source[position::size].count(source[position]) != count:
                return None
    numbers, parts = _same_size_layout(size, body_length, topic_end + 2 - body_end)
    framing = source[body_end:topic_end + 2]
    topic = str(source[body_end + 1:topic_end], "utf-8", "replace")
    messages: list[MessageExt] = []
    append = messages.append
    new = object.__new__
    cls = PulledMessageExt
    for (prefix, body, record_framing, properties), (_, queue_id, queue_offset) in zip(
            parts.iter_unpack(source), numbers.iter_unpack(source), strict=True):
        if record_framing != framing:  # another topic, or other lengths: not one layout
            return None
        message = new(cls)
        message.body = body
        message.topic = topic
        message.queue_id = queue_id
        message.queue_offset = queue_offset
        message.broker_name = broker_name
        message._prefix = prefix
        message._properties_raw = properties
        append(message)
    if damaged is not None:
        stored = list(map(_first, numbers.iter_unpack(source)))
        computed = list(map(and_, map(body_crc32, map(_get_body, messages)),
                            repeat(_CRC_MASK)))
        if stored != computed:  # rare: find the damaged ones, keep the order of the rest
            intact: list[MessageExt] = []
            for message, stored_crc, computed_crc in zip(messages, stored, computed,
                                                         strict=True):
                (intact if stored_crc == computed_crc else damaged).append(message)
            return intact
    return messages


def _inflated(message: MessageExt, damaged: list[MessageExt] | None) -> bool:
    """Inflate ``message``'s body; False when it does not inflate and ``damaged`` takes it.

    A stored body whose record says "zlib" but which does not inflate is damaged bytes the
    body CRC cannot see (the flag lives in SYSFLAG, which no checksum covers): with a
    ``damaged`` list it is left out like a CRC mismatch, so one damaged record never blocks
    the records after it; without one it raises, as before.
    """
    try:
        decompress_body(message)
    except RemoteProtocolError:
        if damaged is None:
            raise
        damaged.append(message)
        return False
    return True


def decompress_body(message: MessageExt) -> None:
    """Inflate a zlib-compressed body in place and clear SYSFLAG's compression bits.

    Cleared so that ``uncompressed_body()`` and a second call do not inflate twice.

    Raises:
        RemoteProtocolError: the body is compressed with LZ4 or ZSTD (not supported), or
            does not inflate.
    """
    compression = message.sysflag & SYSFLAG_COMPRESSION_TYPE_MASK
    if compression not in (0, SYSFLAG_COMPRESSION_ZLIB):
        raise RemoteProtocolError(
            f"message {message.offset_msg_id} on {message.topic} is compressed with type "
            f"{compression >> 8} (1 = LZ4, 2 = ZSTD); tidemq reads only zlib bodies"
        )
    try:
        message.body = zlib.decompress(message.body)
    except zlib.error as e:
        raise RemoteProtocolError(
            f"message {message.offset_msg_id} on {message.topic} does not decompress: {e}"
        ) from None
    message.sysflag &= ~(SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_TYPE_MASK)

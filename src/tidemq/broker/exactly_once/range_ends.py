"""Ending a whole prepared exactly-once range at once: one read, batched puts, one op record.

The per-half end (end_writer.py) costs a future, a progress entry and a store call per
half, which is right for END_TRANSACTION but was most of an exactly-once commit's cost. A
prepared range (prepared_ranges.py) is ended as a unit instead:

- commit: when the range kept its ``CommittedCopies`` (made as its halves were stored),
  the halves' bytes are read in one piece and only the bodies taken out of them
  (``committed_from_copies``); else its records are read once (one ``get_messages`` per
  READ_COUNT halves) and turned into the committed messages column by column
  (``committed_columns``). Either batch is stored
  with ``EndWriter.put_committed`` (one ``put_messages`` per BATCH_MESSAGES_MAX), then one
  op record names all their offsets, then ``progress`` forgets the range;
- roll back: one op record, nothing read.

Order keeps a crash safe: committed copies, then the op record, then the in-memory end.
A SIGKILL between the puts and the op record leaves copies whose halves look open; after
the restart those halves were stored before the start, so they go through the per-half
path, whose index lookup finds the copies (service.py) and commits nothing twice.

Column by column: every half of a range was stored by one put with the same batch
properties, so the pairs a commit drops (REAL_TOPIC, REAL_QID, TRAN_MSG, EOS_*,
CHECK_IMMUNITY_TIME_IN_SECONDS) are the same strings in every record. The record loop only
slices; the properties are then done for the whole range at once, in one of two ways:

- every record names the same properties in the same order (the sink's rows): one split of
  the joined texts gives a column of values per name; the dropped columns are checked to
  hold the first record's values, and the kept ones give each record's dict and text;
- otherwise the dropped pairs are cut out of each text with ``str.replace`` run over the
  column, and each dict is built from the cut text.

The committed text is kept as ``properties_text`` (the store does not render it again). A
record that fits neither (another host form, a pair that differs, an empty name or value)
sends the whole range to ``decode_record`` and ``eos_committed_message``: the same
messages, byte for byte, slower.

A range that cannot be done as a unit (a half missing or not decodable, a half ended on
its own, a half stored before this start) is left to the caller's per-half path
(``commit_range`` returns None).

Ownership: the broker's event loop.
"""

from __future__ import annotations

import functools
import logging
import struct
from collections.abc import Iterator, Sequence
from dataclasses import replace
from itertools import repeat
from operator import add, gt
from typing import TYPE_CHECKING, NamedTuple

from tidemq.broker.exactly_once.records import (
    EOS_COMMIT_DROPPED,
    PROPERTY_EOS_BATCH_ID,
    PROPERTY_EOS_QUERY_ID,
    PROPERTY_EOS_WRITER_ID,
    eos_committed_message,
    eos_identity,
)
from tidemq.broker.transaction.prepared_ranges import PreparedRange
from tidemq.broker.transaction.records import HALF_QUEUE_ID, HALF_TOPIC, NotAHalfMessage, Outcome
from tidemq.errors import RemoteProtocolError
from tidemq.protocol.message import (
    KEY_SEPARATOR,
    MAGIC_V1,
    NAME_VALUE_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    RECORD_FIXED_SIZE_IPV4,
    RECORD_PREFIX_IPV4,
    RECORD_PREFIX_SIZE_IPV4,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    SYSFLAG_TRANSACTION_MASK,
    TRANSACTION_COMMIT_TYPE,
    MessageExt,
    iter_records,
    unpack_host,
)
from tidemq.store.interface import GetStatus, MessageBatch, StoreMessage

if TYPE_CHECKING:
    from tidemq.broker.exactly_once.ledger import HalfLedger

log = logging.getLogger("tidemq.broker")

# Halves whose ranges are committed together, under one op record (commit_ranges): a
# 1 KiB row's op text is about 8 bytes, so 32 KiB of op record.
COMMIT_GROUP_HALVES = 4096
# Halves read per store call (1 KiB rows: about 300 KiB a read), and its byte bound.
READ_COUNT = 256
READ_BYTES_MAX = 4 * 1024 * 1024

_unpack_prefix = RECORD_PREFIX_IPV4.unpack_from
_unpack_size = struct.Struct(">i").unpack_from  # a record's TOTALSIZE
_HOSTS_V6 = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
_TO_COMMIT_MASK = ~SYSFLAG_TRANSACTION_MASK
_DROPPED_BYTES = frozenset(name.encode() for name in EOS_COMMIT_DROPPED)
_HALF_TOPIC_LENGTH = bytes((len(HALF_TOPIC.encode()),))
# From a record's body end to its PROPERTIES: TOPICLENGTH, the half topic, PROPERTIESLENGTH.
_PROPERTIES_AFTER_BODY = 1 + len(HALF_TOPIC.encode()) + 2
_PROPERTY = PROPERTY_SEPARATOR.encode()
_NAME_VALUE_BYTES = NAME_VALUE_SEPARATOR.encode()
_SEPARATOR_PAIR = _NAME_VALUE_BYTES + _PROPERTY
_TAGS = PROPERTY_TAGS.encode()
_KEYS = PROPERTY_KEYS.encode()
_UNIQ_KEY = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode()
# bytes.translate deletes these, leaving only the separators of a text, in order.
_NOT_SEPARATORS = bytes(code for code in range(256) if code not in (1, 2))


@functools.lru_cache(maxsize=256)
def _host_text(address: bytes, port: int) -> str:
    # Producers are few: each born host is rendered once.
    return unpack_host(address, port)


def read_range_bytes(service: HalfLedger, first: int, count: int) -> list[bytes] | None:
    """The stored records at ``[first, first + count)`` as the store returns them (one
    bytes per read), or None when the store does not have them all."""
    store = service.store
    parts: list[bytes] = []
    offset, end = first, first + count
    while offset < end:
        result = store.get_messages(HALF_TOPIC, HALF_QUEUE_ID, offset,
                                    min(READ_COUNT, end - offset), READ_BYTES_MAX)
        if result.status is not GetStatus.FOUND or result.next_begin_offset <= offset:
            return None
        parts.append(result.body)
        offset = result.next_begin_offset
    return parts if offset == end else None


class _Records(NamedTuple):
    """The columns of a range's stored halves (``_record_columns``)."""

    bodies: list[bytes]
    body_crcs: list[int]
    properties: list[bytes]
    flags: list[int]
    physical_offsets: list[int]
    sysflag: int
    born_timestamp: int
    born_host: str
    reconsume_times: int


def committed_columns(parts: list[bytes], first: int, count: int,
                      identity: tuple[str, str, str]) -> MessageBatch | None:
    """The committed messages of the ``count`` records in ``parts`` as one batch (module
    docstring), or None when a record does not fit the column path or is not of
    ``identity`` (query id, batch id text, writer id)."""
    records = _record_columns(parts, first, count)
    if records is None:
        return None
    return _committed_batch(identity, records)


def _record_columns(parts: list[bytes], first: int, count: int) -> _Records | None:
    """The halves at ``[first, first + count)`` in ``parts`` by columns, or None when one
    is not an IPv4 record of the half queue at its offset, or the range's records differ in
    a field one put gives all of them (sysflag, born time and host, reconsume times)."""
    bodies: list[bytes] = []
    body_crcs: list[int] = []
    properties: list[bytes] = []
    flags: list[int] = []
    physical_offsets: list[int] = []
    heads: set[tuple[int, int, bytes, int, int]] = set()
    expected = first
    for part in parts:
        starts = _record_starts(part)
        if starts is None:
            return None
        size = len(starts)
        try:
            (totals, magics, part_crcs, _, part_flags, queue_offsets, part_physical, sysflags,
             born_timestamps, born_addresses, born_ports, _, _, _, reconsumes, _,
             body_lengths) = zip(*map(_unpack_prefix, repeat(part), starts), strict=True)
            body_starts = list(map(add, starts, repeat(RECORD_PREFIX_SIZE_IPV4)))
            body_ends = list(map(add, body_starts, body_lengths))
            topic_lengths = bytes(map(part.__getitem__, body_ends))
        except (struct.error, IndexError, ValueError):
            return None
        ends = list(map(add, starts, totals))
        properties_starts = list(map(add, body_ends, repeat(_PROPERTIES_AFTER_BODY)))
        if (magics.count(MAGIC_V1) != size
                or queue_offsets != tuple(range(expected, expected + size))
                or topic_lengths != _HALF_TOPIC_LENGTH * size
                or any(map(gt, properties_starts, ends))):
            return None
        heads.update(zip(sysflags, born_timestamps, born_addresses, born_ports, reconsumes,
                         strict=True))
        bodies += map(part.__getitem__, map(slice, body_starts, body_ends))
        properties += map(part.__getitem__, map(slice, properties_starts, ends))
        body_crcs += part_crcs
        flags += part_flags
        physical_offsets += part_physical
        expected += size
    if expected != first + count or len(heads) != 1:
        return None
    ((sysflag, born_timestamp, born_address, born_port, reconsume_times),) = heads
    if sysflag & _HOSTS_V6:
        return None
    return _Records(bodies, body_crcs, properties, flags, physical_offsets, sysflag,
                    born_timestamp, _host_text(born_address, born_port), reconsume_times)


def _record_starts(part: bytes) -> list[int] | None:
    """Where each record of ``part`` starts, or None when their sizes do not add up."""
    starts: list[int] = []
    position, end = 0, len(part)
    try:
        while position < end:
            starts.append(position)
            (total,) = _unpack_size(part, position)
            if total < RECORD_FIXED_SIZE_IPV4:
                return None
            position += total
    except struct.error:
        return None
    return starts if position == end else None


def _committed_batch(identity: tuple[str, str, str], records: _Records) -> MessageBatch | None:
    """The committed batch of ``records`` when every record names the same properties in
    the same order, each once with a non-empty value (the sink's rows), and the dropped
    ones hold the same value in every record; else None.

    One split of the joined properties gives a column of values per name; each committed
    text is one ``bytes %`` of the kept names' template.
    """
    texts = records.properties
    count = len(texts)
    joined = _PROPERTY.join(texts)
    if not joined.isascii():
        try:
            joined.decode("utf-8")
        except UnicodeDecodeError:
            return None
    names = texts[0].replace(_PROPERTY, _NAME_VALUE_BYTES).split(_NAME_VALUE_BYTES)[0::2]
    width = len(names)
    # Separators strictly alternate (one name-value separator in every piece).
    if not texts[0] or joined.translate(None, _NOT_SEPARATORS) != (
            _SEPARATOR_PAIR * (width * count - 1) + _NAME_VALUE_BYTES):
        return None
    tokens = joined.replace(_PROPERTY, _NAME_VALUE_BYTES).split(_NAME_VALUE_BYTES)
    values = tokens[1::2]
    if tokens[0::2] != names * count or b"" in values or len(set(names)) != width:
        return None  # names differ, a value decode_properties would drop, a name twice
    dropped: dict[bytes, bytes] = {}
    kept: dict[bytes, list[bytes]] = {}
    for index, name in enumerate(names):
        column = values[index::width]
        if name in _DROPPED_BYTES:
            if column.count(column[0]) != count:
                return None  # not one value in the range: the per-record path decides
            dropped[name] = column[0]
        else:
            kept[name] = column
    first = {name.decode(): value.decode() for name, value in dropped.items()}
    topic = first.get(PROPERTY_REAL_TOPIC)
    queue_text = first.get(PROPERTY_REAL_QUEUE_ID, "")
    if ((first.get(PROPERTY_EOS_QUERY_ID), first.get(PROPERTY_EOS_BATCH_ID),
            first.get(PROPERTY_EOS_WRITER_ID)) != identity
            or not topic or not queue_text.isdigit()):
        return None
    if kept:
        template = _PROPERTY.join(
            name.replace(b"%", b"%%") + _NAME_VALUE_BYTES + b"%b" for name in kept)
        properties = list(map(template.__mod__, zip(*kept.values(), strict=True)))
    else:
        properties = [b""] * count
    tags = kept.get(_TAGS)
    return MessageBatch(
        topic, int(queue_text), records.bodies, properties, records.flags,
        None if tags is None else list(map(bytes.decode, tags)),
        _index_keys(kept.get(_UNIQ_KEY), kept.get(_KEYS), count),
        (records.sysflag & _TO_COMMIT_MASK) | TRANSACTION_COMMIT_TYPE,
        records.born_timestamp, records.born_host, records.reconsume_times,
        prepared_transaction_offsets=records.physical_offsets, body_crcs=records.body_crcs,
    )


def _index_keys(unique_keys: list[bytes] | None, user_keys: list[bytes] | None,
                count: int) -> list[Sequence[str]]:
    """record_encoder.index_keys of each record from its UNIQ_KEY and KEYS values (both
    non-empty when present): the UNIQ_KEY, then each non-empty KEYS token."""
    uniques = None if unique_keys is None else list(map(bytes.decode, unique_keys))
    users = None if user_keys is None else list(map(bytes.decode, user_keys))
    if users is None:
        return [()] * count if uniques is None else list(zip(uniques))
    if uniques is not None and KEY_SEPARATOR not in "".join(users):
        return list(zip(uniques, users, strict=True))
    return [
        [*((unique,) if unique else ()), *filter(None, keys.split(KEY_SEPARATOR))]
        for unique, keys in zip(uniques or [""] * count, users, strict=True)
    ]


def committed_from_copies(service: HalfLedger, prepared: PreparedRange
                          ) -> MessageBatch | None:
    """The committed messages of ``prepared`` from its ``CommittedCopies`` and the bodies
    of its halves, read in one piece; None when the stored bytes are not the halves
    the copies were made with (then the caller parses the halves). The copies are
    forgotten either way."""
    copies = prepared.copies
    assert copies is not None
    service.progress.prepared.drop_copies(prepared)
    block = service.store.read_records(copies.physical_offset, copies.size)
    if block is None:
        return None
    starts = _record_starts(block)
    if starts is None or len(starts) != prepared.count:
        return None
    try:
        first = _unpack_prefix(block, 0)
        last = _unpack_prefix(block, starts[-1])
    except struct.error:
        return None
    # TOTALSIZE MAGICCODE BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG ...
    if (first[1] != MAGIC_V1 or first[3] != HALF_QUEUE_ID or first[5] != prepared.first
            or last[5] != prepared.end - 1 or first[6] != copies.physical_offset
            or first[7] & _HOSTS_V6):
        return None  # not IPv4 records of this range: parse them
    body_starts = list(map(add, starts, repeat(RECORD_PREFIX_SIZE_IPV4)))
    body_lengths = [length for (length,) in map(
        _unpack_size, repeat(block), map(add, starts, repeat(RECORD_PREFIX_SIZE_IPV4 - 4)))]
    view = memoryview(block)
    return replace(
        copies.batch,
        bodies=list(map(view.__getitem__, map(slice, body_starts, map(add, body_starts,
                                                                     body_lengths)))),
        prepared_transaction_offsets=list(map(add, starts, repeat(copies.physical_offset))),
    )


def read_range(service: HalfLedger, first: int, count: int) -> list[MessageExt] | None:
    """The stored halves at ``[first, first + count)``, decoded once; None when one of
    them is missing or does not decode."""
    store = service.store
    halves: list[MessageExt] = []
    offset, end = first, first + count
    while offset < end:
        result = store.get_messages(HALF_TOPIC, HALF_QUEUE_ID, offset,
                                    min(READ_COUNT, end - offset), READ_BYTES_MAX)
        if result.status is not GetStatus.FOUND:
            return None
        try:
            for half in iter_records(result.body):
                if half.queue_offset != offset:
                    return None
                halves.append(half)
                offset += 1
                if offset >= end:
                    break
        except RemoteProtocolError:
            return None
    return halves


def can_end_whole(service: HalfLedger, prepared: PreparedRange) -> bool:
    """True when ``prepared`` may be ended as a unit (module docstring)."""
    return (not prepared.ended_apart and not service.stored_before_start(prepared.first)
            and service.progress.prepared.find(prepared.first) is prepared)


def commit_range(service: HalfLedger, prepared: PreparedRange) -> int | None:
    """Commit every half of ``prepared`` (module docstring).

    Returns:
        How many halves were committed (fewer than ``prepared.count`` when the store
        refused a put: the rest stay open and are committed later), or None when the range
        needs the per-half path (nothing was written).
    """
    return commit_ranges(service, [prepared])[0]


def commit_ranges(service: HalfLedger, ranges: Sequence[PreparedRange]
                  ) -> list[int | None]:
    """``commit_range`` of each of ``ranges``, their committed copies stored first, then
    one op record naming every half they committed, then their ends in memory (the order
    of the module docstring, for the group as a unit). Give groups of a bounded size
    (``COMMIT_GROUP_HALVES``): one op record names them all."""
    results: list[int | None] = []
    ended: list[tuple[PreparedRange, int]] = []
    offsets: list[int] = []
    for prepared in ranges:
        if not can_end_whole(service, prepared):
            results.append(None)
            continue
        committed = _committed_messages(service, prepared)
        if committed is None:
            results.append(None)
            continue
        stored, failure = service.writer.put_committed(committed)
        results.append(stored)
        if stored:
            ended.append((prepared, stored))
            offsets += range(prepared.first, prepared.first + stored)
        if failure is not None:
            log.warning(
                "%d of %d committed messages of half offsets %d-%d could not be stored: %s "
                "%s; those halves stay open and are committed later", prepared.count - stored,
                prepared.count, prepared.first, prepared.end - 1, failure.status.value,
                failure.remark)
    if not offsets:
        return results
    op_offset = service.writer.write_op(Outcome.COMMIT, offsets)
    progress = service.progress
    for prepared, stored in ended:
        if stored == prepared.count:
            progress.end_range(prepared, Outcome.COMMIT, op_offset,
                               range(prepared.first, prepared.end))
            continue
        for half_offset in range(prepared.first, prepared.first + stored):
            progress.end(half_offset, Outcome.COMMIT, op_offset)  # the range notes them
    return results


def commit_groups(ranges: Sequence[PreparedRange]) -> Iterator[list[PreparedRange]]:
    """``ranges`` in order, cut into groups of at most COMMIT_GROUP_HALVES halves (a range
    larger than that is a group of its own)."""
    group: list[PreparedRange] = []
    halves = 0
    for prepared in ranges:
        if group and halves + prepared.count > COMMIT_GROUP_HALVES:
            yield group
            group, halves = [], 0
        group.append(prepared)
        halves += prepared.count
    if group:
        yield group


def _committed_messages(service: HalfLedger, prepared: PreparedRange
                        ) -> MessageBatch | list[StoreMessage] | None:
    """The committed messages of every half of ``prepared``: from its committed copies,
    else by columns when they fit, or None (per-half path)."""
    if prepared.copies is not None:
        committed = committed_from_copies(service, prepared)
        if committed is not None:
            return committed
    parts = read_range_bytes(service, prepared.first, prepared.count)
    if parts is None:
        return None
    committed = committed_columns(parts, prepared.first, prepared.count, prepared.identity())
    if committed is not None:
        return committed
    halves = read_range(service, prepared.first, prepared.count)
    if halves is None or any(eos_identity(half) != prepared.identity() for half in halves):
        return None  # not what this broker prepared there: the per-half path says so
    try:
        return [eos_committed_message(half) for half in halves]
    except NotAHalfMessage:
        return None


def roll_back_range(service: HalfLedger, prepared: PreparedRange) -> int:
    """Roll back every open half of ``prepared`` with one op record; returns how many."""
    progress = service.progress
    if prepared.ended_apart:
        offsets = [offset for offset in range(prepared.first, prepared.end)
                   if not progress.lookup(offset)[0]
                   and service.writer.queued_answer(offset) is None]
    else:
        offsets = list(range(prepared.first, prepared.end))
    op_offset = service.writer.write_op(Outcome.ROLLBACK, offsets) if offsets else -1
    progress.end_range(prepared, Outcome.ROLLBACK, op_offset, offsets)
    return len(offsets)

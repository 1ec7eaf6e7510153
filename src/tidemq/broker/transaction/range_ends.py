"""Ending a whole prepared exactly-once range at once: one read, batched puts, one op record.

The per-half end (end_writer.py) costs a future, a progress entry and a store call per
half, which is right for END_TRANSACTION but was most of an exactly-once commit's cost. A
prepared range (prepared_ranges.py) is ended as a unit instead:

- commit: its records are read once (one ``get_messages`` per READ_COUNT halves) and
  turned into the committed messages column by column (``committed_columns``), stored
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
from itertools import islice, repeat
from operator import and_, or_, sub
from typing import TYPE_CHECKING

from tidemq.broker.transaction.eos_records import (
    EOS_PROPERTIES,
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
    MAGIC_V1,
    NAME_VALUE_SEPARATOR,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SEPARATOR,
    PROPERTY_TRANSACTION_PREPARED,
    RECORD_PREFIX_IPV4,
    RECORD_PREFIX_SIZE_IPV4,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    SYSFLAG_TRANSACTION_MASK,
    TRANSACTION_COMMIT_TYPE,
    MessageExt,
    decode_properties,
    iter_records,
    unpack_host,
)
from tidemq.store.interface import GetStatus, StoreMessage

if TYPE_CHECKING:
    from tidemq.broker.transaction.service import TransactionService

log = logging.getLogger("tidemq.broker")

# Halves read per store call (1 KiB rows: about 300 KiB a read), and its byte bound.
READ_COUNT = 256
READ_BYTES_MAX = 4 * 1024 * 1024

# The properties a commit drops (records.py ``committed_message``, eos_records.py).
DROPPED_PROPERTIES = (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID,
                      PROPERTY_TRANSACTION_PREPARED, *EOS_PROPERTIES)
_unpack_prefix = RECORD_PREFIX_IPV4.unpack_from
_HOSTS_V6 = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
_TO_COMMIT_MASK = ~SYSFLAG_TRANSACTION_MASK
_DROPPED = frozenset(DROPPED_PROPERTIES)
_NAME_VALUE_BYTES = NAME_VALUE_SEPARATOR.encode()
_SEPARATOR_PAIR = _NAME_VALUE_BYTES + PROPERTY_SEPARATOR.encode()
# bytes.translate deletes these, leaving only the separators of a text, in order.
_NOT_SEPARATORS = bytes(code for code in range(256) if code not in (1, 2))


@functools.lru_cache(maxsize=256)
def _host_text(address: bytes, port: int) -> str:
    # Producers are few: each born host is rendered once.
    return unpack_host(address, port)


def read_range_bytes(service: TransactionService, first: int, count: int) -> list[bytes] | None:
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


def committed_columns(parts: list[bytes], first: int, count: int,
                      identity: tuple[str, str, str]) -> list[StoreMessage] | None:
    """The committed messages of the ``count`` records in ``parts`` (module docstring), or
    None when a record does not fit the column path or is not of ``identity`` (query id,
    batch id text, writer id)."""
    bodies: list[bytes] = []
    texts: list[str] = []
    flags: list[int] = []
    sysflags: list[int] = []
    born_timestamps: list[int] = []
    born_hosts: list[str] = []
    reconsume_times: list[int] = []
    physical_offsets: list[int] = []
    expected = first
    # One unpack and three slices per record: the loop the rest of the work avoids.
    for part in parts:
        position, end = 0, len(part)
        while position < end:
            if end - position < RECORD_PREFIX_SIZE_IPV4:
                return None
            (total, magic, _, _, flag, queue_offset, physical_offset, sysflag,
             born_timestamp, born_address, born_port, _, _, _, reconsume, _,
             body_length) = _unpack_prefix(part, position)
            body_start = position + RECORD_PREFIX_SIZE_IPV4
            body_end = body_start + body_length
            record_end = position + total
            if (magic != MAGIC_V1 or sysflag & _HOSTS_V6 or queue_offset != expected
                    or record_end > end or body_end + 3 > record_end):
                return None
            properties_start = body_end + 1 + part[body_end] + 2
            bodies.append(part[body_start:body_end])
            texts.append(str(part[properties_start:record_end], "utf-8", "replace"))
            flags.append(flag)
            sysflags.append(sysflag)
            born_timestamps.append(born_timestamp)
            born_hosts.append(_host_text(born_address, born_port))
            reconsume_times.append(reconsume)
            physical_offsets.append(physical_offset)
            expected += 1
            position = record_end
    if expected != first + count or not texts:
        return None
    return _committed(identity, texts, bodies, flags, sysflags, born_timestamps, born_hosts,
                      reconsume_times, physical_offsets)


def _committed(identity: tuple[str, str, str], texts: list[str], bodies: list[bytes],
               flags: list[int], sysflags: list[int], born_timestamps: list[int],
               born_hosts: list[str], reconsume_times: list[int],
               physical_offsets: list[int]) -> list[StoreMessage] | None:
    first_properties = decode_properties(texts[0])
    if (first_properties.get(PROPERTY_EOS_QUERY_ID), first_properties.get(PROPERTY_EOS_BATCH_ID),
            first_properties.get(PROPERTY_EOS_WRITER_ID)) != identity:
        return None  # every record has the first one's pairs (checked below)
    topic = first_properties.get(PROPERTY_REAL_TOPIC)
    queue_text = first_properties.get(PROPERTY_REAL_QUEUE_ID, "")
    if not topic or not queue_text.isdigit():
        return None
    count = len(texts)
    columns = _same_names(texts, first_properties) or _pairs_cut(texts, first_properties)
    if columns is None:
        return None
    maps, committed_texts = columns
    commit_sysflags = map(or_, map(and_, sysflags, repeat(_TO_COMMIT_MASK)),
                          repeat(TRANSACTION_COMMIT_TYPE))
    return list(map(
        StoreMessage, repeat(topic, count), repeat(int(queue_text)), bodies, maps, flags,
        commit_sysflags, born_timestamps, born_hosts, reconsume_times, physical_offsets,
        repeat(None), committed_texts,
    ))


def _same_names(texts: list[str], first_properties: dict[str, str]
                ) -> tuple[list[dict[str, str]], list[str]] | None:
    """The committed properties (dicts and texts) when every record names the same
    properties in the same order, each once with a non-empty value (the sink's rows: the
    batch's properties and a UNIQ_KEY, maybe TAGS and KEYS), else None.

    One split of the joined texts gives a column per name; the dropped ones must hold the
    first record's value in every record.
    """
    count = len(texts)
    names = list(first_properties)
    width = len(names)
    joined = PROPERTY_SEPARATOR.join(texts)
    try:
        separators = joined.encode("utf-8").translate(None, _NOT_SEPARATORS)
    except UnicodeEncodeError:
        return None
    # Separators strictly alternate (one name-value separator in every piece).
    if separators != _SEPARATOR_PAIR * (width * count - 1) + _NAME_VALUE_BYTES:
        return None
    tokens = joined.replace(PROPERTY_SEPARATOR, NAME_VALUE_SEPARATOR).split(NAME_VALUE_SEPARATOR)
    values = tokens[1::2]
    if tokens[0::2] != names * count or "" in values:
        return None  # names differ, or a value decode_properties would drop
    kept: list[str] = []
    kept_columns: list[list[str]] = []
    for index, name in enumerate(names):
        column = values[index::width]
        if name in _DROPPED:
            if column.count(first_properties[name]) != count:
                return None  # not the first record's pair: the per-record path decides
        else:
            kept.append(name)
            kept_columns.append(column)
    rows = list(zip(*kept_columns, strict=True)) if kept else [()] * count
    maps = list(map(dict, map(zip, repeat(kept), rows)))
    committed_texts = list(map(PROPERTY_SEPARATOR.join, map(
        map, repeat(NAME_VALUE_SEPARATOR.join), map(zip, repeat(kept), rows))))
    return maps, committed_texts


def _pairs_cut(texts: list[str], first_properties: dict[str, str]
               ) -> tuple[list[dict[str, str]], list[str]] | None:
    """The committed properties (dicts and texts) with the dropped pairs cut out of each
    text by ``str.replace``; None when a record's pairs differ from the first's."""
    pairs_before = list(map(str.count, texts, repeat(PROPERTY_SEPARATOR)))
    dropped = 0
    # Framed by separators so a pair is only ever matched whole.
    framed = list(map(str.__add__, repeat(PROPERTY_SEPARATOR),
                      map(str.__add__, texts, repeat(PROPERTY_SEPARATOR))))
    for name in DROPPED_PROPERTIES:
        value = first_properties.get(name)
        if value is None:
            continue
        pair = f"{PROPERTY_SEPARATOR}{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"
        framed = list(map(str.replace, framed, repeat(pair), repeat(PROPERTY_SEPARATOR)))
        dropped += 1
    committed_texts = [text[1:-1] for text in framed]
    removed = set(map(sub, pairs_before, map(str.count, committed_texts,
                                             repeat(PROPERTY_SEPARATOR))))
    joined = PROPERTY_SEPARATOR.join(committed_texts)
    if (removed != {dropped} or "" in committed_texts
            or f"{NAME_VALUE_SEPARATOR}{PROPERTY_SEPARATOR}" in joined
            or f"{PROPERTY_SEPARATOR}{NAME_VALUE_SEPARATOR}" in joined
            or joined.startswith(NAME_VALUE_SEPARATOR) or joined.endswith(NAME_VALUE_SEPARATOR)):
        return None  # a pair differs from the first record's, or decode_properties would
        # drop an empty name or value: the per-record path renders those exactly
    pieces = iter(map(str.split, joined.split(PROPERTY_SEPARATOR),
                      repeat(NAME_VALUE_SEPARATOR), repeat(1)))
    try:
        maps = list(map(dict, map(islice, repeat(pieces), map(
            int.__add__, map(str.count, committed_texts, repeat(PROPERTY_SEPARATOR)),
            repeat(1)))))
    except ValueError:
        return None  # a piece without a name-value separator
    return maps, committed_texts


def read_range(service: TransactionService, first: int, count: int) -> list[MessageExt] | None:
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


def can_end_whole(service: TransactionService, prepared: PreparedRange) -> bool:
    """True when ``prepared`` may be ended as a unit (module docstring)."""
    return (not prepared.ended_apart and not service.stored_before_start(prepared.first)
            and service.progress.prepared.find(prepared.first) is prepared)


def commit_range(service: TransactionService, prepared: PreparedRange) -> int | None:
    """Commit every half of ``prepared`` (module docstring).

    Returns:
        How many halves were committed (fewer than ``prepared.count`` when the store
        refused a put: the rest stay open and are committed later), or None when the range
        needs the per-half path (nothing was written).
    """
    if not can_end_whole(service, prepared):
        return None
    committed = _committed_messages(service, prepared)
    if committed is None:
        return None
    stored, failure = service.writer.put_committed(committed)
    offsets = list(range(prepared.first, prepared.first + stored))
    progress = service.progress
    if stored == prepared.count:
        op_offset = service.writer.write_op(Outcome.COMMIT, offsets)
        progress.end_range(prepared, Outcome.COMMIT, op_offset, offsets)
        return stored
    if stored:
        op_offset = service.writer.write_op(Outcome.COMMIT, offsets)
        for half_offset in offsets:
            progress.end(half_offset, Outcome.COMMIT, op_offset)  # the range notes them
    assert failure is not None
    log.warning("%d of %d committed messages of half offsets %d-%d could not be stored: %s "
                "%s; those halves stay open and are committed later", prepared.count - stored,
                prepared.count, prepared.first, prepared.end - 1, failure.status.value,
                failure.remark)
    return stored


def _committed_messages(service: TransactionService,
                        prepared: PreparedRange) -> list[StoreMessage] | None:
    """The committed messages of every half of ``prepared``, or None (per-half path)."""
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


def roll_back_range(service: TransactionService, prepared: PreparedRange) -> int:
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

"""Encode StoreMessages into stored records: a whole batch into one buffer, in one pass.

The record layout is the one documented in ``tidemq.protocol.message`` (docs/protocol.md §6.1).
This module builds it for the append path, one pass over the messages: check each limit,
pack the fixed 88-byte prefix (one ``struct.pack``), and queue the prefix, the body and the
tail (topic and properties) as parts that one ``bytearray().join`` copies into the batch
buffer. A bad message is refused before anything is written. QUEUEOFFSET and PHYSICALOFFSET
are left 0: only the commit log knows them, under its append lock, and patches them in
place (``patch_offsets``), together with STORETIMESTAMP when another append took a later
time meanwhile (store times never go back along the log).

Two paths, one result (the same bytes, the same errors):
- a batch of IPv4 messages with string properties, plain or all committed transactional
  ones (END_TRANSACTION's and the exactly-once sink's copies of half messages, with their
  PREPARED_TRANSACTION_OFFSET), the common case, is encoded column by column: each step
  (read a field of every message, CRC every body, render every properties string, pack
  every prefix) is one ``map`` that runs in C, so the Python interpreter does no work per
  message;
- anything else (a batch of a few messages, IPv6 hosts, a delayed message, a half or
  rollback record, a property value that is not a string, a message over a limit) goes one
  message at a time, and a bad message is reported from there. Records with an IPv6 born
  or store host go through ``encode_record`` of the shared codec.

A batch that arrives in columns (``MessageBatch``, a broker's SEND_BATCH_MESSAGE) is encoded
by ``encode_message_batch`` the column way with no per-message step at all: its properties
are stored as given and its tag codes and index keys come with it.

A *queue group* (``mixed_queues=True``) is single sends of one topic that arrived together
and go to several queues: encoded the same way, with each record's own QUEUEID, and
``EncodedBatch.queue_ids`` telling the commit log and dispatch which queue each record is in.
"""

from __future__ import annotations

import functools
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import add, and_, attrgetter

from tidemq.limits import PROPERTIES_SIZE_MAX, TOPIC_NAME_LENGTH_MAX, topic_name_problem
from tidemq.protocol.crc import crc32
from tidemq.protocol.message import (
    KEY_SEPARATOR,
    MAGIC_V1,
    NAME_VALUE_SEPARATOR,
    POSITION_BODY_CRC,
    POSITION_QUEUE_OFFSET,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    RECORD_PREFIX_IPV4,
    RECORD_PREFIX_SIZE_IPV4,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    SYSFLAG_TRANSACTION_MASK,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    encode_record,
    pack_host,
    store_timestamp_position,
    tags_code,
)
from tidemq.store.config import SCHEDULE_TOPIC
from tidemq.store.interface import MessageBatch, PutStatus, SendColumns, StoreMessage

_pack_prefix = RECORD_PREFIX_IPV4.pack  # the 88-byte fixed part, both hosts IPv4
# The same 88 bytes in three parts, for a batch whose records share every field from
# QUEUEOFFSET to PREPAREDTRANSACTIONOFFSET (0, 0, SYSFLAG, BORNTIMESTAMP, BORNHOST,
# STORETIMESTAMP, STOREHOST, RECONSUMETIMES, 0: a MessageBatch without prepared offsets):
# those 64 bytes are packed once per batch, and each record's prefix packs TOTALSIZE,
# MAGICCODE, BODYCRC, QUEUEID, FLAG, the shared block and BODYLENGTH (7 values instead of
# 17: measured 0.21 against 0.41 us per record).
_PREFIX_SHARED_IPV4 = struct.Struct(">qqiq4siq4siiq")
_pack_prefix_shared = _PREFIX_SHARED_IPV4.pack
_PREFIX_SPLIT_IPV4 = struct.Struct(f">iiiii{_PREFIX_SHARED_IPV4.size}si")
_pack_prefix_split = _PREFIX_SPLIT_IPV4.pack
assert _PREFIX_SPLIT_IPV4.size == RECORD_PREFIX_IPV4.size
_pack_int16 = struct.Struct(">h").pack
# A group of single sends (``encode_send_columns``): the fields from BORNHOST to
# PREPAREDTRANSACTIONOFFSET are the group's (one born host, reconsume times and prepared offset
# 0), packed once; each record's prefix packs TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, FLAG,
# zeros for QUEUEOFFSET and PHYSICALOFFSET (the commit log patches them), SYSFLAG,
# BORNTIMESTAMP, the shared block and BODYLENGTH.
_SENDS_SHARED_IPV4 = struct.Struct(">4siq4siiq")
_pack_sends_shared = _SENDS_SHARED_IPV4.pack
_SENDS_PREFIX_IPV4 = struct.Struct(f">iiiii16xiq{_SENDS_SHARED_IPV4.size}si")
_pack_sends_prefix = _SENDS_PREFIX_IPV4.pack
assert _SENDS_PREFIX_IPV4.size == RECORD_PREFIX_IPV4.size
_pack_offsets = struct.Struct(">qq").pack_into  # QUEUEOFFSET @20, PHYSICALOFFSET @28
_pack_int64 = struct.Struct(">q").pack_into
_STORE_TIMESTAMP_POSITION_IPV4 = store_timestamp_position(0)  # 56
_NO_V6_FLAGS = ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)

# Transaction types that get a consume-queue entry (and a queue offset); docs/protocol.md §6.2.
QUEUED_TRANSACTION_TYPES = frozenset((TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE))

# Every field encode_messages reads, fetched for all messages with one C call each.
_MESSAGE_FIELDS = attrgetter(
    "topic", "queue_id", "body", "properties", "properties_text", "flag", "sysflag",
    "born_timestamp", "born_host", "reconsume_times", "prepared_transaction_offset", "tags_code",
)
_BODY_CRC_MASK = 0x7FFFFFFF
_CLEAR_HIGH_BIT = bytes(code & 0x7F for code in range(256))  # a translate table
# Below this many messages a batch is encoded one message at a time: the column steps' fixed
# cost does not pay (measured, 1 KiB bodies: one by one wins up to 8 messages, columns from
# 16 on, by 20% at 64).
_COLUMNS_MESSAGES_MIN = 12
_QUEUE_ID_MAX = 0x7FFFFFFF  # QUEUEID is an int32


class EncodeRejected(Exception):
    """A message cannot be stored; ``status`` and ``remark`` go into the PutResult."""

    def __init__(self, status: PutStatus, remark: str) -> None:
        super().__init__(remark)
        self.status = status
        self.remark = remark


@functools.lru_cache(maxsize=1024)
def _packed_host(address: str) -> tuple[bytes, int, bool]:
    # Producers are few and their addresses repeat: parse each "ip:port" once.
    return pack_host(address)


@functools.lru_cache(maxsize=4096)
def _cached_tags_code(tags: str | None) -> int:
    return tags_code(tags)


@dataclass(slots=True)
class EncodedBatch:
    """Records for one queue, packed back to back in ``buffer``.

    ``tag_codes[i]`` is None for a delayed message whose delivery time (its tag code) is
    known only once the store time is; ``delay_levels[i]`` then holds its DELAY level.
    ``store_timestamp_positions`` is None when every record has it at 56 (IPv4 born host).
    ``queue_ids`` is None for a batch of one queue (``queue_id``); for a queue group it holds
    each record's queue id (``queue_id`` is then the first record's).
    """

    topic: str
    queue_id: int
    transaction_type: int
    buffer: bytearray
    sizes: list[int]
    store_timestamp: int
    store_timestamp_positions: list[int] | None
    tag_codes: list[int | None]
    keys: Sequence[Sequence[str]] | None  # per record (KeyColumns from the batch path)
    delay_levels: list[int] | None
    queue_ids: list[int] | None = None

    @property
    def queued(self) -> bool:
        """True when these records get consume-queue entries and queue offsets."""
        return self.transaction_type in QUEUED_TRANSACTION_TYPES

    @property
    def indexed(self) -> bool:
        """True when these records are indexed by key (all but rollback records)."""
        return self.transaction_type != TRANSACTION_ROLLBACK_TYPE

    def store_timestamp_position(self, index: int) -> int:
        """Where STORETIMESTAMP sits in record ``index``."""
        positions = self.store_timestamp_positions
        return _STORE_TIMESTAMP_POSITION_IPV4 if positions is None else positions[index]


def patch_offsets(
    buffer: bytearray, position: int, queue_offset: int, physical_offset: int
) -> None:
    """Write QUEUEOFFSET and PHYSICALOFFSET of the record at ``position``."""
    _pack_offsets(buffer, position + POSITION_QUEUE_OFFSET, queue_offset, physical_offset)


def patch_store_timestamp(buffer: bytearray, position: int, store_timestamp: int) -> None:
    """Write STORETIMESTAMP at ``position`` (a record's start plus its timestamp position)."""
    _pack_int64(buffer, position, store_timestamp)


def encode_messages(
    messages: Sequence[StoreMessage],
    *,
    store_host: str,
    store_timestamp: int,
    max_message_size: int,
    segment_size: int,
    with_keys: bool,
    mixed_queues: bool = False,
) -> EncodedBatch:
    """Validate and encode messages of one (topic, queue) into one buffer.

    Args:
        store_host: ``"ip:port"`` written as STOREHOST.
        store_timestamp: written as STORETIMESTAMP (the commit log may raise it).
        max_message_size: the largest body accepted (``max_message_size``).
        segment_size: a record must fit one commit-log segment.
        with_keys: collect the index keys (UNIQ_KEY and KEYS tokens) of each message.
        mixed_queues: the messages are a queue group (module docstring): one topic, any
            queues; the result's ``queue_ids`` lists each record's queue.

    Raises:
        EncodeRejected: an empty batch, mixed topics or queues, a bad topic, queue id, host,
            field value, body or properties size; nothing has been written.
    """
    if not messages:
        raise EncodeRejected(PutStatus.MESSAGE_ILLEGAL, "the batch has no messages")
    first = messages[0]
    topic = first.topic
    queue_id = first.queue_id
    _check_destination(topic, queue_id)
    store_address, store_port, store_v6 = _packed_host_or_reject(store_host, "store host")
    if len(messages) >= _COLUMNS_MESSAGES_MIN and not store_v6 and topic != SCHEDULE_TOPIC:
        batch = _encode_columns(
            messages, topic, queue_id, (store_address, store_port), store_timestamp,
            max_message_size, segment_size, with_keys, mixed_queues,
        )
        if batch is not None:
            return batch
    return _encode_one_by_one(
        messages, topic, queue_id, store_host, store_timestamp, max_message_size,
        segment_size, with_keys, mixed_queues,
    )


@functools.lru_cache(maxsize=4096)
def _topic_field_of(topic: str) -> bytes | None:
    # TOPICLENGTH TOPIC of a topic that passes _check_destination's name checks, or None:
    # a lone send's topic repeats, so its rules and its encoding are paid once per topic.
    if topic_name_problem(topic) is not None:
        return None
    topic_bytes = topic.encode("utf-8")
    if len(topic_bytes) > TOPIC_NAME_LENGTH_MAX:
        return None
    return bytes((len(topic_bytes),)) + topic_bytes


def ipv4_host_packed(address: str) -> tuple[bytes, int] | None:
    """``"ip:port"`` as ``encode_single`` takes a store host (address bytes, port); None for
    an IPv6 or malformed address, which ``encode_messages`` handles or refuses."""
    try:
        packed_address, port, v6 = _packed_host(address)
    except Exception:
        return None
    return None if v6 else (packed_address, port)


def encode_single(
    message: StoreMessage,
    store_host: tuple[bytes, int],
    store_timestamp: int,
    max_message_size: int,
    segment_size: int,
    with_keys: bool,
) -> EncodedBatch | None:
    """One message, plain or committed, from and to IPv4 hosts: the record a lone send
    appends, with the same bytes, tag code and keys as ``encode_messages([message])`` and
    none of a batch's steps (no per-batch checks, no column or per-message loop).

    Args:
        store_host: the store's packed IPv4 address and port (``pack_host``).
        store_timestamp, max_message_size, segment_size, with_keys: as ``encode_messages``.

    Returns:
        The one-record batch, or None when the message needs ``encode_messages``: a bad
        topic or queue id, an IPv6 born host, SCHEDULE_TOPIC_XXXX, a half or rollback
        record, a field or size over a limit (that path then refuses it and names why).
    """
    topic = message.topic
    topic_field = _topic_field_of(topic)
    queue_id = message.queue_id
    sysflag = message.sysflag
    if (
        topic_field is None
        or not 0 <= queue_id <= _QUEUE_ID_MAX
        or sysflag & SYSFLAG_TRANSACTION_MASK not in QUEUED_TRANSACTION_TYPES
        or topic == SCHEDULE_TOPIC
    ):
        return None
    try:
        born_address, born_port, born_v6 = _packed_host(message.born_host)
    except Exception:
        return None  # encode_messages names the bad address
    if born_v6:
        return None
    properties_map = message.properties
    properties_text = message.properties_text
    if properties_text is None:
        if not properties_map:
            properties_text = ""
        else:
            try:
                properties_text = PROPERTY_SEPARATOR.join(
                    map(NAME_VALUE_SEPARATOR.join, properties_map.items()))
            except TypeError:  # a value that is not a string: rendered as the batch path does
                return None
    properties = properties_text.encode("utf-8")
    properties_length = len(properties)
    body = message.body
    body_length = len(body)
    size = RECORD_PREFIX_SIZE_IPV4 + len(topic_field) + 2 + body_length + properties_length
    if (
        properties_length > PROPERTIES_SIZE_MAX
        or body_length > max_message_size
        or size > segment_size
    ):
        return None
    try:
        prefix = _pack_prefix(
            size, MAGIC_V1, crc32(body) & _BODY_CRC_MASK, queue_id, message.flag, 0, 0,
            sysflag & _NO_V6_FLAGS, message.born_timestamp, born_address, born_port,
            store_timestamp, store_host[0], store_host[1], message.reconsume_times,
            message.prepared_transaction_offset, body_length,
        )
        buffer = bytearray().join((prefix, body, topic_field + _pack_int16(properties_length),
                                   properties))
    except (struct.error, OverflowError, TypeError):
        return None
    tag_code = message.tags_code
    if tag_code is None:
        tag_code = _cached_tags_code(properties_map.get(PROPERTY_TAGS))
    keys: list[list[str]] | None = None
    if with_keys:
        unique_key = properties_map.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        # The common send carries a UNIQ_KEY and no KEYS: its keys without a call.
        if unique_key and PROPERTY_KEYS not in properties_map:
            keys = [[unique_key]]
        else:
            keys = [index_keys(properties_map)]
    return EncodedBatch(topic, queue_id, sysflag & SYSFLAG_TRANSACTION_MASK, buffer, [size],
                        store_timestamp, None, [tag_code], keys, None)


def _encode_columns(
    messages: Sequence[StoreMessage],
    topic: str,
    queue_id: int,
    store_host: tuple[bytes, int],
    store_timestamp: int,
    max_message_size: int,
    segment_size: int,
    with_keys: bool,
    mixed_queues: bool,
) -> EncodedBatch | None:
    """The batch encoded column by column (module docstring), or None when it needs the
    one-by-one path: another host form, a property that is not a string, a mixed batch, half
    or rollback records, a message over a limit (that path then names the problem)."""
    count = len(messages)
    (
        topics, queue_ids, bodies, property_maps, property_texts, flags, sysflags,
        born_timestamps, born_hosts, reconsume_times, prepared_offsets, tag_code_overrides,
    ) = zip(*map(_MESSAGE_FIELDS, messages), strict=True)
    if mixed_queues:
        if min(queue_ids) < 0 or max(queue_ids) > _QUEUE_ID_MAX:
            return None
    elif queue_ids.count(queue_id) != count:
        return None
    # Plain messages, or committed copies of half messages (END_TRANSACTION, the
    # exactly-once sink): one transaction type for the whole batch, NOT or COMMIT.
    transaction_types = list(map(and_, sysflags, repeat(SYSFLAG_TRANSACTION_MASK)))
    transaction_type = transaction_types[0]
    if (
        topics.count(topic) != count
        or born_hosts.count(born_hosts[0]) != count
        or transaction_type not in QUEUED_TRANSACTION_TYPES
        or transaction_types.count(transaction_type) != count
    ):
        return None
    born_address, born_port, born_v6 = _packed_host_or_reject(born_hosts[0], "born host")
    if born_v6:
        return None
    try:
        property_strings = _property_strings(property_maps, property_texts, count)
        tag_codes: list[int | None] = list(
            map(_cached_tags_code, map(dict.get, property_maps, repeat(PROPERTY_TAGS)))
        )
        keys = _index_keys_of(property_maps) if with_keys else None
    except (TypeError, AttributeError):
        return None  # a property name or value that is not a string, or not a dict
    properties = list(map(str.encode, property_strings))
    properties_lengths = list(map(len, properties))
    body_lengths = list(map(len, bodies))
    sized = _ipv4_record_sizes(topic, body_lengths, properties_lengths, max_message_size,
                               segment_size)
    if sized is None:
        return None
    topic_field, sizes = sized
    store_address, store_port = store_host
    try:
        prefixes = list(map(
            _pack_prefix, sizes, repeat(MAGIC_V1),
            body_crcs(bodies),
            queue_ids if mixed_queues else repeat(queue_id), flags,
            repeat(0), repeat(0), map(and_, sysflags, repeat(_NO_V6_FLAGS)), born_timestamps,
            repeat(born_address), repeat(born_port), repeat(store_timestamp),
            repeat(store_address), repeat(store_port), reconsume_times, prepared_offsets,
            body_lengths,
        ))
    except (struct.error, OverflowError, TypeError):
        return None
    if tag_code_overrides.count(None) != count:
        tag_codes = [
            derived if override is None else override
            for derived, override in zip(tag_codes, tag_code_overrides, strict=True)
        ]
    return EncodedBatch(
        topic=topic,
        queue_id=queue_id,
        transaction_type=transaction_type,
        buffer=_join_records(prefixes, bodies, topic_field, properties, properties_lengths),
        sizes=sizes,
        store_timestamp=store_timestamp,
        store_timestamp_positions=None,
        tag_codes=tag_codes,
        keys=keys,
        delay_levels=None,
        queue_ids=list(queue_ids) if mixed_queues else None,
    )


def encode_message_batch(
    batch: MessageBatch,
    *,
    store_host: str,
    store_timestamp: int,
    max_message_size: int,
    segment_size: int,
    with_keys: bool,
) -> EncodedBatch | None:
    """Validate and encode a batch given in columns (``MessageBatch``) into one buffer.

    The same bytes as ``encode_messages`` of ``batch.to_store_messages()``, without a Python
    step per message: the properties are stored as given, tag codes and index keys come
    from ``batch.tags`` and ``batch.keys``.

    Returns:
        The encoded batch, or None when it needs the general path (an IPv6 host, a
        half or rollback sysflag, SCHEDULE_TOPIC_XXXX, a message over a limit: that path
        then names the problem).

    Raises:
        EncodeRejected: an empty batch, a bad topic or queue id, or a bad store host.
    """
    count = len(batch.bodies)
    if not count:
        raise EncodeRejected(PutStatus.MESSAGE_ILLEGAL, "the batch has no messages")
    topic = batch.topic
    queue_id = batch.queue_id
    _check_destination(topic, queue_id)
    store_address, store_port, store_v6 = _packed_host_or_reject(store_host, "store host")
    sysflag = batch.sysflag
    transaction_type = sysflag & SYSFLAG_TRANSACTION_MASK
    if store_v6 or topic == SCHEDULE_TOPIC or transaction_type not in QUEUED_TRANSACTION_TYPES:
        return None
    born_address, born_port, born_v6 = _packed_host_or_reject(batch.born_host, "born host")
    if born_v6:
        return None
    bodies = batch.bodies
    properties = batch.properties
    properties_lengths = list(map(len, properties))
    body_lengths = list(map(len, bodies))
    sized = _ipv4_record_sizes(topic, body_lengths, properties_lengths, max_message_size,
                               segment_size)
    if sized is None:
        return None
    topic_field, sizes = sized
    buffer: bytearray | None = None
    try:
        if batch.prepared_transaction_offsets is None:
            shared = _pack_prefix_shared(
                0, 0, sysflag & _NO_V6_FLAGS, batch.born_timestamp, born_address, born_port,
                store_timestamp, store_address, store_port, batch.reconsume_times, 0,
            )
            buffer = _pack_like_records(
                count, sizes, batch.body_crcs, queue_id, batch.flags, shared, bodies,
                topic_field, properties, body_lengths, properties_lengths,
            )
            if buffer is None:
                prefixes = list(map(
                    _pack_prefix_split, sizes, repeat(MAGIC_V1),
                    batch.body_crcs or body_crcs(bodies), repeat(queue_id), batch.flags,
                    repeat(shared), body_lengths,
                ))
        else:
            prefixes = list(map(
                _pack_prefix, sizes, repeat(MAGIC_V1),
                batch.body_crcs or body_crcs(bodies),
                repeat(queue_id), batch.flags, repeat(0), repeat(0),
                repeat(sysflag & _NO_V6_FLAGS), repeat(batch.born_timestamp),
                repeat(born_address), repeat(born_port), repeat(store_timestamp),
                repeat(store_address), repeat(store_port), repeat(batch.reconsume_times),
                batch.prepared_transaction_offsets, body_lengths,
            ))
    except (struct.error, OverflowError, TypeError):
        return None
    tags = batch.tags
    tag_codes: list[int | None] = (
        [0] * count if tags is None else list(map(_cached_tags_code, tags))
    )
    return EncodedBatch(
        topic=topic,
        queue_id=queue_id,
        transaction_type=transaction_type,
        buffer=buffer if buffer is not None else _join_records(
            prefixes, bodies, topic_field, properties, properties_lengths),
        sizes=sizes,
        store_timestamp=store_timestamp,
        store_timestamp_positions=None,
        tag_codes=tag_codes,
        keys=batch.keys if with_keys else None,
        delay_levels=None,
    )


def encode_send_columns(
    sends: SendColumns,
    store_host: tuple[bytes, int],
    store_timestamp: int,
    max_message_size: int,
    segment_size: int,
    with_keys: bool,
) -> EncodedBatch | None:
    """A group of single sends given in columns (``SendColumns``) as one queue group: the
    same bytes, tag codes and keys as ``encode_messages(<the same StoreMessages>,
    mixed_queues=True)``, with no Python step per message (one ``pack_into`` per record when
    the records are all of one size, a producer's like sends; else one prefix pack each and
    one join).

    Args:
        store_host: the store's packed IPv4 address and port (``pack_host``).
        store_timestamp, max_message_size, segment_size, with_keys: as ``encode_messages``.

    Returns:
        The encoded queue group, or None when the sends need ``encode_messages`` (which
        then stores or refuses each and names why): a bad topic or queue id, an IPv6 or bad
        born host, SCHEDULE_TOPIC_XXXX, mixed transaction types or a half or rollback
        record, a field or size over a limit, a properties text that is no UTF-8.
    """
    topic = sends.topic
    queue_ids = sends.queue_ids
    sysflags = sends.sysflags
    count = len(queue_ids)
    transaction_type = sysflags[0] & SYSFLAG_TRANSACTION_MASK if count else -1
    if (
        not count
        or _topic_field_of(topic) is None
        or topic == SCHEDULE_TOPIC
        or min(queue_ids) < 0
        or max(queue_ids) > _QUEUE_ID_MAX
        or transaction_type not in QUEUED_TRANSACTION_TYPES
        or list(map(and_, sysflags, repeat(SYSFLAG_TRANSACTION_MASK))).count(transaction_type)
        != count
    ):
        return None
    try:
        born_address, born_port, born_v6 = _packed_host(sends.born_host)
        properties = list(map(str.encode, sends.properties))
    except Exception:  # a bad born host or a text with a lone surrogate: the general way
        return None
    if born_v6:
        return None
    bodies = sends.bodies
    properties_lengths = list(map(len, properties))
    body_lengths = list(map(len, bodies))
    sized = _ipv4_record_sizes(topic, body_lengths, properties_lengths, max_message_size,
                               segment_size)
    if sized is None:
        return None
    topic_field, sizes = sized
    try:
        shared = _pack_sends_shared(born_address, born_port, store_timestamp, store_host[0],
                                    store_host[1], 0, 0)
        sysflags_stored = list(map(and_, sysflags, repeat(_NO_V6_FLAGS)))
        buffer = _pack_like_sends(sizes, queue_ids, sends.flags, sysflags_stored,
                                  sends.born_timestamps, shared, bodies, topic_field,
                                  properties, body_lengths, properties_lengths)
        if buffer is None:
            prefixes = list(map(
                _pack_sends_prefix, sizes, repeat(MAGIC_V1), body_crcs(bodies), queue_ids,
                sends.flags, sysflags_stored, sends.born_timestamps, repeat(shared),
                body_lengths,
            ))
            buffer = _join_records(prefixes, bodies, topic_field, properties,
                                   properties_lengths)
    except (struct.error, OverflowError, TypeError):
        return None
    tags = sends.tags
    return EncodedBatch(
        topic=topic,
        queue_id=queue_ids[0],
        transaction_type=transaction_type,
        buffer=buffer,
        sizes=sizes,
        store_timestamp=store_timestamp,
        store_timestamp_positions=None,
        tag_codes=[0] * count if tags is None else list(map(_cached_tags_code, tags)),
        keys=sends.keys if with_keys else None,
        delay_levels=None,
        queue_ids=queue_ids,
    )


def _pack_like_sends(
    sizes: list[int],
    queue_ids: list[int],
    flags: Sequence[int],
    sysflags: list[int],
    born_timestamps: Sequence[int],
    shared: bytes,
    bodies: Sequence[bytes],
    topic_field: bytes,
    properties: Sequence[bytes],
    body_lengths: list[int],
    properties_lengths: list[int],
) -> bytearray | None:
    """``_pack_like_records`` for a group of single sends (each its own queue id, flag,
    sysflag and born time): records of one size packed straight into one buffer, one
    ``pack_into`` per record, the BODYCRCs' high bit cleared at once afterwards; None when
    the records are not all of one size."""
    count = len(sizes)
    body_length = body_lengths[0]
    properties_length = properties_lengths[0]
    if (
        body_lengths.count(body_length) != count
        or properties_lengths.count(properties_length) != count
    ):
        return None
    size = sizes[0]
    buffer = bytearray(size * count)
    deque(map(
        _like_send(body_length, len(topic_field), properties_length).pack_into,
        repeat(buffer), range(0, size * count, size), repeat(size), repeat(MAGIC_V1),
        map(crc32, bodies), queue_ids, flags, sysflags, born_timestamps, repeat(shared),
        repeat(body_length), bodies, repeat(topic_field + _pack_int16(properties_length)),
        properties,
    ), maxlen=0)
    high_bytes = slice(POSITION_BODY_CRC, None, size)  # each BODYCRC's high byte
    buffer[high_bytes] = buffer[high_bytes].translate(_CLEAR_HIGH_BIT)
    return buffer


@functools.lru_cache(maxsize=64)
def _like_send(body_length: int, topic_field_length: int, properties_length: int
               ) -> struct.Struct:
    # A whole IPv4 record of a group of single sends (``_SENDS_PREFIX_IPV4``, BODY,
    # TOPICLENGTH TOPIC PROPERTIESLENGTH as one run, PROPERTIES); BODYCRC unsigned, as zlib
    # gives it, its high bit cleared afterwards.
    return struct.Struct(
        f">iiIii16xiq{_SENDS_SHARED_IPV4.size}si{body_length}s{topic_field_length + 2}s"
        f"{properties_length}s"
    )


def body_crcs(bodies: Sequence[bytes]) -> list[int]:
    """Each body's BODYCRC as the store writes it (for ``MessageBatch.body_crcs``)."""
    return list(map(and_, map(crc32, bodies), repeat(_BODY_CRC_MASK)))


def _ipv4_record_sizes(
    topic: str,
    body_lengths: list[int],
    properties_lengths: list[int],
    max_message_size: int,
    segment_size: int,
) -> tuple[bytes, list[int]] | None:
    """The topic field and each IPv4 record's size, or None when a record breaks a limit
    (the one-by-one path then refuses it and names the limit)."""
    topic_bytes = topic.encode("utf-8")
    topic_field = bytes((len(topic_bytes),)) + topic_bytes  # TOPICLENGTH TOPIC
    sizes = list(map(
        add, map(add, body_lengths, properties_lengths),
        repeat(RECORD_PREFIX_SIZE_IPV4 + len(topic_field) + 2),
    ))
    if (
        max(properties_lengths) > PROPERTIES_SIZE_MAX
        or max(body_lengths) > max_message_size
        or max(sizes) > segment_size
    ):
        return None
    return topic_field, sizes


def _pack_like_records(
    count: int,
    sizes: list[int],
    crcs: Sequence[int] | None,
    queue_id: int,
    flags: Sequence[int],
    shared: bytes,
    bodies: Sequence[bytes],
    topic_field: bytes,
    properties: Sequence[bytes],
    body_lengths: list[int],
    properties_lengths: list[int],
) -> bytearray | None:
    """Records of one size (every body of one length, every PROPERTIES of one length: a
    producer's like messages) packed straight into one buffer, one ``pack_into`` per record
    (no prefix object, no join: measured 0.88 against 1.01 us per 1 KiB record, CRC
    included); None for any other batch, or a field the record struct does not take (a
    body that is not bytes), which ``_join_records`` then handles. ``crcs`` None: each
    body's CRC is computed here, packed as zlib gives it, and the bit BODYCRC leaves out
    is cleared in every record at once (one strided copy of the records' CRC high bytes,
    instead of a mask per record)."""
    body_length = body_lengths[0]
    properties_length = properties_lengths[0]
    if (
        body_lengths.count(body_length) != count
        or properties_lengths.count(properties_length) != count
    ):
        return None
    size = sizes[0]
    buffer = bytearray(size * count)
    try:
        deque(map(
            _like_record(body_length, len(topic_field), properties_length).pack_into,
            repeat(buffer), range(0, size * count, size), repeat(size), repeat(MAGIC_V1),
            map(crc32, bodies) if crcs is None else crcs, repeat(queue_id), flags,
            repeat(shared), repeat(body_length), bodies,
            repeat(topic_field + _pack_int16(properties_length)), properties,
        ), maxlen=0)
    except (struct.error, OverflowError, TypeError):
        return None
    if crcs is None:
        high_bytes = slice(POSITION_BODY_CRC, None, size)  # each BODYCRC's high byte
        buffer[high_bytes] = buffer[high_bytes].translate(_CLEAR_HIGH_BIT)
    return buffer


@functools.lru_cache(maxsize=64)
def _like_record(body_length: int, topic_field_length: int, properties_length: int
                 ) -> struct.Struct:
    # TOTALSIZE MAGICCODE BODYCRC QUEUEID FLAG, the shared 64 bytes, BODYLENGTH, BODY,
    # TOPICLENGTH TOPIC PROPERTIESLENGTH (one run), PROPERTIES: a whole IPv4 record.
    # BODYCRC unsigned: it may come as zlib gives it, its high bit cleared afterwards.
    return struct.Struct(
        f">iiIii{_PREFIX_SHARED_IPV4.size}si{body_length}s{topic_field_length + 2}s"
        f"{properties_length}s"
    )


def _join_records(
    prefixes: list[bytes],
    bodies: Sequence[bytes],
    topic_field: bytes,
    properties: Sequence[bytes],
    properties_lengths: list[int],
) -> bytearray:
    """The records, each PREFIX BODY TOPICLENGTH TOPIC PROPERTIESLENGTH PROPERTIES, in one
    buffer."""
    topic_and_lengths = map(add, repeat(topic_field), map(_pack_int16, properties_lengths))
    return bytearray().join(
        chain.from_iterable(zip(prefixes, bodies, topic_and_lengths, properties, strict=True))
    )


def _property_strings(
    property_maps: Sequence[dict[str, str]],
    property_texts: Sequence[str | None],
    count: int,
) -> Sequence[str]:
    # Raises TypeError for a name or value that is not a string (None included): the
    # one-by-one path renders those as the dict path always did.
    missing = property_texts.count(None)  # type: ignore[attr-defined]
    if missing == 0:
        return property_texts  # type: ignore[return-value]
    rendered = list(map(
        PROPERTY_SEPARATOR.join,
        map(map, repeat(NAME_VALUE_SEPARATOR.join), map(dict.items, property_maps)),
    ))
    if missing == count:
        return rendered
    return [
        text if text is not None else made
        for text, made in zip(property_texts, rendered, strict=True)
    ]


def _index_keys_of(property_maps: Sequence[dict[str, str]]) -> list[Sequence[str]]:
    # The common case, each message with a UNIQ_KEY and one KEYS token, without a call per
    # message; anything else through index_keys.
    unique_keys = list(map(dict.get, property_maps, repeat(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)))
    user_keys = list(map(dict.get, property_maps, repeat(PROPERTY_KEYS)))
    if user_keys.count(None) == len(user_keys) and None not in unique_keys and (
        "" not in unique_keys
    ):
        # The commonest send of all: a UNIQ_KEY (every client sets one) and no KEYS.
        return list(zip(unique_keys))  # type: ignore[arg-type]
    if (
        None not in unique_keys
        and "" not in unique_keys
        and None not in user_keys
        and "" not in user_keys
        and KEY_SEPARATOR not in "".join(user_keys)  # type: ignore[arg-type]
    ):
        return list(zip(unique_keys, user_keys, strict=True))  # type: ignore[arg-type]
    return list(map(index_keys, property_maps))


def _encode_one_by_one(
    messages: Sequence[StoreMessage],
    topic: str,
    queue_id: int,
    store_host: str,
    store_timestamp: int,
    max_message_size: int,
    segment_size: int,
    with_keys: bool,
    mixed_queues: bool,
) -> EncodedBatch:
    first = messages[0]
    batched = len(messages) > 1
    batch_type = _batch_transaction_type(messages)
    topic_bytes = topic.encode("utf-8")
    topic_field = bytes((len(topic_bytes),)) + topic_bytes
    store_address, store_port, store_v6 = _packed_host_or_reject(store_host, "store host")
    fixed_size = RECORD_PREFIX_SIZE_IPV4 + len(topic_field) + 2
    schedule_topic = topic == SCHEDULE_TOPIC

    parts: list[bytes] = []
    add_part = parts.append
    sizes: list[int] = []
    timestamp_positions: list[int] | None = None
    tag_codes: list[int | None] = []
    keys: list[Sequence[str]] | None = [] if with_keys else None
    delay_levels: list[int] | None = [] if schedule_topic else None
    queue_ids: list[int] | None = [] if mixed_queues else None
    born_host_text = None
    born_address, born_port, born_v6 = b"", 0, False
    # The loop below runs once per stored message: calls are inlined on purpose.
    try:
        for message in messages:
            if queue_ids is not None:
                queue_id = message.queue_id
                if not 0 <= queue_id <= _QUEUE_ID_MAX:
                    _check_destination(topic, queue_id)  # raises, naming the queue id
                queue_ids.append(queue_id)
            if batched and (
                message.topic != topic
                or (queue_ids is None and message.queue_id != queue_id)
                or message.sysflag & SYSFLAG_TRANSACTION_MASK != batch_type
            ):
                _check_batch(messages, topic, queue_id, mixed_queues)
            properties_map = message.properties
            properties_text = message.properties_text
            if properties_text is None:
                properties_text = PROPERTY_SEPARATOR.join(
                    [f"{name}{NAME_VALUE_SEPARATOR}{value}"
                     for name, value in properties_map.items() if value is not None]
                ) if properties_map else ""
            properties = properties_text.encode("utf-8")
            properties_length = len(properties)
            if properties_length > PROPERTIES_SIZE_MAX:
                raise _properties_too_large(properties_length)
            body = message.body
            body_length = len(body)
            if body_length > max_message_size:
                raise _body_too_large(body_length, max_message_size)
            if message.born_host != born_host_text:
                born_host_text = message.born_host
                born_address, born_port, born_v6 = _packed_host_or_reject(
                    born_host_text, "born host"
                )
            if born_v6 or store_v6:
                record = bytes(encode_record(
                    topic=topic_bytes, body=body, properties=properties, queue_id=queue_id,
                    flag=message.flag, sysflag=message.sysflag,
                    born_timestamp=message.born_timestamp, born_host=(born_address, born_port),
                    store_timestamp=store_timestamp, store_host=(store_address, store_port),
                    reconsume_times=message.reconsume_times,
                    prepared_transaction_offset=message.prepared_transaction_offset,
                ))
                size = len(record)
                add_part(record)
                if timestamp_positions is None:
                    timestamp_positions = [_STORE_TIMESTAMP_POSITION_IPV4] * len(sizes)
                timestamp_positions.append(
                    store_timestamp_position(SYSFLAG_BORNHOST_V6 if born_v6 else 0)
                )
            else:
                size = fixed_size + body_length + properties_length
                add_part(_pack_prefix(
                    size, MAGIC_V1, crc32(body) & _BODY_CRC_MASK, queue_id, message.flag, 0, 0,
                    message.sysflag & _NO_V6_FLAGS, message.born_timestamp, born_address,
                    born_port, store_timestamp, store_address, store_port,
                    message.reconsume_times, message.prepared_transaction_offset, body_length,
                ))
                add_part(body)
                add_part(topic_field + _pack_int16(properties_length) + properties)
                if timestamp_positions is not None:
                    timestamp_positions.append(_STORE_TIMESTAMP_POSITION_IPV4)
            if size > segment_size:
                raise _record_too_large(size, segment_size)
            sizes.append(size)
            if message.tags_code is not None:
                tag_codes.append(message.tags_code)
            elif schedule_topic:
                tag_codes.append(None)
                delay_levels.append(  # type: ignore[union-attr]
                    _delay_level(properties_map.get(PROPERTY_DELAY_TIME_LEVEL))
                )
            else:
                tag_codes.append(_cached_tags_code(properties_map.get(PROPERTY_TAGS)))
            if keys is not None:
                keys.append(index_keys(properties_map))
    except (struct.error, OverflowError, TypeError) as e:
        raise EncodeRejected(
            PutStatus.MESSAGE_ILLEGAL, f"a message field does not fit its slot in the record: {e}"
        ) from None
    return EncodedBatch(
        topic=topic,
        queue_id=first.queue_id,
        transaction_type=first.sysflag & SYSFLAG_TRANSACTION_MASK,
        buffer=bytearray().join(parts),
        sizes=sizes,
        store_timestamp=store_timestamp,
        store_timestamp_positions=timestamp_positions,
        tag_codes=tag_codes,
        keys=keys,
        delay_levels=delay_levels,
        queue_ids=queue_ids,
    )


def _properties_too_large(length: int) -> EncodeRejected:
    return EncodeRejected(
        PutStatus.PROPERTIES_SIZE_EXCEEDED,
        f"message properties are {length} bytes, more than the {PROPERTIES_SIZE_MAX} a "
        "record can hold; send fewer or shorter properties",
    )


def _body_too_large(length: int, max_message_size: int) -> EncodeRejected:
    return EncodeRejected(
        PutStatus.MESSAGE_ILLEGAL,
        f"message body is {length} bytes, larger than max_message_size={max_message_size} "
        "(set maxMessageSize on the broker and the producer)",
    )


def _record_too_large(size: int, segment_size: int) -> EncodeRejected:
    return EncodeRejected(
        PutStatus.MESSAGE_ILLEGAL,
        f"message record is {size} bytes and cannot fit a commit-log segment of "
        f"mapped_file_size_commit_log={segment_size} bytes; raise that setting",
    )


def index_keys(properties: dict[str, str]) -> list[str]:
    """The keys a message is indexed under: its UNIQ_KEY, then each KEYS token."""
    keys: list[str] = []
    unique_key = properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    if unique_key:
        keys.append(unique_key)
    user_keys = properties.get(PROPERTY_KEYS)
    if user_keys:
        # Split in one call and filtered only when a token is empty (a doubled or trailing
        # space): a generator per message cost more than the split (a trace message's KEYS
        # holds ~480 tokens; a single send's, one).
        tokens = user_keys.split(KEY_SEPARATOR)
        if "" in tokens:
            tokens = [token for token in tokens if token]
        keys += tokens
    return keys


def tag_code_of(properties: dict[str, str]) -> int:
    """The consume-queue tag code of a message's TAGS (cached Java hash)."""
    return _cached_tags_code(properties.get(PROPERTY_TAGS))


def delivery_tag_code(level: int, store_timestamp: int, delay_level_ms: Sequence[int]) -> int:
    """The tag code of a delayed message: when it is due (store time + its level's delay).

    Levels above the table use the last level, as RocketMQ caps them; 0 or less means now.
    """
    if level <= 0:
        return store_timestamp
    return store_timestamp + delay_level_ms[min(level, len(delay_level_ms)) - 1]


def _delay_level(text: str | None) -> int:
    try:
        return int(text) if text else 0
    except ValueError:
        return 0


def _check_destination(topic: str, queue_id: int) -> None:
    problem = topic_name_problem(topic)
    if problem is not None:
        raise EncodeRejected(PutStatus.MESSAGE_ILLEGAL, problem)
    if len(topic.encode("utf-8")) > TOPIC_NAME_LENGTH_MAX:
        raise EncodeRejected(
            PutStatus.MESSAGE_ILLEGAL,
            f"topic {topic[:40]!r} is longer than {TOPIC_NAME_LENGTH_MAX} bytes",
        )
    if not 0 <= queue_id <= _QUEUE_ID_MAX:
        raise EncodeRejected(
            PutStatus.MESSAGE_ILLEGAL, f"queue id {queue_id} is negative or above 2^31-1"
        )


def _check_batch(
    messages: Sequence[StoreMessage], topic: str, queue_id: int, mixed_queues: bool
) -> None:
    # Raises for the first message that does not belong in a batch to topic/queue_id (to
    # topic, in a queue group). Committed transactional messages may share a batch (they are
    # dispatched like plain ones, with consecutive queue offsets); half and rollback records
    # may not.
    batch_type = _batch_transaction_type(messages)
    for message in messages:
        if message.topic != topic or (not mixed_queues and message.queue_id != queue_id):
            raise EncodeRejected(
                PutStatus.MESSAGE_ILLEGAL,
                f"a batch goes to one queue: {topic}/{queue_id} and "
                f"{message.topic}/{message.queue_id} are mixed; send them separately",
            )
        if message.sysflag & SYSFLAG_TRANSACTION_MASK != batch_type:
            raise EncodeRejected(
                PutStatus.MESSAGE_ILLEGAL,
                "a batch holds plain messages or committed transactional ones, not a mix "
                "and no half or rollback records; send the others one by one",
            )


def _batch_transaction_type(messages: Sequence[StoreMessage]) -> int:
    """The transaction type a batch may hold: its first message's, when that is NOT or COMMIT."""
    first_type = messages[0].sysflag & SYSFLAG_TRANSACTION_MASK if messages else 0
    return first_type if first_type == TRANSACTION_COMMIT_TYPE else TRANSACTION_NOT_TYPE


def _packed_host_or_reject(address: str, what: str) -> tuple[bytes, int, bool]:
    try:
        return _packed_host(address)
    except Exception as e:
        raise EncodeRejected(PutStatus.MESSAGE_ILLEGAL, f"{what} {address!r}: {e}") from None

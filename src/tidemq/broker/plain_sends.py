"""Plain single sends of one read, read by columns.

A producer with many sends in flight (tidemq's own at 20,000 msg/s: 64 in flight, ~31 per
read) has a read's worth of SEND_MESSAGE_V2 requests arrive together, all alike: one topic,
the same ten header fields, plain messages carrying a UNIQ_KEY and nothing the broker must
act on. Served one by one, each paid a typed header (~1.8 us), its checks, a properties
round trip and a response object with its own JSON encode: a third of the broker's ~22 us
per send. ``read_plain_sends`` reads such a group's headers as columns, with a few C-level
checks for the whole group, and ``send_columns`` shapes them as the send processor would
(CLUSTER added to the client's properties text, the tags and index keys read from it) into
the store's columns (``SendColumns``: no message object per send), ``plain_messages`` into
StoreMessages for a lone send or a store that does not take columns; the send processor
checks the topic once and answers the group with ``protocol.send_answers``
(send_processor.py, ``serve_group_now``).

Plain means, for every request of the group:

- code SEND_MESSAGE_V2, a two-way request, JSON header; extFields exactly ``a b c d e f g
  h i n`` (what tidemq's producer sends: no reconsume times, unit mode, batch flag);
- one topic for all; queue id, sysFlag, flag and defaultTopicQueueNums canonical decimals
  below 1024, bornTimestamp plain decimal digits; no transaction bit in the sysFlag;
- a body; properties that name a UNIQ_KEY, no WAIT, no CLUSTER, nothing that makes the
  message delayed or transactional, and read back to the same text (no empty or repeated
  name), so that the text plus CLUSTER is what ``encode_properties`` would write.

Anything else returns None, and the group is served the general way, which gives every
answer, refusals included, as before. So this path never answers differently from the
general one; tests/unit/broker/test_plain_sends.py serves the same reads both ways.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import add, attrgetter, itemgetter, or_
from typing import NamedTuple

from tidemq.broker.schedule_service import PROPERTY_DELAY_QUEUE_OFFSET
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_CLUSTER,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    SYSFLAG_MULTI_TAGS,
    SYSFLAG_TRANSACTION_MASK,
    decode_properties,
)
from tidemq.protocol.send_run import SendRun
from tidemq.store.interface import SendColumns, StoreMessage
from tidemq.store.record_encoder import index_keys

# The extFields of tidemq's producer's single send (SendMessageRequestHeader's short names):
# producerGroup, topic, defaultTopic, defaultTopicQueueNums, queueId, sysFlag,
# bornTimestamp, flag, properties, bname.
_FIELDS = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "n")
_ROW = itemgetter(*_FIELDS)
# What a group's check reads of each request, in one pass.
_REQUEST_COLUMNS = attrgetter("code", "flag", "serialize_type", "ext_fields", "body", "opaque")
_NAME = itemgetter(0)
_VALUE = itemgetter(2)
_SEND_V2 = frozenset({int(RequestCode.SEND_MESSAGE_V2)})

# Canonical decimals of the small numbers a send header carries (queue ids, flags): one dict
# lookup each, in C over a column. 1024 as the header reader's table (headers.py).
_SMALL_INTS: dict[str, int] = {str(number): number for number in range(1024)}
# The same for a sysFlag, without those that carry a transaction bit (not plain).
_PLAIN_SYS_FLAGS: dict[str, int] = {
    text: number for text, number in _SMALL_INTS.items()
    if not number & SYSFLAG_TRANSACTION_MASK
}
# A Java long has 19 digits; 18 always fit (the header reader's bound for its fast path).
_DECIMAL_DIGITS_MAX = 18

_UNIQ_KEY = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX

# Properties that make a message more than a plain one: the general path acts on them.
_NOT_PLAIN_KEYS = frozenset({
    PROPERTY_WAIT_STORE_MSG_OK, PROPERTY_CLUSTER, PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TRANSACTION_PREPARED, PROPERTY_DELAY_QUEUE_OFFSET,
})


class PlainSends(NamedTuple):
    """The columns of a group of plain single sends (module docstring), in request order."""

    topic: str
    queue_ids: list[int]
    sys_flags: list[int]
    born_timestamps: list[int]
    flags: list[int]
    properties: Sequence[str]
    bodies: list[bytes]
    opaques: list[int]


def read_plain_sends(requests: list[RemotingCommand]) -> PlainSends | None:
    """The columns of ``requests`` when every one is a plain single send (module docstring),
    else None. Reads only the requests; the broker's state is the caller's to check."""
    try:
        return _read_columns(requests)
    except (TypeError, AttributeError):  # a value that is no str (a command made in process)
        return None


def read_send_run(run: SendRun) -> PlainSends | None:
    """``read_plain_sends`` of a read's run of SEND_MESSAGE_V2 requests taken as columns
    (protocol/send_run.py: two-way, JSON, each with a body and string extFields), with no
    command per request: the same columns, or None where it gives None."""
    try:
        return _read_header_columns(run.ext_fields, run.bodies, run.opaques)
    except (TypeError, AttributeError):
        return None


def _read_columns(requests: list[RemotingCommand]) -> PlainSends | None:
    # Each step is one C-level pass over a column: a group's cost is mostly the steps' own
    # (~0.3-1 us each on a slow host) while it holds few sends, so steps are merged where
    # one pass can do two checks.
    if not requests:
        return None
    codes, flags, serialize_types, ext_fields, bodies, opaques = zip(
        *map(_REQUEST_COLUMNS, requests), strict=True)
    if (
        set(codes) != _SEND_V2
        or any(flags)  # oneway (or a response): not answered alike
        or any(serialize_types)  # only JSON (0) answers are templated
        or None in bodies
    ):
        return None
    return _read_header_columns(ext_fields, bodies, opaques)


def _read_header_columns(ext_fields: Sequence[dict[str, str] | None], bodies: Sequence[bytes],
                         opaques: Sequence[int]) -> PlainSends | None:
    """The columns of sends already known to be two-way JSON SEND_MESSAGE_V2 requests with
    a body, read from their extFields."""
    if not ext_fields:
        return None
    try:
        if set(map(len, ext_fields)) != {len(_FIELDS)}:
            return None
        rows = list(map(_ROW, ext_fields))  # KeyError: another field than these ten
    except (TypeError, KeyError):  # no extFields at all
        return None
    (_, topics, _, default_queue_nums, queue_texts, sys_flag_texts, born_texts, flag_texts,
     properties, _) = zip(*rows, strict=True)
    topic = topics[0]
    if topics.count(topic) != len(topics):
        return None
    small = _SMALL_INTS.get
    queue_ids = list(map(small, queue_texts))
    sys_flags = list(map(_PLAIN_SYS_FLAGS.get, sys_flag_texts))  # None: also a transaction's
    message_flags = list(map(small, flag_texts))
    if (
        None in queue_ids
        or None in sys_flags
        or None in message_flags
        or None in map(small, default_queue_nums)
    ):
        return None
    born_digits = "".join(born_texts)
    born_lengths = set(map(len, born_texts))
    if (
        not born_digits.isdigit()
        or not born_digits.isascii()
        or min(born_lengths) == 0
        or max(born_lengths) > _DECIMAL_DIGITS_MAX
    ):
        return None
    return PlainSends(topic, queue_ids, sys_flags, list(map(int, born_texts)), message_flags,
                      properties, list(bodies), list(opaques))


def _plain_properties(text: str) -> dict[str, str] | None:
    """The properties of a send's text when they are plain (each name once, a UNIQ_KEY,
    nothing the broker acts on: module docstring), else None."""
    properties = decode_properties(text)
    if (
        len(properties) != text.count(PROPERTY_SEPARATOR) + 1
        or not properties.get(_UNIQ_KEY)
        or not _NOT_PLAIN_KEYS.isdisjoint(properties)
    ):
        return None
    return properties


def plain_messages(sends: PlainSends, cluster: str, multi_tags: bool,
                   born_host: str) -> list[StoreMessage] | None:
    """The store messages of ``sends`` as the send processor shapes a plain single send:
    CLUSTER added, the producer's queue, reconsume times 0, the MULTI_TAGS bit when the
    topic's filter type says so, the properties text kept. None when a message is not plain
    after all (its properties, module docstring)."""
    suffix = PROPERTY_SEPARATOR + PROPERTY_CLUSTER + NAME_VALUE_SEPARATOR + cluster
    topic = sends.topic
    messages = []
    add = messages.append
    for queue_id, body, text, flag, sys_flag, born_timestamp in zip(
        sends.queue_ids, sends.bodies, sends.properties, sends.flags, sends.sys_flags,
        sends.born_timestamps, strict=True,
    ):
        name, _, value = text.partition(NAME_VALUE_SEPARATOR)
        if name == _UNIQ_KEY and value and PROPERTY_SEPARATOR not in value:
            # The commonest text of all, a UNIQ_KEY alone: what decode_properties reads.
            properties = {_UNIQ_KEY: value, PROPERTY_CLUSTER: cluster}
        else:
            properties = _plain_properties(text)
            if properties is None:
                return None
            properties[PROPERTY_CLUSTER] = cluster
        if multi_tags:
            sys_flag |= SYSFLAG_MULTI_TAGS
        add(StoreMessage(topic, queue_id, body, properties, flag, sys_flag, born_timestamp,
                         born_host, 0, 0, None, text + suffix))
    return messages


def send_columns(sends: PlainSends, cluster: str, multi_tags: bool,
                 born_host: str) -> SendColumns | None:
    """The messages of ``sends`` in the store's columns (``SendColumns``), shaped as
    ``plain_messages`` shapes them (the same stored text, flags, tags and index keys); None
    when a message is not plain after all. A group whose texts are each a UNIQ_KEY alone
    (tidemq's producer's commonest) is read in a few C calls; any other text is read back
    message by message, as ``plain_messages`` does."""
    texts = sends.properties
    count = len(texts)
    parts = list(map(str.partition, texts, repeat(NAME_VALUE_SEPARATOR)))
    values = list(map(_VALUE, parts))
    tags: list[str | None] | None = None
    keys: list[Sequence[str]]
    if (
        list(map(_NAME, parts)).count(_UNIQ_KEY) == count
        and "" not in values
        and PROPERTY_SEPARATOR not in "".join(values)
    ):
        keys = list(zip(values))  # what index_keys gives for a UNIQ_KEY alone
    else:
        keys = []
        tags = []
        for text in texts:
            properties = _plain_properties(text)
            if properties is None:
                return None
            tags.append(properties.get(PROPERTY_TAGS))
            keys.append(index_keys(properties))
        if tags.count(None) == count:
            tags = None
    suffix = PROPERTY_SEPARATOR + PROPERTY_CLUSTER + NAME_VALUE_SEPARATOR + cluster
    sys_flags = sends.sys_flags
    return SendColumns(
        sends.topic, sends.queue_ids, sends.bodies, list(map(add, texts, repeat(suffix))),
        sends.flags,
        list(map(or_, sys_flags, repeat(SYSFLAG_MULTI_TAGS))) if multi_tags else sys_flags,
        sends.born_timestamps, born_host, tags, keys)

"""Message trace records in RocketMQ's trace data format (encode and decode, no I/O).

A client with tracing on writes, for each message it touches, a short text record into the
trace topic (``RMQ_SYS_TRACE_TOPIC`` unless configured otherwise). Many records share one
trace message: its body is the records one after the other, its KEYS the message ids (and
the messages' own keys) the records talk about, so that a query by key on the trace topic
finds every record of one message. The format is RocketMQ's (its TraceDataEncoder), so
traces written by the Apache clients' ``enableMsgTrace`` read the same way and theirs read
ours (docs/protocol.md, "Message trace").

Layout. Fields of a record are separated by U+0001, and each record ends with U+0002. The
first field names the type; the others follow in a fixed order per type:

- ``Pub``: timestamp ms, region id, producer group, topic, msg id, tags, keys, store host,
  body length, cost ms, message type (ordinal: 0 normal, 1 transaction half, 2 transaction
  commit, 3 delay), offset msg id, success (``true``/``false``) [, client host].
- ``SubBefore``: timestamp ms, region id, consumer group, request id, msg id, retry times,
  keys [, client host].
- ``SubAfter``: request id, msg id, cost ms, success, keys [, context code (0 success,
  1 time out, 2 exception, 3 returned null, 4 failed) [, timestamp ms [, consumer group
  [, client host]]]].
- ``EndTransaction``: timestamp ms, region id, producer group, topic, msg id, tags, keys,
  store host, message type, transaction id, transaction state (``COMMIT_MESSAGE``,
  ``ROLLBACK_MESSAGE``, ``UNKNOW``), from transaction check [, client host].

Bracketed fields are optional: older writers stop earlier. The trailing client host is
tidemq's addition (the client id); RocketMQ's readers ignore fields past the ones they
know, and read a Pub's 15th field as its client host themselves. Java writes a missing
string as ``null`` and splits records dropping trailing empty fields, so a writer must
never leave the last field empty: ``encode`` writes ``null`` for a missing value, and
``decode`` reads ``null`` back as None.

A reader meets data written by anyone: ``decode`` skips a record it cannot parse (unknown
type, too few fields, a number that is not one) instead of failing the whole trace.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

CONTENT_SEPARATOR = "\x01"  # between the fields of one record
FIELD_SEPARATOR = "\x02"  # after each record
TRACE_TOPIC_DEFAULT = "RMQ_SYS_TRACE_TOPIC"
TRACE_PRODUCER_GROUP = "_INNER_TRACE_PRODUCER"  # RocketMQ's group of the trace producer
REGION_DEFAULT = "DefaultRegion"  # RocketMQ's region id when the broker sends none
_NULL = "null"


class TraceType(enum.Enum):
    """The four kinds of trace record."""

    PUB = "Pub"
    SUB_BEFORE = "SubBefore"
    SUB_AFTER = "SubAfter"
    END_TRANSACTION = "EndTransaction"


class MessageType(enum.IntEnum):
    """RocketMQ's MessageType, written as its ordinal."""

    NORMAL = 0
    TRANSACTION_HALF = 1
    TRANSACTION_COMMIT = 2
    DELAY = 3


class ConsumeReturnType(enum.IntEnum):
    """RocketMQ's ConsumeReturnType: why a consume call ended (SubAfter's context code)."""

    SUCCESS = 0
    TIME_OUT = 1
    EXCEPTION = 2
    RETURNNULL = 3
    FAILED = 4


@dataclass(slots=True)
class TraceRecord:
    """One trace record. Which attributes mean something depends on ``type`` (see the
    module docstring); the others stay at their defaults.

    Attributes:
        type: Pub, SubBefore, SubAfter or EndTransaction.
        msg_id: the message's client id (UNIQ_KEY), as RocketMQ clients show it.
        timestamp_ms: when it happened (SubAfter: when consuming began; 0 if not written).
        region_id: the broker's region.
        group: producer group (Pub, EndTransaction) or consumer group (SubBefore/After).
        topic, tags, keys: the message's (keys space-separated, as the KEYS property).
        store_host: the broker address the message was sent to.
        body_length: body bytes.
        cost_ms: how long the send or the consume call took (per message).
        msg_type: normal, transaction half or commit, delay (ordinal of MessageType).
        offset_msg_id: the broker's offset message id.
        success: the send was stored / the consume call succeeded.
        request_id: pairs a SubBefore with its SubAfter (one per consume call).
        retry_times: how often the message had been consumed before (SubBefore).
        context_code: a ConsumeReturnType ordinal (SubAfter).
        transaction_id, transaction_state, from_transaction_check: EndTransaction.
        client_host: the writing client's id (tidemq writes it; see the module docstring).
    """

    type: TraceType
    msg_id: str
    timestamp_ms: int = 0
    region_id: str | None = REGION_DEFAULT
    group: str | None = None
    topic: str | None = None
    tags: str | None = None
    keys: str | None = None
    store_host: str | None = None
    body_length: int = 0
    cost_ms: int = 0
    msg_type: int = MessageType.NORMAL
    offset_msg_id: str | None = None
    success: bool = True
    request_id: str | None = None
    retry_times: int = 0
    context_code: int = ConsumeReturnType.SUCCESS
    transaction_id: str | None = None
    transaction_state: str | None = None
    from_transaction_check: bool = False
    client_host: str | None = None


def _text(value: str | None) -> str:
    # A separator inside a value would split the record; a tag or key never holds one
    # legitimately, so it is replaced rather than escaped (the format has no escape).
    if value is None or value == "":
        return _NULL
    if CONTENT_SEPARATOR in value or FIELD_SEPARATOR in value:
        return value.replace(CONTENT_SEPARATOR, " ").replace(FIELD_SEPARATOR, " ")
    return value


def _flag(value: bool) -> str:
    return "true" if value else "false"


def encode_record(record: TraceRecord) -> str:
    """The record as RocketMQ's trace text, its trailing U+0002 included."""
    kind = record.type
    if kind is TraceType.PUB:
        fields = (
            "Pub", str(record.timestamp_ms), _text(record.region_id), _text(record.group),
            _text(record.topic), _text(record.msg_id), _text(record.tags), _text(record.keys),
            _text(record.store_host), str(record.body_length), str(record.cost_ms),
            str(int(record.msg_type)), _text(record.offset_msg_id), _flag(record.success),
            _text(record.client_host),
        )
    elif kind is TraceType.SUB_BEFORE:
        fields = (
            "SubBefore", str(record.timestamp_ms), _text(record.region_id),
            _text(record.group), _text(record.request_id), _text(record.msg_id),
            str(record.retry_times), _text(record.keys), _text(record.client_host),
        )
    elif kind is TraceType.SUB_AFTER:
        fields = (
            "SubAfter", _text(record.request_id), _text(record.msg_id), str(record.cost_ms),
            _flag(record.success), _text(record.keys), str(int(record.context_code)),
            str(record.timestamp_ms), _text(record.group), _text(record.client_host),
        )
    else:
        fields = (
            "EndTransaction", str(record.timestamp_ms), _text(record.region_id),
            _text(record.group), _text(record.topic), _text(record.msg_id),
            _text(record.tags), _text(record.keys), _text(record.store_host),
            str(int(record.msg_type)), _text(record.transaction_id),
            _text(record.transaction_state), _flag(record.from_transaction_check),
            _text(record.client_host),
        )
    return CONTENT_SEPARATOR.join(fields) + FIELD_SEPARATOR


def encode_records(records: Iterable[TraceRecord]) -> str:
    """Records one after the other: the body of one trace message (as text)."""
    return "".join(encode_record(record) for record in records)


def trace_keys(record: TraceRecord) -> list[str]:
    """The keys a trace message holding ``record`` is indexed by: its msg id and the
    message's own keys (RocketMQ's TraceTransferBean transKey)."""
    keys = [record.msg_id]
    if record.keys:
        keys.extend(k for k in record.keys.split(" ") if k)
    return keys


def _value(text: str) -> str | None:
    return None if text == _NULL or text == "" else text


def _decode_pub(line: list[str]) -> TraceRecord:
    record = TraceRecord(
        TraceType.PUB, msg_id=line[5], timestamp_ms=int(line[1]), region_id=_value(line[2]),
        group=_value(line[3]), topic=_value(line[4]), tags=_value(line[6]),
        keys=_value(line[7]), store_host=_value(line[8]), body_length=int(line[9]),
        cost_ms=int(line[10]), msg_type=int(line[11]),
    )
    if len(line) == 13:  # the oldest writers: no offset msg id
        record.success = line[12] == "true"
    elif len(line) >= 14:
        record.offset_msg_id = _value(line[12])
        record.success = line[13] == "true"
        if len(line) >= 15:
            record.client_host = _value(line[14])
    return record


def _decode_sub_before(line: list[str]) -> TraceRecord:
    return TraceRecord(
        TraceType.SUB_BEFORE, msg_id=line[5], timestamp_ms=int(line[1]),
        region_id=_value(line[2]), group=_value(line[3]), request_id=_value(line[4]),
        retry_times=int(line[6]), keys=_value(line[7]) if len(line) > 7 else None,
        client_host=_value(line[8]) if len(line) > 8 else None,
    )


def _decode_sub_after(line: list[str]) -> TraceRecord:
    record = TraceRecord(
        TraceType.SUB_AFTER, msg_id=line[2], request_id=_value(line[1]),
        cost_ms=int(line[3]), success=line[4] == "true",
        keys=_value(line[5]) if len(line) > 5 else None, region_id=None,
    )
    if len(line) > 6:
        record.context_code = int(line[6])
    if len(line) > 7:
        record.timestamp_ms = int(line[7])
    if len(line) > 8:
        record.group = _value(line[8])
    if len(line) > 9:
        record.client_host = _value(line[9])
    return record


def _decode_end_transaction(line: list[str]) -> TraceRecord:
    return TraceRecord(
        TraceType.END_TRANSACTION, msg_id=line[5], timestamp_ms=int(line[1]),
        region_id=_value(line[2]), group=_value(line[3]), topic=_value(line[4]),
        tags=_value(line[6]), keys=_value(line[7]), store_host=_value(line[8]),
        msg_type=int(line[9]), transaction_id=_value(line[10]),
        transaction_state=_value(line[11]), from_transaction_check=line[12] == "true",
        client_host=_value(line[13]) if len(line) > 13 else None,
    )


# Per type: the decoder and the fewest fields a record must have.
_DECODERS = {
    "Pub": (_decode_pub, 13),
    "SubBefore": (_decode_sub_before, 7),
    "SubAfter": (_decode_sub_after, 5),
    "EndTransaction": (_decode_end_transaction, 13),
}


def decode_records(data: str | bytes) -> list[TraceRecord]:
    """The records of one trace message's body, in order; unparseable ones are skipped.

    Args:
        data: the body (UTF-8 bytes) or its text.
    """
    if isinstance(data, bytes | bytearray | memoryview):
        data = bytes(data).decode("utf-8", errors="replace")
    records: list[TraceRecord] = []
    for chunk in data.split(FIELD_SEPARATOR):
        if not chunk:
            continue
        line = chunk.split(CONTENT_SEPARATOR)
        decoder = _DECODERS.get(line[0])
        if decoder is None or len(line) < decoder[1]:
            continue
        try:
            records.append(decoder[0](line))
        except ValueError:
            continue  # a number that is not one: someone else's malformed record
    return records

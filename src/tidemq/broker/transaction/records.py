"""The messages a transaction is made of, and the op record that ends one.

Every shape here is RocketMQ's (docs/protocol.md §4.9, §4.10, §6.2, §11.1), so a store written
by tidemq reads as a RocketMQ store and a RocketMQ client's transaction API works unchanged.

Half message (what a producer sends with ``TRAN_MSG=true``)::

    topic   RMQ_SYS_TRANS_HALF_TOPIC, queue 0
    props   the producer's, plus REAL_TOPIC = the topic it named, REAL_QID = its queue id
    sysflag transaction bits reset to NOT (0), so the store gives it a consume-queue entry
            in the half topic (no consumer subscribes to that topic)

Committed message (END_TRANSACTION commit, or a check answered with commit)::

    topic / queue        REAL_TOPIC / REAL_QID of the half
    props                the half's minus REAL_TOPIC, REAL_QID and TRAN_MSG
    sysflag              the half's with transaction type COMMIT (8)
    PREPAREDTRANSACTIONOFFSET = the half's commit-log offset (how a restart finds a commit
                                whose op record a crash lost; see service.py)
    body, flag, born time and host, reconsume times: the half's

Op record (RMQ_SYS_TRANS_OP_HALF_TOPIC, the half queue's id, 0)::

    TAGS  "d" (RocketMQ's REMOVETAG: "these halves are done")
    body  half queue offsets in decimal ASCII joined by ",", e.g. b"1742" or b"1742,1745"
          (one offset is RocketMQ 4.x's form, several in one record 5.x's)
    TRAN_OUTCOME  COMMIT | ROLLBACK | DISCARD, for every half named (tidemq's; RocketMQ's
                  reader ignores it)
    PGROUP, __transactionId__  of the half, when the record names one half that had them

Discarded half (checked transactionCheckMax times without an answer): a copy of the half in
TRANS_CHECK_MAX_TIME_TOPIC queue 0, properties kept (REAL_TOPIC names where it was headed).

CHECK_TRANSACTION_STATE (broker to producer, oneway): header fields of §4.10; the body is the
half's stored record re-encoded with topic REAL_TOPIC and queue REAL_QID, every other field
(offsets, store host, properties) as stored, so the producer sees the message it sent.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from tidemq.broker.topic_config_manager import (
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
)
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import CheckTransactionStateRequestHeader
from tidemq.protocol.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SYSFLAG_TRANSACTION_MASK,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    MessageExt,
    encode_properties,
    encode_record,
    pack_host,
)
from tidemq.store.interface import StoreMessage

HALF_TOPIC = RMQ_SYS_TRANS_HALF_TOPIC
OP_TOPIC = RMQ_SYS_TRANS_OP_HALF_TOPIC
DISCARD_TOPIC = TRANS_CHECK_MAX_TIME_TOPIC
HALF_QUEUE_ID = 0  # RocketMQ stores every half message in queue 0 of the half topic
OP_REMOVE_TAG = "d"  # RocketMQ's TransactionalMessageUtil.REMOVETAG
PROPERTY_TRANSACTION_OUTCOME = "TRAN_OUTCOME"


class Outcome(enum.StrEnum):
    """How a half message ended."""

    COMMIT = "COMMIT"  # stored to its real topic
    ROLLBACK = "ROLLBACK"  # dropped
    DISCARD = "DISCARD"  # never answered: copied to TRANS_CHECK_MAX_TIME_TOPIC


class NotAHalfMessage(ValueError):
    """A stored record cannot be treated as a half message; the text says why."""


def parse_boolean(text: str | None) -> bool:
    """Java's Boolean.parseBoolean, as RocketMQ reads TRAN_MSG: "true" in any case (blanks
    around it allowed), everything else false."""
    return text is not None and text.strip().lower() == "true"


def is_half_message(message: StoreMessage) -> bool:
    """True when a message sent by a producer must be stored as a transaction half.

    RocketMQ's rule: ``TRAN_MSG`` is true, unless the message is a consumer's retry that is
    also delayed (an old broker left TRAN_MSG on committed messages, and their retries must
    not become halves again).
    """
    properties = message.properties
    if not parse_boolean(properties.get(PROPERTY_TRANSACTION_PREPARED)):
        return False
    delay = properties.get(PROPERTY_DELAY_TIME_LEVEL, "").strip()
    return not (message.reconsume_times > 0 and delay not in ("", "0"))


def to_half(message: StoreMessage) -> StoreMessage:
    """The half message to store for a transactional send (module docstring).

    ``message.properties`` gains REAL_TOPIC / REAL_QID; a new StoreMessage is returned.
    """
    properties = message.properties
    properties[PROPERTY_REAL_TOPIC] = message.topic
    properties[PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
    return StoreMessage(
        topic=HALF_TOPIC,
        queue_id=HALF_QUEUE_ID,
        body=message.body,
        properties=properties,
        flag=message.flag,
        sysflag=(message.sysflag & ~SYSFLAG_TRANSACTION_MASK) | TRANSACTION_NOT_TYPE,
        born_timestamp=message.born_timestamp,
        born_host=message.born_host,
        reconsume_times=message.reconsume_times,
    )


def make_half(message: StoreMessage) -> None:
    """Turn ``message`` into its half message in place: ``to_half`` without a new object
    (a batch of halves is made this way, one message at a time)."""
    properties = message.properties
    properties[PROPERTY_REAL_TOPIC] = message.topic
    properties[PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
    message.topic = HALF_TOPIC
    message.queue_id = HALF_QUEUE_ID
    message.sysflag = (message.sysflag & ~SYSFLAG_TRANSACTION_MASK) | TRANSACTION_NOT_TYPE
    message.properties_text = None  # the properties changed: the store renders them


def real_destination(half: MessageExt) -> tuple[str, int]:
    """``(REAL_TOPIC, REAL_QID)`` of a stored half message.

    Raises:
        NotAHalfMessage: the record is not in the half topic or lacks a usable
            REAL_TOPIC / REAL_QID.
    """
    if half.topic != HALF_TOPIC:
        raise NotAHalfMessage(
            f"the record at commit-log offset {half.physical_offset} is a message of topic "
            f"{half.topic}, not a half message of {HALF_TOPIC}"
        )
    topic = half.properties.get(PROPERTY_REAL_TOPIC)
    queue_text = half.properties.get(PROPERTY_REAL_QUEUE_ID, "")
    if not topic or not queue_text.isdigit():
        raise NotAHalfMessage(
            f"half message at commit-log offset {half.physical_offset} has REAL_TOPIC="
            f"{topic!r} and REAL_QID={queue_text!r}; it cannot be delivered"
        )
    return topic, int(queue_text)


def committed_message(half: MessageExt) -> StoreMessage:
    """The message a commit stores in the half's real topic and queue (module docstring).

    Raises:
        NotAHalfMessage: as ``real_destination``.
    """
    topic, queue_id = real_destination(half)
    properties = dict(half.properties)
    for name in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TRANSACTION_PREPARED):
        properties.pop(name, None)
    return StoreMessage(
        topic=topic,
        queue_id=queue_id,
        body=half.body,
        properties=properties,
        flag=half.flag,
        sysflag=(half.sysflag & ~SYSFLAG_TRANSACTION_MASK) | TRANSACTION_COMMIT_TYPE,
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=half.physical_offset,
    )


def discarded_message(half: MessageExt) -> StoreMessage:
    """The copy of a never-answered half kept in TRANS_CHECK_MAX_TIME_TOPIC."""
    return StoreMessage(
        topic=DISCARD_TOPIC,
        queue_id=0,
        body=half.body,
        properties=dict(half.properties),
        flag=half.flag,
        sysflag=half.sysflag & ~SYSFLAG_TRANSACTION_MASK,
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        reconsume_times=half.reconsume_times,
    )


def transaction_id_of(properties: dict[str, str]) -> str:
    """The id a producer gave its transaction: ``__transactionId__``, else the UNIQ_KEY."""
    return (
        properties.get(PROPERTY_TRANSACTION_ID)
        or properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        or ""
    )


def op_message(
    half_queue_offsets: Sequence[int],
    outcome: Outcome,
    producer_group: str | None = None,
    transaction_id: str | None = None,
) -> StoreMessage:
    """The op record that marks the halves at ``half_queue_offsets`` as ended with
    ``outcome``; ``producer_group`` and ``transaction_id`` name a lone half's."""
    properties = {PROPERTY_TAGS: OP_REMOVE_TAG, PROPERTY_TRANSACTION_OUTCOME: outcome.value}
    if producer_group:
        properties[PROPERTY_PRODUCER_GROUP] = producer_group
    if transaction_id:
        properties[PROPERTY_TRANSACTION_ID] = transaction_id
    return StoreMessage(
        topic=OP_TOPIC,
        queue_id=HALF_QUEUE_ID,
        body=",".join(map(str, half_queue_offsets)).encode("ascii"),
        properties=properties,
    )


def op_half_offsets(op: MessageExt) -> list[int]:
    """The half queue offsets an op record marks as ended; [] for a record that is not one.

    Reads one offset (RocketMQ 4.x, tidemq) or several joined by "," (RocketMQ 5.x).
    """
    if op.properties.get(PROPERTY_TAGS) != OP_REMOVE_TAG:
        return []
    offsets = []
    for piece in op.body.split(b","):
        piece = piece.strip()
        if piece.isdigit():
            offsets.append(int(piece))
    return offsets


def op_outcome(op: MessageExt) -> Outcome | None:
    """The outcome an op record names; None for a record written without one (RocketMQ)."""
    text = op.properties.get(PROPERTY_TRANSACTION_OUTCOME)
    try:
        return Outcome(text) if text else None
    except ValueError:
        return None


def check_request(half: MessageExt) -> RemotingCommand:
    """CHECK_TRANSACTION_STATE for a stored half message (oneway; module docstring).

    Raises:
        NotAHalfMessage: as ``real_destination``.
    """
    topic, queue_id = real_destination(half)
    unique_key = half.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    header = CheckTransactionStateRequestHeader(
        tran_state_table_offset=half.queue_offset,
        commit_log_offset=half.physical_offset,
        msg_id=unique_key,
        transaction_id=unique_key,
        offset_msg_id=half.offset_msg_id,
    )
    born_address, born_port, _ = pack_host(half.born_host)
    store_address, store_port, _ = pack_host(half.store_host)
    body = encode_record(
        topic=topic.encode("utf-8"),
        body=half.body,
        properties=encode_properties(half.properties).encode("utf-8"),
        queue_id=queue_id,
        flag=half.flag,
        queue_offset=half.queue_offset,
        physical_offset=half.physical_offset,
        sysflag=half.sysflag,
        born_timestamp=half.born_timestamp,
        born_host=(born_address, born_port),
        store_timestamp=half.store_timestamp,
        store_host=(store_address, store_port),
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=half.prepared_transaction_offset,
        crc=half.body_crc,
    )
    return RemotingCommand.request(
        RequestCode.CHECK_TRANSACTION_STATE, header.to_ext_fields(), bytes(body), oneway=True
    )

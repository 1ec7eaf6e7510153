"""The exactly-once properties of a half message, and the message its commit stores.

A half of the exactly-once Spark sink carries its writer's identity as properties (set by
the client as batch properties, client/exactly_once.py; the names are the same there)::

    EOS_QUERY_ID   the Spark query id (stable across restarts of one checkpoint)
    EOS_BATCH_ID   the micro-batch id (decimal)
    EOS_PARTITION  the Spark partition (diagnostics)
    EOS_WRITER_ID  the task execution's id (a fresh uuid each time a task runs)

and CHECK_IMMUNITY_TIME_IN_SECONDS, its timeout. The committed message loses all five.
"""

from __future__ import annotations

from tidemq.broker.transaction.records import committed_message
from tidemq.protocol.message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    MessageExt,
)
from tidemq.store.interface import StoreMessage

PROPERTY_EOS_QUERY_ID = "EOS_QUERY_ID"
PROPERTY_EOS_BATCH_ID = "EOS_BATCH_ID"
PROPERTY_EOS_PARTITION = "EOS_PARTITION"
PROPERTY_EOS_WRITER_ID = "EOS_WRITER_ID"
EOS_PROPERTIES = (PROPERTY_EOS_QUERY_ID, PROPERTY_EOS_BATCH_ID, PROPERTY_EOS_PARTITION,
                  PROPERTY_EOS_WRITER_ID, PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
# Every property an exactly-once half has that its committed message has not
# (``committed_message`` drops the first three).
EOS_COMMIT_DROPPED = frozenset((PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID,
                                PROPERTY_TRANSACTION_PREPARED, *EOS_PROPERTIES))


def eos_identity(half: MessageExt) -> tuple[str, str, str] | None:
    """``(query id, batch id text, writer id)`` of an exactly-once half, else None."""
    properties = half.properties
    writer = properties.get(PROPERTY_EOS_WRITER_ID)
    if writer is None:
        return None
    return (properties.get(PROPERTY_EOS_QUERY_ID, ""), properties.get(PROPERTY_EOS_BATCH_ID, ""),
            writer)


def eos_committed_message(half: MessageExt) -> StoreMessage:
    """The message an exactly-once half commits to: ``committed_message`` without the
    EOS_* and CHECK_IMMUNITY properties (the consumer sees the row as the sink got it).

    Raises:
        NotAHalfMessage: as ``committed_message``.
    """
    message = committed_message(half)
    properties = message.properties
    for name in EOS_PROPERTIES:
        properties.pop(name, None)
    return message

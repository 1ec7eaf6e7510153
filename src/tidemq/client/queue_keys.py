"""MessageQueue keys of the maps brokers send (TopicStatsTable, ConsumeStats, ResetOffsetBody,
GetConsumerStatusBody, ConsumerRunningInfo.mqTable): fastjson writes ``Map<MessageQueue, V>``
with JSON objects as keys (docs/protocol.md §5), which ``jsonx.loads`` reads as
``JsonObjectKey``."""

from __future__ import annotations

from typing import Any

from tidemq.client.message import MessageQueue
from tidemq.errors import RemoteProtocolError
from tidemq.protocol import jsonx


def message_queue_from_key(key: Any) -> MessageQueue:
    """A MessageQueue from a Map<MessageQueue, ...> key as jsonx reads it.

    Java writes such keys as JSON objects (``jsonx.JsonObjectKey``); a JSON text string or
    ``"topic@broker@queueId"`` are accepted too.

    Raises:
        RemoteProtocolError: the key names no queue.
    """
    try:
        if hasattr(key, "get"):
            return MessageQueue.from_json(key)
        if isinstance(key, str):
            if key.startswith("{"):
                return MessageQueue.from_json(jsonx.loads(key))
            topic, broker_name, queue_id = key.rsplit("@", 2)
            return MessageQueue(topic, broker_name, int(queue_id))
    except (TypeError, ValueError, RemoteProtocolError):
        pass
    raise RemoteProtocolError(f"{key!r} does not name a message queue")

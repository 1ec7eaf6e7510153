"""Returning messages a listener failed on: retry later, or straight to the dead letters.

A clustering consumer never drops a failed message (docs/protocol.md §4.8, §11.1):

1. it asks the broker that stored the message to keep a copy for the group's next try
   (CONSUMER_SEND_MSG_BACK with the message's commit-log offset): the broker stores the copy
   in ``%RETRY%<group>``, delayed by level ``3 + reconsume times`` (10 s, 30 s, 1 min, ...
   with the default levels), or in ``%DLQ%<group>`` once it was retried
   ``max_reconsume_times`` times, or at once when asked with delay level -1;
2. when that request fails (the broker is down, the message is gone), it sends a new message
   to ``%RETRY%<group>`` itself, as the Java client does: same body, flag and properties,
   plus RETRY_TOPIC (the original topic), ORIGIN_MESSAGE_ID, RECONSUME_TIME (reconsume
   times + 1) and MAX_RECONSUME_TIMES, delay level ``3 + reconsume times``. The broker
   routes such a message to the dead letters by the same rule as a send-back.
3. when both fail, the caller keeps the message in flight (its offset is not committed) and
   gives it to the listener again a little later.

The inner producer of step 2 is created on first need and closed with the consumer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from tidemq.client import broker_api
from tidemq.client.instance import ClientInstance
from tidemq.client.message import Message
from tidemq.client.producer import Producer
from tidemq.errors import TidemqError
from tidemq.protocol.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MAX_OFFSET,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_MIN_OFFSET,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    MessageExt,
)
from tidemq.remoting.errors import RemotingError

log = logging.getLogger("tidemq.client")

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
CLIENT_INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"  # RocketMQ's group for this producer
# delayLevel 0 in a send-back lets the broker choose 3 + reconsume times; the client's own
# re-send (step 2) uses the same rule.
RETRY_DELAY_LEVEL_BASE = 3
DELAY_LEVEL_DEAD_LETTER = -1
# Properties a stored message carries that must not travel with a re-sent copy: the broker
# and delay service set them anew (the delay service's DELAY_QUEUE_OFFSET is the broker's
# own marker of a delivery; the client knows it only by name).
_NOT_RESENT = (
    PROPERTY_DELAY_TIME_LEVEL, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID,
    PROPERTY_MIN_OFFSET, PROPERTY_MAX_OFFSET, PROPERTY_TRANSACTION_PREPARED, "CLUSTER",
    "DELAY_QUEUE_OFFSET", PROPERTY_RECONSUME_TIME, PROPERTY_MAX_RECONSUME_TIMES,
)


def retry_topic(group: str) -> str:
    """``%RETRY%<group>``."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dead_letter_topic(group: str) -> str:
    """``%DLQ%<group>``."""
    return DLQ_GROUP_TOPIC_PREFIX + group


def resend_properties(message: MessageExt) -> dict[str, str]:
    """``message``'s properties without those the broker and the delay service set anew
    (delay level, real topic and queue, offsets, cluster, reconsume counters)."""
    return {k: v for k, v in message.properties.items() if k not in _NOT_RESENT}


def resend_copy(message: MessageExt, group: str, max_reconsume_times: int,
                *, dead_letter: bool = False) -> Message:
    """The message step 2 sends to ``%RETRY%<group>`` for ``message`` (module docstring).

    Args:
        message: the consumed message (its topic already the original one).
        group: the consumer group.
        max_reconsume_times: the group's retry limit.
        dead_letter: make the broker put it in the dead letters (reconsume times past the
            limit), for an orderly consumer that used up its local retries.
    """
    properties = resend_properties(message)
    properties.setdefault(PROPERTY_RETRY_TOPIC, message.topic)
    if not properties.get(PROPERTY_ORIGIN_MESSAGE_ID):
        properties[PROPERTY_ORIGIN_MESSAGE_ID] = message.msg_id
    reconsume_times = message.reconsume_times + 1
    if dead_letter:
        reconsume_times = max(reconsume_times, max_reconsume_times + 1)
    properties[PROPERTY_RECONSUME_TIME] = str(reconsume_times)
    properties[PROPERTY_MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    copy = Message(retry_topic(group), message.body, properties=properties, flag=message.flag)
    copy.delay_level = RETRY_DELAY_LEVEL_BASE + message.reconsume_times
    return copy


class SendBack:
    """Hands failed messages back to the brokers (see the module docstring).

    Args:
        instance: the consumer's ClientInstance (broker addresses, connections).
        group: the consumer group.
        max_reconsume_times: retries before the dead letters.
        producer_factory: builds the inner producer of step 2 on first need.
    """

    def __init__(self, instance: ClientInstance, group: str,
                 max_reconsume_times: int, producer_factory: Callable[[], Producer]) -> None:
        self._instance = instance
        self._group = group
        self._max_reconsume_times = max_reconsume_times
        self._producer_factory = producer_factory
        self._producer: Producer | None = None
        self._producer_starting: asyncio.Lock | None = None
        self.sent_back = 0
        self.resent = 0
        self.failed = 0

    async def send(self, message: MessageExt, *, dead_letter: bool = False) -> bool:
        """Send ``message`` back for a retry (or to the dead letters); False when both the
        send-back and the re-send failed."""
        delay_level = DELAY_LEVEL_DEAD_LETTER if dead_letter else 0
        try:
            address = await self._instance.find_master(message.broker_name,
                                                       retry_topic(self._group))
            await broker_api.send_message_back(
                self._instance, address, message, self._group, delay_level=delay_level,
                max_reconsume_times=self._max_reconsume_times,
            )
        except (RemotingError, TidemqError) as e:
            log.info("consumer %s: send-back of %s to %s failed (%s); re-sending it to %s",
                     self._group, message.msg_id, message.broker_name, e,
                     retry_topic(self._group))
        else:
            self.sent_back += 1
            return True
        try:
            producer = await self._inner_producer()
            await producer.send(resend_copy(message, self._group, self._max_reconsume_times,
                                            dead_letter=dead_letter))
        except (RemotingError, TidemqError) as e:
            self.failed += 1
            log.warning("consumer %s: message %s could neither be sent back nor re-sent to %s "
                        "(%s); it stays in flight and is consumed again later", self._group,
                        message.msg_id, retry_topic(self._group), e)
            return False
        self.resent += 1
        return True

    async def send_all(self, messages: Iterable[MessageExt], *, dead_letter: bool = False
                       ) -> tuple[list[MessageExt], list[MessageExt]]:
        """Send each of ``messages`` back, concurrently.

        Returns:
            (messages handed back, messages that could not be).
        """
        todo = list(messages)
        outcomes = await asyncio.gather(*(self.send(m, dead_letter=dead_letter) for m in todo))
        done = [m for m, ok in zip(todo, outcomes, strict=True) if ok]
        failed = [m for m, ok in zip(todo, outcomes, strict=True) if not ok]
        return done, failed

    async def _inner_producer(self) -> Producer:
        if self._producer is not None:
            return self._producer
        if self._producer_starting is None:
            self._producer_starting = asyncio.Lock()
        async with self._producer_starting:
            if self._producer is None:
                producer = self._producer_factory()
                await producer.start()
                self._producer = producer
        return self._producer

    async def close(self) -> None:
        """Close the inner producer, if one was started."""
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.close()

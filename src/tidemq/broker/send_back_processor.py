"""CONSUMER_SEND_MSG_BACK (36): a consumer hands back a message it failed to consume.

Theory of operation (docs/protocol.md §4.8, §11.1)
------------------------------------------------
The request names the message by its commit-log offset and the consumer group. The broker
reads that record and stores a copy for the group's next try:

- to ``%RETRY%<group>`` (created with the group's retryQueueNums queues, perm 6), a random
  queue, reconsume times + 1, delayed by ``delayLevel``, or by ``3 + reconsume times`` when
  the consumer left the choice to the broker (0): the first retry waits 10 s, the next 30 s,
  and so on up the delay levels;
- or, once the message used up its retries, or when the consumer asks for it with
  ``delayLevel < 0``, to ``%DLQ%<group>`` (1 queue), undelayed.

"Used up": the stored copy's reconsume times exceed the group's limit. The limit is the
header's ``maxReconsumeTimes`` (honoured from request version 121, V3_4_9, on), else the
message's MAX_RECONSUME_TIMES property, else the group's retryMaxTimes (16). With the limit
16 a message is consumed 17 times: once, then 16 retries. The same rule
(``dead_letter_due``) routes a message a Java consumer re-sends to ``%RETRY%<group>`` itself
when this request failed (send_processor.py), so both paths agree.

The copy keeps body, flag, sysflag, born time and born host, and every property. It gets
RETRY_TOPIC (the original topic, unless a retried message already has it) and
ORIGIN_MESSAGE_ID (kept if there, else the header's originMsgId, else the message's
UNIQ_KEY, the id its consumer saw, else its offset id). The store host is this broker's.
The copy never carries WAIT: like RocketMQ, the answer does not wait for a disk flush.

Dead-letter topics are created readable and writable (perm 6), as Apache's 4.9.7 broker
creates them (tests/differential/test_retry_delay.py compares the two): an operator, the
admin redrive, or a repair consumer reads a dead-letter queue with a plain pull, and nothing
consumes from it by itself: no consumer subscribes to ``%DLQ%`` topics unless told to.

A retry or dead-letter topic the request creates is registered with the name servers before
the answer (as Apache's broker does, and as an admin's create is): whoever looks its route
up after the answer, an operator or a repair consumer, finds it.

Answers: SUCCESS with an empty header, or an error code whose remark names the group, the
offset and what to do (group unknown, no message at the offset, topic not writable, broker
not writable, store refused).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from tidemq.broker.config import PERM_READ, PERM_WRITE
from tidemq.broker.schedule_service import PROPERTY_DELAY_QUEUE_OFFSET, redirect_delayed
from tidemq.broker.topic_config_manager import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    TopicConfigManager,
)
from tidemq.errors import HeaderFieldError, RemoteProtocolError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import ConsumerSendMsgBackRequestHeader
from tidemq.protocol.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    MessageExt,
    decode_record,
)
from tidemq.store.config_tables import SubscriptionGroupConfig
from tidemq.store.interface import StoreMessage

if TYPE_CHECKING:
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.identity import BrokerIdentity
    from tidemq.broker.role import ReplicationRole
    from tidemq.broker.schedule_service import ScheduleMessageService
    from tidemq.broker.subscription_group_manager import SubscriptionGroupManager
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer
    from tidemq.store.interface import MessageStore

log = logging.getLogger("tidemq.broker")

# Requests whose version is at least V3_4_9 may carry their own maxReconsumeTimes.
VERSION_WITH_MAX_RECONSUME_TIMES = 121

# The DLQ topic of a group has one queue (RocketMQ's DLQ_NUMS_PER_GROUP).
DLQ_QUEUE_NUMS = 1

# Readable, unlike RocketMQ's write-only 2: see the module docstring.
DLQ_PERM = PERM_READ | PERM_WRITE
RETRY_PERM = PERM_READ | PERM_WRITE

# delayLevel 0 lets the broker choose 3 + reconsume times: the first retry waits level 3.
RETRY_DELAY_LEVEL_BASE = 3

# TopicSysFlag bit of a unit-mode consumer's retry topic (RocketMQ's FLAG_UNIT_SUB).
TOPIC_SYS_FLAG_UNIT_SUB = 0x2


def dead_letter_due(reconsume_times: int, max_reconsume_times: int) -> bool:
    """True when a message stored for its ``reconsume_times``-th retry has no retry left.

    Args:
        reconsume_times: the reconsume times the stored copy would carry (the consumed
            message's plus one).
        max_reconsume_times: retries the group allows (``max_reconsume_times_of``).
    """
    return reconsume_times > max_reconsume_times


def max_reconsume_times_of(
    group_config: SubscriptionGroupConfig,
    header_value: int | None,
    request_version: int,
    properties: Mapping[str, str],
) -> int:
    """Retries allowed: the header's (version >= 121), the MAX_RECONSUME_TIMES property's,
    else the group's retryMaxTimes. A negative value means "not set" (the Java client sends
    its default 16 instead of its -1)."""
    if (
        request_version >= VERSION_WITH_MAX_RECONSUME_TIMES
        and header_value is not None
        and header_value >= 0
    ):
        return header_value
    text = properties.get(PROPERTY_MAX_RECONSUME_TIMES, "").strip()
    if text.isdigit():
        return int(text)
    return group_config.retry_max_times


def dead_letter_topic_for(topic_config_manager: TopicConfigManager, group: str) -> str:
    """``%DLQ%<group>``, created (1 queue, perm 6) if the broker does not have it yet."""
    topic = DLQ_GROUP_TOPIC_PREFIX + group
    topic_config_manager.create_topic_for_send_back(topic, DLQ_QUEUE_NUMS, DLQ_PERM)
    return topic


def _absent(topic_config_manager: TopicConfigManager, topics: tuple[str, ...]
            ) -> tuple[str, ...]:
    return tuple(topic for topic in topics if topic_config_manager.get(topic) is None)


class SendBackRefused(Exception):
    """A check failed: ``code`` and ``remark`` are the response to send."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


class SendBackProcessor:
    """Serves CONSUMER_SEND_MSG_BACK for one broker.

    Args:
        config: brokerPermission, brokerName (remarks).
        store: read for the consumed message, written for its retry copy.
        identity: the broker's address (remarks).
        role: a slave refuses send-backs.
        topics: retry and dead-letter topics are created on first use.
        groups: the group's retry queues and max reconsume times.
        schedule: the delay levels' count (a retry waits in SCHEDULE_TOPIC_XXXX).
        register_topics: awaited with the retry or dead-letter topics a request created,
            before its answer: the broker's name-server registration (which logs failures,
            never raises); None: nobody is told (a processor tested alone).
    """

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        identity: BrokerIdentity,
        role: ReplicationRole,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        schedule: ScheduleMessageService,
        register_topics: Callable[[tuple[str, ...]], Awaitable[object]] | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._identity = identity
        self._role = role
        self._topics = topics
        self._groups = groups
        self._schedule = schedule
        self._register_topics = register_topics
        self._random = random.Random()

    def register(self, server: RemotingServer) -> None:
        """Register the send-back handler on ``server``."""
        server.register(RequestCode.CONSUMER_SEND_MSG_BACK, self.handle)

    async def handle(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        """Answer one send-back request. Never raises for bad input."""
        try:
            header = ConsumerSendMsgBackRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as exc:
            return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, str(exc))
        group = header.group
        absent = _absent(self._topics, (RETRY_GROUP_TOPIC_PREFIX + group,
                                        DLQ_GROUP_TOPIC_PREFIX + group))
        try:
            self._send_back(header, request)
        except SendBackRefused as refused:
            return RemotingCommand.response_to(request, refused.code, refused.remark)
        finally:
            # Registered even when the copy was refused after its topic was made: the topic
            # exists on this broker either way.
            created = tuple(topic for topic in absent if self._topics.get(topic) is not None)
            if created and self._register_topics is not None:
                await self._register_topics(created)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    def _send_back(
        self,
        header: ConsumerSendMsgBackRequestHeader,
        request: RemotingCommand,
    ) -> None:
        config = self._config
        group = header.group
        self._check_writable(group)
        group_config = self._groups.find_subscription_group_config(group)
        if group_config is None:
            raise SendBackRefused(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group {group} does not exist on broker {config.broker_name}; "
                "create it with tidemq admin updateSubGroup or set "
                "autoCreateSubscriptionGroup=true",
            )
        if group_config.retry_queue_nums <= 0:
            # RocketMQ's rule: a group without retry queues does not retry; the message is
            # dropped and the consumer is told all is well.
            log.debug("group %s has retryQueueNums=%d: message at offset %d not retried",
                     group, group_config.retry_queue_nums, header.offset)
            return
        retry_topic = RETRY_GROUP_TOPIC_PREFIX + group
        topic_config = self._topics.create_topic_for_send_back(
            retry_topic,
            group_config.retry_queue_nums,
            RETRY_PERM,
            TOPIC_SYS_FLAG_UNIT_SUB if header.unit_mode else 0,
        )
        if not topic_config.perm & PERM_WRITE:
            raise SendBackRefused(
                ResponseCode.NO_PERMISSION,
                f"retry topic {retry_topic} is not writable on broker {config.broker_name} "
                f"(perm={topic_config.perm}); give it write permission with "
                f"tidemq admin updateTopic -t {retry_topic} -p 6",
            )
        consumed = self._look_up(header)
        message = _retry_copy(consumed, header.origin_msg_id)
        properties = message.properties
        max_reconsume_times = max_reconsume_times_of(
            group_config, header.max_reconsume_times, request.version, consumed.properties
        )
        if header.delay_level < 0 or dead_letter_due(
            message.reconsume_times, max_reconsume_times
        ):
            message.topic = dead_letter_topic_for(self._topics, group)
            message.queue_id = self._random.randrange(DLQ_QUEUE_NUMS)
            properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)
            log.debug(
                "message %s of group %s (reconsumed %d times, max %d, delayLevel %d) "
                "stored in %s",
                properties.get(PROPERTY_ORIGIN_MESSAGE_ID), group, consumed.reconsume_times,
                max_reconsume_times, header.delay_level, message.topic,
            )
        else:
            message.topic = retry_topic
            message.queue_id = self._random.randrange(group_config.retry_queue_nums)
            delay_level = header.delay_level or RETRY_DELAY_LEVEL_BASE + consumed.reconsume_times
            properties[PROPERTY_DELAY_TIME_LEVEL] = str(delay_level)
            message = redirect_delayed(message, self._schedule.level_count)
        result = self._store.put_message(message)
        if not result.ok:
            raise SendBackRefused(
                ResponseCode.SYSTEM_ERROR,
                f"the store refused the retry copy of the message at offset {header.offset} "
                f"for group {group}: {result.status.value}"
                + (f" ({result.remark})" if result.remark else ""),
            )

    def _check_writable(self, group: str) -> None:
        config = self._config
        refusal = self._role.write_refusal(f"send-backs (group {group})")
        if refusal is not None:
            raise SendBackRefused(ResponseCode.SERVICE_NOT_AVAILABLE, refusal)
        if not config.broker_permission & PERM_WRITE:
            raise SendBackRefused(
                ResponseCode.NO_PERMISSION,
                f"broker {config.broker_name} at {self._identity.address} is not writable "
                f"(brokerPermission={config.broker_permission}); group {group} cannot send "
                "messages back until write permission is given back (brokerPermission=6)",
            )

    def _look_up(self, header: ConsumerSendMsgBackRequestHeader) -> MessageExt:
        store = self._store
        record = store.read_message(header.offset) if header.offset >= 0 else None
        if record is None:
            raise SendBackRefused(
                ResponseCode.SYSTEM_ERROR,
                f"no message starts at commit-log offset {header.offset} on broker "
                f"{self._config.broker_name} (group {header.group}); it may have expired "
                f"(the log now starts at {store.commit_log_min_offset()}), or the "
                "offset is not a message's commitLogOffset",
            )
        try:
            return decode_record(record)
        except RemoteProtocolError as exc:
            raise SendBackRefused(
                ResponseCode.SYSTEM_ERROR,
                f"the message at commit-log offset {header.offset} does not decode: {exc}",
            ) from None



def _retry_copy(consumed: MessageExt, origin_msg_id: str | None) -> StoreMessage:
    """The consumed message as it will be stored again (topic and queue are set after)."""
    properties = dict(consumed.properties)
    properties.pop(PROPERTY_WAIT_STORE_MSG_OK, None)
    properties.pop(PROPERTY_DELAY_QUEUE_OFFSET, None)  # it names an earlier delivery
    if not properties.get(PROPERTY_RETRY_TOPIC):
        properties[PROPERTY_RETRY_TOPIC] = consumed.topic
    if not properties.get(PROPERTY_ORIGIN_MESSAGE_ID, "").strip():
        properties[PROPERTY_ORIGIN_MESSAGE_ID] = (
            (origin_msg_id or "").strip()
            or properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            or consumed.offset_msg_id
        )
    return StoreMessage(
        topic=consumed.topic,
        queue_id=consumed.queue_id,
        body=consumed.body,
        properties=properties,
        flag=consumed.flag,
        sysflag=consumed.sysflag,
        born_timestamp=consumed.born_timestamp,
        born_host=consumed.born_host,
        reconsume_times=consumed.reconsume_times + 1,
    )

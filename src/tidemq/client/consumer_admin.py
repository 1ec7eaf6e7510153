"""A push consumer's answers to the admin requests its brokers forward (docs/protocol.md §2, §5.5).

A broker asks a consumer on the consumer's own connection, for an admin tool:

- GET_CONSUMER_RUNNING_INFO (307; ``consumerGroup``, ``clientId``, ``jstackEnable``): a
  ConsumerRunningInfo body::

      {"properties": {name: string value},                  settings, start time, version
       "subscriptionSet": [SubscriptionData, ...],
       "mqTable": {MessageQueue: ProcessQueueInfo},          the queues owned now
       "statusTable": {topic: ConsumeStatus},
       "jstack": "..."}                                      only with jstackEnable

  ProcessQueueInfo carries ``commitOffset``, ``cachedMsgMinOffset``, ``cachedMsgMaxOffset``,
  ``cachedMsgCount``, ``cachedMsgSizeInMiB``, ``locked``, ``lastLockTimestamp``, ``droped``
  (sic) and RocketMQ's other fields (0 where tidemq keeps no such figure). ConsumeStatus has
  RocketMQ's rate fields (``pullRT``, ``pullTPS``, ``consumeRT``, ``consumeOKTPS``,
  ``consumeFailedTPS``: tidemq measures no rates yet, so 0.0) and ``consumeFailedMsgs``.
  ``jstack`` holds the stacks of the consumer process's threads and asyncio tasks.
- GET_CONSUMER_STATUS_FROM_CLIENT (221; ``topic``, ``group``): GetConsumerStatusBody
  ``{"messageQueueTable": {MessageQueue: offset}}``, this consumer's offsets of the queues of
  ``topic`` it owns.
- RESET_CONSUMER_CLIENT_OFFSET (220, oneway; ``topic``, ``group``; ResetOffsetBody
  ``{"offsetTable": {MessageQueue: offset}}``): the consumer moves to those offsets
  (``PushConsumer.reset_offsets``).

A request for another group gets SYSTEM_ERROR naming the group this consumer serves.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidemq.client.message import MessageQueue
from tidemq.client.queue_keys import message_queue_from_key
from tidemq.errors import HeaderFieldError, RemoteProtocolError
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import (
    GetConsumerRunningInfoRequestHeader,
    GetConsumerStatusRequestHeader,
    ResetOffsetRequestHeader,
)

if TYPE_CHECKING:
    from tidemq.client.push_consumer import PushConsumer

log = logging.getLogger("tidemq.client")

_MIB = 1024 * 1024


def register_consumer_admin(consumer: PushConsumer) -> None:
    """Answer the broker's GET_CONSUMER_RUNNING_INFO, GET_CONSUMER_STATUS_FROM_CLIENT and
    RESET_CONSUMER_CLIENT_OFFSET for ``consumer`` on its client instance."""
    answers = _ConsumerAdminAnswers(consumer)
    remoting = consumer.instance.remoting
    remoting.register(RequestCode.GET_CONSUMER_RUNNING_INFO, answers.running_info)
    remoting.register(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, answers.consumer_status)
    remoting.register(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, answers.reset_offset)


def running_info(consumer: PushConsumer, *, jstack: bool = False) -> dict[str, Any]:
    """The ConsumerRunningInfo document of ``consumer`` (see the module docstring)."""
    stats = consumer.stats()
    properties = {
        "consumerGroup": consumer.group,
        "messageModel": consumer.message_model.value,
        "consumeFromWhere": consumer.consume_from.value,
        "consumeMessageBatchMaxSize": str(consumer.consume_message_batch_max_size),
        "pullBatchSize": str(consumer.pull_batch_size),
        "pullThresholdForQueue": str(consumer.pull_threshold_for_queue),
        "maxReconsumeTimes": str(consumer.max_reconsume_times),
        "PROP_CONSUMEORDERLY": str(consumer.orderly).lower(),
        "PROP_CONSUME_TYPE": "CONSUME_PASSIVELY",
        "PROP_THREADPOOL_CORE_SIZE": str(consumer.consume_concurrency),
        "PROP_CONSUMER_START_TIMESTAMP": str(consumer.start_timestamp_ms),
        "PROP_CLIENT_VERSION": "tidemq",
    }
    mq_table = {}
    for queue in consumer.assignment():
        process_queue = consumer.process_queues[queue]
        in_flight = process_queue.message_count
        mq_table[queue] = {
            "commitOffset": consumer.offset_store.read(queue) or 0,
            "cachedMsgMinOffset": process_queue.commit_offset() if in_flight else 0,
            "cachedMsgMaxOffset": max(process_queue.max_offset_pulled, 0) if in_flight else 0,
            "cachedMsgCount": in_flight,
            "cachedMsgSizeInMiB": process_queue.message_bytes // _MIB,
            "transactionMsgMinOffset": 0,
            "transactionMsgMaxOffset": 0,
            "transactionMsgCount": 0,
            "locked": process_queue.locked,
            "tryUnlockTimes": 0,
            "lastLockTimestamp": process_queue.last_lock_ms,
            "droped": process_queue.dropped,
            "lastPullTimestamp": 0,
            "lastConsumeTimestamp": 0,
        }
    status = {"pullRT": 0.0, "pullTPS": 0.0, "consumeRT": 0.0, "consumeOKTPS": 0.0,
              "consumeFailedTPS": 0.0, "consumeFailedMsgs": stats.failed}
    document: dict[str, Any] = {
        "properties": properties,
        "subscriptionSet": consumer.subscription_data(),
        "mqTable": mq_table,
        "statusTable": {topic: dict(status) for topic in consumer.topics()},
    }
    if jstack:
        document["jstack"] = _stacks()
    return document


class _ConsumerAdminAnswers:
    def __init__(self, consumer: PushConsumer) -> None:
        self._consumer = consumer

    async def running_info(self, request: RemotingCommand, connection: object
                           ) -> RemotingCommand:
        return self._answer(
            request, GetConsumerRunningInfoRequestHeader, lambda header: header.consumer_group,
            lambda header: running_info(self._consumer, jstack=header.jstack_enable))

    async def consumer_status(self, request: RemotingCommand, connection: object
                              ) -> RemotingCommand:
        return self._answer(
            request, GetConsumerStatusRequestHeader, lambda header: header.group,
            lambda header: {"messageQueueTable": self._consumer.consumer_offsets(header.topic)})

    def _answer(self, request: RemotingCommand, header_class: Any,
                group_of: Callable[[Any], str], document_of: Callable[[Any], Any]
                ) -> RemotingCommand:
        """Parse the header; answer SYSTEM_ERROR when it is bad or names another group than
        this consumer's, else SUCCESS with ``document_of(header)`` as the JSON body."""
        try:
            header = header_class.from_ext_fields(request.ext_fields)
        except HeaderFieldError as e:
            return _error(request, str(e))
        group = group_of(header)
        if group != self._consumer.group:
            return _error(request, f"consumer {self._consumer.client_id} serves group "
                                   f"{self._consumer.group!r}, not {group!r}")
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                           body=jsonx.dumps(document_of(header)))

    async def reset_offset(self, request: RemotingCommand, connection: object) -> None:
        consumer = self._consumer
        try:
            header = ResetOffsetRequestHeader.from_ext_fields(request.ext_fields)
            offsets = _offset_table(request.body)
        except (HeaderFieldError, RemoteProtocolError) as e:
            log.warning("consumer %s: ignoring a broker's offset reset: %s", consumer.group, e)
            return None
        if header.group != consumer.group:
            return None
        offsets = {queue: offset for queue, offset in offsets.items()
                   if queue.topic == header.topic}
        log.info("consumer %s: a broker resets %s to %s", consumer.group, header.topic,
                 {str(queue): offset for queue, offset in offsets.items()})
        await consumer.reset_offsets(offsets)
        return None


def _offset_table(body: bytes | None) -> dict[MessageQueue, int]:
    """The ``offsetTable`` of a ResetOffsetBody.

    Raises:
        RemoteProtocolError: no body, or not a table of MessageQueue keys and integer offsets.
    """
    if not body:
        raise RemoteProtocolError("RESET_CONSUMER_CLIENT_OFFSET has no body")
    document = jsonx.loads(body)
    table = document.get("offsetTable") if isinstance(document, dict) else None
    if not isinstance(table, dict):
        raise RemoteProtocolError("RESET_CONSUMER_CLIENT_OFFSET body has no offsetTable object")
    try:
        return {message_queue_from_key(key): int(value) for key, value in table.items()}
    except (TypeError, ValueError) as e:
        raise RemoteProtocolError(f"RESET_CONSUMER_CLIENT_OFFSET offsetTable: {e}") from None


def _stacks() -> str:
    """Every thread's stack and every asyncio task's, as text (Java's jstack, for Python)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f'"{names.get(ident, ident)}"\n' + "".join(traceback.format_stack(frame)))
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:  # no running loop
        tasks = set()
    for task in sorted(tasks, key=lambda t: t.get_name()):
        frames = ((frame, frame.f_lineno) for frame in task.get_stack(limit=8))
        stack = "".join(traceback.StackSummary.extract(frames).format())
        parts.append(f"task {task.get_name()}\n{stack}")
    return "\n".join(parts)


def _error(request: RemotingCommand, remark: str) -> RemotingCommand:
    return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, remark)

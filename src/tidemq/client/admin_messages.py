"""Admin reads of stored messages: a queue's range, a topic's time window, consume-queue
entries.

``MessageAdmin`` is mixed into ``Admin`` (it uses its ``_instance``, ``topic_route`` and
``_check_running``). Reads are plain pulls as the tools group ``TOOLS_CONSUMER``, which commit
nothing; QUERY_CONSUME_QUEUE (321) answers a queue's raw entries (docs/protocol.md, "Admin
requests").
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidemq.client import broker_api
from tidemq.client.instance import check_response
from tidemq.client.message import MessageQueue
from tidemq.client.subscription import parse_tag_expression
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.message import MessageExt

if TYPE_CHECKING:
    from tidemq.client.instance import ClientInstance
    from tidemq.client.route import TopicRouteData

TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"  # RocketMQ's group for admin-tool reads
READ_PULL_BATCH = 32  # messages per pull of an admin read (mqadmin pulls 32 too)


@dataclass(frozen=True, slots=True)
class ConsumeQueueEntry:
    """One consume-queue entry: where a message is in the commit log, and its tag code."""

    queue_offset: int
    physical_offset: int
    size: int
    tags_code: int


class MessageAdmin:
    """Reads stored messages of a queue or topic without committing anything."""

    _instance: ClientInstance

    if TYPE_CHECKING:
        def _check_running(self) -> None: ...
        async def topic_route(self, topic: str) -> TopicRouteData: ...

    async def queue_messages(self, queue: MessageQueue, begin_offset: int | None = None,
                             end_offset: int | None = None, *, tag_expression: str = "*",
                             max_num: int | None = None) -> AsyncIterator[MessageExt]:
        """The messages of ``queue`` in [begin_offset, end_offset) (default: all stored)
        matching ``tag_expression``, oldest first, at most ``max_num``."""
        self._check_running()
        address = await self._instance.find_master(queue.broker_name, queue.topic)
        offset = (await broker_api.min_offset(self._instance, address, queue)
                  if begin_offset is None else begin_offset)
        end = (await broker_api.max_offset(self._instance, address, queue)
               if end_offset is None else end_offset)
        subscription = parse_tag_expression(queue.topic, tag_expression)
        given = 0
        while offset < end and (max_num is None or given < max_num):
            result = await broker_api.pull_message(
                self._instance, address, TOOLS_CONSUMER_GROUP, queue, offset,
                min(READ_PULL_BATCH, end - offset), subscription)
            for message in result.messages:
                if message.queue_offset >= end or (max_num is not None and given >= max_num):
                    return
                given += 1
                yield message
            if result.next_begin_offset <= offset:
                return
            offset = result.next_begin_offset

    async def offsets_between(self, queue: MessageQueue, begin_ms: int, end_ms: int
                              ) -> tuple[int, int]:
        """[first, end) offsets of ``queue`` for messages stored from begin_ms to end_ms."""
        address = await self._instance.find_master(queue.broker_name, queue.topic)
        first = await broker_api.search_offset(self._instance, address, queue, begin_ms)
        end = await broker_api.search_offset(self._instance, address, queue, end_ms)
        maximum = await broker_api.max_offset(self._instance, address, queue)
        # search answers the offset of the message stored closest to the time; the end
        # message itself counts when it was stored at or before end_ms.
        return first, min(maximum, end + 1)

    async def topic_messages(self, topic: str, begin_ms: int, end_ms: int, *,
                             tag_expression: str = "*",
                             max_num: int | None = None) -> AsyncIterator[MessageExt]:
        """The messages of every queue of ``topic`` stored in [begin_ms, end_ms]."""
        route = await self.topic_route(topic)
        given = 0
        for queue in sorted(route.subscribe_queues(topic)):
            first, end = await self.offsets_between(queue, begin_ms, end_ms)
            async for message in self.queue_messages(queue, first, end,
                                                     tag_expression=tag_expression):
                if not begin_ms <= message.store_timestamp <= end_ms:
                    continue
                if max_num is not None and given >= max_num:
                    return
                given += 1
                yield message

    async def consume_queue(self, queue: MessageQueue, index: int, count: int, *,
                            broker_addr: str | None = None) -> list[ConsumeQueueEntry]:
        """QUERY_CONSUME_QUEUE: up to ``count`` raw entries of ``queue`` from offset ``index``
        (the body's ``queueData`` holds ``physicOffset``, ``physicSize``, ``tagsCode`` each,
        in queue order from ``index``)."""
        self._check_running()
        address = broker_addr or await self._instance.find_master(queue.broker_name,
                                                                  queue.topic)
        fields = {"topic": queue.topic, "queueId": str(queue.queue_id), "index": str(index),
                  "count": str(count), "consumerGroup": TOOLS_CONSUMER_GROUP}
        response = await self._instance.invoke(address, RequestCode.QUERY_CONSUME_QUEUE, fields)
        check_response(response, f"consume queue entries of {queue}", address)
        body: dict[str, Any] = jsonx.loads(response.body or b"{}")
        return [ConsumeQueueEntry(index + position, int(unit.get("physicOffset", 0)),
                                  int(unit.get("physicSize", 0)), int(unit.get("tagsCode", 0)))
                for position, unit in enumerate(body.get("queueData") or [])]

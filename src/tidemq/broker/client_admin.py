"""Admin requests the broker answers by asking the group's consumers.

An admin tool cannot reach a consumer (consumers listen on nothing); the broker holds every
consumer's connection, so it asks on the admin's behalf, as RocketMQ 4.x's Broker2Client does
(docs/protocol.md §2, §4.16, §5.5):

- GET_CONSUMER_RUNNING_INFO (307; ``consumerGroup``, ``clientId``, ``jstackEnable``): the
  request goes, same code, fields and body, to the connection of that client in that group
  and its answer (a ConsumerRunningInfo body) comes back as it is. A client not connected
  here -> SYSTEM_ERROR naming group and client; no answer within 10 s (RocketMQ's bound) ->
  SYSTEM_ERROR naming the failure.
- INVOKE_BROKER_TO_RESET_OFFSET (222; ``topic``, ``group``, ``timestamp``, ``isForce``): for
  each queue of the topic here, the offset stored closest to ``timestamp`` (-1: the queue's
  max offset). Without ``isForce`` a queue only moves back: one whose committed offset is
  already earlier keeps it. The table goes as a ResetOffsetBody with RESET_CONSUMER_CLIENT_OFFSET
  (220, oneway) to every member connection, and back to the admin. A group with no member
  connected -> CONSUMER_NOT_ONLINE (206), so the admin may fall back to committing offsets
  directly (checked first, so an offline group always gets it); a queue the group never
  committed -> SYSTEM_ERROR. Unlike RocketMQ the broker
  also commits the new offsets itself, so progress tools show them at once and a consumer
  that dies before acting on the request still starts there.
- INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223; ``topic``, ``group``, ``clientAddr``): asks each
  member (or only the one whose client id is ``clientAddr``) with GET_CONSUMER_STATUS_FROM_CLIENT
  (221), 5 s each, all at once; the answer is GetConsumerStatusBody
  ``{"consumerTable": {clientId: {MessageQueue: offset}}}`` of the members that answered.
  No member connected -> SYSTEM_ERROR.

Maps keyed by MessageQueue are written with JSON-object keys, as fastjson writes them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from tidemq.errors import RemoteProtocolError
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import (
    GetConsumerRunningInfoRequestHeader,
    GetConsumerStatusRequestHeader,
    ResetOffsetRequestHeader,
)
from tidemq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from tidemq.broker.client_manager import ClientChannel
    from tidemq.broker.clients import Clients
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.consumer_offset_manager import ConsumerOffsetManager
    from tidemq.broker.topic_config_manager import TopicConfigManager
    from tidemq.store.interface import MessageStore

log = logging.getLogger("tidemq.broker")

# RocketMQ's Broker2Client bounds: a running-info call may collect thread stacks (10 s);
# a status question is a table lookup (5 s); the reset is oneway, its write bounded at 5 s.
RUNNING_INFO_TIMEOUT_MS = 10_000
CONSUMER_STATUS_TIMEOUT_MS = 5_000
RESET_OFFSET_SEND_TIMEOUT_MS = 5_000

RESET_TO_MAX_OFFSET = -1  # the ``timestamp`` that means "skip to the end"


class ClientAdmin:
    """Serves GET_CONSUMER_RUNNING_INFO, INVOKE_BROKER_TO_RESET_OFFSET and
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS from the broker's parts: ``clients`` (the group's
    connected consumers), ``offsets``, ``topics`` and ``store``; ``config`` names the broker.

    Each method takes the admin's request and returns the response; a bad header raises
    ``HeaderFieldError`` (the admin processor answers SYSTEM_ERROR naming the field).
    """

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicConfigManager,
        offsets: ConsumerOffsetManager,
        clients: Clients,
    ) -> None:
        self._config = config
        self._store = store
        self._topics = topics
        self._offsets = offsets
        self._clients = clients

    async def get_consumer_running_info(self, request: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_RUNNING_INFO: forward to the client and relay its answer."""
        header = GetConsumerRunningInfoRequestHeader.from_ext_fields(request.ext_fields)
        channel = self._channel_of(header.consumer_group, header.client_id)
        if channel is None:
            return _error(request, ResponseCode.SYSTEM_ERROR,
                          f"consumer {header.client_id} of group {header.consumer_group} is not "
                          f"connected to broker {self._config.broker_name}; list the "
                          "group's clients with consumerConnection")
        forwarded = RemotingCommand.request(request.code, dict(request.ext_fields or {}),
                                            body=request.body)
        try:
            answer = await channel.connection.request(forwarded, RUNNING_INFO_TIMEOUT_MS)
        except RemotingError as e:
            return _error(request, ResponseCode.SYSTEM_ERROR,
                          f"asking consumer {header.client_id} of group "
                          f"{header.consumer_group} for its running info failed: {e}")
        return RemotingCommand.response_to(request, answer.code, answer.remark,
                                           ext_fields=answer.ext_fields, body=answer.body)

    async def reset_offset(self, request: RemotingCommand) -> RemotingCommand:
        """INVOKE_BROKER_TO_RESET_OFFSET: new offsets for the group's queues of a topic, sent
        to every member (RESET_CONSUMER_CLIENT_OFFSET) and committed here."""
        header = ResetOffsetRequestHeader.from_ext_fields(request.ext_fields)
        config = self._config
        topic_config = self._topics.get(header.topic)
        if topic_config is None:
            return _error(request, ResponseCode.SYSTEM_ERROR,
                          f"topic {header.topic} does not exist on broker "
                          f"{config.broker_name}; nothing to reset")
        members = self._members(header.group)
        if not members:
            return _error(request, ResponseCode.CONSUMER_NOT_ONLINE,
                          f"no consumer of group {header.group} is connected to broker "
                          f"{config.broker_name}, so none can be told to reset "
                          f"{header.topic}; commit the offsets directly instead")
        offsets: dict[int, int] = {}
        for queue_id in range(topic_config.write_queue_nums):
            committed = self._offsets.query_offset(header.group, header.topic, queue_id)
            if committed is None or committed < 0:
                return _error(request, ResponseCode.SYSTEM_ERROR,
                              f"group {header.group} has committed no offset of {header.topic} "
                              f"queue {queue_id} on broker {config.broker_name}; a group "
                              "must have consumed a topic before its offsets can be reset")
            offsets[queue_id] = self._reset_target(header, queue_id, committed)
        for queue_id, offset in offsets.items():
            self._offsets.commit_offset(header.group, header.topic, queue_id, offset)
        body = self._offset_table_body(header.topic, offsets)
        await asyncio.gather(*(self._send_reset(channel, header, body) for channel in members))
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body)

    async def get_consumer_status(self, request: RemotingCommand) -> RemotingCommand:
        """INVOKE_BROKER_TO_GET_CONSUMER_STATUS: each member's offsets of a topic."""
        header = GetConsumerStatusRequestHeader.from_ext_fields(request.ext_fields)
        members = [channel for channel in self._members(header.group)
                   if not header.client_addr or channel.client_id == header.client_addr]
        if not members:
            return _error(request, ResponseCode.SYSTEM_ERROR,
                          f"no consumer of group {header.group}"
                          + (f" with client id {header.client_addr}" if header.client_addr
                             else "")
                          + f" is connected to broker {self._config.broker_name}")
        question = GetConsumerStatusRequestHeader(topic=header.topic, group=header.group)
        answers = await asyncio.gather(*(self._ask_status(channel, question)
                                         for channel in members))
        table = {channel.client_id: offsets for channel, offsets in zip(members, answers,
                                                                         strict=True)
                 if offsets is not None}
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                           body=jsonx.dumps({"consumerTable": table}))

    # -- internals ----------------------------------------------------------------------------

    def _members(self, group: str) -> list[ClientChannel]:
        info = self._clients.consumers.get(group)
        if info is None:
            return []
        return [channel for channel in info.channels.values()
                if not channel.connection.is_closing]

    def _channel_of(self, group: str, client_id: str) -> ClientChannel | None:
        return next((c for c in self._members(group) if c.client_id == client_id), None)

    def _reset_target(self, header: ResetOffsetRequestHeader, queue_id: int,
                      committed: int) -> int:
        store = self._store
        if header.timestamp == RESET_TO_MAX_OFFSET:
            target = store.max_offset(header.topic, queue_id)
        else:
            target = store.offset_by_time(header.topic, queue_id, header.timestamp)
        target = max(target, 0)
        return target if header.is_force or target < committed else committed

    def _offset_table_body(self, topic: str, offsets: dict[int, int]) -> bytes:
        broker_name = self._config.broker_name
        table = {
            jsonx.JsonObjectKey({"brokerName": broker_name, "queueId": queue_id, "topic": topic}):
                offset
            for queue_id, offset in offsets.items()
        }
        return jsonx.dumps({"offsetTable": table})

    async def _send_reset(self, channel: ClientChannel, header: ResetOffsetRequestHeader,
                          body: bytes) -> None:
        command = RemotingCommand.request(RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                                          header.to_ext_fields(), body=body, oneway=True)
        try:
            await channel.connection.send_oneway(command, RESET_OFFSET_SEND_TIMEOUT_MS)
            log.info("told consumer %s of group %s to reset its offsets of %s",
                     channel.client_id, header.group, header.topic)
        except RemotingError as e:
            log.warning("could not tell consumer %s of group %s to reset its offsets of %s: %s",
                        channel.client_id, header.group, header.topic, e)

    async def _ask_status(self, channel: ClientChannel, question: GetConsumerStatusRequestHeader
                          ) -> dict[Any, int] | None:
        command = RemotingCommand.request(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT,
                                          question.to_ext_fields())
        try:
            answer = await channel.connection.request(command, CONSUMER_STATUS_TIMEOUT_MS)
            if answer.code != ResponseCode.SUCCESS or not answer.body:
                log.info("consumer %s gave no status of %s: %s", channel.client_id,
                         question.topic, answer.remark or answer.code)
                return None
            table = jsonx.loads(answer.body).get("messageQueueTable") or {}
            return {jsonx.JsonObjectKey(_as_dict(key)): int(value) for key, value in table.items()}
        except (RemotingError, RemoteProtocolError, AttributeError, TypeError, ValueError) as e:
            log.warning("asking consumer %s of group %s for its status failed: %s",
                        channel.client_id, question.group, e)
            return None


def _as_dict(key: Any) -> dict[str, Any]:
    if isinstance(key, jsonx.JsonObjectKey):
        return key.as_dict()
    if isinstance(key, str) and key.startswith("{"):
        return jsonx.loads(key)
    raise ValueError(f"{key!r} is not a MessageQueue key")


def _error(request: RemotingCommand, code: int, remark: str) -> RemotingCommand:
    return RemotingCommand.response_to(request, code, remark)

"""Offset requests: QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15), GET_MAX_OFFSET (30),
GET_MIN_OFFSET (31), SEARCH_OFFSET_BY_TIMESTAMP (29), GET_EARLIEST_MSG_STORETIME (32).

QUERY_CONSUMER_OFFSET for a queue the group never committed (protocol-notes §4.5): RocketMQ
answers SUCCESS with offset 0 when the queue's first message is still there and "in memory",
so a new group on a young queue reads it from the start; otherwise QUERY_NOT_FOUND (22) and
the client applies its consumeFromWhere (§15.5). tidemq's test for "in memory" is that the
queue's min offset is still 0 (retention has not trimmed it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidemq.errors import HeaderFieldError
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import (
    GetEarliestMsgStoretimeRequestHeader,
    GetEarliestMsgStoretimeResponseHeader,
    GetMaxOffsetRequestHeader,
    GetMaxOffsetResponseHeader,
    GetMinOffsetRequestHeader,
    GetMinOffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    SearchOffsetRequestHeader,
    SearchOffsetResponseHeader,
    UpdateConsumerOffsetRequestHeader,
)

if TYPE_CHECKING:
    from tidemq.broker.consumption import ConsumptionServices
    from tidemq.remoting.connection import Connection


class ConsumerOffsetProcessor:
    """Serves the consumer-offset and queue-offset requests."""

    def __init__(self, services: ConsumptionServices) -> None:
        self._services = services
        self._broker = services.broker

    async def query_consumer_offset(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand:
        """QUERY_CONSUMER_OFFSET: the group's committed offset of a queue."""
        try:
            header = QueryConsumerOffsetRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as e:
            return _error(request, str(e))
        offset = self._services.consumer_offset_manager.query_offset(
            header.consumer_group, header.topic, header.queue_id
        )
        if offset is None:
            min_offset = self._broker.store.min_offset(header.topic, header.queue_id)
            if min_offset > 0:
                return RemotingCommand.response_to(
                    request, ResponseCode.QUERY_NOT_FOUND,
                    remark=(
                        f"group {header.consumer_group} has committed no offset for "
                        f"{header.topic} queue {header.queue_id}, and the queue starts at "
                        f"{min_offset} (older messages were deleted); the consumer starts "
                        "where its consumeFromWhere says"
                    ),
                )
            offset = 0
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            ext_fields=QueryConsumerOffsetResponseHeader(offset=offset).to_ext_fields(),
        )

    async def update_consumer_offset(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand:
        """UPDATE_CONSUMER_OFFSET: store the group's offset of a queue (often oneway)."""
        try:
            header = UpdateConsumerOffsetRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as e:
            return _error(request, str(e))
        self._services.consumer_offset_manager.commit_offset(
            header.consumer_group, header.topic, header.queue_id, header.commit_offset
        )
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def get_max_offset(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand:
        """GET_MAX_OFFSET: the next queue offset to be written."""
        try:
            header = GetMaxOffsetRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as e:
            return _error(request, str(e))
        offset = self._broker.store.max_offset(header.topic, header.queue_id)
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            ext_fields=GetMaxOffsetResponseHeader(offset=offset).to_ext_fields(),
        )

    async def get_min_offset(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand:
        """GET_MIN_OFFSET: the first queue offset still readable."""
        try:
            header = GetMinOffsetRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as e:
            return _error(request, str(e))
        offset = self._broker.store.min_offset(header.topic, header.queue_id)
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            ext_fields=GetMinOffsetResponseHeader(offset=offset).to_ext_fields(),
        )

    async def search_offset_by_timestamp(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand:
        """SEARCH_OFFSET_BY_TIMESTAMP: the queue offset stored closest to a time (§4.12)."""
        try:
            header = SearchOffsetRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as e:
            return _error(request, str(e))
        offset = self._broker.store.offset_by_time(header.topic, header.queue_id, header.timestamp)
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            ext_fields=SearchOffsetResponseHeader(offset=offset).to_ext_fields(),
        )

    async def get_earliest_msg_storetime(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand:
        """GET_EARLIEST_MSG_STORETIME: store time of the queue's first readable message."""
        try:
            header = GetEarliestMsgStoretimeRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as e:
            return _error(request, str(e))
        timestamp = self._broker.store.earliest_message_time(header.topic, header.queue_id)
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            ext_fields=GetEarliestMsgStoretimeResponseHeader(timestamp=timestamp).to_ext_fields(),
        )


def _error(request: RemotingCommand, remark: str) -> RemotingCommand:
    return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, remark=remark)

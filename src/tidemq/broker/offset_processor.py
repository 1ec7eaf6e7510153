"""Offset requests: QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15), GET_MAX_OFFSET (30),
GET_MIN_OFFSET (31), SEARCH_OFFSET_BY_TIMESTAMP (29), GET_EARLIEST_MSG_STORETIME (32).

QUERY_CONSUMER_OFFSET for a queue the group never committed (docs/protocol.md §4.5): RocketMQ
answers SUCCESS with offset 0 when the queue's first message is still there and "in memory",
so a new group on a young queue reads it from the start; otherwise QUERY_NOT_FOUND (22) and
the client applies its consumeFromWhere (§15.5). tidemq's test for "in memory" is that the
queue's min offset is still 0 (retention has not trimmed it).

Every handler has one shape: ``_handler(RequestHeader)`` parses the request header (a missing
or unparsable field -> SYSTEM_ERROR naming it) and the method body turns the parsed header into
the response.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tidemq.broker.consumer_offset_manager import KEEP_LARGER_EXT_FIELD
from tidemq.errors import HeaderFieldError
from tidemq.protocol.codes import RequestCode, ResponseCode
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
    from tidemq.broker.consumer_offset_manager import ConsumerOffsetManager
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer
    from tidemq.store.interface import MessageStore

# answer(processor, request, parsed header) -> response
Answer = Callable[["ConsumerOffsetProcessor", RemotingCommand, Any], RemotingCommand]
Handler = Callable[["ConsumerOffsetProcessor", RemotingCommand, "Connection"],
                   Awaitable[RemotingCommand]]


def _handler(header_class: Any) -> Callable[[Answer], Handler]:
    """Make ``answer(self, request, header)`` a request handler that parses ``header_class``
    (a typed request header of tidemq.protocol.headers) first and answers SYSTEM_ERROR naming
    the field when the header is bad."""

    def decorate(answer: Answer) -> Handler:
        @functools.wraps(answer)
        async def handle(self: ConsumerOffsetProcessor, request: RemotingCommand,
                         connection: Connection) -> RemotingCommand:
            try:
                header = header_class.from_ext_fields(request.ext_fields)
            except HeaderFieldError as e:
                return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR,
                                                   remark=str(e))
            return answer(self, request, header)

        return handle

    return decorate


def _success(request: RemotingCommand, response_header: Any = None) -> RemotingCommand:
    ext_fields = None if response_header is None else response_header.to_ext_fields()
    return RemotingCommand.response_to(request, ResponseCode.SUCCESS, ext_fields=ext_fields)


class ConsumerOffsetProcessor:
    """Serves the consumer-offset and queue-offset requests."""

    def __init__(self, *, store: MessageStore, offsets: ConsumerOffsetManager) -> None:
        self._store = store
        self._offsets = offsets

    def register(self, server: RemotingServer) -> None:
        """Register the six offset handlers on ``server``."""
        routes = {
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: self.get_max_offset,
            RequestCode.GET_MIN_OFFSET: self.get_min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.get_earliest_msg_storetime,
        }
        for code, handler in routes.items():
            server.register(code, handler)

    @_handler(QueryConsumerOffsetRequestHeader)
    def query_consumer_offset(self, request: RemotingCommand,
                              header: QueryConsumerOffsetRequestHeader) -> RemotingCommand:
        """QUERY_CONSUMER_OFFSET: the group's committed offset of a queue."""
        offset = self._offsets.query_offset(
            header.consumer_group, header.topic, header.queue_id
        )
        if offset is None:
            min_offset = self._store.min_offset(header.topic, header.queue_id)
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
        return _success(request, QueryConsumerOffsetResponseHeader(offset=offset))

    @_handler(UpdateConsumerOffsetRequestHeader)
    def update_consumer_offset(self, request: RemotingCommand,
                               header: UpdateConsumerOffsetRequestHeader) -> RemotingCommand:
        """UPDATE_CONSUMER_OFFSET: store the group's offset of a queue (often oneway).

        Allowed on a slave too, as in RocketMQ (a consumer whose master is gone commits
        there); with the ``tidemqKeepLarger`` field (a slave handing those commits back to
        its master) the larger of the stored and the given offset is kept."""
        if (request.ext_fields or {}).get(KEEP_LARGER_EXT_FIELD) == "true":
            self._offsets.commit_offset_max(
                header.consumer_group, header.topic, header.queue_id, header.commit_offset
            )
        else:
            self._offsets.commit_offset(
                header.consumer_group, header.topic, header.queue_id, header.commit_offset
            )
        return _success(request)

    @_handler(GetMaxOffsetRequestHeader)
    def get_max_offset(self, request: RemotingCommand,
                       header: GetMaxOffsetRequestHeader) -> RemotingCommand:
        """GET_MAX_OFFSET: the next queue offset to be written."""
        offset = self._store.max_offset(header.topic, header.queue_id)
        return _success(request, GetMaxOffsetResponseHeader(offset=offset))

    @_handler(GetMinOffsetRequestHeader)
    def get_min_offset(self, request: RemotingCommand,
                       header: GetMinOffsetRequestHeader) -> RemotingCommand:
        """GET_MIN_OFFSET: the first queue offset still readable."""
        offset = self._store.min_offset(header.topic, header.queue_id)
        return _success(request, GetMinOffsetResponseHeader(offset=offset))

    @_handler(SearchOffsetRequestHeader)
    def search_offset_by_timestamp(self, request: RemotingCommand,
                                   header: SearchOffsetRequestHeader) -> RemotingCommand:
        """SEARCH_OFFSET_BY_TIMESTAMP: the queue offset stored closest to a time (§4.12)."""
        offset = self._store.offset_by_time(header.topic, header.queue_id, header.timestamp)
        return _success(request, SearchOffsetResponseHeader(offset=offset))

    @_handler(GetEarliestMsgStoretimeRequestHeader)
    def get_earliest_msg_storetime(self, request: RemotingCommand,
                                   header: GetEarliestMsgStoretimeRequestHeader
                                   ) -> RemotingCommand:
        """GET_EARLIEST_MSG_STORETIME: store time of the queue's first readable message."""
        timestamp = self._store.earliest_message_time(header.topic, header.queue_id)
        return _success(request, GetEarliestMsgStoretimeResponseHeader(timestamp=timestamp))

"""Finding messages without a queue offset: QUERY_MESSAGE (12) and VIEW_MESSAGE_BY_ID (33).

QUERY_MESSAGE looks a key up in the store's hash index (docs/protocol.md §4.13, §10.3): the
``KEYS`` tokens and the ``UNIQ_KEY`` of every message of a topic are indexed. The client asks
every master of the topic and filters what comes back itself (by key membership or UNIQ_KEY),
so hash collisions in the index only cost a transfer. With ``_UNIQUE_KEY_QUERY=true`` (a
lookup by message id) the broker uses ``defaultQueryMaxNum`` instead of the client's maxNum.

VIEW_MESSAGE_BY_ID gets one record by commit-log offset: the client decoded that offset from
an offset message id (§8.1) that names this broker's address.

Both answer with stored records as they are, concatenated (§6.3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidemq.errors import HeaderFieldError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import (
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    ViewMessageRequestHeader,
)

if TYPE_CHECKING:
    from tidemq.broker.config import BrokerConfig
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer
    from tidemq.store.interface import MessageStore

# One QUERY_MESSAGE answers at most this many records whatever maxNum says: the index walk
# and the response are bounded, and RocketMQ's admin tools ask 64 by default.
QUERY_MESSAGE_MAX_NUM = 1024


class QueryMessageProcessor:
    """Serves QUERY_MESSAGE and VIEW_MESSAGE_BY_ID."""

    def __init__(self, *, config: BrokerConfig, store: MessageStore) -> None:
        self._config = config
        self._store = store

    def register(self, server: RemotingServer) -> None:
        """Register QUERY_MESSAGE and VIEW_MESSAGE_BY_ID on ``server``."""
        server.register(RequestCode.QUERY_MESSAGE, self.query_message)
        server.register(RequestCode.VIEW_MESSAGE_BY_ID, self.view_message_by_id)

    async def query_message(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand:
        """QUERY_MESSAGE: records of a topic indexed under a key within a time range."""
        try:
            header = QueryMessageRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as e:
            return _error(request, ResponseCode.SYSTEM_ERROR, str(e))
        max_num = header.max_num
        if header.unique_key_query:
            max_num = self._config.default_query_max_num
        max_num = min(max(max_num, 1), QUERY_MESSAGE_MAX_NUM)
        result = self._store.query_messages(
            header.topic, header.key, max_num, header.begin_timestamp, header.end_timestamp
        )
        response_header = QueryMessageResponseHeader(
            index_last_update_timestamp=result.index_last_update_timestamp_ms,
            index_last_update_phyoffset=result.index_last_update_physical_offset,
        )
        if not result.records:
            return RemotingCommand.response_to(
                request, ResponseCode.QUERY_NOT_FOUND,
                remark=(
                    f"no message of topic {header.topic} with key {header.key!r} stored between "
                    f"{header.begin_timestamp} and {header.end_timestamp} (ms); check the key "
                    "and widen the time range"
                ),
                ext_fields=response_header.to_ext_fields(),
            )
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            ext_fields=response_header.to_ext_fields(), body=result.body,
        )

    async def view_message_by_id(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand:
        """VIEW_MESSAGE_BY_ID: the one record stored at a commit-log offset."""
        try:
            header = ViewMessageRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as e:
            return _error(request, ResponseCode.SYSTEM_ERROR, str(e))
        record = self._store.read_message(header.offset) if header.offset >= 0 else None
        if record is None:
            store = self._store
            return _error(
                request, ResponseCode.SYSTEM_ERROR,
                f"can not find message by the offset, {header.offset}: no record starts there "
                f"(this broker's commit log holds offsets {store.commit_log_min_offset()} to "
                f"{store.commit_log_max_offset()}); check the message id names this broker",
            )
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=bytes(record))


def _error(request: RemotingCommand, code: int, remark: str) -> RemotingCommand:
    return RemotingCommand.response_to(request, code, remark=remark)

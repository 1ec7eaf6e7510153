"""SEND_REPLY_MESSAGE (324) and SEND_REPLY_MESSAGE_V2 (325): a replier's answer to a request,
pushed to the requester (docs/protocol.md, "Request-reply").

A request is an ordinary message whose properties name its requester's client id
(REPLY_TO_CLIENT), a correlation id and a time to live. The consumer that handles it sends a
reply to ``<cluster>_REPLY_TOPIC`` with the same three properties and MSG_TYPE=reply, using
these codes (the send header, in the long or the short form). The broker then:

1. checks the reply as it checks any send (topic, permissions, sizes);
2. finds the requester's connection among the producers that heartbeat to it, by the
   REPLY_TO_CLIENT client id, and calls it with PUSH_REPLY_MESSAGE_TO_CLIENT (326): the
   reply's send header fields plus bornHost, storeHost and storeTimestamp, the properties
   with PUSH_REPLY_TIME added, the body as sent; the requester answers SUCCESS;
3. stores the reply in the reply topic when ``storeReplyMessageEnable`` (the default), so
   it can be looked up later.

The answer is SUCCESS when the push succeeded (msgId "0", queue offset 0 when the reply was
not stored; the stored message's ids otherwise) and SYSTEM_ERROR naming the requester when it
could not be reached (not connected here, or not answering within PUSH_REPLY_TIMEOUT_MS). As
RocketMQ does, a reply that could not be pushed is still stored when storing is on.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from tidemq.broker.send_processor import SendRefused
from tidemq.errors import HeaderFieldError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import SendMessageRequestHeader
from tidemq.protocol.message import (
    PROPERTY_MESSAGE_REPLY_TO_CLIENT,
    PROPERTY_PUSH_REPLY_TIME,
    decode_properties,
    encode_properties,
)
from tidemq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from tidemq.broker.client_manager import ProducerManager
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.identity import BrokerIdentity
    from tidemq.broker.send_processor import SendMessageProcessor
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer

log = logging.getLogger("tidemq.broker")

# How long the requester may take to accept a pushed reply (RocketMQ's callClient waits 3 s).
PUSH_REPLY_TIMEOUT_MS = 3000

# The form the reply is stored in: the same send, under the matching send code.
_STORE_CODES = {
    RequestCode.SEND_REPLY_MESSAGE: RequestCode.SEND_MESSAGE,
    RequestCode.SEND_REPLY_MESSAGE_V2: RequestCode.SEND_MESSAGE_V2,
}


class ReplyMessageProcessor:
    """Serves SEND_REPLY_MESSAGE and SEND_REPLY_MESSAGE_V2 (module docstring).

    Args:
        config: storeReplyMessageEnable and the names in remarks.
        identity: the broker's address (storeHost of a pushed reply).
        producers: the connected producers, where a requester is found by client id.
        send: checks a reply as a send, and stores it.
    """

    def __init__(self, *, config: BrokerConfig, identity: BrokerIdentity,
                 producers: ProducerManager, send: SendMessageProcessor) -> None:
        self._config = config
        self._identity = identity
        self._producers = producers
        self._send = send

    def register(self, server: RemotingServer) -> None:
        """Register both reply codes on ``server``."""
        for code in _STORE_CODES:
            server.register(code, self.handle)

    async def handle(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        """Push one reply to its requester and store it (module docstring)."""
        try:
            header = SendMessageRequestHeader.from_ext_fields(request.ext_fields, request.code)
            self._send.check_send(header, len(request.body or b""), connection)
        except HeaderFieldError as exc:
            return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, str(exc))
        except SendRefused as refused:
            return RemotingCommand.response_to(request, refused.code, refused.remark)
        pushed, problem = await self._push(header, request.body or b"", connection)
        if self._config.store_reply_message_enable:
            stored = await self._send.handle(
                dataclasses.replace(request, code=_STORE_CODES[request.code]), connection)
        else:
            stored = None
        if not pushed:
            return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, problem)
        if stored is not None:
            return stored  # its ids say where the reply is kept (or why it is not)
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, None,
            {"msgId": "0", "queueId": str(max(header.queue_id, 0)), "queueOffset": "0"})

    async def _push(self, header: SendMessageRequestHeader, body: bytes,
                    replier: Connection) -> tuple[bool, str]:
        properties = decode_properties(header.properties) if header.properties else {}
        requester = properties.get(PROPERTY_MESSAGE_REPLY_TO_CLIENT)
        if not requester:
            return False, (f"the reply has no {PROPERTY_MESSAGE_REPLY_TO_CLIENT} property, so "
                           "its requester is unknown; build replies from the request message")
        target = self._producers.find_connection(requester)
        if target is None:
            return False, (f"cannot push the reply to {requester}: it is not connected to "
                           f"broker {self._config.broker_name} (gone, or its request timed "
                           "out and it closed)")
        properties[PROPERTY_PUSH_REPLY_TIME] = str(time.time_ns() // 1_000_000)
        fields = {
            "producerGroup": header.producer_group,
            "topic": header.topic,
            "defaultTopic": header.default_topic,
            "defaultTopicQueueNums": str(header.default_topic_queue_nums),
            "queueId": str(header.queue_id),
            "sysFlag": str(header.sys_flag),
            "bornTimestamp": str(header.born_timestamp),
            "flag": str(header.flag),
            "properties": encode_properties(properties),
            "reconsumeTimes": str(header.reconsume_times or 0),
            "unitMode": "true" if header.unit_mode else "false",
            "bornHost": replier.remote_address,
            "storeHost": self._identity.address,
            "storeTimestamp": str(time.time_ns() // 1_000_000),
        }
        push = RemotingCommand.request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, fields, body)
        try:
            answer = await target.request(push, PUSH_REPLY_TIMEOUT_MS)
        except RemotingError as exc:
            log.warning("pushing a reply to %s failed: %s", requester, exc)
            return False, f"cannot push the reply to {requester}: {exc}"
        if answer.code != ResponseCode.SUCCESS:
            return False, (f"{requester} refused the pushed reply: "
                           f"{answer.remark or answer.code}")
        return True, ""

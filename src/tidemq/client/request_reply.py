"""Request-reply over messages, as RocketMQ 4.x clients do it (docs/protocol.md,
"Request-reply").

The requester (``Producer.request``) sends an ordinary message carrying three properties:
CORRELATION_ID (fresh per request), REPLY_TO_CLIENT (its own client id) and TTL (how long it
waits, ms). The consumer that handles the request answers with ``reply_message(request,
body)`` sent by any producer: the reply goes to ``<cluster>_REPLY_TOPIC`` (CLUSTER is the
property the broker stamped on the stored request) with MSG_TYPE=reply and the same three
properties, and the producer sends it with SEND_REPLY_MESSAGE_V2 (325). The broker pushes it
to the requester's connection (PUSH_REPLY_MESSAGE_TO_CLIENT, 326), where ``ReplyWaiters``
hands it to the request waiting on that correlation id.

``replying(producer, handler)`` makes a push-consumer listener of a function from a request
to its reply body: the replier helper.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from tidemq.client.errors import ClientError, InvalidMessage
from tidemq.client.listener import ConsumeResult
from tidemq.client.message import Message
from tidemq.errors import HeaderFieldError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import (
    PROPERTY_CLUSTER,
    PROPERTY_CORRELATION_ID,
    PROPERTY_MESSAGE_REPLY_TO_CLIENT,
    PROPERTY_MESSAGE_TTL,
    PROPERTY_MESSAGE_TYPE,
    REPLY_MESSAGE_FLAG,
    REPLY_TOPIC_POSTFIX,
    SYSFLAG_COMPRESSED,
    MessageExt,
    decode_properties,
)

if TYPE_CHECKING:
    from tidemq.client.producer import Producer
    from tidemq.remoting.client import RemotingClient
    from tidemq.remoting.connection import Connection

log = logging.getLogger("tidemq.client")

# RocketMQ's DefaultMQProducer.request waits 3 s unless told otherwise.
REQUEST_TIMEOUT_MS_DEFAULT = 3000


class RequestTimeout(ClientError):
    """No reply came within the request's timeout (the request itself was sent)."""

    retriable = True


def request_properties(correlation_id: str, client_id: str, timeout_ms: int) -> dict[str, str]:
    """The properties that make a message a request (module docstring)."""
    return {PROPERTY_CORRELATION_ID: correlation_id,
            PROPERTY_MESSAGE_REPLY_TO_CLIENT: client_id,
            PROPERTY_MESSAGE_TTL: str(timeout_ms)}


def new_correlation_id() -> str:
    """A correlation id unique across clients (a random UUID, as RocketMQ's is)."""
    return str(uuid.uuid4())


def is_request(message: MessageExt) -> bool:
    """True when ``message`` was sent by ``request`` and expects a reply."""
    return bool(message.properties.get(PROPERTY_MESSAGE_REPLY_TO_CLIENT))


def reply_message(request: MessageExt, body: bytes | str) -> Message:
    """The reply to ``request``: send it with any started producer.

    Raises:
        InvalidMessage: ``request`` is not a request (no REPLY_TO_CLIENT or CLUSTER property).
    """
    properties = request.properties
    cluster = properties.get(PROPERTY_CLUSTER)
    if not is_request(request) or not cluster:
        raise InvalidMessage(
            f"message {request.msg_id} of topic {request.topic} is not a request (it has no "
            f"{PROPERTY_MESSAGE_REPLY_TO_CLIENT} or {PROPERTY_CLUSTER} property), so it has "
            "no requester to reply to")
    reply_properties = {PROPERTY_MESSAGE_TYPE: REPLY_MESSAGE_FLAG}
    for name in (PROPERTY_CORRELATION_ID, PROPERTY_MESSAGE_REPLY_TO_CLIENT,
                 PROPERTY_MESSAGE_TTL):
        if name in properties:
            reply_properties[name] = properties[name]
    return Message(f"{cluster}_{REPLY_TOPIC_POSTFIX}", body, properties=reply_properties)


def is_reply(message: Message) -> bool:
    """True for a message built by ``reply_message`` (sent with SEND_REPLY_MESSAGE_V2)."""
    return message.properties.get(PROPERTY_MESSAGE_TYPE) == REPLY_MESSAGE_FLAG


class ReplyWaiters:
    """The requests of one client waiting for their replies, by correlation id; serves the
    broker's PUSH_REPLY_MESSAGE_TO_CLIENT on the client's connections."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[MessageExt]] = {}

    def register(self, remoting: RemotingClient) -> None:
        """Serve PUSH_REPLY_MESSAGE_TO_CLIENT on ``remoting``'s connections."""
        remoting.register(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, self.on_push)

    def expect(self, correlation_id: str) -> asyncio.Future[MessageExt]:
        """A future resolved by the reply carrying ``correlation_id``."""
        future: asyncio.Future[MessageExt] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = future
        return future

    def forget(self, correlation_id: str) -> None:
        """Stop waiting for ``correlation_id`` (answered, timed out or cancelled)."""
        self._waiting.pop(correlation_id, None)

    async def on_push(self, request: RemotingCommand,
                      connection: Connection) -> RemotingCommand:
        """PUSH_REPLY_MESSAGE_TO_CLIENT: hand the reply to its request; always SUCCESS unless
        the push is malformed (a late reply is logged and dropped, as RocketMQ does)."""
        try:
            reply = _reply_from_push(request)
        except (HeaderFieldError, KeyError, ValueError, zlib.error) as exc:
            return RemotingCommand.response_to(
                request, ResponseCode.SYSTEM_ERROR, f"malformed reply push: {exc}")
        correlation_id = reply.properties.get(PROPERTY_CORRELATION_ID, "")
        future = self._waiting.pop(correlation_id, None)
        if future is None or future.done():
            log.warning("a reply from %s for correlation id %s came after its request ended "
                        "(timed out?); dropped", connection.remote_address, correlation_id)
        else:
            future.set_result(reply)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)


def _reply_from_push(request: RemotingCommand) -> MessageExt:
    fields = request.ext_fields or {}
    sysflag = int(fields.get("sysFlag", "0"))
    body = request.body or b""
    if sysflag & SYSFLAG_COMPRESSED:
        body = zlib.decompress(body)
    return MessageExt(
        topic=fields["topic"],
        body=body,
        flag=int(fields.get("flag", "0")),
        properties=decode_properties(fields.get("properties") or ""),
        queue_id=int(fields.get("queueId", "0")),
        sysflag=sysflag,
        born_timestamp=int(fields.get("bornTimestamp", "0")),
        born_host=fields.get("bornHost", "").lstrip("/"),
        store_timestamp=int(fields.get("storeTimestamp", "0")),
        store_host=fields.get("storeHost", "").lstrip("/"),
        reconsume_times=int(fields.get("reconsumeTimes") or "0"),
    )


ReplyHandler = Callable[[MessageExt], "bytes | str | Awaitable[bytes | str]"]


def replying(producer: Producer, handler: ReplyHandler):
    """A push-consumer listener that answers each request with ``handler(request)``.

    ``handler`` returns the reply body (or an awaitable of it); messages that are not
    requests are passed to it too and their result is dropped. A failed reply send raises,
    so the request is consumed again later (the requester may have timed out by then).

    Args:
        producer: a started producer that sends the replies.
        handler: request message -> reply body.
    """

    async def listener(messages: list[MessageExt]) -> ConsumeResult:
        for message in messages:
            body = handler(message)
            if asyncio.iscoroutine(body) or isinstance(body, Awaitable):
                body = await body
            if is_request(message):
                await producer.send(reply_message(message, body))
        return ConsumeResult.SUCCESS

    return listener


async def send_request(producer: Producer, waiters: ReplyWaiters, message: Message,
                       timeout_ms: int, **send_options: object) -> MessageExt:
    """Send ``message`` as a request and wait for its reply (``Producer.request``).

    Raises:
        RequestTimeout: the reply did not come within ``timeout_ms`` of the call.
        and whatever ``Producer.send`` raises for the request itself.
    """
    correlation_id = new_correlation_id()
    message.properties.update(request_properties(correlation_id, producer.client_id,
                                                 timeout_ms))
    reply = waiters.expect(correlation_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000
    try:
        await producer.send(message, timeout_ms=timeout_ms, **send_options)
        try:
            async with asyncio.timeout_at(deadline):
                return await reply
        except TimeoutError:
            raise RequestTimeout(
                f"no reply to the request sent to topic {message.topic} within {timeout_ms} ms "
                f"(correlation id {correlation_id}); is a consumer replying to it?") from None
    finally:
        waiters.forget(correlation_id)

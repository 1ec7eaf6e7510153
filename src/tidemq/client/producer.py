"""Producer: send messages to a topic's queues, one by one, in batches, ordered or oneway.

Theory of operation. ``send`` checks the message (topic name, body size, properties size)
before anything goes on the wire, gives it a UNIQ_KEY (its client message id), compresses a
large body (zlib level 5 at >= ``compress_over_bytes``), finds the topic's publish queues (route
from the name servers, cached and refreshed every 30 s; for a topic the name servers do not
know, the route of the auto-create template ``TBW102`` with at most
``default_topic_queue_nums`` queues, so the broker creates the topic on the first send) and
sends SEND_MESSAGE_V2 (310) to the master of the chosen queue's broker.

Queue choice is round robin, skipping brokers that failed recently (``FaultTracker``).
A send that fails with a transport error (connect, timeout, closed) or one of the retriable
response codes of docs/protocol.md §1.5 is retried up to ``retry_times_when_send_failed`` more
times on another broker, within the one ``send_timeout_ms`` budget. Other error codes (e.g.
MESSAGE_ILLEGAL, SYSTEM_BUSY) raise ``BrokerRejected`` at once. Codes 0, 10, 11 and 12 all
mean "stored" and return a ``SendResult``.

Ordered sends (``sharding_key``, ``queue`` or ``selector``) pick one queue and are never
retried elsewhere: a message on another queue would break the order the caller asked for.

Many sends may run at once: ``await asyncio.gather(*(producer.send(m) for m in msgs))`` is the
asynchronous path (RocketMQ's sendAsync), limited only by the caller.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tidemq.client.batch import check_batch, split_batch
from tidemq.client.errors import SEND_RETRY_CODES, BrokerRejected, NoRouteError
from tidemq.client.instance import (
    HEARTBEAT_BROKER_INTERVAL_MS,
    POLL_NAME_SERVER_INTERVAL_MS,
    REQUEST_TIMEOUT_MS,
    ClientInstance,
)
from tidemq.client.lifecycle import ClientLifecycle, leave_quietly
from tidemq.client.message import (
    Message,
    MessageQueue,
    SendResult,
    SendStatus,
    check_properties_size,
    new_send_result,
    validate_message,
)
from tidemq.client.queue_selection import (
    FAULT_ISOLATION_MS_DEFAULT,
    FaultTracker,
    PublishInfo,
    RoundRobin,
    select_by_sharding_key,
)
from tidemq.client.request_reply import (
    REQUEST_TIMEOUT_MS_DEFAULT,
    ReplyWaiters,
    is_reply,
    send_request,
)
from tidemq.client.route import TopicRouteData
from tidemq.client.security import Credentials, TlsOption
from tidemq.client.trace_data import TRACE_PRODUCER_GROUP, TRACE_TOPIC_DEFAULT
from tidemq.client.trace_dispatcher import TraceDispatcher
from tidemq.client.tracer import Tracer
from tidemq.errors import RemoteProtocolError
from tidemq.limits import MESSAGE_BODY_SIZE_MAX, group_name_problem
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import JsonRequestTemplate, RemotingCommand, json_plain, next_opaque
from tidemq.protocol.message import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_ZLIB,
    MessageExt,
    encode_properties,
)
from tidemq.protocol.msgid import new_unique_key
from tidemq.remoting.errors import RemotingError, RemotingTimeout

log = logging.getLogger("tidemq.client")

DEFAULT_NAMESRV = "127.0.0.1:9876"
AUTO_CREATE_TOPIC_KEY = "TBW102"  # RocketMQ's auto-create template topic
DEFAULT_TOPIC_QUEUE_NUMS = 4  # RocketMQ producer default (docs/protocol.md §11.3)
COMPRESS_OVER_BYTES = 4096  # compressMsgBodyOverHowmuch
COMPRESS_LEVEL = 5  # rocketmq.message.compressLevel
# The trace producer's zlib level: about 2.6 times cheaper than 5 on trace text, which it
# compresses as well (20-fold).
TRACE_COMPRESS_LEVEL = 1
SEND_TIMEOUT_MS = 3000  # sendMsgTimeout
RETRY_PREFIX = "%RETRY%"  # a consumer group's retry topic is %RETRY%<group>
RETRY_TIMES_WHEN_SEND_FAILED = 2

# A retry needs more than this many ms of the send's budget left. A timed-out attempt's timer
# may fire up to a millisecond before its deadline (connection.py's expiry slack) and its
# budget was cut to whole ms, so up to ~2 ms of the budget can be left when it fails: a retry
# in them could only time out too, and its "within 1 ms" would hide the first attempt's
# error, which names the send's real budget.
_RETRY_MIN_MS = 2

_STORED_STATUS = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
# Properties of at most this many characters cannot exceed 32767 bytes in UTF-8 (4 bytes per
# character at most), so only longer ones need an exact size check.
_PROPERTIES_CHARS_ALWAYS_OK = 32767 // 4

# Request codes as plain ints: an IntEnum member takes the header encoder's careful path.
_SEND_MESSAGE_V2_CODE = int(RequestCode.SEND_MESSAGE_V2)
_SEND_REPLY_MESSAGE_V2_CODE = int(RequestCode.SEND_REPLY_MESSAGE_V2)

# The properties text of a message whose only property is its unique key, up to the key.
_UNIQ_KEY_PROPERTY_HEAD = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX + NAME_VALUE_SEPARATOR
# ... and as it appears in a JSON header (the separator escaped as orjson writes it).
_UNIQ_KEY_JSON_HEAD = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX + "\\u0001"

# Topic names already checked, so a send does not run the name regex again (bounded: a
# producer writing to very many topics just checks more often).
VALID_TOPICS_CACHED_MAX = 1024

QueueSelector = Callable[[Sequence[MessageQueue], Message], MessageQueue]


def default_namesrv() -> str:
    """The name server list from $NAMESRV_ADDR (as RocketMQ's tools read it), else local."""
    return os.environ.get("NAMESRV_ADDR") or DEFAULT_NAMESRV


class Producer(ClientLifecycle):
    """Sends messages to tidemq (or RocketMQ 4.x) brokers. Use as ``async with``.

    Args:
        group: the producer group (RocketMQ rules for names).
        namesrv: name server addresses ``"host:port;host:port"``; default $NAMESRV_ADDR or
            127.0.0.1:9876.
        send_timeout_ms: time budget of one send, its retries included.
        retry_times_when_send_failed: extra attempts, on other brokers, after a retriable
            failure.
        compress_over_bytes: bodies at least this long are zlib-compressed (single sends).
        compress_level: zlib level.
        max_message_size: largest body accepted (and largest batch request body).
        default_topic_queue_nums: queues of a topic auto-created by the first send.
        instance_name: part of the client id; default ``<pid>#<nanoTime>``.
        fault_isolation_ms: how long a broker that failed a send is avoided.
        request_timeout_ms: timeout of name-server and other non-send requests.
        poll_name_server_interval_ms: how often cached routes are refreshed.
        heartbeat_broker_interval_ms: how often the group is announced to every master.
        enable_msg_trace: write a Pub trace record of every message sent (and EndTransaction
            records of a TransactionProducer) to the trace topic, in the background
            (RocketMQ's enableMsgTrace; see docs/monitoring.md). A send never waits for, or
            fails because of, its trace.
        trace_topic: the trace topic (RocketMQ's customizedTraceTopic); default
            RMQ_SYS_TRACE_TOPIC.
        credentials: ACL keys (``tidemq.Credentials``); every request is signed with them.
        tls: True, an ``ssl.SSLContext`` (``tidemq.tls_context``) or None for plain TCP.

    Raises:
        ValueError: a bad group name or name server address.
    """

    def __init__(
        self,
        group: str = "DEFAULT_PRODUCER",
        namesrv: str | Iterable[str] | None = None,
        *,
        send_timeout_ms: int = SEND_TIMEOUT_MS,
        retry_times_when_send_failed: int = RETRY_TIMES_WHEN_SEND_FAILED,
        compress_over_bytes: int = COMPRESS_OVER_BYTES,
        compress_level: int = COMPRESS_LEVEL,
        max_message_size: int = MESSAGE_BODY_SIZE_MAX,
        default_topic_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS,
        instance_name: str | None = None,
        fault_isolation_ms: int = FAULT_ISOLATION_MS_DEFAULT,
        request_timeout_ms: int = REQUEST_TIMEOUT_MS,
        poll_name_server_interval_ms: int = POLL_NAME_SERVER_INTERVAL_MS,
        heartbeat_broker_interval_ms: int = HEARTBEAT_BROKER_INTERVAL_MS,
        enable_msg_trace: bool = False,
        trace_topic: str | None = None,
        credentials: Credentials | None = None,
        tls: TlsOption = None,
    ):
        problem = group_name_problem(group)
        if problem is not None:
            raise ValueError(f"producer {problem}")
        if retry_times_when_send_failed < 0:
            raise ValueError("retry_times_when_send_failed must be >= 0")
        self.group = group
        self.send_timeout_ms = send_timeout_ms
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.compress_over_bytes = compress_over_bytes
        self.compress_level = compress_level
        self.max_message_size = max_message_size
        self.default_topic_queue_nums = default_topic_queue_nums
        self.faults = FaultTracker(fault_isolation_ms)
        self._instance = ClientInstance(
            namesrv if namesrv is not None else default_namesrv(),
            instance_name=instance_name,
            request_timeout_ms=request_timeout_ms,
            poll_name_server_interval_ms=poll_name_server_interval_ms,
            heartbeat_broker_interval_ms=heartbeat_broker_interval_ms,
            credentials=credentials,
            tls=tls,
        )
        self._instance.route_listeners.append(self._route_changed)
        self._instance.heartbeat_sources.append(self._heartbeat_data)
        self._publish: dict[str, PublishInfo] = {}
        self._route_lookups: dict[str, asyncio.Future[PublishInfo]] = {}
        self._known_masters: set[str] = set()
        self._valid_topics: set[str] = set()
        self._default_topic_queue_nums_text = str(default_topic_queue_nums)
        # (topic, broker name) -> the header template of a plain message's send to it, or
        # None when a name needs JSON escaping (such sends are encoded the general way).
        self._send_templates: dict[tuple[str, str], JsonRequestTemplate | None] = {}
        self._client_name = f"producer {group!r}"
        # Replies to this producer's requests arrive on its broker connections.
        self._replies = ReplyWaiters()
        self._replies.register(self._instance.remoting)
        self._request_topics: set[str] = set()
        namesrv_addresses = self._instance.namesrv_addresses
        self.tracer: Tracer | None = (
            Tracer(new_trace_dispatcher(namesrv_addresses, trace_topic,
                                        credentials=credentials,
                                        tls=self._instance.tls_context),
                   group, self._instance.client_id)
            if enable_msg_trace else None
        )

    # -- life cycle ------------------------------------------------------------------------

    @property
    def client_id(self) -> str:
        """This producer's client id, ``<ip>@<instance name>``."""
        return self._instance.client_id

    async def start(self) -> None:
        """Start background route refresh and heartbeats. Idempotent.

        Raises:
            ClientStateError: the producer was closed.
        """
        if not self._begin_start():
            return
        await self._instance.start()
        if self.tracer is not None:
            self.tracer.dispatcher.start()
        self._state = "running"

    async def close(self) -> None:
        """Write the trace records still buffered (if tracing), unregister from the brokers
        and close all connections. Idempotent."""
        was_running = self._begin_close()
        if was_running is None:
            return
        if self.tracer is not None:
            await self.tracer.dispatcher.close()
        if was_running:
            await leave_quietly(self._instance, producer_group=self.group)
        await self._instance.close()
        self._closed()

    # -- sending ---------------------------------------------------------------------------

    async def send(
        self,
        message: Message,
        *,
        sharding_key: str | None = None,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        timeout_ms: int | None = None,
    ) -> SendResult:
        """Send one message and wait until the broker stored it.

        Args:
            message: the message; it gets a UNIQ_KEY property unless it has one. For a
                ``%RETRY%<group>`` topic its RECONSUME_TIME and MAX_RECONSUME_TIMES properties
                move into the request header, as a consumer re-sending a message needs.
            sharding_key: send to the queue this key hashes to (ordered per key).
            queue: send to exactly this queue.
            selector: ``selector(queues, message) -> queue`` picks the queue.
            timeout_ms: overall budget; ``send_timeout_ms`` by default.

        Returns:
            The SendResult; its status says how durable the store was.

        Raises:
            InvalidTopicName, InvalidMessage, MessageTooLarge: the message fails a check;
                nothing was sent.
            NoRouteError: no broker serves the topic and it cannot be auto-created.
            BrokerRejected: the broker refused the message (``.code``, ``.remark``).
            RemotingError: every attempt failed in transport (timeout, connect, closed).
            ClientStateError: the producer is not started.
        """
        self._check_running()
        topic = message.topic
        body = message.body
        # _validate's and _maybe_compress's common cases tested here, without their calls.
        if topic not in self._valid_topics or not 0 < len(body) <= self.max_message_size:
            self._validate(message)
        properties = message.properties
        unique_key = properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        unique_key_generated = unique_key is None  # hex digits: nothing to escape in JSON
        born_ms = time.time_ns() // 1_000_000
        if unique_key_generated:
            # The key's time part from the born timestamp's clock reading: one read a send.
            unique_key = properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = new_unique_key(
                born_ms)
        if len(body) < self.compress_over_bytes:
            sysflag = 0
        else:
            body, sysflag = self._maybe_compress(body)
        flag = message.flag
        sysflag_text = str(sysflag) if sysflag else "0"
        born_text = str(born_ms)
        flag_text = str(flag) if flag else "0"
        code = _SEND_MESSAGE_V2_CODE
        fields: dict[str, str] | None
        plain: tuple[str, str, str, str] | None = None
        if len(properties) == 1 and not topic.startswith(RETRY_PREFIX):
            # The common message: no property but its unique key (no tags, keys, reply
            # type, retry counts), rendered as encode_properties renders it.
            if len(unique_key) > _PROPERTIES_CHARS_ALWAYS_OK - len(_UNIQ_KEY_PROPERTY_HEAD):
                check_properties_size(topic, f"{_UNIQ_KEY_PROPERTY_HEAD}{unique_key}")
            plain = (sysflag_text, born_text, flag_text, unique_key)
            if (self._instance.remoting.request_hook is None
                    and (unique_key_generated or json_plain(unique_key))):
                # No request hook signing it and nothing to escape: its header is rendered
                # in the attempt loop from the template of its topic and broker
                # (``_send_templates``), not built as a dict and encoded; the bytes are the
                # same.
                fields = None
            else:
                fields = self._plain_fields(topic, plain)
        else:
            # A retry's reconsume counts leave the properties for the header first.
            retry_fields = (_retry_header_fields(properties) if topic.startswith(RETRY_PREFIX)
                            else None)
            properties_text = encode_properties(properties)
            if len(properties_text) > _PROPERTIES_CHARS_ALWAYS_OK:
                check_properties_size(topic, properties_text)
            fields = self._send_fields(topic, sysflag_text, born_text, flag_text,
                                       properties_text)
            if retry_fields:
                fields.update(retry_fields)
            # A reply (request_reply.reply_message) is sent with its own code, so the broker
            # pushes it to its requester.
            if is_reply(message):
                code = _SEND_REPLY_MESSAGE_V2_CODE
        if self.tracer is None:
            if (fields is None and sharding_key is None and queue is None and selector is None
                    and (info := self._publish.get(topic)) is not None and info.queues):
                # The common send: its first attempt made here, in this coroutine, not in a
                # _send_request coroutine of its own (one frame less to make, resume and
                # clear per send); a failed first attempt goes on there, as it would have.
                loop = self._instance.loop or asyncio.get_running_loop()
                started = loop.time()  # of the send and of its attempt
                budget_s = (timeout_ms if timeout_ms is not None else self.send_timeout_ms) / 1000
                deadline = started + budget_s
                target = info.round_robin.select(info.queues, self.faults, None)
                broker_name = target.broker_name
                address = self._instance.master_address(broker_name)
                if address is None:
                    address = await self._instance.find_master(broker_name, topic)
                    started = loop.time()
                remaining_ms = int((deadline - started) * 1000)
                if remaining_ms <= 0:
                    raise self._no_time_left(topic, budget_s)
                template = self._send_templates.get((topic, broker_name))
                if template is not None:
                    sysflag_text, born_text, flag_text, key = plain  # type: ignore[misc]
                    request = template.render(next_opaque(), (
                        str(target.queue_id), sysflag_text, born_text, flag_text,
                        f"{_UNIQ_KEY_JSON_HEAD}{key}"), body)
                else:
                    request = self._plain_request(
                        code, topic, target, plain, body)  # type: ignore[arg-type]
                try:
                    response = await self._instance.remoting.invoke_written(
                        address, request, remaining_ms)
                except RemotingError as e:
                    error: Exception = e
                    self._attempt_failed(e, topic, broker_name, address, 0,
                                         1 + self.retry_times_when_send_failed)
                else:
                    status = _STORED_STATUS.get(response.code)
                    if status is not None:
                        self.faults.record_latency(broker_name, (loop.time() - started) * 1000)
                        return _send_result(status, response, unique_key, topic, target, address)
                    error = self._refused(response, topic, target, broker_name, address, 0,
                                         1 + self.retry_times_when_send_failed)
                return await self._send_request(
                    code, topic, fields, body, unique_key, message, None, None, None,
                    timeout_ms, plain, (deadline, broker_name, error),
                )
            return await self._send_request(
                code, topic, fields, body, unique_key, message,
                sharding_key, queue, selector, timeout_ms, plain,
            )
        started_ms = time.time_ns() // 1_000_000
        result = await self._send_request(
            code, topic, fields, body, unique_key, message,
            sharding_key, queue, selector, timeout_ms, plain,
        )
        self.tracer.sent((message,), result, started_ms,
                         self._instance.master_address(result.queue.broker_name))
        return result

    async def request(self, message: Message, timeout_ms: int = REQUEST_TIMEOUT_MS_DEFAULT,
                      **options: Any) -> MessageExt:
        """Send ``message`` as a request and return the reply a consumer sends back
        (RocketMQ's request-reply; the consumer answers with ``request_reply.reply_message``
        or a ``request_reply.replying`` listener).

        Args:
            message: the request; it gets CORRELATION_ID, REPLY_TO_CLIENT and TTL properties.
            timeout_ms: how long to wait for the reply, the send included.
            options: as ``send`` (``sharding_key``, ``queue``, ``selector``).

        Returns:
            The reply message (body, properties, the replier's born and store hosts).

        Raises:
            RequestTimeout: no reply within ``timeout_ms``.
            and what ``send`` raises.
        """
        self._check_running()
        if message.topic not in self._request_topics:
            # The broker pushes the reply to this client only if it knows it: announce it to
            # the brokers of the topic before the first request (as RocketMQ's client does).
            await self.queues(message.topic)
            await self._instance.send_heartbeat()
            self._request_topics.add(message.topic)
        return await send_request(self, self._replies, message, timeout_ms, **options)

    def request_with_callback(
        self, message: Message, on_reply: Callable[[MessageExt], Any],
        on_error: Callable[[BaseException], Any] | None = None,
        timeout_ms: int = REQUEST_TIMEOUT_MS_DEFAULT, **options: Any,
    ) -> asyncio.Task[None]:
        """Send a request and return at once; ``on_reply(reply)`` or ``on_error(exception)``
        is called on the event loop when it ends (RocketMQ's request with a RequestCallback).
        An error without ``on_error`` is logged."""

        async def run() -> None:
            try:
                reply = await self.request(message, timeout_ms, **options)
            except Exception as exc:
                if on_error is None:
                    log.warning("request to topic %s failed: %s", message.topic, exc)
                else:
                    on_error(exc)
                return
            on_reply(reply)

        return asyncio.get_running_loop().create_task(run(), name="tidemq-request")

    async def send_batch(
        self,
        messages: Sequence[Message],
        *,
        sharding_key: str | None = None,
        queue: MessageQueue | None = None,
        timeout_ms: int | None = None,
    ) -> list[SendResult]:
        """Send messages of one topic as SEND_BATCH_MESSAGE requests.

        The list is split into request-sized chunks (each at most ``max_message_size`` bytes
        encoded), sent one after the other in order. Each chunk is stored atomically on one
        queue; ``sharding_key`` or ``queue`` put every chunk on the same queue.

        Returns:
            One SendResult per chunk (request), in order: ``msg_id`` / ``offset_msg_id`` hold
            the ids of its messages joined by ``,`` (``msg_ids`` splits them); ``queue_offset``
            is the offset of the chunk's first message, the others follow consecutively.

        Raises:
            InvalidMessage: an empty list, several topics, a delay level, a retry topic.
            InvalidTopicName, MessageTooLarge: as ``send``.
            BrokerRejected, RemotingError, NoRouteError: as ``send``. Chunks sent before the
                failure stay stored; the error's ``sent`` attribute lists their results.
        """
        self._check_running()
        topic = check_batch(messages, self.max_message_size)
        chunks = split_batch(messages, new_unique_key, self.max_message_size)
        results: list[SendResult] = []
        tracer = self.tracer
        first = 0  # index in messages of the chunk's first message
        for chunk in chunks:
            started_ms = time.time_ns() // 1_000_000
            fields = {
                "a": self.group,
                "b": topic,
                "c": AUTO_CREATE_TOPIC_KEY,
                "d": self._default_topic_queue_nums_text,
                "e": "0",
                "f": "0",
                "g": str(time.time_ns() // 1_000_000),
                "h": "0",
                "m": "true",
            }
            try:
                result = await self._send_request(
                    RequestCode.SEND_BATCH_MESSAGE, topic, fields, chunk.body,
                    ",".join(chunk.unique_keys), None, sharding_key, queue, None, timeout_ms,
                )
            except Exception as e:
                e.sent = results  # type: ignore[attr-defined]
                raise
            results.append(result)
            if tracer is not None:
                tracer.sent(messages[first:first + chunk.message_count], result, started_ms,
                            self._instance.master_address(result.queue.broker_name))
            first += chunk.message_count
        return results

    async def send_oneway(
        self,
        message: Message,
        *,
        sharding_key: str | None = None,
        queue: MessageQueue | None = None,
    ) -> None:
        """Send one message without waiting for the broker's answer (no result, no retry).

        Returns once the request is written to the connection; the broker may still refuse
        or lose it. Use for logs and metrics where throughput beats certainty.

        Raises:
            InvalidTopicName, InvalidMessage, MessageTooLarge, NoRouteError, RemotingError:
                as ``send`` (transport errors only when the request could not be written).
        """
        self._check_running()
        self._validate(message)
        properties = message.properties
        if PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX not in properties:
            properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = new_unique_key()
        body, sysflag = self._maybe_compress(message.body)
        properties_text = encode_properties(properties)
        if len(properties_text) > _PROPERTIES_CHARS_ALWAYS_OK:
            check_properties_size(message.topic, properties_text)
        info = await self._publish_info(message.topic)
        target = self._choose_queue(info, message, sharding_key, queue, None, None)
        address = await self._instance.find_master(target.broker_name, message.topic)
        fields = {
            "a": self.group, "b": message.topic, "c": AUTO_CREATE_TOPIC_KEY,
            "d": self._default_topic_queue_nums_text, "e": str(target.queue_id),
            "f": str(sysflag), "g": str(time.time_ns() // 1_000_000), "h": str(message.flag),
            "i": properties_text, "n": target.broker_name,
        }
        request = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, fields, body, oneway=True)
        await self._instance.remoting.invoke_oneway(address, request, self.send_timeout_ms)

    def _validate(self, message: Message) -> None:
        body_size = len(message.body)
        if message.topic in self._valid_topics and 0 < body_size <= self.max_message_size:
            return  # the common case: a topic already checked, a body within bounds
        validate_message(message, self.max_message_size)
        if len(self._valid_topics) < VALID_TOPICS_CACHED_MAX:
            self._valid_topics.add(message.topic)

    def _maybe_compress(self, body: bytes) -> tuple[bytes, int]:
        if len(body) < self.compress_over_bytes:
            return body, 0
        compressed = zlib.compress(body, self.compress_level)
        if len(compressed) >= len(body):
            return body, 0  # incompressible: sending it compressed only costs the consumer
        return compressed, SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_ZLIB

    async def _send_request(
        self,
        code: int,
        topic: str,
        fields: dict[str, str] | None,
        body: bytes,
        msg_id: str,
        message: Message | None,
        sharding_key: str | None,
        queue: MessageQueue | None,
        selector: QueueSelector | None,
        timeout_ms: int | None,
        plain: tuple[str, str, str, str] | None = None,
        after_first: tuple[float, str, Exception] | None = None,
    ) -> SendResult:
        """Send to a queue of ``topic``, retrying elsewhere as configured. The request's
        extFields are ``fields`` (fields ``e`` and ``n`` set per attempt), or with ``fields``
        None a plain message's, rendered from its template with ``plain``: the sysflag, the
        born timestamp and the flag as text, and the unique key (its only property, with
        nothing to escape in JSON; ``send``). ``after_first``: ``send`` made the first
        attempt of an unordered send itself and it failed: (the send's deadline in loop
        time, the broker it tried, the error, already handled by ``_attempt_failed`` or
        ``_refused``); the attempts left are made here."""
        loop = self._instance.loop or asyncio.get_running_loop()
        budget_s = (timeout_ms if timeout_ms is not None else self.send_timeout_ms) / 1000
        ordered = sharding_key is not None or queue is not None or selector is not None
        attempts = 1 if ordered else 1 + self.retry_times_when_send_failed
        failed_broker: str | None = None
        last_error: Exception | None = None
        first_attempt = 0
        if after_first is None:
            deadline = loop.time() + budget_s
        else:
            deadline, failed_broker, last_error = after_first
            first_attempt = 1
        info = self._publish.get(topic)
        if info is None or not info.queues:  # else known already: no coroutine to await
            info = await self._publish_info(topic)
        remoting = self._instance.remoting
        for attempt in range(first_attempt, attempts):
            if ordered:
                target = self._choose_queue(info, message, sharding_key, queue, selector, None)
            else:
                target = info.round_robin.select(info.queues, self.faults, failed_broker)
            broker_name = target.broker_name
            address = self._instance.master_address(broker_name)
            if address is None:
                address = await self._instance.find_master(broker_name, topic)
            started = loop.time()  # of the attempt (one clock read for its budget and latency)
            remaining_ms = int((deadline - started) * 1000)
            if remaining_ms <= 0 or (last_error is not None and remaining_ms <= _RETRY_MIN_MS):
                break
            if fields is None:
                request = self._plain_request(
                    code, topic, target, plain, body)  # type: ignore[arg-type]
            else:
                if attempt:
                    fields = dict(fields)  # the previous request may still hold the old dict
                fields["e"] = str(target.queue_id)
                fields["n"] = broker_name
                # ``fields`` is this attempt's own dict (copied above for a retry): the
                # request takes it as it is instead of copying it as RemotingCommand.request
                # does.
                request = RemotingCommand(int(code), next_opaque(), 0, None, fields, body)
            try:
                # Written at the call; awaited as the answer's own future, no coroutine of
                # the connection's around it (RemotingClient.invoke_written).
                response = await remoting.invoke_written(address, request, remaining_ms)
            except RemotingError as e:
                last_error = e
                failed_broker = broker_name
                self._attempt_failed(e, topic, broker_name, address, attempt, attempts)
                continue
            status = _STORED_STATUS.get(response.code)
            if status is not None:
                self.faults.record_latency(broker_name, (loop.time() - started) * 1000)
                return _send_result(status, response, msg_id, topic, target, address)
            last_error = self._refused(response, topic, target, broker_name, address,
                                       attempt, attempts)
            failed_broker = broker_name
        if last_error is not None:
            raise last_error
        raise self._no_time_left(topic, budget_s)

    def _attempt_failed(self, error: RemotingError, topic: str, broker_name: str,
                        address: str, attempt: int, attempts: int) -> None:
        """The bookkeeping of an attempt that failed in transport: the broker is avoided for
        a while and the topic's route refreshed soon."""
        self.faults.mark_failed(broker_name)
        self._instance.refresh_route_soon(topic)
        log.info("send to %s (%s) failed, attempt %d of %d: %s", broker_name, address,
                 attempt + 1, attempts, error)

    def _refused(self, response: RemotingCommand, topic: str, target: MessageQueue,
                 broker_name: str, address: str, attempt: int,
                 attempts: int) -> BrokerRejected:
        """The error of an attempt the broker answered with a code that is not "stored":
        returned, with the broker avoided for a while, when another attempt may follow
        (``SEND_RETRY_CODES``).

        Raises:
            BrokerRejected: any other code (no attempt follows).
        """
        error = BrokerRejected(
            f"send to topic {topic!r} queue {target.queue_id}", response.code,
            response.remark, f"{broker_name} ({address})",
        )
        if response.code not in SEND_RETRY_CODES:
            raise error
        self.faults.mark_failed(broker_name)
        self._instance.refresh_route_soon(topic)
        log.info("send to %s refused, attempt %d of %d: %s", broker_name, attempt + 1,
                 attempts, error)
        return error

    @staticmethod
    def _no_time_left(topic: str, budget_s: float) -> RemotingTimeout:
        return RemotingTimeout(
            f"send to topic {topic!r} used its whole timeout of {budget_s * 1000:.0f} ms "
            "before a broker could be tried (send_timeout_ms)"
        )

    def _plain_request(self, code: int, topic: str, target: MessageQueue,
                       plain: tuple[str, str, str, str], body: bytes) -> RemotingCommand:
        """A plain message's request to ``target`` (``plain`` as ``_send_request`` takes
        it): rendered from the template of its topic and broker (made at the first send
        there), or, when a name needs JSON escaping, built from its extFields."""
        broker_name = target.broker_name
        template = self._send_templates.get((topic, broker_name), _NO_TEMPLATE)
        if template is _NO_TEMPLATE:
            template = self._send_template(code, topic, broker_name)
        if template is not None:
            sysflag_text, born_text, flag_text, key = plain
            return template.render(next_opaque(), (
                str(target.queue_id), sysflag_text, born_text, flag_text,
                f"{_UNIQ_KEY_JSON_HEAD}{key}"), body)
        fields = self._plain_fields(topic, plain)
        fields["e"] = str(target.queue_id)
        fields["n"] = broker_name
        return RemotingCommand(int(code), next_opaque(), 0, None, fields, body)

    def _send_template(self, code: int, topic: str,
                       broker_name: str) -> JsonRequestTemplate | None:
        """The header template of a plain message's send to ``broker_name`` (made once)."""
        try:
            template: JsonRequestTemplate | None = JsonRequestTemplate(code, {
                "a": self.group, "b": topic, "c": AUTO_CREATE_TOPIC_KEY,
                "d": self._default_topic_queue_nums_text, "e": None, "f": None, "g": None,
                "h": None, "i": None, "n": broker_name,
            })
        except ValueError:  # a name that needs escaping: encoded the general way
            template = None
        self._send_templates[(topic, broker_name)] = template
        return template

    def _plain_fields(self, topic: str, plain: tuple[str, str, str, str]) -> dict[str, str]:
        """The extFields of a plain message's send (without ``e`` and ``n``) from the
        values ``send`` prepared for the template."""
        sysflag, born, flag, unique_key = plain
        return self._send_fields(topic, sysflag, born, flag,
                                 f"{_UNIQ_KEY_PROPERTY_HEAD}{unique_key}")

    def _send_fields(self, topic: str, sysflag: str, born: str, flag: str,
                     properties_text: str) -> dict[str, str]:
        """A send's extFields but the queue id and the broker name (``e`` and ``n``, set by
        ``_send_request`` per attempt) and a retry's reconsume fields."""
        return {
            "a": self.group, "b": topic, "c": AUTO_CREATE_TOPIC_KEY,
            "d": self._default_topic_queue_nums_text, "f": sysflag, "g": born, "h": flag,
            "i": properties_text,
        }

    def _choose_queue(
        self,
        info: PublishInfo,
        message: Message | None,
        sharding_key: str | None,
        queue: MessageQueue | None,
        selector: QueueSelector | None,
        avoid_broker: str | None,
    ) -> MessageQueue:
        if queue is not None:
            return queue
        if sharding_key is not None:
            return select_by_sharding_key(info.queues, sharding_key)
        if selector is not None:
            chosen = selector(list(info.queues), message)  # type: ignore[arg-type]
            if not isinstance(chosen, MessageQueue):
                raise TypeError(
                    f"queue selector returned {chosen!r}; it must return one of the "
                    "MessageQueue objects it was given"
                )
            return chosen
        return info.round_robin.select(info.queues, self.faults, avoid_broker)

    # -- routes ----------------------------------------------------------------------------

    async def queues(self, topic: str) -> list[MessageQueue]:
        """The publish queues of ``topic`` this producer would send to (routes fetched once).

        Raises:
            NoRouteError: no broker serves the topic and it cannot be auto-created.
        """
        self._check_running()
        return list((await self._publish_info(topic)).queues)

    async def _publish_info(self, topic: str) -> PublishInfo:
        info = self._publish.get(topic)
        if info is not None and info.queues:
            return info
        lookup = self._route_lookups.get(topic)
        if lookup is None:
            # One lookup per topic however many sends wait for it.
            lookup = asyncio.ensure_future(self._look_up_publish_info(topic))
            self._route_lookups[topic] = lookup
            lookup.add_done_callback(lambda _: self._route_lookups.pop(topic, None))
        return await asyncio.shield(lookup)

    async def _look_up_publish_info(self, topic: str) -> PublishInfo:
        route = await self._instance.fetch_route(topic)
        from_default = False
        if route is None or not route.publish_queues(topic):
            template = await self._instance.fetch_route(AUTO_CREATE_TOPIC_KEY)
            if template is None or not template.publish_queues(topic):
                raise NoRouteError(
                    f"no broker serves topic {topic!r} and auto-creation is unavailable (the "
                    f"name servers {';'.join(self._instance.namesrv_addresses)} have no "
                    f"writable {AUTO_CREATE_TOPIC_KEY} route); create the topic with "
                    f"'tidemq admin updateTopic -t {topic} -c <cluster>' or start the broker "
                    "with --autoCreateTopicEnable true"
                )
            route = template.with_queue_nums_capped(self.default_topic_queue_nums)
            from_default = True
            self._instance.topics_of_interest.add(topic)
        info = self._publish.get(topic)
        queues = route.publish_queues(topic)
        if info is None:
            info = PublishInfo(queues, RoundRobin(_random_start()), from_default,
                               bool(route.order_topic_conf))
            self._publish[topic] = info
        else:
            info.queues = queues
            info.from_default_topic = from_default
        self._heartbeat_new_masters()
        return info

    def _route_changed(self, topic: str, route: TopicRouteData) -> None:
        info = self._publish.get(topic)
        if info is not None:
            queues = route.publish_queues(topic)
            if queues:
                info.queues = queues
                info.from_default_topic = False
                info.order_topic = bool(route.order_topic_conf)
        self._heartbeat_new_masters()

    def _heartbeat_new_masters(self) -> None:
        masters = set(self._instance.master_addresses())
        if masters - self._known_masters and self._state == "running":
            self._known_masters = masters
            self._instance.spawn(self._instance.send_heartbeat())

    def _heartbeat_data(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return [{"groupName": self.group}], []


def new_trace_dispatcher(namesrv: str | Iterable[str], topic: str | None, *,
                         credentials: Credentials | None = None,
                         tls: TlsOption = None) -> TraceDispatcher:
    """A dispatcher writing to ``topic`` (default RMQ_SYS_TRACE_TOPIC) through a producer of
    its own (group ``_INNER_TRACE_PRODUCER``, signing and TLS as the traced client), started
    at its first write so that a missing name server delays traces, never the traced
    client's start."""
    sender = _TraceSender(Producer(
        TRACE_PRODUCER_GROUP, namesrv,
        instance_name=f"tidemq-trace-{os.getpid()}-{next(_trace_producers)}",
        # As Java's trace producer, compress bodies over 4 KiB: the ~190 bytes of text a
        # record holds shrink about 20-fold, so a trace message stores ~5 times fewer
        # bytes (its KEYS, ~33 bytes a record, stay), and the broker saves about what
        # level 1 costs the client (~0.3-0.4 us per record); RESULTS.md, "Message trace
        # cost, second pass (issue 15, owner: trace)".
        compress_over_bytes=COMPRESS_OVER_BYTES,
        compress_level=TRACE_COMPRESS_LEVEL,
        retry_times_when_send_failed=0,
        credentials=credentials,
        tls=tls,
    ))
    return TraceDispatcher(topic or TRACE_TOPIC_DEFAULT, sender.send, sender.producer.close)


class _TraceSender:
    """Sends trace messages with a producer started by the first send (one start however
    many sends wait for it; a failed start is tried again by the next send)."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self._starting: asyncio.Future[None] | None = None

    async def send(self, topic: str, body: bytes, keys: list[str]) -> None:
        if self.producer.state != "running":
            starting = self._starting
            if starting is None or (starting.done() and (starting.cancelled()
                                                         or starting.exception() is not None)):
                self._starting = asyncio.ensure_future(self.producer.start())
            await asyncio.shield(self._starting)
        await self.producer.send(Message(topic, body, keys=keys))


_trace_producers = itertools.count()


_NO_TEMPLATE: Any = object()  # not made yet (None: cannot be made)


def _retry_header_fields(properties: dict[str, str]) -> dict[str, str]:
    """A message re-sent to ``%RETRY%<group>`` by a consumer carries its reconsume times and
    limit as properties; like the Java producer, move them into the request header (fields
    ``j`` reconsumeTimes and ``l`` maxReconsumeTimes), where the broker reads them."""
    fields: dict[str, str] = {}
    reconsume_times = properties.pop(PROPERTY_RECONSUME_TIME, None)
    if reconsume_times is not None:
        fields["j"] = reconsume_times
    max_reconsume_times = properties.pop(PROPERTY_MAX_RECONSUME_TIMES, None)
    if max_reconsume_times is not None:
        fields["l"] = max_reconsume_times
    return fields


def _random_start() -> int:
    # Producers started together should not all hit queue 0 first.
    return int.from_bytes(os.urandom(2), "big")


def _send_result(
    status: SendStatus,
    response: RemotingCommand,
    msg_id: str,
    topic: str,
    target: MessageQueue,
    address: str,
) -> SendResult:
    """The result of a send to ``target`` (a queue of ``topic``) the broker answered with
    ``response``, a stored code."""
    ext = response.ext_fields or {}
    try:
        queue_id = int(ext["queueId"])
        queue_offset = int(ext["queueOffset"])
        offset_msg_id = ext["msgId"]
    except (KeyError, ValueError) as e:
        raise RemoteProtocolError(
            f"send response from {target.broker_name} ({address}) lacks a valid {e} header "
            "field"
        ) from None
    # The broker names the queue it was asked for: the target itself, unless it said another.
    queue = (target if queue_id == target.queue_id and target.topic == topic
             else MessageQueue(topic, target.broker_name, queue_id))
    return new_send_result(
        status, msg_id, offset_msg_id, queue, queue_offset, ext.get("MSG_REGION"),
        ext.get("TRACE_ON", "true") != "false", ext.get("transactionId"),
    )

"""Broker requests shared by the consumers and the admin client: pull, offsets, messages by
id, group members, queue locks and send-back.

Each function sends one request to one broker address through a ``ClientInstance`` and turns
the response into Python values, raising ``BrokerRejected`` (with the broker's code and remark)
for error codes a caller cannot use. Request and response fields are those of
docs/protocol.md §4.4, §4.5, §4.8, §4.12 to §4.15.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable
from typing import Any

from tidemq.client.errors import BrokerRejected
from tidemq.client.instance import ClientInstance, check_response
from tidemq.client.message import MessageQueue, PullResult, PullStatus
from tidemq.client.subscription import Subscription
from tidemq.errors import HeaderFieldError, RemoteProtocolError
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import JsonRequestTemplate, RemotingCommand, next_opaque
from tidemq.protocol.headers import (
    GetEarliestMsgStoretimeResponseHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetResponseHeader,
    SearchOffsetResponseHeader,
    read_pull_answer_numbers,
)
from tidemq.protocol.message import MessageExt
from tidemq.protocol.pulled_records import decode_pulled_records

# PullSysFlag bits (docs/protocol.md §4.4).
PULL_COMMIT_OFFSET = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4
PULL_LITE = 0x10

# Lite pull consumer timings (docs/protocol.md §11.5): the broker holds a pull for up to 20 s;
# the client waits 10 s longer for the answer so a held pull is never cut short by us.
BROKER_SUSPEND_MAX_MS = 20_000
PULL_RESPONSE_GRACE_MS = 10_000
# The code as a plain int: an IntEnum member takes the header encoder's careful path.
PULL_MESSAGE_CODE = int(RequestCode.PULL_MESSAGE)

_PULL_STATUS = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}

logger = logging.getLogger(__name__)


async def pull_message(
    instance: ClientInstance,
    address: str,
    group: str,
    queue: MessageQueue,
    offset: int,
    max_nums: int,
    subscription: Subscription,
    *,
    suspend_timeout_ms: int = 0,
    timeout_ms: int | None = None,
    commit_offset: int | None = None,
    lite: bool = True,
    check_crc: bool = True,
) -> PullResult:
    """PULL_MESSAGE: up to ``max_nums`` messages of ``queue`` from ``offset``.

    The subscription travels with the request (SUBSCRIPTION flag), so no heartbeat is needed
    first; a TAG subscription's messages are checked again here by tag string (the broker
    filters by tag hash), a SQL92 one's are not (the broker alone evaluates SQL92).
    With ``suspend_timeout_ms`` > 0 the broker may hold the request that long waiting
    for a message (long polling). A ``commit_offset`` > 0 is stored by the broker as the
    group's offset of the queue on the way (COMMIT_OFFSET flag), as a push consumer does with
    every pull; ``lite`` marks a lite-pull consumer's request (LITE_PULL flag).
    ``check_crc`` leaves out (and logs) messages whose body fails its CRC (decode_messages).

    Returns:
        The PullResult: FOUND with the decoded messages (bodies decompressed, tag-filtered by
        string, ``broker_name`` set), or NO_NEW_MSG / NO_MATCHED_MSG / OFFSET_ILLEGAL with
        where to go next.

    Raises:
        BrokerRejected: another response code (no permission, unknown topic, ...).
        RemotingError: transport failure.
        RemoteProtocolError: the response is malformed.
    """
    fields = pull_request_fields(group, queue, offset, max_nums, subscription,
                                 suspend_timeout_ms=suspend_timeout_ms,
                                 commit_offset=commit_offset, lite=lite)
    if timeout_ms is None:
        timeout_ms = pull_timeout_ms(instance, suspend_timeout_ms)
    # The fields are this request's own dict: no copy (ClientInstance.invoke copies).
    request = RemotingCommand(PULL_MESSAGE_CODE, next_opaque(), 0, None, fields)
    response = await instance.remoting.invoke(address, request,
                                              timeout_ms or instance.request_timeout_ms)
    return decode_pull_response(response, queue, subscription, address, check_crc=check_crc)


def pull_request_fields(
    group: str,
    queue: MessageQueue,
    offset: int,
    max_nums: int,
    subscription: Subscription,
    *,
    suspend_timeout_ms: int = 0,
    commit_offset: int | None = None,
    lite: bool = True,
) -> dict[str, str]:
    """The extFields of a PULL_MESSAGE request (a new dict; see ``pull_message``)."""
    sysflag = (PULL_SUBSCRIPTION | PULL_LITE) if lite else PULL_SUBSCRIPTION
    if suspend_timeout_ms > 0:
        sysflag |= PULL_SUSPEND
    if commit_offset is not None and commit_offset > 0:
        sysflag |= PULL_COMMIT_OFFSET
    else:
        commit_offset = 0
    return {
        "consumerGroup": group,
        "topic": queue.topic,
        "queueId": str(queue.queue_id),
        "queueOffset": str(offset),
        "maxMsgNums": str(max_nums),
        "sysFlag": str(sysflag),
        "commitOffset": str(commit_offset),
        "suspendTimeoutMillis": str(suspend_timeout_ms),
        "subscription": subscription.expression,
        "subVersion": str(subscription.version_ms),
        "expressionType": subscription.expression_type,
    }


class PullRequestTemplate:
    """The PULL_MESSAGE requests of one queue with one subscription, rendered from a template
    (``JsonRequestTemplate``): only the offset, the offset to commit and the flags that go
    with it change from one pull to the next. Byte for byte the request of
    ``pull_request_fields`` with the same arguments; made by ``pull_request_template``.
    """

    __slots__ = ("_sysflag_committing", "_sysflag_plain", "_template")

    def __init__(self, template: JsonRequestTemplate, sysflag: int) -> None:
        self._template = template
        self._sysflag_plain = str(sysflag)
        self._sysflag_committing = str(sysflag | PULL_COMMIT_OFFSET)

    def render(self, offset: int, commit_offset: int | None = None) -> RemotingCommand:
        """The pull at ``offset`` committing ``commit_offset`` (when above 0), with the next
        opaque of this process."""
        if commit_offset is not None and commit_offset > 0:
            values = (str(commit_offset), str(offset), self._sysflag_committing)
        else:
            values = ("0", str(offset), self._sysflag_plain)
        return self._template.render(next_opaque(), values)


def pull_request_template(
    group: str,
    queue: MessageQueue,
    max_nums: int,
    subscription: Subscription,
    *,
    suspend_timeout_ms: int = 0,
    lite: bool = True,
) -> PullRequestTemplate | None:
    """The template of ``queue``'s pulls (arguments as ``pull_request_fields``), or None when
    a value needs JSON escaping (a SQL92 expression with a quote, say): build those requests
    from ``pull_request_fields`` then."""
    fields: dict[str, str | None] = dict(pull_request_fields(
        group, queue, 0, max_nums, subscription, suspend_timeout_ms=suspend_timeout_ms,
        lite=lite))
    sysflag = int(fields["sysFlag"])  # type: ignore[arg-type]
    fields["commitOffset"] = fields["queueOffset"] = fields["sysFlag"] = None
    try:
        return PullRequestTemplate(JsonRequestTemplate(PULL_MESSAGE_CODE, fields), sysflag)
    except ValueError:
        return None


def pull_timeout_ms(instance: ClientInstance, suspend_timeout_ms: int) -> int:
    """How long a pull's answer is waited for: a held pull's hold plus a grace (never cut
    short by us), else the instance's request timeout."""
    return (suspend_timeout_ms + PULL_RESPONSE_GRACE_MS if suspend_timeout_ms > 0
            else instance.request_timeout_ms)


def decode_pull_response(
    response: RemotingCommand,
    queue: MessageQueue,
    subscription: Subscription | None,
    address: str = "broker",
    *,
    check_crc: bool = True,
) -> PullResult:
    """Turn a PULL_MESSAGE response into a PullResult (see ``pull_message``).

    Raises:
        BrokerRejected: the code is not one of 0, 19, 20, 21.
        RemoteProtocolError: the header lacks a field or the body does not decode.
    """
    status = _PULL_STATUS.get(response.code)
    if status is None:
        raise BrokerRejected(f"pull of {queue}", response.code, response.remark, address)
    # The header's four numbers read straight from extFields (the typed header for any text
    # that is not a plain decimal, and its errors): a typed read was ~16 % of an answer's
    # path in the consumer (RESULTS.md, consumer).
    numbers = read_pull_answer_numbers(response.ext_fields)
    if numbers is None:
        try:
            header = PullMessageResponseHeader.from_ext_fields(response.ext_fields)
        except HeaderFieldError as e:
            raise RemoteProtocolError(f"pull response from {address}: {e}") from None
        numbers = (header.suggest_which_broker_id, header.next_begin_offset,
                   header.min_offset, header.max_offset)
    suggested, next_begin_offset, min_offset, max_offset = numbers
    # The result is built with positional arguments: matching eight keywords was more than
    # half of building it (0.64 against 0.26 us), paid once per pull answer.
    body = response.body
    if status is not PullStatus.FOUND or not body:
        return PullResult(status, next_begin_offset, min_offset, max_offset, [], suggested)
    # decode_messages' two steps, without its call: one call fewer per answer.
    damaged: list[MessageExt] | None = [] if check_crc else None
    messages = decode_pulled_records(body, queue.broker_name, damaged=damaged, decompress=True)
    if damaged:
        _log_damaged(damaged)
    filtered = 0
    if subscription is not None and subscription.tags:  # not matches_all (a property call)
        tags = subscription.tags
        received = len(messages)
        messages = [m for m in messages if m.properties.get("TAGS") in tags]
        filtered = received - len(messages)
    return PullResult(status, next_begin_offset, min_offset, max_offset, messages, suggested,
                      filtered, len(body) if messages or filtered else 0)


def decode_messages(
    body: bytes, broker_name: str = "", *, check_crc: bool = True
) -> list[MessageExt]:
    """Decode concatenated stored records; zlib bodies are decompressed in place.

    With ``check_crc`` (the default, like Kafka's ``check.crcs``) each body's CRC is checked
    against the record's BODYCRC first: a message whose body does not match is left out and
    reported as an ERROR naming it (topic, queue, queue offset, msg id), so a damaged stored
    message is never handed to the application as if it were intact; so is a body flagged
    compressed that does not inflate (a damaged SYSFLAG, which no checksum covers).

    One pass over the records (``protocol.pulled_records``): the CRC check, inflating and
    ``broker_name`` happen as each record is decoded, and the fields consumers seldom read
    (properties, hosts, timestamps, ...) are made when first read.

    Raises:
        RemoteProtocolError: a record is malformed, or (without ``check_crc``) a body does
            not decompress.
    """
    damaged: list[MessageExt] | None = [] if check_crc else None
    messages = decode_pulled_records(body, broker_name, damaged=damaged, decompress=True)
    if damaged:
        _log_damaged(damaged)
    return messages


def _log_damaged(damaged: list[MessageExt]) -> None:
    """Log each record ``decode_pulled_records`` set aside as an ERROR naming it."""
    crc32 = zlib.crc32
    for message in damaged:
        crc = crc32(message.body) & 0x7FFFFFFF
        what = (f"its body CRC is {crc:#010x} but the record says {message.body_crc:#010x}"
                if crc != message.body_crc else
                "its record flags the body as compressed but it does not inflate")
        logger.error(
            "message %s of %s queue %d at queue offset %d is damaged: %s; left out (the "
            "broker's store holds damaged bytes there: run 'tidemq store check' on it)",
            message.offset_msg_id, message.topic, message.queue_id, message.queue_offset,
            what,
        )


# -- offsets ------------------------------------------------------------------------------------


def _queue_fields(queue: MessageQueue) -> dict[str, str]:
    return {"topic": queue.topic, "queueId": str(queue.queue_id)}


async def _offset_request(
    instance: ClientInstance, address: str, code: int, fields: dict[str, str], what: str,
    field_name: str = "offset",
) -> int:
    response = await instance.invoke(address, code, fields)
    check_response(response, what, address)
    try:
        return int((response.ext_fields or {})[field_name])
    except (KeyError, ValueError):
        raise RemoteProtocolError(
            f"{what}: response from {address} lacks a numeric {field_name!r} field"
        ) from None


async def max_offset(instance: ClientInstance, address: str, queue: MessageQueue) -> int:
    """GET_MAX_OFFSET: the offset the next message of ``queue`` will get."""
    return await _offset_request(instance, address, RequestCode.GET_MAX_OFFSET,
                                 _queue_fields(queue), f"max offset of {queue}")


async def min_offset(instance: ClientInstance, address: str, queue: MessageQueue) -> int:
    """GET_MIN_OFFSET: the oldest offset of ``queue`` still stored."""
    return await _offset_request(instance, address, RequestCode.GET_MIN_OFFSET,
                                 _queue_fields(queue), f"min offset of {queue}")


async def search_offset(
    instance: ClientInstance, address: str, queue: MessageQueue, timestamp_ms: int
) -> int:
    """SEARCH_OFFSET_BY_TIMESTAMP: the offset of the message stored closest to the time."""
    fields = _queue_fields(queue)
    fields["timestamp"] = str(timestamp_ms)
    response = await instance.invoke(address, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, fields)
    check_response(response, f"offset search by time in {queue}", address)
    return SearchOffsetResponseHeader.from_ext_fields(response.ext_fields).offset


async def earliest_msg_store_time(
    instance: ClientInstance, address: str, queue: MessageQueue
) -> int:
    """GET_EARLIEST_MSG_STORETIME: store time (ms) of the oldest message of ``queue``."""
    response = await instance.invoke(address, RequestCode.GET_EARLIEST_MSG_STORETIME,
                                     _queue_fields(queue))
    check_response(response, f"earliest store time of {queue}", address)
    return GetEarliestMsgStoretimeResponseHeader.from_ext_fields(response.ext_fields).timestamp


async def query_consumer_offset(
    instance: ClientInstance, address: str, group: str, queue: MessageQueue
) -> int | None:
    """QUERY_CONSUMER_OFFSET: ``group``'s committed offset of ``queue``; None when none.

    Raises:
        BrokerRejected: an error code other than QUERY_NOT_FOUND.
    """
    fields = {"consumerGroup": group, **_queue_fields(queue)}
    response = await instance.invoke(address, RequestCode.QUERY_CONSUMER_OFFSET, fields)
    if response.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    check_response(response, f"committed offset of group {group!r} in {queue}", address)
    return QueryConsumerOffsetResponseHeader.from_ext_fields(response.ext_fields).offset


async def update_consumer_offset(
    instance: ClientInstance, address: str, group: str, queue: MessageQueue, offset: int
) -> None:
    """UPDATE_CONSUMER_OFFSET: store ``offset`` as ``group``'s position in ``queue``."""
    fields = {"consumerGroup": group, **_queue_fields(queue), "commitOffset": str(offset)}
    response = await instance.invoke(address, RequestCode.UPDATE_CONSUMER_OFFSET, fields)
    check_response(response, f"commit of offset {offset} for group {group!r} in {queue}",
                   address)


# -- messages by id and key ---------------------------------------------------------------------


async def view_message(
    instance: ClientInstance, address: str, physical_offset: int, *, timeout_ms: int | None = None
) -> MessageExt:
    """VIEW_MESSAGE_BY_ID: the record at ``physical_offset`` of the broker at ``address``."""
    response = await instance.invoke(address, RequestCode.VIEW_MESSAGE_BY_ID,
                                     {"offset": str(physical_offset)}, timeout_ms=timeout_ms)
    check_response(response, f"view of the message at commit-log offset {physical_offset}",
                   address)
    messages = decode_messages(response.body or b"")
    if not messages:
        raise RemoteProtocolError(f"view of offset {physical_offset} at {address} was empty")
    return messages[0]


async def query_messages(
    instance: ClientInstance,
    address: str,
    topic: str,
    key: str,
    max_num: int,
    begin_ms: int,
    end_ms: int,
    *,
    unique_key: bool,
    broker_name: str = "",
) -> list[MessageExt]:
    """QUERY_MESSAGE: messages of ``topic`` indexed under ``key`` in the time range.

    Returns an empty list when the broker finds none (QUERY_NOT_FOUND). The broker matches by
    key hash, so callers filter the result by the exact key.
    """
    fields = {
        "topic": topic,
        "key": key,
        "maxNum": str(max_num),
        "beginTimestamp": str(begin_ms),
        "endTimestamp": str(end_ms),
        "_UNIQUE_KEY_QUERY": "true" if unique_key else "false",
    }
    response = await instance.invoke(address, RequestCode.QUERY_MESSAGE, fields)
    if response.code == ResponseCode.QUERY_NOT_FOUND:
        return []
    check_response(response, f"query of topic {topic!r} by key {key!r}", address)
    return decode_messages(response.body or b"", broker_name)



# -- consumer groups ------------------------------------------------------------------------------


async def consumer_ids(instance: ClientInstance, address: str, group: str) -> list[str]:
    """GET_CONSUMER_LIST_BY_GROUP: the client ids of ``group``'s live members at ``address``.

    Returns an empty list when the broker knows no member (it answers SYSTEM_ERROR then).
    """
    response = await instance.invoke(address, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                     {"consumerGroup": group})
    if response.code != ResponseCode.SUCCESS:
        return []
    body = jsonx.loads(response.body or b"{}")
    if not isinstance(body, dict):
        raise RemoteProtocolError(f"consumer list of group {group!r} from {address} is not a "
                                  "JSON object")
    return [str(member) for member in (body.get("consumerIdList") or [])]


async def consumer_connection(instance: ClientInstance, address: str,
                              group: str) -> dict[str, Any] | None:
    """GET_CONSUMER_CONNECTION_LIST: ``group``'s ConsumerConnection body as a dict
    (``connectionSet``, ``subscriptionTable``, ``messageModel``, ...); None when the broker
    has no live member of the group."""
    response = await instance.invoke(address, RequestCode.GET_CONSUMER_CONNECTION_LIST,
                                     {"consumerGroup": group})
    if response.code != ResponseCode.SUCCESS:
        return None
    body = jsonx.loads(response.body or b"{}")
    return body if isinstance(body, dict) else None


def _lock_body(group: str, client_id: str, queues: Iterable[MessageQueue]) -> bytes:
    return jsonx.dumps({"clientId": client_id, "consumerGroup": group,
                        "mqSet": [queue.to_json() for queue in queues]})


async def lock_batch(
    instance: ClientInstance, address: str, group: str, client_id: str,
    queues: Iterable[MessageQueue],
) -> set[MessageQueue]:
    """LOCK_BATCH_MQ: lock (or renew) ``queues`` of one broker for ``client_id``.

    Returns:
        The queues the broker granted; queues held by another live member are left out.

    Raises:
        BrokerRejected: the broker refused the request.
        RemoteProtocolError: the response body is malformed.
    """
    response = await instance.invoke(address, RequestCode.LOCK_BATCH_MQ, None,
                                     _lock_body(group, client_id, queues))
    check_response(response, f"lock of queues for group {group!r}", address)
    body = jsonx.loads(response.body or b"{}")
    try:
        return {MessageQueue.from_json(item) for item in (body.get("lockOKMQSet") or [])}
    except (AttributeError, TypeError, ValueError) as e:
        raise RemoteProtocolError(f"lock response from {address} is malformed: {e}") from None


async def unlock_batch(
    instance: ClientInstance, address: str, group: str, client_id: str,
    queues: Iterable[MessageQueue],
) -> None:
    """UNLOCK_BATCH_MQ: release ``client_id``'s locks on ``queues`` of one broker.

    Raises:
        BrokerRejected: the broker refused the request.
    """
    response = await instance.invoke(address, RequestCode.UNLOCK_BATCH_MQ, None,
                                     _lock_body(group, client_id, queues))
    check_response(response, f"unlock of queues for group {group!r}", address)


async def send_message_back(
    instance: ClientInstance,
    address: str,
    message: MessageExt,
    group: str,
    *,
    delay_level: int = 0,
    max_reconsume_times: int | None = None,
    origin_topic: str | None = None,
) -> None:
    """CONSUMER_SEND_MSG_BACK: hand a message the group failed to consume back to the broker
    that stored it (docs/protocol.md §4.8).

    The broker stores a copy in ``%RETRY%<group>`` delayed by ``delay_level`` (0: the broker
    picks 3 + reconsume times), or in ``%DLQ%<group>`` when ``delay_level`` < 0 or the
    message used up ``max_reconsume_times``.

    Raises:
        BrokerRejected: the broker refused (message gone, group unknown, ...).
        RemotingError: transport failure.
    """
    fields = {
        "offset": str(message.physical_offset),
        "group": group,
        "delayLevel": str(delay_level),
        "originMsgId": message.msg_id,
        "originTopic": origin_topic or message.topic,
        "unitMode": "false",
    }
    if max_reconsume_times is not None:
        fields["maxReconsumeTimes"] = str(max_reconsume_times)
    response = await instance.invoke(address, RequestCode.CONSUMER_SEND_MSG_BACK, fields)
    check_response(response, f"send-back of message {message.msg_id} for group {group!r}",
                   address)

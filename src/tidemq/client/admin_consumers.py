"""Admin questions about a group's live consumers, asked through the brokers.

Consumers listen on nothing, so an admin asks a broker, which asks the consumers on their
connections and relays the answers (tidemq.broker.client_admin; docs/protocol.md §2, §4.16):
GET_CONSUMER_RUNNING_INFO (307), INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223) and
INVOKE_BROKER_TO_RESET_OFFSET (222). ``Admin`` exposes these as methods; the functions here
take its ``ClientInstance`` and the broker addresses to ask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidemq.client.broker_fanout import ask_each_broker
from tidemq.client.errors import NoRouteError
from tidemq.client.instance import check_response
from tidemq.client.message import MessageQueue
from tidemq.client.queue_keys import message_queue_from_key
from tidemq.errors import RemoteProtocolError
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.headers import (
    GetConsumerRunningInfoRequestHeader,
    GetConsumerStatusRequestHeader,
    ResetOffsetRequestHeader,
)

if TYPE_CHECKING:
    from tidemq.client.instance import ClientInstance

# The broker waits up to 10 s for the consumer (RocketMQ's bound); the admin waits longer so
# the broker's own "no answer" reaches it instead of a bare timeout.
RUNNING_INFO_TIMEOUT_MS = 15_000


@dataclass
class ConsumerRunningInfo:
    """What one live consumer reports about itself (RocketMQ's ConsumerRunningInfo).

    Attributes:
        properties: its settings and facts (``consumerGroup``, ``PROP_CONSUMEORDERLY``,
            ``PROP_CONSUMER_START_TIMESTAMP``, ...), all strings.
        subscriptions: its SubscriptionData objects (``topic``, ``subString``, ...).
        queues: the queues it owns, each with its ProcessQueueInfo (``commitOffset``,
            ``cachedMsgCount``, ``locked``, ...).
        status: per topic, its ConsumeStatus (``consumeFailedMsgs``, rates).
        jstack: its threads' stacks, when asked for.
    """

    properties: dict[str, str] = field(default_factory=dict)
    subscriptions: list[dict[str, Any]] = field(default_factory=list)
    queues: dict[MessageQueue, dict[str, Any]] = field(default_factory=dict)
    status: dict[str, dict[str, Any]] = field(default_factory=dict)
    jstack: str | None = None


async def consumer_running_info(instance: ClientInstance, addresses: list[str], group: str,
                                client_id: str, *, jstack: bool = False
                                ) -> ConsumerRunningInfo:
    """Ask the brokers at ``addresses``, in turn, for consumer ``client_id``'s running info.

    Raises:
        NoRouteError: no broker has that consumer connected (each one's answer is named).
        RemoteProtocolError: the consumer's answer is not a ConsumerRunningInfo.
    """
    fields = GetConsumerRunningInfoRequestHeader(consumer_group=group, client_id=client_id,
                                                 jstack_enable=jstack).to_ext_fields()
    answers, refusals = await ask_each_broker(
        instance, ((address, address) for address in addresses),
        RequestCode.GET_CONSUMER_RUNNING_INFO, fields, timeout_ms=RUNNING_INFO_TIMEOUT_MS,
        first_only=True)
    if answers:
        return _running_info(jsonx.loads(answers[0][1].body or b"{}"))
    raise NoRouteError(f"no running info of consumer {client_id} of group {group!r}: "
                       + ("; ".join(refusals) or "no broker to ask"))


async def consumer_status(instance: ClientInstance, addresses: list[str], group: str,
                          topic: str, client_id: str | None = None
                          ) -> dict[str, dict[MessageQueue, int]]:
    """Each live consumer's offsets of ``topic`` (client id -> queue -> offset), merged over
    the brokers at ``addresses``; only ``client_id`` when given.

    Raises:
        NoRouteError: no broker has a consumer of the group connected.
    """
    fields = GetConsumerStatusRequestHeader(topic=topic, group=group,
                                            client_addr=client_id).to_ext_fields()
    table: dict[str, dict[MessageQueue, int]] = {}
    answers, refusals = await ask_each_broker(
        instance, ((address, address) for address in addresses),
        RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, fields)
    for _, response in answers:
        consumers = jsonx.loads(response.body or b"{}").get("consumerTable") or {}
        for member, offsets in consumers.items():
            mine = table.setdefault(str(member), {})
            for key, offset in (offsets or {}).items():
                mine[message_queue_from_key(key)] = int(offset)
    if not table and refusals:
        raise NoRouteError(f"no consumer status of group {group!r}: " + "; ".join(refusals))
    return {member: dict(sorted(offsets.items())) for member, offsets in sorted(table.items())}


async def reset_live_consumers(instance: ClientInstance, address: str, group: str, topic: str,
                               timestamp_ms: int, *, force: bool) -> dict[MessageQueue, int] | None:
    """INVOKE_BROKER_TO_RESET_OFFSET at one broker: its queues of ``topic`` move to
    ``timestamp_ms`` (-1: the end) and the group's live consumers there are told.

    Returns:
        The new offset of each queue of that broker; None when no consumer of the group is
        connected to it (CONSUMER_NOT_ONLINE: commit the offsets directly instead).

    Raises:
        BrokerRejected: another error answer (the topic is unknown there, or the group never
            committed an offset of it).
    """
    fields = ResetOffsetRequestHeader(topic=topic, group=group, timestamp=timestamp_ms,
                                      is_force=force).to_ext_fields()
    response = await instance.invoke(address, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, fields)
    if response.code == ResponseCode.CONSUMER_NOT_ONLINE:
        return None
    check_response(response, f"reset offsets of group {group!r} in {topic}", address)
    table = jsonx.loads(response.body or b"{}").get("offsetTable") or {}
    return {message_queue_from_key(key): int(offset) for key, offset in table.items()}


def _running_info(document: Any) -> ConsumerRunningInfo:
    if not isinstance(document, dict):
        raise RemoteProtocolError("a consumer's running info is not a JSON object")
    try:
        return ConsumerRunningInfo(
            properties={str(k): str(v) for k, v in (document.get("properties") or {}).items()},
            subscriptions=list(document.get("subscriptionSet") or []),
            queues=dict(sorted(
                (message_queue_from_key(key), dict(value))
                for key, value in (document.get("mqTable") or {}).items())),
            status={str(k): dict(v) for k, v in (document.get("statusTable") or {}).items()},
            jstack=document.get("jstack"),
        )
    except (AttributeError, TypeError, ValueError) as e:
        raise RemoteProtocolError(f"a consumer's running info is malformed: {e}") from None


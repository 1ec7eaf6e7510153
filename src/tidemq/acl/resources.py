"""Which topics and groups a request touches, and the permission each needs.

RocketMQ's ``PlainAccessValidator.parse`` by request code (docs/protocol.md §14); a group ``g``
is the resource ``%RETRY%g``:

====================================  ===============================================
SEND_MESSAGE (10)                     PUB on ``topic``; to a retry topic: SUB on the
                                      ``group``'s retry topic instead
SEND_MESSAGE_V2 (310)                 the same with ``b`` (topic) and ``a`` (group)
CONSUMER_SEND_MSG_BACK (36)           SUB on ``group``
PULL_MESSAGE (11)                     SUB on ``topic`` and on ``consumerGroup``
QUERY_MESSAGE (12)                    SUB on ``topic``
HEART_BEAT (34)                       SUB on every consumer group of the body and on
                                      every topic they subscribe
UNREGISTER_CLIENT (35),               SUB on ``consumerGroup``
GET_CONSUMER_LIST_BY_GROUP (38)
UPDATE_CONSUMER_OFFSET (15)           SUB on ``consumerGroup`` and on ``topic``
====================================  ===============================================

tidemq adds what RocketMQ 4.x forgot: SEND_BATCH_MESSAGE (320) and SEND_REPLY_MESSAGE_V2
(325) are checked like SEND_MESSAGE_V2, SEND_REPLY_MESSAGE (324) like SEND_MESSAGE, so a
batch cannot go where a single message may not.
Every other code needs no resource permission (only a valid signature, and admin for
``ADMIN_CODES``).
"""

from __future__ import annotations

from tidemq.acl.permission import Perm
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.command import RemotingCommand

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"

# A heartbeat names one entry per group and topic of one client; the check stops reading
# beyond this many (the heartbeat processor refuses such a body anyway).
HEARTBEAT_RESOURCES_MAX = 10_000

Needs = list[tuple[str, Perm]]


class UnreadableRequest(ValueError):
    """The request's resources cannot be read (a heartbeat body that is not HeartbeatData)."""


def retry_topic(group: str) -> str:
    """The resource name of a consumer group: ``%RETRY%<group>``."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def is_group_resource(resource: str) -> bool:
    """True for a group's resource name (``%RETRY%...``)."""
    return resource.startswith(RETRY_GROUP_TOPIC_PREFIX)


def _send(fields: dict[str, str], topic_key: str, group_key: str) -> Needs:
    topic = fields.get(topic_key)
    if topic is None:
        return []
    if is_group_resource(topic):
        group = fields.get(group_key)
        return [] if group is None else [(retry_topic(group), Perm.SUB)]
    return [(topic, Perm.PUB)]


def _sub(*names: str | None, groups: tuple[str | None, ...] = ()) -> Needs:
    needs = [(name, Perm.SUB) for name in names if name is not None]
    needs += [(retry_topic(group), Perm.SUB) for group in groups if group is not None]
    return needs


def _heartbeat(body: bytes | None) -> Needs:
    if not body:
        return []
    try:
        data = jsonx.loads(body)
    except Exception as exc:
        raise UnreadableRequest(f"the HEART_BEAT body is not HeartbeatData JSON: {exc}") from exc
    consumers = data.get("consumerDataSet") if isinstance(data, dict) else None
    needs: Needs = []
    for consumer in consumers or ():
        if not isinstance(consumer, dict):
            raise UnreadableRequest("a HEART_BEAT consumerDataSet entry is not an object")
        group = consumer.get("groupName")
        if isinstance(group, str):
            needs.append((retry_topic(group), Perm.SUB))
        for subscription in consumer.get("subscriptionDataSet") or ():
            topic = subscription.get("topic") if isinstance(subscription, dict) else None
            if isinstance(topic, str):
                needs.append((topic, Perm.SUB))
        if len(needs) > HEARTBEAT_RESOURCES_MAX:
            raise UnreadableRequest(
                f"the HEART_BEAT names more than {HEARTBEAT_RESOURCES_MAX} groups and topics"
            )
    return needs


def needed_permissions(request: RemotingCommand) -> Needs:
    """``[(resource, permission needed)]`` of ``request`` (module docstring).

    Raises:
        UnreadableRequest: the body the check needs cannot be read.
    """
    fields = request.ext_fields or {}
    code = request.code
    if code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_REPLY_MESSAGE):
        # RocketMQ reads the retry case's group from a "group" field the v1 header does not
        # have; the header's producer group is what it means.
        return _send(fields, "topic", "producerGroup")
    if code in _V2_SENDS:
        return _send(fields, "b", "a")
    if code == RequestCode.PULL_MESSAGE:
        return _sub(fields.get("topic"), groups=(fields.get("consumerGroup"),))
    if code == RequestCode.CONSUMER_SEND_MSG_BACK:
        return _sub(groups=(fields.get("group"),))
    if code == RequestCode.QUERY_MESSAGE:
        return _sub(fields.get("topic"))
    if code == RequestCode.HEART_BEAT:
        return _heartbeat(request.body)
    if code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        return _sub(groups=(fields.get("consumerGroup"),))
    if code == RequestCode.UPDATE_CONSUMER_OFFSET:
        return _sub(fields.get("topic"), groups=(fields.get("consumerGroup"),))
    return []


_V2_SENDS = frozenset({
    RequestCode.SEND_MESSAGE_V2,
    RequestCode.SEND_BATCH_MESSAGE,
    RequestCode.SEND_REPLY_MESSAGE_V2,
})

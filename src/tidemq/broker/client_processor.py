"""Client bookkeeping requests: HEART_BEAT (34), UNREGISTER_CLIENT (35),
GET_CONSUMER_LIST_BY_GROUP (38), CHECK_CLIENT_CONFIG (46), GET_CONSUMER_CONNECTION_LIST (203)
and GET_PRODUCER_CONNECTION_LIST (204).

HEART_BEAT's body is HeartbeatData JSON (docs/protocol.md §5.1). Real clients differ in it, so it
is read tolerantly:

- Java writes enums by name; the C++ 1.x client writes them as integers (consumeType 1,
  messageModel 1, consumeFromWhere 0), which are mapped to the names;
- the C++ 1.x client sends ``codeSet:[0]`` whatever its tags: tag codes are always
  recomputed here from ``tagsSet`` (or ``subString``) with Java's String.hashCode;
- ``subVersion`` may be a number or a string of digits; absent fields take their defaults
  (no ``producerDataSet``, no ``classFilterMode``, ...).

For each consumer group the heartbeat auto-creates the subscription group (when allowed),
creates its retry topic ``%RETRY%<group>`` and registers the connection and subscriptions;
members are told of changes by NOTIFY_CONSUMER_IDS_CHANGED (see ``client_manager``). SQL92
subscriptions are compiled into the broker's ``ConsumerFilterTable`` right away (RocketMQ's
ConsumerFilterManager.register); one that does not compile is logged, and that group's pulls
are answered FILTER_DATA_NOT_EXIST naming the problem.

CHECK_CLIENT_CONFIG (46), sent by Java push and lite-pull consumers at start (§4.17): a TAG
subscription -> SUCCESS; SQL92 while enablePropertyFilter=false -> SYSTEM_ERROR naming the
setting; SQL92 that does not compile -> SUBSCRIPTION_PARSE_FAILED naming the position and
what was expected; else SUCCESS.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidemq.broker.client_manager import (
    EXPRESSION_TYPE_SQL92,
    EXPRESSION_TYPE_TAG,
    ClientChannel,
    SubscriptionData,
    build_subscription,
    consume_from_where_name,
    consume_type_name,
    message_model_name,
)
from tidemq.broker.config import PERM_READ, PERM_WRITE
from tidemq.errors import HeaderFieldError, RemoteProtocolError, SqlFilterError
from tidemq.filter.sql92 import compile_sql92
from tidemq.limits import topic_name_problem
from tidemq.protocol import jsonx
from tidemq.protocol.codes import LanguageCode, RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import (
    GetConsumerConnectionListRequestHeader,
    GetConsumerListByGroupRequestHeader,
    GetProducerConnectionListRequestHeader,
    UnregisterClientRequestHeader,
)

if TYPE_CHECKING:
    from tidemq.broker.clients import Clients
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.subscription_group_manager import SubscriptionGroupManager
    from tidemq.broker.topic_config_manager import TopicConfigManager
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer

log = logging.getLogger("tidemq.broker")

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
TOPIC_SYS_FLAG_UNIT_SUB = 0x2  # TopicSysFlag: the retry topic of a unit-mode consumer

# A heartbeat lists one entry per group and topic of one client; thousands is already absurd.
HEARTBEAT_GROUPS_MAX = 10_000


def retry_topic(group: str) -> str:
    """The retry topic of a consumer group: ``%RETRY%<group>``."""
    return RETRY_GROUP_TOPIC_PREFIX + group


# -- HeartbeatData ------------------------------------------------------------------------------


@dataclass(slots=True)
class ConsumerData:
    """One consumer group of a heartbeat."""

    group: str
    consume_type: str
    message_model: str
    consume_from_where: str
    subscriptions: list[SubscriptionData] = field(default_factory=list)
    unit_mode: bool = False


@dataclass(slots=True)
class Heartbeat:
    """A decoded HeartbeatData body."""

    client_id: str
    consumers: list[ConsumerData] = field(default_factory=list)
    producer_groups: list[str] = field(default_factory=list)


def decode_heartbeat(body: bytes | None) -> Heartbeat:
    """Parse a HeartbeatData body, tolerating the differences of real clients.

    Raises:
        RemoteProtocolError: the body is missing or not JSON, is not an object, lacks
            ``clientID``, or a list field is not a list; the message names the field.
    """
    if not body:
        raise RemoteProtocolError("HEART_BEAT has no body; expected HeartbeatData JSON")
    try:
        document = jsonx.loads(body)
    except jsonx.JsonDecodeError as e:
        raise RemoteProtocolError(f"HEART_BEAT body is not HeartbeatData JSON: {e}") from None
    if not isinstance(document, dict):
        raise RemoteProtocolError("HEART_BEAT body is not a JSON object (HeartbeatData)")
    client_id = document.get("clientID")
    if not isinstance(client_id, str) or not client_id:
        raise RemoteProtocolError(
            f"HEART_BEAT body field clientID is {client_id!r}; expected the client's id"
        )
    heartbeat = Heartbeat(client_id)
    for entry in _list_field(document, "consumerDataSet"):
        if not isinstance(entry, dict):
            raise RemoteProtocolError("HEART_BEAT consumerDataSet entry is not an object")
        group = entry.get("groupName")
        if not isinstance(group, str) or not group:
            log.warning("heartbeat of %s has a consumer entry without groupName; ignored",
                        client_id)
            continue
        heartbeat.consumers.append(ConsumerData(
            group=group,
            consume_type=consume_type_name(entry.get("consumeType")),
            message_model=message_model_name(entry.get("messageModel")),
            consume_from_where=consume_from_where_name(entry.get("consumeFromWhere")),
            subscriptions=[
                decode_subscription(item)
                for item in _list_field(entry, "subscriptionDataSet")
            ],
            unit_mode=entry.get("unitMode") is True,
        ))
    for entry in _list_field(document, "producerDataSet"):
        group = entry.get("groupName") if isinstance(entry, dict) else None
        if isinstance(group, str) and group:
            heartbeat.producer_groups.append(group)
    if len(heartbeat.consumers) + len(heartbeat.producer_groups) > HEARTBEAT_GROUPS_MAX:
        raise RemoteProtocolError(
            f"HEART_BEAT lists more than {HEARTBEAT_GROUPS_MAX} groups; one client has a few"
        )
    return heartbeat


def decode_subscription(item: Any) -> SubscriptionData:
    """One SubscriptionData object of a heartbeat or CHECK_CLIENT_CONFIG body.

    Raises:
        RemoteProtocolError: not an object, or no topic.
    """
    if not isinstance(item, dict):
        raise RemoteProtocolError(f"subscription entry {item!r:.100} is not an object")
    topic = item.get("topic")
    if not isinstance(topic, str) or not topic:
        raise RemoteProtocolError(f"subscription entry {item!r:.100} has no topic")
    expression = item.get("subString")
    tags = item.get("tagsSet")
    return build_subscription(
        topic,
        expression if isinstance(expression, str) else None,
        item.get("expressionType") if isinstance(item.get("expressionType"), str) else None,
        _as_int(item.get("subVersion")),
        tags if isinstance(tags, list) else None,
    )


def _list_field(document: dict[str, Any], name: str) -> list[Any]:
    value = document.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise RemoteProtocolError(f"body field {name} is not a list")
    return value


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return 0


def _language_name(code: int) -> str:
    try:
        return LanguageCode(code).name
    except ValueError:
        return LanguageCode.OTHER.name


# -- the processor --------------------------------------------------------------------------------


class ClientManageProcessor:
    """Serves the client bookkeeping requests of one broker.

    Args:
        config: notifyConsumerIdsChangedEnable, enablePropertyFilter.
        topics: retry topics are created on a consumer's first heartbeat.
        groups: subscription groups (auto-created, notify flags).
        clients: the consumer and producer tables the heartbeats fill.
    """

    def __init__(
        self,
        *,
        config: BrokerConfig,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
        clients: Clients,
    ) -> None:
        self._config = config
        self._topics = topics
        self._groups = groups
        self._clients = clients

    def register(self, server: RemotingServer) -> None:
        """Register the client bookkeeping handlers on ``server``."""
        routes = {
            RequestCode.HEART_BEAT: self.heart_beat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list_by_group,
            RequestCode.CHECK_CLIENT_CONFIG: self.check_client_config,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self.get_consumer_connection_list,
            RequestCode.GET_PRODUCER_CONNECTION_LIST: self.get_producer_connection_list,
        }
        for code, handler in routes.items():
            server.register(code, handler)

    async def heart_beat(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        """HEART_BEAT: register the client's consumer and producer groups."""
        try:
            heartbeat = decode_heartbeat(request.body)
        except RemoteProtocolError as e:
            return _error(request, ResponseCode.SYSTEM_ERROR, str(e))
        clients = self._clients
        config = self._config
        now = clients.now_ms()
        language = _language_name(request.language)
        group_manager = self._groups
        for consumer in heartbeat.consumers:
            group = consumer.group
            retry = retry_topic(group)
            problem = topic_name_problem(retry)
            if problem is not None:
                return _error(
                    request, ResponseCode.SYSTEM_ERROR,
                    f"consumer group {group!r} cannot be served: its retry topic breaks the "
                    f"topic name rules ({problem}); rename the group",
                )
            group_config = group_manager.find_subscription_group_config(group)
            notify = True
            if group_config is not None:
                notify = group_config.notify_consumer_ids_changed_enable
                self._topics.create_topic_for_send_back(
                    retry, group_config.retry_queue_nums, PERM_READ | PERM_WRITE,
                    TOPIC_SYS_FLAG_UNIT_SUB if consumer.unit_mode else 0,
                )
            clients.consumers.register(
                group,
                ClientChannel(connection, heartbeat.client_id, language, request.version, now),
                consume_type=consumer.consume_type,
                message_model=consumer.message_model,
                consume_from_where=consumer.consume_from_where,
                subscriptions=consumer.subscriptions,
                notify=notify and config.notify_consumer_ids_changed_enable,
            )
            self._register_filters(group, consumer.subscriptions)
        for group in heartbeat.producer_groups:
            clients.producers.register(
                group,
                ClientChannel(connection, heartbeat.client_id, language, request.version, now),
            )
        clients.watch_connection(connection)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    def _register_filters(self, group: str, subscriptions: list[SubscriptionData]) -> None:
        table = self._clients.filters
        for subscription in subscriptions:
            if subscription.expression_type != EXPRESSION_TYPE_SQL92:
                continue
            current = table.get(group, subscription.topic)
            data = table.register(group, subscription.topic, subscription.sub_string,
                                  subscription.sub_version)
            if data.problem is not None and data is not current:
                log.warning("consumer group %s subscribes %s with a SQL92 expression that does "
                            "not compile; its pulls will fail until it is fixed: %s",
                            group, subscription.topic, data.problem)

    async def unregister_client(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand:
        """UNREGISTER_CLIENT: the client leaves its producer and/or consumer group."""
        try:
            header = UnregisterClientRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as e:
            return _error(request, ResponseCode.SYSTEM_ERROR, str(e))
        clients = self._clients
        if header.producer_group:
            clients.producers.unregister(header.producer_group, connection)
        if header.consumer_group:
            group_config = self._groups.get(header.consumer_group)
            notify = group_config is None or group_config.notify_consumer_ids_changed_enable
            clients.consumers.unregister(
                header.consumer_group, connection,
                notify=notify and self._config.notify_consumer_ids_changed_enable,
            )
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def get_consumer_list_by_group(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand:
        """GET_CONSUMER_LIST_BY_GROUP: the client ids of the group's live members."""
        try:
            header = GetConsumerListByGroupRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as e:
            return _error(request, ResponseCode.SYSTEM_ERROR, str(e))
        group = header.consumer_group
        info = self._clients.consumers.get(group)
        client_ids = info.client_ids() if info is not None else []
        if not client_ids:
            return _error(request, ResponseCode.SYSTEM_ERROR,
                          f"no consumer for this group, {group}")
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, body=jsonx.dumps({"consumerIdList": client_ids})
        )

    async def check_client_config(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand:
        """CHECK_CLIENT_CONFIG: can this broker serve the consumer's subscription (§4.17)?"""
        try:
            if not request.body:
                raise RemoteProtocolError("CHECK_CLIENT_CONFIG has no body; expected "
                                          "{clientId, group, subscriptionData}")
            try:
                document = jsonx.loads(request.body)
            except jsonx.JsonDecodeError as e:
                raise RemoteProtocolError(f"CHECK_CLIENT_CONFIG body is not JSON: {e}") from None
            if not isinstance(document, dict):
                raise RemoteProtocolError("CHECK_CLIENT_CONFIG body is not a JSON object")
            raw = document.get("subscriptionData")
            subscription = decode_subscription(raw) if raw is not None else None
        except RemoteProtocolError as e:
            return _error(request, ResponseCode.SYSTEM_ERROR, str(e))
        if subscription is None or subscription.expression_type == EXPRESSION_TYPE_TAG:
            return RemotingCommand.response_to(request, ResponseCode.SUCCESS)
        if subscription.expression_type != EXPRESSION_TYPE_SQL92:
            return _error(
                request, ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"expression type {subscription.expression_type!r} of the subscription to "
                f"{subscription.topic} is unknown; use TAG or SQL92",
            )
        if not self._config.enable_property_filter:
            return _error(
                request, ResponseCode.SYSTEM_ERROR,
                "SQL92 filter is not enabled (set enablePropertyFilter=true)",
            )
        try:
            compile_sql92(subscription.sub_string)
        except SqlFilterError as e:
            return _error(
                request, ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"the SQL92 subscription to {subscription.topic} does not compile: {e}",
            )
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def get_consumer_connection_list(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST (203): the group's members and subscriptions."""
        try:
            header = GetConsumerConnectionListRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as e:
            return _error(request, ResponseCode.SYSTEM_ERROR, str(e))
        info = self._clients.consumers.get(header.consumer_group)
        if info is None or not info.channels:
            return _error(
                request, ResponseCode.CONSUMER_NOT_ONLINE,
                f"the consumer group {header.consumer_group} is not online: no member has sent "
                "a heartbeat to this broker in the last 120 s",
            )
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, body=jsonx.dumps(info.to_connection_json())
        )

    async def get_producer_connection_list(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand:
        """GET_PRODUCER_CONNECTION_LIST (204): the producer group's live connections."""
        try:
            header = GetProducerConnectionListRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as e:
            return _error(request, ResponseCode.SYSTEM_ERROR, str(e))
        channels = self._clients.producers.channels(header.producer_group)
        if not channels:
            return _error(
                request, ResponseCode.SYSTEM_ERROR,
                f"the producer group {header.producer_group} does not exist: no producer of it "
                "has sent a heartbeat to this broker",
            )
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            body=jsonx.dumps({"connectionSet": [channel.to_json() for channel in channels]}),
        )


def _error(request: RemotingCommand, code: int, remark: str) -> RemotingCommand:
    return RemotingCommand.response_to(request, code, remark=remark)

"""The name server's request handlers, one per request code (docs/protocol.md §4.11).

Each handler reads its typed header, asks the RouteInfoManager or the KV config, and answers
with RocketMQ's response code and a remark a user can act on. A request whose header or body
is malformed gets SYSTEM_ERROR naming the field or what was wrong, never a closed connection.
Codes not listed here get REQUEST_CODE_NOT_SUPPORTED from the remoting server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from tidemq.config_loader import apply_runtime_settings, current_properties
from tidemq.errors import ConfigError, RemoteProtocolError
from tidemq.namesrv.config import NamesrvConfig
from tidemq.namesrv.kv_config import KVConfigManager
from tidemq.namesrv.register_body import decode_register_broker_body
from tidemq.namesrv.route_data import (
    NAMESPACE_ORDER_TOPIC_CONFIG,
    DataVersion,
    encode_kv_table,
    encode_topic_list,
)
from tidemq.namesrv.route_info_manager import RouteInfoManager
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import (
    AddWritePermOfBrokerRequestHeader,
    AddWritePermOfBrokerResponseHeader,
    DeleteKVConfigRequestHeader,
    DeleteTopicFromNamesrvRequestHeader,
    GetKVConfigRequestHeader,
    GetKVConfigResponseHeader,
    GetKVListByNamespaceRequestHeader,
    GetRouteInfoRequestHeader,
    GetTopicsByClusterRequestHeader,
    PutKVConfigRequestHeader,
    QueryDataVersionRequestHeader,
    QueryDataVersionResponseHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
    WipeWritePermOfBrokerRequestHeader,
    WipeWritePermOfBrokerResponseHeader,
)
from tidemq.protocol.message import body_crc

if TYPE_CHECKING:
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer

log = logging.getLogger("tidemq.namesrv")

# The settings UPDATE_NAMESRV_CONFIG may change: those read on every request or scan (the
# others bind a port or a file, or start a timer, when the name server starts).
NAMESRV_RUNTIME_KEYS = frozenset({
    "orderMessageEnable", "enableAllTopicList", "enableTopicList",
    "deleteTopicWithBrokerRegistration", "brokerChannelExpiredTime",
})

# MQVersion V4_9_4: clients from this version on read route data as standard JSON.
VERSION_STANDARD_JSON_ROUTES = 401

Handler = Callable[[RemotingCommand, "Connection"], Awaitable[RemotingCommand | None]]


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class NamesrvProcessor:
    """Serves the name-server request codes from one RouteInfoManager and KV config.

    Args:
        config: the name server's settings (feature switches, orderMessageEnable).
        route_info: the route tables.
        kv_config: the KV settings.
        clock_ms: wall-clock milliseconds (injectable for tests).
    """

    def __init__(
        self,
        config: NamesrvConfig,
        route_info: RouteInfoManager,
        kv_config: KVConfigManager,
        *,
        clock_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        self.config = config
        self.route_info = route_info
        self.kv_config = kv_config
        self.clock_ms = clock_ms

    def handlers(self) -> dict[int, Handler]:
        """Every request code served, with its handler."""
        table: dict[int, Callable[[RemotingCommand, Connection], RemotingCommand]] = {
            RequestCode.PUT_KV_CONFIG: self.put_kv_config,
            RequestCode.GET_KV_CONFIG: self.get_kv_config,
            RequestCode.DELETE_KV_CONFIG: self.delete_kv_config,
            RequestCode.GET_KVLIST_BY_NAMESPACE: self.get_kv_list_by_namespace,
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.QUERY_DATA_VERSION: self.query_data_version,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route_info_by_topic,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_broker_cluster_info,
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: self.wipe_write_perm_of_broker,
            RequestCode.ADD_WRITE_PERM_OF_BROKER: self.add_write_perm_of_broker,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topic_list,
            RequestCode.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self.delete_topic_in_namesrv,
            RequestCode.GET_NAMESRV_CONFIG: self.get_namesrv_config,
            RequestCode.UPDATE_NAMESRV_CONFIG: self.update_namesrv_config,
        }
        return {code: _guarded(handler) for code, handler in table.items()}

    def register(self, server: RemotingServer) -> None:
        """Register every handler on ``server``."""
        for code, handler in self.handlers().items():
            server.register(code, handler)

    # -- brokers -------------------------------------------------------------------------------

    def register_broker(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        """REGISTER_BROKER (103): record a broker and its topic table."""
        header = RegisterBrokerRequestHeader.from_ext_fields(request.ext_fields)
        body = request.body
        if body and header.body_crc32 != 0:
            actual = body_crc(body)
            if actual != header.body_crc32:
                log.warning("REGISTER_BROKER from %s (%s): body CRC32 %d, header says %d",
                            connection.remote_address, header.broker_addr, actual,
                            header.body_crc32)
                return RemotingCommand.response_to(
                    request, ResponseCode.SYSTEM_ERROR,
                    remark=f"crc32 not match: the {len(body)}-byte body has CRC32 {actual}, "
                    f"bodyCrc32 says {header.body_crc32}; the body was altered in transit",
                )
        registration = decode_register_broker_body(
            body, compressed=header.compressed, version=request.version
        )
        result = self.route_info.register_broker(
            cluster_name=header.cluster_name,
            broker_addr=header.broker_addr,
            broker_name=header.broker_name,
            broker_id=header.broker_id,
            ha_server_addr=header.ha_server_addr,
            body=registration,
            connection=connection,
            now_ms=self.clock_ms(),
            delete_missing_topics=self.config.delete_topic_with_broker_registration,
        )
        response_header = RegisterBrokerResponseHeader(
            ha_server_addr=result.ha_server_addr, master_addr=result.master_addr
        )
        order_topics = self.kv_config.namespace(NAMESPACE_ORDER_TOPIC_CONFIG)
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            ext_fields=response_header.to_ext_fields(),
            body=encode_kv_table(order_topics) if order_topics else None,
        )

    def unregister_broker(self, request: RemotingCommand, connection: Connection
                          ) -> RemotingCommand:
        """UNREGISTER_BROKER (104): forget one broker id."""
        header = UnregisterBrokerRequestHeader.from_ext_fields(request.ext_fields)
        self.route_info.unregister_broker(
            cluster_name=header.cluster_name,
            broker_addr=header.broker_addr,
            broker_name=header.broker_name,
            broker_id=header.broker_id,
        )
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    def query_data_version(self, request: RemotingCommand, connection: Connection
                           ) -> RemotingCommand:
        """QUERY_DATA_VERSION (322): has the broker's topic table changed since it registered?

        An unchanged version counts as a sign of life, as a registration would.
        """
        header = QueryDataVersionRequestHeader.from_ext_fields(request.ext_fields)
        data_version = DataVersion.from_json_dict(jsonx.loads(request.body or b"{}"))
        changed = self.route_info.is_topic_config_changed(header.broker_addr, data_version)
        if not changed:
            self.route_info.touch_broker(header.broker_addr, self.clock_ms())
        known = self.route_info.data_version_of(header.broker_addr)
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            ext_fields=QueryDataVersionResponseHeader(changed=changed).to_ext_fields(),
            body=jsonx.dumps(known.to_json_dict()) if known is not None else None,
        )

    def wipe_write_perm_of_broker(self, request: RemotingCommand, connection: Connection
                                  ) -> RemotingCommand:
        """WIPE_WRITE_PERM_OF_BROKER (205): stop producers writing to a broker name."""
        header = WipeWritePermOfBrokerRequestHeader.from_ext_fields(request.ext_fields)
        count = self.route_info.wipe_write_perm(header.broker_name)
        log.info("write permission wiped from %d topic(s) of %s, asked by %s", count,
                 header.broker_name, connection.remote_address)
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            ext_fields=WipeWritePermOfBrokerResponseHeader(wipe_topic_count=count)
            .to_ext_fields(),
        )

    def add_write_perm_of_broker(self, request: RemotingCommand, connection: Connection
                                 ) -> RemotingCommand:
        """ADD_WRITE_PERM_OF_BROKER (327): let producers write to a broker name again."""
        header = AddWritePermOfBrokerRequestHeader.from_ext_fields(request.ext_fields)
        count = self.route_info.add_write_perm(header.broker_name)
        log.info("write permission given back to %d topic(s) of %s, asked by %s", count,
                 header.broker_name, connection.remote_address)
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            ext_fields=AddWritePermOfBrokerResponseHeader(add_topic_count=count).to_ext_fields(),
        )

    # -- routes and topics ---------------------------------------------------------------------

    def get_route_info_by_topic(self, request: RemotingCommand, connection: Connection
                                ) -> RemotingCommand:
        """GET_ROUTEINFO_BY_TOPIC (105): the topic's route, or TOPIC_NOT_EXIST."""
        header = GetRouteInfoRequestHeader.from_ext_fields(request.ext_fields)
        route = self.route_info.topic_route(header.topic)
        if route is None:
            return RemotingCommand.response_to(
                request, ResponseCode.TOPIC_NOT_EXIST,
                remark=f"No topic route info in name server for the topic: {header.topic}; "
                "create it with `tidemq admin updateTopic`, or let a broker with "
                "autoCreateTopicEnable=true create it on first send",
            )
        if self.config.order_message_enable:
            route.order_topic_conf = self.kv_config.get(NAMESPACE_ORDER_TOPIC_CONFIG, header.topic)
        standard_json = (
            request.version >= VERSION_STANDARD_JSON_ROUTES
            or bool(header.accept_standard_json_only)
        )
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, body=route.encode(standard_json=standard_json)
        )

    def get_broker_cluster_info(self, request: RemotingCommand, connection: Connection
                                ) -> RemotingCommand:
        """GET_BROKER_CLUSTER_INFO (106): every broker name and cluster."""
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, body=self.route_info.cluster_info().encode()
        )

    def get_all_topic_list(self, request: RemotingCommand, connection: Connection
                           ) -> RemotingCommand:
        """GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206): every topic, unless disabled."""
        if not self.config.enable_all_topic_list:
            return RemotingCommand.response_to(
                request, ResponseCode.SYSTEM_ERROR,
                remark="listing all topics is disabled on this name server "
                "(set enableAllTopicList=true to allow it)",
            )
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, body=encode_topic_list(self.route_info.all_topics())
        )

    def get_topics_by_cluster(self, request: RemotingCommand, connection: Connection
                              ) -> RemotingCommand:
        """GET_TOPICS_BY_CLUSTER (224): the topics of one cluster, unless disabled."""
        if not self.config.enable_topic_list:
            return RemotingCommand.response_to(
                request, ResponseCode.SYSTEM_ERROR,
                remark="listing topics by cluster is disabled on this name server "
                "(set enableTopicList=true to allow it)",
            )
        header = GetTopicsByClusterRequestHeader.from_ext_fields(request.ext_fields)
        topics = self.route_info.topics_by_cluster(header.cluster)
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, body=encode_topic_list(topics)
        )

    def delete_topic_in_namesrv(self, request: RemotingCommand, connection: Connection
                                ) -> RemotingCommand:
        """DELETE_TOPIC_IN_NAMESRV (216): forget a topic (in one cluster when given)."""
        header = DeleteTopicFromNamesrvRequestHeader.from_ext_fields(request.ext_fields)
        removed = self.route_info.delete_topic(header.topic, header.cluster_name)
        log.info("topic %s deleted%s by %s%s", header.topic,
                 f" in cluster {header.cluster_name}" if header.cluster_name else "",
                 connection.remote_address, "" if removed else " (it had no route)")
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    # -- KV config -----------------------------------------------------------------------------

    def put_kv_config(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        """PUT_KV_CONFIG (100)."""
        header = PutKVConfigRequestHeader.from_ext_fields(request.ext_fields)
        self.kv_config.put(header.namespace, header.key, header.value)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    def get_kv_config(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        """GET_KV_CONFIG (101): the value in the response header, or QUERY_NOT_FOUND."""
        header = GetKVConfigRequestHeader.from_ext_fields(request.ext_fields)
        value = self.kv_config.get(header.namespace, header.key)
        if value is None:
            return RemotingCommand.response_to(
                request, ResponseCode.QUERY_NOT_FOUND,
                remark=f"No config item, Namespace: {header.namespace} Key: {header.key}",
            )
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            ext_fields=GetKVConfigResponseHeader(value=value).to_ext_fields(),
        )

    def delete_kv_config(self, request: RemotingCommand, connection: Connection
                         ) -> RemotingCommand:
        """DELETE_KV_CONFIG (102): absent keys are fine."""
        header = DeleteKVConfigRequestHeader.from_ext_fields(request.ext_fields)
        self.kv_config.delete(header.namespace, header.key)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    def get_kv_list_by_namespace(self, request: RemotingCommand, connection: Connection
                                 ) -> RemotingCommand:
        """GET_KVLIST_BY_NAMESPACE (219): a KVTable body, or QUERY_NOT_FOUND."""
        header = GetKVListByNamespaceRequestHeader.from_ext_fields(request.ext_fields)
        table = self.kv_config.namespace(header.namespace)
        if table is None:
            return RemotingCommand.response_to(
                request, ResponseCode.QUERY_NOT_FOUND,
                remark=f"No config item, Namespace: {header.namespace}",
            )
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, body=encode_kv_table(table)
        )

    # -- settings ------------------------------------------------------------------------------

    def get_namesrv_config(self, request: RemotingCommand, connection: Connection
                           ) -> RemotingCommand:
        """GET_NAMESRV_CONFIG (319): every setting as ``key=value`` lines."""
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            body=properties_text(current_properties(self.config)).encode())

    def update_namesrv_config(self, request: RemotingCommand, connection: Connection
                              ) -> RemotingCommand:
        """UPDATE_NAMESRV_CONFIG (318): change run-time settings (``key=value`` lines); kept
        until the name server stops (its config file is the operator's, not rewritten)."""
        try:
            applied = apply_runtime_settings(
                [self.config], (request.body or b"").decode("utf-8", "replace"),
                NAMESRV_RUNTIME_KEYS)
        except ConfigError as e:
            return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR,
                                               remark=str(e))
        log.info("settings changed by %s: %s", connection.remote_address,
                 ", ".join(f"{k}={v}" for k, v in applied.items()))
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)


def properties_text(properties: dict[str, str]) -> str:
    """``{key: value}`` as properties text, one ``key=value`` line each."""
    return "".join(f"{key}={value}\n" for key, value in properties.items())


def _guarded(
    handler: Callable[[RemotingCommand, Connection], RemotingCommand],
) -> Handler:
    """Wrap a synchronous handler: bad input from the peer becomes SYSTEM_ERROR with a remark.

    The route tables live on the event loop and no handler waits for anything, so handlers
    are plain functions; this adapts them to the server's async handler signature.
    """

    async def serve(request: RemotingCommand, connection: Connection) -> RemotingCommand:
        try:
            return handler(request, connection)
        except RemoteProtocolError as e:  # a missing header field, a malformed body
            log.warning("%s from %s refused: %s", request.describe(), connection.remote_address,
                        e)
            return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, remark=str(e))

    serve.__name__ = serve.__qualname__ = getattr(handler, "__name__", "handler")
    return serve

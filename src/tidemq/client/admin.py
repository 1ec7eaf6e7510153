"""Admin: topics, clusters, offsets, consumer progress, message lookup and dead letters
(mqadmin's work).

Requests go to the name servers (routes, cluster info, topic list, KV config) or to brokers
(topic config, stats, offsets, messages). Writes that concern a cluster go to every master of
it, as RocketMQ's admin tool does: creating a topic sends UPDATE_AND_CREATE_TOPIC to each
master (which then re-registers with the name servers); deleting one removes it from the
brokers first and then from every name server.

Dead letters: a consumer group's messages that failed every retry sit in ``%DLQ%<group>``
(one queue per broker that dead-lettered something; tidemq brokers create it readable).
``dead_letters`` reads them with plain pulls; ``redrive_dead_letters`` sends copies back to
their original topic (RETRY_TOPIC), or only to the group's ``%RETRY%<group>`` with
``to_retry_topic``, keeping body, flag, tags, keys, user properties and the message id
(UNIQ_KEY). A log can't be edited, so the DLQ keeps its messages; what was redriven is
remembered as the committed offset of the tools group ``TOOLS_DLQ_REDRIVE`` on the DLQ's
queues, and a redrive of "all" sends only the messages past that offset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tidemq.client import admin_acl, admin_consumers, broker_api
from tidemq.client.admin_groups import GroupAdmin
from tidemq.client.admin_messages import TOOLS_CONSUMER_GROUP, MessageAdmin
from tidemq.client.admin_servers import ServerAdmin, suggestion
from tidemq.client.admin_types import (
    ConsumeStats,
    TopicOffset,
    parse_consume_stats,
)
from tidemq.client.broker_fanout import ask_each_broker
from tidemq.client.errors import BrokerRejected, InvalidMessage, NoRouteError
from tidemq.client.instance import REQUEST_TIMEOUT_MS, ClientInstance, check_response
from tidemq.client.lifecycle import ClientLifecycle
from tidemq.client.message import Message, MessageQueue, SendResult
from tidemq.client.producer import Producer, default_namesrv
from tidemq.client.queue_keys import message_queue_from_key
from tidemq.client.route import ClusterInfo, TopicRouteData, parse_cluster_info
from tidemq.client.security import Credentials, TlsOption
from tidemq.client.send_back import dead_letter_topic, resend_properties, retry_topic
from tidemq.client.subscription import parse_tag_expression
from tidemq.errors import InvalidMessageId, InvalidTopicName, TidemqError
from tidemq.limits import topic_name_problem
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.headers import CreateTopicRequestHeader
from tidemq.protocol.message import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    MessageExt,
)
from tidemq.protocol.msgid import decode_offset_msg_id
from tidemq.remoting.errors import RemotingError

log = logging.getLogger("tidemq.client")

AUTO_CREATE_TOPIC_KEY = "TBW102"
ORDER_TOPIC_CONFIG_NAMESPACE = "ORDER_TOPIC_CONFIG"
QUERY_END_MS_MAX = (1 << 63) - 1
# A unique-key query lets the broker pick defaultQueryMaxNum (32); key queries take ours.
QUERY_MAX_NUM_DEFAULT = 32
# An offset id points at an address; if it is really a unique key that address is made up,
# so give the connect a short leash.
VIEW_BY_ID_TIMEOUT_MS = 2000
# The tools group whose committed offsets on a DLQ remember what was redriven.
DLQ_REDRIVE_GROUP = "TOOLS_DLQ_REDRIVE"
DLQ_REDRIVE_PRODUCER_GROUP = "TOOLS_DLQ_REDRIVE_PRODUCER"
# Dead letters read per call at most, and per pull (the broker sends up to 1024 / 1 MiB).
DEAD_LETTERS_MAX_DEFAULT = 10_000
DEAD_LETTERS_PULL_BATCH = 256


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message in a group's dead-letter queue.

    Attributes:
        message: the stored message (its topic is ``%DLQ%<group>``).
        queue: the DLQ queue it is in.
        original_topic: the topic it was first sent to (RETRY_TOPIC), if known.
        redriven: it was already sent back by a redrive of all dead letters.
    """

    message: MessageExt
    queue: MessageQueue
    original_topic: str | None
    redriven: bool

    @property
    def ids(self) -> set[str]:
        """Every id it may be asked for by: message id, offset id, original message id."""
        ids = {self.message.msg_id, self.message.offset_msg_id}
        origin = self.message.properties.get(PROPERTY_ORIGIN_MESSAGE_ID)
        if origin:
            ids.add(origin)
        return ids


class Admin(ClientLifecycle, ServerAdmin, GroupAdmin, MessageAdmin):
    """Administers topics, groups and offsets; looks messages up. Use as ``async with``.

    Args:
        namesrv: name server addresses; default $NAMESRV_ADDR or 127.0.0.1:9876.
        request_timeout_ms: timeout of each request.
        instance_name: part of the client id.
        credentials: ACL keys (``tidemq.Credentials``); every request is signed with them.
        tls: True, an ``ssl.SSLContext`` (``tidemq.tls_context``) or None for plain TCP.
    """

    def __init__(
        self,
        namesrv: str | Iterable[str] | None = None,
        *,
        request_timeout_ms: int = REQUEST_TIMEOUT_MS,
        instance_name: str | None = None,
        credentials: Credentials | None = None,
        tls: TlsOption = None,
    ):
        self._instance = ClientInstance(
            namesrv if namesrv is not None else default_namesrv(),
            instance_name=instance_name,
            request_timeout_ms=request_timeout_ms,
            credentials=credentials,
            tls=tls,
        )
        self._client_name = "admin client"

    @property
    def namesrv_addresses(self) -> list[str]:
        """The name servers this client talks to."""
        return list(self._instance.namesrv_addresses)

    async def start(self) -> None:
        """Make the client usable (no background work is started). Idempotent.

        Raises:
            ClientStateError: the client was closed.
        """
        if self._begin_start():
            self._state = "running"

    async def close(self) -> None:
        """Close every connection. Idempotent."""
        if self._begin_close() is None:
            return
        try:
            await self._instance.close()
        finally:
            self._closed()

    async def __aenter__(self) -> Admin:
        await self.start()
        return self

    # -- clusters and brokers -------------------------------------------------------------

    async def cluster_list(self) -> ClusterInfo:
        """GET_BROKER_CLUSTER_INFO: every cluster and broker group the name servers know."""
        self._check_running()
        response = await self._instance.invoke_namesrv(RequestCode.GET_BROKER_CLUSTER_INFO)
        check_response(response, "cluster info", "name server")
        info = parse_cluster_info(response.body or b"{}")
        for broker in info.brokers.values():
            self._instance.broker_addresses[broker.broker_name] = dict(broker.broker_addrs)
        return info

    @staticmethod
    def _known_broker_addresses(info: ClusterInfo) -> set[str]:
        return {address for broker in info.brokers.values()
                for address in broker.broker_addrs.values()}

    async def broker_runtime_info(self, broker_addr: str) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO: the broker's statistics table (all values strings)."""
        self._check_running()
        response = await self._instance.invoke(broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        check_response(response, "broker runtime info", broker_addr)
        body = jsonx.loads(response.body or b"{}")
        return {str(k): str(v) for k, v in (body.get("table") or {}).items()}

    async def _masters(self, cluster: str | None, broker_addr: str | None) -> list[str]:
        if broker_addr:
            return [broker_addr]
        info = await self.cluster_list()
        if cluster is None:
            if len(info.clusters) != 1:
                raise ValueError(
                    "give a cluster or a broker address: the name servers know clusters "
                    f"{', '.join(sorted(info.clusters)) or '(none)'}"
                )
            cluster = next(iter(info.clusters))
        if cluster not in info.clusters:
            raise NoRouteError(
                f"cluster {cluster!r} is unknown to the name servers; known: "
                f"{', '.join(sorted(info.clusters)) or '(none)'}"
            )
        masters = list(info.master_addresses(cluster).values())
        if not masters:
            raise NoRouteError(f"cluster {cluster!r} has no master broker online")
        return masters

    # -- topics ---------------------------------------------------------------------------

    async def create_topic(
        self,
        topic: str,
        queue_nums: int = 8,
        perm: int = 6,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        order: bool = False,
        read_queue_nums: int | None = None,
        write_queue_nums: int | None = None,
    ) -> list[str]:
        """Create or update ``topic`` on one broker or on every master of a cluster.

        Args:
            topic: the topic name.
            queue_nums: read and write queue count (unless given separately).
            perm: PermName bits: 6 read+write, 4 read only, 2 write only.
            cluster: the cluster whose masters get the topic (the only one when omitted).
            broker_addr: one broker instead of a cluster.
            order: an order topic: also publishes ``brokerName:queues`` per broker to the name
                servers (ORDER_TOPIC_CONFIG), which pins producers to those queues.
            read_queue_nums / write_queue_nums: override ``queue_nums`` for one side.

        Returns:
            The broker addresses updated.

        Raises:
            InvalidTopicName, ValueError, NoRouteError, BrokerRejected, RemotingError.
        """
        self._check_running()
        problem = topic_name_problem(topic)
        if problem is not None:
            raise InvalidTopicName(problem)
        reads = queue_nums if read_queue_nums is None else read_queue_nums
        writes = queue_nums if write_queue_nums is None else write_queue_nums
        if reads < 0 or writes < 0 or reads + writes == 0:
            raise ValueError(f"queue counts read={reads} write={writes} make no queue")
        header = CreateTopicRequestHeader(
            topic=topic, default_topic=AUTO_CREATE_TOPIC_KEY, read_queue_nums=reads,
            write_queue_nums=writes, perm=perm, topic_filter_type="SINGLE_TAG",
            topic_sys_flag=0, order=order,
        )
        masters = await self._masters(cluster, broker_addr)
        for address in masters:
            response = await self._instance.invoke(
                address, RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext_fields()
            )
            check_response(response, f"create topic {topic!r}", address)
        if order and broker_addr is None:
            await self._put_order_conf(topic, masters, reads)
        return masters

    update_topic = create_topic

    async def _put_order_conf(self, topic: str, masters: list[str], queue_nums: int) -> None:
        info = await self.cluster_list()
        by_address = {
            broker.broker_addrs.get(0): name for name, broker in info.brokers.items()
        }
        conf = ";".join(f"{by_address[a]}:{queue_nums}" for a in masters if a in by_address)
        fields = {"namespace": ORDER_TOPIC_CONFIG_NAMESPACE, "key": topic, "value": conf}
        for address in self._instance.namesrv_addresses:
            response = await self._instance.invoke(address, RequestCode.PUT_KV_CONFIG, fields)
            check_response(response, f"order config of topic {topic!r}", address)

    async def delete_topic(self, topic: str, *, cluster: str | None = None) -> list[str]:
        """Delete ``topic`` from the brokers (every master of ``cluster``, or those of its
        route) and then from every name server.

        Returns:
            The broker addresses the topic was deleted from.
        """
        self._check_running()
        if cluster is not None:
            masters = await self._masters(cluster, None)
        else:
            route = await self._instance.fetch_route(topic)
            masters = sorted(route.master_addresses().values()) if route else []
        for address in masters:
            response = await self._instance.invoke(address, RequestCode.DELETE_TOPIC_IN_BROKER,
                                                   {"topic": topic})
            check_response(response, f"delete topic {topic!r}", address)
        fields = {"topic": topic}
        if cluster is not None:
            fields["clusterName"] = cluster
        for address in self._instance.namesrv_addresses:
            response = await self._instance.invoke(address, RequestCode.DELETE_TOPIC_IN_NAMESRV,
                                                   fields)
            check_response(response, f"delete topic {topic!r} from the name server", address)
        self._instance.routes.pop(topic, None)
        return masters

    async def topic_route(self, topic: str) -> TopicRouteData:
        """The topic's route from the name servers.

        Raises:
            NoRouteError: the topic is unknown.
        """
        self._check_running()
        route = await self._instance.fetch_route(topic)
        if route is None:
            try:
                hint = suggestion(topic, await self.topic_list())
            except TidemqError:
                hint = ""
            raise NoRouteError(f"topic {topic!r} does not exist on any broker{hint}")
        return route

    async def topic_list(self) -> list[str]:
        """Every topic the name servers know, sorted."""
        self._check_running()
        response = await self._instance.invoke_namesrv(
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER
        )
        check_response(response, "topic list", "name server")
        body = jsonx.loads(response.body or b"{}")
        return sorted(str(t) for t in (body.get("topicList") or []))

    async def topic_stats(self, topic: str) -> dict[MessageQueue, TopicOffset]:
        """GET_TOPIC_STATS_INFO from every broker of the topic: min/max offset per queue."""
        route = await self.topic_route(topic)
        table: dict[MessageQueue, TopicOffset] = {}
        for broker_name, address in sorted(route.master_addresses().items()):
            response = await self._instance.invoke(address, RequestCode.GET_TOPIC_STATS_INFO,
                                                   {"topic": topic})
            check_response(response, f"stats of topic {topic!r}", f"{broker_name} ({address})")
            body = jsonx.loads(response.body or b"{}")
            for key, value in (body.get("offsetTable") or {}).items():
                table[message_queue_from_key(key)] = TopicOffset(
                    min_offset=int(value.get("minOffset", 0)),
                    max_offset=int(value.get("maxOffset", 0)),
                    last_update_timestamp=int(value.get("lastUpdateTimestamp", 0)),
                )
        return dict(sorted(table.items()))

    # -- groups and offsets ---------------------------------------------------------------

    async def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        """GET_CONSUME_STATS from every master: the group's progress and lag per queue.

        Raises:
            NoRouteError: no broker knows the group (it never committed an offset).
        """
        self._check_running()
        info = await self.cluster_list()
        stats = ConsumeStats()
        fields = {"consumerGroup": group}
        if topic is not None:
            fields["topic"] = topic
        answers, refusals = await ask_each_broker(
            self._instance, sorted(info.master_addresses().items()),
            RequestCode.GET_CONSUME_STATS, fields)
        for _, response in answers:
            stats.merge(parse_consume_stats(response.body))
        if not stats.offsets and refusals:
            raise NoRouteError(
                f"no consume stats for group {group!r}: " + "; ".join(refusals)
            )
        if not stats.offsets:
            await self.check_group(group)
            if topic is not None:
                await self.topic_route(topic)
        stats.offsets = dict(sorted(stats.offsets.items()))
        return stats

    consumer_progress = consume_stats

    async def _queue_master(self, queue: MessageQueue) -> str:
        self._check_running()
        return await self._instance.find_master(queue.broker_name, queue.topic)

    async def max_offset(self, queue: MessageQueue) -> int:
        """The offset the next message of ``queue`` will get."""
        return await broker_api.max_offset(self._instance, await self._queue_master(queue), queue)

    async def min_offset(self, queue: MessageQueue) -> int:
        """The oldest offset of ``queue`` still stored."""
        return await broker_api.min_offset(self._instance, await self._queue_master(queue), queue)

    async def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The offset of ``queue`` whose message was stored closest to ``timestamp_ms``."""
        return await broker_api.search_offset(self._instance, await self._queue_master(queue),
                                              queue, timestamp_ms)

    async def earliest_msg_store_time(self, queue: MessageQueue) -> int:
        """Store time (ms) of the oldest message of ``queue``."""
        return await broker_api.earliest_msg_store_time(
            self._instance, await self._queue_master(queue), queue
        )

    async def committed_offset(self, group: str, queue: MessageQueue) -> int | None:
        """``group``'s committed offset of ``queue``; None when it has none."""
        return await broker_api.query_consumer_offset(
            self._instance, await self._queue_master(queue), group, queue
        )

    async def reset_offset_by_time(
        self, group: str, topic: str, timestamp_ms: int, *, force: bool = True
    ) -> dict[MessageQueue, int]:
        """Move ``group``'s offsets in every queue of ``topic`` to the message stored closest
        to ``timestamp_ms`` (-1: the end of each queue), as mqadmin's resetOffsetByTime does.

        Each master of the topic is asked to do it (INVOKE_BROKER_TO_RESET_OFFSET): it
        commits the offsets and tells the group's live consumers, which move there at once.
        Where no consumer of the group is connected, the offsets are committed directly.

        Args:
            force: move every queue; False moves a queue only backwards (one whose committed
                offset is already earlier keeps it). Committing directly always moves.

        Returns:
            The new offset of each queue.

        Raises:
            BrokerRejected: a broker refused (e.g. the group never consumed the topic there).
        """
        route = await self.topic_route(topic)
        queues = route.subscribe_queues(topic)
        result: dict[MessageQueue, int] = {}
        for broker_name in sorted({queue.broker_name for queue in queues}):
            own = [queue for queue in queues if queue.broker_name == broker_name]
            address = await self._queue_master(own[0])
            offsets = await admin_consumers.reset_live_consumers(
                self._instance, address, group, topic, timestamp_ms, force=force)
            if offsets is None:  # nobody to tell there: commit directly
                offsets = {}
                for queue in own:
                    offsets[queue] = await self._offset_at(address, queue, timestamp_ms)
                    await broker_api.update_consumer_offset(self._instance, address, group,
                                                            queue, offsets[queue])
            result.update(offsets)
        return dict(sorted(result.items()))

    async def _offset_at(self, address: str, queue: MessageQueue, timestamp_ms: int) -> int:
        if timestamp_ms == -1:
            return await broker_api.max_offset(self._instance, address, queue)
        return await broker_api.search_offset(self._instance, address, queue, timestamp_ms)

    async def consumer_running_info(self, group: str, client_id: str, *, jstack: bool = False
                                    ) -> admin_consumers.ConsumerRunningInfo:
        """What the live consumer ``client_id`` of ``group`` reports about itself: settings,
        subscriptions, owned queues with what it holds of each, and (``jstack``) its stacks.

        Raises:
            NoRouteError: no master has that consumer connected.
        """
        self._check_running()
        masters = sorted((await self.cluster_list()).master_addresses().values())
        return await admin_consumers.consumer_running_info(self._instance, masters, group,
                                                           client_id, jstack=jstack)

    async def consumer_status(self, group: str, topic: str, client_id: str | None = None
                              ) -> dict[str, dict[MessageQueue, int]]:
        """Each live consumer of ``group``'s own offsets of ``topic`` (client id -> queue ->
        offset), as the consumers hold them now; only ``client_id`` when given.

        Raises:
            NoRouteError: no master of the topic has a consumer of the group connected.
        """
        route = await self.topic_route(topic)
        masters = []
        for broker_name in sorted({queue.broker_name for queue in route.subscribe_queues(topic)}):
            masters.append(await self._instance.find_master(broker_name, topic))
        return await admin_consumers.consumer_status(self._instance, masters, group, topic,
                                                     client_id)

    # -- ACL (tidemq.client.admin_acl; needs an admin account where ACL is on) ---------------

    async def update_acl_config(self, access_key: str, *, broker_addr: str | None = None,
                                cluster: str | None = None, **account: Any) -> list[str]:
        """Create the ACL account ``access_key`` or change the fields given for it, on one
        broker or every master of ``cluster`` (``account``: secret_key, white_remote_address,
        admin, default_topic_perm, default_group_perm, topic_perms, group_perms, as
        ``admin_acl.account_fields`` takes them). Returns the brokers changed."""
        self._check_running()
        fields = admin_acl.account_fields(access_key, **account)
        return await admin_acl.change_each(
            self._instance, await self._masters(cluster, broker_addr),
            RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, fields,
            f"create or update ACL account {access_key!r}")

    async def delete_acl_config(self, access_key: str, *, broker_addr: str | None = None,
                                cluster: str | None = None) -> list[str]:
        """Delete the ACL account ``access_key``; returns the brokers changed."""
        self._check_running()
        return await admin_acl.change_each(
            self._instance, await self._masters(cluster, broker_addr),
            RequestCode.DELETE_ACL_CONFIG, {"accessKey": access_key},
            f"delete ACL account {access_key!r}")

    async def update_global_white_addrs(self, patterns: Sequence[str], *,
                                        broker_addr: str | None = None,
                                        cluster: str | None = None) -> list[str]:
        """Replace the brokers' globalWhiteRemoteAddresses; returns the brokers changed."""
        self._check_running()
        return await admin_acl.change_each(
            self._instance, await self._masters(cluster, broker_addr),
            RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
            {"globalWhiteAddrs": ",".join(patterns)}, "update the ACL global white list")

    async def acl_config_versions(self, *, broker_addr: str | None = None,
                                  cluster: str | None = None) -> list[admin_acl.AclVersion]:
        """Each broker's ACL file version (mqadmin clusterAclConfigVersion)."""
        self._check_running()
        return await admin_acl.acl_versions(self._instance,
                                            await self._masters(cluster, broker_addr))

    async def acl_config(self, broker_addr: str | None = None, *,
                         cluster: str | None = None) -> dict[str, admin_acl.AclConfig]:
        """Each broker's ACL rules, secret keys included (mqadmin getAclConfig), by address."""
        self._check_running()
        return {address: await admin_acl.acl_config(self._instance, address)
                for address in await self._masters(cluster, broker_addr)}

    async def update_subscription_group(
        self,
        group: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        **options: Any,
    ) -> list[str]:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP on one broker or every master of a cluster.

        Args:
            group: the consumer group.
            options: SubscriptionGroupConfig fields by their RocketMQ names, e.g.
                ``consumeEnable=False``, ``retryMaxTimes=3``, ``consumeBroadcastEnable=True``.

        Returns:
            The broker addresses updated.
        """
        self._check_running()
        config: dict[str, Any] = {
            "brokerId": 0,
            "consumeBroadcastEnable": True,
            "consumeEnable": True,
            "consumeFromMinEnable": True,
            "groupName": group,
            "notifyConsumerIdsChangedEnable": True,
            "retryMaxTimes": 16,
            "retryQueueNums": 1,
            "whichBrokerWhenConsumeSlowly": 1,
        }
        config.update(options)
        body = jsonx.dumps(config)
        masters = await self._masters(cluster, broker_addr)
        for address in masters:
            response = await self._instance.invoke(
                address, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, body
            )
            check_response(response, f"update subscription group {group!r}", address)
        return masters

    # -- messages -------------------------------------------------------------------------

    async def query_message_by_id(self, msg_id: str, topic: str | None = None) -> MessageExt:
        """Find a message by its id: a client id (UNIQ_KEY) or an offset message id.

        With ``topic``, the id is first looked up as a UNIQ_KEY on every master of the topic;
        then (or without ``topic``) it is read as an offset id and the message fetched from
        the broker address inside it (VIEW_MESSAGE_BY_ID).

        Raises:
            NoRouteError: no message has that id.
            InvalidMessageId: without ``topic``, the id is not an offset message id.
        """
        self._check_running()
        if topic is not None:
            found = await self._query_all_masters(topic, msg_id, QUERY_MAX_NUM_DEFAULT, 0,
                                                  QUERY_END_MS_MAX, unique_key=True)
            for message in found:
                if message.unique_key == msg_id:
                    return message
        try:
            address, physical_offset = decode_offset_msg_id(msg_id)
        except InvalidMessageId:
            if topic is None:
                raise
            raise NoRouteError(f"no message of topic {topic!r} has id {msg_id!r}") from None
        if topic is None and address not in self._known_broker_addresses(
                await self.cluster_list()):
            # Not an offset id of any broker here: most likely a client id (UNIQ_KEY), which
            # can only be found through the topic's index.
            raise NoRouteError(
                f"{msg_id!r} is not the offset id of a message on a broker registered here "
                f"(read as one it points at {address}); if it is a message id from a send "
                "result (UNIQ_KEY), give its topic too (-t TOPIC)")
        try:
            message = await broker_api.view_message(self._instance, address, physical_offset,
                                                    timeout_ms=VIEW_BY_ID_TIMEOUT_MS)
        except (RemotingError, BrokerRejected) as e:
            where = f" of topic {topic!r}" if topic else ""
            raise NoRouteError(
                f"no message{where} has id {msg_id!r} (read as an offset id it points at "
                f"{address}, offset {physical_offset}: {e})"
            ) from None
        if topic is not None and message.topic != topic:
            raise NoRouteError(f"no message of topic {topic!r} has id {msg_id!r}")
        return message

    async def query_message_by_unique_key(self, topic: str, msg_id: str) -> list[MessageExt]:
        """Every stored message of ``topic`` whose message id (UNIQ_KEY) is ``msg_id``,
        oldest first (a message resent after a timeout is stored more than once).

        Raises:
            NoRouteError: the topic is unknown, or no message of it has that id.
        """
        self._check_running()
        found = await self._query_all_masters(topic, msg_id, QUERY_MAX_NUM_DEFAULT, 0,
                                              QUERY_END_MS_MAX, unique_key=True)
        matched = sorted((m for m in found if m.unique_key == msg_id),
                         key=lambda m: (m.store_timestamp, m.broker_name, m.queue_offset))
        if not matched:
            raise NoRouteError(f"no message of topic {topic!r} has message id {msg_id!r}")
        return matched

    async def query_message_by_key(
        self,
        topic: str,
        key: str,
        *,
        begin_ms: int = 0,
        end_ms: int | None = None,
        max_num: int = QUERY_MAX_NUM_DEFAULT,
    ) -> list[MessageExt]:
        """Messages of ``topic`` with ``key`` among their KEYS, stored in [begin_ms, end_ms].

        Returns:
            Up to ``max_num`` messages, oldest store time first (empty when none).
        """
        self._check_running()
        found = await self._query_all_masters(
            topic, key, max_num, begin_ms, QUERY_END_MS_MAX if end_ms is None else end_ms,
            unique_key=False,
        )
        matched = [m for m in found if key in m.keys]
        matched.sort(key=lambda m: (m.store_timestamp, m.broker_name, m.queue_offset))
        return matched[:max_num]

    async def _query_all_masters(
        self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int, *,
        unique_key: bool,
    ) -> list[MessageExt]:
        route = await self.topic_route(topic)
        masters = sorted(route.master_addresses().items())
        results = await asyncio.gather(
            *(broker_api.query_messages(self._instance, address, topic, key, max_num,
                                        begin_ms, end_ms, unique_key=unique_key,
                                        broker_name=name)
              for name, address in masters),
            return_exceptions=True,
        )
        found: list[MessageExt] = []
        for (name, address), result in zip(masters, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("query of topic %r by key %r at %s (%s) failed: %s", topic, key,
                            name, address, result)
                continue
            found.extend(result)
        return found

    async def query_message_by_offset(self, queue: MessageQueue, offset: int) -> MessageExt:
        """The message at ``offset`` of ``queue`` (a one-message pull as TOOLS_CONSUMER).

        Raises:
            NoRouteError: no message is stored at that offset.
        """
        address = await self._queue_master(queue)
        result = await broker_api.pull_message(
            self._instance, address, TOOLS_CONSUMER_GROUP, queue, offset, 1,
            parse_tag_expression(queue.topic, "*"),
        )
        if not result.messages or result.messages[0].queue_offset != offset:
            raise NoRouteError(
                f"no message at offset {offset} of {queue} (the queue holds "
                f"[{result.min_offset}, {result.max_offset}))"
            )
        return result.messages[0]

    # -- dead letters ---------------------------------------------------------------------

    async def dead_letters(self, group: str, *,
                           max_num: int = DEAD_LETTERS_MAX_DEFAULT) -> list[DeadLetter]:
        """The messages in ``%DLQ%<group>``, oldest first per queue (at most ``max_num``).

        Returns:
            The dead letters; empty when the group has none (no DLQ topic yet).
        """
        self._check_running()
        topic = dead_letter_topic(group)
        route = await self._instance.fetch_route(topic)
        if route is None:
            return []
        letters: list[DeadLetter] = []
        subscription = parse_tag_expression(topic, "*")
        for queue in route.subscribe_queues(topic):
            address = await self._queue_master(queue)
            offset = await broker_api.min_offset(self._instance, address, queue)
            end = await broker_api.max_offset(self._instance, address, queue)
            redriven_up_to = await broker_api.query_consumer_offset(
                self._instance, address, DLQ_REDRIVE_GROUP, queue) or 0
            while offset < end and len(letters) < max_num:
                result = await broker_api.pull_message(
                    self._instance, address, TOOLS_CONSUMER_GROUP, queue, offset,
                    min(DEAD_LETTERS_PULL_BATCH, max_num - len(letters)), subscription,
                )
                for message in result.messages:
                    letters.append(DeadLetter(
                        message, queue, message.properties.get(PROPERTY_RETRY_TOPIC),
                        message.queue_offset < redriven_up_to,
                    ))
                if result.next_begin_offset <= offset:
                    break
                offset = result.next_begin_offset
        return letters[:max_num]

    async def redrive_dead_letters(
        self,
        group: str,
        *,
        msg_ids: Iterable[str] | None = None,
        to_retry_topic: bool = False,
        max_num: int = DEAD_LETTERS_MAX_DEFAULT,
    ) -> list[tuple[DeadLetter, SendResult]]:
        """Send dead letters of ``group`` back to be consumed again (module docstring).

        Args:
            group: the consumer group.
            msg_ids: redrive only these (message id, offset id or original message id);
                None redrives every dead letter not redriven before.
            to_retry_topic: send to ``%RETRY%<group>`` (only this group consumes them
                again, shown with their original topic) instead of the original topic (every
                group subscribing it gets them again).
            max_num: dead letters read at most.

        Returns:
            (dead letter, send result) for each message sent, in order.

        Raises:
            NoRouteError: a requested id is not in the DLQ (nothing is sent then).
            InvalidMessage: a dead letter has no original topic to go back to.
            BrokerRejected, RemotingError: a send failed; those sent before stay sent (and,
                for a redrive of all, remembered as redriven).
        """
        letters = await self.dead_letters(group, max_num=max_num)
        if msg_ids is not None:
            wanted = set(msg_ids)
            chosen = [letter for letter in letters if letter.ids & wanted]
            missing = wanted - set().union(*(letter.ids for letter in chosen))
            if missing:
                raise NoRouteError(
                    f"no message with id {', '.join(sorted(missing))} is in "
                    f"{dead_letter_topic(group)}; list them with 'tidemq admin dlqList -g {group}'"
                )
        else:
            chosen = [letter for letter in letters if not letter.redriven]
        sent: list[tuple[DeadLetter, SendResult]] = []
        progress: dict[MessageQueue, int] = {}
        producer = Producer(DLQ_REDRIVE_PRODUCER_GROUP, self._instance.namesrv_addresses,
                            request_timeout_ms=self._instance.request_timeout_ms,
                            credentials=self._instance.credentials,
                            tls=self._instance.tls_context)
        await producer.start()
        try:
            for letter in chosen:
                result = await producer.send(_redrive_copy(letter, group, to_retry_topic))
                sent.append((letter, result))
                if msg_ids is None:
                    progress[letter.queue] = letter.message.queue_offset + 1
        finally:
            await producer.close()
            for queue, offset in progress.items():
                await broker_api.update_consumer_offset(
                    self._instance, await self._queue_master(queue), DLQ_REDRIVE_GROUP, queue,
                    offset)
        return sent

    # -- name-server KV config ------------------------------------------------------------

    async def put_kv_config(self, namespace: str, key: str, value: str) -> None:
        """PUT_KV_CONFIG on every name server."""
        self._check_running()
        fields = {"namespace": namespace, "key": key, "value": value}
        for address in self._instance.namesrv_addresses:
            response = await self._instance.invoke(address, RequestCode.PUT_KV_CONFIG, fields)
            check_response(response, f"put KV config {namespace}/{key}", address)

    async def get_kv_config(self, namespace: str, key: str) -> str | None:
        """GET_KV_CONFIG from a name server; None when absent."""
        self._check_running()
        response = await self._instance.invoke_namesrv(
            RequestCode.GET_KV_CONFIG, {"namespace": namespace, "key": key}
        )
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        check_response(response, f"get KV config {namespace}/{key}", "name server")
        return (response.ext_fields or {}).get("value")



def _redrive_copy(letter: DeadLetter, group: str, to_retry_topic: bool) -> Message:
    """The message a redrive sends for ``letter``.

    Raises:
        InvalidMessage: the letter has no original topic.
    """
    original = letter.original_topic
    if not original:
        raise InvalidMessage(
            f"dead letter {letter.message.msg_id} of group {group!r} has no RETRY_TOPIC "
            "property, so its original topic is unknown; it cannot be redriven"
        )
    properties = resend_properties(letter.message)
    if to_retry_topic:
        properties[PROPERTY_RETRY_TOPIC] = original
        topic = retry_topic(group)
    else:
        properties.pop(PROPERTY_RETRY_TOPIC, None)
        topic = original
    properties.pop(PROPERTY_ORIGIN_MESSAGE_ID, None)
    return Message(topic, letter.message.body, properties=properties, flag=letter.message.flag)

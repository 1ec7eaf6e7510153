"""Admin requests about groups and the brokers' metadata tables.

``GroupAdmin`` is mixed into ``Admin`` (it uses its ``_instance``, ``cluster_list``,
``topic_route``, ``consume_stats``, ``broker_targets`` and ``_check_running``). Request codes and
bodies: docs/protocol.md, "Admin requests".

- GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), GET_ALL_TOPIC_CONFIG (21) and GET_ALL_CONSUMER_OFFSET
  (43) answer a broker's config tables (``subscriptionGroupTable``, ``topicConfigTable``,
  ``offsetTable`` keyed ``topic@group``); a group is *known* when some master has its
  config or an offset of it.
- GET_CONSUMER_CONNECTION_LIST (203) / GET_PRODUCER_CONNECTION_LIST (204): a group's live
  connections as one broker sees them (every member heartbeats to every master).
- DELETE_SUBSCRIPTIONGROUP (207), with ``removeOffset`` to drop its offsets too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidemq.client import broker_api
from tidemq.client.admin_servers import suggestion
from tidemq.client.admin_types import ConsumeStats, parse_consume_stats
from tidemq.client.broker_fanout import ask_each_broker
from tidemq.client.errors import NoRouteError
from tidemq.client.instance import check_response
from tidemq.client.message import MessageQueue
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode

if TYPE_CHECKING:
    from tidemq.client.instance import ClientInstance
    from tidemq.client.route import ClusterInfo, TopicRouteData


@dataclass(slots=True)
class GroupConnections:
    """A group's live connections, merged over the brokers asked.

    Attributes:
        connections: one dict per client (``clientId``, ``clientAddr``, ``language``,
            ``version``), sorted by client id.
        subscriptions: topic -> SubscriptionData (consumer groups only).
        consume_type, message_model, consume_from_where: as the members reported (consumer
            groups only).
    """

    connections: list[dict[str, Any]] = field(default_factory=list)
    subscriptions: dict[str, dict[str, Any]] = field(default_factory=dict)
    consume_type: str | None = None
    message_model: str | None = None
    consume_from_where: str | None = None


class GroupAdmin:
    """Group configs, connections, deletion, offset cloning and the brokers' tables."""

    _instance: ClientInstance

    if TYPE_CHECKING:
        def _check_running(self) -> None: ...
        async def cluster_list(self) -> ClusterInfo: ...
        async def topic_route(self, topic: str) -> TopicRouteData: ...
        async def consume_stats(self, group: str, topic: str | None = None
                                ) -> ConsumeStats: ...
        async def broker_targets(self, cluster: str | None, broker_addr: str | None
                                 ) -> list[str]: ...

    # -- the brokers' tables --------------------------------------------------------------

    async def _table(self, address: str, code: int, name: str) -> dict[str, Any]:
        self._check_running()
        response = await self._instance.invoke(address, code)
        check_response(response, name, address)
        return dict(jsonx.loads(response.body or b"{}").get(name) or {})

    async def subscription_groups(self, broker_addr: str) -> dict[str, dict[str, Any]]:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG: group -> SubscriptionGroupConfig of one broker."""
        return await self._table(broker_addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                                 "subscriptionGroupTable")

    async def topic_configs(self, broker_addr: str) -> dict[str, dict[str, Any]]:
        """GET_ALL_TOPIC_CONFIG: topic -> TopicConfig of one broker."""
        return await self._table(broker_addr, RequestCode.GET_ALL_TOPIC_CONFIG,
                                 "topicConfigTable")

    async def consumer_offsets(self, broker_addr: str) -> dict[tuple[str, str], dict[int, int]]:
        """GET_ALL_CONSUMER_OFFSET: (topic, group) -> queue id -> offset, of one broker."""
        table = await self._table(broker_addr, RequestCode.GET_ALL_CONSUMER_OFFSET,
                                  "offsetTable")
        offsets: dict[tuple[str, str], dict[int, int]] = {}
        for key, queues in table.items():
            topic, _, group = str(key).partition("@")
            offsets[(topic, group)] = {int(q): int(o) for q, o in (queues or {}).items()}
        return offsets

    async def known_groups(self) -> set[str]:
        """Every group some master has a config or an offset of."""
        groups: set[str] = set()
        for address in sorted((await self.cluster_list()).master_addresses().values()):
            groups.update(await self.subscription_groups(address))
            groups.update(group for _, group in await self.consumer_offsets(address))
        return groups

    async def check_group(self, group: str) -> str:
        """``group`` when some master knows it.

        Raises:
            NoRouteError: no master has a config or offset of it (the nearest is suggested).
        """
        known = await self.known_groups()
        if group not in known:
            raise NoRouteError(
                f"consumer group {group!r} is unknown to every broker (no config, no offset)"
                f"{suggestion(group, sorted(known))}")
        return group

    async def group_config(self, group: str) -> dict[str, dict[str, Any]]:
        """The SubscriptionGroupConfig of ``group`` on each master that has one.

        Raises:
            NoRouteError: no master has a config of it.
        """
        configs: dict[str, dict[str, Any]] = {}
        known: set[str] = set()
        for address in sorted((await self.cluster_list()).master_addresses().values()):
            table = await self.subscription_groups(address)
            known.update(table)
            if group in table:
                configs[address] = dict(table[group])
        if not configs:
            raise NoRouteError(f"no broker has a config of consumer group {group!r}"
                               f"{suggestion(group, sorted(known))}")
        return configs

    # -- connections ----------------------------------------------------------------------

    async def consumer_connection(self, group: str, broker_addr: str | None = None
                                  ) -> GroupConnections:
        """GET_CONSUMER_CONNECTION_LIST from one broker or every master, merged.

        Raises:
            NoRouteError: no member of the group is connected (an unknown group is named as
                such, with the nearest known one).
        """
        self._check_running()
        targets = await self.broker_targets(None, broker_addr)
        answers, refusals = await ask_each_broker(
            self._instance, ((address, address) for address in targets),
            RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group})
        if not answers:
            await self.check_group(group)
            raise NoRouteError(f"no consumer of group {group!r} is online: "
                               + "; ".join(refusals))
        merged = GroupConnections()
        seen: set[str] = set()
        for _, response in answers:
            body = jsonx.loads(response.body or b"{}")
            for connection in body.get("connectionSet") or []:
                if connection.get("clientId") not in seen:
                    seen.add(connection.get("clientId"))
                    merged.connections.append(dict(connection))
            merged.subscriptions.update(body.get("subscriptionTable") or {})
            merged.consume_type = body.get("consumeType", merged.consume_type)
            merged.message_model = body.get("messageModel", merged.message_model)
            merged.consume_from_where = body.get("consumeFromWhere", merged.consume_from_where)
        merged.connections.sort(key=lambda c: str(c.get("clientId")))
        return merged

    async def producer_connection(self, group: str, topic: str) -> GroupConnections:
        """GET_PRODUCER_CONNECTION_LIST from every master of ``topic``, merged.

        Raises:
            NoRouteError: the topic is unknown, or no producer of the group is connected.
        """
        route = await self.topic_route(topic)
        answers, refusals = await ask_each_broker(
            self._instance, sorted(route.master_addresses().items()),
            RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": group})
        if not answers:
            raise NoRouteError(f"no producer of group {group!r} is connected to a broker of "
                               f"topic {topic!r}: " + "; ".join(refusals))
        merged = GroupConnections()
        seen: set[str] = set()
        for _, response in answers:
            for connection in jsonx.loads(response.body or b"{}").get("connectionSet") or []:
                if connection.get("clientId") not in seen:
                    seen.add(connection.get("clientId"))
                    merged.connections.append(dict(connection))
        merged.connections.sort(key=lambda c: str(c.get("clientId")))
        return merged

    # -- changes --------------------------------------------------------------------------

    async def delete_subscription_group(self, group: str, *, cluster: str | None = None,
                                        broker_addr: str | None = None,
                                        remove_offset: bool = False) -> list[str]:
        """DELETE_SUBSCRIPTIONGROUP on one broker or every master of a cluster.

        Raises:
            NoRouteError: the group is unknown to every broker.
        """
        await self.check_group(group)
        targets = await self.broker_targets(cluster, broker_addr)
        fields = {"groupName": group, "removeOffset": "true" if remove_offset else "false"}
        for address in targets:
            response = await self._instance.invoke(address, RequestCode.DELETE_SUBSCRIPTIONGROUP,
                                                   fields)
            check_response(response, f"delete of consumer group {group!r}", address)
        return targets

    async def clone_group_offset(self, source_group: str, target_group: str, topic: str
                                 ) -> dict[MessageQueue, int]:
        """Copy ``source_group``'s committed offsets of ``topic`` to ``target_group``
        (UPDATE_CONSUMER_OFFSET per queue), as mqadmin's cloneGroupOffset does offline.

        Returns:
            The offset written for each queue.

        Raises:
            NoRouteError: the topic or the source group is unknown.
        """
        await self.check_group(source_group)
        stats = await self.consume_stats(source_group, topic)
        written: dict[MessageQueue, int] = {}
        for queue, offset in stats.offsets.items():
            address = await self._instance.find_master(queue.broker_name, topic)
            await broker_api.update_consumer_offset(self._instance, address, target_group, queue,
                                                    offset.consumer_offset)
            written[queue] = offset.consumer_offset
        return written

    async def broker_consume_stats(self, broker_addr: str) -> dict[str, ConsumeStats]:
        """Every group's progress on one broker (mqadmin's brokerConsumeStats): the groups
        with offsets there, each answered by GET_CONSUME_STATS at that broker only."""
        address = (await self.broker_targets(None, broker_addr))[0]
        groups = sorted({group for _, group in await self.consumer_offsets(address)})
        result: dict[str, ConsumeStats] = {}
        for group in groups:
            response = await self._instance.invoke(address, RequestCode.GET_CONSUME_STATS,
                                                   {"consumerGroup": group})
            if response.code == ResponseCode.SUCCESS:
                result[group] = parse_consume_stats(response.body)
        return result

"""Group look-ups the console needs: every subscription group the masters know, and a
group's live members (GET_ALL_SUBSCRIPTIONGROUP_CONFIG 201, GET_CONSUMER_CONNECTION_LIST
203; bodies as RocketMQ's SubscriptionGroupWrapper and ConsumerConnection).
"""

from __future__ import annotations

import asyncio
from typing import Any

from tidemq.client.admin import Admin
from tidemq.client.instance import check_response
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode


async def subscription_group_names(admin: Admin) -> list[str]:
    """Every group some master has a subscription-group config of, sorted.

    Raises:
        BrokerRejected, RemotingError: a master refused or did not answer.
    """
    cluster = await admin.cluster_list()
    instance = admin._instance
    addresses = sorted(cluster.master_addresses().values())
    responses = await asyncio.gather(*(
        instance.invoke(address, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        for address in addresses))
    names: set[str] = set()
    for address, response in zip(addresses, responses, strict=True):
        check_response(response, "list the subscription groups", address)
        table = jsonx.loads(response.body or b"{}").get("subscriptionGroupTable") or {}
        names.update(str(name) for name in table)
    return sorted(names)


async def group_members(admin: Admin, group: str) -> list[dict[str, Any]]:
    """The live members of ``group`` as the masters see them (``clientId``, ``clientAddr``,
    ``language``, ``version``), merged and sorted by client id; empty when none is online.
    """
    cluster = await admin.cluster_list()
    instance = admin._instance
    addresses = sorted(cluster.master_addresses().values())
    responses = await asyncio.gather(*(
        instance.invoke(address, RequestCode.GET_CONSUMER_CONNECTION_LIST,
                        {"consumerGroup": group})
        for address in addresses), return_exceptions=True)
    members: dict[str, dict[str, Any]] = {}
    for response in responses:
        if isinstance(response, BaseException) or response.code != ResponseCode.SUCCESS:
            continue  # not connected there (CONSUMER_NOT_ONLINE) or not reachable
        for connection in jsonx.loads(response.body or b"{}").get("connectionSet") or []:
            members.setdefault(str(connection.get("clientId")), dict(connection))
    return [members[client_id] for client_id in sorted(members)]

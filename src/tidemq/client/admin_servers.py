"""Admin requests about the servers themselves: broker and name-server settings, write
permission, the name servers' KV config, and the brokers' housekeeping requests.

``ServerAdmin`` is mixed into ``Admin`` (it uses its ``_instance``, ``cluster_list`` and
``_check_running``). Request codes and bodies: docs/protocol.md, "Admin requests".

- GET_BROKER_CONFIG (26) answers the broker's settings as properties text;
  UPDATE_BROKER_CONFIG (25) sends ``key=value`` lines the same way; the broker changes the
  keys that may change at run time and keeps them across restarts.
- GET_NAMESRV_CONFIG (319) / UPDATE_NAMESRV_CONFIG (318): the same for a name server.
- WIPE_WRITE_PERM_OF_BROKER (205) / ADD_WRITE_PERM_OF_BROKER (327) go to every name server,
  which answers how many topics' queue data it changed (``wipeTopicCount`` /
  ``addTopicCount``): taking a broker out of the write path before maintenance.
- CLEAN_EXPIRED_CONSUMEQUEUE (306) and CLEAN_UNUSED_TOPIC (316) ask a broker to drop consume
  queues below the commit log's minimum, and queues of topics it no longer has.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from tidemq.client.errors import NoRouteError
from tidemq.client.instance import check_response
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode

if TYPE_CHECKING:
    from tidemq.client.instance import ClientInstance
    from tidemq.client.route import ClusterInfo


def parse_properties_text(text: str) -> dict[str, str]:
    """``key=value`` lines (as GET_BROKER_CONFIG answers) -> dict; blank and ``#`` lines skip."""
    properties: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, _, value = line.partition("=")
        properties[key.strip()] = value.strip()
    return properties


def suggestion(wanted: str, known: list[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``known`` to ``wanted``, else ``""``."""
    close = difflib.get_close_matches(wanted, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class ServerAdmin:
    """Broker and name-server settings, write permission, KV config, housekeeping."""

    _instance: ClientInstance

    if TYPE_CHECKING:
        def _check_running(self) -> None: ...
        async def cluster_list(self) -> ClusterInfo: ...

    # -- finding brokers ------------------------------------------------------------------

    async def check_broker_addr(self, broker_addr: str) -> str:
        """``broker_addr`` when a name server knows a broker there.

        Raises:
            NoRouteError: no broker registered that address (the nearest one is suggested).
        """
        info = await self.cluster_list()
        known = sorted(address for broker in info.brokers.values()
                       for address in broker.broker_addrs.values())
        if broker_addr not in known:
            raise NoRouteError(
                f"no broker at {broker_addr} is registered with the name servers"
                f"{suggestion(broker_addr, known)} (known: {', '.join(known) or 'none'})")
        return broker_addr

    async def check_broker_name(self, broker_name: str) -> str:
        """``broker_name`` when a name server knows that broker group.

        Raises:
            NoRouteError: unknown broker name (the nearest one is suggested).
        """
        info = await self.cluster_list()
        if broker_name not in info.brokers:
            known = sorted(info.brokers)
            raise NoRouteError(
                f"no broker named {broker_name!r} is registered with the name servers"
                f"{suggestion(broker_name, known)} (known: {', '.join(known) or 'none'})")
        return broker_name

    async def broker_targets(self, cluster: str | None, broker_addr: str | None) -> list[str]:
        """One checked broker address, or every master of ``cluster`` (of all clusters when
        both are None), sorted.

        Raises:
            NoRouteError: the address or cluster is unknown, or the cluster has no master.
        """
        if broker_addr:
            return [await self.check_broker_addr(broker_addr)]
        info = await self.cluster_list()
        if cluster is not None and cluster not in info.clusters:
            known = sorted(info.clusters)
            raise NoRouteError(f"no cluster named {cluster!r} is known to the name servers"
                               f"{suggestion(cluster, known)} (known: {', '.join(known)})")
        masters = sorted(info.master_addresses(cluster).values())
        if not masters:
            raise NoRouteError("no master broker is registered with the name servers"
                               + (f" in cluster {cluster!r}" if cluster else ""))
        return masters

    # -- broker settings ------------------------------------------------------------------

    async def broker_config(self, broker_addr: str) -> dict[str, str]:
        """GET_BROKER_CONFIG: every setting of the broker at ``broker_addr``, by key."""
        self._check_running()
        response = await self._instance.invoke(broker_addr, RequestCode.GET_BROKER_CONFIG)
        check_response(response, "broker config", broker_addr)
        return parse_properties_text((response.body or b"").decode("utf-8", "replace"))

    async def update_broker_config(self, settings: dict[str, str], *,
                                   cluster: str | None = None,
                                   broker_addr: str | None = None) -> list[str]:
        """UPDATE_BROKER_CONFIG on one broker or every master of a cluster: the broker
        applies the keys that may change at run time and keeps them across restarts; it
        refuses the whole request (naming the key) if one may not change or is invalid.

        Returns:
            The broker addresses updated.

        Raises:
            BrokerRejected: a broker refused (its remark names the key and why).
        """
        self._check_running()
        body = "".join(f"{key}={value}\n" for key, value in settings.items()).encode()
        targets = await self.broker_targets(cluster, broker_addr)
        for address in targets:
            response = await self._instance.invoke(address, RequestCode.UPDATE_BROKER_CONFIG,
                                                   None, body)
            check_response(response, f"update of broker config {', '.join(settings)}",
                           address)
        return targets

    # -- name-server settings -------------------------------------------------------------

    async def namesrv_config(self) -> dict[str, dict[str, str]]:
        """GET_NAMESRV_CONFIG from every name server: address -> settings by key."""
        self._check_running()
        configs: dict[str, dict[str, str]] = {}
        for address in self._instance.namesrv_addresses:
            response = await self._instance.invoke(address, RequestCode.GET_NAMESRV_CONFIG)
            check_response(response, "name server config", address)
            configs[address] = parse_properties_text(
                (response.body or b"").decode("utf-8", "replace"))
        return configs

    async def update_namesrv_config(self, settings: dict[str, str]) -> list[str]:
        """UPDATE_NAMESRV_CONFIG on every name server (the run-time changeable keys).

        Returns:
            The name servers updated.
        """
        self._check_running()
        body = "".join(f"{key}={value}\n" for key, value in settings.items()).encode()
        for address in self._instance.namesrv_addresses:
            response = await self._instance.invoke(address, RequestCode.UPDATE_NAMESRV_CONFIG,
                                                   None, body)
            check_response(response, f"update of name server config {', '.join(settings)}",
                           address)
        return list(self._instance.namesrv_addresses)

    # -- write permission -----------------------------------------------------------------

    async def wipe_write_perm(self, broker_name: str) -> dict[str, int]:
        """WIPE_WRITE_PERM_OF_BROKER on every name server: producers stop choosing the
        broker's queues (it still serves reads). Returns name server -> topics changed."""
        return await self._write_perm(broker_name, RequestCode.WIPE_WRITE_PERM_OF_BROKER,
                                      "wipeTopicCount", "wipe write permission")

    async def add_write_perm(self, broker_name: str) -> dict[str, int]:
        """ADD_WRITE_PERM_OF_BROKER on every name server: undoes ``wipe_write_perm``."""
        return await self._write_perm(broker_name, RequestCode.ADD_WRITE_PERM_OF_BROKER,
                                      "addTopicCount", "add write permission")

    async def _write_perm(self, broker_name: str, code: int, count_field: str,
                          what: str) -> dict[str, int]:
        self._check_running()
        await self.check_broker_name(broker_name)
        counts: dict[str, int] = {}
        for address in self._instance.namesrv_addresses:
            response = await self._instance.invoke(address, code, {"brokerName": broker_name})
            check_response(response, f"{what} of broker {broker_name!r}", address)
            counts[address] = int((response.ext_fields or {}).get(count_field, 0))
        return counts

    # -- KV config ------------------------------------------------------------------------

    async def delete_kv_config(self, namespace: str, key: str) -> None:
        """DELETE_KV_CONFIG on every name server."""
        self._check_running()
        fields = {"namespace": namespace, "key": key}
        for address in self._instance.namesrv_addresses:
            response = await self._instance.invoke(address, RequestCode.DELETE_KV_CONFIG,
                                                   fields)
            check_response(response, f"delete KV config {namespace}/{key}", address)

    async def kv_list(self, namespace: str) -> dict[str, str]:
        """GET_KVLIST_BY_NAMESPACE: every key of ``namespace`` (empty when there is none)."""
        self._check_running()
        response = await self._instance.invoke_namesrv(RequestCode.GET_KVLIST_BY_NAMESPACE,
                                                       {"namespace": namespace})
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return {}
        check_response(response, f"KV list of namespace {namespace}", "name server")
        table = jsonx.loads(response.body or b"{}").get("table") or {}
        return {str(k): str(v) for k, v in sorted(table.items())}

    # -- housekeeping ---------------------------------------------------------------------

    async def clean_expired_consume_queue(self, *, cluster: str | None = None,
                                          broker_addr: str | None = None) -> list[str]:
        """CLEAN_EXPIRED_CONSUMEQUEUE on one broker or every master; returns those asked."""
        return await self._housekeeping(RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE,
                                        "clean of expired consume queues", cluster, broker_addr)

    async def clean_unused_topic(self, *, cluster: str | None = None,
                                 broker_addr: str | None = None) -> list[str]:
        """CLEAN_UNUSED_TOPIC on one broker or every master; returns those asked."""
        return await self._housekeeping(RequestCode.CLEAN_UNUSED_TOPIC,
                                        "clean of unused topics", cluster, broker_addr)

    async def _housekeeping(self, code: int, what: str, cluster: str | None,
                            broker_addr: str | None) -> list[str]:
        self._check_running()
        targets = await self.broker_targets(cluster, broker_addr)
        for address in targets:
            response = await self._instance.invoke(address, code)
            check_response(response, what, address)
        return targets

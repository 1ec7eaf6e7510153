"""ACL administration through the brokers (RocketMQ 4.x's request codes 50-54; the broker
side is ``tidemq.acl.admin_requests``, the facts in docs/protocol.md "ACL").

``Admin`` exposes these as methods (``update_acl_config``, ``delete_acl_config``,
``update_global_white_addrs``, ``acl_config_versions``, ``acl_config``); the functions here
take its ``ClientInstance`` and the broker addresses to change or ask. A change goes to every
broker given, one after the other, and fails naming the first broker that refused it (the
ones before it keep the change; running the same command again is harmless).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidemq.client.instance import check_response
from tidemq.errors import RemoteProtocolError
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode

if TYPE_CHECKING:
    from tidemq.client.instance import ClientInstance


@dataclass(frozen=True)
class AclVersion:
    """One broker's ACL file version (GET_BROKER_CLUSTER_ACL_INFO)."""

    broker_name: str
    broker_addr: str
    cluster_name: str
    counter: int
    timestamp_ms: int
    files: dict[str, int] = field(default_factory=dict)  # file -> its counter


@dataclass(frozen=True)
class AclConfig:
    """One broker's ACL rules (GET_BROKER_CLUSTER_ACL_CONFIG): white list and accounts (each
    a dict with RocketMQ's field names, secretKey included)."""

    global_white_addrs: list[str]
    accounts: list[dict[str, Any]]


def account_fields(
    access_key: str,
    *,
    secret_key: str | None = None,
    white_remote_address: str | None = None,
    admin: bool | None = None,
    default_topic_perm: str | None = None,
    default_group_perm: str | None = None,
    topic_perms: Sequence[str] | None = None,
    group_perms: Sequence[str] | None = None,
) -> dict[str, str]:
    """The UPDATE_AND_CREATE_ACL_CONFIG header: fields given only (the broker keeps the rest);
    ``topic_perms``/``group_perms`` entries are ``name=PERM`` (PUB, SUB, PUB|SUB, DENY)."""
    fields = {"accessKey": access_key}
    for key, value in (("secretKey", secret_key), ("whiteRemoteAddress", white_remote_address),
                       ("defaultTopicPerm", default_topic_perm),
                       ("defaultGroupPerm", default_group_perm)):
        if value is not None:
            fields[key] = value
    if admin is not None:
        fields["admin"] = "true" if admin else "false"
    for key, entries in (("topicPerms", topic_perms), ("groupPerms", group_perms)):
        if entries is not None:
            fields[key] = ",".join(entries)
    return fields


async def change_each(instance: ClientInstance, addresses: Iterable[str], code: int,
                      fields: dict[str, str], what: str) -> list[str]:
    """Send one ACL change to every broker; the addresses changed.

    Raises:
        BrokerRejected: a broker refused (its remark says why); later brokers are not asked.
    """
    changed = []
    for address in addresses:
        response = await instance.invoke(address, code, fields)
        check_response(response, what, address)
        changed.append(address)
    return changed


async def acl_versions(instance: ClientInstance, addresses: Iterable[str]) -> list[AclVersion]:
    """GET_BROKER_CLUSTER_ACL_INFO from each broker.

    Raises:
        BrokerRejected: a broker refused (ACL off there, for one).
        RemoteProtocolError: an answer without its version fields.
    """
    versions = []
    for address in addresses:
        response = await instance.invoke(address, RequestCode.GET_BROKER_CLUSTER_ACL_INFO, {})
        check_response(response, "read the ACL version", address)
        fields = response.ext_fields or {}
        try:
            version = jsonx.loads(fields.get("version") or "{}")
            files = jsonx.loads(fields.get("allAclFileVersion") or "{}")
            versions.append(AclVersion(
                broker_name=fields.get("brokerName", "?"),
                broker_addr=fields.get("brokerAddr", address),
                cluster_name=fields.get("clusterName", "?"),
                counter=int(version.get("counter", 0)),
                timestamp_ms=int(version.get("timestamp", 0)),
                files={str(k): int(v.get("counter", 0)) for k, v in files.items()},
            ))
        except (ValueError, TypeError, AttributeError) as exc:
            raise RemoteProtocolError(
                f"ACL version answer from {address} is not DataVersion JSON: {exc}") from exc
    return versions


async def acl_config(instance: ClientInstance, address: str) -> AclConfig:
    """GET_BROKER_CLUSTER_ACL_CONFIG from one broker (needs an admin account).

    Raises:
        BrokerRejected: the broker refused.
        RemoteProtocolError: the body is not the expected JSON.
    """
    response = await instance.invoke(address, RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, {})
    check_response(response, "read the ACL config", address)
    try:
        body = jsonx.loads(response.body or b"{}")
        return AclConfig([str(p) for p in body.get("globalWhiteAddrs") or []],
                         [dict(a) for a in body.get("plainAccessConfigs") or []])
    except (ValueError, TypeError, AttributeError) as exc:
        raise RemoteProtocolError(f"ACL config answer from {address} is not JSON: {exc}"
                                  ) from exc

"""The ACL administration request codes (RocketMQ 4.x ``AdminBrokerProcessor``), persisted to
``plain_acl.yml`` through ``AclService``.

=================================  ========================================================
UPDATE_AND_CREATE_ACL_CONFIG (50)  header ``accessKey``, ``secretKey``,
                                   ``whiteRemoteAddress``, ``admin``, ``defaultTopicPerm``,
                                   ``defaultGroupPerm``, ``topicPerms`` and ``groupPerms``
                                   (comma-joined ``name=PERM``); fields absent keep their
                                   values. Failure: UPDATE_AND_CREATE_ACL_CONFIG_FAILED (209)
DELETE_ACL_CONFIG (51)             header ``accessKey``. Failure: DELETE_ACL_CONFIG_FAILED
                                   (210)
GET_BROKER_CLUSTER_ACL_INFO (52)   response header ``version`` (DataVersion JSON),
                                   ``allAclFileVersion`` (JSON ``{file: DataVersion}``),
                                   ``brokerAddr``, ``brokerName``, ``clusterName``
UPDATE_GLOBAL_WHITE_ADDRS_CONFIG   header ``globalWhiteAddrs`` (comma-joined patterns),
(53)                               optional ``aclFileFullPath`` (must be this broker's file).
                                   Failure: UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED (211)
GET_BROKER_CLUSTER_ACL_CONFIG (54) body ``{"globalWhiteAddrs": [...], "plainAccessConfigs":
                                   [{accessKey, secretKey, whiteRemoteAddress, admin,
                                   defaultTopicPerm, defaultGroupPerm, topicPerms,
                                   groupPerms}]}`` (RocketMQ 4.7 to 4.9.x; secret keys
                                   included, so it is admin-only here)
=================================  ========================================================

With ACL off every one of them is answered with its failure code (SYSTEM_ERROR for the two
reads) and a remark saying to set aclEnable=true; the admin-only ones among them are checked by
the request guard before they get here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from tidemq.acl.acl_file import ACCOUNTS, GLOBAL_WHITE, AclFileError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

if TYPE_CHECKING:
    from tidemq.acl.service import AclService

_ACCOUNT_TEXT_FIELDS = ("secretKey", "whiteRemoteAddress", "defaultTopicPerm",
                        "defaultGroupPerm")


def _data_version(counter: int, timestamp: int) -> dict[str, int]:
    return {"counter": counter, "stateVersion": 0, "timestamp": timestamp}


def _texts(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(item) for item in value if item is not None]
    return [str(value)]


def _split(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


class AclAdminProcessor:
    """Serves the ACL administration codes for one server.

    Args:
        service: the server's ACL, or None when aclEnable is false.
        describe: ``() -> (brokerAddr, brokerName, clusterName)`` for GET_BROKER_CLUSTER_ACL_INFO,
            read at request time (the address is known once the server bound its port).
    """

    def __init__(self, service: AclService | None, describe: Any) -> None:
        self._service = service
        self._describe = describe

    def register(self, server: Any) -> None:
        """Register the five codes on ``server`` (``RemotingServer.register``'s shape)."""
        server.register(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, self.update_account)
        server.register(RequestCode.DELETE_ACL_CONFIG, self.delete_account)
        server.register(RequestCode.GET_BROKER_CLUSTER_ACL_INFO, self.version_info)
        server.register(RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, self.update_global_white)
        server.register(RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, self.all_config)

    def _off(self, request: RemotingCommand, code: int) -> RemotingCommand | None:
        if self._service is not None:
            return None
        _, broker_name, _ = self._describe()
        return RemotingCommand.response_to(
            request, code,
            remark=f"ACL is off on {broker_name}: start it with aclEnable=true (and an "
                   "aclFilePath) to manage accounts",
        )

    async def update_account(self, request: RemotingCommand, connection: Any
                             ) -> RemotingCommand:
        """UPDATE_AND_CREATE_ACL_CONFIG (module docstring)."""
        failed = ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED
        off = self._off(request, failed)
        if off is not None:
            return off
        fields = request.ext_fields or {}
        access_key = fields.get("accessKey")
        if not access_key:
            return RemotingCommand.response_to(
                request, failed, remark="accessKey is missing: name the account to create or "
                                        "change")
        account: dict[str, Any] = {"accessKey": access_key}
        for name in _ACCOUNT_TEXT_FIELDS:
            if fields.get(name) is not None:
                account[name] = fields[name]
        if fields.get("admin") is not None:
            account["admin"] = fields["admin"].strip().lower() == "true"
        for name in ("topicPerms", "groupPerms"):
            if fields.get(name) is not None:
                account[name] = _split(fields[name])
        try:
            self._service.update_account(account)  # type: ignore[union-attr]
        except AclFileError as exc:
            return RemotingCommand.response_to(
                request, failed,
                remark=f"account {access_key!r} was not created or changed: {exc}")
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def delete_account(self, request: RemotingCommand, connection: Any
                             ) -> RemotingCommand:
        """DELETE_ACL_CONFIG (module docstring)."""
        failed = ResponseCode.DELETE_ACL_CONFIG_FAILED
        off = self._off(request, failed)
        if off is not None:
            return off
        access_key = (request.ext_fields or {}).get("accessKey")
        if not access_key:
            return RemotingCommand.response_to(request, failed,
                                               remark="accessKey is missing: name the account")
        try:
            deleted = self._service.delete_account(access_key)  # type: ignore[union-attr]
        except AclFileError as exc:
            return RemotingCommand.response_to(request, failed, remark=str(exc))
        if not deleted:
            return RemotingCommand.response_to(
                request, failed,
                remark=f"there is no account {access_key!r} in {self._service.path}")  # type: ignore[union-attr]
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def update_global_white(self, request: RemotingCommand, connection: Any
                                  ) -> RemotingCommand:
        """UPDATE_GLOBAL_WHITE_ADDRS_CONFIG (module docstring)."""
        failed = ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED
        off = self._off(request, failed)
        if off is not None:
            return off
        service = self._service
        assert service is not None
        fields = request.ext_fields or {}
        path = fields.get("aclFileFullPath")
        if path and path != str(service.path):
            return RemotingCommand.response_to(
                request, failed,
                remark=f"aclFileFullPath={path} is not this broker's ACL file ({service.path}); "
                       "leave it out")
        try:
            service.update_global_white(_split(fields.get("globalWhiteAddrs") or ""))
        except AclFileError as exc:
            return RemotingCommand.response_to(request, failed, remark=str(exc))
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def version_info(self, request: RemotingCommand, connection: Any) -> RemotingCommand:
        """GET_BROKER_CLUSTER_ACL_INFO (module docstring)."""
        off = self._off(request, ResponseCode.SYSTEM_ERROR)
        if off is not None:
            return off
        rules = self._service.rules  # type: ignore[union-attr]
        version = _data_version(rules.data_version_counter, rules.data_version_timestamp)
        broker_addr, broker_name, cluster_name = self._describe()
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, ext_fields={
            "version": orjson.dumps(version).decode(),
            "allAclFileVersion": orjson.dumps({str(rules.path): version}).decode(),
            "brokerAddr": broker_addr,
            "brokerName": broker_name,
            "clusterName": cluster_name,
        })

    async def all_config(self, request: RemotingCommand, connection: Any) -> RemotingCommand:
        """GET_BROKER_CLUSTER_ACL_CONFIG (module docstring)."""
        off = self._off(request, ResponseCode.SYSTEM_ERROR)
        if off is not None:
            return off
        document = self._service.rules.document  # type: ignore[union-attr]
        accounts = []
        for raw in document.get(ACCOUNTS) or []:
            if not isinstance(raw, dict):
                continue
            accounts.append({
                "accessKey": str(raw.get("accessKey")),
                "secretKey": str(raw.get("secretKey")),
                "whiteRemoteAddress": raw.get("whiteRemoteAddress"),
                "admin": bool(raw.get("admin", False)),
                "defaultTopicPerm": raw.get("defaultTopicPerm"),
                "defaultGroupPerm": raw.get("defaultGroupPerm"),
                "topicPerms": _texts(raw.get("topicPerms")),
                "groupPerms": _texts(raw.get("groupPerms")),
            })
        body = {"globalWhiteAddrs": _texts(document.get(GLOBAL_WHITE)),
                "plainAccessConfigs": accounts}
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                           body=orjson.dumps(body))

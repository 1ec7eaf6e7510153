"""Role requests: GET_BROKER_EPOCH_CACHE (1007) and NOTIFY_BROKER_ROLE_CHANGED (1008).

RocketMQ 5's controller mode uses these two codes; tidemq answers them on every broker:

- GET_BROKER_EPOCH_CACHE: this broker's epoch list and commit-log end (body in
  broker/ha/reconcile.py). A slave made by a role switch asks its new master before copying;
  ``tidemq admin`` and the controller read it too. Any broker answers (a static one with an
  empty list).
- NOTIFY_BROKER_ROLE_CHANGED (admin-only under ACL): header masterAddress, masterEpoch,
  brokerId (the id this broker takes as a slave), and tidemq's masterHaAddress and
  masterRole (headers.py). A broker whose own address is masterAddress becomes the master of
  masterEpoch; any other becomes its slave with brokerId. Answered once the switch is done
  (for a slave: writes refused and the HA client started; the truncation and catch-up follow
  in the background). A stale epoch, a missing brokerId or a store that cannot switch is
  refused with SYSTEM_ERROR and a remark saying why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidemq.broker.config import BrokerRole
from tidemq.broker.ha.reconcile import epoch_cache_body
from tidemq.broker.role import RoleSwitchError
from tidemq.errors import HeaderFieldError, StoreError
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import NotifyBrokerRoleChangedRequestHeader

if TYPE_CHECKING:
    from tidemq.broker.identity import BrokerIdentity
    from tidemq.broker.role import ReplicationRole
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer
    from tidemq.store.interface import MessageStore


class RoleProcessor:
    """Answers the role requests (module docstring).

    Args:
        role: the broker's ReplicationRole (switched here).
        identity: names and address (who is the master).
        store: the store (epoch list, log end).
    """

    def __init__(self, *, role: ReplicationRole, identity: BrokerIdentity,
                 store: MessageStore) -> None:
        self._role = role
        self._identity = identity
        self._store = store

    def register(self, server: RemotingServer) -> None:
        """Register both handlers on ``server``."""
        server.register(RequestCode.GET_BROKER_EPOCH_CACHE, self.get_epoch_cache)
        server.register(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, self.notify_role_changed)

    async def get_epoch_cache(self, request: RemotingCommand,
                              connection: Connection | None = None) -> RemotingCommand:
        """This broker's epochs and commit-log end."""
        epochs = getattr(self._store, "epochs", None)
        identity = self._identity
        body = epoch_cache_body(identity.cluster_name, identity.broker_name,
                                identity.broker_id, epochs.entries if epochs else [],
                                self._store.commit_log_max_offset())
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                           body=jsonx.dumps(body))

    async def notify_role_changed(self, request: RemotingCommand,
                                  connection: Connection | None = None) -> RemotingCommand:
        """Become master or slave as the header says."""
        try:
            header = NotifyBrokerRoleChangedRequestHeader.from_ext_fields(request.ext_fields)
            master_role = _master_role(header.master_role)
        except (HeaderFieldError, ValueError) as e:
            return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, str(e))
        try:
            if header.master_address == self._identity.address:
                await self._role.become_master(header.master_epoch, master_role)
                done = f"master of epoch {header.master_epoch}"
            else:
                if header.broker_id is None:
                    raise RoleSwitchError(
                        "brokerId is missing: a broker told to follow "
                        f"{header.master_address} needs the id it registers with as a slave")
                ha_address = header.master_ha_address or _next_port(header.master_address)
                await self._role.become_slave(header.master_epoch, header.master_address,
                                              ha_address, header.broker_id)
                done = (f"slave {header.broker_id} of {header.master_address} in epoch "
                        f"{header.master_epoch}")
        except (RoleSwitchError, StoreError, ValueError) as e:
            return RemotingCommand.response_to(
                request, ResponseCode.SYSTEM_ERROR,
                f"broker {self._identity.broker_name} at {self._identity.address} did not "
                f"change role: {e}")
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                           f"broker {self._identity.address} is now {done}")


def _master_role(text: str | None) -> BrokerRole | None:
    if not text:
        return None
    role = BrokerRole(text.upper())
    if role is BrokerRole.SLAVE:
        raise ValueError("masterRole must be SYNC_MASTER or ASYNC_MASTER, not SLAVE")
    return role


def _next_port(address: str) -> str:
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"masterAddress {address!r} is not host:port")
    return f"{host}:{int(port) + 1}"

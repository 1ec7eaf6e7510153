"""The check a slave makes of its master before streaming, over ordinary admin requests.

RocketMQ's HA stream has no handshake: a slave pointed at the wrong master (another broker
group, another cluster) or a slave whose log is not a copy of its master's would just start
appending the master's bytes after its own. tidemq keeps the stream byte for byte and asks
the master's remoting port first (requests any RocketMQ 4.x broker answers):

1. GET_BROKER_CONFIG (26): the master's brokerName and brokerClusterName must be the
   slave's, and its brokerRole must not be SLAVE;
2. GET_BROKER_RUNTIME_INFO (28): the master's commitLogMinOffset / commitLogMaxOffset. A
   slave whose log ends after the master's is *ahead* of it; a slave with records whose
   end is before the master's first retained offset cannot continue from there;
3. VIEW_MESSAGE_BY_ID (33) at the start of the slave's last record: the master must hold a
   record there, byte for byte the same. Otherwise the logs *differ* (the slave was once a
   master, or its disk was swapped).

Any of these is a refusal: the slave streams nothing, logs the reason naming both offsets,
and never truncates its own log. An unreachable master is no refusal: the slave retries.
"""

from __future__ import annotations

from typing import Protocol

from tidemq.broker.outgoing import refusal_hint
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting.client import RemotingClient

_REQUEST_TIMEOUT_MS = 3000


class ReplicaStore(Protocol):
    """What the slave's HA side needs of its store (a ``StoreCore`` has it)."""

    def commit_log_min_offset(self) -> int: ...

    def commit_log_max_offset(self) -> int: ...

    def last_record_offset(self) -> int: ...

    def read_message(self, physical_offset: int) -> bytes | None: ...

    def append_replicated(self, physical_offset: int, data: bytes | memoryview) -> int: ...

    def dispatch_replicated(self, max_bytes: int | None = None) -> int: ...

    def replicated_oldest_timestamp(self) -> int: ...

    def replicated_confirmed_offset(self) -> int: ...


class MasterUnreachable(Exception):
    """The master did not answer a check request (retry later)."""


def parse_properties(text: str) -> dict[str, str]:
    """``key=value`` lines (GET_BROKER_CONFIG's body) as a dict; other lines are skipped."""
    properties: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            properties[key.strip()] = value.strip()
    return properties


class MasterCheck:
    """Asks a master whether this slave may copy from it.

    Args:
        client: the broker's remoting client.
        broker_name, cluster_name: this slave's brokerName and brokerClusterName.
        store: this slave's store.
    """

    def __init__(self, client: RemotingClient, broker_name: str, cluster_name: str,
                 store: ReplicaStore) -> None:
        self._client = client
        self._broker_name = broker_name
        self._cluster_name = cluster_name
        self._store = store

    async def problem(self, master_addr: str) -> str | None:
        """Why this slave must not copy from the master at ``master_addr`` (its remoting
        address), or None when it may.

        Raises:
            MasterUnreachable: a request failed; nothing is known yet.
        """
        config = parse_properties(
            (await self._call(master_addr, RequestCode.GET_BROKER_CONFIG) or b"").decode(
                "utf-8", "replace")
        )
        name = config.get("brokerName", "")
        cluster = config.get("brokerClusterName", "")
        role = config.get("brokerRole", "")
        if name != self._broker_name or cluster != self._cluster_name:
            return (
                f"the master at {master_addr} is broker {name!r} of cluster {cluster!r}, but "
                f"this slave is broker {self._broker_name!r} of cluster {self._cluster_name!r}; "
                "a slave copies only the master of its own brokerName and brokerClusterName "
                "(fix haMasterAddress, brokerName or brokerClusterName)"
            )
        if role.upper() == "SLAVE":
            return (
                f"the broker at {master_addr} is a slave (brokerRole=SLAVE), not a master; "
                "point haMasterAddress at the master (brokerId 0)"
            )
        table = jsonx.loads(
            await self._call(master_addr, RequestCode.GET_BROKER_RUNTIME_INFO) or b"{}"
        ).get("table") or {}
        master_min = int(table.get("commitLogMinOffset", 0))
        master_max = int(table.get("commitLogMaxOffset", 0))
        ours = self._store.commit_log_max_offset()
        if ours > master_max:
            return (
                f"this slave's commit log ends at offset {ours}, after its master's "
                f"({master_addr}), which ends at {master_max}: the slave's log is ahead of "
                "the master's (was it a master once?). It will not copy, and it truncates "
                "nothing itself: empty its store directory to copy the master afresh"
            )
        last = self._store.last_record_offset()
        if last < 0:
            return None
        if ours < master_min:
            return (
                f"this slave's commit log ends at offset {ours}, but its master ({master_addr}) "
                f"keeps only offsets from {master_min} on: the records in between are gone. "
                "Empty the slave's store directory so that it copies from the master's first "
                "retained offset"
            )
        ours_record = self._store.read_message(last)
        theirs = await self._view(master_addr, last)
        if ours_record is None or theirs != ours_record:
            return (
                f"this slave's last record (offset {last}, log end {ours}) is not the "
                f"master's record at that offset (master {master_addr} ends at {master_max}"
                f"{'' if theirs else ', and holds no record starting there'}): the logs "
                "differ (was the slave a master once, or its disk swapped?). It will not "
                "copy, and it truncates nothing itself: empty its store directory to copy "
                "the master afresh"
            )
        return None

    async def _call(self, address: str, code: int, ext_fields: dict[str, str] | None = None,
                    *, refused_ok: bool = False) -> bytes | None:
        try:
            response = await self._client.invoke(
                address, RemotingCommand.request(code, ext_fields or {}), _REQUEST_TIMEOUT_MS
            )
        except Exception as e:  # remoting errors, a closed loop: all mean "not now"
            raise MasterUnreachable(f"{address} did not answer request {code}: {e}") from e
        if response.code != ResponseCode.SUCCESS:
            if refused_ok:
                return None
            raise MasterUnreachable(
                f"{address} answered request {code} with code {response.code}: "
                f"{response.remark or ''}{refusal_hint(response.code)}"
            )
        return response.body or b""

    async def _view(self, address: str, physical_offset: int) -> bytes | None:
        # A refusal means "no record starts there"; no answer at all is MasterUnreachable.
        return await self._call(
            address, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(physical_offset)},
            refused_ok=True,
        )

"""ControllerStore: the controller's records in etcd, over the asyncio etcd v3 client aetcd.

Every method speaks in records (records.py) and keys (keys.py); nothing above this module
sees etcd's types. Failures to reach etcd become ``ControllerUnavailable`` (retriable: the
callers keep their current state and try again); a value tidemq did not write becomes
``RecordError``.

Endpoints: ``controllerAddr`` is etcd's client endpoints, ``host:port;host:port`` (RocketMQ's
separator for address lists). One is used at a time; a failed request moves to the next one
and is tried there once, so a 3-node etcd with one node down costs one failed request.

Compare-and-set: the group state key is only ever written by a transaction comparing its mod
revision with the one read (``put_state``); two deciders that read the same state cannot both
commit. The election record of the new epoch is written in the same transaction.

Owner: one event loop; an instance is not shared between loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from tidemq.controller.keys import DEFAULT_PREFIX, Keys
from tidemq.controller.records import ElectionRecord, GroupState, ReplicaReport
from tidemq.errors import ConfigError, TidemqError

log = logging.getLogger("tidemq.controller")

# One etcd request may take this long before we call etcd unreachable: long enough for a
# loaded etcd's fsync, short enough that a broker notices an outage within a heartbeat or two.
REQUEST_TIMEOUT_S = 2.0
# A request whose shared channel was closed by another request's failure is asked again on a new
# channel this many times (then it fails as a cancel).
CHANNEL_REOPENS = 2


class ControllerUnavailable(TidemqError):
    """No etcd endpoint of controllerAddr answered; callers keep their state and retry."""

    retriable = True


class ClusterMismatch(TidemqError):
    """The etcd prefix holds another cluster's data (its marker names another cluster)."""


def parse_endpoints(text: str | None, key: str = "controllerAddr") -> list[tuple[str, int]]:
    """``host:port;host:port`` (commas accepted too) as (host, port) pairs.

    Raises:
        ConfigError: empty, or an entry without a numeric port; names ``key``.
    """
    if not text or not text.strip():
        raise ConfigError(f"{key} is empty: give etcd's client endpoints as host:port;host:port")
    endpoints = []
    for item in text.replace(",", ";").split(";"):
        item = item.strip()
        if not item:
            continue
        for scheme in ("http://", "https://"):
            item = item.removeprefix(scheme)
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"{key}={text!r}: {item!r} is not host:port (etcd's client endpoints, "
                "for example 127.0.0.1:2379;127.0.0.1:22379)"
            )
        endpoints.append((host, int(port)))
    if not endpoints:
        raise ConfigError(f"{key}={text!r} names no endpoint (host:port;host:port)")
    return endpoints


@dataclass(slots=True)
class GroupView:
    """One read of a group: its state (None before its first master), live replicas, and
    the etcd revision the read saw."""

    broker_name: str
    state: GroupState | None
    state_revision: int  # mod revision of the state key (0: no state yet)
    replicas: dict[int, ReplicaReport] = field(default_factory=dict)
    revision: int = 0
    master_offset: tuple[int, int] | None = None  # (epoch, offset) last written by a master

    def master_alive(self) -> bool:
        """True when the state's master process still holds its lease (its report exists
        under the lease the state names)."""
        state = self.state
        if state is None:
            return False
        report = self.replicas.get(state.master_broker_id)
        return report is not None and report.lease == state.master_lease


class ControllerStore:
    """The controller's records in one etcd cluster under one prefix.

    Args:
        endpoints: etcd client endpoints (``parse_endpoints``).
        prefix: ``controllerEtcdPrefix``.
        request_timeout_s: per request.
    """

    def __init__(self, endpoints: list[tuple[str, int]], prefix: str = DEFAULT_PREFIX,
                 request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        try:
            import aetcd  # imported here: only controller mode needs it (and grpc)
        except ImportError as e:
            raise ConfigError(
                f"automatic failover needs the etcd client aetcd ({e}): install "
                "tidemq[controller] (pip install 'tidemq[controller]')") from e

        self._aetcd = aetcd
        self.endpoints = endpoints
        self.keys = Keys(prefix.rstrip("/") or DEFAULT_PREFIX)
        self._timeout = request_timeout_s
        self._index = 0
        self._client: Any = None

    @property
    def endpoint(self) -> str:
        """The endpoint in use (``host:port``)."""
        host, port = self.endpoints[self._index]
        return f"{host}:{port}"

    @property
    def endpoints_text(self) -> str:
        return ";".join(f"{h}:{p}" for h, p in self.endpoints)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            # Closing a channel whose peer is gone must not hold up a stop or a failover.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._timeout):
                    await client.close()

    async def __aenter__(self) -> ControllerStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- requests, failing over between endpoints --------------------------------------------

    def _connected_client(self) -> Any:
        if self._client is None:
            host, port = self.endpoints[self._index]
            self._client = self._aetcd.Client(host=host, port=port, timeout=self._timeout)
        return self._client

    async def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        errors = []
        endpoints_left = len(self.endpoints)
        reopens_left = CHANNEL_REOPENS
        while endpoints_left > 0:
            client = self._connected_client()
            try:
                async with asyncio.timeout(self._timeout + 0.5):
                    if callable(method):
                        return await method(client)
                    return await getattr(client, method)(*args, **kwargs)
            except (self._aetcd.exceptions.ClientError, TimeoutError, OSError) as e:
                # Unreachable, timed out, or an error of that member (no leader, a lease it
                # no longer knows): try the next endpoint once, then give up for this round.
                errors.append(f"{self.endpoint}: {type(e).__name__} {e}".strip())
                await self.close()
                self._index = (self._index + 1) % len(self.endpoints)
                endpoints_left -= 1
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling() or reopens_left == 0:
                    raise  # this request itself was cancelled
                # Requests share one channel: another one's failure closed it under this one,
                # which grpc reports as a local cancel. Ask again on a new channel.
                reopens_left -= 1
                errors.append(f"{self.endpoint}: the channel was closed under the request")
                if self._client is client:
                    await self.close()
        raise ControllerUnavailable(
            f"etcd did not answer {what} at controllerAddr={self.endpoints_text} "
            f"({'; '.join(errors)}); check that etcd runs there and that controllerAddr "
            "lists its client endpoints"
        )

    # -- the cluster marker -------------------------------------------------------------------

    async def claim_cluster(self, cluster_name: str) -> None:
        """Write the marker when the prefix is empty; check it names ``cluster_name``.

        Raises:
            ClusterMismatch: the prefix belongs to another cluster.
            ControllerUnavailable: etcd did not answer.
        """
        marker = self.keys.marker
        tx = self._connected_client().transactions
        await self._call(
            "the cluster marker", "transaction",
            compare=[tx.version(marker) == 0],
            success=[tx.put(marker, cluster_name.encode())],
            failure=[],
        )
        got = await self._call("the cluster marker", "get", marker)
        holder = got.value.decode(errors="replace") if got is not None else ""
        if holder != cluster_name:
            raise ClusterMismatch(
                f"etcd at controllerAddr={self.endpoints_text} holds the failover data of "
                f"cluster {holder!r} under prefix {self.keys.prefix!r}, and this is cluster "
                f"{cluster_name!r}: give this cluster its own controllerEtcdPrefix (or its "
                "own etcd); tidemq never mixes two clusters' masters"
            )

    async def cluster_name(self) -> str | None:
        """The cluster the prefix belongs to (None: nobody claimed it yet)."""
        got = await self._call("the cluster marker", "get", self.keys.marker)
        return got.value.decode(errors="replace") if got is not None else None

    # -- leases -------------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; its id."""
        lease = await self._call("a lease grant", "lease", ttl_s)
        return int(lease.id)

    async def keep_alive(self, lease: int) -> int:
        """Refresh ``lease``; the TTL etcd granted again, 0 when the lease is gone."""
        reply = await self._call("a lease keep-alive", "refresh_lease", lease)
        return int(reply.TTL) if reply is not None else 0

    async def revoke(self, lease: int) -> None:
        await self._call("a lease revoke", "revoke_lease", lease)

    async def register_controller(self, controller_id: str, description: bytes,
                                  lease: int) -> None:
        """Say that a controller runs (``getControllerMetaData`` lists them)."""
        await self._call("a controller registration", "put",
                         self.keys.controllers + controller_id.encode(), description,
                         lease=lease)

    async def controllers(self) -> dict[str, str]:
        """The running controllers: id -> what they wrote of themselves."""
        result = await self._call("the controllers", "get_prefix", self.keys.controllers)
        head = len(self.keys.controllers)
        return {kv.key[head:].decode(errors="replace"): kv.value.decode(errors="replace")
                for kv in result}

    async def members(self) -> list[str]:
        """etcd's members as ``name client-URLs``."""
        async def collect(client: Any) -> list[str]:
            return [f"{m.name} {','.join(m.client_urls)}" async for m in client.members()]

        return await self._call("the etcd members", collect)

    # -- reports ------------------------------------------------------------------------------

    async def put_report(self, broker_name: str, report: ReplicaReport, lease: int) -> None:
        """Write this process's report under its lease."""
        key = self.keys.replica(broker_name, report.broker_id)
        await self._call("a replica report", "put", key, report.to_json(), lease=lease)

    async def put_master_offset(self, broker_name: str, epoch: int, offset: int) -> None:
        """A master's confirmed offset, kept after its lease ends (for ASYNC loss windows)."""
        key = self.keys.group(broker_name) + b"masterOffset"
        await self._call("the master offset", "put", key, f"{epoch} {offset}".encode())

    # -- reads --------------------------------------------------------------------------------

    async def group_names(self) -> list[str]:
        """Every group with a key under the prefix."""
        result = await self._call("the groups", "get_prefix", self.keys.groups, keys_only=True)
        names = {self.keys.group_name_of(kv.key) for kv in result}
        return sorted(n for n in names if n)

    async def read_group(self, broker_name: str) -> GroupView:
        """The group's state, live replicas and last master offset, in one consistent read."""
        result = await self._call("the group", "get_prefix", self.keys.group(broker_name))
        view = GroupView(broker_name, None, 0, revision=int(result.header.revision))
        replicas_prefix = self.keys.replicas(broker_name)
        state_key = self.keys.state(broker_name)
        master_offset_key = self.keys.group(broker_name) + b"masterOffset"
        for kv in result:
            key = kv.key
            if key == state_key:
                view.state = GroupState.from_json(kv.value)
                view.state_revision = int(kv.mod_revision)
            elif key.startswith(replicas_prefix):
                report = ReplicaReport.from_json(kv.value, lease=int(kv.lease),
                                                 revision=int(kv.mod_revision))
                view.replicas[report.broker_id] = report
            elif key == master_offset_key:
                epoch, _, offset = kv.value.decode().partition(" ")
                view.master_offset = (int(epoch), int(offset))
        return view

    async def history(self, broker_name: str) -> list[ElectionRecord]:
        """The group's election records, oldest first."""
        result = await self._call("the election history", "get_prefix",
                                  self.keys.history(broker_name))
        return sorted((ElectionRecord.from_json(kv.value) for kv in result),
                      key=lambda r: r.epoch)

    async def revision(self) -> int:
        """etcd's current revision."""
        result = await self._call("the revision", "get_prefix", self.keys.marker,
                                  keys_only=True)
        return int(result.header.revision)

    # -- compare-and-set ----------------------------------------------------------------------

    async def put_state(self, state: GroupState, seen_revision: int,
                        election: ElectionRecord | None = None) -> bool:
        """Replace the group's state if nobody changed it since ``seen_revision`` (0: create
        it); with ``election``, write that epoch's record in the same transaction.

        Returns:
            True when committed, False when someone else changed the state first.
        """
        client = self._connected_client()
        tx = client.transactions
        key = self.keys.state(state.broker_name)
        compare = [tx.mod(key) == seen_revision] if seen_revision else [tx.version(key) == 0]
        success = [tx.put(key, state.to_json())]
        if election is not None:
            success.append(tx.put(self.keys.election(state.broker_name, election.epoch),
                                  election.to_json()))
        committed, _ = await self._call("a state change", "transaction", compare=compare,
                                        success=success, failure=[])
        return bool(committed)

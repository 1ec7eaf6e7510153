"""Queue locks for orderly consumers: LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42).

An orderly push consumer must own a queue on the broker before it consumes it, so that two
members of a group never process one queue's messages at once while a rebalance moves the
queue between them. The broker keeps, per (consumer group, message queue), the client id
holding the lock and when it last locked it. A lock is a lease: held for
``REBALANCE_LOCK_LEASE_MS`` (60 s, RocketMQ's ``rocketmq.broker.rebalance.lockMaxLiveTime``)
after the holder's last LOCK_BATCH_MQ, which renews it; clients relock every 20 s and consider
their own lock gone after 30 s, so a live holder never loses it. Once a lease has run out any
member may take the queue.

A lease also ends when the connection its holder last locked it on closes: a consumer whose
process died (or whose connection broke) gives its queues to the rest of the group at once
instead of after the 60 s lease. A holder that reconnects and relocks on a new connection owns
the lease there, so the close of its old connection releases nothing.

Bodies (docs/protocol.md §4.14, §5.5), JSON, no extFields:
    request   {"clientId": "...", "consumerGroup": "g", "mqSet": [MessageQueue, ...]}
    response  {"lockOKMQSet": [MessageQueue, ...]}      (LOCK only: the queues now held)
    MessageQueue = {"brokerName": "b", "queueId": 0, "topic": "T"}

Everything runs on the broker's event loop thread; nothing here is locked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from tidemq.errors import RemoteProtocolError
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

if TYPE_CHECKING:
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer

log = logging.getLogger("tidemq.broker")

# RocketMQ's rocketmq.broker.rebalance.lockMaxLiveTime: three client relock periods (20 s),
# so a holder that misses two relocks in a row still keeps its queues.
REBALANCE_LOCK_LEASE_MS = 60_000

# One request locks the queues of one consumer; a topic has at most a few thousand queues.
# The bound keeps a bogus body from making us build an unbounded set.
LOCK_BATCH_QUEUES_MAX = 65_536

_WATCHED_ATTRIBUTE = "tidemq.broker.lock_watch"


def monotonic_ms() -> int:
    """Milliseconds of a clock that never goes back (for leases and expiry, not timestamps)."""
    return int(time.monotonic() * 1000)


class MessageQueue(NamedTuple):
    """A queue as RocketMQ names it: topic, broker name and queue id."""

    topic: str
    broker_name: str
    queue_id: int

    def to_json(self) -> dict[str, Any]:
        """The MessageQueue JSON object (fastjson's field names)."""
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}


@dataclass(slots=True)
class _Lease:
    client_id: str
    last_lock_ms: int
    owner: object = None  # what the lease was last locked through (a connection), or None


class RebalanceLockManager:
    """Per (group, queue) leases held by client ids.

    Args:
        lease_ms: how long a lock lasts after its holder's last lock request.
        clock_ms: a monotonic millisecond clock (injected by tests).
    """

    def __init__(
        self,
        *,
        lease_ms: int = REBALANCE_LOCK_LEASE_MS,
        clock_ms: Callable[[], int] = monotonic_ms,
    ) -> None:
        self._lease_ms = lease_ms
        self._clock_ms = clock_ms
        self._leases: dict[str, dict[MessageQueue, _Lease]] = {}

    def try_lock_batch(
        self, group: str, queues: Iterable[MessageQueue], client_id: str, *,
        owner: object = None,
    ) -> list[MessageQueue]:
        """Lock or renew each queue for ``client_id``; returns the queues it now holds.

        A queue is granted when it is free, its lease has run out, or ``client_id`` already
        holds it (then the lease is renewed). Queues held by a live other client are left out.

        Args:
            owner: what the request came through (the connection); ``release_owner(owner)``
                ends the granted leases unless a later lock moved them to another owner.
        """
        now = self._clock_ms()
        leases = self._leases.setdefault(group, {})
        granted: list[MessageQueue] = []
        for queue in queues:
            lease = leases.get(queue)
            if lease is None or lease.client_id == client_id or self._expired(lease, now):
                leases[queue] = _Lease(client_id, now, owner)
                granted.append(queue)
        if not leases:
            del self._leases[group]
        return granted

    def unlock_batch(self, group: str, queues: Iterable[MessageQueue], client_id: str) -> None:
        """Release the queues ``client_id`` holds; queues held by others are left alone."""
        leases = self._leases.get(group)
        if not leases:
            return
        for queue in queues:
            lease = leases.get(queue)
            if lease is not None and lease.client_id == client_id:
                del leases[queue]
        if not leases:
            del self._leases[group]

    def release_owner(self, owner: object) -> list[tuple[str, MessageQueue, str]]:
        """End every lease last locked through ``owner`` (its connection closed).

        Returns:
            (group, queue, client id) of each lease ended, so callers can log them.
        """
        released: list[tuple[str, MessageQueue, str]] = []
        for group, leases in list(self._leases.items()):
            for queue, lease in list(leases.items()):
                if lease.owner is owner:
                    del leases[queue]
                    released.append((group, queue, lease.client_id))
            if not leases:
                del self._leases[group]
        return released

    def purge_expired(self) -> int:
        """Forget leases that have run out (they grant nothing); returns how many went.

        Run periodically so queues locked once and never again do not pile up.
        """
        now = self._clock_ms()
        purged = 0
        for group, leases in list(self._leases.items()):
            for queue in [q for q, lease in leases.items() if self._expired(lease, now)]:
                del leases[queue]
                purged += 1
            if not leases:
                del self._leases[group]
        return purged

    def holder(self, group: str, queue: MessageQueue) -> str | None:
        """The client id whose lease on ``queue`` is live, or None."""
        lease = self._leases.get(group, {}).get(queue)
        if lease is None or self._expired(lease, self._clock_ms()):
            return None
        return lease.client_id

    def is_locked_by(self, group: str, queue: MessageQueue, client_id: str) -> bool:
        """True while ``client_id`` holds a live lease on ``queue`` in ``group``."""
        return self.holder(group, queue) == client_id

    def _expired(self, lease: _Lease, now: int) -> bool:
        return now - lease.last_lock_ms > self._lease_ms


# -- the processor --------------------------------------------------------------------------------


class LockBatchRequest(NamedTuple):
    """A decoded LockBatchRequestBody / UnlockBatchRequestBody."""

    client_id: str
    group: str
    queues: list[MessageQueue]


def decode_lock_batch_body(body: bytes | None) -> LockBatchRequest:
    """Parse a lock/unlock request body.

    Raises:
        RemoteProtocolError: the body is missing, not a JSON object, or a field is missing or
            of the wrong type; the message names the field.
    """
    if not body:
        raise RemoteProtocolError(
            "request has no body; expected {clientId, consumerGroup, mqSet} JSON"
        )
    document = jsonx.loads(body)
    if not isinstance(document, dict):
        raise RemoteProtocolError("body is not a JSON object; expected {clientId, consumerGroup, "
                                  "mqSet}")
    client_id = document.get("clientId")
    group = document.get("consumerGroup")
    if not isinstance(client_id, str) or not client_id:
        raise RemoteProtocolError(f"body field clientId is {client_id!r}; expected a client id")
    if not isinstance(group, str) or not group:
        raise RemoteProtocolError(f"body field consumerGroup is {group!r}; expected a group name")
    raw_queues = document.get("mqSet") or []
    if not isinstance(raw_queues, list):
        raise RemoteProtocolError("body field mqSet is not a list of MessageQueue objects")
    if len(raw_queues) > LOCK_BATCH_QUEUES_MAX:
        raise RemoteProtocolError(
            f"body field mqSet has {len(raw_queues)} queues, more than {LOCK_BATCH_QUEUES_MAX}"
        )
    return LockBatchRequest(client_id, group, [_decode_queue(item) for item in raw_queues])


def _decode_queue(item: Any) -> MessageQueue:
    if not isinstance(item, dict):
        raise RemoteProtocolError(f"mqSet entry {item!r} is not a MessageQueue object")
    topic = item.get("topic")
    broker_name = item.get("brokerName")
    queue_id = item.get("queueId")
    if isinstance(queue_id, str) and queue_id.lstrip("-").isdigit():
        queue_id = int(queue_id)  # some clients send every number as a string
    if not isinstance(topic, str) or not isinstance(broker_name, str):
        raise RemoteProtocolError(f"mqSet entry {item!r} lacks a topic or brokerName string")
    if not isinstance(queue_id, int) or isinstance(queue_id, bool):
        raise RemoteProtocolError(f"mqSet entry {item!r} has no integer queueId")
    return MessageQueue(topic, broker_name, queue_id)


def encode_lock_batch_response(queues: Iterable[MessageQueue]) -> bytes:
    """The LockBatchResponseBody JSON for the queues granted."""
    return jsonx.dumps({"lockOKMQSet": [queue.to_json() for queue in queues]})


class LockBatchProcessor:
    """Serves LOCK_BATCH_MQ and UNLOCK_BATCH_MQ against a ``RebalanceLockManager``.

    The leases a connection takes end when that connection closes.
    """

    def __init__(self, lock_manager: RebalanceLockManager) -> None:
        self._locks = lock_manager

    def register(self, server: RemotingServer) -> None:
        """Register LOCK_BATCH_MQ and UNLOCK_BATCH_MQ on ``server``."""
        server.register(RequestCode.LOCK_BATCH_MQ, self.lock_batch)
        server.register(RequestCode.UNLOCK_BATCH_MQ, self.unlock_batch)

    async def lock_batch(self, request: RemotingCommand, connection: Connection
                         ) -> RemotingCommand:
        """LOCK_BATCH_MQ: lock or renew the queues; the body lists the queues now held."""
        try:
            decoded = decode_lock_batch_body(request.body)
        except RemoteProtocolError as e:
            return RemotingCommand.response_to(
                request, ResponseCode.SYSTEM_ERROR, remark=f"LOCK_BATCH_MQ: {e}"
            )
        granted = self._locks.try_lock_batch(decoded.group, decoded.queues, decoded.client_id,
                                             owner=connection)
        if granted:
            self._watch(connection)
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, body=encode_lock_batch_response(granted)
        )

    async def unlock_batch(self, request: RemotingCommand, connection: object) -> RemotingCommand:
        """UNLOCK_BATCH_MQ: release the caller's locks on the queues (others' are kept)."""
        try:
            decoded = decode_lock_batch_body(request.body)
        except RemoteProtocolError as e:
            return RemotingCommand.response_to(
                request, ResponseCode.SYSTEM_ERROR, remark=f"UNLOCK_BATCH_MQ: {e}"
            )
        self._locks.unlock_batch(decoded.group, decoded.queues, decoded.client_id)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    def _watch(self, connection: Connection) -> None:
        if connection.attributes.get(_WATCHED_ATTRIBUTE):
            return
        connection.attributes[_WATCHED_ATTRIBUTE] = True
        connection.on_close.append(self._connection_closed)

    def _connection_closed(self, connection: Connection) -> None:
        released = self._locks.release_owner(connection)
        if released:
            log.info("released %d queue locks of %s (%s) when its connection closed",
                     len(released), ", ".join(sorted({client for _, _, client in released})),
                     connection.remote_address)

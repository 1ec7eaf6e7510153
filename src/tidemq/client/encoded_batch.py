"""Send batch bodies the caller already encoded: SEND_BATCH_MESSAGE without Message objects.

``Producer.send_batch`` takes ``Message`` objects and encodes each (a UNIQ_KEY, a properties
string, an entry). A caller that holds its rows in columns (the Spark sink, with Arrow
batches) can build the batch body (docs/protocol.md §6.5: per entry TOTALSIZE, MAGICCODE 0,
BODYCRC 0, FLAG, BODY LENGTH, body, PROPERTIES LENGTH, properties) far faster itself, and
send it here to a queue it chose. A message without a UNIQ_KEY gets one from the broker.

``EncodedBatchSender`` is a small client of its own (a ``ClientInstance``: routes, broker
addresses, connections). It sends to exactly the queue given, once: a failure raises, and
the caller decides (a Spark task fails and Spark retries it). Batch-level properties (header
field ``i``) are added by the broker to every message of the batch; the exactly-once sink
puts TRAN_MSG and its batch identity there (exactly_once.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tidemq.client.errors import BrokerRejected, NoRouteError
from tidemq.client.instance import REQUEST_TIMEOUT_MS, ClientInstance
from tidemq.client.message import MessageQueue, SendStatus
from tidemq.client.security import Credentials, TlsOption
from tidemq.errors import RemoteProtocolError
from tidemq.limits import group_name_problem
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.message import encode_properties

SEND_TIMEOUT_MS = 10_000  # a 4 MiB batch on a busy shared machine can take seconds
AUTO_CREATE_TOPIC_KEY = "TBW102"

_STORED_STATUS = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


@dataclass(frozen=True, slots=True)
class BatchSendResult:
    """What the broker stored for one batch request.

    Attributes:
        status: SEND_OK, or a stored-but-not-fully-durable status.
        queue: the queue written (for a transactional batch: the queue its commit goes to).
        queue_offset: the consume-queue offset of the first message; the others follow it.
            For a transactional batch: the first half message's half-queue offset.
        count: messages in the batch.
    """

    status: SendStatus
    queue: MessageQueue
    queue_offset: int
    count: int


class EncodedBatchSender:
    """Sends pre-encoded batch bodies to chosen queues (use as ``async with``).

    Args:
        group: producer group named in the requests.
        namesrv: name server addresses ``"host:port;host:port"``.
        send_timeout_ms: timeout of one batch request.
        request_timeout_ms: timeout of route lookups.
        credentials, tls: as for ``tidemq.client.Producer``.

    Raises:
        ValueError: a bad group name or name server address.
    """

    def __init__(self, group: str, namesrv: str | Iterable[str], *,
                 send_timeout_ms: int = SEND_TIMEOUT_MS,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS,
                 credentials: Credentials | None = None, tls: TlsOption = None) -> None:
        problem = group_name_problem(group)
        if problem is not None:
            raise ValueError(f"producer {problem}")
        self.group = group
        self.send_timeout_ms = send_timeout_ms
        self.instance = ClientInstance(namesrv, request_timeout_ms=request_timeout_ms,
                                       credentials=credentials, tls=tls)

    async def start(self) -> None:
        """Start route refreshes (idempotent)."""
        await self.instance.start()

    async def close(self) -> None:
        """Close every connection (idempotent)."""
        await self.instance.close()

    async def __aenter__(self) -> EncodedBatchSender:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def queues(self, topic: str) -> list[MessageQueue]:
        """The writable queues of ``topic``, sorted (broker name, queue id).

        Raises:
            NoRouteError: no broker serves the topic (it must exist: no auto-creation here).
        """
        route = await self.instance.route(topic)
        queues = route.publish_queues(topic) if route is not None else []
        if not queues:
            raise NoRouteError(
                f"no broker serves topic {topic!r} with writable queues; create it with "
                f"'tidemq admin updateTopic -t {topic} -c <cluster>'"
            )
        return sorted(queues)

    async def send(
        self,
        queue: MessageQueue,
        body: bytes,
        count: int,
        *,
        properties: Mapping[str, str] | None = None,
        sys_flag: int = 0,
        timeout_ms: int | None = None,
    ) -> BatchSendResult:
        """Send one encoded batch of ``count`` messages to ``queue``, once.

        Args:
            queue: the queue to store the batch in.
            body: the batch body (module docstring), at most the broker's maxMessageSize.
            count: messages encoded in ``body`` (reported back, not checked here).
            properties: batch-level properties the broker adds to every message.
            sys_flag: the batch's sysflag (TRANSACTION_PREPARED_TYPE for half messages).
            timeout_ms: default ``send_timeout_ms``.

        Raises:
            BrokerRejected: the broker refused the batch (nothing of it is stored).
            RemotingError: transport failure; the batch may or may not be stored.
            NoRouteError: no master is known for the queue's broker.
        """
        instance = self.instance
        broker_name = queue.broker_name
        address = instance.master_address(broker_name)
        if address is None:
            address = await instance.find_master(broker_name, queue.topic)
        fields = {
            "a": self.group, "b": queue.topic, "c": AUTO_CREATE_TOPIC_KEY, "d": "4",
            "e": str(queue.queue_id), "f": str(sys_flag), "g": str(time.time_ns() // 1_000_000),
            "h": "0", "m": "true", "n": broker_name,
        }
        if properties:
            fields["i"] = encode_properties(properties)
        response = await instance.invoke(address, RequestCode.SEND_BATCH_MESSAGE, fields, body,
                                         timeout_ms=timeout_ms or self.send_timeout_ms)
        status = _STORED_STATUS.get(response.code)
        if status is None:
            raise BrokerRejected(f"batch of {count} messages to {queue}", response.code,
                                 response.remark, f"{broker_name} ({address})", retriable=False)
        try:
            queue_offset = int((response.ext_fields or {})["queueOffset"])
        except (KeyError, ValueError):
            raise RemoteProtocolError(
                f"send response from {broker_name} ({address}) lacks a numeric queueOffset"
            ) from None
        return BatchSendResult(status, queue, queue_offset, count)


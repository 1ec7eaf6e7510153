"""Exactly-once batches, client side: half-message batches, then one commit per broker.

What the exactly-once Spark sink (``pyspark_tidemq``) does with a micro-batch, in tidemq's
terms (the broker's side, and why it is exactly once: broker/exactly_once/service.py):

1. every task execution (a *writer*, with a fresh ``writer_id``) sends its rows as batches
   of half messages, ``send_half_batch``: invisible to consumers until committed. Each batch
   carries the writer's ``EosIdentity`` as batch properties (TRAN_MSG, PGROUP, the
   EOS_* ids and CHECK_IMMUNITY_TIME_IN_SECONDS, after which an uncommitted half is rolled
   back by the broker). The writer notes, per broker, the half-queue ranges it got back
   (``WriterHalves``);
2. once every task finished, one process (Spark's driver) sends ``commit_batch`` to each
   broker with every writer's ranges there. The broker commits them once per (query id,
   batch id): a second commit of the same batch (a replay) commits nothing and rolls the
   replay's halves back;
3. a batch that failed is aborted (``abort_batch``, best effort: the timeout does it too).

The request codes (EOS_COMMIT_BATCH 30001, EOS_ABORT_BATCH 30002) and the EOS_* property
names are tidemq extensions; a RocketMQ broker answers REQUEST_CODE_NOT_SUPPORTED.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tidemq.client.encoded_batch import BatchSendResult, EncodedBatchSender
from tidemq.client.errors import BrokerRejected
from tidemq.client.message import MessageQueue
from tidemq.errors import RemoteProtocolError
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    TRANSACTION_PREPARED_TYPE,
)

# The broker reads the same names (broker/exactly_once/service.py; a unit test keeps
# the two lists equal).
PROPERTY_EOS_QUERY_ID = "EOS_QUERY_ID"
PROPERTY_EOS_BATCH_ID = "EOS_BATCH_ID"
PROPERTY_EOS_PARTITION = "EOS_PARTITION"
PROPERTY_EOS_WRITER_ID = "EOS_WRITER_ID"

# Five minutes: a micro-batch's tasks and its commit must finish within it, or the broker
# rolls the halves back and the commit fails (the query then restarts and replays).
EOS_TIMEOUT_MS = 300_000
# A commit is answered once every half is committed: a million rows on one broker take tens
# of seconds on a busy machine, so it waits longer than a send.
COMMIT_TIMEOUT_MS = 120_000


@dataclass(frozen=True, slots=True)
class EosIdentity:
    """Who wrote a batch of halves; the broker commits halves by these ids.

    Attributes:
        producer_group: the producer group (PGROUP) of the halves.
        query_id: the Spark query id (stable across restarts of one checkpoint).
        batch_id: the micro-batch id.
        partition: the Spark partition (diagnostics only).
        writer_id: this task execution's id (a new one for every execution).
        timeout_ms: an uncommitted half is rolled back this long after it was stored
            (rounded up to whole seconds).
    """

    producer_group: str
    query_id: str
    batch_id: int
    partition: int
    writer_id: str
    timeout_ms: int = EOS_TIMEOUT_MS

    def batch_properties(self) -> dict[str, str]:
        """The batch-level properties of a half batch of this writer."""
        return {
            PROPERTY_TRANSACTION_PREPARED: "true",
            PROPERTY_PRODUCER_GROUP: self.producer_group,
            PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: str(max(1, -(-self.timeout_ms // 1000))),
            PROPERTY_EOS_QUERY_ID: self.query_id,
            PROPERTY_EOS_BATCH_ID: str(self.batch_id),
            PROPERTY_EOS_PARTITION: str(self.partition),
            PROPERTY_EOS_WRITER_ID: self.writer_id,
        }


@dataclass(slots=True)
class WriterHalves:
    """One writer's halves on one broker: ``count`` halves in ``ranges`` (first half-queue
    offset, count), adjacent ranges merged. Picklable (a Spark commit message holds it)."""

    writer_id: str
    count: int = 0
    ranges: list[tuple[int, int]] = field(default_factory=list)

    def add(self, first_offset: int, count: int) -> None:
        """Note ``count`` halves stored from half-queue offset ``first_offset`` on."""
        ranges = self.ranges
        if ranges and ranges[-1][0] + ranges[-1][1] == first_offset:
            ranges[-1] = (ranges[-1][0], ranges[-1][1] + count)
        else:
            ranges.append((first_offset, count))
        self.count += count

    def to_json(self) -> dict[str, object]:
        """The request body's writer entry."""
        return {"writerId": self.writer_id, "count": self.count,
                "ranges": [list(r) for r in self.ranges]}


@dataclass(frozen=True, slots=True)
class EosCommitResult:
    """A broker's answer to ``commit_batch`` / ``abort_batch``.

    Attributes:
        broker_name: the broker.
        committed_count: messages the batch's decision commits on that broker (for a
            replay: what the first commit committed); 0 for an abort.
        already_committed: True when the batch had been committed before (a replay).
        rolled_back_count: halves this request rolled back.
    """

    broker_name: str
    committed_count: int
    already_committed: bool
    rolled_back_count: int


class ExactlyOnceClient(EncodedBatchSender):
    """Sends half batches and commits or aborts exactly-once batches (``async with``).

    Arguments as ``EncodedBatchSender``.
    """

    async def send_half_batch(self, identity: EosIdentity, queue: MessageQueue, body: bytes,
                              count: int, *, timeout_ms: int | None = None
                              ) -> BatchSendResult:
        """Send ``count`` pre-encoded messages to ``queue`` as half messages of ``identity``.

        Returns:
            The result; ``queue_offset`` is the first half's half-queue offset, the others
            follow it (add them to the writer's ``WriterHalves`` of the queue's broker).

        Raises:
            As ``EncodedBatchSender.send``.
        """
        return await self.send(queue, body, count, properties=identity.batch_properties(),
                               sys_flag=TRANSACTION_PREPARED_TYPE, timeout_ms=timeout_ms)

    async def commit_batch(self, broker_name: str, topic: str, producer_group: str,
                           query_id: str, batch_id: int, writers: Iterable[WriterHalves]
                           ) -> EosCommitResult:
        """Commit batch ``batch_id`` of ``query_id`` on one broker: exactly these writers'
        halves, once.

        Args:
            broker_name: the broker.
            topic: a topic the broker serves (its route gives the broker's address).
            producer_group, query_id, batch_id: as the halves' ``EosIdentity``.
            writers: every writer's halves on that broker.

        Raises:
            BrokerRejected: the broker refused; EOS_BATCH_INCOMPLETE means halves are
                missing or already rolled back (nothing was committed: restart the query).
            RemotingError: transport failure; the outcome is unknown (commit again: a
                repeated commit is answered ``already_committed``).
        """
        return await self._batch_request(RequestCode.EOS_COMMIT_BATCH, "commit", broker_name,
                                         topic, producer_group, query_id, batch_id, writers)

    async def abort_batch(self, broker_name: str, topic: str, producer_group: str,
                          query_id: str, batch_id: int, writers: Iterable[WriterHalves]
                          ) -> EosCommitResult:
        """Roll back these writers' halves on one broker now (those no commit holds).

        Raises:
            As ``commit_batch``.
        """
        return await self._batch_request(RequestCode.EOS_ABORT_BATCH, "abort", broker_name,
                                         topic, producer_group, query_id, batch_id, writers)

    async def _batch_request(self, code: int, verb: str, broker_name: str, topic: str,
                             producer_group: str, query_id: str, batch_id: int,
                             writers: Iterable[WriterHalves]) -> EosCommitResult:
        address = await self.instance.find_master(broker_name, topic)
        fields = {"producerGroup": producer_group, "queryId": query_id,
                  "batchId": str(batch_id)}
        body = jsonx.dumps({"writers": [writer.to_json() for writer in writers]})
        response = await self.instance.invoke(
            address, code, fields, body, timeout_ms=max(self.send_timeout_ms, COMMIT_TIMEOUT_MS))
        what = f"exactly-once {verb} of batch {batch_id} of query {query_id}"
        if response.code != ResponseCode.SUCCESS:
            raise BrokerRejected(what, response.code, response.remark,
                                 f"{broker_name} ({address})", retriable=False)
        ext = response.ext_fields or {}
        try:
            return EosCommitResult(
                broker_name=broker_name,
                committed_count=int(ext.get("committedCount", "0")),
                already_committed=ext.get("alreadyCommitted") == "true",
                rolled_back_count=int(ext.get("rolledBackCount", "0")),
            )
        except ValueError:
            raise RemoteProtocolError(f"{what}: malformed answer from {address}: {ext}") from None


def merge_writers(reports: Sequence[dict[str, WriterHalves]]) -> dict[str, list[WriterHalves]]:
    """Group writers' halves by broker: ``[{broker: halves}, ...]`` -> ``{broker: [...]}``."""
    by_broker: dict[str, list[WriterHalves]] = {}
    for report in reports:
        for broker_name, halves in report.items():
            by_broker.setdefault(broker_name, []).append(halves)
    return by_broker

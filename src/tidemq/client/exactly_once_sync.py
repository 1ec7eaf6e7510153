"""Synchronous twins of ``EncodedBatchSender`` and ``ExactlyOnceClient`` (like ``tidemq.sync``).

They run the asyncio clients on ``tidemq.sync``'s shared private loop, so a Spark task (a
plain thread) can encode the next batch while earlier ones are in flight:
``send_async`` / ``send_half_batch_async`` return ``concurrent.futures.Future`` objects.
Arguments, results and errors are those of the asyncio classes (encoded_batch.py,
exactly_once.py).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable, Mapping
from typing import Any

from tidemq.client import encoded_batch as _encoded_batch
from tidemq.client import exactly_once as _exactly_once
from tidemq.client.encoded_batch import BatchSendResult
from tidemq.client.exactly_once import EosCommitResult, EosIdentity, WriterHalves
from tidemq.client.message import MessageQueue
from tidemq.sync import _Twin

__all__ = ["EncodedBatchSender", "ExactlyOnceClient"]


class EncodedBatchSender(_Twin):
    """Synchronous twin of ``tidemq.client.encoded_batch.EncodedBatchSender``."""

    def __init__(self, group: str, namesrv: str, **options: Any) -> None:
        super().__init__(_encoded_batch.EncodedBatchSender, group, namesrv, **options)

    def queues(self, topic: str) -> list[MessageQueue]:
        """The writable queues of ``topic``, sorted."""
        return self._run(self._async.queues(topic))

    def send(self, queue: MessageQueue, body: bytes, count: int, **options: Any
             ) -> BatchSendResult:
        """Send one encoded batch and wait for the broker."""
        return self._run(self._async.send(queue, body, count, **options))

    def send_async(self, queue: MessageQueue, body: bytes, count: int,
                   properties: Mapping[str, str] | None = None
                   ) -> concurrent.futures.Future[BatchSendResult]:
        """Start sending one encoded batch; the future resolves to its result (or error)."""
        return self._runner.submit(self._async.send(queue, body, count, properties=properties))


class ExactlyOnceClient(EncodedBatchSender):
    """Synchronous twin of ``tidemq.client.exactly_once.ExactlyOnceClient``."""

    def __init__(self, group: str, namesrv: str, **options: Any) -> None:
        _Twin.__init__(self, _exactly_once.ExactlyOnceClient, group, namesrv, **options)

    def send_half_batch_async(self, identity: EosIdentity, queue: MessageQueue, body: bytes,
                              count: int) -> concurrent.futures.Future[BatchSendResult]:
        """Start sending one batch of half messages; the future resolves to its result."""
        return self._runner.submit(self._async.send_half_batch(identity, queue, body, count))

    def commit_batch(self, broker_name: str, topic: str, producer_group: str, query_id: str,
                     batch_id: int, writers: Iterable[WriterHalves]) -> EosCommitResult:
        """Commit one batch on one broker (``ExactlyOnceClient.commit_batch``)."""
        return self._run(self._async.commit_batch(broker_name, topic, producer_group,
                                                  query_id, batch_id, list(writers)))

    def abort_batch(self, broker_name: str, topic: str, producer_group: str, query_id: str,
                    batch_id: int, writers: Iterable[WriterHalves]) -> EosCommitResult:
        """Roll back writers' halves on one broker (``ExactlyOnceClient.abort_batch``)."""
        return self._run(self._async.abort_batch(broker_name, topic, producer_group,
                                                 query_id, batch_id, list(writers)))

"""``df.write`` / ``df.writeStream`` ``.format("tidemq")``: rows to messages.

Theory of operation
-------------------
Spark builds the writer on the driver (``sink_layout`` checks the columns there, before any
task runs), pickles it, and calls ``write(batches)`` once per task in executors with the
task's rows as Arrow record batches. ``write`` hands them to the writer's *delivery*, which
sends them (sink_sender.py: batch requests encoded straight from the Arrow columns, several
in flight, per-queue order kept for rows routed by ``shardingKey`` / ``queueId``) and returns
a report; the driver's ``commit(messages, batchId)`` passes the reports back to it.

- ``AtLeastOnceDelivery`` (default): rows are stored as they are sent; a task that fails
  after some requests were stored is retried by Spark and sends them again, so a row may be
  stored twice, as with Spark's Kafka sink. Unrouted rows go round robin over the topic's
  queues, a request at a time.
- ``ExactlyOnceDelivery`` (``exactlyOnce=true``; exactly_once.py): rows are sent as half
  messages and committed by the driver once per (query id, batch id).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from pyspark_tidemq.options import DeliveryGuarantee, SinkOptions
from pyspark_tidemq.sink_encoding import Chunk
from pyspark_tidemq.sink_rows import SinkLayout, sink_layout
from pyspark_tidemq.sink_sender import TaskSender
from tidemq.client.encoded_batch import BatchSendResult
from tidemq.client.exactly_once_sync import EncodedBatchSender
from tidemq.client.message import MessageQueue

log = logging.getLogger("pyspark_tidemq")


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one write task reports to the driver.

    Attributes:
        messages: messages stored.
        requests: send requests made.
    """

    messages: int = 0
    requests: int = 0


class Delivery:
    """How a sink delivers: ``send`` in tasks, ``commit`` / ``abort`` on the driver."""

    def send(self, options: SinkOptions, layout: SinkLayout,
             batches: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Send one task's rows; the task's report."""
        raise NotImplementedError

    def commit(self, messages: Sequence[WriterCommitMessage | None],
               batch_id: int | None) -> None:
        """Every task succeeded (``batch_id`` is None for a batch write)."""
        raise NotImplementedError

    def abort(self, messages: Sequence[WriterCommitMessage | None],
              batch_id: int | None) -> None:
        """A task failed."""
        raise NotImplementedError


class AtLeastOnceDelivery(Delivery):
    """Sends at once; a retried task sends again, so messages may be duplicated."""

    def send(self, options: SinkOptions, layout: SinkLayout,
             batches: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        """Send the task's rows; returns once all are stored."""
        report = SinkCommitMessage()

        def stored(result: BatchSendResult) -> None:
            report.messages += result.count

        with EncodedBatchSender(options.producer_group, options.namesrv_addr,
                                send_timeout_ms=options.send_timeout_ms,
                                credentials=options.credentials) as client:

            def submit(queue: MessageQueue, chunk: Chunk):
                return client.send_async(queue, chunk.body, chunk.count)

            sender = TaskSender(options, layout, client.queues, submit,
                                lambda queues, row: None, stored)
            sender.send_all(batches)
        report.requests = sender.requests
        return report

    def commit(self, messages: Sequence[WriterCommitMessage | None],
               batch_id: int | None) -> None:
        """Log what the tasks stored."""
        sent = [m for m in messages if isinstance(m, SinkCommitMessage)]
        log.info("tidemq sink%s: %d messages in %d requests from %d tasks",
                 f" batch {batch_id}" if batch_id is not None else "",
                 sum(m.messages for m in sent), sum(m.requests for m in sent), len(sent))

    def abort(self, messages: Sequence[WriterCommitMessage | None],
              batch_id: int | None) -> None:
        """Stored messages stay stored: at least once has nothing to take back."""
        log.warning("tidemq sink%s aborted; messages already stored stay stored (at-least-once)",
                    f" batch {batch_id}" if batch_id is not None else "")


def make_delivery(options: SinkOptions, *, batch_write: bool) -> Delivery:
    """The delivery of ``options.delivery_guarantee`` (built on the driver, then pickled)."""
    if options.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE:
        from pyspark_tidemq.exactly_once import ExactlyOnceDelivery

        if batch_write:
            return ExactlyOnceDelivery.for_batch_write(options)
        return ExactlyOnceDelivery(options)
    return AtLeastOnceDelivery()


class TidemqBatchWriter(DataSourceArrowWriter):
    """``df.write.format("tidemq")``: each task sends its rows (at least once, or with
    ``exactlyOnce=true`` all rows become visible together when the job commits).

    Args:
        options: validated sink options.
        schema: the DataFrame's schema (checked here, on the driver).

    Raises:
        InvalidSinkInput: the columns cannot become messages.
    """

    def __init__(self, options: SinkOptions, schema: StructType):
        self.options = options
        self.layout = sink_layout(schema, options)
        self.delivery = make_delivery(options, batch_write=True)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Send this task's rows; returns when all are stored."""
        return self.delivery.send(self.options, self.layout, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task succeeded."""
        self.delivery.commit(messages, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """A task failed: at least once keeps what was stored; exactly once rolls it back."""
        self.delivery.abort(messages, None)


class TidemqStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("tidemq")``: each micro-batch's tasks send their rows."""

    def __init__(self, options: SinkOptions, schema: StructType):
        self.options = options
        self.layout = sink_layout(schema, options)
        self.delivery = make_delivery(options, batch_write=False)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Send this task's rows; returns when all are stored."""
        return self.delivery.send(self.options, self.layout, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every task of micro-batch ``batchId`` succeeded."""
        self.delivery.commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """A task of micro-batch ``batchId`` failed."""
        self.delivery.abort(messages, batchId)

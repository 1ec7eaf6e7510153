"""``df.write`` / ``df.writeStream`` ``.format("tidemq")``: rows to messages, at least once.

Theory of operation
-------------------
Spark builds the writer on the driver (``sink_layout`` checks the columns there, before any
task runs), pickles it, and calls ``write(batches)`` once per task in executors with the
task's rows as Arrow record batches. ``write`` opens a ``tidemq.sync.Producer`` and sends:

- rows become ``Message`` objects (``sink_rows.batch_to_messages``) and are grouped by topic
  and route: rows with a ``queueId`` or ``shardingKey`` by their queue, the rest together;
- each group is cut into ``sendBatchSize`` messages per SEND_BATCH_MESSAGE request; up to
  ``maxInFlightRequests`` requests are in flight, so the broker stores one batch while this
  task encodes the next;
- requests for one queue go out one after the other, in row order, so rows of one sharding
  key keep their order (within a task; Spark does not order rows across tasks);
- ``write`` returns only when every request was answered; any failure fails the task.

Delivery is *at least once*, like Spark's Kafka sink: a task that fails after some requests
were stored is retried by Spark and sends them again. The seam for exactly once is
``Delivery``: ``write`` hands its sends to a delivery and returns what the delivery reports;
the driver's ``commit(messages, batchId)`` passes the reports back to it. An exactly-once
delivery would send transactional half messages in ``write``, report their transaction ids,
and commit them in ``commit`` idempotently per (query id, batch id), aborting stale ones by
timeout (``abort`` is not called when a driver dies).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from pyspark_tidemq.errors import InvalidSinkInput
from pyspark_tidemq.options import DeliveryGuarantee, SinkOptions
from pyspark_tidemq.sink_rows import Route, SinkLayout, batch_to_messages, sink_layout
from tidemq import sync
from tidemq.client.message import Message, MessageQueue
from tidemq.client.queue_selection import select_by_sharding_key

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
             batches: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        raise NotImplementedError

    def commit(self, messages: Sequence[WriterCommitMessage | None],
               batch_id: int | None) -> None:
        raise NotImplementedError

    def abort(self, messages: Sequence[WriterCommitMessage | None],
              batch_id: int | None) -> None:
        raise NotImplementedError


class AtLeastOnceDelivery(Delivery):
    """Sends at once; a retried task sends again, so messages may be duplicated."""

    def send(self, options: SinkOptions, layout: SinkLayout,
             batches: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        with _Sender(options) as sender:
            for batch in batches:
                if batch.num_rows:
                    messages, routes = batch_to_messages(batch, layout)
                    sender.submit(messages, routes)
            return sender.finish()

    def commit(self, messages: Sequence[WriterCommitMessage | None],
               batch_id: int | None) -> None:
        sent = [m for m in messages if isinstance(m, SinkCommitMessage)]
        log.info("tidemq sink%s: %d messages in %d requests from %d tasks",
                 f" batch {batch_id}" if batch_id is not None else "",
                 sum(m.messages for m in sent), sum(m.requests for m in sent), len(sent))

    def abort(self, messages: Sequence[WriterCommitMessage | None],
              batch_id: int | None) -> None:
        # Stored messages stay stored: at least once has nothing to take back.
        log.warning("tidemq sink%s aborted; messages already stored stay stored (at-least-once)",
                    f" batch {batch_id}" if batch_id is not None else "")


DELIVERIES: dict[DeliveryGuarantee, Callable[[], Delivery]] = {
    DeliveryGuarantee.AT_LEAST_ONCE: AtLeastOnceDelivery,
}


_Sent = concurrent.futures.Future  # of (messages, requests) sent by one chunk


class _Sender:
    """Sends message groups with bounded concurrency and per-queue order, in one task."""

    def __init__(self, options: SinkOptions):
        self.options = options
        self.producer = sync.Producer(options.producer_group, options.namesrv_addr,
                                      send_timeout_ms=options.send_timeout_ms)
        self.producer.start()
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=options.max_in_flight_requests, thread_name_prefix="tidemq-sink")
        self.in_flight: collections.deque[_Sent] = collections.deque()
        self.last_for_queue: dict[MessageQueue, _Sent] = {}
        self.queues: dict[str, list[MessageQueue]] = {}
        self.messages = 0
        self.requests = 0

    def __enter__(self) -> _Sender:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for future in self.in_flight:
            future.cancel()
        self.pool.shutdown(wait=True)
        self.producer.close()

    def submit(self, messages: list[Message], routes: Sequence[Route]) -> None:
        """Queue ``messages`` for sending (grouped by topic and queue, in row order)."""
        groups: dict[tuple[str, MessageQueue | None], list[Message]] = {}
        for message, route in zip(messages, routes, strict=True):
            queue = None if route is None else self._queue_for(message.topic, route)
            groups.setdefault((message.topic, queue), []).append(message)
        size = self.options.send_batch_size
        for (_, queue), group in groups.items():
            for first in range(0, len(group), size):
                self._send(group[first:first + size], queue)

    def _send(self, chunk: list[Message], queue: MessageQueue | None) -> None:
        previous = self.last_for_queue.get(queue) if queue is not None else None
        future = self.pool.submit(self._send_chunk, chunk, queue, previous)
        if queue is not None:
            self.last_for_queue[queue] = future
        self.in_flight.append(future)
        # Bound what waits in memory: at most twice the requests that can be in flight.
        while len(self.in_flight) > 2 * self.options.max_in_flight_requests:
            self._settle(self.in_flight.popleft())

    def _send_chunk(self, chunk: list[Message], queue: MessageQueue | None,
                    previous: _Sent | None) -> tuple[int, int]:
        if previous is not None:
            previous.result()  # same queue: keep row order (raises if it failed)
        results = self.producer.send_batch(chunk, queue=queue) if queue is not None \
            else self.producer.send_batch(chunk)
        return len(chunk), len(results)

    def _settle(self, future: _Sent) -> None:
        messages, requests = future.result()
        self.messages += messages
        self.requests += requests

    def finish(self) -> SinkCommitMessage:
        """Wait for every request; the task's report."""
        while self.in_flight:
            self._settle(self.in_flight.popleft())
        return SinkCommitMessage(messages=self.messages, requests=self.requests)

    def _queue_for(self, topic: str, route: str | tuple[str | None, int]) -> MessageQueue:
        queues = self.queues.get(topic)
        if queues is None:
            queues = self.queues[topic] = sorted(self.producer.queues(topic))
        if isinstance(route, str):
            return select_by_sharding_key(queues, route)
        broker_name, queue_id = route
        for queue in queues:
            if queue.queue_id == queue_id and broker_name in (None, queue.broker_name):
                return queue
        raise InvalidSinkInput(
            f"topic {topic!r} has no writable queue {queue_id}"
            + (f" on broker {broker_name!r}" if broker_name else "")
            + "; its queues: " + ", ".join(f"{q.broker_name}:{q.queue_id}" for q in queues)
        )


class TidemqBatchWriter(DataSourceArrowWriter):
    """``df.write.format("tidemq")``: each task sends its rows (at least once).

    Args:
        options: validated sink options.
        schema: the DataFrame's schema (checked here, on the driver).

    Raises:
        InvalidSinkInput: the columns cannot become messages.
    """

    def __init__(self, options: SinkOptions, schema: StructType):
        self.options = options
        self.layout = sink_layout(schema, options)
        self.delivery = DELIVERIES[options.delivery_guarantee]()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        """Send this task's rows; returns when all are stored."""
        return self.delivery.send(self.options, self.layout, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task succeeded."""
        self.delivery.commit(messages, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """A task failed; what was stored stays stored."""
        self.delivery.abort(messages, None)


class TidemqStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("tidemq")``: each micro-batch's tasks send their rows."""

    def __init__(self, options: SinkOptions, schema: StructType):
        self.options = options
        self.layout = sink_layout(schema, options)
        self.delivery = DELIVERIES[options.delivery_guarantee]()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        """Send this task's rows; returns when all are stored."""
        return self.delivery.send(self.options, self.layout, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every task of micro-batch ``batchId`` succeeded."""
        self.delivery.commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """A task of micro-batch ``batchId`` failed."""
        self.delivery.abort(messages, batchId)

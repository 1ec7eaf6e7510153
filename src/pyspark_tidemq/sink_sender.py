"""One write task's sends: encoded batch requests, several in flight, per-queue order kept.

A Spark write task calls ``TaskSender.send_batch`` for each Arrow batch of its rows. The rows
become batch requests (sink_encoding.py), which go to the brokers through a synchronous
tidemq client whose asyncio loop runs in a background thread: while the brokers store one
request, the task encodes the next. At most ``maxInFlightRequests`` requests wait for an
answer; a request for a queue that must keep its row order (rows routed by ``shardingKey``
or ``queueId``) is sent only after the previous one for that queue was answered. ``finish``
returns once every request was answered; any failure raises, which fails the task.

The delivery decides what a request is (``submit``: a plain batch, or a batch of half
messages) and where unrouted rows go (``queue_for_block``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

from pyspark_tidemq.errors import InvalidSinkInput
from pyspark_tidemq.options import SinkOptions
from pyspark_tidemq.sink_encoding import Chunk, chunks
from pyspark_tidemq.sink_rows import Route, SinkLayout, batch_columns
from tidemq.client.encoded_batch import BatchSendResult
from tidemq.client.message import MessageQueue
from tidemq.client.queue_selection import select_by_sharding_key

Submit = Callable[[MessageQueue, Chunk], "concurrent.futures.Future[BatchSendResult]"]
QueueForBlock = Callable[[list[MessageQueue], int], MessageQueue | None]


class TaskSender:
    """Sends one task's rows (module docstring).

    Args:
        options: the sink options (batch size, requests in flight).
        layout: the input columns.
        queues_of: ``topic -> sorted writable queues`` (asks the name server once a topic).
        submit: starts one request and returns its future.
        queue_for_block: ``(queues of the topic, task row index) -> queue`` for rows without
            a route; None lets the sender go round robin.
        on_result: called with each stored request's result, in the task's thread.
    """

    def __init__(self, options: SinkOptions, layout: SinkLayout,
                 queues_of: Callable[[str], list[MessageQueue]], submit: Submit,
                 queue_for_block: QueueForBlock,
                 on_result: Callable[[BatchSendResult], None]) -> None:
        self.options = options
        self.layout = layout
        self._queues_of = queues_of
        self._queue_lists: dict[str, list[MessageQueue]] = {}
        self._submit = submit
        self._queue_for_block = queue_for_block
        self._on_result = on_result
        self._in_flight: collections.deque[concurrent.futures.Future[BatchSendResult]] = \
            collections.deque()
        self._last_for_queue: dict[MessageQueue, concurrent.futures.Future[BatchSendResult]] = {}
        self._round_robin: dict[str, Iterator[MessageQueue]] = {}
        self.rows = 0
        self.requests = 0

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues, sorted (looked up once per task)."""
        found = self._queue_lists.get(topic)
        if found is None:
            found = self._queue_lists[topic] = self._queues_of(topic)
        return found

    def send_batch(self, batch: pa.RecordBatch) -> None:
        """Encode and start sending one Arrow batch of the task's rows."""
        if not batch.num_rows:
            return
        columns = batch_columns(batch, self.layout)
        first_row = self.rows
        self.rows += batch.num_rows

        def queue_for_block(topic: str, row_index: int) -> MessageQueue | None:
            return self._queue_for_block(self.queues(topic), row_index)

        for chunk in chunks(columns, first_row, self.layout.topic_option,
                            self.options.send_batch_size, self._queue_for_route,
                            queue_for_block):
            self._send(chunk)

    def _send(self, chunk: Chunk) -> None:
        queue = chunk.queue
        if queue is None:
            cycle = self._round_robin.get(chunk.topic)
            if cycle is None:
                cycle = self._round_robin[chunk.topic] = itertools.cycle(self.queues(chunk.topic))
            queue = next(cycle)
        if chunk.ordered:
            previous = self._last_for_queue.get(queue)
            if previous is not None:
                previous.result()  # keep the queue's row order (raises if it failed)
        future = self._submit(queue, chunk)
        if chunk.ordered:
            self._last_for_queue[queue] = future
        self._in_flight.append(future)
        self.requests += 1
        while len(self._in_flight) > self.options.max_in_flight_requests:
            self._settle(self._in_flight.popleft())

    def _settle(self, future: concurrent.futures.Future[BatchSendResult]) -> None:
        self._on_result(future.result())

    def finish(self) -> None:
        """Wait until every request is answered (raises the first failure)."""
        while self._in_flight:
            self._settle(self._in_flight.popleft())

    def send_all(self, batches: Iterable[pa.RecordBatch]) -> None:
        """Send every row of ``batches`` and wait for every answer; on any failure stop
        waiting for the requests still in flight and raise it."""
        try:
            for batch in batches:
                self.send_batch(batch)
            self.finish()
        except BaseException:
            self.cancel()
            raise

    def cancel(self) -> None:
        """Stop waiting for requests in flight (the task failed)."""
        for future in self._in_flight:
            future.cancel()
        self._in_flight.clear()

    def _queue_for_route(self, topic: str, route: Route) -> MessageQueue:
        queues = self.queues(topic)
        if isinstance(route, str):
            return select_by_sharding_key(queues, route)
        assert route is not None
        broker_name, queue_id = route
        for queue in queues:
            if queue.queue_id == queue_id and broker_name in (None, queue.broker_name):
                return queue
        raise InvalidSinkInput(
            f"topic {topic!r} has no writable queue {queue_id}"
            + (f" on broker {broker_name!r}" if broker_name else "")
            + "; its queues: " + ", ".join(f"{q.broker_name}:{q.queue_id}" for q in queues)
        )

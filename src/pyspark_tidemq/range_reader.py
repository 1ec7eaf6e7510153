"""Executor side: pull one queue range from its broker and yield Arrow record batches.

Theory of operation
-------------------
``read_queue_range`` runs inside a Spark task, in a Python worker that may be reused for
other tasks, so it owns everything it opens: a private event loop and a ``ClientInstance``
(connections to the name server and the broker), both closed when the generator finishes or
is closed early.

It pulls ``[start, end)`` with PULL_MESSAGE requests of up to ``pullBatchSize`` messages,
never long polling (the end offset is known to exist). The next pull is sent before the
current answer is decoded, so the broker prepares it while this process builds the batch:
the two overlap on the machine's cores. Answers are decoded column by column
(``record_batch.pull_body_to_batch``); the broker filters by tag code and the reader again by
tag string, so a hash collision never lets another tag through.

A pull can find that messages of the range are gone:

- PULL_OFFSET_MOVED forward: retention deleted ``[offset, next)``;
- PULL_OFFSET_MOVED backward or PULL_NOT_FOUND before the end: the queue is shorter than
  planned (the topic was deleted and re-created).

With ``failOnDataLoss=true`` that raises ``DataLossError``; with false it logs a WARNING
naming the queue and offsets skipped and goes on. A range that starts at a queue's earliest
offset (``from_earliest``) may find the head trimmed: that is not loss.

Transport errors and retriable broker errors are retried ``PULL_ATTEMPTS_MAX`` times with a
fresh route (the broker may have restarted); then the task fails and Spark retries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_tidemq.errors import DataLossError
from pyspark_tidemq.offsets import QueueRange
from pyspark_tidemq.options import SourceOptions
from pyspark_tidemq.record_batch import pull_body_to_batch
from tidemq.client.broker_api import PULL_LITE, PULL_SUBSCRIPTION
from tidemq.client.errors import BrokerRejected, NoRouteError
from tidemq.client.instance import ClientInstance
from tidemq.client.subscription import EXPRESSION_TYPE_TAG, parse_tag_expression
from tidemq.errors import ClientError, HeaderFieldError, RemoteProtocolError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.headers import PullMessageResponseHeader
from tidemq.remoting.errors import RemotingError
from tidemq.remoting.loop import new_event_loop

log = logging.getLogger("pyspark_tidemq")

# Attempts per pull before the task fails (Spark then retries the task): enough to ride out a
# broker restart of a few seconds, few enough that a dead broker fails the task quickly.
PULL_ATTEMPTS_MAX = 4
RETRY_DELAY_S = 0.5  # doubled after each failed attempt: 0.5, 1, 2 s

_PULL_CODES = frozenset({
    ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY,
    ResponseCode.PULL_OFFSET_MOVED,
})


@dataclass(slots=True)
class _Pulled:
    code: int
    header: PullMessageResponseHeader
    body: bytes | None


class _QueuePuller:
    """PULL_MESSAGE requests for one queue, returning the raw stored records."""

    def __init__(self, options: SourceOptions, queue_range: QueueRange):
        self.options = options
        self.range = queue_range
        self.instance = ClientInstance(options.namesrv_addr,
                                       request_timeout_ms=options.request_timeout_ms,
                                       credentials=options.credentials)
        subscription = parse_tag_expression(queue_range.topic, options.tag_expression)
        self.fields_template = {
            "consumerGroup": options.reader_group,
            "topic": queue_range.topic,
            "queueId": str(queue_range.queue_id),
            "sysFlag": str(PULL_SUBSCRIPTION | PULL_LITE),
            "commitOffset": "0",
            "suspendTimeoutMillis": "0",
            "subscription": subscription.expression,
            "subVersion": str(subscription.version_ms),
            "expressionType": EXPRESSION_TYPE_TAG,
        }
        self.address: str | None = None

    async def _broker_address(self, refresh: bool) -> str:
        if self.address is None or refresh:
            await self.instance.fetch_route(self.range.topic)
            self.address = self.instance.read_address(self.range.broker_name)
            if self.address is None:
                raise NoRouteError(
                    f"no address known for broker {self.range.broker_name!r} of topic "
                    f"{self.range.topic!r}; is the broker registered with the name server?"
                )
        return self.address

    async def pull(self, offset: int, max_nums: int) -> _Pulled:
        fields = dict(self.fields_template, queueOffset=str(offset), maxMsgNums=str(max_nums))
        delay_s = RETRY_DELAY_S
        for attempt in range(1, PULL_ATTEMPTS_MAX + 1):
            try:
                address = await self._broker_address(refresh=attempt > 1)
                response = await self.instance.invoke(address, RequestCode.PULL_MESSAGE, fields)
                if response.code not in _PULL_CODES:
                    raise BrokerRejected(f"pull of {self.range.queue} at offset {offset}",
                                         response.code, response.remark, address)
                try:
                    header = PullMessageResponseHeader.from_ext_fields(response.ext_fields)
                except HeaderFieldError as e:
                    raise RemoteProtocolError(f"pull response from {address}: {e}") from None
                return _Pulled(response.code, header, response.body)
            except (RemotingError, ClientError) as e:
                if not getattr(e, "retriable", False) or attempt == PULL_ATTEMPTS_MAX:
                    raise
                log.warning("pull of %s at offset %d failed (attempt %d of %d), retrying in "
                            "%.1f s: %s", self.range.queue, offset, attempt, PULL_ATTEMPTS_MAX,
                            delay_s, e)
                await asyncio.sleep(delay_s)
                delay_s *= 2
        raise AssertionError("unreachable")  # the loop returns or raises

    async def close(self) -> None:
        await self.instance.close()


def read_queue_range(options: SourceOptions, queue_range: QueueRange) -> Iterator[pa.RecordBatch]:
    """Yield the messages of ``queue_range`` as record batches of the source's schema.

    Raises:
        DataLossError: messages of the range are gone and ``failOnDataLoss`` is true.
        BrokerRejected / RemotingError / NoRouteError: pulls kept failing.
        RemoteProtocolError: the broker sent malformed records.
    """
    if queue_range.size <= 0:
        return
    loop = new_event_loop()
    puller = _QueuePuller(options, queue_range)
    tags = options.tags
    tag_values = pa.array(sorted(tags), pa.string()) if tags else None
    end = queue_range.end_offset
    offset = queue_range.start_offset
    pending: asyncio.Task[_Pulled] | None = None
    try:
        pending = loop.create_task(puller.pull(offset, min(options.pull_batch_size, end - offset)))
        while pending is not None:
            pulled = loop.run_until_complete(pending)
            pending = None
            next_offset = _next_offset(options, queue_range, offset, pulled)
            if next_offset < end:
                pending = loop.create_task(
                    puller.pull(next_offset, min(options.pull_batch_size, end - next_offset)))
                loop.run_until_complete(asyncio.sleep(0))  # let the request go out now
            if pulled.code == ResponseCode.SUCCESS and pulled.body:
                batch = pull_body_to_batch(pulled.body, queue_range.broker_name,
                                           queue_range.topic,
                                           include_properties=options.include_properties,
                                           stop_offset=end)
                if tag_values is not None:
                    batch = batch.filter(pc.is_in(batch.column("tags"), value_set=tag_values))
                if batch.num_rows:
                    yield batch
            offset = next_offset
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                loop.run_until_complete(pending)
        try:
            loop.run_until_complete(puller.close())
        finally:
            loop.close()


def _next_offset(options: SourceOptions, queue_range: QueueRange, offset: int,
                 pulled: _Pulled) -> int:
    """Where to pull next after ``pulled``; ``end_offset`` (or past it) when done."""
    end = queue_range.end_offset
    header = pulled.header
    next_offset = header.next_begin_offset
    if pulled.code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY):
        if next_offset <= offset:
            raise RemoteProtocolError(
                f"pull of {queue_range.queue} at offset {offset} answered nextBeginOffset "
                f"{next_offset}, which does not move forward"
            )
        return next_offset
    if pulled.code == ResponseCode.PULL_NOT_FOUND:
        # Nothing at ``offset``: the queue ends before the range does.
        _lost(options, queue_range, offset, end,
              f"the queue now ends at offset {header.max_offset}")
        return end
    # PULL_OFFSET_MOVED: ``offset`` is outside [min, max) of the queue.
    if next_offset > offset:
        trimmed_head = queue_range.from_earliest and offset == queue_range.start_offset
        if not trimmed_head:
            _lost(options, queue_range, offset, min(next_offset, end),
                  f"the queue now starts at offset {header.min_offset} (retention deleted "
                  "older messages)")
        return next_offset
    _lost(options, queue_range, offset, end,
          f"the queue now ends at offset {header.max_offset} (was the topic re-created?)")
    return end


def _lost(options: SourceOptions, queue_range: QueueRange, first: int, stop: int,
          reason: str) -> None:
    if stop <= first:
        return
    what = (f"messages [{first}, {stop}) of queue {queue_range.queue} are no longer stored: "
            f"{reason}")
    if options.fail_on_data_loss:
        raise DataLossError(
            f"{what}; set option failOnDataLoss=false to skip them with a warning instead"
        )
    log.warning("%s; skipped (failOnDataLoss=false)", what)

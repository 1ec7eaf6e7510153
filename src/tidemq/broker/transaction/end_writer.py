"""Writing the end of transactions: committed messages and op records, op records batched.

END_TRANSACTION arrives one transaction per request, thousands a second, and each end needs
two records: the committed message and an op record. ``EndWriter`` gathers the ends decided
within one turn of the event loop and writes them in a callback scheduled at once
(``loop.call_soon``):

1. the committed messages, in one ``put_message_group`` (one encode and append for every
   topic and queue, each queue in arrival order; bounded in count and bytes). The store
   answers each message on its own, so one bad message is refused alone;
2. then the op records: one per outcome for all those ends, its body the half offsets joined
   by ``,`` (the form RocketMQ 5.x writes; records.py). One put instead of one per end.

A half is marked ended in ``progress`` the moment its end is queued, so a check or a
discard in the same turn sees it ended and writes nothing, and a second END_TRANSACTION for
it waits for the first one's answer (``queued_answer``) before it is answered.
A commit the store refuses (not writable, disk error) reopens its half (pending again,
checked after transactionCheckInterval) and answers the END_TRANSACTION with the store's
failure. An op record the store refuses is logged; the end holds in memory, and after a
restart the half is checked again, where the index guard (service.py) finds a commit.

*Durability.* Under SYNC_FLUSH, and on a SYNC_MASTER, the commits of one flush are answered
once the writer's last put (their op record, after their committed copies) is on disk and
a slave acknowledged its end: one wait per flush, however many commits it holds (the flush
and the slave waits are group-committed themselves; ``ReplicationRole.stored_status``), run
in a task so the loop never blocks. When the disk or the slave does not confirm in time the
commit still stands on the master (the half is ended) but is answered FLUSH_DISK_TIMEOUT,
FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE with a remark saying so, not SUCCESS
(docs/operations.md, "Transactions and exactly-once commits under SYNC_MASTER"). Rollbacks
store no message and are answered at once. ``stored_status`` gives the exactly-once commit
the same wait.

The caller awaits the returned future for the answer (a oneway END_TRANSACTION's is
dropped). ``flush`` writes what is queued at once. The service calls it before taking a
checkpoint and at shutdown, so a checkpoint never counts an end whose records are not in the
commit log yet.

Ownership: the broker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple, Protocol

from tidemq.broker.transaction.records import (
    HALF_QUEUE_ID,
    OP_TOPIC,
    Outcome,
    op_message,
    transaction_id_of,
)
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.message import PROPERTY_PRODUCER_GROUP, MessageExt
from tidemq.store.interface import MessageBatch, PutResult, PutStatus, StoreMessage

if TYPE_CHECKING:
    from tidemq.broker.runtime_info import BrokerStats
    from tidemq.broker.transaction.progress import TransactionProgress
    from tidemq.protocol.message import MessageExt
    from tidemq.store.interface import MessageStore

log = logging.getLogger("tidemq.broker")

# Ends gathered before they are written without waiting for the loop's turn to end.
QUEUED_ENDS_MAX = 1024
# One put of committed messages holds at most this many, and this many body bytes
# (a batch must fit one commit-log segment: 1 GiB by default, a few MiB in tests; one
# message may still be up to maxMessageSize on its own).
BATCH_MESSAGES_MAX = 256
BATCH_BYTES_MAX = 1024 * 1024

STORED = frozenset({PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT})
# A stored commit the disk or a slave did not confirm: answered with the send's code.
NOT_CONFIRMED_CODES = {
    PutStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
}
_NOT_CONFIRMED_WHY = {
    PutStatus.FLUSH_DISK_TIMEOUT: "was not flushed to disk within syncFlushTimeout",
    PutStatus.FLUSH_SLAVE_TIMEOUT: "no slave acknowledged it within syncFlushTimeout",
    PutStatus.SLAVE_NOT_AVAILABLE: ("no slave is in sync (none connected, or each further "
                                    "behind than haMaxGapNotInSync)"),
}
_FAILED_PUT_CODES = {
    PutStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
}


class EndAnswer(NamedTuple):
    """END_TRANSACTION's response: a ResponseCode and a remark (None when all went well)."""

    code: int
    remark: str | None = None


SUCCESS = EndAnswer(ResponseCode.SUCCESS)


@dataclass(slots=True)
class _QueuedEnd:
    half: MessageExt
    outcome: Outcome
    committed: StoreMessage | None  # what a commit stores; None for a rollback
    answer: asyncio.Future[EndAnswer]


class EndWriterHost(Protocol):
    """What the end writer uses of the transaction service."""

    store: MessageStore
    progress: TransactionProgress

    @property
    def broker_stats(self) -> BrokerStats:
        """The broker's put counters."""
        ...

    def op_queue_end(self) -> int:
        """The op queue's next offset."""
        ...

    def ensure_topic(self, topic: str) -> None:
        """Give a transaction system topic a config on first use."""
        ...

    def reopen(self, half: MessageExt) -> None:
        """Undo the end of a half whose commit could not be stored."""
        ...

    @property
    def waits_for_slaves(self) -> bool:
        """True on a SYNC_MASTER: a commit is confirmed once a slave holds it."""
        ...

    async def stored_status(self, result: PutResult) -> PutStatus:
        """PUT_OK once ``result`` is on disk (SYNC_FLUSH) and on a slave (SYNC_MASTER);
        else FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE."""
        ...


class EndWriter:
    """Queues ends of halves and writes them in batches (module docstring).

    Args:
        service: the transaction service, as an ``EndWriterHost`` (store, progress, topics,
            stats, reopen).
    """

    def __init__(self, service: EndWriterHost) -> None:
        self._service = service
        self._queued: list[_QueuedEnd] = []
        self._answers: dict[int, asyncio.Future[EndAnswer]] = {}  # by half offset, queued ones
        self._flush_scheduled = False
        # The last put this writer stored (the highest commit-log end of its writes).
        self._last_put: PutResult | None = None
        self._waits: set[asyncio.Task[None]] = set()  # commits waiting for disk / slave

    def queued_answer(self, half_offset: int) -> asyncio.Future[EndAnswer] | None:
        """The answer future of the half's end when it is queued and not written yet."""
        return self._answers.get(half_offset)

    def end(self, half: MessageExt, outcome: Outcome,
            committed: StoreMessage | None = None) -> asyncio.Future[EndAnswer]:
        """Queue the end of ``half``; ``committed``: the message a commit stores.

        Returns:
            A future of the END_TRANSACTION answer, set once the records are written.
        """
        loop = asyncio.get_running_loop()
        service = self._service
        service.progress.end(half.queue_offset, outcome, service.op_queue_end())
        answer: asyncio.Future[EndAnswer] = loop.create_future()
        self._queued.append(_QueuedEnd(half, outcome, committed, answer))
        self._answers[half.queue_offset] = answer
        if len(self._queued) >= QUEUED_ENDS_MAX:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self.flush)
        return answer

    def end_now(self, half: MessageExt, outcome: Outcome) -> None:
        """Write the op record ending ``half`` at once (checks and discards, which are rare)."""
        self.end_offset_now(half.queue_offset, outcome,
                            half.properties.get(PROPERTY_PRODUCER_GROUP),
                            transaction_id_of(half.properties))

    def end_offset_now(self, half_offset: int, outcome: Outcome, producer_group: str | None,
                       transaction_id: str | None) -> None:
        """Write the op record ending the half at ``half_offset`` at once (its record may be
        gone)."""
        op_offset = self._write_ops(outcome, [half_offset], producer_group, transaction_id)
        self._service.progress.end(half_offset, outcome, op_offset)

    def put_committed(self, committed: MessageBatch | list[StoreMessage]
                      ) -> tuple[int, PutResult | None]:
        """Store committed messages of one queue now, in batches of at most
        BATCH_MESSAGES_MAX / BATCH_BYTES_MAX (whole exactly-once ranges; exactly_once.py),
        given by columns or one by one.

        Returns:
            How many were stored (a prefix of ``committed``), and the failed put's result
            (None when all were stored).
        """
        store = self._service.store
        stored = 0
        if isinstance(committed, MessageBatch):
            chunks: Iterator[MessageBatch | list[StoreMessage]] = _bounded_columns(committed)
        else:
            chunks = _bounded_message_batches(committed)
        for chunk in chunks:
            started = time.monotonic()
            if isinstance(chunk, MessageBatch):
                result = store.put_batch(chunk, msg_ids=False)  # nobody is told them
                bodies = chunk.bodies
            else:
                result = store.put_messages(chunk)
                bodies = [message.body for message in chunk]
            self._count(result.status, len(bodies), result.wrote_bytes, started)
            if result.status not in STORED:
                return stored, result
            self._last_put = result
            stored += len(bodies)
        return stored, None

    def write_op(self, outcome: Outcome, offsets: list[int]) -> int:
        """Write one op record ending the halves at ``offsets`` now; returns its op queue
        offset (the op queue's end when the store refused it: logged, see the module
        docstring)."""
        return self._write_ops(outcome, offsets)

    def flush(self) -> None:
        """Write every queued end now and answer their futures."""
        self._flush_scheduled = False
        queued, self._queued = self._queued, []
        if not queued:
            return
        self._answers.clear()
        try:
            self._write(queued)
        except BaseException:
            for end in queued:  # writing failed unexpectedly: nobody may wait forever
                if not end.answer.done():
                    end.answer.set_result(EndAnswer(
                        ResponseCode.SYSTEM_ERROR,
                        f"ending half offset {end.half.queue_offset} failed unexpectedly; see "
                        "the broker log",
                    ))
            raise

    async def stored_status(self) -> PutStatus:
        """Whether everything this writer stored so far is on disk (SYNC_FLUSH) and on a
        slave (SYNC_MASTER): its last put's status (module docstring, *Durability*). With no
        put of its own yet (a replayed commit after a restart), the slave wait covers the
        whole commit log as it is now."""
        last = self._last_put
        if last is None:
            end = self._service.store.commit_log_max_offset()
            last = PutResult(PutStatus.PUT_OK, physical_offset=end, wrote_bytes=0)
        if last.durable is None and not self._service.waits_for_slaves:
            return PutStatus.PUT_OK
        return await self._service.stored_status(last)

    async def cancel_waits(self) -> None:
        """Stop waiting for the disk and slaves (shutdown); the commits still waiting are
        answered FLUSH_SLAVE_TIMEOUT (stored on the master, not confirmed)."""
        waits = list(self._waits)
        for task in waits:
            task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)

    def _write(self, queued: list[_QueuedEnd]) -> None:
        stored = self._store_committed(queued)
        for outcome in (Outcome.COMMIT, Outcome.ROLLBACK):
            halves = [end.half for end in stored if end.outcome is outcome]
            if len(halves) == 1:  # a lone end also names its producer group and transaction
                properties = halves[0].properties
                self._write_ops(outcome, [halves[0].queue_offset],
                                properties.get(PROPERTY_PRODUCER_GROUP),
                                transaction_id_of(properties))
            elif halves:
                self._write_ops(outcome, [half.queue_offset for half in halves])
        commits = [end for end in stored if end.outcome is Outcome.COMMIT]
        last = self._last_put
        waiting: list[_QueuedEnd] = []
        if commits and last is not None and (last.durable is not None
                                             or self._service.waits_for_slaves):
            # One wait for the whole flush: its last put ends after every copy it stored.
            waiting = commits
            task = asyncio.get_running_loop().create_task(
                self._answer_when_stored(commits, last), name="end-transaction-durable")
            self._waits.add(task)
            task.add_done_callback(self._waits.discard)
        answered_later = {id(end) for end in waiting}
        for end in stored:
            if id(end) not in answered_later and not end.answer.done():
                end.answer.set_result(SUCCESS)

    async def _answer_when_stored(self, commits: list[_QueuedEnd], last: PutResult) -> None:
        try:
            status = await self._service.stored_status(last)
        except asyncio.CancelledError:
            status = PutStatus.FLUSH_SLAVE_TIMEOUT  # shutting down: not confirmed
            raise
        except Exception:
            log.exception("waiting for the disk / a slave to confirm %d commits failed",
                          len(commits))
            status = PutStatus.FLUSH_SLAVE_TIMEOUT
        finally:
            answer = SUCCESS if status is PutStatus.PUT_OK else None
            for end in commits:
                if not end.answer.done():
                    end.answer.set_result(answer or _not_confirmed(end, status))

    def _store_committed(self, queued: list[_QueuedEnd]) -> list[_QueuedEnd]:
        """Put the committed messages; returns the ends that hold (rollbacks and commits
        stored). A refused commit reopens its half and gets the failure answer."""
        commits = [end for end in queued if end.committed is not None]
        refused: set[int] = set()
        for batch in _bounded_batches(commits):
            refused.update(self._put_group(batch))
        return [end for end in queued if id(end) not in refused] if refused else queued

    def _put_group(self, batch: list[_QueuedEnd]) -> list[int]:
        """Store the committed messages of ``batch`` (any topics and queues) in one group
        append, each queue in arrival order; returns the ids of the refused ends."""
        store = self._service.store
        messages: list[StoreMessage] = [end.committed for end in batch]  # type: ignore[misc]
        started = time.monotonic()
        results = store.put_message_group(messages)
        stored = [result for result in results if result.status in STORED]
        if stored:
            self._last_put = max(stored, key=_end_of)
            self._count(PutStatus.PUT_OK, len(stored),
                        sum(result.wrote_bytes for result in stored), started)
        if len(stored) == len(messages):
            return []
        refused = []
        for end, result in zip(batch, results, strict=True):
            if result.status not in STORED:
                self._service.broker_stats.record_put_failure()
                refused.append(self._refuse(end, result.status, result.remark))
        return refused

    def _count(self, status: PutStatus, message_count: int, stored_bytes: int,
               started: float) -> None:
        stats = self._service.broker_stats
        if status in STORED:
            elapsed_ms = int((time.monotonic() - started) * 1000)
            stats.record_put(message_count, stored_bytes, elapsed_ms)
        else:
            stats.record_put_failure()

    def _refuse(self, end: _QueuedEnd, status: PutStatus, remark: str) -> int:
        message = end.committed
        assert message is not None
        log.warning("the committed message of half offset %d for %s queue %d could not be "
                    "stored: %s %s; the half stays pending", end.half.queue_offset,
                    message.topic, message.queue_id, status.value, remark)
        self._service.reopen(end.half)
        end.answer.set_result(_refusal(message.topic, status, remark))
        return id(end)

    def _write_ops(self, outcome: Outcome, offsets: list[int], group: str | None = None,
                   transaction_id: str | None = None) -> int:
        """One op record ending the halves at ``offsets`` with ``outcome``; returns its op
        queue offset (the op queue's end when the store refused it)."""
        service = self._service
        service.ensure_topic(OP_TOPIC)
        result = service.store.put_message(op_message(offsets, outcome, group, transaction_id))
        if result.status in STORED:
            self._last_put = result
            return result.queue_offset
        log.error(
            "op record ending half offsets %s (%s) could not be stored: %s %s; the ends hold "
            "until the broker restarts, then those halves are checked again",
            _shown(offsets), outcome.value, result.status.value, result.remark,
        )
        return service.store.max_offset(OP_TOPIC, HALF_QUEUE_ID)


def _bounded_batches(group: list[_QueuedEnd]) -> Iterator[list[_QueuedEnd]]:
    """``group`` cut into batches of at most BATCH_MESSAGES_MAX / BATCH_BYTES_MAX."""
    batch: list[_QueuedEnd] = []
    size = 0
    for end in group:
        length = len(end.committed.body)  # type: ignore[union-attr]
        if batch and (len(batch) >= BATCH_MESSAGES_MAX or size + length > BATCH_BYTES_MAX):
            yield batch
            batch, size = [], 0
        batch.append(end)
        size += length
    if batch:
        yield batch


def _bounded_columns(batch: MessageBatch) -> Iterator[MessageBatch]:
    """``batch`` cut into batches of at most BATCH_MESSAGES_MAX / BATCH_BYTES_MAX."""
    lengths = list(map(len, batch.bodies))
    start, size = 0, 0
    for index, length in enumerate(lengths):
        if index > start and (index - start >= BATCH_MESSAGES_MAX
                              or size + length > BATCH_BYTES_MAX):
            yield _columns_slice(batch, start, index)
            start, size = index, 0
        size += length
    yield _columns_slice(batch, start, len(lengths))


def _columns_slice(batch: MessageBatch, start: int, end: int) -> MessageBatch:
    if start == 0 and end == len(batch.bodies):
        return batch
    offsets = batch.prepared_transaction_offsets
    crcs = batch.body_crcs
    return replace(
        batch, bodies=batch.bodies[start:end], properties=batch.properties[start:end],
        flags=batch.flags[start:end], keys=batch.keys[start:end],
        tags=None if batch.tags is None else batch.tags[start:end],
        prepared_transaction_offsets=None if offsets is None else offsets[start:end],
        body_crcs=None if crcs is None else crcs[start:end],
    )


def _bounded_message_batches(messages: list[StoreMessage]) -> Iterator[list[StoreMessage]]:
    """``messages`` cut into batches of at most BATCH_MESSAGES_MAX / BATCH_BYTES_MAX."""
    batch: list[StoreMessage] = []
    size = 0
    for message in messages:
        length = len(message.body)
        if batch and (len(batch) >= BATCH_MESSAGES_MAX or size + length > BATCH_BYTES_MAX):
            yield batch
            batch, size = [], 0
        batch.append(message)
        size += length
    if batch:
        yield batch


def _end_of(result: PutResult) -> int:
    return result.physical_offset + result.wrote_bytes


def _not_confirmed(end: _QueuedEnd, status: PutStatus) -> EndAnswer:
    """The answer to a commit stored on the master that the disk or a slave did not confirm."""
    message = end.committed
    topic = message.topic if message is not None else "?"
    why = _NOT_CONFIRMED_WHY.get(status, status.value)
    return EndAnswer(
        NOT_CONFIRMED_CODES.get(status, ResponseCode.FLUSH_SLAVE_TIMEOUT),
        f"the commit of half offset {end.half.queue_offset} (topic {topic}) is stored on this "
        f"master and the half is ended, but {why}; the committed message may be lost with "
        "this master's disk (check the slave: tidemq admin brokerStatus)",
    )


def _refusal(topic: str, status: PutStatus, remark: str) -> EndAnswer:
    return EndAnswer(
        _FAILED_PUT_CODES.get(status, ResponseCode.SYSTEM_ERROR),
        f"the committed message for topic {topic} could not be stored ({status.value}: "
        f"{remark}); the half stays pending and is checked again",
    )


def _shown(offsets: list[int], limit: int = 10) -> str:
    text = ",".join(map(str, offsets[:limit]))
    return text + (f",... ({len(offsets)} in all)" if len(offsets) > limit else "")


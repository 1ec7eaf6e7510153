"""Exactly-once batches: many half messages committed together, once, per (query id, batch id).

This is the broker's half of the exactly-once Spark sink (``pyspark_tidemq``). A Spark
streaming query writes micro-batch ``batchId``; each task execution (a *writer*, with a fresh
``writerId``) sends its rows as transactional half messages in batches, and the driver
commits the micro-batch once every task finished. Spark may run a micro-batch twice (a
driver restarted before it recorded the commit replays it), and a killed driver never
aborts; this module makes the outcome the same as one clean run.

Theory of operation
-------------------
*Halves.* A SEND_BATCH_MESSAGE whose batch properties say TRAN_MSG=true is stored by
``prepare_batch`` as half messages in one put (records.py shapes). Each half carries, from
the batch properties, PGROUP, CHECK_IMMUNITY_TIME_IN_SECONDS and the EOS identity::

    EOS_QUERY_ID   the Spark query id (stable across restarts of one checkpoint)
    EOS_BATCH_ID   the micro-batch id
    EOS_PARTITION  the Spark partition (diagnostics)
    EOS_WRITER_ID  the task execution's id (a fresh uuid each time a task runs)

The SEND response names the first half's half-queue offset; the batch's halves follow it.
The writer reports its ranges ``[first offset, count]`` to the driver. The broker remembers
the put as a *prepared range* (prepared_ranges.py: offsets, identity, timeout) and tracks
its halves only through it: the check scan jumps over them, and they cost nothing more
until their commit or their timeout.

*Commit* (EOS_COMMIT_BATCH, one request per broker, from the driver):

1. A decision for (queryId, batchId) exists: this is a replay. Nothing is committed; the
   halves of writers that are not in the decision are rolled back. Answer SUCCESS,
   ``alreadyCommitted=true`` and the count committed the first time.
2. Else every listed writer's ranges are verified: each half must be there, be that
   writer's (query, batch, writer, producer group) and not have ended. A listed range made
   of whole prepared ranges of that identity, none with a half ended on its own, passes
   without a read; any other is read half by half. Otherwise answer
   EOS_BATCH_INCOMPLETE naming the first problem (typically halves rolled back because the
   batch took longer than their immunity); nothing is decided, the driver fails the batch,
   and a restarted query replays it.
3. The decision is written to ``eosCommits.json`` (decisions.py) and only then are the
   halves committed: a prepared range as a unit (range_ends.py: one read, batched puts of
   the committed messages, one op record), anything else half by half through the
   END_TRANSACTION path (end_writer.py), with the event loop free every APPLY_CHUNK
   halves. Then the answer: SUCCESS, ``committedCount``.

While a commit is between step 2 and the end of step 3, a second commit of the same batch
waits for it, and the check service leaves its halves alone.

*The broker finishes on its own.* A decision whose halves are not all committed (the broker
was killed while committing) is finished at start-up, before the check service's first
round can reach them (``finish_decided``). And whenever an EOS half or prepared range is
due (its immunity passed): one within the ranges of a decision is committed, never rolled
back; any other is rolled back at once, without asking a producer (the task that sent it is
gone): rows of killed task attempts and of drivers that died before committing disappear
this way. Committed messages lose the EOS_* and CHECK_IMMUNITY properties (records.py).

*Abort* (EOS_ABORT_BATCH): the listed writers' halves that no decision holds are rolled back
now; a driver calls it for a failed micro-batch (best effort: the timeout does the same).

Several brokers: the driver commits them one after the other. A driver killed between two
leaves a batch committed on some brokers only; the restarted query replays it, the brokers
that committed roll the replay back and the others commit it. Rows reach the same broker in
the replay because the sink routes each row by (partition, row index).

Wire format (tidemq extensions; RocketMQ has no such requests)
---------------------------------------------------------------
Request header ext fields: ``producerGroup``, ``queryId``, ``batchId`` (decimal). Body,
JSON::

    {"writers": [{"writerId": "9f1c...", "count": 300, "ranges": [[1042, 256], [1300, 44]]}]}

``count`` must equal the sum of the range counts. Response ext fields: ``committedCount``
(what the decision commits), ``alreadyCommitted`` (``true`` for a replay), and
``rolledBackCount`` (halves this request rolled back).

Ownership: the broker's event loop; store reads and puts are quick mmap work done there.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemq.broker.exactly_once.decisions import (
    EOS_COMMITS_FILE_NAME,
    BatchDecision,
    EosDecisions,
    Range,
)
from tidemq.broker.exactly_once.range_ends import (
    commit_groups,
    commit_range,
    commit_ranges,
    roll_back_range,
)
from tidemq.broker.exactly_once.records import (
    EOS_PROPERTIES,
    PROPERTY_EOS_BATCH_ID,
    PROPERTY_EOS_PARTITION,
    PROPERTY_EOS_QUERY_ID,
    PROPERTY_EOS_WRITER_ID,
    eos_committed_message,
    eos_identity,
)
from tidemq.broker.transaction.end_writer import NOT_CONFIRMED_CODES, EndAnswer
from tidemq.broker.transaction.prepared_ranges import CommittedCopies, PreparedRange
from tidemq.broker.transaction.records import (
    HALF_QUEUE_ID,
    HALF_TOPIC,
    NotAHalfMessage,
    Outcome,
    is_half_message,
    make_half,
    parse_boolean,
)
from tidemq.errors import RemoteProtocolError, StoreError
from tidemq.protocol import jsonx
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_MASK,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    MessageExt,
    iter_records,
)
from tidemq.store.interface import GetStatus, MessageBatch, PutResult, PutStatus, StoreMessage
from tidemq.store.record_encoder import body_crcs

if TYPE_CHECKING:
    from tidemq.broker.exactly_once.ledger import HalfLedger
    from tidemq.broker.transaction.progress import PendingHalf

log = logging.getLogger("tidemq.broker")

__all__ = [
    "EOS_PROPERTIES", "PROPERTY_EOS_BATCH_ID", "PROPERTY_EOS_PARTITION",
    "PROPERTY_EOS_QUERY_ID", "PROPERTY_EOS_WRITER_ID", "EosAnswer", "EosBatch",
    "EosRequestError", "ExactlyOnceService", "WriterHalves", "answer_for_bad_request",
    "eos_committed_message", "eos_identity", "parse_batch_request",
]

# Halves read per store call while verifying or committing (1 KiB rows: 256 KiB a read).
READ_COUNT = 256
READ_BYTES_MAX = 4 * 1024 * 1024
# Halves ended before the loop is given back: one flush of the end writer's batched puts.
APPLY_CHUNK = 1024
# Request bounds, checked before anything is read: a Spark micro-batch has one writer per
# task (thousands at most), and a writer's ranges are one per send request at worst.
WRITERS_MAX = 100_000
RANGES_MAX = 1_000_000
ID_LENGTH_MAX = 256
# A due half whose batch is being decided right now is looked at again this much later.
DECIDING_RECHECK_MS = 1_000
# Halves of due prepared ranges settled per check round before the loop is given back.
DUE_HALVES_PER_TICK_MAX = 16_384
# The properties that make halves one prepared range: equal in all of them.
RANGE_IDENTITY = (PROPERTY_EOS_WRITER_ID, PROPERTY_EOS_QUERY_ID, PROPERTY_EOS_BATCH_ID,
                  PROPERTY_PRODUCER_GROUP, PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
# Test hook (crash tests only): the broker SIGKILLs itself once it has committed this many
# halves of a decision (0: right after the decision is written, before any commit).
KILL_AFTER_COMMITS_ENV = "TIDEMQ_TEST_EOS_KILL_AFTER_COMMITS"


class EosRequestError(ValueError):
    """An EOS_COMMIT_BATCH / EOS_ABORT_BATCH request is malformed; the text says how."""


@dataclass(frozen=True, slots=True)
class WriterHalves:
    """One writer's halves on this broker, as the driver lists them."""

    writer_id: str
    count: int
    ranges: tuple[Range, ...]


@dataclass(frozen=True, slots=True)
class EosBatch:
    """A parsed EOS_COMMIT_BATCH / EOS_ABORT_BATCH request (module docstring)."""

    producer_group: str
    query_id: str
    batch_id: int
    writers: tuple[WriterHalves, ...]

    @property
    def count(self) -> int:
        """Halves listed, over all writers."""
        return sum(writer.count for writer in self.writers)


@dataclass(frozen=True, slots=True)
class EosAnswer:
    """The response: a code, a remark, and the ext fields of the module docstring."""

    code: int
    remark: str | None = None
    committed_count: int = 0
    already_committed: bool = False
    rolled_back_count: int = 0

    def ext_fields(self) -> dict[str, str]:
        """The response's ext fields."""
        return {
            "committedCount": str(self.committed_count),
            "alreadyCommitted": "true" if self.already_committed else "false",
            "rolledBackCount": str(self.rolled_back_count),
        }


_NOT_CONFIRMED = frozenset(NOT_CONFIRMED_CODES.values())


def parse_batch_request(ext_fields: dict[str, str] | None, body: bytes | None) -> EosBatch:
    """The EOS request in a command's header fields and body.

    Raises:
        EosRequestError: a field is missing or malformed, or a bound is exceeded.
    """
    fields = ext_fields or {}
    group = _id_field(fields, "producerGroup")
    query_id = _id_field(fields, "queryId")
    batch_text = fields.get("batchId", "")
    if not batch_text.lstrip("-").isdigit():
        raise EosRequestError(f"header field batchId is {batch_text!r}, expected an integer")
    try:
        document = jsonx.loads(body or b"")
    except Exception as exc:
        raise EosRequestError(f"the body is not JSON: {exc}") from None
    writers_json = document.get("writers") if isinstance(document, dict) else None
    if not isinstance(writers_json, list):
        raise EosRequestError('the body must be {"writers": [...]}')
    if len(writers_json) > WRITERS_MAX:
        raise EosRequestError(f"{len(writers_json)} writers, more than {WRITERS_MAX}")
    writers = []
    range_total = 0
    for item in writers_json:
        writer = _writer(item)
        range_total += len(writer.ranges)
        if range_total > RANGES_MAX:
            raise EosRequestError(f"more than {RANGES_MAX} ranges in one request")
        writers.append(writer)
    return EosBatch(group, query_id, int(batch_text), tuple(writers))


def _id_field(fields: dict[str, str], name: str) -> str:
    value = fields.get(name, "")
    if not value or len(value) > ID_LENGTH_MAX:
        raise EosRequestError(
            f"header field {name} is {value!r}: expected 1 to {ID_LENGTH_MAX} characters")
    return value


def _writer(item: Any) -> WriterHalves:
    if not isinstance(item, dict):
        raise EosRequestError(f"writer entry {item!r} is not an object")
    writer_id = item.get("writerId")
    count = item.get("count")
    ranges = item.get("ranges")
    if not isinstance(writer_id, str) or not writer_id or len(writer_id) > ID_LENGTH_MAX:
        raise EosRequestError(f"writerId {writer_id!r} is not a short non-empty string")
    if not _natural(count) or not isinstance(ranges, list):
        raise EosRequestError(f"writer {writer_id}: count {count!r} or ranges are malformed")
    parsed = []
    for one in ranges:
        if not (isinstance(one, list) and len(one) == 2 and _natural(one[0])
                and _natural(one[1])):
            raise EosRequestError(f"writer {writer_id}: range {one!r} is not [offset, count]")
        parsed.append((one[0], one[1]))
    listed = sum(n for _, n in parsed)
    if listed != count:
        raise EosRequestError(
            f"writer {writer_id}: count is {count} but its ranges hold {listed} halves")
    return WriterHalves(writer_id, count, tuple(parsed))


def _natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class ExactlyOnceService:
    """Prepared batches, EOS commits and aborts, and EOS halves the check service finds due.

    Args:
        service: the transaction service, seen through the narrow ``HalfLedger``
            (ledger.py: store, progress, end writer, timing).
        config_dir: where eosCommits.json lives.

    Raises:
        ConfigFileCorrupt: eosCommits.json and its .bak are both unreadable.
    """

    def __init__(self, service: HalfLedger, config_dir: str | Path) -> None:
        self._service = service
        self.decisions = EosDecisions(Path(config_dir) / EOS_COMMITS_FILE_NAME)
        self._deciding: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._write_lock: asyncio.Lock | None = None
        self._last_rolled_back: tuple[str, str, str] | None = None

    def identity(self, half: MessageExt) -> tuple[str, str, str] | None:
        """``(query id, batch id text, writer id)`` of an exactly-once half, else None."""
        return eos_identity(half)

    # -- the send path ---------------------------------------------------------------------

    def prepare_batch(self, messages: list[StoreMessage]) -> PutResult:
        """Store a transactional batch as half messages in one put.

        The messages become the halves in place (records.py ``to_half``: topic, queue,
        sysflag, REAL_TOPIC / REAL_QID); the caller must not reuse them.

        Returns:
            The put's result (half-queue offsets), or MESSAGE_ILLEGAL when a message is not
            marked TRAN_MSG=true.
        """
        for message in _differing(messages):
            if not is_half_message(message):
                return PutResult(
                    PutStatus.MESSAGE_ILLEGAL,
                    f"a transactional batch to topic {message.topic} holds a message without "
                    "TRAN_MSG=true; put TRAN_MSG and PGROUP in the batch properties")
        service = self._service
        service.ensure_topic(HALF_TOPIC)
        for message in messages:
            make_half(message)
        result = service.store.put_messages(messages)
        if result.status in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT) and messages:
            self._remember_range(messages, result)
        return result

    @staticmethod
    def takes_columns(batch_properties: dict[str, str]) -> bool:
        """True when a transactional batch with these batch properties may be stored by
        ``prepare_columns``: they say TRAN_MSG=true, name the whole range identity and no
        delay, so every half is a half and carries them (a batch's properties override its
        entries')."""
        return (
            parse_boolean(batch_properties.get(PROPERTY_TRANSACTION_PREPARED))
            and PROPERTY_DELAY_TIME_LEVEL not in batch_properties
            and all(name in batch_properties for name in RANGE_IDENTITY)
        )

    def prepare_columns(self, batch: MessageBatch, batch_properties: dict[str, str],
                        committed_properties: list[bytes] | None = None) -> PutResult:
        """Store a transactional batch given in columns as half messages in one put: one
        prepared range.

        Args:
            batch: the batch as sent, for its real topic and queue, its properties merged
                with ``batch_properties`` (REAL_TOPIC / REAL_QID among them).
            batch_properties: properties for which ``takes_columns`` is true.
            committed_properties: each message's properties without ``EOS_COMMIT_DROPPED``
                (``merge_batch_properties``'s ``without_dropped``), when known: the range
                then keeps its committed copies while the budget allows
                (prepared_ranges.py).

        Returns:
            The put's result (half-queue offsets).
        """
        service = self._service
        service.ensure_topic(HALF_TOPIC)
        crcs = body_crcs(batch.bodies)
        sysflag = batch.sysflag & ~SYSFLAG_TRANSACTION_MASK
        halves = replace(batch, topic=HALF_TOPIC, queue_id=HALF_QUEUE_ID,
                         sysflag=sysflag | TRANSACTION_NOT_TYPE, body_crcs=crcs)
        result = service.store.put_batch(halves)
        if result.status in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            copies = None
            if committed_properties is not None and service.progress.prepared.copies_max_bytes:
                copies = CommittedCopies.of(result.physical_offset, result.wrote_bytes, replace(
                    batch, bodies=[], properties=committed_properties,
                    sysflag=sysflag | TRANSACTION_COMMIT_TYPE, body_crcs=crcs))
            self._add_range(batch_properties, result, len(batch.bodies), copies)
        return result

    def _remember_range(self, messages: list[StoreMessage], result: PutResult) -> None:
        """Track the stored halves as one prepared range when they are one writer's."""
        properties = messages[0].properties
        if properties.get(PROPERTY_EOS_WRITER_ID) is None:
            return  # a transactional batch of another client: its halves are checked
        count = len(messages)
        for name in RANGE_IDENTITY:
            value = properties.get(name)
            if [m.properties.get(name) for m in messages].count(value) != count:
                return  # not one identity (an entry overrode one): tracked half by half
        self._add_range(properties, result, count)

    def _add_range(self, properties: dict[str, str], result: PutResult, count: int,
                   copies: CommittedCopies | None = None) -> None:
        """Track ``count`` halves stored by one put, all with ``properties``' identity."""
        service = self._service
        store_timestamp = result.store_timestamp or service.clock_ms()
        service.progress.prepared.add(PreparedRange(
            first=result.queue_offset, count=count,
            query_id=properties.get(PROPERTY_EOS_QUERY_ID, ""),
            batch_text=properties.get(PROPERTY_EOS_BATCH_ID, ""),
            writer_id=properties.get(PROPERTY_EOS_WRITER_ID, ""),
            producer_group=properties.get(PROPERTY_PRODUCER_GROUP, ""),
            due_ms=store_timestamp + service.immunity_ms(properties),
            copies=copies,
        ))

    # -- commit and abort ------------------------------------------------------------------

    async def commit(self, batch: EosBatch) -> EosAnswer:
        """Steps 1-3 of the module docstring for one EOS_COMMIT_BATCH."""
        key = (batch.query_id, batch.batch_id)
        while (running := self._deciding.get(key)) is not None:
            await asyncio.shield(running)  # the same batch is being committed: wait for it
        decision = self.decisions.get(*key)
        if decision is not None:
            return await self._confirmed(batch, self._replayed(batch, decision))
        started = time.monotonic()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._deciding[key] = done
        try:
            problem = self._verify(batch)
            if problem is not None:
                return EosAnswer(ResponseCode.EOS_BATCH_INCOMPLETE, problem)
            decision = BatchDecision(
                query_id=batch.query_id, batch_id=batch.batch_id,
                producer_group=batch.producer_group, count=batch.count,
                decided_ms=self._service.clock_ms(),
                writers={w.writer_id: list(w.ranges) for w in batch.writers},
            )
            self.decisions.record(decision)
            try:
                await self.write_decisions()
            except StoreError as exc:
                self.decisions.forget(*key)
                return EosAnswer(
                    ResponseCode.SYSTEM_ERROR,
                    f"batch {batch.batch_id} of query {batch.query_id} was not committed: its "
                    f"decision could not be written ({exc}); the halves wait, retry the commit")
            failed = await self.apply(decision)
        finally:
            del self._deciding[key]
            done.set_result(None)
        remark = None
        if failed:
            remark = (f"{failed} of {decision.count} committed messages could not be stored "
                      "yet; the decision is durable and the broker commits them on its own")
        log.info("exactly-once batch %d of query %s committed: %d messages from %d writers "
                 "in %.0f ms", batch.batch_id, batch.query_id, decision.count,
                 len(batch.writers), (time.monotonic() - started) * 1000)
        return await self._confirmed(
            batch, EosAnswer(ResponseCode.SUCCESS, remark, committed_count=decision.count))

    async def _confirmed(self, batch: EosBatch, answer: EosAnswer) -> EosAnswer:
        """``answer`` once the committed copies are on disk (SYNC_FLUSH) and on a slave
        (SYNC_MASTER); else the batch stays committed on this master (its decision holds)
        and the answer says FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE,
        so a sink does not take the batch for safe (docs/operations.md)."""
        status = await self._service.writer.stored_status()
        if status is PutStatus.PUT_OK:
            return answer
        return replace(
            answer, code=NOT_CONFIRMED_CODES.get(status, ResponseCode.FLUSH_SLAVE_TIMEOUT),
            remark=(f"batch {batch.batch_id} of query {batch.query_id} is committed on this "
                    f"master ({answer.committed_count} messages) but not confirmed: "
                    f"{status.value} (a slave or the disk did not acknowledge the committed "
                    "messages within syncFlushTimeout); they may be lost with this master's "
                    "disk. A repeated commit is answered again once they are confirmed"),
        )

    def _replayed(self, batch: EosBatch, decision: BatchDecision) -> EosAnswer:
        """A commit of a decided batch: roll back the halves of writers the decision lacks."""
        rolled_back = self._roll_back(batch, decision)
        log.info(
            "exactly-once batch %d of query %s was already committed (%d messages); %d half "
            "messages of its replay rolled back", batch.batch_id, batch.query_id,
            decision.count, rolled_back)
        return EosAnswer(
            ResponseCode.SUCCESS,
            f"batch {batch.batch_id} of query {batch.query_id} was already committed with "
            f"{decision.count} messages; this replay's {rolled_back} half messages were rolled "
            "back",
            committed_count=decision.count, already_committed=True,
            rolled_back_count=rolled_back,
        )

    async def abort(self, batch: EosBatch) -> EosAnswer:
        """EOS_ABORT_BATCH: roll back the listed writers' halves no decision holds."""
        key = (batch.query_id, batch.batch_id)
        while (running := self._deciding.get(key)) is not None:
            await asyncio.shield(running)
        rolled_back = self._roll_back(batch, self.decisions.get(*key))
        return EosAnswer(ResponseCode.SUCCESS, committed_count=0,
                         rolled_back_count=rolled_back)

    def _roll_back(self, batch: EosBatch, decision: BatchDecision | None) -> int:
        writer_end = self._service.writer
        rolled_back = 0
        for writer in batch.writers:
            if decision is not None and writer.writer_id in decision.writers:
                continue  # a retried commit of the same writers: they are the decision's
            for first, count in writer.ranges:
                prepared = self._prepared(batch, writer.writer_id, first, count)
                if prepared is not None:
                    for one in prepared:
                        rolled_back += roll_back_range(self._service, one)
                    continue
                for half in self._halves(((first, count),)):
                    if self._is_open(half) and _belongs(half, batch, writer.writer_id):
                        writer_end.end(half, Outcome.ROLLBACK)
                        rolled_back += 1
        return rolled_back

    def _prepared(self, batch: EosBatch, writer_id: str, first: int,
                  count: int) -> list[PreparedRange] | None:
        """The prepared ranges that make up exactly ``[first, first + count)``, all of
        ``writer_id`` in ``batch``; None when the span is anything else."""
        found = self._service.progress.prepared.covering(first, count)
        if found is None:
            return None
        identity = (batch.query_id, str(batch.batch_id), writer_id)
        for prepared in found:
            if (prepared.identity() != identity
                    or prepared.producer_group != batch.producer_group):
                return None
        return found

    def _verify(self, batch: EosBatch) -> str | None:
        """None when every listed half is there, the writer's and open; else the problem."""
        what = f"batch {batch.batch_id} of query {batch.query_id}"
        for writer in batch.writers:
            found = 0
            for first, count in writer.ranges:
                prepared = self._prepared(batch, writer.writer_id, first, count)
                if prepared is not None and not any(one.ended_apart for one in prepared):
                    found += count  # this broker prepared them so, and none has ended
                    continue
                expected = first
                for half in self._halves(((first, count),)):
                    if half.queue_offset != expected:
                        break
                    if not _belongs(half, batch, writer.writer_id):
                        return (
                            f"{what}: half offset {half.queue_offset} is not a half message of "
                            f"writer {writer.writer_id} (producer group {batch.producer_group});"
                            " the commit names offsets this broker did not give that writer")
                    if not self._is_open(half):
                        return (
                            f"{what}: the half messages of writer {writer.writer_id} (from "
                            f"offset {half.queue_offset}) were already rolled back, most likely "
                            "because the batch took longer than their timeout; nothing was "
                            "committed. Restart the query from its checkpoint to write the "
                            "batch again, and raise the sink option exactlyOnce.timeoutMs")
                    found += 1
                    expected += 1
                if expected != first + count:
                    return (
                        f"{what}: half offset {expected} of writer {writer.writer_id} is not "
                        "stored on this broker (expired or never written); nothing was "
                        "committed. Restart the query from its checkpoint to write it again")
            assert found == writer.count
        return None

    # -- committing a decision -------------------------------------------------------------

    async def apply(self, decision: BatchDecision) -> int:
        """Commit every open half of ``decision``; returns how many could not be stored
        (they stay pending and the check service commits them later)."""
        service = self._service
        answers: list[asyncio.Future[EndAnswer]] = []
        since_yield = 0
        kill_after = _kill_after_commits()
        if kill_after == 0:
            _kill_self("the decision is written, nothing committed")
        committed = 0  # by whole ranges
        failed = 0
        batch = EosBatch(decision.producer_group, decision.query_id, decision.batch_id, ())
        for writer_id, ranges in decision.writers.items():
            for first, count in ranges:
                # Looked up now, not before the loop: a yield may have let the check service
                # settle some of these ranges meanwhile.
                prepared = self._prepared(batch, writer_id, first, count) or ()
                by_half: list[PreparedRange] = []
                for group in commit_groups(prepared):
                    for one, done in zip(group, commit_ranges(service, group), strict=True):
                        if done is None:
                            by_half.append(one)
                            continue
                        committed += done
                        failed += one.count - done
                        since_yield += one.count
                    if kill_after is not None and committed >= kill_after:
                        _kill_self(f"{committed} halves committed")
                    if since_yield >= APPLY_CHUNK:
                        # Let others run; a range ended meanwhile (the check service)
                        # is found so by commit_ranges and left to the per-half path.
                        since_yield = 0
                        await asyncio.sleep(0)
                spans = [(one.first, one.count) for one in by_half] if prepared else [
                    (first, count)]
                for half in self._halves(spans):
                    if not self._is_open(half) or eos_identity(half) != (
                            decision.query_id, str(decision.batch_id), writer_id):
                        continue
                    answer = self._commit_half(half)
                    if answer is not None:
                        answers.append(answer)
                    if kill_after is not None and len(answers) + committed >= kill_after:
                        service.writer.flush()
                        _kill_self(f"{len(answers) + committed} halves committed")
                    since_yield += 1
                    if since_yield >= APPLY_CHUNK:
                        since_yield = 0
                        await asyncio.sleep(0)  # let the end writer flush, and others run
                for one in by_half:
                    service.progress.prepared.remove(one)  # each of its halves ended or reopened
                if since_yield >= APPLY_CHUNK:
                    since_yield = 0
                    await asyncio.sleep(0)
        service.writer.flush()  # write the last chunk now rather than on the next turn
        if answers:
            for answer in await asyncio.gather(*answers):
                # Stored but not confirmed by the disk / a slave is stored: commit answers that.
                if answer.code != ResponseCode.SUCCESS and answer.code not in _NOT_CONFIRMED:
                    failed += 1
        if not failed:
            self.decisions.mark_applied(decision)
        return failed

    def _commit_half(self, half: MessageExt) -> asyncio.Future[EndAnswer] | None:
        service = self._service
        if service.committed_before_restart(half):
            service.writer.end_now(half, Outcome.COMMIT)
            return None
        try:
            committed = eos_committed_message(half)
        except NotAHalfMessage as exc:
            log.error("exactly-once half offset %d cannot be committed: %s; it is discarded",
                      half.queue_offset, exc)
            service.writer.end_now(half, Outcome.DISCARD)
            return None
        return service.writer.end(half, Outcome.COMMIT, committed)

    async def finish_decided(self) -> None:
        """Commit what decisions made before a crash left open (run once at start)."""
        for decision in self.decisions.unapplied():
            failed = await self.apply(decision)
            log.info("exactly-once batch %d of query %s: decided before the restart, its "
                     "remaining half messages are committed%s", decision.batch_id,
                     decision.query_id, f" ({failed} not yet)" if failed else "")
        await self.write_decisions()

    async def write_decisions(self) -> None:
        """Write the decision table if it changed (one writer at a time, in a thread).

        Raises:
            StoreError: the file could not be written.
        """
        if self._write_lock is None:
            self._write_lock = asyncio.Lock()
        async with self._write_lock:
            snapshot = self.decisions.snapshot()  # taken late: it holds every decision so far
            if snapshot is not None:
                await asyncio.to_thread(self.decisions.write, snapshot)

    # -- the check service -----------------------------------------------------------------

    def settle_due(self, pending: PendingHalf, half: MessageExt, now_ms: int) -> bool:
        """End an exactly-once half whose check time came; False when it is not one.

        Within a decision's ranges it is committed; while its batch is being decided it is
        looked at again shortly; otherwise it is rolled back (no producer is asked).
        """
        identity = eos_identity(half)
        if identity is None:
            return False
        query_id, batch_text, writer_id = identity
        batch_id = int(batch_text) if batch_text.lstrip("-").isdigit() else None
        service = self._service
        if batch_id is not None and (query_id, batch_id) in self._deciding:
            service.progress.reschedule(pending, now_ms + DECIDING_RECHECK_MS)
            return True
        decision = self.decisions.get(query_id, batch_id) if batch_id is not None else None
        if decision is not None and _in_ranges(half.queue_offset,
                                               decision.writers.get(writer_id, ())):
            self._commit_half(half)
            return True
        service.writer.end(half, Outcome.ROLLBACK)
        if identity != self._last_rolled_back:  # one line per writer, not one per row
            self._last_rolled_back = identity
            log.info("exactly-once half messages of writer %s (query %s, batch %s) were not "
                     "committed within their timeout: rolled back (from half offset %d)",
                     writer_id, query_id, batch_text, half.queue_offset)
        return True

    def settle_due_ranges(self, now_ms: int) -> bool:
        """End the prepared ranges whose timeout came by ``now_ms``, as ``settle_due`` ends
        a half: committed when their batch's decision holds them, rolled back otherwise.

        Returns:
            True when due ranges are left for the next round (the budget ran out).
        """
        service = self._service
        prepared_ranges = service.progress.prepared
        settled = 0
        while settled < DUE_HALVES_PER_TICK_MAX:
            prepared = prepared_ranges.pop_due(now_ms)
            if prepared is None:
                return False
            settled += prepared.count
            batch_text = prepared.batch_text
            batch_id = int(batch_text) if batch_text.lstrip("-").isdigit() else None
            key = (prepared.query_id, batch_id)
            if batch_id is not None and key in self._deciding:
                prepared_ranges.reschedule(prepared, now_ms + DECIDING_RECHECK_MS)
                continue
            decision = self.decisions.get(*key) if batch_id is not None else None
            if decision is not None and _in_ranges(
                    prepared.first, decision.writers.get(prepared.writer_id, ())):
                self._commit_due(prepared, decision)
                continue
            roll_back_range(service, prepared)
            if prepared.identity() != self._last_rolled_back:  # one line per writer
                self._last_rolled_back = prepared.identity()
                log.info("exactly-once half messages of writer %s (query %s, batch %s) were "
                         "not committed within their timeout: rolled back (from half offset "
                         "%d)", prepared.writer_id, prepared.query_id, batch_text,
                         prepared.first)
        return True

    def _commit_due(self, prepared: PreparedRange, decision: BatchDecision) -> None:
        """Commit a due range of a decided batch: as a unit, else half by half."""
        service = self._service
        done = commit_range(service, prepared)
        if done is not None:
            if done < prepared.count:  # the store refused: try the rest again later
                service.progress.prepared.reschedule(
                    prepared, service.clock_ms() + service.settings.check_interval_ms)
            return
        identity = (decision.query_id, str(decision.batch_id), prepared.writer_id)
        for half in self._halves(((prepared.first, prepared.count),)):
            if self._is_open(half) and eos_identity(half) == identity:
                self._commit_half(half)
        service.progress.prepared.remove(prepared)

    # -- reading halves --------------------------------------------------------------------

    def _halves(self, ranges: tuple[Range, ...] | list[Range]) -> Iterator[MessageExt]:
        """The stored halves of ``ranges``, in order; stops at the first one missing."""
        store = self._service.store
        for first, count in ranges:
            offset, end = first, first + count
            while offset < end:
                result = store.get_messages(HALF_TOPIC, HALF_QUEUE_ID, offset,
                                            min(READ_COUNT, end - offset), READ_BYTES_MAX)
                if result.status is not GetStatus.FOUND:
                    return
                try:
                    for half in iter_records(result.body):
                        if half.queue_offset != offset:
                            return
                        yield half
                        offset += 1
                        if offset >= end:
                            break
                except RemoteProtocolError as exc:
                    log.error("half offset %d does not decode (%s)", offset, exc)
                    return

    def _is_open(self, half: MessageExt) -> bool:
        service = self._service
        offset = half.queue_offset
        return (not service.progress.lookup(offset)[0]
                and service.writer.queued_answer(offset) is None)


def _differing(messages: list[StoreMessage]) -> list[StoreMessage]:
    """The messages whose half-ness must be checked one by one: only the first when they
    agree on everything ``is_half_message`` reads (a batch's TRAN_MSG comes from its batch
    properties, its reconsume times are the batch's), else all of them."""
    if not messages:
        return messages
    count = len(messages)
    properties = [message.properties for message in messages]
    for name in (PROPERTY_TRANSACTION_PREPARED, PROPERTY_DELAY_TIME_LEVEL):
        values = list(map(dict.get, properties, repeat(name)))
        if values.count(values[0]) != count:
            return messages
    times = [message.reconsume_times for message in messages]
    return messages[:1] if times.count(times[0]) == count else messages


def _belongs(half: MessageExt, batch: EosBatch, writer_id: str) -> bool:
    properties = half.properties
    return (properties.get(PROPERTY_EOS_WRITER_ID) == writer_id
            and properties.get(PROPERTY_EOS_QUERY_ID) == batch.query_id
            and properties.get(PROPERTY_EOS_BATCH_ID) == str(batch.batch_id)
            and properties.get(PROPERTY_PRODUCER_GROUP) == batch.producer_group)


def _in_ranges(offset: int, ranges: Any) -> bool:
    return any(first <= offset < first + count for first, count in ranges)


def _kill_after_commits() -> int | None:
    text = os.environ.get(KILL_AFTER_COMMITS_ENV, "")
    return int(text) if text.isdigit() else None


def _kill_self(where: str) -> None:
    log.warning("%s is set: the broker kills itself now (%s)", KILL_AFTER_COMMITS_ENV, where)
    os.kill(os.getpid(), signal.SIGKILL)


def answer_for_bad_request(exc: EosRequestError) -> EosAnswer:
    """The SYSTEM_ERROR answer to a malformed request."""
    return EosAnswer(ResponseCode.SYSTEM_ERROR, f"malformed exactly-once request: {exc}")

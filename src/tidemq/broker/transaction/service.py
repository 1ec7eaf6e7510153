"""Transactional messages on the broker: half messages, how they end, and the check service.

Theory of operation
-------------------
*Half.* A producer sends a message with ``TRAN_MSG=true`` (and its group in PGROUP). The
send path's hook calls ``prepare``: the message is stored as a *half* in
RMQ_SYS_TRANS_HALF_TOPIC queue 0 with its real topic and queue in REAL_TOPIC / REAL_QID
(records.py). No consumer subscribes to that topic, so nobody sees it. The producer gets the
half's offset msg id and half-queue offset back, runs its local transaction, and ends it.

*End.* END_TRANSACTION (oneway, docs/protocol.md §4.9) names the half by half-queue offset and
commit-log offset. ``end_transaction`` reads the half there and checks that it is one, of
that producer group, at that offset. Commit stores the committed message in the real topic
and queue (a DELAY on it is honoured), then an op record; rollback only the op record. The
op record (RMQ_SYS_TRANS_OP_HALF_TOPIC, tag ``d``, body = half queue offsets) is what makes
the end permanent. The ends decided in one turn of the event loop are written together,
committed messages first, in a few batched puts (end_writer.py).

*Exactly once.* Each half ends at most once. A half is marked ended the moment its end is
decided. An END_TRANSACTION or a check answer for a half that already ended writes nothing:
a repeat of the same outcome is answered SUCCESS, a contradiction SYSTEM_ERROR naming what
happened first. ``progress.py`` answers "has this half ended?" for every offset. The one gap
a crash can open is a commit stored with its op record not yet written (SIGKILL between the
two puts). So for a half stored before this broker started, the service first looks in the
index for a committed copy of it (the real topic under the half's UNIQ_KEY, with
PREPAREDTRANSACTIONOFFSET = the half's commit-log offset). If one is found, the half ends
as committed without a second copy. It does so before committing that half again, and when
the scan or a discard meets it. The same lookup answers a repeated commit of a half whose
outcome is no longer remembered. With messageIndexEnable=false the index cannot be searched
and this guard is off.

*Checks* (checker.py). One asyncio task on the broker's loop runs a round at least once a
second:

1. Scan: the half queue is read from the scan offset. A half that already ended is skipped
   without reading it. Halves are normally ended within milliseconds, so a steady stream
   costs a dict lookup per message. An unended half younger than SCAN_AGE_MIN_MS stops
   the scan, since it will most likely end soon. An older one becomes *pending*. Its first
   check is due ``immunity`` after its store time. Immunity is transactionTimeOut (6 s), or
   the message's CHECK_IMMUNITY_TIME_IN_SECONDS in seconds. A half stored before this broker
   started is first checked no earlier than transactionCheckInterval after the start, so
   producers have time to reconnect (RocketMQ's first check pass also waits one interval).
2. Check: every pending half whose time has come is sent CHECK_TRANSACTION_STATE (oneway;
   records.py) over a live connection of its producer group (ProducerManager). Successive
   checks rotate over the group's connections. The check is counted even when no producer
   of the group is connected, as RocketMQ counts it. The next check is
   transactionCheckInterval (60 s) later. The producer answers with END_TRANSACTION
   (``fromTransactionCheck=true``), which ends the half as above.
3. Discard: a half whose check time comes after transactionCheckMax (15) unanswered
   checks is copied to TRANS_CHECK_MAX_TIME_TOPIC and ended with outcome DISCARD. A late
   commit of it is refused. A half that retention already deleted ends the same way,
   without the copy.

*Restarts.* progress.py keeps a checkpoint: the scan offset, the pending halves with their
check counts, and where to replay op records from. It is written every PERSIST_INTERVAL_MS
and at shutdown, after the queued ends are written. ``restore`` (run before the first
round, in a worker thread; END_TRANSACTION waits for it) replays the op records written
since. After any crash, a half that ended stays ended and an unended half is checked again.
Check counts of halves that became pending after the last checkpoint start again at 0.

*Exactly-once batches* (exactly_once.py): a SEND_BATCH_MESSAGE marked transactional is stored
as halves in one put (``prepare_batch``); tidemq's EOS_COMMIT_BATCH commits a Spark
micro-batch's halves once per (query id, batch id), and the check service ends exactly-once
halves by their batch's decision instead of asking a producer. Such a put is tracked as one
*prepared range* (prepared_ranges.py), not as pending halves: the scan jumps over it, the
checkpoint lists it, and it is committed or rolled back as a whole (range_ends.py).

*Finding a transaction* (for an exactly-once sink that commits later, from another process):
``find_half(producer_group, transaction_id)`` returns an unended half by the producer's
transaction id (``__transactionId__``, else the UNIQ_KEY), and ``outcome(half_queue_offset)``
tells whether and how a half ended.

Ownership: all state belongs to the event loop; the store is called from it (quick mmap
work). ``restore`` runs in a worker thread before anything else touches the state. A slave
keeps no transaction state and refuses END_TRANSACTION; its master does the checking.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from tidemq.broker.config import PERM_READ, PERM_WRITE, BrokerConfig
from tidemq.broker.schedule_service import redirect_delayed
from tidemq.broker.transaction.checker import READ_BYTES_MAX, TransactionChecker
from tidemq.broker.transaction.end_processor import EndTransactionProcessor
from tidemq.broker.transaction.end_writer import SUCCESS, EndAnswer, EndWriter
from tidemq.broker.transaction.prepared_ranges import PreparedRange
from tidemq.broker.transaction.progress import (
    PROGRESS_FILE_NAME,
    Checkpoint,
    PendingHalf,
    TransactionProgress,
)
from tidemq.broker.transaction.records import (
    HALF_QUEUE_ID,
    HALF_TOPIC,
    OP_TOPIC,
    NotAHalfMessage,
    Outcome,
    committed_message,
    is_half_message,
    op_half_offsets,
    op_outcome,
    real_destination,
    to_half,
    transaction_id_of,
)
from tidemq.broker.transaction.settings import TransactionSettings
from tidemq.errors import RemoteProtocolError, StoreError
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.headers import EndTransactionRequestHeader
from tidemq.protocol.message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    MessageExt,
    decode_record,
    iter_records,
)
from tidemq.store.interface import GetStatus, PutResult, PutStatus, StoreMessage

if TYPE_CHECKING:
    from tidemq.broker.client_manager import ClientChannel, ProducerManager
    from tidemq.broker.role import ReplicationRole
    from tidemq.broker.runtime_info import BrokerStats
    from tidemq.broker.schedule_service import ScheduleMessageService
    from tidemq.broker.topic_config_manager import TopicConfigManager
    from tidemq.broker.transaction.batches import PreparedBatches
    from tidemq.remoting.server import RemotingServer
    from tidemq.store.interface import MessageStore

__all__ = ["SUCCESS", "EndAnswer", "HalfMessageRef", "TransactionService", "TransactionSettings"]

log = logging.getLogger("tidemq.broker")

# The checkpoint is written this often (and at shutdown); RocketMQ persists consumer offsets,
# which hold its transaction progress, every 5 s.
PERSIST_INTERVAL_MS = 5_000
# One read of the op or half queue while restoring: messages and bytes.
READ_BATCH_COUNT = 32
READ_BATCH_BYTES = 1024 * 1024
# Records looked at when searching the index for a committed copy of a half.
COMMITTED_COPY_QUERY_MAX = 64
_TIME_MAX_MS = (1 << 63) - 1

_OUTCOME_OF_TYPE = {
    TRANSACTION_COMMIT_TYPE: Outcome.COMMIT,
    TRANSACTION_ROLLBACK_TYPE: Outcome.ROLLBACK,
}
_ENDED_WORDS = {
    Outcome.COMMIT: "committed",
    Outcome.ROLLBACK: "rolled back",
    Outcome.DISCARD: "discarded after its last unanswered check",
}


def wall_clock_ms() -> int:
    """Milliseconds since the epoch: the clock store times come from."""
    return time.time_ns() // 1_000_000


class HalfMessageRef(NamedTuple):
    """Where an unended half message is, and whose it is."""

    queue_offset: int  # in the half queue: END_TRANSACTION's tranStateTableOffset
    physical_offset: int  # END_TRANSACTION's commitLogOffset
    producer_group: str
    transaction_id: str
    store_timestamp_ms: int


class TransactionService:
    """Half messages, END_TRANSACTION and the check service of one broker.

    Args:
        config: the transaction settings' keys (unless ``settings`` is given).
        store: where halves, op records and committed messages are.
        role: a slave keeps no transaction state and refuses END_TRANSACTION.
        stats: committed messages count as puts.
        topics: the transaction system topics get a config on first use.
        producers: the producer groups' connections the checks are sent over.
        schedule: the delay levels' count (a committed message may be delayed).
        config_dir: where transactionProgress.json lives.
        batches: makes the exactly-once part (tidemq.broker.exactly_once) on this service,
            which it sees as a ``HalfLedger``; the service and its check task call it back
            through ``PreparedBatches`` (batches.py) only.
        settings: timing; by default read from ``config``.
        clock_ms: wall-clock milliseconds; tests inject one to make halves old.

    Raises:
        ConfigFileCorrupt: transactionProgress.json and its .bak are both unreadable.
    """

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store: MessageStore,
        role: ReplicationRole,
        stats: BrokerStats,
        topics: TopicConfigManager,
        producers: ProducerManager,
        schedule: ScheduleMessageService,
        config_dir: Path,
        batches: Callable[[TransactionService], PreparedBatches],
        settings: TransactionSettings | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.store: MessageStore = store
        self._role = role
        self._stats = stats
        self._topics = topics
        self._producers = producers
        self._schedule = schedule
        self.settings = settings or TransactionSettings.from_broker_config(config)
        # Public so a test can swap in a fake clock after the controller built us.
        self.clock_ms: Callable[[], int] = clock_ms or wall_clock_ms
        self._progress_path = Path(config_dir) / PROGRESS_FILE_NAME
        self.progress = TransactionProgress(self._progress_path)
        self.progress.prepared.copies_max_bytes = self.settings.commit_cache_bytes
        self.writer = EndWriter(self)
        self.checker = TransactionChecker(self)
        self.end_processor = EndTransactionProcessor(self)
        self.batches: PreparedBatches = batches(self)
        self._restored_below = 0  # halves below this queue offset were stored before start
        self._started_ms = 0
        self._topics_ready: set[str] = set()
        self._ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._restored = False

    # -- lifecycle -------------------------------------------------------------------------

    def register(self, server: RemotingServer) -> None:
        """Register the END_TRANSACTION and exactly-once handlers on ``server``."""
        self.end_processor.register(server)

    @property
    def is_slave(self) -> bool:
        """True on a slave broker (no transaction state; END_TRANSACTION is refused)."""
        return self._role.is_slave

    @property
    def waits_for_slaves(self) -> bool:
        """True on a SYNC_MASTER with its HA service: commits wait for a slave."""
        replication = self._role.replication
        return replication is not None and replication.waits_for_slaves

    async def stored_status(self, result: PutResult) -> PutStatus:
        """``result`` on disk (SYNC_FLUSH) and on a slave (SYNC_MASTER), as a send waits."""
        return await self._role.stored_status(result, True)

    async def start(self) -> None:
        """Restore the progress (in a worker thread), then start the check and persist tasks."""
        if self._started:
            return
        self._started = True
        self._started_ms = self.clock_ms()
        if self.is_slave:
            self._ready.set()
            return
        try:
            await asyncio.to_thread(self._restore_once)
        finally:
            self._ready.set()
        self._start_tasks()

    def _start_tasks(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self.batches.finish_decided(),
                                            name="exactly-once-finish"))
        self._tasks.append(loop.create_task(self.checker.run(), name="transaction-check"))
        self._tasks.append(loop.create_task(self._persist_loop(), name="transaction-progress"))

    async def follow_role(self) -> None:
        """After a role switch (broker/role.py). A broker that became master rebuilds its
        progress from the half and op queues it holds now (copied while it was a slave;
        ``restore`` replays the op records from its own last checkpoint, or from the start)
        and starts the check; one that became slave stops it (its master checks)."""
        if not self._started:
            return
        if self.is_slave:
            tasks, self._tasks = self._tasks, []
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.writer.cancel_waits()
            return
        if self._tasks:
            return  # a master already (a repeated become_master)
        self.progress = TransactionProgress(self._progress_path)
        self.progress.prepared.copies_max_bytes = self.settings.commit_cache_bytes
        self._restored = False
        self._started_ms = self.clock_ms()
        self._ready.clear()
        try:
            await asyncio.to_thread(self._restore_once)
        finally:
            self._ready.set()
        self._start_tasks()

    async def shutdown(self) -> None:
        """Stop the tasks, write queued ends and the checkpoint (before the store closes); a
        checkpoint write that fails with a StoreError (a full disk) is logged, not raised."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._started and not self.is_slave:
            try:
                await self.persist()
            except StoreError as exc:
                # A full disk at shutdown: the next start replays the op queue from the last
                # saved checkpoint, so nothing is lost; the broker still closes its store.
                log.error("writing the transaction progress at shutdown failed: %s; the next "
                          "start replays the op queue from its last saved checkpoint", exc)
        await self.writer.cancel_waits()

    async def ready(self) -> None:
        """Wait until the progress is restored (END_TRANSACTION waits for this).

        A broker used without ``start`` (handlers called directly) restores here, once.
        """
        if not self._started:
            if not self.is_slave:
                self._restore_once()
            return
        await self._ready.wait()

    def _restore_once(self) -> None:
        if not self._restored:
            self._restored = True
            self.restore()

    async def persist(self) -> None:
        """Write the checkpoint if it changed: queued ends first, then a snapshot taken on
        the loop, written in a thread."""
        self.writer.flush()
        snapshot = self.progress.snapshot(self.op_queue_end())
        if snapshot is not None:
            await asyncio.to_thread(self.progress.write_snapshot, snapshot)
        await self.batches.write_decisions()  # applied marks are written lazily, here

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(PERSIST_INTERVAL_MS / 1000)
            try:
                await self.persist()
            except StoreError as exc:
                # A full disk or an unwritable config dir: the message names the file and
                # what to do; a traceback would only say it came from here.
                log.error("writing the transaction progress failed: %s; retrying in %d ms",
                          exc, PERSIST_INTERVAL_MS)
            except Exception:
                log.exception("writing the transaction progress failed; retrying in %d ms",
                              PERSIST_INTERVAL_MS)

    async def tick(self) -> int:
        """One scan-and-check round now (checker.py); returns ms until the next is due."""
        self._restore_once()  # done by start; a broker driven without start restores here
        return await self.checker.tick()

    # -- the send path ---------------------------------------------------------------------

    def prepare(self, message: StoreMessage) -> StoreMessage:
        """The message to store for a send: the half message when it is transactional.

        Called by the send path's ``redirect_special_delivery`` for every single message;
        returns ``message`` itself when it is not a transaction half (records.py rule).
        """
        if not is_half_message(message):
            return message
        self.ensure_topic(HALF_TOPIC)
        return to_half(message)

    # -- END_TRANSACTION -------------------------------------------------------------------

    async def end_transaction(
        self, header: EndTransactionRequestHeader, *, answer_wanted: bool = True
    ) -> EndAnswer | None:
        """Commit or roll back the half ``header`` names (docs/protocol.md §4.9).

        Args:
            answer_wanted: False for a oneway request: a decided end is then only queued
                for writing (end_writer.py) and SUCCESS returned without waiting for it.

        Returns:
            The answer once the end is written, or None for commitOrRollback 0 ("still
            unknown"), which RocketMQ leaves unanswered: the half stays pending.
        """
        kind = header.commit_or_rollback
        if kind == TRANSACTION_NOT_TYPE:
            return None
        wanted = _OUTCOME_OF_TYPE.get(kind)
        if wanted is None:
            return EndAnswer(
                ResponseCode.SYSTEM_ERROR,
                f"commitOrRollback is {kind}; expected 0 (unknown), 8 (commit) or 12 "
                "(rollback)",
            )
        half_offset = header.tran_state_table_offset
        queued = self.writer.queued_answer(half_offset)
        if queued is not None:
            await asyncio.shield(queued)  # the first end of this half is being written
        ended, outcome = self.progress.lookup(half_offset)
        if ended:
            if outcome is None:
                outcome = self._forgotten_outcome(header)
            return _repeated_end(half_offset, wanted, outcome, header.producer_group)
        half = self._find_half(header)
        if isinstance(half, EndAnswer):
            return half
        if wanted is Outcome.ROLLBACK:
            return await self._answer(self.writer.end(half, Outcome.ROLLBACK), answer_wanted)
        if self.committed_before_restart(half):
            self.writer.end_now(half, Outcome.COMMIT)
            return SUCCESS
        try:
            committed = self._delayed(committed_message(half))
        except (NotAHalfMessage, ValueError) as exc:
            return EndAnswer(ResponseCode.MESSAGE_ILLEGAL, f"cannot commit: {exc}")
        return await self._answer(self.writer.end(half, Outcome.COMMIT, committed),
                                  answer_wanted)

    @staticmethod
    async def _answer(answer: asyncio.Future[EndAnswer], wanted: bool) -> EndAnswer:
        # Nobody reads a oneway request's answer: do not hold its handler until the write.
        return await answer if wanted else SUCCESS

    def _find_half(self, header: EndTransactionRequestHeader) -> MessageExt | EndAnswer:
        """The half END_TRANSACTION names, or the SYSTEM_ERROR answer saying what is wrong
        (RocketMQ's remarks, with the values)."""
        where = (
            f"half offset {header.tran_state_table_offset}, commit-log offset "
            f"{header.commit_log_offset}, producer group {header.producer_group}"
        )
        record = self.store.read_message(header.commit_log_offset)
        if record is None:
            return EndAnswer(
                ResponseCode.SYSTEM_ERROR,
                f"Find prepared transaction message failed: no message is stored at {where} "
                "(expired, or the offsets are wrong)",
            )
        try:
            half = decode_record(record)
            real_destination(half)
        except (RemoteProtocolError, NotAHalfMessage) as exc:
            return EndAnswer(ResponseCode.SYSTEM_ERROR, f"The commit log offset wrong: {exc}")
        if half.physical_offset != header.commit_log_offset:
            return EndAnswer(
                ResponseCode.SYSTEM_ERROR,
                f"The commit log offset wrong: the record read at {where} says it is at "
                f"commit-log offset {half.physical_offset}",
            )
        group = half.properties.get(PROPERTY_PRODUCER_GROUP)
        if group != header.producer_group:
            return EndAnswer(
                ResponseCode.SYSTEM_ERROR,
                f"The producer group wrong: the half message at {where} belongs to producer "
                f"group {group}",
            )
        if half.queue_offset != header.tran_state_table_offset:
            return EndAnswer(
                ResponseCode.SYSTEM_ERROR,
                f"The transaction state table offset wrong: the half message at {where} has "
                f"half offset {half.queue_offset}",
            )
        return half

    def _delayed(self, message: StoreMessage) -> StoreMessage:
        # A commit-type message with DELAY waits in SCHEDULE_TOPIC_XXXX, as in RocketMQ.
        if PROPERTY_DELAY_TIME_LEVEL not in message.properties:
            return message
        return redirect_delayed(message, self._schedule.level_count)

    def _forgotten_outcome(self, header: EndTransactionRequestHeader) -> Outcome | None:
        """The outcome of a half that ended too long ago to be remembered: COMMIT when its
        committed copy is in the index, else None (rolled back, discarded, or no index)."""
        half = self._find_half(header)
        if isinstance(half, EndAnswer) or not self._has_committed_copy(half, quiet=True):
            return None
        return Outcome.COMMIT

    def committed_before_restart(self, half: MessageExt) -> bool:
        """True when a half stored before this start already has a committed copy."""
        if not self.stored_before_start(half.queue_offset):
            return False
        return self._has_committed_copy(half)

    def _has_committed_copy(self, half: MessageExt, *, quiet: bool = False) -> bool:
        """True when the index holds the committed copy of ``half`` (records.py)."""
        if not half.unique_key:
            return False
        topic, _ = real_destination(half)
        found = self.store.query_messages(
            topic, half.unique_key, COMMITTED_COPY_QUERY_MAX, half.store_timestamp, _TIME_MAX_MS
        )
        for record in found.records:
            try:
                copy = decode_record(record)
            except RemoteProtocolError:
                continue
            if (
                copy.transaction_type == TRANSACTION_COMMIT_TYPE
                and copy.prepared_transaction_offset == half.physical_offset
            ):
                if not quiet:
                    log.warning(
                        "half offset %d of producer group %s was committed before the broker "
                        "stopped (as %s offset %d) but its op record was lost; it is not "
                        "committed again",
                        half.queue_offset, half.properties.get(PROPERTY_PRODUCER_GROUP),
                        copy.topic, copy.queue_offset,
                    )
                return True
        return False

    # -- queries ---------------------------------------------------------------------------

    def outcome(self, half_queue_offset: int) -> tuple[bool, Outcome | None]:
        """``(ended, outcome)`` of the half at ``half_queue_offset``; the outcome is None
        when it has not ended, or ended so long ago that it is no longer remembered."""
        return self.progress.lookup(half_queue_offset)

    def find_half(self, producer_group: str, transaction_id: str) -> HalfMessageRef | None:
        """The unended half of ``producer_group`` whose transaction id is ``transaction_id``.

        The transaction id is the half's ``__transactionId__`` property, else its UNIQ_KEY.
        Halves the scan has not reached yet are read from the store (on this thread).
        """
        pending = self.progress.find_pending(producer_group, transaction_id)
        if pending is not None:
            return HalfMessageRef(
                pending.queue_offset, pending.physical_offset, pending.producer_group,
                pending.transaction_id, pending.store_timestamp_ms,
            )
        progress = self.progress
        for queue_offset, half in self._read_queue(HALF_TOPIC, progress.scan_offset):
            if progress.lookup(queue_offset)[0]:
                continue
            properties = half.properties
            if (
                properties.get(PROPERTY_PRODUCER_GROUP) == producer_group
                and transaction_id_of(properties) == transaction_id
            ):
                return HalfMessageRef(
                    queue_offset, half.physical_offset, producer_group, transaction_id,
                    half.store_timestamp,
                )
        return None

    # -- restore ---------------------------------------------------------------------------

    def restore(self) -> None:
        """Rebuild the progress from the checkpoint and the op records (progress.py).

        Runs once, before the check task and before END_TRANSACTION is served.
        """
        store = self.store
        progress = self.progress
        half_min = store.min_offset(HALF_TOPIC, HALF_QUEUE_ID)
        half_max = store.max_offset(HALF_TOPIC, HALF_QUEUE_ID)
        op_min = store.min_offset(OP_TOPIC, HALF_QUEUE_ID)
        op_max = store.max_offset(OP_TOPIC, HALF_QUEUE_ID)
        checkpoint = progress.loaded or Checkpoint(half_min, op_min)
        if checkpoint.half_scan_offset > half_max:
            log.warning(
                "transaction progress says %d half messages were scanned, but the half queue "
                "holds only %d (its tail was lost?); scanning from %d",
                checkpoint.half_scan_offset, half_max, half_max,
            )
        scan = min(max(checkpoint.half_scan_offset, half_min), half_max)
        progress.scan_offset = scan
        self._restored_below = half_max
        check_times = {
            h: n for h, n in checkpoint.pending_check_times.items() if half_min <= h < scan
        }
        self._restore_prepared(checkpoint.prepared_ranges, half_min)
        prepared = progress.prepared
        replay_from = min(max(checkpoint.op_replay_offset, op_min), op_max)
        replayed = 0
        for op_offset, op in self._read_queue(OP_TOPIC, replay_from):
            outcome = op_outcome(op)
            for half_offset in op_half_offsets(op):
                if (half_offset in check_times or half_offset >= scan
                        or (prepared and prepared.find(half_offset) is not None)):
                    check_times.pop(half_offset, None)
                    progress.end(half_offset, outcome, op_offset)
                    replayed += 1
        for half_offset, times in sorted(check_times.items()):
            half = self._read_half(half_offset)
            if half is not None:
                self.track(half, times)
        if half_max or op_max:
            log.info(
                "transactions restored: %d half messages, scan at %d, %d pending, %d ended "
                "by op records replayed from op offset %d",
                half_max, scan, len(progress.pending), replayed, replay_from,
            )

    def _restore_prepared(self, spans: list[tuple[int, int]], half_min: int) -> None:
        """Track the checkpoint's open exactly-once ranges again (prepared_ranges.py): the
        identity and store time come from each range's first half."""
        for first, count in spans:
            if first < half_min:
                continue  # retention removed (part of) it: its halves end as they are met
            half = self._read_half(first)
            identity = self.batches.identity(half) if half is not None else None
            if half is None or identity is None:
                log.warning("exactly-once halves at offsets %d-%d are no longer readable; "
                            "they are not tracked", first, first + count - 1)
                continue
            due_ms = half.store_timestamp + self.immunity_ms(half.properties)
            if self.stored_before_start(first):
                due_ms = max(due_ms, self._started_ms + self.settings.check_interval_ms)
            query_id, batch_text, writer_id = identity
            self.progress.prepared.add(PreparedRange(
                first=first, count=count, query_id=query_id, batch_text=batch_text,
                writer_id=writer_id,
                producer_group=half.properties.get(PROPERTY_PRODUCER_GROUP, ""),
                due_ms=due_ms,
            ))

    def _read_queue(self, topic: str, start: int) -> Iterator[tuple[int, MessageExt]]:
        """``(queue offset, record)`` of queue 0 of ``topic`` from ``start`` to its end."""
        offset = start
        while True:
            result = self.store.get_messages(
                topic, HALF_QUEUE_ID, offset, READ_BATCH_COUNT, READ_BATCH_BYTES
            )
            if result.status is not GetStatus.FOUND:
                if result.next_begin_offset > offset and result.status in (
                    GetStatus.OFFSET_TOO_SMALL, GetStatus.MESSAGE_WAS_REMOVING,
                    GetStatus.OFFSET_FOUND_NULL,
                ):
                    offset = result.next_begin_offset
                    continue
                return
            try:
                for record in iter_records(result.body):
                    yield record.queue_offset, record
                    offset = record.queue_offset + 1
            except RemoteProtocolError as exc:
                log.error("%s offset %d does not decode (%s); skipped", topic, offset, exc)
                offset += 1
                continue
            offset = max(offset, result.next_begin_offset)

    def _read_half(self, half_offset: int) -> MessageExt | None:
        result = self.store.get_messages(HALF_TOPIC, HALF_QUEUE_ID, half_offset, 1,
                                         READ_BYTES_MAX)
        if result.status is not GetStatus.FOUND:
            return None
        try:
            half = decode_record(result.body)
        except RemoteProtocolError:
            return None
        return half if half.queue_offset == half_offset else None

    # -- what the checker and the writer use ------------------------------------------------

    def stored_before_start(self, half_offset: int) -> bool:
        """True for a half stored before this broker started (a crash may have cut its end)."""
        return half_offset < self._restored_below

    def track(self, half: MessageExt, check_times: int = 0) -> None:
        """Make ``half`` pending, first due after its immunity (module docstring)."""
        properties = half.properties
        due_ms = half.store_timestamp + self.immunity_ms(properties)
        if self.stored_before_start(half.queue_offset):
            due_ms = max(due_ms, self._started_ms + self.settings.check_interval_ms)
        self.progress.add_pending(
            PendingHalf(
                queue_offset=half.queue_offset,
                physical_offset=half.physical_offset,
                store_timestamp_ms=half.store_timestamp,
                producer_group=properties.get(PROPERTY_PRODUCER_GROUP, ""),
                transaction_id=transaction_id_of(properties),
                check_times=check_times,
                next_check_ms=due_ms,
            )
        )

    def immunity_ms(self, properties: dict[str, str]) -> int:
        """How long after its store time a half is first due: CHECK_IMMUNITY_TIME_IN_SECONDS
        in ms, else transactionTimeOut."""
        text = properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, "").strip()
        if text.isdigit():
            return int(text) * 1000
        return self.settings.timeout_ms  # absent, -1 (RocketMQ's "use the default") or junk

    def reopen(self, half: MessageExt) -> None:
        """Undo the end of ``half`` whose commit could not be stored: it is checked again."""
        self.progress.ended.pop(half.queue_offset, None)
        if half.queue_offset < self.progress.scan_offset:
            self.track(half)
            pending = self.progress.pending[half.queue_offset]
            self.progress.reschedule(pending, self.clock_ms() + self.settings.check_interval_ms)

    def end_missing(self, pending: PendingHalf) -> None:
        """End a pending half whose record is gone (retention) as DISCARD, without a copy."""
        self.writer.end_offset_now(pending.queue_offset, Outcome.DISCARD,
                                   pending.producer_group, pending.transaction_id)

    def live_producers(self, group: str) -> list[ClientChannel]:
        """The connected producers of ``group`` (ProducerManager)."""
        return [
            channel for channel in self._producers.channels(group)
            if not channel.connection.is_closing
        ]

    def op_queue_end(self) -> int:
        """The op queue's next offset: a lower bound of where an op written now lands."""
        return self.store.max_offset(OP_TOPIC, HALF_QUEUE_ID)

    @property
    def broker_stats(self) -> BrokerStats:
        """The broker's put counters (committed messages count as puts)."""
        return self._stats

    def ensure_topic(self, topic: str) -> None:
        """Give a transaction system topic a config (1 queue, read/write) on first use, as
        RocketMQ's transaction bridge does, so admin tools list it."""
        if topic in self._topics_ready:
            return
        self._topics.create_topic_for_send_back(
            topic, 1, PERM_READ | PERM_WRITE
        )
        self._topics_ready.add(topic)


def _repeated_end(
    half_offset: int, wanted: Outcome, outcome: Outcome | None, group: str
) -> EndAnswer:
    """The answer to END_TRANSACTION for a half that already ended: nothing is written."""
    if outcome is wanted:
        return EndAnswer(
            ResponseCode.SUCCESS,
            f"half offset {half_offset} was already {_ENDED_WORDS[wanted]}; nothing changed",
        )
    if outcome is None and wanted is Outcome.ROLLBACK:
        return EndAnswer(
            ResponseCode.SUCCESS,
            f"half offset {half_offset} has already ended without a commit; nothing changed",
        )
    if outcome is None:
        return EndAnswer(
            ResponseCode.SYSTEM_ERROR,
            f"the transaction of half offset {half_offset} (producer group {group}) has "
            f"already ended without a commit (rolled back, or discarded after its checks); it "
            f"cannot be {_ENDED_WORDS[wanted]} now",
        )
    return EndAnswer(
        ResponseCode.SYSTEM_ERROR,
        f"the transaction of half offset {half_offset} (producer group {group}) was already "
        f"{_ENDED_WORDS[outcome]}; it cannot be {_ENDED_WORDS[wanted]} now",
    )


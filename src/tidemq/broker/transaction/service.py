"""Transactional messages on the broker: half messages, how they end, and the check service.

Theory of operation
-------------------
*Half.* A producer sends a message with ``TRAN_MSG=true`` (and its group in PGROUP). The
send path's hook calls ``prepare``: the message is stored as a *half* in
RMQ_SYS_TRANS_HALF_TOPIC queue 0 with its real topic and queue in REAL_TOPIC / REAL_QID
(records.py). No consumer subscribes to that topic, so nobody sees it. The producer gets the
half's offset msg id and half-queue offset back, runs its local transaction, and ends it.

*End.* END_TRANSACTION (oneway, protocol-notes §4.9) names the half by half-queue offset and
commit-log offset. ``end_transaction`` reads the half there and checks that it is one, of
that producer group, at that offset. Commit stores the committed message in the real topic
and queue (a DELAY on it is honoured), then writes an op record; rollback only writes the
op record. The op record (RMQ_SYS_TRANS_OP_HALF_TOPIC, tag ``d``, body = the half's queue
offset) is what makes the end permanent. Both writes happen in one synchronous step on the
event loop, so no other request runs between them.

*Exactly once.* Each half ends at most once. An END_TRANSACTION or a check answer for a half
that already ended writes nothing: a repeat of the same outcome is answered SUCCESS, a
contradiction SYSTEM_ERROR naming what happened first. ``progress.py`` answers "has this
half ended?" for every offset. The one gap a crash can open is a commit stored with its op
record not yet written (SIGKILL between the two puts). So for a half stored before this
broker started, the service first looks in the index for a committed copy of it (the real
topic under the half's UNIQ_KEY, with PREPAREDTRANSACTIONOFFSET = the half's commit-log
offset). If one is found, the half ends as committed without a second copy. It does so
before committing that half again, and when the scan meets it. With messageIndexEnable=false
the index cannot be searched and this guard is off.

*Checks.* One asyncio task on the broker's loop ticks at least once a second:

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
and at shutdown. ``restore`` (run before the first tick, in a worker thread; END_TRANSACTION
waits for it) replays the op records written since. After any crash, a half that ended
stays ended and an unended half is checked again. Check counts of halves that became
pending after the last checkpoint start again at 0.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from tidemq.broker.config import PERM_READ, PERM_WRITE, BrokerRole
from tidemq.broker.transaction.progress import (
    PROGRESS_FILE_NAME,
    Checkpoint,
    PendingHalf,
    TransactionProgress,
)
from tidemq.broker.transaction.records import (
    DISCARD_TOPIC,
    HALF_QUEUE_ID,
    HALF_TOPIC,
    OP_TOPIC,
    NotAHalfMessage,
    Outcome,
    check_request,
    committed_message,
    discarded_message,
    is_half_message,
    op_half_offsets,
    op_message,
    op_outcome,
    real_destination,
    to_half,
    transaction_id_of,
)
from tidemq.errors import ProtocolError, RemoteProtocolError
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.headers import EndTransactionRequestHeader
from tidemq.protocol.message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    MessageExt,
    decode_record,
    iter_records,
)
from tidemq.remoting.errors import RemotingError
from tidemq.store.interface import GetStatus, PutStatus, StoreMessage

if TYPE_CHECKING:
    from tidemq.broker.controller import BrokerController
    from tidemq.remoting.server import RemotingServer

log = logging.getLogger("tidemq.broker")

# RocketMQ's BrokerConfig defaults (protocol-notes §11.1).
TRANSACTION_TIMEOUT_MS = 6_000  # transactionTimeOut: no check before a half is this old
TRANSACTION_CHECK_INTERVAL_MS = 60_000  # transactionCheckInterval: between checks of a half
TRANSACTION_CHECK_MAX = 15  # transactionCheckMax: then the half is discarded

# A half is looked at once it is this old: nearly every half ends well within it, so a
# steady stream of transactions costs no reads (and transactionTimeOut is rarely below it).
SCAN_AGE_MIN_MS = 1_000
# The check task's longest sleep; it bounds how late a scan or check can run.
TICK_INTERVAL_MAX_MS = 1_000
# Shortest sleep between ticks, so a burst of near-due checks cannot spin.
TICK_INTERVAL_MIN_MS = 50
# Work per tick before yielding to the loop (sends and pulls go on meanwhile).
SCAN_READS_PER_TICK_MAX = 1_024
CHECKS_PER_TICK_MAX = 512
# The checkpoint is written this often (and at shutdown); RocketMQ persists consumer offsets,
# which hold its transaction progress, every 5 s.
PERSIST_INTERVAL_MS = 5_000
# A oneway check waits at most this long for room in a slow producer's write buffer.
CHECK_SEND_TIMEOUT_MS = 3_000
# One read of the op or half queue while restoring: messages and bytes.
READ_BATCH_COUNT = 32
READ_BATCH_BYTES = 1024 * 1024
# Records looked at when searching the index for a committed copy of a half.
COMMITTED_COPY_QUERY_MAX = 64
_TIME_MAX_MS = (1 << 63) - 1

_STORED = frozenset({PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT})
_FAILED_PUT_CODES = {
    PutStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
}
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


@dataclass(frozen=True, slots=True)
class TransactionSettings:
    """The check service's timing (RocketMQ BrokerConfig keys in brackets).

    Attributes:
        timeout_ms: a half is first checked once this old [transactionTimeOut].
        check_interval_ms: time between checks of one half [transactionCheckInterval].
        check_max: checks sent before a half is discarded [transactionCheckMax].
    """

    timeout_ms: int = TRANSACTION_TIMEOUT_MS
    check_interval_ms: int = TRANSACTION_CHECK_INTERVAL_MS
    check_max: int = TRANSACTION_CHECK_MAX

    @classmethod
    def from_broker_config(cls, config: object) -> TransactionSettings:
        """The settings a BrokerConfig declares (``transaction_timeout_ms``,
        ``transaction_check_interval_ms``, ``transaction_check_max``); RocketMQ's defaults
        for any it does not declare."""
        return cls(
            timeout_ms=getattr(config, "transaction_timeout_ms", TRANSACTION_TIMEOUT_MS),
            check_interval_ms=getattr(
                config, "transaction_check_interval_ms", TRANSACTION_CHECK_INTERVAL_MS
            ),
            check_max=getattr(config, "transaction_check_max", TRANSACTION_CHECK_MAX),
        )


class HalfMessageRef(NamedTuple):
    """Where an unended half message is, and whose it is."""

    queue_offset: int  # in the half queue: END_TRANSACTION's tranStateTableOffset
    physical_offset: int  # END_TRANSACTION's commitLogOffset
    producer_group: str
    transaction_id: str
    store_timestamp_ms: int


class EndAnswer(NamedTuple):
    """END_TRANSACTION's response: a ResponseCode and a remark (None when all went well)."""

    code: int
    remark: str | None = None


_SUCCESS = EndAnswer(ResponseCode.SUCCESS)


class TransactionService:
    """Half messages, END_TRANSACTION and the check service of one broker.

    Args:
        broker: the BrokerController (``store``, ``config``, ``config_dir``,
            ``topic_config_manager``, ``producer_manager``, ``schedule_service``).
        settings: timing; by default read from the broker's config.
        clock_ms: wall-clock milliseconds; tests inject one to make halves old.

    Raises:
        ConfigFileCorrupt: transactionProgress.json and its .bak are both unreadable.
    """

    def __init__(
        self,
        broker: BrokerController,
        *,
        settings: TransactionSettings | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        from tidemq.broker.transaction.end_processor import EndTransactionProcessor

        self._broker = broker
        self._store = broker.store
        self.settings = settings or TransactionSettings.from_broker_config(broker.config)
        # Public so a test can swap in a fake clock after the controller built us.
        self.clock_ms: Callable[[], int] = clock_ms or wall_clock_ms
        self.progress = TransactionProgress(Path(broker.config_dir) / PROGRESS_FILE_NAME)
        self.end_processor = EndTransactionProcessor(self)
        self._restored_below = 0  # halves below this queue offset were stored before start
        self._started_ms = 0
        self._topics_ready: set[str] = set()
        self._ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False

    # -- lifecycle -------------------------------------------------------------------------

    def register(self, server: RemotingServer) -> None:
        """Register the END_TRANSACTION handler on ``server``."""
        self.end_processor.register(server)

    @property
    def is_slave(self) -> bool:
        """True on a slave broker (no transaction state; END_TRANSACTION is refused)."""
        return self._broker.config.broker_role is BrokerRole.SLAVE

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
            await asyncio.to_thread(self.restore)
        finally:
            self._ready.set()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._check_loop(), name="transaction-check"))
        self._tasks.append(loop.create_task(self._persist_loop(), name="transaction-progress"))

    async def shutdown(self) -> None:
        """Stop the tasks and write the checkpoint (call before the store closes)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._started and not self.is_slave:
            await self.persist()

    async def ready(self) -> None:
        """Wait until the progress is restored (END_TRANSACTION waits for this)."""
        await self._ready.wait()

    async def persist(self) -> None:
        """Write the checkpoint if it changed: snapshot on the loop, write in a thread."""
        snapshot = self.progress.snapshot(self._store.max_offset(OP_TOPIC, HALF_QUEUE_ID))
        if snapshot is not None:
            await asyncio.to_thread(self.progress.write_snapshot, snapshot)

    # -- the send path ---------------------------------------------------------------------

    def prepare(self, message: StoreMessage) -> StoreMessage:
        """The message to store for a send: the half message when it is transactional.

        Called by the send path's ``redirect_special_delivery`` for every single message;
        returns ``message`` itself when it is not a transaction half (records.py rule).
        """
        if not is_half_message(message):
            return message
        self._ensure_topic(HALF_TOPIC)
        return to_half(message)

    # -- END_TRANSACTION -------------------------------------------------------------------

    def end_transaction(self, header: EndTransactionRequestHeader) -> EndAnswer | None:
        """Commit or roll back the half ``header`` names (protocol-notes §4.9).

        Returns:
            The answer, or None for commitOrRollback 0 ("still unknown"), which RocketMQ
            leaves unanswered: the half stays pending and is checked later.
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
        ended, outcome = self.progress.lookup(half_offset)
        if ended:
            return _repeated_end(half_offset, wanted, outcome, header.producer_group)
        half_or_answer = self._find_half(header)
        if isinstance(half_or_answer, EndAnswer):
            return half_or_answer
        half = half_or_answer
        if wanted is Outcome.COMMIT:
            if self._committed_before_restart(half):
                self._end(half, Outcome.COMMIT)
                return _SUCCESS
            failure = self._store_committed(half)
            if failure is not None:
                return failure
        self._end(half, wanted)
        return _SUCCESS

    def _find_half(self, header: EndTransactionRequestHeader) -> MessageExt | EndAnswer:
        """The half END_TRANSACTION names, or the SYSTEM_ERROR answer saying what is wrong
        (RocketMQ's remarks, with the values)."""
        where = (
            f"half offset {header.tran_state_table_offset}, commit-log offset "
            f"{header.commit_log_offset}, producer group {header.producer_group}"
        )
        record = self._store.read_message(header.commit_log_offset)
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

    def _store_committed(self, half: MessageExt) -> EndAnswer | None:
        """Store the committed copy of ``half``; None when stored, else the failure answer."""
        try:
            message = self._delayed(committed_message(half))
        except (NotAHalfMessage, ValueError) as exc:
            return EndAnswer(ResponseCode.MESSAGE_ILLEGAL, f"cannot commit: {exc}")
        started = time.monotonic()
        result = self._store.put_message(message)
        if result.status in _STORED:
            elapsed_ms = int((time.monotonic() - started) * 1000)
            self._broker.stats.record_put(1, len(message.body), elapsed_ms)
            return None
        self._broker.stats.record_put_failure()
        log.warning(
            "commit of half offset %d to %s queue %d failed: %s %s",
            half.queue_offset, message.topic, message.queue_id, result.status.value,
            result.remark,
        )
        return EndAnswer(
            _FAILED_PUT_CODES.get(result.status, ResponseCode.SYSTEM_ERROR),
            f"the committed message for topic {message.topic} could not be stored "
            f"({result.status.value}: {result.remark}); the half stays pending and is "
            "checked again",
        )

    def _delayed(self, message: StoreMessage) -> StoreMessage:
        # A commit-type message with DELAY waits in SCHEDULE_TOPIC_XXXX, as in RocketMQ.
        from tidemq.broker.schedule_service import redirect_delayed

        schedule_service = getattr(self._broker, "schedule_service", None)
        if schedule_service is None:
            return message
        return redirect_delayed(message, schedule_service.level_count)

    def _end(self, half: MessageExt, outcome: Outcome) -> None:
        """Write the op record ending ``half`` and record the end (even if the write fails:
        the index guard of a restart covers a commit whose op record is missing)."""
        group = half.properties.get(PROPERTY_PRODUCER_GROUP)
        transaction_id = transaction_id_of(half.properties)
        op_offset = self._write_op(half.queue_offset, outcome, group, transaction_id)
        self.progress.end(half.queue_offset, outcome, op_offset)

    def _write_op(
        self, half_offset: int, outcome: Outcome, group: str | None, transaction_id: str
    ) -> int:
        self._ensure_topic(OP_TOPIC)
        result = self._store.put_message(op_message(half_offset, outcome, group, transaction_id))
        if result.status in _STORED:
            return result.queue_offset
        log.error(
            "op record for half offset %d (%s) could not be stored: %s %s; the end holds until "
            "the broker restarts, then the half is checked again",
            half_offset, outcome.value, result.status.value, result.remark,
        )
        return self._store.max_offset(OP_TOPIC, HALF_QUEUE_ID)

    def _committed_before_restart(self, half: MessageExt) -> bool:
        """True when a half stored before this start already has a committed copy."""
        if half.queue_offset >= self._restored_below or not half.unique_key:
            return False
        topic, _ = real_destination(half)
        found = self._store.query_messages(
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
            return _ref(pending)
        progress = self.progress
        for queue_offset, half in self._read_half_queue(progress.scan_offset):
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
        store = self._store
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
        replay_from = min(max(checkpoint.op_replay_offset, op_min), op_max)
        replayed = 0
        for op_offset, op in self._read_queue(OP_TOPIC, replay_from):
            outcome = op_outcome(op)
            for half_offset in op_half_offsets(op):
                if half_offset in check_times or half_offset >= scan:
                    check_times.pop(half_offset, None)
                    progress.end(half_offset, outcome, op_offset)
                    replayed += 1
        for half_offset, times in sorted(check_times.items()):
            half = self._read_half(half_offset)
            if half is not None:
                self._track(half, times)
        if half_max or op_max:
            log.info(
                "transactions restored: %d half messages, scan at %d, %d pending, %d ended "
                "by op records replayed from op offset %d",
                half_max, scan, len(progress.pending), replayed, replay_from,
            )

    def _read_queue(self, topic: str, start: int) -> Iterator[tuple[int, MessageExt]]:
        """``(queue offset, record)`` of queue 0 of ``topic`` from ``start`` to its end."""
        offset = start
        while True:
            result = self._store.get_messages(
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

    def _read_half_queue(self, start: int) -> Iterator[tuple[int, MessageExt]]:
        return self._read_queue(HALF_TOPIC, start)

    def _read_half(self, half_offset: int) -> MessageExt | None:
        result = self._store.get_messages(
            HALF_TOPIC, HALF_QUEUE_ID, half_offset, 1, READ_BATCH_BYTES
        )
        if result.status is not GetStatus.FOUND:
            return None
        try:
            half = decode_record(result.body)
        except RemoteProtocolError:
            return None
        return half if half.queue_offset == half_offset else None

    def _track(self, half: MessageExt, check_times: int = 0) -> None:
        """Make ``half`` pending, first due after its immunity (module docstring)."""
        properties = half.properties
        due_ms = half.store_timestamp + self._immunity_ms(properties)
        if half.queue_offset < self._restored_below:
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

    def _immunity_ms(self, properties: dict[str, str]) -> int:
        text = properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS, "").strip()
        if text.isdigit():
            return int(text) * 1000
        return self.settings.timeout_ms  # absent, -1 (RocketMQ's "use the default") or junk

    # -- the check task --------------------------------------------------------------------

    def scan(self, now_ms: int) -> bool:
        """Step 1 of the module docstring: move the scan offset over the half queue.

        Returns:
            True when work is left for the next tick (the read budget ran out).
        """
        progress = self.progress
        ended = progress.ended
        end = self._store.max_offset(HALF_TOPIC, HALF_QUEUE_ID)
        offset = progress.scan_offset
        reads = 0
        try:
            while offset < end:
                if offset in ended:
                    offset += 1
                    continue
                if reads >= SCAN_READS_PER_TICK_MAX:
                    return True
                reads += 1
                result = self._store.get_messages(
                    HALF_TOPIC, HALF_QUEUE_ID, offset, 1, READ_BATCH_BYTES
                )
                if result.status is not GetStatus.FOUND:
                    if result.next_begin_offset > offset:
                        log.warning("half queue offset %d is unreadable (%s); continuing at %d",
                                    offset, result.status.value, result.next_begin_offset)
                        offset = result.next_begin_offset
                        continue
                    return False
                try:
                    half = decode_record(result.body)
                except RemoteProtocolError as exc:
                    log.error("half queue offset %d does not decode (%s); skipped", offset, exc)
                    offset += 1
                    continue
                restored = offset < self._restored_below
                if not restored and now_ms - half.store_timestamp < SCAN_AGE_MIN_MS:
                    return False
                if restored and self._committed_before_restart(half):
                    self._end(half, Outcome.COMMIT)
                else:
                    self._track(half)
                offset += 1
            return False
        finally:
            progress.scan_offset = offset

    async def run_checks(self, now_ms: int) -> bool:
        """Steps 2 and 3 of the module docstring for every pending half due at ``now_ms``.

        Returns:
            True when due checks are left for the next tick (the budget ran out).
        """
        progress = self.progress
        for _ in range(CHECKS_PER_TICK_MAX):
            half = progress.pop_due(now_ms)
            if half is None:
                return False
            if half.check_times >= self.settings.check_max:
                self._discard(half, now_ms)
                continue
            half.check_times += 1
            progress.reschedule(half, now_ms + self.settings.check_interval_ms)
            await self._send_check(half)
        return True

    async def _send_check(self, pending: PendingHalf) -> None:
        half = self._read_stored_half(pending)
        if half is None:
            return
        try:
            request = check_request(half)
        except NotAHalfMessage as exc:
            log.error("half offset %d cannot be checked: %s; discarded", pending.queue_offset,
                      exc)
            self._end_unreadable(pending)
            return
        group = pending.producer_group
        channels = [
            channel for channel in self._broker.producer_manager.channels(group)
            if not channel.connection.is_closing
        ]
        if not channels:
            log.warning(
                "no producer of group %s is connected to check half offset %d (transaction "
                "%s); check %d of %d counted anyway",
                group, pending.queue_offset, pending.transaction_id, pending.check_times,
                self.settings.check_max,
            )
            return
        channel = channels[pending.check_times % len(channels)]
        try:
            await channel.connection.send_oneway(request, CHECK_SEND_TIMEOUT_MS)
        except (RemotingError, ProtocolError) as exc:
            log.warning("check of half offset %d to producer %s failed: %s",
                        pending.queue_offset, channel.client_id, exc)
            return
        log.debug("checked half offset %d (transaction %s) with producer %s, check %d of %d",
                  pending.queue_offset, pending.transaction_id, channel.client_id,
                  pending.check_times, self.settings.check_max)

    def _read_stored_half(self, pending: PendingHalf) -> MessageExt | None:
        """The half's record; a half retention deleted is ended (DISCARD) and None returned."""
        record = self._store.read_message(pending.physical_offset)
        try:
            half = decode_record(record) if record is not None else None
        except RemoteProtocolError:
            half = None
        if half is None or half.topic != HALF_TOPIC:
            log.warning("half offset %d (producer group %s) is no longer stored; it ends "
                        "unanswered", pending.queue_offset, pending.producer_group)
            self._end_unreadable(pending)
            return None
        return half

    def _end_unreadable(self, pending: PendingHalf) -> None:
        op_offset = self._write_op(pending.queue_offset, Outcome.DISCARD, pending.producer_group,
                                   pending.transaction_id)
        self.progress.end(pending.queue_offset, Outcome.DISCARD, op_offset)

    def _discard(self, pending: PendingHalf, now_ms: int) -> None:
        half = self._read_stored_half(pending)
        if half is None:
            return
        if self._committed_before_restart(half):
            self._end(half, Outcome.COMMIT)
            return
        self._ensure_topic(DISCARD_TOPIC)
        result = self._store.put_message(discarded_message(half))
        if result.status not in _STORED and result.status is not PutStatus.MESSAGE_ILLEGAL:
            log.warning("half offset %d could not be copied to %s (%s); trying again in %d ms",
                        pending.queue_offset, DISCARD_TOPIC, result.status.value,
                        self.settings.check_interval_ms)
            self.progress.reschedule(pending, now_ms + self.settings.check_interval_ms)
            return
        log.warning(
            "half message at offset %d of producer group %s (transaction %s, topic %s) got no "
            "answer to %d checks (transactionCheckMax); discarded to %s",
            pending.queue_offset, pending.producer_group, pending.transaction_id,
            half.properties.get(PROPERTY_REAL_TOPIC), pending.check_times, DISCARD_TOPIC,
        )
        self._end(half, Outcome.DISCARD)

    async def tick(self) -> int:
        """One round of scan and checks; returns how long to sleep before the next (ms)."""
        now_ms = self.clock_ms()
        more = self.scan(now_ms)
        more = await self.run_checks(now_ms) or more
        if more:
            return 0
        next_due = self.progress.next_due_ms()
        if next_due is None:
            return TICK_INTERVAL_MAX_MS
        return max(TICK_INTERVAL_MIN_MS, min(next_due - now_ms, TICK_INTERVAL_MAX_MS))

    async def _check_loop(self) -> None:
        while True:
            try:
                wait_ms = await self.tick()
            except Exception:
                log.exception("transaction check round failed; retrying in %d ms",
                              TICK_INTERVAL_MAX_MS)
                wait_ms = TICK_INTERVAL_MAX_MS
            await asyncio.sleep(wait_ms / 1000)

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(PERSIST_INTERVAL_MS / 1000)
            try:
                await self.persist()
            except Exception:
                log.exception("writing the transaction progress failed; retrying in %d ms",
                              PERSIST_INTERVAL_MS)

    # -- topics ----------------------------------------------------------------------------

    def _ensure_topic(self, topic: str) -> None:
        # The system topics get a config (1 queue, read/write) on first use, as RocketMQ's
        # transaction bridge creates them, so admin tools list them.
        if topic in self._topics_ready:
            return
        self._broker.topic_config_manager.create_topic_for_send_back(
            topic, 1, PERM_READ | PERM_WRITE
        )
        self._topics_ready.add(topic)


def _ref(pending: PendingHalf) -> HalfMessageRef:
    return HalfMessageRef(
        pending.queue_offset, pending.physical_offset, pending.producer_group,
        pending.transaction_id, pending.store_timestamp_ms,
    )


def _repeated_end(
    half_offset: int, wanted: Outcome, outcome: Outcome | None, group: str
) -> EndAnswer:
    """The answer to END_TRANSACTION for a half that already ended: nothing is written."""
    if outcome is wanted:
        return EndAnswer(
            ResponseCode.SUCCESS,
            f"half offset {half_offset} was already {_ENDED_WORDS[wanted]}; nothing changed",
        )
    if outcome is None:
        return EndAnswer(
            ResponseCode.SYSTEM_ERROR,
            f"the transaction of half offset {half_offset} (producer group {group}) has "
            f"already ended; it cannot be {_ENDED_WORDS[wanted]} now",
        )
    return EndAnswer(
        ResponseCode.SYSTEM_ERROR,
        f"the transaction of half offset {half_offset} (producer group {group}) was already "
        f"{_ENDED_WORDS[outcome]}; it cannot be {_ENDED_WORDS[wanted]} now",
    )


"""Delayed delivery: messages wait in SCHEDULE_TOPIC_XXXX until due, then go to their topic.

Theory of operation
-------------------
*Storing* (``redirect_delayed``; the send path and the send-back path call it): a message
whose DELAY property is a level n > 0, and which is not a transaction half message, keeps
its topic and queue in REAL_TOPIC / REAL_QID and is stored in SCHEDULE_TOPIC_XXXX queue
n - 1, n capped at the number of configured levels (messageDelayLevel; above the last
level means the last, as in RocketMQ, and DELAY is rewritten to the capped level). The store
writes the delivery time (store time + the level's delay) into the consume-queue tag code.

*Delivering*: one asyncio task per level on the broker's event loop (store calls are quick
mmap work, so no threads). A tick reads the level's queue from its delay offset, a batch at
a time. For each record, due = store time + the level's delay, computed from the record's
DELAY and store time by the store's own function, so it equals the tag code. A due record
is rebuilt for its real topic and queue (REAL_TOPIC / REAL_QID; DELAY removed; the tag code
derived again from TAGS by the store; body, flag, sysflag, born time and host, reconsume
times and every other property kept, UNIQ_KEY included, so the message id does not change),
marked with DELAY_QUEUE_OFFSET = "<level>:<schedule queue offset>" and put. Then the offset
moves past it. The first record not yet due ends the tick. The next one is scheduled for
its due time, but at least 100 ms and at most 1 s away. An empty queue sleeps 1 s, or less
when a store dispatch to that queue wakes it. A backlog is worked off in chunks of
DELIVERIES_PER_TICK_MAX, yielding to the loop in between.

Failures: a record that can never be delivered (gone from the commit log, no REAL_TOPIC,
refused by the store as illegal) is logged and skipped. If the store cannot write just now
(not available, disk error), the tick ends without moving the offset and tries again 1 s
later.

*Progress and restarts* (delay_offset_manager.py): offsets live in memory. Every 10 s, and
at shutdown, they are written to delayOffset.json together with P = the commit log's end at
that moment (``tailScanPhysicalOffset``). Deliveries and snapshots both happen on the loop,
so every delivery stored below P is counted in the offsets written with P.

- Clean restart: shutdown writes the final offsets with P = the end of the log, so the next
  start delivers exactly the records not yet delivered.
- Crash (SIGKILL): deliveries made after the last write are in the commit log (recovery
  keeps every whole record) but not counted in the offsets. Before its timers start, the
  service scans the log from P to its end for records carrying the mark. It checks each one
  against the schedule record the mark names (same REAL_TOPIC and UNIQ_KEY) and moves that
  level's offset past it. Within a level, deliveries happen in offset order, so the
  highest mark is the level's progress. Nothing is delivered twice.
- Marks in other records cannot move an offset too far. Producer sends drop the property,
  and the send-back strips it. A copy that slipped through names a delivery made earlier,
  and a forged mark fails the check.
- Not covered: an OS crash or power cut under ASYNC_FLUSH can lose the commit log's tail,
  delivered copies included, while delayOffset.json (fsynced) already counts them. Those
  deliveries are lost, as any unflushed message is.

Ownership: offsets, wake events and tasks belong to the event loop. The recovery scan runs
in a worker thread before any task starts. The dispatch listener may run on any appending
thread and only hands a wake-up to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tidemq.broker.delay_offset_manager import DelayOffsetManager
from tidemq.errors import RemoteProtocolError, StoreError
from tidemq.protocol.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SYSFLAG_TRANSACTION_MASK,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    MessageExt,
    decode_record,
    iter_records,
)
from tidemq.store.config import SCHEDULE_TOPIC
from tidemq.store.config_tables import DelayOffsetTable
from tidemq.store.interface import GetStatus, PutStatus, StoreMessage
from tidemq.store.record_encoder import delivery_tag_code

if TYPE_CHECKING:
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.role import ReplicationRole
    from tidemq.store.config import StoreConfig
    from tidemq.store.interface import MessageStore

log = logging.getLogger("tidemq.broker")

# Put on every delivered message: "<level>:<queue offset in SCHEDULE_TOPIC_XXXX>". It lets a
# restart after a crash find deliveries the persisted offsets do not count yet.
PROPERTY_DELAY_QUEUE_OFFSET = "DELAY_QUEUE_OFFSET"
_MARK_BYTES = (PROPERTY_DELAY_QUEUE_OFFSET + "\x01").encode()

# RocketMQ re-checks a level every 100 ms (DELAY_FOR_A_WHILE); we wait for the first due
# message instead, but never less than this, so a burst of near-due messages cannot spin.
TICK_INTERVAL_MIN_MS = 100
# Longest wait between ticks, and the retry pause after a failed put (RocketMQ waits 10 s).
# It bounds how late a message can be if a wake-up is missed.
TICK_INTERVAL_MAX_MS = 1000
# RocketMQ's flushDelayOffsetInterval: at most this much progress is rescanned after a crash.
PERSIST_INTERVAL_MS = 10_000
# Deliveries per tick before the task yields to the loop (sends and pulls go on meanwhile).
DELIVERIES_PER_TICK_MAX = 512
# One read of a level's queue: messages, and bytes (the first message comes even if larger).
READ_BATCH_COUNT = 32
READ_BATCH_BYTES = 1024 * 1024

_DELIVERABLE_TRANSACTION_TYPES = frozenset({TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE})
_NOTHING_TO_READ = frozenset(
    {GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MATCHED_LOGIC_QUEUE}
)
# Store statuses that will not change if the same message is put again.
_PERMANENT_FAILURES = frozenset({PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED})


def wall_clock_ms() -> int:
    """Milliseconds since the epoch: the clock store times are taken from."""
    return time.time_ns() // 1_000_000


def redirect_delayed(message: StoreMessage, level_count: int) -> StoreMessage:
    """Reroute a delayed message into SCHEDULE_TOPIC_XXXX (docs/protocol.md §6.2).

    Also drops any DELAY_QUEUE_OFFSET property: only the scheduler writes it.

    Args:
        message: the message as it would be stored; its ``properties`` dict is changed.
        level_count: how many delay levels are configured; higher levels are capped to it.

    Returns:
        ``message`` itself when it is not delayed (no DELAY, DELAY <= 0, or a transaction
        half message); else a copy for queue ``level - 1`` of SCHEDULE_TOPIC_XXXX, with
        REAL_TOPIC / REAL_QID saved and DELAY set to the capped level.

    Raises:
        ValueError: DELAY is not an integer (the message names the value and the range).
    """
    properties = message.properties
    if properties.pop(PROPERTY_DELAY_QUEUE_OFFSET, None) is not None:
        _drop_properties_text(message)
    text = properties.get(PROPERTY_DELAY_TIME_LEVEL)
    if text is None:
        return message
    try:
        level = int(text.strip())
    except ValueError:
        raise ValueError(
            f"DELAY property {text[:40]!r} of a message to topic {message.topic} is not a "
            f"delay level; use 0 (no delay) or 1..{level_count} (see messageDelayLevel)"
        ) from None
    if level <= 0:
        return message
    if message.sysflag & SYSFLAG_TRANSACTION_MASK not in _DELIVERABLE_TRANSACTION_TYPES:
        return message  # a half message waits for its commit, not for a timer
    level = min(level, level_count)
    properties[PROPERTY_DELAY_TIME_LEVEL] = str(level)
    properties[PROPERTY_REAL_TOPIC] = message.topic
    properties[PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
    _drop_properties_text(message)
    return dataclasses.replace(message, topic=SCHEDULE_TOPIC, queue_id=level - 1, tags_code=None)


def _drop_properties_text(message: StoreMessage) -> None:
    # A pre-rendered properties string (the client's, passed on to save re-encoding) no
    # longer says what ``properties`` says once we changed them: let the store render them.
    if getattr(message, "properties_text", None) is not None:
        message.properties_text = None


class _Outcome(enum.Enum):
    DELIVERED = "delivered"
    SKIPPED = "skipped"  # can never be delivered; logged
    RETRY = "retry"  # the store cannot write now


class ScheduleMessageService:
    """The delay levels' timers and their progress (see the module docstring).

    Args:
        config: messageDelayLevel as the broker read it (checked against the store's).
        store_config: the store's delay levels and commit-log segment size.
        store: where scheduled messages wait and are delivered.
        role: a slave starts no timers.
        config_dir: where delayOffset.json lives.
        clock_ms: wall-clock milliseconds; tests inject one to make messages due.

    Raises:
        ConfigFileCorrupt: delayOffset.json and its .bak are both unreadable.
    """

    def __init__(
        self,
        *,
        config: BrokerConfig,
        store_config: StoreConfig,
        store: MessageStore,
        role: ReplicationRole,
        config_dir: Path,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self._store_config = store_config
        self._store = store
        self._role = role
        # Public so a test can swap in a fake clock after the controller built us.
        self.clock_ms: Callable[[], int] = clock_ms or wall_clock_ms
        # The store's table decides the tag codes, so due times come from the same one.
        self._delay_level_ms = store_config.delay_level_ms()
        self.level_count = len(self._delay_level_ms)
        if config.delay_level_count() != self.level_count:
            log.warning(
                "messageDelayLevel differs between the broker (%d levels) and the store "
                "(%d levels); the store's %r is used for delays",
                config.delay_level_count(),
                self.level_count,
                store_config.message_delay_level,
            )
        self._offsets = DelayOffsetManager(Path(config_dir) / DelayOffsetTable.file_name)
        # A slave's copy of the master's offsets that could not be written yet.
        self._synced_unsaved = False
        self._tasks: list[asyncio.Task[None]] = []
        self._wake: dict[int, asyncio.Event] = {}
        self._idle: set[int] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writing: asyncio.Future[None] | None = None
        self._listening = False
        self._started = False
        self._running = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Account for deliveries a crash left uncounted, then start one timer per level.

        A slave starts no timers: its master delivers, and the delivered copies reach the
        slave through replication like any other message.
        """
        if self._started:
            return
        self._started = True
        await asyncio.to_thread(self.recover_deliveries)
        await self.persist()
        if self._role.is_slave:
            return
        self._start_timers()

    async def follow_role(self) -> None:
        """After a role switch (broker/role.py): a broker that became master starts the
        timers (from the delay offsets it copied as a slave from the old master: a message
        due meanwhile may be delivered twice, never lost); one that became slave stops them."""
        if not self._started:
            return
        if self._role.is_slave and self._running:
            await self.shutdown()
        elif not self._role.is_slave and not self._running:
            await asyncio.to_thread(self.recover_deliveries)
            self._start_timers()

    def _start_timers(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._running = True
        if not self._listening:
            self._store.add_dispatch_listener(self._on_dispatch)
            self._listening = True
        for level in range(1, self.level_count + 1):
            self._wake[level] = asyncio.Event()
            self._tasks.append(loop.create_task(self._run_level(level), name=f"delay-{level}"))
        self._tasks.append(loop.create_task(self._persist_loop(), name="delay-offsets"))

    async def shutdown(self) -> None:
        """Stop the timers and write the offsets (call before the store closes); a write that
        fails with a StoreError (a full disk) is logged, not raised."""
        self._running = False
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await self.persist()
        except StoreError as exc:
            # A full disk at shutdown: say what is lost and go on, so the broker still
            # closes its store cleanly (raised, it skipped every later step of shutdown).
            log.error("persisting delay offsets at shutdown failed: %s; delayOffset.json keeps "
                      "the offsets of its last save, so delayed messages delivered since may "
                      "be delivered again", exc)

    async def persist(self) -> None:
        """Write delayOffset.json if it changed: snapshot on the loop, write in a thread.

        Raises:
            StoreFull, StoreError: the write failed (the next persist tries again).
        """
        if self._writing is not None:
            # One writer per file: a write whose awaiting task was cancelled (shutdown
            # stopping the periodic persist) still runs in its thread; let it finish.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._writing)
        snapshot = self._offsets.snapshot(self._store.commit_log_max_offset())
        if snapshot is None:
            return
        self._writing = asyncio.ensure_future(
            asyncio.to_thread(self._offsets.write_snapshot, snapshot)
        )
        await asyncio.shield(self._writing)

    # -- queries ---------------------------------------------------------------------------

    def delay_offset_json(self) -> bytes:
        """The GET_ALL_DELAY_OFFSET body: ``{"offsetTable":{level: next offset}}``."""
        return self._offsets.to_json()

    async def sync_from_master(self, table: DelayOffsetTable) -> bool:
        """Take the master's delay offsets (a slave's periodic sync; a slave delivers
        nothing itself) and write them; True when they changed.

        A write that failed (a full disk) is tried again at the next sync even when the
        offsets did not change since: a slave runs no periodic save of its own.

        Raises:
            StoreFull, StoreError: the write failed (the offsets are kept in memory).
        """
        changed = self._offsets.replace(table)
        if not changed and not self._synced_unsaved:
            return False
        try:
            await self.persist()
        except StoreError:
            self._synced_unsaved = True
            raise
        self._synced_unsaved = False
        return changed

    def offset(self, level: int) -> int:
        """The next queue offset ``level`` will deliver."""
        return self._offsets.offset(level)

    # -- delivering ------------------------------------------------------------------------

    def deliver_due(self, level: int) -> int:
        """Deliver ``level``'s messages that are due now, in order (one tick).

        Returns:
            Milliseconds until the next tick should run: 0 when a backlog remains, else
            within [TICK_INTERVAL_MIN_MS, TICK_INTERVAL_MAX_MS].
        """
        now_ms = self.clock_ms()
        queue_id = level - 1
        offset = self._offsets.offset(level)
        delivered = 0
        read_count = READ_BATCH_COUNT
        try:
            while delivered < DELIVERIES_PER_TICK_MAX:
                result = self._store.get_messages(
                    SCHEDULE_TOPIC, queue_id, offset, read_count, READ_BATCH_BYTES
                )
                status = result.status
                if status is not GetStatus.FOUND:
                    moved = self._skip_unreadable(level, offset, status, result.next_begin_offset)
                    if moved is None:
                        self._idle.add(level)
                        return TICK_INTERVAL_MAX_MS
                    offset = moved
                    continue
                try:
                    for record in iter_records(result.body):
                        due_ms = self._due_ms(record)
                        if due_ms > now_ms:
                            offset = record.queue_offset
                            return _clamp_wait(due_ms - now_ms)
                        if self._deliver(level, record) is _Outcome.RETRY:
                            offset = record.queue_offset
                            return TICK_INTERVAL_MAX_MS
                        offset = record.queue_offset + 1
                        delivered += 1
                except RemoteProtocolError as exc:
                    # The store verified these bytes, so this is rare; find the bad record by
                    # reading one at a time, then step over it rather than block the level.
                    if read_count > 1:
                        read_count = 1
                        continue
                    log.error("delay level %d: record at %s offset %d does not decode (%s); "
                              "skipped", level, SCHEDULE_TOPIC, offset, exc)
                    offset = result.next_begin_offset
                    continue
                offset = max(offset, result.next_begin_offset)
                read_count = READ_BATCH_COUNT
            return 0
        finally:
            if offset != self._offsets.offset(level):  # levels never used stay out of the table
                self._offsets.commit(level, offset)

    def _skip_unreadable(
        self, level: int, offset: int, status: GetStatus, next_offset: int
    ) -> int | None:
        """Where to read next after a read found nothing to deliver; None when idle."""
        if status in _NOTHING_TO_READ:
            return None
        if next_offset <= offset and status is not GetStatus.OFFSET_OVERFLOW_BADLY:
            return None  # no progress possible now; try again on the next tick
        if status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY):
            # Retention removed entries below us, or the queue is shorter than our offset
            # (a store that lost its tail): go on from the nearest readable offset.
            log.warning(
                "delay level %d: offset %d is outside queue %d of %s (%s); continuing at %d",
                level, offset, level - 1, SCHEDULE_TOPIC, status.value, next_offset,
            )
        return next_offset

    def _due_ms(self, record: MessageExt) -> int:
        text = record.properties.get(PROPERTY_DELAY_TIME_LEVEL, "")
        level = int(text) if text.isdigit() else 0
        return delivery_tag_code(level, record.store_timestamp, self._delay_level_ms)

    def _deliver(self, level: int, record: MessageExt) -> _Outcome:
        properties = record.properties
        real_topic = properties.get(PROPERTY_REAL_TOPIC)
        real_queue_text = properties.get(PROPERTY_REAL_QUEUE_ID, "")
        if not real_topic or not real_queue_text.isdigit():
            log.error(
                "delay level %d: message at %s offset %d has REAL_TOPIC=%r REAL_QID=%r and "
                "cannot be delivered; skipped",
                level, SCHEDULE_TOPIC, record.queue_offset, real_topic, real_queue_text,
            )
            return _Outcome.SKIPPED
        properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        properties[PROPERTY_DELAY_QUEUE_OFFSET] = f"{level}:{record.queue_offset}"
        message = StoreMessage(
            topic=real_topic,
            queue_id=int(real_queue_text),
            body=record.body,
            properties=properties,
            flag=record.flag,
            sysflag=record.sysflag,
            born_timestamp=record.born_timestamp,
            born_host=record.born_host,
            reconsume_times=record.reconsume_times,
            prepared_transaction_offset=record.prepared_transaction_offset,
        )
        result = self._store.put_message(message)
        if result.status is PutStatus.PROPERTIES_SIZE_EXCEEDED:
            # The mark made a message at the size limit too large: deliver it unmarked (only
            # crash recovery misses it) rather than not at all.
            properties.pop(PROPERTY_DELAY_QUEUE_OFFSET)
            result = self._store.put_message(message)
        if result.ok:
            return _Outcome.DELIVERED
        if result.status in _PERMANENT_FAILURES:
            log.error(
                "delay level %d: message at %s offset %d for %s/%s was refused by the store "
                "(%s: %s); skipped",
                level, SCHEDULE_TOPIC, record.queue_offset, real_topic, real_queue_text,
                result.status.value, result.remark,
            )
            return _Outcome.SKIPPED
        log.warning(
            "delay level %d: store could not take the message at %s offset %d (%s: %s); "
            "retrying in %d ms",
            level, SCHEDULE_TOPIC, record.queue_offset, result.status.value, result.remark,
            TICK_INTERVAL_MAX_MS,
        )
        return _Outcome.RETRY

    # -- crash recovery --------------------------------------------------------------------

    def recover_deliveries(self) -> int:
        """Count deliveries stored after the last persisted snapshot (a crash lost them).

        Scans the commit log from the persisted ``tailScanPhysicalOffset`` to its end for
        records carrying DELAY_QUEUE_OFFSET, checks each against the schedule record it
        names, and moves that level's offset past it. Call before the timers start.

        Returns:
            How many levels' offsets moved.
        """
        start = self._offsets.loaded_tail_scan_physical_offset
        if start is None:
            return 0  # a new store, or a file RocketMQ wrote: nothing of ours to find
        store = self._store
        end = store.commit_log_max_offset()
        if start > end:
            log.warning(
                "delayOffset.json counts deliveries up to commit-log offset %d but the log "
                "ends at %d: its tail was lost (an OS crash under ASYNC_FLUSH?), and delayed "
                "messages delivered into it are lost with it",
                start, end,
            )
            return 0
        segment_size = self._store_config.mapped_file_size_commit_log
        position = max(start, store.commit_log_min_offset())
        moved: set[int] = set()
        while position < end:
            record = store.read_message(position)
            if record is None:  # the blank end of a segment: records go on in the next one
                position = (position // segment_size + 1) * segment_size
                continue
            position += int.from_bytes(record[:4], "big")
            if _MARK_BYTES in record:
                level = self._recover_one(record)
                if level is not None:
                    moved.add(level)
        if moved:
            log.info(
                "delay offsets after the commit-log scan from %d to %d: %s",
                start, end,
                ", ".join(f"level {level} -> {self._offsets.offset(level)}"
                          for level in sorted(moved)),
            )
        return len(moved)

    def _recover_one(self, record: bytes) -> int | None:
        """The level whose offset a marked record moved, or None."""
        try:
            delivered = decode_record(record)
        except RemoteProtocolError:
            return None
        mark = delivered.properties.get(PROPERTY_DELAY_QUEUE_OFFSET, "")
        level_text, _, offset_text = mark.partition(":")
        if not (level_text.isdigit() and offset_text.isdigit()):
            return None
        level, queue_offset = int(level_text), int(offset_text)
        if not 1 <= level <= self.level_count or queue_offset < self._offsets.offset(level):
            return None
        scheduled = self._scheduled_record(level, queue_offset)
        unique_key = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
        if (
            scheduled is None
            or scheduled.properties.get(PROPERTY_REAL_TOPIC) != delivered.topic
            or scheduled.properties.get(unique_key) != delivered.properties.get(unique_key)
        ):
            return None
        self._offsets.advance_to(level, queue_offset + 1)
        return level

    def _scheduled_record(self, level: int, queue_offset: int) -> MessageExt | None:
        result = self._store.get_messages(SCHEDULE_TOPIC, level - 1, queue_offset, 1, 1)
        if result.status is not GetStatus.FOUND:
            return None
        try:
            record = decode_record(result.body)
        except RemoteProtocolError:
            return None
        return record if record.queue_offset == queue_offset else None

    # -- timers ----------------------------------------------------------------------------

    async def _run_level(self, level: int) -> None:
        wake = self._wake[level]
        while True:
            wake.clear()
            self._idle.discard(level)
            try:
                wait_ms = self.deliver_due(level)
            except Exception:
                log.exception("delay level %d: delivery tick failed; retrying", level)
                wait_ms = TICK_INTERVAL_MAX_MS
            if wait_ms <= 0:
                await asyncio.sleep(0)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), wait_ms / 1000)

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(PERSIST_INTERVAL_MS / 1000)
            try:
                await self.persist()
            except StoreError as exc:
                # A full disk or an unwritable config dir: the message names the file and
                # what to do; a traceback would only say it came from here.
                log.error("persisting delay offsets failed: %s; trying again in %d ms", exc,
                          PERSIST_INTERVAL_MS)
            except Exception:
                log.exception("persisting delay offsets failed; trying again in %d ms",
                              PERSIST_INTERVAL_MS)

    def _on_dispatch(self, topic: str, queue_id: int, max_offset: int) -> None:
        # Runs on the appending thread for every queue; only an idle level needs a wake-up
        # (a busy one already sleeps until its next due message).
        if topic != SCHEDULE_TOPIC or not self._running:
            return
        level = queue_id + 1
        event = self._wake.get(level)
        if event is None or level not in self._idle or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed under us
            self._loop.call_soon_threadsafe(event.set)


def _clamp_wait(wait_ms: int) -> int:
    return max(TICK_INTERVAL_MIN_MS, min(wait_ms, TICK_INTERVAL_MAX_MS))

"""StoreCore: the message store's behaviour, shared by the file store and its memory twin.

It owns a commit log, the consume queues and (optionally) a key index, and implements
``MessageStore`` on them: validated appends with synchronous dispatch, reads, searches,
retention, truncation. ``FileMessageStore`` adds files, recovery, flush threads, the
checkpoint and the lock; ``MemoryMessageStore`` uses anonymous mappings and adds nothing.

Theory of an append (``put_messages``):
1. encode every record into one buffer, outside the lock (record_encoder.py); a bad message
   is answered here and nothing is written;
2. under the append lock: take the queue offset (the queue's max offset) and a store time
   (never below the previous one, so store times grow along the log), make room in the
   consume queue, write the records to the commit log (patching offsets and time in place),
   and dispatch them (consume-queue entries in one pack, index keys);
3. after the lock: tell dispatch listeners, and under SYNC_FLUSH ask the group commit for
   a durable future.

``put_batch`` (a batch in columns) encodes with ``encode_message_batch`` and appends as above.

``put_message_group`` (single sends that arrived together) does the same once per topic for
the plain messages among them, and once per topic for the committed transactional ones
(END_TRANSACTION's and the exactly-once sink's copies of half messages), as a queue group:
one buffer, one commit-log write, each record with the next queue offset of its own queue,
one dispatch (consume-queue entries per queue, index keys once). A half or rollback record,
a delayed message, or a group the encoder refuses, goes through ``put_message`` alone,
after the messages before it are appended, so the order of each queue is the order of the
list.

``put_send_columns`` (a broker's read of plain single sends, given in columns) appends them
as such a queue group, encoded from the columns (``encode_send_columns``: no StoreMessage,
one pack per record) and answered in columns (no PutResult per message); the same bytes.

Threads and the state they own:
- the append lock (one appender at a time, any thread): commit-log writes and rolls,
  consume-queue writes and creation, index puts, truncation, topic deletion, and the
  segment deletions of retention;
- readers (any thread, no lock): copy-on-write segment lists, consume-queue dict lookups,
  bytes below published offsets;
- flush threads (file store): flushed positions and the checkpoint.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from itertools import chain, repeat
from operator import and_, attrgetter
from typing import Any, NamedTuple

from tidemq.errors import StoreError, StoreFull
from tidemq.protocol.message import BLANK_MAGIC, SYSFLAG_TRANSACTION_MASK
from tidemq.protocol.msgid import encode_offset_msg_id
from tidemq.store import queue_reads, rebuild, recovery
from tidemq.store.commit_log import CommitLog
from tidemq.store.config import SCHEDULE_TOPIC, StoreConfig
from tidemq.store.consume_queue_table import ConsumeQueueTable
from tidemq.store.disk_space import DiskSpaceGuard
from tidemq.store.dispatch import (
    ConsumeQueueDispatcher,
    DispatchBatch,
    Dispatcher,
    IndexDispatcher,
    KeyIndex,
    QueueRun,
    QueueRuns,
    queue_order,
)
from tidemq.store.epochs import EpochFile
from tidemq.store.flush import GroupCommitService
from tidemq.store.interface import (
    DispatchListener,
    GetResult,
    JoinedMsgIds,
    MessageBatch,
    MessageStore,
    PutResult,
    PutStatus,
    QueryResult,
    SendColumns,
    SendColumnsPut,
    StoreMessage,
)
from tidemq.store.key_columns import concatenated_keys, key_count
from tidemq.store.record_encoder import (
    QUEUED_TRANSACTION_TYPES,
    EncodedBatch,
    EncodeRejected,
    delivery_tag_code,
    encode_message_batch,
    encode_messages,
    encode_send_columns,
    encode_single,
    ipv4_host_packed,
)
from tidemq.store.replication import CommitLogReplica, read_chunk
from tidemq.store.retention import RetentionPolicy
from tidemq.store.truncation import (
    TruncateIntent,
    Truncation,
    dropped_records,
    sync_file,
)
from tidemq.store.worker_group_commit import WorkerGroupCommitService
from tidemq.timings import LatencyTally

logger = logging.getLogger(__name__)

_MSG_ID_OFFSET_DIGITS = 16  # the physical offset is the last 8 bytes of an offset msg id
_topic_of = attrgetter("topic")
_sysflag_of = attrgetter("sysflag")


def _offset_msg_ids(prefix: str, physical_offsets: list[int]) -> list[str]:
    # The offsets as 16 uppercase hex digits each, for the whole batch in a few C calls:
    # pack them big-endian, hex them with a space every 8 bytes, split.
    packed = struct.pack(f">{len(physical_offsets)}q", *physical_offsets)
    return list(map(prefix.__add__, packed.hex(" ", 8).upper().split(" ")))


def _joined_offset_msg_ids(prefix: str, physical_offsets: list[int]) -> JoinedMsgIds:
    # The same ids comma-joined, as a batch's answer carries them, with no string per id:
    # the offsets hexed with a comma every 8 bytes, the host part put before each.
    packed = struct.pack(f">{len(physical_offsets)}q", *physical_offsets)
    hexed = packed.hex(",", 8).upper()
    return JoinedMsgIds(prefix + hexed.replace(",", "," + prefix))


class _GroupAppended(NamedTuple):
    """A queue group appended: each record's physical and queue offset, the store time,
    and the SYNC_FLUSH future (None under ASYNC_FLUSH)."""

    physical_offsets: list[int]
    queue_offsets: list[int]
    store_timestamp: int
    durable: Future[PutStatus] | None


class StoreCore(MessageStore):
    """``MessageStore`` over a commit log, consume queues and a key index."""

    def __init__(
        self,
        config: StoreConfig,
        commit_log: CommitLog,
        queues: ConsumeQueueTable,
        index: KeyIndex | None,
    ) -> None:
        self.config = config
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        # Commit-log syncs (flush threads write it, the metrics read it); a memory store
        # never syncs, so its tally stays empty.
        self.flush_latency = LatencyTally()
        self._dispatchers: list[Dispatcher] = [ConsumeQueueDispatcher(queues)]
        if index is not None:
            self._dispatchers.append(IndexDispatcher(index))
        self._listeners: list[DispatchListener] = []
        self._append_listeners: list[Callable[[], None]] = []
        self._append_lock = threading.Lock()
        self._delay_level_ms = config.delay_level_ms()
        RetentionPolicy.from_config(config)  # checks the retention settings at open
        # Every offset msg id of this store shares its host part: render it once
        # (encode_offset_msg_id parses the host on each call) and append the offset in hex.
        self._msg_id_prefix = encode_offset_msg_id(config.store_host, 0)[:-_MSG_ID_OFFSET_DIGITS]
        # The lone send's encoder takes the store host packed (an IPv4 one: an IPv6 store
        # host goes the general way).
        self._store_host_packed = ipv4_host_packed(config.store_host)
        # SYNC_FLUSH (file store): the in-process service or the sync worker's (same methods).
        self._group_commit: GroupCommitService | WorkerGroupCommitService | None = None
        self._closed = False
        self._not_writable_reason: str | None = None
        # Refuses writes while the volume is nearly full (file store; disk_space.py).
        self.disk_guard: DiskSpaceGuard | None = None
        # Store time of the newest dispatched record (the checkpoint's logics time).
        self.last_dispatched_timestamp = 0
        self._replica: CommitLogReplica | None = None
        # The file store's epoch file and truncation intent (epochs.py, truncation.py); a
        # memory store has neither.
        self.epochs: EpochFile | None = None
        self.truncate_intent: TruncateIntent | None = None

    # -- appends --------------------------------------------------------------------------------

    def put_message(self, message: StoreMessage) -> PutResult:
        """Append one message (see ``MessageStore.put_message``)."""
        return self._put_one(message)

    def put_messages(self, messages: list[StoreMessage]) -> PutResult:
        """Append a batch of one queue (see ``MessageStore.put_messages``)."""
        return self._put(messages)

    def put_message_group(self, messages: Sequence[StoreMessage]) -> list[PutResult]:
        """Append single sends together (see ``MessageStore.put_message_group``)."""
        if len(messages) == 1:
            return [self._put_one(messages[0])]
        topic = messages[0].topic
        if topic != SCHEDULE_TOPIC and list(map(_topic_of, messages)).count(topic) == len(
            messages
        ):
            kinds = set(map(and_, map(_sysflag_of, messages), repeat(SYSFLAG_TRANSACTION_MASK)))
            if len(kinds) == 1 and kinds <= QUEUED_TRANSACTION_TYPES:
                # The common read (a producer's plain sends of one topic): one queue group,
                # checked in a few C calls instead of a Python step per message.
                return self._put_queue_group(
                    messages if isinstance(messages, list) else list(messages))
        results: list[PutResult | None] = [None] * len(messages)
        # topic -> (transaction type, positions of the messages to append as one group)
        pending: dict[str, tuple[int, list[int]]] = {}
        for position, message in enumerate(messages):
            transaction_type = message.sysflag & SYSFLAG_TRANSACTION_MASK
            if (
                transaction_type not in QUEUED_TRANSACTION_TYPES
                or message.topic == SCHEDULE_TOPIC
            ):
                self._put_pending(messages, pending, results)
                results[position] = self._put((message,))
                continue
            group = pending.get(message.topic)
            if group is not None and group[0] != transaction_type:
                # A group holds one transaction type; appending the pending ones first keeps
                # each queue in the order of the list.
                self._put_pending(messages, pending, results)
                group = None
            if group is None:
                pending[message.topic] = (transaction_type, [position])
            else:
                group[1].append(position)
        self._put_pending(messages, pending, results)
        return results  # type: ignore[return-value]  # every position was filled

    def _put_pending(
        self,
        messages: Sequence[StoreMessage],
        pending: dict[str, tuple[int, list[int]]],
        results: list[PutResult | None],
    ) -> None:
        for _, positions in pending.values():
            group = [messages[position] for position in positions]
            for position, result in zip(positions, self._put_queue_group(group), strict=True):
                results[position] = result
        pending.clear()

    def _put_queue_group(self, messages: list[StoreMessage]) -> list[PutResult]:
        """Plain (or all committed) messages of one topic, any queues: one append, one
        result per message."""
        if len(messages) == 1 or self._write_refusal() is not None:
            return [self._put_one(message) for message in messages]
        try:
            batch = encode_messages(messages, **self._encoding(), mixed_queues=True)
        except EncodeRejected:
            # Some message is bad: one by one, so that only it is refused (and named).
            return [self._put((message,)) for message in messages]
        appended = self._append_queue_group(batch)
        if isinstance(appended, PutResult):
            return [appended] * len(messages)
        return self._columns_put(batch, appended).put_results()

    def put_send_columns(self, sends: SendColumns) -> SendColumnsPut | None:
        """Append single sends given in columns (see ``MessageStore.put_send_columns``):
        encoded as one queue group (``encode_send_columns``) and appended as
        ``_put_queue_group`` appends one. None for one message (the lone send's path is
        cheaper), an IPv6 store host, a store that takes no write now (the general path
        says why), or sends the column encoder leaves to ``encode_messages``."""
        store_host = self._store_host_packed
        if (
            store_host is None
            or len(sends.queue_ids) < 2
            or self._write_refusal() is not None
        ):
            return None
        batch = encode_send_columns(
            sends, store_host, int(time.time() * 1000), self.config.max_message_size,
            self.commit_log.file_size, self.index is not None)
        if batch is None:
            return None
        appended = self._append_queue_group(batch)
        if isinstance(appended, PutResult):
            return SendColumnsPut(appended.status, appended.remark, len(batch.sizes))
        return self._columns_put(batch, appended)

    def _columns_put(self, batch: EncodedBatch, appended: _GroupAppended) -> SendColumnsPut:
        """A stored queue group's results in columns (its msg ids made when asked for)."""
        physical_offsets, queue_offsets, store_timestamp, durable = appended
        return SendColumnsPut(
            PutStatus.PUT_OK, "", len(batch.sizes), physical_offsets, batch.sizes, queue_offsets,
            self._msg_id_prefix, store_timestamp, durable)

    def _append_queue_group(self, batch: EncodedBatch) -> _GroupAppended | PutResult:
        """Append a queue group encoded outside the lock (theory, step 2 and 3): each
        record with the next queue offset of its own queue, one commit-log write, one
        dispatch. What was appended, or the one failure that stands for every message."""
        topic = batch.topic
        queue_ids: list[int] = batch.queue_ids  # type: ignore[assignment]
        # The records in queue order and each queue's run of them, made once for the queue
        # offsets and the consume-queue entries (dispatch.py), with no Python step per record.
        order, counts = queue_order(queue_ids)
        with self._append_lock:
            if self._closed or self._not_writable_reason is not None:
                return self._unavailable()
            store_timestamp = max(batch.store_timestamp, self.commit_log.last_store_timestamp)
            log_end = self.commit_log.max_offset()
            get_or_create = self.queues.get_or_create
            runs: list[QueueRun] = []
            run_offsets: list[range] = []
            try:
                # Each queue's first offset (its max offset), with room made for its run.
                for queue_id, run_length in counts:
                    queue = get_or_create(topic, queue_id)
                    first = queue.next_offset_with_room(run_length)
                    runs.append(QueueRun(queue, first, run_length))
                    run_offsets.append(range(first, first + run_length))
                # Each record's queue offset: the runs' offsets, in queue order, put back
                # in record order (``any`` only drives the C-level map of __setitem__).
                queue_offsets = [0] * len(queue_ids)
                any(map(queue_offsets.__setitem__, order, chain.from_iterable(run_offsets)))
                self._ensure_index_room(batch)
                physical_offsets = self.commit_log.append(
                    batch, 0, 1, store_timestamp, queue_offsets
                )
            except StoreError as e:
                return self._append_failed(batch, log_end, e)
            self._dispatch(batch, queue_offsets[0], physical_offsets, store_timestamp,
                           QueueRuns(order, runs))
            end_offset = self.commit_log.max_offset()
        self._notify_runs(topic, runs)
        durable = self._group_commit.request(end_offset) if self._group_commit else None
        return _GroupAppended(physical_offsets, queue_offsets, store_timestamp, durable)

    def _encoding(self) -> dict[str, Any]:
        """The encoders' settings: this store's host and limits, and the time now."""
        return {
            "store_host": self.config.store_host,
            "store_timestamp": int(time.time() * 1000),
            "max_message_size": self.config.max_message_size,
            "segment_size": self.commit_log.file_size,
            "with_keys": self.index is not None,
        }

    def _put_one(self, message: StoreMessage) -> PutResult:
        """One message (theory, "a lone send"): the same append as ``_put`` of it, with the
        one-record encoder, write and dispatch, and no per-batch step."""
        store_host = self._store_host_packed
        if store_host is None or self._write_refusal() is not None:
            return self._put((message,))
        now_ms = int(time.time() * 1000)
        batch = encode_single(message, store_host, now_ms, self.config.max_message_size,
                              self.commit_log.file_size, self.index is not None)
        if batch is None:
            return self._put((message,))
        topic = batch.topic
        queue_id = batch.queue_id
        keys = batch.keys[0] if batch.keys is not None else None
        commit_log = self.commit_log
        with self._append_lock:
            if self._closed or self._not_writable_reason is not None:
                return self._unavailable()
            queue = self.queues.get_or_create(topic, queue_id)
            queue_offset = queue.max_offset
            # Store times never go back along the log (time search relies on it).
            store_timestamp = max(now_ms, commit_log.last_store_timestamp)
            log_end = commit_log.max_offset()
            try:
                queue.ensure_room(1)
                if keys and self.index is not None:
                    self.index.ensure_room(len(keys))
                physical_offset = commit_log.append_one(batch, queue_offset, store_timestamp)
            except StoreError as e:
                return self._append_failed(batch, log_end, e)
            size = batch.sizes[0]
            tag_code: int = batch.tag_codes[0]  # type: ignore[assignment]  # no delay: set
            try:
                for dispatcher in self._dispatchers:
                    dispatcher.dispatch_one(topic, queue_id, queue_offset, physical_offset, size,
                                            tag_code, keys, store_timestamp)
                self.last_dispatched_timestamp = store_timestamp
            except StoreError as e:
                self._dispatch_failed(e)
        if self._listeners or self._append_listeners:
            self._notify(topic, queue_id, queue_offset + 1)
        group_commit = self._group_commit
        durable = (group_commit.request(physical_offset + size) if group_commit is not None
                   else None)
        # The one id as a list of one, as a queue group's results carry theirs: an answer
        # takes it as it is (a JoinedMsgIds costs an ABC isinstance there).
        return PutResult(PutStatus.PUT_OK, "", physical_offset, size, queue_offset,
                         [f"{self._msg_id_prefix}{physical_offset:016X}"],
                         store_timestamp, 1, durable)

    def _put(self, messages: list[StoreMessage] | tuple[StoreMessage, ...]) -> PutResult:
        if self._write_refusal() is not None:
            return self._unavailable()
        try:
            batch = encode_messages(messages, **self._encoding())
        except EncodeRejected as e:
            return PutResult(e.status, e.remark)
        return self._append(batch)

    def put_batch(self, batch: MessageBatch, *, msg_ids: bool = True) -> PutResult:
        """Append a batch given in columns (see ``MessageStore.put_batch``)."""
        if self._write_refusal() is not None:
            return self._unavailable()
        try:
            encoded = encode_message_batch(batch, **self._encoding())
        except EncodeRejected as e:
            return PutResult(e.status, e.remark)
        if encoded is None:
            return self._put(batch.to_store_messages())
        return self._append(encoded, msg_ids=msg_ids)

    def put_batches(self, batches: Sequence[MessageBatch]) -> list[PutResult]:
        """Append batches given in columns together (see ``MessageStore.put_batches``)."""
        if len(batches) == 1:
            return [self.put_batch(batches[0])]
        if self._write_refusal() is not None:
            return [self._unavailable() for _ in batches]
        encoding = self._encoding()
        encoded: list[EncodedBatch | EncodeRejected | None] = []
        for batch in batches:
            try:
                encoded.append(encode_message_batch(batch, **encoding))
            except EncodeRejected as e:
                encoded.append(e)
        if all(isinstance(item, EncodedBatch) and item.queued and item.topic == batches[0].topic
               for item in encoded):
            return self._append_many(encoded)  # type: ignore[arg-type]  # all EncodedBatch
        # Anything else batch by batch, in order, as put_batch answers each.
        results: list[PutResult] = []
        for batch, item in zip(batches, encoded, strict=True):
            if isinstance(item, EncodeRejected):
                results.append(PutResult(item.status, item.remark))
            elif item is None:
                results.append(self._put(batch.to_store_messages()))
            else:
                results.append(self._append(item))
        return results

    def _append_many(self, batches: list[EncodedBatch]) -> list[PutResult]:
        """Append queued batches of one topic in one commit-log write (theory, step 2 and
        3): each batch's queue offsets follow the batches before it in the same queue; one
        consume-queue put per batch, one index put for all."""
        topic = batches[0].topic
        with self._append_lock:
            if self._closed or self._not_writable_reason is not None:
                return [self._unavailable() for _ in batches]
            next_offsets: dict[int, int] = {}  # queue id -> its next queue offset
            queue_counts: Counter[int] = Counter()
            queue_offsets: list[int] = []
            for batch in batches:
                queue_id = batch.queue_id
                queue_offset = next_offsets.get(queue_id)
                if queue_offset is None:
                    queue_offset = self.queues.get_or_create(topic, queue_id).max_offset
                queue_offsets.append(queue_offset)
                next_offsets[queue_id] = queue_offset + len(batch.sizes)
                queue_counts[queue_id] += len(batch.sizes)
            store_timestamp = max(batches[0].store_timestamp,
                                  self.commit_log.last_store_timestamp)
            log_end = self.commit_log.max_offset()
            try:
                for queue_id, count in queue_counts.items():
                    self.queues.get_or_create(topic, queue_id).ensure_room(count)
                for batch in batches:
                    self._ensure_index_room(batch)
                offsets_per_batch = self.commit_log.append_many(
                    batches, queue_offsets, store_timestamp)
            except StoreError as e:
                return [self._append_failed(batches[0], log_end, e)] * len(batches)
            if offsets_per_batch is not None:
                self._dispatch_many(batches, queue_offsets, offsets_per_batch, store_timestamp)
                end_offset = self.commit_log.max_offset()
        if offsets_per_batch is None:
            # They span a segment roll: one by one, each with its own result (a batch the
            # next segment cannot be made for is refused alone; the store keeps writing).
            return [self._append(batch) for batch in batches]
        for queue_id, max_offset in next_offsets.items():
            self._notify(topic, queue_id, max_offset)
        durable = self._group_commit.request(end_offset) if self._group_commit else None
        prefix = self._msg_id_prefix
        return [
            PutResult(
                status=PutStatus.PUT_OK,
                physical_offset=physical_offsets[0],
                wrote_bytes=len(batch.buffer),
                queue_offset=queue_offset,
                msg_ids=_joined_offset_msg_ids(prefix, physical_offsets),
                store_timestamp=store_timestamp,
                message_count=len(batch.sizes),
                durable=durable,
            )
            for batch, queue_offset, physical_offsets in zip(
                batches, queue_offsets, offsets_per_batch, strict=True)
        ]

    def _append(self, batch: EncodedBatch, *, msg_ids: bool = True) -> PutResult:
        """Append records of one queue encoded outside the lock (theory, step 2 and 3)."""
        count = len(batch.sizes)
        queued = batch.queued
        with self._append_lock:
            if self._closed or self._not_writable_reason is not None:
                return self._unavailable()
            queue = self.queues.get_or_create(batch.topic, batch.queue_id) if queued else None
            queue_offset = queue.max_offset if queue is not None else 0
            # Store times never go back along the log (time search relies on it).
            store_timestamp = max(batch.store_timestamp, self.commit_log.last_store_timestamp)
            log_end = self.commit_log.max_offset()
            try:
                if queue is not None:
                    queue.ensure_room(count)
                self._ensure_index_room(batch)
                physical_offsets = self.commit_log.append(
                    batch, queue_offset, 1 if queued else 0, store_timestamp
                )
            except StoreError as e:
                return self._append_failed(batch, log_end, e)
            self._dispatch(batch, queue_offset, physical_offsets, store_timestamp)
            end_offset = self.commit_log.max_offset()
        if queued:
            self._notify(batch.topic, batch.queue_id, queue_offset + count)
        durable = self._group_commit.request(end_offset) if self._group_commit else None
        prefix = self._msg_id_prefix
        return PutResult(
            status=PutStatus.PUT_OK,
            physical_offset=physical_offsets[0],
            wrote_bytes=len(batch.buffer),
            queue_offset=queue_offset if queued else 0,
            msg_ids=_joined_offset_msg_ids(prefix, physical_offsets) if msg_ids else [],
            store_timestamp=store_timestamp,
            message_count=count,
            durable=durable,
        )

    def _ensure_index_room(self, batch: EncodedBatch) -> None:
        # Under the append lock, before the commit-log write: reserve the index's disk for
        # the batch's keys (index_file.py), so dispatching them cannot fail on a full disk.
        index = self.index
        keys = batch.keys
        if index is not None and keys is not None and batch.indexed:
            index.ensure_room(key_count(keys))

    def _append_failed(self, batch: EncodedBatch, log_end: int, error: StoreError) -> PutResult:
        # Called under the append lock when the commit-log append raised.
        if isinstance(error, StoreFull) and self.commit_log.max_offset() == log_end:
            # Nothing was written: refuse this and the next writes until there is room.
            remark = str(error)
            if self.disk_guard is not None:
                remark = self.disk_guard.note_full(remark)
            logger.warning("append to %s/%d refused: %s", batch.topic, batch.queue_id, remark)
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, remark)
        logger.error("append to %s/%d failed: %s", batch.topic, batch.queue_id, error)
        if self.commit_log.max_offset() != log_end:
            # Part of the batch is in the log (a write failed after a segment roll): its
            # queue offsets are unknown to the queues, so stop, as after a failed dispatch;
            # recovery rebuilds the queues from the log.
            self._not_writable_reason = (
                f"a commit-log write failed half way ({error}); restart the broker"
            )
        return PutResult(PutStatus.UNKNOWN_ERROR, f"the store could not write: {error}")

    def _dispatch(
        self,
        batch: EncodedBatch,
        queue_offset: int,
        physical_offsets: list[int],
        store_timestamp: int,
        queue_runs: QueueRuns | None = None,
    ) -> None:
        tag_codes = batch.tag_codes
        if batch.delay_levels is not None:
            levels = iter(batch.delay_levels)
            tag_codes = [
                delivery_tag_code(next(levels), store_timestamp, self._delay_level_ms)
                if code is None
                else code
                for code in tag_codes
            ]
        dispatch_batch = DispatchBatch(
            topic=batch.topic,
            queue_id=batch.queue_id,
            queue_offset=queue_offset,
            physical_offsets=physical_offsets,
            sizes=batch.sizes,
            tag_codes=tag_codes,  # type: ignore[arg-type]  # every None was resolved above
            keys=batch.keys,
            store_timestamp=store_timestamp,
            queued=batch.queued,
            indexed=batch.indexed,
            queue_runs=queue_runs,
        )
        try:
            for dispatcher in self._dispatchers:
                dispatcher.dispatch(dispatch_batch)
            self.last_dispatched_timestamp = store_timestamp
        except StoreError as e:
            self._dispatch_failed(e)

    def _dispatch_failed(self, error: StoreError) -> None:
        # The records are in the commit log, the only truth, and recovery rebuilds what
        # failed here; but appending on would let queue offsets and the queues diverge.
        self._not_writable_reason = f"dispatch failed ({error}); restart the broker to rebuild"
        logger.error("store stops taking writes: %s", self._not_writable_reason)

    def _dispatch_many(
        self,
        batches: list[EncodedBatch],
        queue_offsets: list[int],
        offsets_per_batch: list[list[int]],
        store_timestamp: int,
    ) -> None:
        # ``_dispatch`` of each batch, but the index keys of all of them in one put (their
        # columns hash together); batches of ``_append_many``: queued (so indexed too), one
        # topic, no delays.
        dispatch_batches = [
            DispatchBatch(
                topic=batch.topic,
                queue_id=batch.queue_id,
                queue_offset=queue_offset,
                physical_offsets=physical_offsets,
                sizes=batch.sizes,
                tag_codes=batch.tag_codes,  # type: ignore[arg-type]  # no delays: no None
                keys=None,
                store_timestamp=store_timestamp,
                queued=True,
                indexed=False,
            )
            for batch, queue_offset, physical_offsets in zip(
                batches, queue_offsets, offsets_per_batch, strict=True)
        ]
        if all(batch.keys is not None for batch in batches):  # None: the index is off
            first = batches[0]
            dispatch_batches.append(DispatchBatch(
                topic=first.topic,
                queue_id=first.queue_id,
                queue_offset=queue_offsets[0],
                physical_offsets=list(chain.from_iterable(offsets_per_batch)),
                sizes=[],
                tag_codes=[],
                keys=concatenated_keys([batch.keys for batch in batches]),  # type: ignore[misc]
                store_timestamp=store_timestamp,
                queued=False,
                indexed=True,
            ))
        try:
            for dispatch_batch in dispatch_batches:
                for dispatcher in self._dispatchers:
                    dispatcher.dispatch(dispatch_batch)
            self.last_dispatched_timestamp = store_timestamp
        except StoreError as e:
            self._dispatch_failed(e)

    def _notify(self, topic: str, queue_id: int, max_offset: int) -> None:
        for listener in self._listeners:
            try:
                listener(topic, queue_id, max_offset)
            except Exception:
                # A listener's bug must not fail an append that already happened.
                logger.exception("dispatch listener %r failed", listener)
        self._notify_appended()

    def _notify_appended(self) -> None:
        for listener in self._append_listeners:
            try:
                listener()
            except Exception:
                logger.exception("append listener %r failed", listener)

    def _notify_runs(self, topic: str, runs: list[QueueRun]) -> None:
        # ``_notify`` of each queue a queue group wrote, listener by listener.
        for listener in self._listeners:
            for queue, first_offset, count in runs:
                try:
                    listener(topic, queue.queue_id, first_offset + count)
                except Exception:
                    # A listener's bug must not fail an append that already happened.
                    logger.exception("dispatch listener %r failed", listener)
        self._notify_appended()  # once for the group

    def _write_refusal(self) -> str | None:
        """Why the store takes no write now, or None: closed, stopped after a failure, or
        its volume too full (the last one passes by itself)."""
        if self._closed:
            return "the store is closed"
        if self._not_writable_reason is not None:
            return self._not_writable_reason
        guard = self.disk_guard
        return guard.refusal() if guard is not None else None

    def _unavailable(self) -> PutResult:
        reason = self._write_refusal() or "the store is not writable"
        return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, f"cannot append: {reason}")

    def add_dispatch_listener(self, listener: DispatchListener) -> None:
        """Call ``listener(topic, queue_id, max_offset)`` after each dispatch to a queue."""
        self._listeners.append(listener)

    def add_append_listener(self, listener: Callable[[], None]) -> None:
        """See ``MessageStore.add_append_listener``: called with the dispatch listeners,
        once for a queue group."""
        self._append_listeners.append(listener)

    # -- reads ----------------------------------------------------------------------------------

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        max_bytes: int,
        tag_codes: Collection[int] | None = None,
    ) -> GetResult:
        """Read a queue (see ``MessageStore.get_messages`` and queue_reads.py)."""
        return queue_reads.get_messages(
            self.queues.get(topic, queue_id), self.commit_log, offset, max_count, max_bytes,
            tag_codes,
        )

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The next queue offset to be written (0 for an unknown queue)."""
        queue = self.queues.get(topic, queue_id)
        return queue.max_offset if queue is not None else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first readable queue offset (0 for an unknown queue)."""
        queue = self.queues.get(topic, queue_id)
        return queue.min_offset if queue is not None else 0

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """See ``MessageStore.offset_by_time``."""
        return queue_reads.offset_by_time(
            self.queues.get(topic, queue_id), self.commit_log, timestamp_ms
        )

    def earliest_message_time(self, topic: str, queue_id: int) -> int:
        """See ``MessageStore.earliest_message_time``."""
        return queue_reads.earliest_message_time(self.queues.get(topic, queue_id), self.commit_log)

    def read_message(self, physical_offset: int) -> bytes | None:
        """The record at ``physical_offset``, or None."""
        if physical_offset < self.commit_log.min_offset():
            return None
        return self.commit_log.read_record(physical_offset)

    def read_records(self, physical_offset: int, size: int) -> bytes | None:
        """See ``MessageStore.read_records``."""
        if physical_offset < self.commit_log.min_offset():
            return None
        return self.commit_log.read_records(physical_offset, size)

    def query_messages(
        self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> QueryResult:
        """See ``MessageStore.query_messages``; empty when the index is off."""
        if self.index is None:
            return QueryResult([], 0, 0)
        offsets = self.index.query(topic, key, max_count, begin_ms, end_ms)
        records = [
            record for record in map(self.read_message, offsets) if record is not None
        ]
        return QueryResult(
            records,
            self.index.last_update_timestamp_ms,
            max(0, self.index.last_update_physical_offset),
        )

    def commit_log_min_offset(self) -> int:
        """The first physical offset still stored."""
        return self.commit_log.min_offset()

    def commit_log_max_offset(self) -> int:
        """The physical offset the next record goes to."""
        return self.commit_log.max_offset()

    # -- replication (replication.py) -----------------------------------------------------------

    def _replica_of_store(self) -> CommitLogReplica:
        if self._replica is None:
            self._replica = CommitLogReplica(
                self.commit_log, self.queues, self.index, self._dispatchers, self._delay_level_ms
            )
        return self._replica

    def append_replicated(self, physical_offset: int, data: bytes | memoryview) -> int:
        """A slave's write of its master's commit-log bytes at ``physical_offset`` (see
        ``CommitLogReplica.append``); returns the log's new end.

        Raises:
            ReplicaMismatch: the bytes do not continue this log; nothing was written.
            StoreError: the store is closed, or a segment could not be created or written.
        """
        with self._append_lock:
            if self._closed:
                raise StoreError("the store is closed")
            return self._replica_of_store().append(physical_offset, data)

    def dispatch_replicated(self, max_bytes: int | None = None) -> int:
        """Verify and dispatch the whole records replicated so far (with ``max_bytes``, about
        that many bytes of them: a slice); tell the dispatch listeners; return the confirmed
        offset (the end of the last record dispatched).

        Raises:
            ReplicaCorrupt: replicated bytes are no record (the message names the offset).
        """
        with self._append_lock:
            if self._closed:
                raise StoreError("the store is closed")
            replica = self._replica_of_store()
            try:
                notes = replica.dispatch(max_bytes)
            finally:
                self.last_dispatched_timestamp = replica.last_store_timestamp
            confirmed = replica.confirmed_offset
        for topic, queue_id, max_offset in notes:
            self._notify(topic, queue_id, max_offset)
        return confirmed

    def reset_replica(self) -> None:
        """Forget the replica's view of the log (confirmed offset, last record): a broker
        about to copy from a master after writing as one (a role switch) starts it afresh
        from the log as it is, every record of which is dispatched."""
        with self._append_lock:
            self._replica = None

    def replicated_confirmed_offset(self) -> int:
        """The end of the last whole replicated (or recovered) record."""
        return self._replica_of_store().confirmed_offset

    def replicated_oldest_timestamp(self) -> int:
        """Store time of the first record the latest ``dispatch_replicated`` made readable
        (0: it made none); a slave's replication lag is "now" minus it."""
        return self._replica_of_store().dispatch_oldest_timestamp

    def last_record_offset(self) -> int:
        """The start of the last whole record of the log (-1 when it holds none).

        Known at once after replicated records were dispatched; otherwise found by walking
        the record headers of the last segment that holds a record (a start-up cost).
        """
        replica = self._replica_of_store()
        if replica.last_record_offset >= 0 or self.commit_log.max_offset() == 0:
            return replica.last_record_offset
        last = -1
        for mapped in reversed(self.commit_log.queue.files):
            for segment, position in self.commit_log.iter_positions(mapped.file_from_offset):
                if segment is not mapped:
                    break
                last = segment.file_from_offset + position
            if last >= 0:
                break
        replica.last_record_offset = last
        return last

    def read_commit_log(self, physical_offset: int, max_bytes: int) -> bytes | None:
        """A master's read for its slaves: up to ``max_bytes`` written bytes from
        ``physical_offset`` within one segment (empty: nothing written there yet; None: the
        offset is not in this log)."""
        return read_chunk(self.commit_log, physical_offset, max_bytes)

    # -- maintenance ----------------------------------------------------------------------------

    def delete_topic(self, topic: str) -> None:
        """Forget the topic's consume queues; its queues restart at offset 0."""
        with self._append_lock:
            self.queues.remove_topic(topic)
            # The start-up check must not rebuild the deleted queues from the log.
            manifest = rebuild.read_manifest(self.queues)
            if any(key[0] == topic for key in manifest):
                rebuild.drop_manifest(self.queues)

    def truncate(self, physical_offset: int) -> None:
        """Cut the commit log at ``physical_offset`` and the queue entries pointing past it."""
        with self._append_lock:
            rebuild.drop_manifest(self.queues)  # queues shrink now, legitimately
            self.commit_log.truncate(physical_offset)
            for queue in self.queues.all():
                queue.truncate_from_physical(physical_offset)

    def truncate_to(self, physical_offset: int, *, finish: bool = False) -> Truncation:
        """Make ``physical_offset`` (a record boundary) the end of the log, crash-safely, and
        drop everything derived from the records after it: consume-queue entries, index
        entries, epoch-file entries (truncation.py). Returns what was dropped.

        Idempotent: truncating to the log's end changes nothing (but still drops epoch
        entries starting there), unless ``finish`` (an interrupted truncation, whose commit
        log may already be cut while its queues and index are not). Writes are held off
        while it runs (the append lock).

        Raises:
            StoreError: the offset is outside the log or not a record boundary (nothing was
                changed), or a file could not be written (the intent file makes the next
                open finish the truncation).
        """
        with self._append_lock:
            if self._closed:
                raise StoreError("the store is closed")
            end = self.commit_log.max_offset()
            problem = self._cut_problem(physical_offset, end)
            if problem is not None:
                raise StoreError(problem)
            truncation = Truncation(physical_offset, end)
            truncation.records = list(dropped_records(
                self.commit_log, physical_offset,
                lambda offset: _offset_msg_ids(self._msg_id_prefix, [offset])[0]))
            cut = physical_offset < end or finish
            if self.truncate_intent is not None and cut:
                self.truncate_intent.record(physical_offset)
            if self.epochs is not None:
                truncation.epochs_dropped = [
                    entry.epoch for entry in self.epochs.truncate_from(physical_offset)]
            if cut:
                self._cut(physical_offset)
            if self.truncate_intent is not None:
                self.truncate_intent.clear()
            return truncation

    def _cut_problem(self, physical_offset: int, end: int) -> str | None:
        low = self.commit_log.min_offset()
        if physical_offset > end or (physical_offset < low and end > 0):
            return (
                f"cannot truncate the commit log to offset {physical_offset}: it holds "
                f"offsets {low} to {end}"
            )
        replica = self._replica
        boundary = (
            physical_offset == end
            or physical_offset % self.commit_log.file_size == 0
            # A slave's copy past its last whole record: the master's boundaries (its bytes
            # up to there are the master's), where no whole record may start yet.
            or (replica is not None and physical_offset >= replica.confirmed_offset)
            or self.commit_log.read_record(physical_offset) is not None
            or self._blank_marker_at(physical_offset)
        )
        if not boundary:
            return (
                f"cannot truncate the commit log to offset {physical_offset}: no record "
                "starts there (an offset inside a record would leave half of it)"
            )
        return None

    def _blank_marker_at(self, physical_offset: int) -> bool:
        mapped = self.commit_log.find_file(physical_offset)
        if mapped is None:
            return False
        position = physical_offset - mapped.file_from_offset
        if position + 8 > mapped.write_position:
            return False
        total, magic = struct.unpack_from(">ii", mapped.buffer, position)
        return magic == BLANK_MAGIC and total == mapped.file_size - position

    def _cut(self, physical_offset: int) -> None:
        # Under the append lock; each step is idempotent (a crash replays them all).
        rebuild.drop_manifest(self.queues)  # queues shrink now, legitimately
        allocator = getattr(self.commit_log, "allocator", None)
        if allocator is not None:
            allocator.discard()
        self.commit_log.truncate(physical_offset)
        cut_segment = self.commit_log.find_file(physical_offset)
        if cut_segment is None and physical_offset > 0:
            cut_segment = self.commit_log.find_file(physical_offset - 1)
        for queue in self.queues.all():
            queue.truncate_from_physical(physical_offset)
        if self.index is not None:
            self.index.drop_from(physical_offset, self.commit_log.store_timestamp_at)
            recovery.redispatch(self.commit_log, self.queues, self.index, self._dispatchers,
                                self._delay_level_ms)
        self._replica = None  # its confirmed offset and last record are past the cut
        self.commit_log.flush()
        if cut_segment is not None:
            sync_file(cut_segment.path)
        for queue in self.queues.all():
            queue.flush()
        if self.index is not None:
            self.index.flush()

    def consume_queue_entries(self, topic: str, queue_id: int, queue_offset: int,
                              count: int) -> list[tuple[int, int, int]]:
        """See ``MessageStore.consume_queue_entries``."""
        queue = self.queues.get(topic, queue_id)
        entries: list[tuple[int, int, int]] = []
        if queue is None:
            return entries
        for offset in range(max(queue_offset, queue.min_offset), queue_offset + count):
            entry = queue.entry(offset)
            if entry is None:
                break
            entries.append(entry)
        return entries

    def queue_topics(self) -> set[str]:
        """See ``MessageStore.queue_topics``."""
        return {queue.topic for queue in self.queues.all()}

    def clean_expired_consume_queues(self) -> int:
        """See ``MessageStore.clean_expired_consume_queues``."""
        with self._append_lock:
            commit_log_min = self.commit_log.min_offset()
            count = 0
            for queue in self.queues.all():
                count += queue.delete_files_below(commit_log_min)
                queue.correct_min_offset(commit_log_min)
        return count

    def run_retention(self, now_ms: int, disk_used_ratio: float | None = None) -> int:
        """See ``MessageStore.run_retention`` and retention.py."""
        if self._closed:
            return 0
        ratio = self._disk_used_ratio() if disk_used_ratio is None else disk_used_ratio
        with self._append_lock:
            # The policy is read from the settings each run: updateBrokerConfig may change
            # fileReservedTime, deleteWhen and diskMaxUsedSpaceRatio while the broker runs.
            policy = RetentionPolicy.from_config(self.config)
            count = policy.segments_to_delete(self.commit_log.queue.files, now_ms, ratio)
            if count == 0:
                return 0
            deleted = self.commit_log.queue.delete_first_files(count)
            commit_log_min = self.commit_log.min_offset()
            for queue in self.queues.all():
                queue.delete_files_below(commit_log_min)
                queue.correct_min_offset(commit_log_min)
        for segment in deleted:
            logger.info("retention deleted commit-log segment %s", segment.describe())
        if self.index is not None:
            self.index.delete_files_below(commit_log_min)
        return len(deleted)

    def _disk_used_ratio(self) -> float:
        return 0.0

    def flush(self) -> None:
        """Sync the commit log, the consume queues and the index."""
        self.commit_log.flush()
        for queue in self.queues.all():
            queue.flush()
        if self.index is not None:
            self.index.flush()

    def close(self) -> None:
        """Stop taking writes and release the parts."""
        with self._append_lock:
            if self._closed:
                return
            self._closed = True
        self.queues.close()
        self.commit_log.close()
        if self.index is not None:
            self.index.close()

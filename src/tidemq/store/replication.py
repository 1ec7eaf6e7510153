"""Replication, the store's side: a slave writes its master's commit-log bytes at the
master's offsets and dispatches the whole records among them; a master reads its log in
chunks to send.

The HA stream (docs/protocol.md, "Master/slave replication") carries raw commit-log bytes
in chunks of up to ``haTransferBatchSize``, each inside one segment of the master's log
and each starting where the previous one ended. A chunk may end in the middle of a record;
the next chunk brings the rest. So the slave's log has two ends:

- ``max_offset`` (the commit log's write end): every byte the master sent so far, maybe
  ending inside a record. This is what the slave reports to its master;
- ``confirmed_offset``: the end of the last whole record that was verified (magic, sizes,
  PHYSICALOFFSET, body CRC) and dispatched to the consume queues and the index. Readers see
  only records below it, because only dispatched records have queue entries.

Theory of an ``append(physical_offset, data)``:

1. the offset must be this log's end; an empty log takes any segment start (a slave that
   starts from nothing copies from wherever its master's log begins);
2. the bytes go into the segment holding the offset; a chunk that starts a segment needs
   the previous one complete; a chunk never crosses a segment end (the master reads within
   one segment) — either is ``ReplicaMismatch``, and nothing is written;
3. ``dispatch()`` (after one or more appends) walks the records from ``confirmed_offset``
   and dispatches every whole one, consecutive records of one queue as one batch. A record
   cut by the end of the written bytes waits for the next chunk; the blank marker at a
   segment's end moves on to the next segment once that segment is written to its end.
   Bytes that are no record at all raise ``ReplicaCorrupt`` naming the offset: the
   slave refuses to go on rather than serve or dispatch them.

After a crash of the slave, recovery cuts a record torn by the crash (or by a chunk cut in
the middle of it) like any torn tail, so the slave starts again at a record boundary and
asks its master for the rest.

Threads: ``append`` and ``dispatch`` run under the store's append lock (the store's methods
take it), like appends on a master; ``read_chunk`` (master) reads below the write position
without a lock, like any reader.
"""

from __future__ import annotations

import functools
import logging
import struct
from collections.abc import Callable, Sequence

from tidemq.errors import StoreError
from tidemq.protocol.crc import crc32 as accelerated_crc32
from tidemq.protocol.message import (
    BLANK_MAGIC,
    KEY_SEPARATOR,
    MAGIC_V1,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    SYSFLAG_TRANSACTION_MASK,
    TRANSACTION_ROLLBACK_TYPE,
    decode_properties,
    record_size,
    store_timestamp_position,
    tags_code,
)
from tidemq.store.commit_log import CommitLog
from tidemq.store.config import SCHEDULE_TOPIC
from tidemq.store.consume_queue_table import ConsumeQueueTable
from tidemq.store.dispatch import DispatchBatch, Dispatcher, KeyIndex
from tidemq.store.mapped_file import MappedFile
from tidemq.store.record_check import inspect_record
from tidemq.store.record_encoder import QUEUED_TRANSACTION_TYPES, delivery_tag_code

logger = logging.getLogger(__name__)

_SIZE_MAGIC = struct.Struct(">ii")
# TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG: a record's head.
_HEAD = struct.Struct(">iiiiiqqi")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_BLANK_MARKER_SIZE = 8
_MIN_RECORD_SIZE = record_size(0, 0, 0)
_HOSTS_V6 = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
# Bytes before the body (BODYLENGTH ends them), by the hosts' address families.
_PREFIX_SIZES = {bits: record_size(0, 0, 0, bits) - 3
                 for bits in (0, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6, _HOSTS_V6)}
_STORE_TIMESTAMP_POSITIONS = {bits: store_timestamp_position(bits)
                              for bits in (0, SYSFLAG_BORNHOST_V6)}


class ReplicaMismatch(StoreError):
    """Replicated bytes do not continue this log (wrong offset, a segment skipped); the
    message names both offsets. Nothing was written."""


class ReplicaCorrupt(StoreError):
    """Replicated bytes are not a valid record; the message names the offset and why."""


# fn(topic, queue_id, max_offset): told after a replicated record reached that queue.
QueueNotify = Callable[[str, int, int], None]


class CommitLogReplica:
    """Writes a master's commit-log bytes into this store and dispatches them (a slave).

    Args:
        commit_log, queues, index, dispatchers: the store's parts.
        delay_level_ms: the delay levels (tag codes of SCHEDULE_TOPIC_XXXX records).
    """

    def __init__(
        self,
        commit_log: CommitLog,
        queues: ConsumeQueueTable,
        index: KeyIndex | None,
        dispatchers: Sequence[Dispatcher],
        delay_level_ms: Sequence[int],
    ) -> None:
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        self._dispatchers = dispatchers
        self._delay_level_ms = delay_level_ms
        # Recovery left the log at a record boundary with everything dispatched.
        self.confirmed_offset = commit_log.max_offset()
        # Start of the last whole record dispatched here (-1: none yet); the slave compares
        # it with its master's record at the same offset before streaming.
        self.last_record_offset = -1
        self.last_store_timestamp = commit_log.last_store_timestamp
        self._topic_names: dict[bytes, str] = {}
        # Store time of the first record the latest ``dispatch`` made readable (0: none); the
        # slave's replication lag is "now" minus it.
        self.dispatch_oldest_timestamp = 0

    # -- appends --------------------------------------------------------------------------------

    def append(self, physical_offset: int, data: bytes | memoryview) -> int:
        """Write ``data`` at ``physical_offset``; return the log's new end.

        Raises:
            ReplicaMismatch: the offset is not this log's end, or the chunk would cross a
                segment end or skip one. Nothing was written.
            StoreFull / StoreError: a segment could not be created or written.
        """
        if not data:
            return self.commit_log.max_offset()
        file_size = self.commit_log.file_size
        last = self.commit_log.queue.last_file()
        end = self.commit_log.max_offset()
        if last is None:
            if physical_offset % file_size:
                raise ReplicaMismatch(
                    f"this commit log is empty and can start only at a segment start (a "
                    f"multiple of {file_size}), not at offset {physical_offset}"
                )
            self._start_log_at(physical_offset)
        elif physical_offset != end:
            raise ReplicaMismatch(
                f"replicated bytes start at offset {physical_offset} but this commit log "
                f"ends at {end}"
            )
        mapped = self._segment_for(physical_offset)
        position = physical_offset - mapped.file_from_offset
        if position + len(data) > file_size:
            raise ReplicaMismatch(
                f"{len(data)} replicated bytes at offset {physical_offset} cross the end of "
                f"segment {mapped.describe()} (segments here are {file_size} bytes; the "
                "master's mappedFileSizeCommitLog must be the same)"
            )
        if mapped.reserved_position < mapped.file_size:
            mapped.reserve(mapped.file_size)  # a full disk refuses here, never faults below
        self.commit_log.write_raw(mapped, data)
        return mapped.end_offset

    def _start_log_at(self, physical_offset: int) -> None:
        # An empty log (a slave started from an empty disk) begins at the master's offset.
        # The dispatch starts there too: nothing before it exists here.
        self.commit_log.start_segment_at(physical_offset)
        self.confirmed_offset = physical_offset
        for queue in self.queues.all():
            queue.correct_min_offset(physical_offset)

    def _segment_for(self, physical_offset: int) -> MappedFile:
        last = self.commit_log.queue.last_file()
        assert last is not None
        if physical_offset < last.file_from_offset + last.file_size:
            return last
        if last.write_position != last.file_size:
            raise ReplicaMismatch(
                f"replicated bytes start a new segment at offset {physical_offset} but "
                f"segment {last.describe()} is written only to {last.end_offset}"
            )
        return self.commit_log.start_segment_at(physical_offset)

    # -- dispatch -------------------------------------------------------------------------------

    def dispatch(self, max_bytes: int | None = None) -> list[tuple[str, int, int]]:
        """Verify and dispatch every whole record past ``confirmed_offset`` (with
        ``max_bytes``: stop at the first record boundary at least that far past it, so a
        slave far behind can dispatch in slices).

        Returns:
            ``(topic, queue id, queue max offset)`` of each queue that got entries, for the
            store's dispatch listeners (long-polling pulls on the slave).
        Raises:
            ReplicaCorrupt: the bytes at ``confirmed_offset`` or later are no record;
                everything before them is dispatched.
        """
        runs: list[_Run] = []
        self.dispatch_oldest_timestamp = 0
        try:
            self._walk(runs, max_bytes)
        finally:
            for run in runs:
                self._dispatch_run(run)
        notes = []
        for topic, queue_id in {(run.topic, run.queue_id) for run in runs if run.queued}:
            queue = self.queues.get(topic, queue_id)
            if queue is not None:
                notes.append((topic, queue_id, queue.max_offset))
        return notes

    def _walk(self, runs: list[_Run], max_bytes: int | None = None) -> None:
        # The hot loop of a catch-up: one struct unpack for the head, one CRC, the topic
        # from a cache, the properties parsed once. Anything else (a blank marker, a record
        # cut by the end of what arrived, a bad record) leaves the inner loop and is sorted
        # out below; inspect_record names what is wrong with a bad one.
        offset = self.confirmed_offset
        stop_at = offset + max_bytes if max_bytes is not None else 1 << 62
        queue = self.commit_log.queue
        with_keys = self.index is not None
        delay_level_ms = self._delay_level_ms
        topics = self._topic_names
        unpack_head = _HEAD.unpack_from
        unpack_int32 = _INT32.unpack_from
        unpack_int16 = _INT16.unpack_from
        unpack_int64 = _INT64.unpack_from
        crc32 = accelerated_crc32
        mapped = queue.find_file(offset)
        while mapped is not None:
            buffer = mapped.buffer
            file_size = mapped.file_size
            base = mapped.file_from_offset
            written = mapped.write_position
            position = offset - base
            while written - position >= _BLANK_MARKER_SIZE and offset < stop_at:
                (total, magic, crc, queue_id, _, queue_offset, stored_offset,
                 sysflag) = unpack_head(buffer, position)
                if (magic != MAGIC_V1 or total > written - position or total < _MIN_RECORD_SIZE
                        or stored_offset != offset):
                    break
                body_start = position + _PREFIX_SIZES[sysflag & _HOSTS_V6]
                cursor = body_start + unpack_int32(buffer, body_start - 4)[0]
                end = position + total
                if cursor < body_start or cursor + 3 > end:
                    break
                properties_at = cursor + 1 + buffer[cursor]
                if (properties_at + 2 > end
                        or properties_at + 2 + unpack_int16(buffer, properties_at)[0] != end
                        or crc32(buffer[body_start:cursor]) & 0x7FFFFFFF != crc):
                    break
                topic_bytes = bytes(buffer[cursor + 1 : properties_at])
                topic = topics.get(topic_bytes)
                if topic is None:
                    topic = topics[topic_bytes] = topic_bytes.decode("utf-8", "replace")
                store_timestamp = unpack_int64(
                    buffer, position + _STORE_TIMESTAMP_POSITIONS[sysflag & SYSFLAG_BORNHOST_V6]
                )[0]
                text = str(buffer[properties_at + 2 : end], "utf-8", "replace")
                properties = decode_properties(text)
                get = properties.get
                transaction_type = sysflag & SYSFLAG_TRANSACTION_MASK
                if topic == SCHEDULE_TOPIC:
                    level_text = get(PROPERTY_DELAY_TIME_LEVEL, "")
                    level = int(level_text) if level_text.isdigit() else 0
                    tag_code = delivery_tag_code(level, store_timestamp, delay_level_ms)
                else:
                    tag_code = _tags_code(get(PROPERTY_TAGS))
                queued = transaction_type in QUEUED_TRANSACTION_TYPES
                indexed = transaction_type != TRANSACTION_ROLLBACK_TYPE
                last = runs[-1] if runs else None
                if (last is None or last.topic != topic or last.queue_id != queue_id
                        or last.queued != queued or last.indexed != indexed
                        or last.store_timestamp != store_timestamp
                        or (queued and last.next_queue_offset != queue_offset)):
                    last = _Run(topic, queue_id, queue_offset, store_timestamp, queued,
                                indexed, with_keys)
                    runs.append(last)
                if with_keys:
                    unique_key = get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
                    user_keys = get(PROPERTY_KEYS)
                    keys = [unique_key] if unique_key else []
                    if user_keys:
                        keys.extend(token for token in user_keys.split(KEY_SEPARATOR) if token)
                else:
                    keys = None
                last.add(offset, total, tag_code, keys)
                if not self.dispatch_oldest_timestamp:
                    self.dispatch_oldest_timestamp = store_timestamp
                self.last_record_offset = offset
                self.last_store_timestamp = store_timestamp
                position = end
                offset += total
                self.confirmed_offset = offset
            if offset >= stop_at:
                break  # this slice is done; the next dispatch goes on from here
            remaining = written - position
            if remaining < _BLANK_MARKER_SIZE:
                if position == file_size:  # exactly full: go on in the next segment
                    offset = base + file_size
                    mapped = queue.find_file(offset)
                    continue
                break
            total, magic = _SIZE_MAGIC.unpack_from(buffer, position)
            if magic == BLANK_MAGIC and total == file_size - position:
                if written != file_size:
                    break  # the rest of the segment has not arrived yet
                offset = base + file_size
                mapped = queue.find_file(offset)
                continue
            if magic == MAGIC_V1 and remaining < total <= file_size - position:
                break  # cut by the end of what arrived; the next chunk brings the rest
            inspection = inspect_record(buffer, position, written, offset, True)
            self.confirmed_offset = offset
            raise ReplicaCorrupt(
                f"replicated bytes at commit-log offset {offset} ({mapped.describe()}:"
                f"{position}) are not a record: "
                f"{inspection.problem or 'the record does not parse'}"
            )
        self.confirmed_offset = offset

    def _dispatch_run(self, run: _Run) -> None:
        batch = DispatchBatch(
            topic=run.topic,
            queue_id=run.queue_id,
            queue_offset=run.queue_offset,
            physical_offsets=run.physical_offsets,
            sizes=run.sizes,
            tag_codes=run.tag_codes,
            keys=run.keys,
            store_timestamp=run.store_timestamp,
            queued=run.queued,
            indexed=run.indexed,
        )
        for dispatcher in self._dispatchers:
            dispatcher.dispatch(batch)
        self.commit_log.last_store_timestamp = run.store_timestamp


class _Run:
    """Consecutive records of one queue, of one kind and store time: one dispatch batch."""

    __slots__ = ("indexed", "keys", "next_queue_offset", "physical_offsets", "queue_id",
                 "queue_offset", "queued", "sizes", "store_timestamp", "tag_codes", "topic")

    def __init__(self, topic: str, queue_id: int, queue_offset: int, store_timestamp: int,
                 queued: bool, indexed: bool, with_keys: bool) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.next_queue_offset = queue_offset
        self.store_timestamp = store_timestamp
        self.queued = queued
        self.indexed = indexed
        self.physical_offsets: list[int] = []
        self.sizes: list[int] = []
        self.tag_codes: list[int] = []
        self.keys: list[Sequence[str]] | None = [] if with_keys else None

    def add(self, physical_offset: int, size: int, tag_code: int,
            keys: Sequence[str] | None) -> None:
        """Take one more record of the run."""
        self.physical_offsets.append(physical_offset)
        self.sizes.append(size)
        self.tag_codes.append(tag_code)
        if self.keys is not None:
            self.keys.append(keys or [])
        self.next_queue_offset += 1


@functools.lru_cache(maxsize=4096)
def _tags_code(tags: str | None) -> int:
    return tags_code(tags)


# -- the master's side ---------------------------------------------------------------------------


def read_chunk(commit_log: CommitLog, physical_offset: int, max_bytes: int) -> bytes | None:
    """Up to ``max_bytes`` written bytes from ``physical_offset``, within one segment.

    Returns:
        the bytes (empty when nothing is written there yet), or None when the offset is
        below the log's first segment (retention deleted it) or not in the log at all.
    """
    if physical_offset < commit_log.min_offset():
        return None
    mapped = commit_log.find_file(physical_offset)
    if mapped is None:
        # The end of the log is a segment end: the next segment does not exist yet.
        return b"" if physical_offset == commit_log.max_offset() else None
    position = physical_offset - mapped.file_from_offset
    size = min(max_bytes, mapped.write_position - position)
    if size <= 0:
        return b"" if position == mapped.write_position else None
    try:
        return mapped.read(position, size)
    except ValueError:  # retention deleted the segment while we read it
        return None

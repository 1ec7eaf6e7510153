"""Dispatch: derive consume-queue entries and index keys from appended records.

The commit log is the only truth; consume queues and the index are built from it by a list
of dispatchers, each fed a ``DispatchBatch`` (the records of one queue appended together):

- on the hot path the append builds the batch from what it already knows (offsets, sizes,
  tag codes, keys), with no re-parse of the bytes it just wrote;
- recovery builds one per record by parsing the commit log (``batch_from_record``).

Rules (docs/protocol.md §6.2): only transaction types NOT and COMMIT get consume-queue entries;
the index covers NOT, PREPARED and COMMIT records (not ROLLBACK). A record is indexed under
``topic#UNIQ_KEY`` and ``topic#<each KEYS token>``. Both dispatchers are idempotent, so
re-dispatching a record that is already there changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import NamedTuple, Protocol

from tidemq.protocol.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    SYSFLAG_TRANSACTION_MASK,
    TRANSACTION_ROLLBACK_TYPE,
)
from tidemq.store.config import SCHEDULE_TOPIC
from tidemq.store.consume_queue import ENTRY, ENTRY_SIZE, ConsumeQueue, pack_entries
from tidemq.store.consume_queue_table import ConsumeQueueTable
from tidemq.store.record_check import DispatchFields
from tidemq.store.record_encoder import (
    QUEUED_TRANSACTION_TYPES,
    delivery_tag_code,
    index_keys,
    tag_code_of,
)

_pack_entry = ENTRY.pack


class QueueRun(NamedTuple):
    """A queue group's records of one queue: its first queue offset and how many."""

    queue: ConsumeQueue
    first_offset: int
    count: int


class QueueRuns(NamedTuple):
    """A queue group's records by queue, as its append found them: ``order`` the records'
    positions in queue order (ascending queue ids, each queue's in arrival order), ``runs``
    each queue's run of them in that order."""

    order: list[int]
    runs: list[QueueRun]


def queue_order(queue_ids: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """A queue group's records by queue: their positions in queue order (ascending queue
    ids, each queue's records in arrival order: a stable sort) and each queue's
    ``(queue_id, count)`` in that order; a Python step per queue, none per record."""
    order = sorted(range(len(queue_ids)), key=queue_ids.__getitem__)
    return order, [(queue_id, len(list(run)))
                   for queue_id, run in groupby(map(queue_ids.__getitem__, order))]


@dataclass(slots=True)
class DispatchBatch:
    """Consecutive records of one queue, as dispatchers need them.

    A queue group (records of one topic in several queues, appended together) sets
    ``queue_runs``, the records by queue as its append found them; ``queue_id`` and
    ``queue_offset`` are then the first record's.
    """

    topic: str
    queue_id: int
    queue_offset: int  # of the first record; the others follow by one
    physical_offsets: list[int]
    sizes: list[int]
    tag_codes: list[int]
    keys: list[Sequence[str]] | None  # per record; None when the index is off
    store_timestamp: int
    queued: bool  # gets consume-queue entries
    indexed: bool  # gets index keys
    queue_runs: QueueRuns | None = None


class Dispatcher(Protocol):
    """Something derived from the commit log."""

    def dispatch(self, batch: DispatchBatch) -> None:
        """Take in the batch's records (idempotently)."""

    def dispatch_one(self, topic: str, queue_id: int, queue_offset: int, physical_offset: int,
                     size: int, tag_code: int, keys: Sequence[str] | None,
                     store_timestamp: int) -> None:
        """Take in one queued (and so indexed) record: ``dispatch`` of a one-record batch
        without building it (a lone send's append). ``keys`` None: the index is off."""


class KeyIndex(Protocol):
    """The part of the index service dispatch and queries use (IndexService, MemoryIndex)."""

    @property
    def last_update_physical_offset(self) -> int: ...

    @property
    def last_update_timestamp_ms(self) -> int: ...

    def ensure_room(self, key_count: int) -> None: ...

    def put(self, topic: str, keys: Sequence[str], physical_offset: int,
            store_timestamp_ms: int) -> None: ...

    def query(self, topic: str, key: str, max_count: int, begin_ms: int,
              end_ms: int) -> list[int]: ...

    def flush(self) -> None: ...

    def delete_files_below(self, min_physical_offset: int) -> int: ...

    def drop_from(self, physical_offset: int,
                  timestamp_at: Callable[[int], int | None] = ...) -> int: ...

    def close(self) -> None: ...


class ConsumeQueueDispatcher:
    """Writes consume-queue entries, one struct pack per batch."""

    def __init__(self, queues: ConsumeQueueTable) -> None:
        self.queues = queues

    def dispatch(self, batch: DispatchBatch) -> None:
        """Append the batch's entries to its queue (skipping those already there)."""
        if not batch.queued:
            return
        if batch.queue_runs is not None:
            self._put_runs(batch, batch.queue_runs)
            return
        queue = self.queues.get_or_create(batch.topic, batch.queue_id)
        entries = pack_entries(batch.physical_offsets, batch.sizes, batch.tag_codes)
        queue.put(batch.queue_offset, entries, batch.store_timestamp)

    def dispatch_one(self, topic: str, queue_id: int, queue_offset: int, physical_offset: int,
                     size: int, tag_code: int, keys: Sequence[str] | None,
                     store_timestamp: int) -> None:
        """Append one record's entry to its queue (see ``Dispatcher.dispatch_one``)."""
        self.queues.get_or_create(topic, queue_id).put(
            queue_offset, _pack_entry(physical_offset, size, tag_code), store_timestamp)

    @staticmethod
    def _put_runs(batch: DispatchBatch, queue_runs: QueueRuns) -> None:
        # A queue group: its entries packed in queue order with one struct call, and each
        # queue's run put at once: no Python step per record.
        order = queue_runs.order
        entries = pack_entries(
            list(map(batch.physical_offsets.__getitem__, order)),
            list(map(batch.sizes.__getitem__, order)),
            list(map(batch.tag_codes.__getitem__, order)),
        )
        store_timestamp = batch.store_timestamp
        start = 0
        for queue, first_offset, count in queue_runs.runs:
            end = start + count * ENTRY_SIZE
            queue.put(first_offset, entries[start:end], store_timestamp)
            start = end


class IndexDispatcher:
    """Puts each record's keys into the index: a batch in one ``put_columns`` when the index
    has it (IndexService), else one ``put`` per record."""

    def __init__(self, index: KeyIndex) -> None:
        self.index = index
        self._put_columns = getattr(index, "put_columns", None)

    def dispatch_one(self, topic: str, queue_id: int, queue_offset: int, physical_offset: int,
                     size: int, tag_code: int, keys: Sequence[str] | None,
                     store_timestamp: int) -> None:
        """Index one record under its keys (see ``Dispatcher.dispatch_one``)."""
        if keys:
            self.index.put(topic, keys, physical_offset, store_timestamp)

    def dispatch(self, batch: DispatchBatch) -> None:
        """Index every record of the batch under its keys (records with none are skipped)."""
        if not batch.indexed or batch.keys is None:
            return
        topic = batch.topic
        timestamp = batch.store_timestamp
        if self._put_columns is not None and len(batch.keys) > 1:
            self._put_columns(topic, batch.physical_offsets, batch.keys, timestamp)
            return
        put = self.index.put
        for physical_offset, keys in zip(batch.physical_offsets, batch.keys, strict=True):
            if keys:
                put(topic, keys, physical_offset, timestamp)


def batch_from_record(
    fields: DispatchFields,
    physical_offset: int,
    size: int,
    delay_level_ms: Sequence[int],
    with_keys: bool,
) -> DispatchBatch:
    """A one-record batch rebuilt from a stored record (recovery's re-dispatch)."""
    properties = fields.properties
    transaction_type = fields.sysflag & SYSFLAG_TRANSACTION_MASK
    if fields.topic == SCHEDULE_TOPIC:
        level_text = properties.get(PROPERTY_DELAY_TIME_LEVEL, "")
        level = int(level_text) if level_text.isdigit() else 0
        tag_code = delivery_tag_code(level, fields.store_timestamp, delay_level_ms)
    else:
        tag_code = tag_code_of(properties)
    return DispatchBatch(
        topic=fields.topic,
        queue_id=fields.queue_id,
        queue_offset=fields.queue_offset,
        physical_offsets=[physical_offset],
        sizes=[size],
        tag_codes=[tag_code],
        keys=[index_keys(properties)] if with_keys else None,
        store_timestamp=fields.store_timestamp,
        queued=transaction_type in QUEUED_TRANSACTION_TYPES,
        indexed=transaction_type != TRANSACTION_ROLLBACK_TYPE,
    )

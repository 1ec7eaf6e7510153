"""Rebuild consume queues found wrong at start-up from the commit log (after either stop).

The consume queues are derived from the commit log, so a lost, cut or zeroed queue file costs
a re-read of the log, never a message. Recovery (recovery.py) decides which queues are wrong,
in O(queues) plus O(segments) work, never a scan of the log:

- a segment of the wrong size (cut short): found at load (consume_queue_table.py);
- missing or short against the manifest: at every clean close the store writes each queue's
  max offset to ``consumequeue/manifest.json``; a queue missing from disk, or holding fewer
  entries than it had then, lost files (queues only grow; deleting a topic rewrites the
  manifest, truncating the log drops it);
- a missing segment between two others, or a zeroed one: a segment before the last whose
  first or last entry is all zeros;
- a gap found by re-dispatch after a crash: a record whose queue offset is past the queue's
  end (the entries between were lost).

The tail checks (entries past the log, the last entry pointing at the wrong record) stay in
recovery.py: they cut the queue, and re-dispatch refills it.

A rebuild deletes the queue's files and dispatches every record of the commit log that
belongs to it, reading only each record's queue id before parsing the few that match.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import Collection, Sequence

import orjson

from tidemq.limits import topic_name_problem
from tidemq.store.commit_log import CommitLog
from tidemq.store.consume_queue import ENTRY_SIZE, ConsumeQueue
from tidemq.store.consume_queue_table import ConsumeQueueTable
from tidemq.store.dispatch import ConsumeQueueDispatcher, batch_from_record
from tidemq.store.record_check import dispatch_fields

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
_ZERO_ENTRY = bytes(ENTRY_SIZE)
MIN_RECORD_SIZE = 91  # a record with empty body, topic and properties


def manifest_path(queues: ConsumeQueueTable) -> str | None:
    """Where the manifest lives (None for in-memory queues)."""
    return None if queues.directory is None else os.path.join(queues.directory, MANIFEST_NAME)


def write_manifest(queues: ConsumeQueueTable) -> None:
    """Record every queue's max offset (at a clean close, after the final flush)."""
    path = manifest_path(queues)
    if path is None:
        return
    table: dict[str, dict[str, int]] = {}
    for queue in queues.all():
        if queue.max_offset:
            table.setdefault(queue.topic, {})[str(queue.queue_id)] = queue.max_offset
    temporary = path + ".tmp"
    try:
        os.makedirs(queues.directory, exist_ok=True)  # type: ignore[arg-type]
        with open(temporary, "wb") as f:
            f.write(orjson.dumps(table))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except OSError as e:
        # Only the start-up check of the next open loses its reference; say so.
        logger.warning("cannot write the consume-queue manifest %s: %s", path, e)


def read_manifest(queues: ConsumeQueueTable) -> dict[tuple[str, int], int]:
    """(topic, queue id) -> max offset at the last clean close; empty when there is none."""
    path = manifest_path(queues)
    if path is None or not os.path.exists(path):
        return {}
    try:
        with open(path, "rb") as f:
            table = orjson.loads(f.read())
        return {
            (topic, int(queue_id)): int(max_offset)
            for topic, by_queue in table.items()
            for queue_id, max_offset in by_queue.items()
        }
    except (OSError, ValueError, AttributeError, TypeError) as e:
        logger.warning("ignoring the unreadable consume-queue manifest %s: %s", path, e)
        return {}


def drop_manifest(queues: ConsumeQueueTable) -> None:
    """Forget the manifest (the log was truncated: queues may shrink legitimately)."""
    path = manifest_path(queues)
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def segment_problem(queue: ConsumeQueue) -> str | None:
    """Why the queue's segments cannot be trusted: one missing between two others, or one
    before the last that looks zeroed (its first or last entry is zeros); else None."""
    segments = queue.segments()
    for before, after in itertools.pairwise(segments):
        if after.file_from_offset != before.file_from_offset + before.file_size:
            return f"the segment after {before.describe()} is missing"
    for mapped in segments[:-1]:
        buffer = mapped.buffer
        last = mapped.file_size - ENTRY_SIZE
        if buffer[:ENTRY_SIZE] == _ZERO_ENTRY or buffer[last : last + ENTRY_SIZE] == _ZERO_ENTRY:
            return f"segment {mapped.describe()} holds zeros where entries should be"
    return None


def rebuild_queues(
    commit_log: CommitLog,
    queues: ConsumeQueueTable,
    reasons: dict[tuple[str, int], str],
    delay_level_ms: Sequence[int],
) -> int:
    """Delete the files of the queues in ``reasons`` and dispatch their records again from
    the whole commit log; return how many records were dispatched."""
    for (topic, queue_id), reason in sorted(reasons.items()):
        logger.warning(
            "consume queue %s/%d: %s; rebuilding it from the commit log", topic, queue_id, reason
        )
        queues.reset(topic, queue_id)
    wanted: Collection[tuple[str, int]] = set(reasons)
    queue_ids = {queue_id for _, queue_id in wanted}
    dispatcher = ConsumeQueueDispatcher(queues)
    damaged = commit_log.damaged
    count = 0
    for mapped, position in commit_log.iter_positions(commit_log.min_offset()):
        buffer = mapped.buffer
        if int.from_bytes(buffer[position + 12 : position + 16], "big") not in queue_ids:
            continue
        fields = dispatch_fields(buffer, position)
        if (fields.topic, fields.queue_id) not in wanted:
            continue
        physical_offset = mapped.file_from_offset + position
        queue = queues.get(fields.topic, fields.queue_id)
        expected = queue.max_offset if queue is not None else 0
        if expected and fields.queue_offset > expected + _records_lost_before(
            damaged, physical_offset
        ):
            # Records of a queue follow each other in the log: a jump further than the
            # damaged bytes before it could hide is a damaged QUEUEOFFSET (the body CRC does
            # not cover it). Taking it would hide every later record of the queue.
            logger.error(
                "record at %s:%d claims queue offset %d of %s/%d, where %d comes next: a "
                "damaged header; not queued", mapped.describe(), position,
                fields.queue_offset, fields.topic, fields.queue_id, expected,
            )
            continue
        size = int.from_bytes(buffer[position : position + 4], "big")
        batch = batch_from_record(fields, physical_offset, size, delay_level_ms, False)
        dispatcher.dispatch(batch)
        count += 1
    for topic, queue_id in sorted(wanted):
        queue = queues.get(topic, queue_id)
        if queue is not None:
            queue.correct_min_offset(commit_log.min_offset())
            queue.jumped = False
            logger.warning(
                "consume queue %s/%d rebuilt: offsets %d to %d", topic, queue_id,
                queue.min_offset, queue.max_offset,
            )
    return count


def _records_lost_before(damaged: list[tuple[int, int]], physical_offset: int) -> int:
    # At most one record per MIN_RECORD_SIZE bytes of the damaged ranges before the offset.
    lost = sum(min(end, physical_offset) - start for start, end in damaged
               if start < physical_offset)
    return lost // MIN_RECORD_SIZE + 1


def topic_is_sane(topic: str) -> bool:
    """Whether a topic read back from a record may name a consume-queue directory (a damaged
    record's topic could hold '/' or '..')."""
    return topic_name_problem(topic) is None

"""Recovery: make the commit log, the consume queues and the index agree again at open.

Theory of operation (RocketMQ's recoverNormally / recoverAbnormally, plus tail cutting):

1. Commit log. After a clean close (no ``abort`` file) only the last three segments are
   scanned; after a crash the scan starts at the last segment whose first record is no newer
   than the checkpoint's minimum time (everything before that is known to be on disk in
   every part). The scan verifies each record (magic, sizes, PHYSICALOFFSET, and the body CRC
   when ``check_crc_on_recover``). At a position holding neither a record nor a blank marker
   it tells two cases apart:

   - *damage in the middle*: a valid record (magic, sizes, PHYSICALOFFSET and body CRC all
     consistent; ``find_next_record``) follows in the segment, or a later segment holds data.
     Only the bytes up to that record (or to the segment's end) are lost: they become a
     *damaged range*, logged as a WARNING naming the segment, the offsets and the bytes,
     kept out of the consume queues and the index, and never served (CommitLog.damaged);
     the scan goes on after it. A segment that ends early in zeros (a file cut short and
     extended) is the same: the log goes on in the next segment.
   - *a torn tail*: nothing valid follows. That is the end of the log: whatever follows it
     in that segment is zeroed and later segments are deleted, with a WARNING
     "truncated N invalid bytes at <file>:<position>" for each one that held data.

   An acknowledged message is thus lost only if its own bytes are damaged (RocketMQ and
   Kafka truncate the log at the first bad record instead).
2. Consume queues. Each queue's write position is found from its last segments (the last
   entry with a size); entries at the tail that do not match a record (a torn write) and
   every entry pointing past the end of the commit log are dropped; min offsets move to the
   first entry whose record still exists.
   Entries pointing into a damaged range become fillers (readers skip them).
3. Re-dispatch. Records past what the queues (and the index) hold are parsed from the
   commit log and dispatched again (damaged ranges are skipped). Dispatch is idempotent,
   so starting a little early is harmless. Deleting every consume queue (or the index)
   therefore rebuilds it at open.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tidemq.protocol.message import SYSFLAG_TRANSACTION_MASK
from tidemq.store import rebuild
from tidemq.store.commit_log import CommitLog
from tidemq.store.consume_queue import FILLER_SIZE, ConsumeQueue
from tidemq.store.consume_queue_table import ConsumeQueueTable
from tidemq.store.dispatch import Dispatcher, KeyIndex, batch_from_record
from tidemq.store.index_file import IndexService
from tidemq.store.mapped_file import MappedFile
from tidemq.store.record_check import (
    RecordKind,
    dispatch_fields,
    find_next_record_in,
    inspect_record,
    queue_key,
    read_store_timestamp,
    valid_record_size,
)
from tidemq.store.record_encoder import QUEUED_TRANSACTION_TYPES

logger = logging.getLogger(__name__)

# RocketMQ trusts all but the last three segments after a clean close.
NORMAL_RECOVERY_FILE_COUNT = 3

# How much of a later segment is looked at to tell whether the log goes on after a problem.
_LATER_DATA_PROBE_BYTES = 64 * 1024

# Torn writes touch the last entries only; never walk back further than this per queue.
QUEUE_TAIL_CHECK_MAX = 1024

_QUEUE_ID_POSITION = 12
_QUEUE_OFFSET_POSITION = 20


@dataclass(slots=True, frozen=True)
class DamagedRange:
    """Bytes of the commit log [start, end) (log offsets) that hold no valid record."""

    start: int
    end: int
    path: str
    problem: str


@dataclass(slots=True)
class RecoveryReport:
    """What recovery did, for logs and tests."""

    clean_exit: bool
    scan_start: int = 0  # where the commit-log scan began
    commit_log_end: int = 0
    truncated_bytes: int = 0
    dropped_queue_entries: int = 0
    redispatched_records: int = 0
    damaged: list[DamagedRange] = field(default_factory=list)
    blanked_queue_entries: int = 0  # entries pointing into damaged ranges, now fillers
    rebuilt_queues: dict[tuple[str, int], str] = field(default_factory=dict)  # -> why
    index_rebuilt: str = ""  # why the whole index was rebuilt, or ""
    scan_seconds: float = 0.0  # the commit-log scan (CRC included), for the benchmark


def recover(
    commit_log: CommitLog,
    queues: ConsumeQueueTable,
    index: KeyIndex | None,
    dispatchers: Sequence[Dispatcher],
    *,
    clean_exit: bool,
    checkpoint_min_timestamp: int,
    check_crc: bool,
    delay_level_ms: Sequence[int],
    checkpoint_index_timestamp: int = 0,
) -> RecoveryReport:
    """Run the three steps of the module docstring on freshly loaded parts."""
    report = RecoveryReport(clean_exit=clean_exit)
    commit_log.queue.check_contiguous()
    started = time.perf_counter()
    recover_commit_log(commit_log, report, checkpoint_min_timestamp, check_crc)
    report.scan_seconds = time.perf_counter() - started
    end = report.commit_log_end
    commit_log_min = commit_log.min_offset()
    ranges = [(damaged.start, damaged.end) for damaged in report.damaged]
    manifest = rebuild.read_manifest(queues)
    reasons = {key: "a segment had the wrong size (cut short)" for key in queues.broken}
    for queue in queues.all():
        queue.recover()
        for start, stop in ranges:
            report.blanked_queue_entries += queue.blank_entries_in(start, stop)
        report.dropped_queue_entries += _drop_torn_tail(queue, commit_log)
        report.dropped_queue_entries += queue.truncate_from_physical(end)
        queue.correct_min_offset(commit_log_min)
        key = (queue.topic, queue.queue_id)
        if key in reasons:
            continue
        problem = rebuild.segment_problem(queue)
        if problem is None and manifest.get(key, 0) > queue.max_offset:
            problem = (
                f"it holds entries up to offset {queue.max_offset} but held "
                f"{manifest[key]} at the last clean stop (a file was lost, cut or zeroed)"
            )
        if problem is not None:
            reasons[key] = problem
    for key, max_offset in manifest.items():
        if queues.get(*key) is None:
            reasons[key] = f"its files are missing (it held {max_offset} entries)"
    if reasons:
        rebuild.rebuild_queues(commit_log, queues, reasons, delay_level_ms)
        report.rebuilt_queues.update(reasons)
    if isinstance(index, IndexService):
        report.index_rebuilt = _index_problem(index, clean_exit, checkpoint_index_timestamp)
        if report.index_rebuilt:
            logger.warning("index: %s; rebuilding it from the commit log", report.index_rebuilt)
            index.destroy()
    # After a crash a queue may lag the others (its last pages never reached the disk):
    # re-dispatch everything the scan covered, as RocketMQ does.
    start_at_most = None if clean_exit else report.scan_start
    report.redispatched_records = redispatch(
        commit_log, queues, index, dispatchers, delay_level_ms, start_at_most
    )
    gaps = {
        (queue.topic, queue.queue_id): "re-dispatch found entries missing before the log's "
        "last records (a file was lost or cut)"
        for queue in queues.all() if queue.jumped
    }
    if gaps:
        rebuild.rebuild_queues(commit_log, queues, gaps, delay_level_ms)
        report.rebuilt_queues.update(gaps)
    logger.info(
        "recovered store after a %s exit: commit log ends at %d, %d bytes truncated, "
        "%d damaged ranges skipped (%d queue entries made fillers), %d queue entries "
        "dropped, %d records re-dispatched",
        "clean" if clean_exit else "unclean", end, report.truncated_bytes,
        len(report.damaged), report.blanked_queue_entries, report.dropped_queue_entries,
        report.redispatched_records,
    )
    return report


def recover_commit_log(
    commit_log: CommitLog,
    report: RecoveryReport,
    checkpoint_min_timestamp: int,
    check_crc: bool,
) -> None:
    """Find the end of the commit log, set write positions, cut whatever follows the end."""
    files = commit_log.queue.files
    if not files:
        return
    if report.clean_exit:
        start = max(0, len(files) - NORMAL_RECOVERY_FILE_COUNT)
    else:
        start = _abnormal_start(files, checkpoint_min_timestamp)
    extended = set(commit_log.queue.extended)
    for index, mapped in enumerate(files[:start]):
        if mapped.path in extended:  # cut short: scan from it, keep what follows
            start = index
            break
    file_size = commit_log.file_size
    for mapped in files[:start]:
        mapped.write_position = mapped.flushed_position = file_size
    end = report.scan_start = files[start].file_from_offset
    problem = ""
    last_timestamp = 0
    scanned = files[start:]
    for number, mapped in enumerate(scanned):
        later = scanned[number + 1 :]
        position, problem, timestamp = _scan_segment(
            mapped, check_crc, report.damaged, lambda later=later: _hold_data(later)
        )
        last_timestamp = timestamp or last_timestamp
        mapped.write_position = mapped.flushed_position = position
        end = mapped.file_from_offset + position
        if position < file_size:
            break
    for damaged in report.damaged:
        logger.warning(
            "damaged commit-log range at %s:%d-%d (log offsets %d-%d, %d bytes): %s; "
            "skipped it and kept every valid record after it (the records in it are lost)",
            damaged.path, damaged.start - _segment_start(damaged, file_size),
            damaged.end - _segment_start(damaged, file_size), damaged.start, damaged.end,
            damaged.end - damaged.start, damaged.problem,
        )
    commit_log.set_damaged([(damaged.start, damaged.end) for damaged in report.damaged])
    commit_log.verified_from = report.scan_start
    report.commit_log_end = end
    report.truncated_bytes = _cut_after(commit_log, end, problem)
    commit_log.queue.flushed_where = end
    if last_timestamp:
        commit_log.last_store_timestamp = last_timestamp
    elif end > commit_log.min_offset():
        commit_log.last_store_timestamp = _last_timestamp_before(commit_log, files[start])


def _abnormal_start(files: Sequence[MappedFile], min_timestamp: int) -> int:
    # The last segment whose first record is old enough that the checkpoint covers it.
    for index in range(len(files) - 1, -1, -1):
        mapped = files[index]
        inspection = inspect_record(
            mapped.buffer, 0, mapped.file_size, mapped.file_from_offset, check_crc=False
        )
        if (
            inspection.kind is RecordKind.RECORD
            and read_store_timestamp(mapped.buffer, 0) <= min_timestamp
        ):
            return index
    return 0


def _segment_start(damaged: DamagedRange, file_size: int) -> int:
    return damaged.start - damaged.start % file_size


def _hold_data(segments: Sequence[MappedFile]) -> bool:
    # Whether the log goes on after a segment: a later one starts with something (a record,
    # or damage). The allocator's spare is all zeros. Looking at the first 64 KiB keeps a
    # clean start from reading a whole empty segment.
    return any(mapped.data_end(0, _LATER_DATA_PROBE_BYTES) > 0 for mapped in segments)


def _scan_segment(
    mapped: MappedFile,
    check_crc: bool,
    damaged: list[DamagedRange],
    log_goes_on: Callable[[], bool],
) -> tuple[int, str, int]:
    """(end position, why the scan stopped before the segment's end or "", store time of the
    segment's last record or 0); damaged ranges found on the way are added to ``damaged``.

    ``log_goes_on`` says whether later segments hold data (asked only at a problem)."""
    buffer = mapped.buffer
    file_size = mapped.file_size
    base = mapped.file_from_offset
    position = 0
    last_record = -1
    problem = ""
    while True:
        size = valid_record_size(buffer, position, file_size, base + position, check_crc)
        if size:  # the common record, checked in one go
            last_record = position
            position += size
            continue
        inspection = inspect_record(buffer, position, file_size, base + position, check_crc)
        if inspection.kind is RecordKind.RECORD:
            last_record = position
            position += inspection.size
            continue
        if inspection.kind is RecordKind.BLANK:
            position = file_size
            break
        # Not a record: the end of the log, a torn tail, or damage in the middle.
        reason = inspection.problem or "zeros where a record or an end-of-file marker should be"
        # mmap.find for the magic over the bytes ever written (the never-written rest of the
        # segment, most of it at the log's end, is neither searched nor faulted in).
        resumed = find_next_record_in(mapped.find, buffer,
                                      mapped.data_ranges(position + 1, file_size),
                                      position + 1, base)
        if resumed is not None:
            damaged.append(DamagedRange(base + position, base + resumed, mapped.describe(),
                                        reason))
            position = resumed
            continue
        if log_goes_on():
            damaged.append(DamagedRange(base + position, base + file_size, mapped.describe(),
                                        reason))
            position = file_size
            break
        problem = inspection.problem  # a torn tail ("" when it is just the end)
        break
    timestamp = read_store_timestamp(buffer, last_record) if last_record >= 0 else 0
    return position, problem, timestamp


def _cut_after(commit_log: CommitLog, end: int, problem: str) -> int:
    """Zero what follows ``end`` in its segment, delete later segments; log what held data."""
    truncated = 0
    for mapped in commit_log.queue.files:
        if mapped.file_from_offset + mapped.file_size <= end:
            continue
        position = max(0, end - mapped.file_from_offset)
        data_end = mapped.data_end(position)
        if data_end > position:
            truncated += data_end - position
            reason = problem if mapped.file_from_offset <= end else "past the end of the log"
            logger.warning(
                "truncated %d invalid bytes at %s:%d (%s)",
                data_end - position, mapped.describe(), position, reason or "not a record",
            )
    commit_log.truncate(end)
    return truncated


def _last_timestamp_before(commit_log: CommitLog, first_scanned: MappedFile) -> int:
    # No record in the scanned segments: the newest is the last record of an earlier one.
    timestamp = 0
    previous = commit_log.find_file(first_scanned.file_from_offset - 1)
    if previous is not None:
        for mapped, position in commit_log.iter_positions(previous.file_from_offset):
            if mapped is not previous:
                break
            timestamp = read_store_timestamp(mapped.buffer, position)
    return timestamp


def _drop_torn_tail(queue: ConsumeQueue, commit_log: CommitLog) -> int:
    """Drop tail entries that do not point at their record (a torn consume-queue write)."""
    commit_log_min = commit_log.min_offset()
    max_offset = queue.max_offset
    offset = max_offset - 1
    low = max(queue.min_offset, max_offset - QUEUE_TAIL_CHECK_MAX)
    while offset >= low:
        entry = queue.entry(offset)
        if entry is None:
            break
        physical_offset, size, _ = entry
        if size == FILLER_SIZE or physical_offset < commit_log_min:
            break
        if _entry_matches(commit_log, queue, offset, physical_offset, size):
            break
        offset -= 1
    dropped = max_offset - 1 - offset
    if dropped:
        logger.warning(
            "dropped %d torn entries at the tail of consume queue %s/%d",
            dropped, queue.topic, queue.queue_id,
        )
        queue.queue.truncate_dirty((offset + 1) * 20)
    return dropped


def _entry_matches(
    commit_log: CommitLog, queue: ConsumeQueue, queue_offset: int, physical_offset: int, size: int
) -> bool:
    record = commit_log.read_record(physical_offset)
    if record is None or len(record) != size:
        return False
    queue_id = int.from_bytes(record[_QUEUE_ID_POSITION : _QUEUE_ID_POSITION + 4], "big")
    stored_offset = int.from_bytes(
        record[_QUEUE_OFFSET_POSITION : _QUEUE_OFFSET_POSITION + 8], "big", signed=True
    )
    return queue_id == queue.queue_id and stored_offset == queue_offset


def _index_problem(index: IndexService, clean_exit: bool, checkpoint_index_ms: int) -> str:
    """Why the index lost entries (files deleted at load, or it ends before the checkpoint's
    index time after a clean stop), or ""."""
    if index.load_problems:
        return "; ".join(index.load_problems)
    if clean_exit and index.last_update_timestamp_ms < checkpoint_index_ms:
        return (
            f"its newest entry is from {index.last_update_timestamp_ms} but the checkpoint "
            f"says entries up to {checkpoint_index_ms} were flushed (an index file was lost)"
        )
    return ""


def redispatch(
    commit_log: CommitLog,
    queues: ConsumeQueueTable,
    index: KeyIndex | None,
    dispatchers: Sequence[Dispatcher],
    delay_level_ms: Sequence[int],
    start_at_most: int | None = None,
) -> int:
    """Dispatch every record past what the queues and the index hold (and at least those
    from ``start_at_most`` on); return how many records were dispatched."""
    commit_log_min = commit_log.min_offset()
    queue_end = max((queue.last_physical_end() for queue in queues.all()), default=0)
    start = max(queue_end, commit_log_min)
    if start_at_most is not None:
        start = max(min(start, start_at_most), commit_log_min)
    if index is not None:
        start = min(start, max(index.last_update_physical_offset, commit_log_min))
    if start >= commit_log.max_offset():
        return 0
    count = 0
    with_keys = index is not None
    get_queue = queues.get
    for mapped, position in commit_log.iter_positions(start):
        buffer = mapped.buffer
        if index is None or mapped.file_from_offset + position <= (
            index.last_update_physical_offset
        ):
            # Cheap first: a record its queue (and the index) already hold is skipped on its
            # header alone; dispatching it would change nothing (both are idempotent).
            topic, queue_id, queue_offset, sysflag = queue_key(buffer, position)
            if sysflag & SYSFLAG_TRANSACTION_MASK not in QUEUED_TRANSACTION_TYPES:
                continue
            queue = get_queue(topic, queue_id)
            if queue is not None and queue_offset < queue.max_offset:
                continue
        size = int.from_bytes(buffer[position : position + 4], "big")
        fields = dispatch_fields(buffer, position)
        if not rebuild.topic_is_sane(fields.topic):
            logger.error(
                "record at %s:%d names topic %r, not a valid topic name (a damaged header); "
                "not dispatched", mapped.describe(), position, fields.topic,
            )
            continue
        batch = batch_from_record(
            fields, mapped.file_from_offset + position, size, delay_level_ms, with_keys
        )
        for dispatcher in dispatchers:
            dispatcher.dispatch(batch)
        count += 1
    return count


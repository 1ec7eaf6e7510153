"""Offline verification of a store directory (``tidemq store check DIR``).

It reads the files as they are, read-only and without the lock (like kafka-dump-log), so it
also works on a copy or next to a running broker, and never repairs anything:

- commit log: segments are contiguous and of one size; every record has the right magic,
  consistent sizes, its own PHYSICALOFFSET and a matching body CRC; a segment ends in a
  blank marker, exactly full, or (the last one) in zeros; any other byte after the last
  record is reported;
- consume queues: every entry points at a record of its topic and queue, with the same
  size and the entry's queue offset; entries below the commit log's first offset are counted
  as expired (retention removed their records), not as problems; segments follow each other
  without a hole or a zeroed one; every queue the log holds records of exists and reaches
  the last of them (check_derived.py);
- index files: header, slots, chains and every entry's key hash (check_derived.py).

Each problem names the file and the byte position in it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

from tidemq.store.check_derived import (
    IndexSettings,
    QueueHighWater,
    check_index_files,
    check_queue_ends,
)
from tidemq.store.commit_log import CommitLog
from tidemq.store.consume_queue import ENTRY, ENTRY_SIZE, FILLER_SIZE
from tidemq.store.mapped_file import MappedFile, parse_file_name
from tidemq.store.mapped_file_queue import MappedFileQueue
from tidemq.store.record_check import (
    RecordKind,
    dispatch_fields,
    find_next_record_in,
    inspect_record,
)

_RECORD_HEAD = struct.Struct(">iiiiiqq")  # TOTALSIZE MAGIC CRC QUEUEID FLAG QUEUEOFFSET PHYSICAL
_PROBLEMS_MAX = 1000  # a wrecked store would print millions of lines; stop listing here


@dataclass(slots=True)
class CheckProblem:
    """One thing wrong: the file, the byte position in it, and what."""

    path: str
    position: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.position}: {self.message}"


@dataclass(slots=True)
class CheckReport:
    """What ``check_store`` looked at and found."""

    segments: int = 0
    records: int = 0
    record_bytes: int = 0
    queues: int = 0
    index_files: int = 0
    index_files_unchecked: int = 0  # their layout is unknown: settings not given
    entries: int = 0
    expired_entries: int = 0
    problems: list[CheckProblem] = field(default_factory=list)
    problems_omitted: int = 0

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems

    def add(self, path: str, position: int, message: str) -> None:
        """Record a problem (after the first 1000, only count them)."""
        if len(self.problems) < _PROBLEMS_MAX:
            self.problems.append(CheckProblem(path, position, message))
        else:
            self.problems_omitted += 1

    def summary(self) -> str:
        """One line: what was checked and the verdict."""
        count = len(self.problems) + self.problems_omitted
        verdict = "no problems" if self.ok else f"{count} problems"
        return (
            f"{self.segments} commit-log segments, {self.records} records "
            f"({self.record_bytes} bytes); {self.queues} consume queues, {self.entries} entries "
            f"({self.expired_entries} expired); {self.index_files} index files"
            + (f" ({self.index_files_unchecked} not checked: give --max-hash-slot-num and "
               "--max-index-num)" if self.index_files_unchecked else "")
            + f"; {verdict}"
        )


def check_store(
    root_dir: str, *, check_crc: bool = True, index_settings: IndexSettings | None = None
) -> CheckReport:
    """Verify the commit log, the consume queues and the index files under ``root_dir``.

    Args:
        index_settings: maxHashSlotNum / maxIndexNum the index was written with (RocketMQ's
            defaults when None).

    Raises:
        StoreError: a directory cannot be read or a segment cannot be mapped.
    """
    report = CheckReport()
    if not os.path.isdir(os.path.join(root_dir, "commitlog")):
        report.add(root_dir, 0, "no commitlog directory here: is this a storePathRootDir?")
        return report
    commit_log = open_commit_log_readonly(os.path.join(root_dir, "commitlog"), report)
    high_water = QueueHighWater()
    try:
        _check_commit_log(commit_log, report, check_crc, high_water)
        queue_directory = os.path.join(root_dir, "consumequeue")
        queue_ends = _check_consume_queues(queue_directory, commit_log, report)
        check_queue_ends(high_water, queue_ends, queue_directory, report.add)
        report.index_files, report.index_files_unchecked = check_index_files(
            root_dir, commit_log, index_settings or IndexSettings(), report.add,
            high_water.last_keyed_offset,
        )
    finally:
        commit_log.queue.close()
    return report


def segment_size(directory: str) -> int | None:
    """The size of the first segment in ``directory`` (all should match), or None if none."""
    names = sorted(n for n in os.listdir(directory) if parse_file_name(n) is not None)
    if not names:
        return None
    return os.path.getsize(os.path.join(directory, names[0]))


def open_commit_log_readonly(directory: str, report: CheckReport) -> CommitLog:
    """Map the commit log's segments read-only; segments of a different size are reported
    in ``report`` and left out. Write positions stay 0 (the caller walks the records)."""
    size = segment_size(directory) if os.path.isdir(directory) else None
    commit_log = CommitLog(directory, size or 1 << 30, readonly=True)
    if size is None:
        return commit_log
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if parse_file_name(name) is not None and os.path.getsize(path) != size:
            report.add(path, 0, f"segment is {os.path.getsize(path)} bytes, the others {size}")
    commit_log.queue.load(skip_wrong_size=True)
    return commit_log


def _check_commit_log(
    commit_log: CommitLog, report: CheckReport, check_crc: bool, high_water: QueueHighWater
) -> None:
    files = commit_log.queue.files
    # All-zero segments at the end were made ahead of need (the segment allocator): they
    # are not part of the log yet.
    while len(files) > 1 and files[-1].data_end(0) == 0:
        files = files[:-1]
    report.segments = len(files)
    for number, mapped in enumerate(files):
        path = mapped.describe()
        is_last = number == len(files) - 1
        segment_end = mapped.file_from_offset + mapped.file_size
        if not is_last and files[number + 1].file_from_offset != segment_end:
            report.add(path, mapped.file_size, "the next segment is missing (a hole in the log)")
        end = _check_segment(mapped, report, check_crc, high_water)
        mapped.write_position = end
        if end < mapped.file_size:
            data_end = mapped.data_end(end)
            if data_end > end:
                report.add(
                    path, end, f"{data_end - end} bytes of data after the last valid record"
                )
            elif not is_last:
                report.add(
                    path, end, "segment ends without an end-of-file marker before the next one"
                )


def _check_segment(
    mapped: MappedFile, report: CheckReport, check_crc: bool, high_water: QueueHighWater
) -> int:
    """Walk the records of one segment, reporting each damaged range (and going on at the
    next valid record, as recovery does); return where its valid data ends."""
    buffer = mapped.buffer
    size = mapped.file_size
    base = mapped.file_from_offset
    position = 0
    end = 0
    while position < size:
        inspection = inspect_record(buffer, position, size, base + position, check_crc)
        if inspection.kind is RecordKind.RECORD:
            report.records += 1
            report.record_bytes += inspection.size
            high_water.add(buffer, position, base + position)
            position += inspection.size
            end = position
            continue
        if inspection.kind is RecordKind.BLANK:
            return size
        if mapped.data_end(position) <= position:
            return end  # zeros to the segment's end
        resumed = find_next_record_in(mapped.find, buffer,
                                      mapped.data_ranges(position + 1, size), position + 1,
                                      base)
        if resumed is None:
            return end  # the caller reports the bytes after the last valid record
        report.add(
            mapped.describe(), position,
            f"{inspection.problem or 'zeros where a record should be'}: damaged range of "
            f"{resumed - position} bytes (log offsets {base + position}-{base + resumed}); "
            f"the next valid record starts at {resumed}",
        )
        position = end = resumed
    return end


def _check_consume_queues(
    directory: str, commit_log: CommitLog, report: CheckReport
) -> dict[tuple[str, int], int]:
    """Check every queue's entries; return each queue's end (its next queue offset)."""
    ends: dict[tuple[str, int], int] = {}
    if not os.path.isdir(directory):
        return ends
    commit_log_min = commit_log.min_offset()
    for topic in sorted(os.listdir(directory)):
        topic_dir = os.path.join(directory, topic)
        if not os.path.isdir(topic_dir):
            continue
        for name in sorted(os.listdir(topic_dir)):
            queue_dir = os.path.join(topic_dir, name)
            if not name.isdigit() or not os.path.isdir(queue_dir):
                continue
            size = segment_size(queue_dir)
            if size is None:
                continue
            if size % ENTRY_SIZE:
                report.add(queue_dir, 0, f"segment size {size} is not a multiple of {ENTRY_SIZE}")
                continue
            for segment in sorted(os.listdir(queue_dir)):
                path = os.path.join(queue_dir, segment)
                if parse_file_name(segment) is not None and os.path.getsize(path) != size:
                    report.add(path, 0, f"queue segment is {os.path.getsize(path)} bytes, the "
                               f"others {size} (cut short)")
            queue = MappedFileQueue(queue_dir, size, readonly=True)
            queue.load(skip_wrong_size=True)
            try:
                report.queues += 1
                ends[(topic, int(name))] = _check_queue(
                    queue, topic, int(name), commit_log, commit_log_min, report
                )
            finally:
                queue.close()
    return ends


def _check_queue(
    queue: MappedFileQueue,
    topic: str,
    queue_id: int,
    commit_log: CommitLog,
    commit_log_min: int,
    report: CheckReport,
) -> int:
    """Check one queue's entries; return its end (the next queue offset)."""
    topic_bytes = topic.encode("utf-8")
    files = queue.files
    end = files[0].file_from_offset // ENTRY_SIZE if files else 0
    for number, mapped in enumerate(files):
        path = mapped.describe()
        if number and mapped.file_from_offset != files[number - 1].file_from_offset + (
            mapped.file_size
        ):
            report.add(path, 0, "the queue segment before this one is missing (a hole)")
        ended = False
        for index, (physical_offset, size, _) in enumerate(ENTRY.iter_unpack(mapped.buffer)):
            if size == 0 and physical_offset == 0:
                ended = True
                position = index * ENTRY_SIZE
                if mapped.data_end(position) > position:
                    report.add(path, position, "data after the last consume-queue entry")
                if number != len(files) - 1:
                    report.add(path, position, "queue segment ends before the next one starts"
                               + (" (it is zeros)" if position == 0 else ""))
                break
            end = (mapped.file_from_offset + (index + 1) * ENTRY_SIZE) // ENTRY_SIZE
            if size == FILLER_SIZE:
                continue
            report.entries += 1
            if physical_offset < commit_log_min:
                report.expired_entries += 1
                continue
            queue_offset = (mapped.file_from_offset // ENTRY_SIZE) + index
            problem = _entry_problem(
                commit_log, physical_offset, size, topic_bytes, queue_id, queue_offset
            )
            if problem:
                report.add(
                    path, index * ENTRY_SIZE,
                    f"entry {queue_offset} of {topic}/{queue_id} -> physical offset "
                    f"{physical_offset}: {problem}",
                )
        if ended:
            break
    return end


def _entry_problem(
    commit_log: CommitLog,
    physical_offset: int,
    size: int,
    topic: bytes,
    queue_id: int,
    queue_offset: int,
) -> str:
    record = commit_log.read_record(physical_offset)
    if record is None:
        return "no record starts there"
    if len(record) != size:
        return f"the record is {len(record)} bytes, the entry says {size}"
    _, _, _, stored_queue_id, _, stored_queue_offset, _ = _RECORD_HEAD.unpack_from(record)
    if stored_queue_id != queue_id:
        return f"the record belongs to queue {stored_queue_id}"
    if stored_queue_offset != queue_offset:
        return f"the record has queue offset {stored_queue_offset}"
    stored_topic = dispatch_fields(record, 0).topic.encode("utf-8")
    if stored_topic != topic:
        return f"the record belongs to topic {stored_topic.decode('utf-8', 'replace')!r}"
    return ""

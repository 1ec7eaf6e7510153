"""Offline checks of the derived files (``tidemq store check``): index files, and consume
queues against the records the commit log holds. check.py walks the commit log and calls in.

Index files (layout in index_file.py), each:
- its size matches maxHashSlotNum / maxIndexNum (given to the check, or inferred from the
  file sizes when they fit RocketMQ's four entries per slot; else the files are listed as
  not checked);
- the header: indexCount within 1..maxIndexNum (a zeroed file has 0), hashSlotCount equal to
  the slots in use;
- every slot and every entry's prevIndex points below indexCount (and prevIndex below its own
  entry: chains run newest to oldest);
- every entry points at a record (unless retention deleted it) whose topic#key, for one of its
  keys (UNIQ_KEY, KEYS tokens), hashes to the entry's keyHash;
- the newest file does not end before the checkpoint's indexMsgTimestamp (a lost file).

Consume queues: each queue the commit log holds records of must exist and reach the highest
queue offset among them (a missing, cut or zeroed file falls short).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

from tidemq.store.commit_log import CommitLog
from tidemq.store.index_file import (
    HASH_SLOT_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    MAX_HASH_SLOT_NUM_DEFAULT,
    MAX_INDEX_NUM_DEFAULT,
    index_file_size,
    index_key_hash,
)
from tidemq.store.record_check import dispatch_fields
from tidemq.store.record_encoder import QUEUED_TRANSACTION_TYPES, index_keys

AddProblem = Callable[[str, int, str], None]

_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")
_SLOT = struct.Struct(">i")
_TRANSACTION_MASK = 0x0C
_TRANSACTION_ROLLBACK = 0x0C
_CHECKPOINT_INDEX_AT = 16


@dataclass(slots=True)
class IndexSettings:
    """The settings index files were written with (they fix the files' layout); None: not
    given, inferred from a file's size when it fits RocketMQ's ratio (4 entries per slot)."""

    max_hash_slot_num: int | None = None
    max_index_num: int | None = None

    def resolve(self, file_size: int) -> tuple[int, int] | None:
        """(slots, entries) for a file of ``file_size`` bytes, or None when unknown."""
        if self.max_hash_slot_num is not None and self.max_index_num is not None:
            return self.max_hash_slot_num, self.max_index_num
        if file_size == index_file_size(MAX_HASH_SLOT_NUM_DEFAULT, MAX_INDEX_NUM_DEFAULT):
            return MAX_HASH_SLOT_NUM_DEFAULT, MAX_INDEX_NUM_DEFAULT
        slots, remainder = divmod(file_size - INDEX_HEADER_SIZE, HASH_SLOT_SIZE + 4 * 20)
        return (slots, 4 * slots) if slots > 0 and not remainder else None


class QueueHighWater:
    """Per (topic, queue id), the highest queue offset + 1 among the commit log's queued
    records (fed record by record while check.py walks the log)."""

    def __init__(self) -> None:
        self.ends: dict[tuple[str, int], int] = {}
        # Physical offset of the last record the index should hold (it has keys), or -1.
        self.last_keyed_offset = -1

    def add(self, buffer: memoryview, position: int, physical_offset: int) -> None:
        """Take in the record at ``position`` (already verified)."""
        fields = dispatch_fields(buffer, position)
        transaction_type = fields.sysflag & _TRANSACTION_MASK
        if transaction_type != _TRANSACTION_ROLLBACK and index_keys(fields.properties):
            self.last_keyed_offset = physical_offset
        if transaction_type not in QUEUED_TRANSACTION_TYPES:
            return
        key = (fields.topic, fields.queue_id)
        end = fields.queue_offset + 1
        if end > self.ends.get(key, 0):
            self.ends[key] = end


def check_queue_ends(
    expected: QueueHighWater, queue_ends: dict[tuple[str, int], int], directory: str,
    add: AddProblem,
) -> None:
    """Report queues missing or ending before the commit log's records of them do."""
    for (topic, queue_id), end in sorted(expected.ends.items()):
        queue_dir = os.path.join(directory, topic, str(queue_id))
        found = queue_ends.get((topic, queue_id))
        if found is None:
            add(queue_dir, 0, f"consume queue {topic}/{queue_id} is missing: the commit log "
                f"holds its records up to queue offset {end - 1}")
        elif found < end:
            add(queue_dir, found * 20, f"consume queue {topic}/{queue_id} ends at offset "
                f"{found} but the commit log holds its records up to queue offset {end - 1} "
                "(a file was lost, cut or zeroed)")


def check_index_files(
    root_dir: str, commit_log: CommitLog, settings: IndexSettings, add: AddProblem,
    last_keyed_offset: int = -1,
) -> tuple[int, int]:
    """Check every index file under ``root_dir/index``; return (files checked, files whose
    layout is unknown: their size fits no settings given or inferable)."""
    directory = os.path.join(root_dir, "index")
    if not os.path.isdir(directory):
        return 0, 0
    names = sorted(n for n in os.listdir(directory) if len(n) == 17 and n.isdigit())
    sizes = {name: os.path.getsize(os.path.join(directory, name)) for name in names}
    # The files share one layout: take the one most of them fit.
    layouts = [settings.resolve(size) for size in sizes.values()]
    known = [layout for layout in layouts if layout is not None]
    layout = max(set(known), key=known.count) if known else None
    if layout is None and names:
        return 0, len(names)
    size = index_file_size(*layout) if layout is not None else 0
    newest_end = 0
    newest_end_offset = -1
    checked = 0
    for name in names:
        path = os.path.join(directory, name)
        if sizes[name] != size:
            add(path, 0, f"index file is {sizes[name]} bytes; maxHashSlotNum={layout[0]} and "
                f"maxIndexNum={layout[1]} make {size} (cut short, or pass the settings the "
                "broker uses: --max-hash-slot-num, --max-index-num)")
            continue
        checked += 1
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            end = _check_index_file(path, data, commit_log, layout, add)  # type: ignore[arg-type]
            newest_end = max(newest_end, end)
            if end:
                newest_end_offset = max(newest_end_offset, _HEADER.unpack_from(data, 0)[3])
    if last_keyed_offset > newest_end_offset:
        add(directory, 0, f"the index ends at physical offset {newest_end_offset} but the "
            f"commit log holds records with keys up to {last_keyed_offset}: an index file is "
            "missing or damaged (a broker rebuilds it at start-up)")
    checkpoint_index = _checkpoint_index_time(root_dir)
    if checkpoint_index > newest_end:
        add(directory, 0, f"the index ends at store time {newest_end} but the checkpoint says "
            f"keys up to {checkpoint_index} were flushed: an index file is missing or damaged")
    return checked, 0


def _check_index_file(
    path: str, data: mmap.mmap, commit_log: CommitLog, layout: tuple[int, int],
    add: AddProblem,
) -> int:
    """Check one file; return its end timestamp (0 when its header is unusable)."""
    slots, max_index_num = layout
    _, end_ms, _, _, slot_count, index_count = _HEADER.unpack_from(data, 0)
    if not 1 <= index_count <= max_index_num:
        add(path, 36, f"header indexCount {index_count} is outside 1..{max_index_num}"
            + (" (the header is zeros)" if not any(data[:INDEX_HEADER_SIZE]) else ""))
        return 0
    used = 0
    for slot in range(slots):
        head = _SLOT.unpack_from(data, INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE)[0]
        if head:
            used += 1
            if not 0 < head < index_count:
                add(path, INDEX_HEADER_SIZE + slot * HASH_SLOT_SIZE,
                    f"slot {slot} points at entry {head}, outside 1..{index_count - 1}")
    if used != slot_count:
        add(path, 32, f"header hashSlotCount {slot_count} but {used} slots are in use")
    entries_at = INDEX_HEADER_SIZE + slots * HASH_SLOT_SIZE
    commit_log_min = commit_log.min_offset()
    for number in range(1, index_count):
        position = entries_at + number * INDEX_ENTRY_SIZE
        key_hash, physical_offset, _, previous = _ENTRY.unpack_from(data, position)
        if not 0 <= previous < number:
            add(path, position, f"entry {number} links to entry {previous}, not an older one")
        if physical_offset < commit_log_min:
            continue  # its record was deleted by retention
        problem = _entry_record_problem(commit_log, physical_offset, key_hash, slots)
        if problem:
            add(path, position, f"entry {number} -> physical offset {physical_offset}: {problem}")
    return end_ms


def _entry_record_problem(
    commit_log: CommitLog, physical_offset: int, key_hash: int, slots: int
) -> str:
    record = commit_log.read_record(physical_offset)
    if record is None:
        return "no record starts there"
    fields = dispatch_fields(record, 0)
    hashes = {index_key_hash(f"{fields.topic}#{key}") for key in index_keys(fields.properties)}
    if key_hash not in hashes:
        return f"keyHash {key_hash} is none of the record's keys' hashes"
    return ""


def _checkpoint_index_time(root_dir: str) -> int:
    path = os.path.join(root_dir, "checkpoint")
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError:
        return 0
    if len(head) < 24:
        return 0
    return struct.unpack_from(">q", head, _CHECKPOINT_INDEX_AT)[0]

"""Print stored records in readable form (``tidemq store dump DIR``), like kafka-dump-log.

Two ways in, both read-only and without the store's lock:
- by commit log: every record from a physical offset (the first one by default);
- by queue: ``topic`` and ``queue_id`` given, the records a consumer of that queue would get
  from a queue offset on, through the consume queue.
Each record is one header line (offsets, size, topic, queue, times, hosts, flags) followed by
its properties and a preview of its body.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator

from tidemq.protocol.message import MessageExt, decode_record
from tidemq.store.check import CheckReport, open_commit_log_readonly, segment_size
from tidemq.store.commit_log import CommitLog
from tidemq.store.consume_queue import ENTRY, ENTRY_SIZE, FILLER_SIZE
from tidemq.store.mapped_file_queue import MappedFileQueue
from tidemq.store.record_check import RecordKind, inspect_record

BODY_PREVIEW_BYTES = 64


def dump_store(
    root_dir: str,
    *,
    topic: str | None = None,
    queue_id: int = 0,
    offset: int | None = None,
    count: int | None = None,
) -> Iterator[str]:
    """Lines describing the records of the store under ``root_dir``.

    Args:
        topic: read through this topic's consume queue ``queue_id``; None walks the log.
        offset: a queue offset (with ``topic``) or a physical offset (without); None starts
            at the first one.
        count: stop after this many records; None prints them all.
    """
    commit_log = open_commit_log_readonly(os.path.join(root_dir, "commitlog"), CheckReport())
    try:
        _set_write_positions(commit_log)
        if topic is None:
            yield from _dump_log(commit_log, offset, count)
        else:
            yield from _dump_queue(root_dir, commit_log, topic, queue_id, offset or 0, count)
    finally:
        commit_log.queue.close()


def _set_write_positions(commit_log: CommitLog) -> None:
    # Read-only: take each segment's end as the last record that verifies (no CRC).
    for mapped in commit_log.queue.files:
        position = 0
        while True:
            inspection = inspect_record(
                mapped.buffer, position, mapped.file_size, mapped.file_from_offset + position,
                check_crc=False,
            )
            if inspection.kind is not RecordKind.RECORD:
                break
            position += inspection.size
        mapped.write_position = position


def _dump_log(commit_log: CommitLog, offset: int | None, count: int | None) -> Iterator[str]:
    start = commit_log.min_offset() if offset is None else offset
    printed = 0
    for mapped, position in commit_log.iter_positions(start):
        if count is not None and printed >= count:
            return
        yield from format_record(decode_record(mapped.buffer, position))
        printed += 1
    if printed == 0:
        yield f"no records from physical offset {start}"


def _dump_queue(
    root_dir: str,
    commit_log: CommitLog,
    topic: str,
    queue_id: int,
    queue_offset: int,
    count: int | None,
) -> Iterator[str]:
    queue_dir = os.path.join(root_dir, "consumequeue", topic, str(queue_id))
    size = segment_size(queue_dir) if os.path.isdir(queue_dir) else None
    if size is None:
        yield f"no consume queue {topic}/{queue_id} under {root_dir}"
        return
    queue = MappedFileQueue(queue_dir, size, readonly=True)
    queue.load(skip_wrong_size=True)
    printed = 0
    try:
        while count is None or printed < count:
            mapped = queue.find_file(queue_offset * ENTRY_SIZE)
            if mapped is None:
                break
            position = queue_offset * ENTRY_SIZE - mapped.file_from_offset
            physical_offset, record_size, tag_code = ENTRY.unpack_from(mapped.buffer, position)
            if record_size == 0:
                break
            queue_offset += 1
            if record_size == FILLER_SIZE:
                continue
            record = commit_log.read_record(physical_offset)
            if record is None:
                yield (
                    f"queue offset {queue_offset - 1}: physical offset {physical_offset} "
                    "holds no record (expired or damaged)"
                )
            else:
                yield from format_record(decode_record(record), tag_code=tag_code)
            printed += 1
    finally:
        queue.close()
    if printed == 0:
        yield f"no entries in {topic}/{queue_id} from queue offset {queue_offset}"


def _time(ms: int) -> str:
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return f"{moment.isoformat(timespec='milliseconds')} ({ms})"


def format_record(message: MessageExt, tag_code: int | None = None) -> Iterator[str]:
    """The readable lines of one record."""
    tag = f" tag_code={tag_code}" if tag_code is not None else ""
    yield (
        f"physical_offset={message.physical_offset} size={message.store_size} "
        f"topic={message.topic} queue_id={message.queue_id} "
        f"queue_offset={message.queue_offset}{tag}"
    )
    yield (
        f"  store_time={_time(message.store_timestamp)} born_time={_time(message.born_timestamp)} "
        f"store_host={message.store_host} born_host={message.born_host}"
    )
    yield (
        f"  flag={message.flag} sysflag={message.sysflag:#x} "
        f"reconsume_times={message.reconsume_times} body_crc={message.body_crc:#010x} "
        f"prepared_offset={message.prepared_transaction_offset}"
    )
    if message.properties:
        shown = " ".join(f"{name}={value}" for name, value in message.properties.items())
        yield f"  properties: {shown}"
    body = message.body
    more = "..." if len(body) > BODY_PREVIEW_BYTES else ""
    yield f"  body ({len(body)} bytes): {body[:BODY_PREVIEW_BYTES]!r}{more}"

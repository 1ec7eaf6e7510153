"""RecentWrites: reads of the commit log's tail served from the buffers the appends wrote,
the same bytes as the file holds, and nothing kept that a later write could make wrong."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import SEGMENT_SIZE, message, small_config

from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import GetStatus
from tidemq.store.recent_writes import RecentWrites

ALL_BYTES = 1 << 30
TOPIC = "Orders"


@settings(max_examples=200, deadline=None)
@given(
    writes=st.lists(
        st.tuples(st.integers(1, 60), st.booleans()), min_size=1, max_size=30
    ),
    reads=st.lists(st.tuples(st.integers(0, 2000), st.integers(1, 80)), max_size=30),
    limit=st.integers(1, 300),
)
def test_a_view_is_the_log_bytes_it_names_or_none(writes, reads, limit):
    # A model log: each write goes at its end or, now and then, somewhere before it (a cut
    # log written again); a view, when given, must be the model's bytes now.
    recent = RecentWrites(limit)
    log = bytearray()
    last = None
    for number, (size, cut) in enumerate(writes):
        start = len(log) // 2 if cut and log else len(log)
        buffer = bytearray((number * 7 + i) % 251 for i in range(size))
        del log[start:]
        log += buffer
        recent.written(start, buffer)
        last = (start, start + size)
    for start, length in reads:
        view = recent.view(start, start + length)
        if view is not None:
            with view:
                assert bytes(view) == bytes(log[start : start + length])
    # What the last write wrote is always there when it fits the limit.
    start, end = last
    view = recent.view(start, end)
    if end - start <= limit:
        assert view is not None and bytes(view) == bytes(log[start:end])
    else:
        assert view is None


@settings(max_examples=200, deadline=None)
@given(
    writes=st.lists(st.tuples(st.integers(1, 60), st.booleans()), min_size=1, max_size=30),
    ranges=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 40)), min_size=1,
                    max_size=20),
    first=st.integers(0, 2000),
    limit=st.integers(1, 300),
)
def test_gathered_ranges_are_the_log_bytes_they_name_or_none(writes, ranges, first, limit):
    # A model log written as above; ascending ranges with gaps between them (a queue's
    # records among other queues'): gathered, when given, they are the model's bytes of
    # each range, back to back; ranges within the last write are always given.
    recent = RecentWrites(limit)
    log = bytearray()
    for number, (size, cut) in enumerate(writes):
        start = len(log) // 2 if cut and log else len(log)
        buffer = bytearray((number * 7 + i) % 251 for i in range(size))
        del log[start:]
        log += buffer
        recent.written(start, buffer)
    starts, ends = [], []
    position = first
    for gap, length in ranges:
        position += gap
        starts.append(position)
        ends.append(position + length)
        position += length
    gathered = recent.gather(starts, ends)
    if gathered is not None:
        assert ends[-1] <= len(log)
        assert gathered == b"".join(bytes(log[a:b]) for a, b in zip(starts, ends, strict=True))
    last_start, last_end = start, start + size
    if (size <= limit and starts[0] >= last_start and ends[-1] <= last_end):
        assert gathered is not None


def test_ranges_over_several_writes_are_gathered_from_each():
    recent = RecentWrites(1000)
    log = bytes(range(250))
    for start in range(0, 250, 50):
        recent.written(start, bytearray(log[start : start + 50]))
    starts, ends = [5, 45, 120, 130, 249], [10, 50, 125, 150, 250]  # 45-50 ends a write
    assert recent.gather(starts, ends) == b"".join(
        log[a:b] for a, b in zip(starts, ends, strict=True))
    assert recent.gather([45, 60], [55, 61]) is None  # 45-55 runs over two writes
    recent.clear()
    assert recent.gather([5], [10]) is None


def test_kept_bytes_stay_within_the_limit_and_a_cleared_log_keeps_none():
    recent = RecentWrites(100)
    for number in range(10):
        recent.written(number * 40, bytearray(40))
    assert recent.view(9 * 40, 10 * 40) is not None
    assert recent.view(0, 40) is None  # dropped: 400 bytes written, 100 kept at most
    recent.clear()
    assert recent.view(9 * 40, 10 * 40) is None


def _segment_bytes(store: FileMessageStore, physical_offset: int, size: int) -> bytes:
    # The stored bytes, read from the segment's file (not its mapping, not the buffers).
    segment = store.commit_log.find_file(physical_offset)
    assert segment is not None and segment.path is not None
    fd = os.open(segment.path, os.O_RDONLY)
    try:
        return os.pread(fd, size, physical_offset - segment.file_from_offset)
    finally:
        os.close(fd)


def _records_of(store: FileMessageStore, queue_id: int, offset: int) -> list[tuple[int, int]]:
    queue = store.queues.get(TOPIC, queue_id)
    entries = []
    for queue_offset in range(offset, queue.max_offset):
        entry = queue.entry(queue_offset)
        entries.append((entry[0], entry[1]))
    return entries


@settings(max_examples=25, deadline=None)
@given(groups=st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3000)),
                                min_size=1, max_size=12), min_size=1, max_size=12))
def test_pulls_of_fresh_records_answer_the_stored_bytes(tmp_path_factory, groups):
    # Groups of sends over 4 queues, 64 KiB segments (the larger groups roll to the next
    # one): after each group every queue is read from where its consumer stood, and the
    # body is the records' bytes as the files hold them, whichever way it was read.
    store = FileMessageStore(small_config(tmp_path_factory.mktemp("recent")))
    try:
        pulled = [0, 0, 0, 0]
        for number, group in enumerate(groups):
            messages = [message(TOPIC, queue_id, bytes([number % 256]) * size or b"x",
                                keys=f"k{number}")
                        for queue_id, size in group]
            if len(messages) == 1:
                store.put_message(messages[0])
            else:
                store.put_message_group(messages)
            for queue_id in range(4):
                result = store.get_messages(TOPIC, queue_id, pulled[queue_id], 32, ALL_BYTES)
                if result.status is not GetStatus.FOUND:
                    continue
                records = _records_of(store, queue_id, pulled[queue_id])[
                    : result.message_count]
                expected = b"".join(_segment_bytes(store, offset, size)
                                    for offset, size in records)
                assert result.body == expected
                pulled[queue_id] += result.message_count
    finally:
        store.close()


def test_a_pull_of_what_was_just_appended_does_not_read_the_mapping(tmp_path):
    store = FileMessageStore(small_config(tmp_path))
    try:
        store.put_message_group([message(TOPIC, queue_id % 2, b"m" * 900)
                                 for queue_id in range(8)])
        looked_up = []
        find_file = store.commit_log.find_file
        store.commit_log.find_file = lambda offset: looked_up.append(offset) or find_file(offset)
        for queue_id in (0, 1):
            result = store.get_messages(TOPIC, queue_id, 0, 32, ALL_BYTES)
            assert result.status is GetStatus.FOUND and result.message_count == 4
        assert looked_up == []
        # Forgotten: read through the mapping, the same bytes.
        store.commit_log.recent.clear()
        again = store.get_messages(TOPIC, 1, 0, 32, ALL_BYTES)
        assert looked_up and again.body == result.body
    finally:
        store.close()


def test_a_pull_of_queues_written_together_over_several_appends_reads_no_mapping(tmp_path):
    # Three groups of sends spread over 4 queues (as a producer's queue selection spreads
    # them): each queue's records lie apart, in three appended buffers.
    store = FileMessageStore(small_config(tmp_path))
    try:
        for number in range(3):
            store.put_message_group([message(TOPIC, index % 4, bytes([number]) * (300 + index))
                                     for index in range(12)])
        looked_up = []
        find_file = store.commit_log.find_file
        store.commit_log.find_file = lambda offset: looked_up.append(offset) or find_file(offset)
        bodies = {}
        for queue_id in range(4):
            result = store.get_messages(TOPIC, queue_id, 1, 32, ALL_BYTES)
            assert result.status is GetStatus.FOUND and result.message_count == 8
            bodies[queue_id] = result.body
        assert looked_up == []
        for queue_id in range(4):
            expected = b"".join(_segment_bytes(store, offset, size)
                                for offset, size in _records_of(store, queue_id, 1))
            assert bodies[queue_id] == expected
    finally:
        store.close()


def test_a_truncated_log_keeps_nothing_of_what_was_cut(tmp_path):
    store = FileMessageStore(small_config(tmp_path))
    try:
        first = store.put_message(message(TOPIC, 0, b"a" * 100))
        second = store.put_message(message(TOPIC, 0, b"b" * 100))
        start = second.physical_offset
        assert store.commit_log.recent.view(start, start + second.wrote_bytes) is not None
        store.commit_log.truncate(start)
        assert store.commit_log.recent.view(first.physical_offset, start) is None
        assert store.commit_log.max_offset() == start < SEGMENT_SIZE
    finally:
        store.close()

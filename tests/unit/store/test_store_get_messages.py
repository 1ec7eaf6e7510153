"""get_messages statuses (docs/protocol.md §4.4), tag filters, time search, keys, dispatch rules."""

from __future__ import annotations

import os
import time

from store_helpers import message

from tidemq.protocol.message import decode_records, tags_code
from tidemq.store import queue_reads
from tidemq.store.config import SCHEDULE_TOPIC
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import GetStatus, PutStatus

TOPIC = "Orders"
PREPARED = 0x4
COMMIT = 0x8
ROLLBACK = 0xC


def fill(store, count, queue_id=0, **fields):
    for i in range(count):
        assert store.put_message(message(queue_id=queue_id, body=f"m{i}".encode(), **fields)).ok


def test_unknown_queue_is_no_matched_logic_queue(store):
    result = store.get_messages("Nobody", 0, 5, 32, 1 << 20)
    assert (result.status, result.next_begin_offset) == (GetStatus.NO_MATCHED_LOGIC_QUEUE, 0)
    assert (store.max_offset("Nobody", 0), store.min_offset("Nobody", 0)) == (0, 0)


def test_offset_at_max_is_overflow_one_and_past_it_overflow_badly(store):
    fill(store, 3)
    one = store.get_messages(TOPIC, 0, 3, 32, 1 << 20)
    assert (one.status, one.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, 3)
    assert (one.min_offset, one.max_offset) == (0, 3)
    badly = store.get_messages(TOPIC, 0, 9, 32, 1 << 20)
    assert (badly.status, badly.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 3)
    assert badly.body == b""


def test_found_stops_at_max_count_and_max_bytes(store):
    fill(store, 10)
    result = store.get_messages(TOPIC, 0, 2, 4, 1 << 20)
    assert (result.status, result.message_count, result.next_begin_offset) == (
        GetStatus.FOUND, 4, 6,
    )
    assert [m.body for m in decode_records(result.body)] == [b"m2", b"m3", b"m4", b"m5"]
    record_size = len(result.body) // 4
    by_bytes = store.get_messages(TOPIC, 0, 0, 32, 2 * record_size + 1)
    assert (by_bytes.message_count, by_bytes.next_begin_offset) == (2, 2)
    # The first message comes back even when it alone is over max_bytes.
    tiny = store.get_messages(TOPIC, 0, 0, 32, 1)
    assert (tiny.status, tiny.message_count, tiny.next_begin_offset) == (GetStatus.FOUND, 1, 1)


def test_body_is_the_stored_records_as_they_are(store):
    fill(store, 5)
    result = store.get_messages(TOPIC, 0, 0, 32, 1 << 20)
    offsets = [m.physical_offset for m in decode_records(result.body)]
    assert result.body == b"".join(store.read_message(offset) for offset in offsets)


def test_interleaved_queues_read_back_separately(store):
    for i in range(20):
        assert store.put_message(message(queue_id=i % 3, body=f"q{i % 3}-{i}".encode())).ok
    for queue_id in range(3):
        result = store.get_messages(TOPIC, queue_id, 0, 32, 1 << 20)
        bodies = [m.body for m in decode_records(result.body)]
        assert bodies == [f"q{queue_id}-{i}".encode() for i in range(queue_id, 20, 3)]
        assert {m.queue_id for m in decode_records(result.body)} == {queue_id}


def test_tag_filter_keeps_matching_codes_and_skips_the_rest(store):
    for i in range(12):
        tags = ("paid", "refunded", "created")[i % 3]
        assert store.put_message(message(body=f"m{i}".encode(), tags=tags)).ok
    wanted = {tags_code("paid"), tags_code("created")}
    result = store.get_messages(TOPIC, 0, 0, 32, 1 << 20, tag_codes=wanted)
    messages = decode_records(result.body)
    assert [m.tags for m in messages] == ["paid", "created"] * 4
    assert result.next_begin_offset == 12  # every scanned entry is consumed
    limited = store.get_messages(TOPIC, 0, 0, 3, 1 << 20, tag_codes=[tags_code("paid")])
    assert [m.queue_offset for m in decode_records(limited.body)] == [0, 3, 6]
    assert limited.next_begin_offset == 7  # right after the last returned, not past the next
    none = store.get_messages(TOPIC, 0, 0, 32, 1 << 20, tag_codes={tags_code("other")})
    assert (none.status, none.next_begin_offset) == (GetStatus.NO_MATCHED_MESSAGE, 12)


def test_scan_is_bounded_by_one_queue_segment(store):
    # 150 entries: the test queues hold 100 entries per segment.
    fill(store, 150, tags="a")
    result = store.get_messages(TOPIC, 0, 0, 500, 1 << 30, tag_codes={tags_code("b")})
    assert (result.status, result.next_begin_offset) == (GetStatus.NO_MATCHED_MESSAGE, 100)
    rest = store.get_messages(TOPIC, 0, 100, 500, 1 << 30)
    assert (rest.message_count, rest.next_begin_offset) == (50, 150)


def test_entries_whose_records_are_gone_read_as_message_was_removing(store):
    for _ in range(2):
        assert store.put_message(message(body=b"x" * 30_000)).ok  # the first segment
    for _ in range(3):
        assert store.put_message(message(queue_id=1, body=b"y" * 30_000)).ok
    # Drop the first segment under queue 0, as a retention run racing this read would.
    store.commit_log.queue.delete_first_files(1)
    result = store.get_messages(TOPIC, 0, 0, 32, 1 << 20)
    assert (result.status, result.next_begin_offset) == (GetStatus.MESSAGE_WAS_REMOVING, 2)
    assert result.body == b""
    # Entries past the removed ones are still found in the same scan.
    assert store.get_messages(TOPIC, 1, 0, 32, 1 << 20).message_count == 3


def test_missing_queue_segment_is_rebuilt_at_open_and_reads_again(config):
    store = FileMessageStore(config)
    fill(store, 250)  # queue segments at entries 0, 100, 200
    store.close()
    queue_dir = os.path.join(config.store_path_root_dir, "consumequeue", TOPIC, "0")
    os.unlink(os.path.join(queue_dir, str(100 * 20).zfill(20)))
    store = FileMessageStore(config)
    try:
        assert (TOPIC, 0) in store.recovery_report.rebuilt_queues
        result = store.get_messages(TOPIC, 0, 150, 32, 1 << 20)
        assert (result.status, result.next_begin_offset) == (GetStatus.FOUND, 182)
        assert store.get_messages(TOPIC, 0, 200, 32, 1 << 20).status is GetStatus.FOUND
    finally:
        store.close()


def test_queue_with_no_entries_is_no_message_in_queue(config):
    store = FileMessageStore(config)
    store.close()
    os.makedirs(os.path.join(config.store_path_root_dir, "consumequeue", TOPIC, "0"))
    store = FileMessageStore(config)
    try:
        result = store.get_messages(TOPIC, 0, 4, 32, 1 << 20)
        assert (result.status, result.next_begin_offset) == (GetStatus.NO_MESSAGE_IN_QUEUE, 0)
    finally:
        store.close()


def _put_at_distinct_times(store, count, gap_ms=5):
    """Put messages whose store times are at least gap_ms apart; return their times."""
    times = []
    for i in range(count):
        if times:
            while int(time.time() * 1000) < times[-1] + gap_ms:
                time.sleep(0.001)
        result = store.put_message(message(body=f"t{i}".encode()))
        times.append(result.store_timestamp)
    return times


def test_offset_by_time_prefers_exact_then_closer_then_earlier(store):
    times = _put_at_distinct_times(store, 4)
    assert store.offset_by_time(TOPIC, 0, times[2]) == 2
    assert store.offset_by_time(TOPIC, 0, times[1] + 1) == 1
    assert store.offset_by_time(TOPIC, 0, times[2] - 1) == 2
    middle = times[1] + (times[2] - times[1]) // 2
    if (times[2] - times[1]) % 2 == 0:
        assert store.offset_by_time(TOPIC, 0, middle) == 1  # a tie goes to the earlier one
    assert store.offset_by_time(TOPIC, 0, times[0] - 10_000) == 0
    assert store.offset_by_time(TOPIC, 0, times[3] + 10_000) == 3
    assert store.offset_by_time("Nobody", 0, times[0]) == 0


def test_offset_by_time_returns_the_first_of_equal_times(store):
    result = store.put_messages([message(body=b"a"), message(body=b"b"), message(body=b"c")])
    assert store.offset_by_time(TOPIC, 0, result.store_timestamp) == 0


def test_earliest_message_time_is_the_first_store_time(store):
    assert store.earliest_message_time(TOPIC, 0) == -1
    times = _put_at_distinct_times(store, 2, gap_ms=2)
    assert store.earliest_message_time(TOPIC, 0) == times[0]


def test_query_by_key_and_unique_key_newest_first(store):
    results = [
        store.put_message(message(body=f"m{i}".encode(), keys=f"order-{i % 2} shared",
                                  unique_key=f"U{i}"))
        for i in range(6)
    ]
    query = store.query_messages(TOPIC, "order-1", 10, 0, 2**62)
    assert [m.body for m in decode_records(query.body)] == [b"m5", b"m3", b"m1"]
    assert query.index_last_update_physical_offset == results[-1].physical_offset
    assert query.index_last_update_timestamp_ms == results[-1].store_timestamp
    assert len(store.query_messages(TOPIC, "shared", 4, 0, 2**62).records) == 4
    unique = store.query_messages(TOPIC, "U2", 32, 0, 2**62)
    assert [m.unique_key for m in decode_records(unique.body)] == ["U2"]
    assert store.query_messages("Other", "order-1", 10, 0, 2**62).records == []
    late = results[0].store_timestamp + 10**9
    assert store.query_messages(TOPIC, "order-1", 10, late, late + 1).records == []


def test_transaction_types_follow_the_dispatch_rules(store):
    prepared = store.put_message(message(body=b"half", keys="tx", sysflag=PREPARED))
    rollback = store.put_message(message(body=b"rolled", keys="tx", sysflag=ROLLBACK))
    commit = store.put_message(message(body=b"done", keys="tx", sysflag=COMMIT))
    assert prepared.queue_offset == 0 and rollback.queue_offset == 0
    assert store.max_offset(TOPIC, 0) == 1  # only the commit record is queued
    assert [m.body for m in decode_records(store.get_messages(TOPIC, 0, 0, 32, 1 << 20).body)] == [
        b"done"
    ]
    indexed = {m.body for m in decode_records(store.query_messages(TOPIC, "tx", 32, 0, 2**62).body)}
    assert indexed == {b"half", b"done"}  # rollback records are not indexed
    assert store.read_message(prepared.physical_offset) is not None
    assert commit.queue_offset == 0


def test_delay_topic_tag_code_is_the_delivery_time(store):
    # Level 3 is 10 s in the default messageDelayLevel.
    delayed = message(topic=SCHEDULE_TOPIC, queue_id=2, body=b"delayed")
    delayed.properties["DELAY"] = "3"
    result = store.put_message(delayed)
    due = result.store_timestamp + 10_000
    found = store.get_messages(SCHEDULE_TOPIC, 2, 0, 32, 1 << 20, tag_codes={due})
    assert [m.body for m in decode_records(found.body)] == [b"delayed"]


def test_explicit_tag_code_overrides_the_tags_hash(store):
    store.put_message(message(body=b"coded", tags="ignored", tags_code=424242))
    found = store.get_messages(TOPIC, 0, 0, 32, 1 << 20, tag_codes={424242})
    assert found.message_count == 1


def test_dispatch_listeners_hear_each_queue_advance(store):
    heard = []
    store.add_dispatch_listener(lambda topic, queue_id, max_offset: heard.append(
        (topic, queue_id, max_offset)))
    store.put_message(message(queue_id=1))
    store.put_messages([message(queue_id=2) for _ in range(5)])
    store.put_message(message(queue_id=1, sysflag=PREPARED))  # not dispatched to a queue
    assert heard == [(TOPIC, 1, 1), (TOPIC, 2, 5)]


def test_a_failing_listener_does_not_fail_the_append(store, caplog):
    def broken(topic, queue_id, max_offset):
        raise RuntimeError("listener bug")

    store.add_dispatch_listener(broken)
    assert store.put_message(message()).status is PutStatus.PUT_OK
    assert "listener" in caplog.text


def test_delete_topic_forgets_its_queues(store):
    fill(store, 3)
    fill(store, 2, topic="Keep")
    store.delete_topic(TOPIC)
    assert store.get_messages(TOPIC, 0, 0, 32, 1 << 20).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert store.max_offset("Keep", 0) == 2
    assert store.put_message(message(body=b"again")).queue_offset == 0


def test_truncate_cuts_the_log_and_the_queues(store):
    results = [store.put_message(message(body=f"m{i}".encode())) for i in range(6)]
    store.truncate(results[4].physical_offset)
    assert store.max_offset(TOPIC, 0) == 4
    assert store.commit_log_max_offset() == results[4].physical_offset
    assert store.read_message(results[4].physical_offset) is None
    again = store.put_message(message(body=b"new"))
    assert (again.physical_offset, again.queue_offset) == (results[4].physical_offset, 4)


def test_reading_by_columns_answers_as_the_entry_by_entry_loop(store, monkeypatch):
    # Two queues interleaved in runs of 1-5 adjacent records, records of several sizes, over
    # several 64 KiB segments (a run ends at each segment's blank tail), read at many offsets
    # with bounds by count and by bytes: the column pass (queue_reads._collect_all) and the
    # entry-by-entry loop give the same answers.
    for round_index in range(150):
        body = b"x" * (100 + 37 * (round_index % 7))
        for _ in range(round_index % 5 + 1):
            assert store.put_message(message(queue_id=round_index % 2, body=body)).ok
    reads = [(queue_id, offset, max_count, max_bytes)
             for queue_id in (0, 1)
             for offset in range(0, store.max_offset(TOPIC, queue_id), 5)
             for max_count, max_bytes in ((1, 1 << 20), (4, 1 << 20), (32, 1 << 20), (32, 900))]
    taken = []
    column_pass = queue_reads._collect_all

    def counted(*args):
        found = column_pass(*args)
        taken.append(found is not None)
        return found

    monkeypatch.setattr(queue_reads, "_collect_all", counted)
    by_columns = [store.get_messages(TOPIC, *read) for read in reads]
    # The same reads with nothing of the appended buffers kept: through the mappings only.
    store.commit_log.recent.clear()
    through_mappings = [store.get_messages(TOPIC, *read) for read in reads]
    monkeypatch.setattr(queue_reads, "_collect_all", lambda *args: None)
    by_entries = [store.get_messages(TOPIC, *read) for read in reads]
    assert by_columns == by_entries
    assert through_mappings == by_entries
    assert {r.status for r in by_columns} == {GetStatus.FOUND}
    # Most reads were by columns (the rest: over max_bytes, or across a segment's end).
    assert sum(taken[: len(reads)]) > len(reads) // 2
    assert sum(taken[len(reads) :]) > len(reads) // 2


def test_reads_the_column_pass_leaves_to_the_loop(store):
    fill(store, 6)
    fill(store, 3, queue_id=1)
    wanted = store.get_messages(TOPIC, 0, 0, 32, 1 << 20, [tags_code("none")])
    assert (wanted.status, wanted.next_begin_offset) == (GetStatus.NO_MATCHED_MESSAGE, 6)
    over_bytes = store.get_messages(TOPIC, 0, 0, 32, 10)  # the first alone is over the bound
    assert (over_bytes.message_count, over_bytes.next_begin_offset) == (1, 1)

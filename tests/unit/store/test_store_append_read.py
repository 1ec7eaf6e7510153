"""Appends and reads through the MessageStore interface, on the file store and its twin."""

from __future__ import annotations

import dataclasses

import pytest
from store_helpers import SEGMENT_SIZE, message

from tidemq.protocol.message import decode_record, decode_records
from tidemq.protocol.msgid import decode_offset_msg_id
from tidemq.store.config import StoreConfig
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import GetStatus, PutStatus

TOPIC = "Orders"
# A record of this test's messages: 91 fixed + body + topic ("Orders") + properties ("").
FIXED_RECORD_SIZE = 91 + len(TOPIC)


def read_all(store, topic=TOPIC, queue_id=0):
    """Every message of the queue, paging with next_begin_offset as a consumer does."""
    messages = []
    offset = 0
    for _ in range(1000):
        result = store.get_messages(topic, queue_id, offset, 32, 1 << 30)
        if result.status is GetStatus.OFFSET_OVERFLOW_ONE:
            return messages
        assert result.status is GetStatus.FOUND, result
        messages.extend(decode_records(result.body))
        offset = result.next_begin_offset
    raise AssertionError("queue did not end")


def test_round_trip_across_segment_rolls_with_an_exact_fill(store):
    # Fill the first segment exactly: 7 records of 8192 bytes and one of the rest.
    sizes = [8192] * 7 + [SEGMENT_SIZE - 7 * 8192]
    results = [
        store.put_message(message(body=bytes([i]) * (size - FIXED_RECORD_SIZE)))
        for i, size in enumerate(sizes)
    ]
    assert [r.status for r in results] == [PutStatus.PUT_OK] * len(sizes)
    assert results[-1].physical_offset + sizes[-1] == SEGMENT_SIZE  # fills it to the byte
    after = store.put_message(message(body=b"next"))
    assert after.physical_offset == SEGMENT_SIZE  # starts the second segment, no blank needed
    # A record that does not fit the rest of a segment starts the next one.
    big = store.put_message(message(body=b"b" * (SEGMENT_SIZE - 200)))
    assert big.physical_offset == 2 * SEGMENT_SIZE
    assert store.commit_log_max_offset() == big.physical_offset + big.wrote_bytes

    messages = read_all(store)
    assert [m.queue_offset for m in messages] == list(range(10))
    assert [m.physical_offset for m in messages] == [
        *(r.physical_offset for r in results), after.physical_offset, big.physical_offset
    ]
    assert messages[3].body == bytes([3]) * (8192 - FIXED_RECORD_SIZE)
    assert messages[8].body == b"next"
    for m in messages:
        record = store.read_message(m.physical_offset)
        assert decode_record(record).body == m.body


def test_rolls_take_the_warmed_spare_segment_when_warming_is_turned_on(config):
    # Warming is off by default (as in RocketMQ); turned on, the log's next segments come
    # from the allocator thread, zeroed, and hold exactly what was appended.
    warmed = dataclasses.replace(config, warm_mapped_file_enable=True)
    with FileMessageStore(warmed) as store:
        assert store._allocator is not None
        test_round_trip_across_segment_rolls_with_an_exact_fill(store)


def test_warming_is_off_by_default():
    assert StoreConfig().warm_mapped_file_enable is False


def test_batch_append_assigns_consecutive_queue_offsets_in_one_pass(store):
    store.put_message(message(body=b"single"))
    batch = [message(body=f"m{i}".encode(), keys=f"k{i}") for i in range(64)]
    result = store.put_messages(batch)
    assert result.status is PutStatus.PUT_OK
    assert (result.queue_offset, result.message_count) == (1, 64)
    physical = [decode_offset_msg_id(msg_id) for msg_id in result.msg_ids]
    assert {host for host, _ in physical} == {"127.0.0.1:10911"}
    assert physical[0][1] == result.physical_offset
    messages = read_all(store)
    assert [m.queue_offset for m in messages] == list(range(65))
    assert [m.physical_offset for m in messages[1:]] == [offset for _, offset in physical]
    assert [m.body for m in messages[1:]] == [f"m{i}".encode() for i in range(64)]
    assert messages[5].keys == ["k4"]
    assert result.wrote_bytes == sum(m.store_size for m in messages[1:])
    assert store.max_offset(TOPIC, 0) == 65


def test_batch_that_crosses_a_segment_end_is_split_at_a_record(store):
    body = b"x" * 900
    result = store.put_messages([message(body=body) for _ in range(200)])  # ~200 KB
    assert result.status is PutStatus.PUT_OK
    messages = read_all(store)
    assert len(messages) == 200
    for m in messages:  # no record straddles a segment end
        start = m.physical_offset
        assert start // SEGMENT_SIZE == (start + m.store_size - 1) // SEGMENT_SIZE
    assert all(m.body == body for m in messages)


def test_records_carry_store_host_times_and_message_fields(store):
    result = store.put_message(
        message(body=b"payload", tags="paid", keys="o-1 o-2", unique_key="U1", flag=7,
                born_timestamp=1_700_000_000_000, born_host="10.0.0.9:5555",
                reconsume_times=2)
    )
    m = decode_record(store.read_message(result.physical_offset))
    assert (m.topic, m.queue_id, m.body, m.flag) == (TOPIC, 0, b"payload", 7)
    assert m.properties == {"TAGS": "paid", "KEYS": "o-1 o-2", "UNIQ_KEY": "U1"}
    assert m.store_host == "127.0.0.1:10911"
    assert m.born_host == "10.0.0.9:5555"
    assert m.born_timestamp == 1_700_000_000_000
    assert m.store_timestamp == result.store_timestamp
    assert m.reconsume_times == 2
    assert m.physical_offset == result.physical_offset


def test_ipv6_hosts_are_stored_in_the_wide_layout(store):
    result = store.put_message(message(body=b"v6", born_host="[::1]:9000"))
    assert result.status is PutStatus.PUT_OK
    m = decode_record(store.read_message(result.physical_offset))
    assert m.born_host == "[::1]:9000"
    assert m.sysflag & 0x10  # BORNHOST_V6
    assert m.store_timestamp == result.store_timestamp
    assert read_all(store)[0].body == b"v6"


@pytest.mark.parametrize(
    ("bad", "status", "words"),
    [
        (message(body=b"x" * (4 * 1024 * 1024 + 1)), PutStatus.MESSAGE_ILLEGAL,
         "max_message_size=4194304"),
        (message(body=b"x" * 70_000), PutStatus.MESSAGE_ILLEGAL, "mapped_file_size_commit_log"),
        (message(topic="t" * 128), PutStatus.MESSAGE_ILLEGAL, "127"),
        (message(topic="bad topic"), PutStatus.MESSAGE_ILLEGAL, "outside"),
        (message(topic=""), PutStatus.MESSAGE_ILLEGAL, "blank"),
        (message(queue_id=-1), PutStatus.MESSAGE_ILLEGAL, "queue id -1"),
        (message(keys="k" * 40_000), PutStatus.PROPERTIES_SIZE_EXCEEDED, "32767"),
        (message(born_host="nonsense"), PutStatus.MESSAGE_ILLEGAL, "born host"),
    ],
)
def test_bad_messages_are_refused_before_anything_is_written(store, bad, status, words):
    store.put_message(message(body=b"first"))
    end = store.commit_log_max_offset()
    result = store.put_message(bad)
    assert result.status is status
    assert words in result.remark
    assert result.durable is None
    assert store.commit_log_max_offset() == end
    assert store.max_offset(TOPIC, 0) == 1


def test_a_batch_must_target_one_queue(store):
    result = store.put_messages([message(queue_id=0), message(queue_id=1)])
    assert result.status is PutStatus.MESSAGE_ILLEGAL
    assert "one queue" in result.remark
    assert store.put_messages([]).status is PutStatus.MESSAGE_ILLEGAL
    assert store.commit_log_max_offset() == 0


def test_read_message_only_answers_at_a_record_start(store):
    first = store.put_message(message(body=b"a" * 50))
    assert store.read_message(first.physical_offset + 1) is None
    assert store.read_message(first.physical_offset + first.wrote_bytes) is None
    assert store.read_message(-5) is None
    assert store.read_message(10 * SEGMENT_SIZE) is None


def test_read_records_gives_what_one_batch_append_wrote(store):
    store.put_message(message(body=b"before"))
    result = store.put_messages([message(body=b"m%d" % i) for i in range(10)])
    block = store.read_records(result.physical_offset, result.wrote_bytes)
    assert block is not None and len(block) == result.wrote_bytes
    assert [m.body for m in decode_records(block)] == [b"m%d" % i for i in range(10)]
    assert store.read_records(result.physical_offset + 1, 10) is None  # not a record start
    assert store.read_records(result.physical_offset, result.wrote_bytes + 1) is None
    assert store.read_records(result.physical_offset, 0) is None
    assert store.read_records(-5, 10) is None


def test_read_records_refuses_a_batch_split_over_a_segment_end(store):
    result = store.put_messages([message(body=b"x" * 900) for _ in range(200)])  # ~200 KB
    assert result.wrote_bytes > SEGMENT_SIZE - result.physical_offset % SEGMENT_SIZE
    assert store.read_records(result.physical_offset, result.wrote_bytes) is None


def test_closed_store_refuses_appends(store):
    store.close()
    result = store.put_message(message())
    assert result.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert "closed" in result.remark

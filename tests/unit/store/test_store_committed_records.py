"""Committed copies of half messages (TRANSACTION_COMMIT_TYPE), as END_TRANSACTION and the
exactly-once sink store them many at once: through ``put_messages`` (one queue),
``put_message_group`` (many queues) and ``put_batch`` (columns). The bytes must be the record
codec's, byte for byte, PREPARED_TRANSACTION_OFFSET and the transaction properties included;
the records are queued and indexed like plain ones. Batches of 12 messages or more are
encoded column by column, smaller ones one message at a time: both sizes are drawn.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import small_config

from tidemq.protocol.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    decode_record,
    decode_records,
    encode_properties,
    encode_record,
    pack_host,
)
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import MessageBatch, PutResult, PutStatus, StoreMessage
from tidemq.store.memory_store import MemoryMessageStore

TOPIC = "Orders"
STORE_HOST = "127.0.0.1:10911"  # small_config's default store host
ALL_BYTES = 64 * 1024 * 1024


def expected_record(m: StoreMessage, queue_offset: int, store_timestamp: int) -> bytes:
    """The record the store must write for ``m``, by the shared codec (PHYSICALOFFSET 0)."""
    store_address, store_port, _ = pack_host(STORE_HOST)
    born_address, born_port, _ = pack_host(m.born_host)
    text = m.properties_text if m.properties_text is not None else encode_properties(
        m.properties
    )
    return bytes(encode_record(
        topic=m.topic.encode(), body=m.body, properties=text.encode(), queue_id=m.queue_id,
        flag=m.flag, queue_offset=queue_offset, physical_offset=0, sysflag=m.sysflag,
        born_timestamp=m.born_timestamp, born_host=(born_address, born_port),
        store_timestamp=store_timestamp, store_host=(store_address, store_port),
        reconsume_times=m.reconsume_times,
        prepared_transaction_offset=m.prepared_transaction_offset,
    ))


def stored_record(store, msg_id: str) -> bytes:
    """The record of an offset msg id, PHYSICALOFFSET zeroed after checking it is its own."""
    physical_offset = int(msg_id[-16:], 16)
    record = store.read_message(physical_offset)
    assert record is not None
    assert decode_record(record).physical_offset == physical_offset
    return record[:28] + bytes(8) + record[36:]


@st.composite
def committed_copy(draw, queue_ids: st.SearchStrategy[int], born_host: str) -> StoreMessage:
    index = draw(st.integers(0, 10**6))
    properties = {
        "TAGS": draw(st.sampled_from(["paid", "refunded", "é"])),
        "KEYS": f"order-{index}",
        "UNIQ_KEY": f"{index:032X}",
        "TRAN_MSG": "true",
        "PGROUP": "eos-sink",
        "REAL_TOPIC": TOPIC,
        "REAL_QID": str(draw(st.integers(0, 7))),
    }
    text = encode_properties(properties) if draw(st.booleans()) else None
    return StoreMessage(
        topic=TOPIC,
        queue_id=draw(queue_ids),
        body=draw(st.binary(max_size=200)),
        properties=properties,
        flag=draw(st.integers(-(2**31), 2**31 - 1)),
        # COMMIT, with or without the compressed / multi-tags bits.
        sysflag=TRANSACTION_COMMIT_TYPE | draw(st.sampled_from([0, 0x1, 0x2])),
        born_timestamp=draw(st.integers(0, 2**62)),
        born_host=born_host,
        reconsume_times=draw(st.integers(0, 16)),
        prepared_transaction_offset=draw(st.integers(0, 2**62)),
        properties_text=text,
    )


def store() -> MemoryMessageStore:
    # 4 KiB segments: batches roll over segment ends now and then.
    return MemoryMessageStore(small_config("unused", mapped_file_size_commit_log=4096))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    born_host=st.sampled_from(["10.0.0.7:51000", "[fe80::1]:7000"]),
    data=st.data(),
)
def test_committed_batches_of_one_queue_match_the_record_codec(born_host, data):
    messages = data.draw(st.lists(committed_copy(st.just(3), born_host), min_size=1, max_size=30))
    target = store()
    try:
        result = target.put_messages(messages)
        assert result.status is PutStatus.PUT_OK, result.remark
        assert [stored_record(target, msg_id) for msg_id in result.msg_ids] == [
            expected_record(m, result.queue_offset + index, result.store_timestamp)
            for index, m in enumerate(messages)
        ]
        assert target.max_offset(TOPIC, 3) == len(messages)  # queued like plain messages
    finally:
        target.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_committed_copies_for_many_queues_match_the_record_codec_in_queue_order(data):
    messages = data.draw(
        st.lists(committed_copy(st.integers(0, 5), "10.0.0.7:51000"), min_size=1, max_size=40)
    )
    target = store()
    try:
        results = target.put_message_group(messages)
        next_offsets: dict[int, int] = {}
        for m, result in zip(messages, results, strict=True):
            assert result.status is PutStatus.PUT_OK, result.remark
            queue_offset = next_offsets.get(m.queue_id, 0)
            next_offsets[m.queue_id] = queue_offset + 1
            assert result.queue_offset == queue_offset
            assert stored_record(target, result.msg_ids[0]) == expected_record(
                m, queue_offset, result.store_timestamp
            )
        for queue_id, count in next_offsets.items():
            got = target.get_messages(TOPIC, queue_id, 0, 1000, ALL_BYTES)
            assert [r.body for r in decode_records(got.body)] == [
                m.body for m in messages if m.queue_id == queue_id
            ]
            assert got.message_count == count
    finally:
        target.close()


def test_committed_copies_are_found_by_key_after_a_group_put(tmp_path):
    # Enough hash slots that a batch's keys rarely share one: the whole-batch index write.
    target = FileMessageStore(small_config(tmp_path, max_hash_slot_num=100_000))
    copies = [
        StoreMessage(
            TOPIC, n % 4, b"c%d" % n,
            {"KEYS": f"order-{n}", "UNIQ_KEY": f"{n:032X}", "REAL_TOPIC": TOPIC},
            sysflag=TRANSACTION_COMMIT_TYPE, prepared_transaction_offset=1000 + n,
        )
        for n in range(40)
    ]
    try:
        assert all(r.ok for r in target.put_message_group(copies))
        for n in (0, 17, 39):
            found = target.query_messages(TOPIC, f"order-{n}", 5, 0, 2**62)
            records = [decode_record(r) for r in found.records]
            assert [(r.body, r.prepared_transaction_offset) for r in records] == [
                (b"c%d" % n, 1000 + n)
            ]
    finally:
        target.close()


def test_plain_and_committed_runs_in_one_group_keep_each_queues_order(tmp_path):
    target = MemoryMessageStore(small_config(tmp_path))
    messages = [
        StoreMessage(
            TOPIC, n % 2, b"m%d" % n, {"UNIQ_KEY": f"{n:032X}"},
            sysflag=TRANSACTION_COMMIT_TYPE if (n // 10) % 2 else 0,
        )
        for n in range(50)
    ]
    try:
        assert all(r.ok for r in target.put_message_group(messages))
        for queue_id in (0, 1):
            got = target.get_messages(TOPIC, queue_id, 0, 1000, ALL_BYTES)
            records = decode_records(got.body)
            assert [r.body for r in records] == [
                m.body for m in messages if m.queue_id == queue_id
            ]
            assert [r.sysflag for r in records] == [
                m.sysflag for m in messages if m.queue_id == queue_id
            ]
    finally:
        target.close()


def test_half_messages_in_a_group_are_stored_but_not_queued(tmp_path):
    target = MemoryMessageStore(small_config(tmp_path))
    messages = [
        StoreMessage(
            TOPIC, 0, b"m%d" % n, {"UNIQ_KEY": f"{n:032X}"},
            sysflag=TRANSACTION_PREPARED_TYPE if n in (3, 15) else TRANSACTION_COMMIT_TYPE,
        )
        for n in range(20)
    ]
    try:
        results = target.put_message_group(messages)
        assert all(r.ok for r in results)
        assert target.max_offset(TOPIC, 0) == 18
        half = decode_record(target.read_message(results[15].physical_offset))
        assert half.body == b"m15" and half.sysflag == TRANSACTION_PREPARED_TYPE
    finally:
        target.close()


def test_put_batch_of_committed_copies_stores_what_put_messages_stores(tmp_path):
    def batch() -> MessageBatch:
        count = 20
        return MessageBatch(
            topic=TOPIC, queue_id=1,
            bodies=[b"body-%d" % n for n in range(count)],
            properties=[
                encode_properties({"TAGS": "paid", "UNIQ_KEY": f"{n:032X}"}).encode()
                for n in range(count)
            ],
            flags=[n for n in range(count)],
            tags=["paid"] * count,
            keys=[(f"{n:032X}",) for n in range(count)],
            sysflag=TRANSACTION_COMMIT_TYPE,
            born_timestamp=1_700_000_000_000,
            born_host="10.0.0.7:51000",
        )

    columns, rows = (
        FileMessageStore(small_config(tmp_path / n, max_hash_slot_num=100_000))
        for n in ("a", "b")
    )
    try:
        by_columns: PutResult = columns.put_batch(batch())
        by_rows: PutResult = rows.put_messages(batch().to_store_messages())
        assert by_columns.ok and by_rows.ok
        for a, b in zip(by_columns.msg_ids, by_rows.msg_ids, strict=True):
            record_a, record_b = stored_record(columns, a), stored_record(rows, b)
            # STORETIMESTAMP (at 56) is each store's own clock.
            assert record_a[:56] + record_a[64:] == record_b[:56] + record_b[64:]
            assert decode_record(record_a).sysflag == TRANSACTION_COMMIT_TYPE
        assert columns.max_offset(TOPIC, 1) == 20
        found = columns.query_messages(TOPIC, f"{7:032X}", 5, 0, 2**62)
        assert [decode_record(r).body for r in found.records] == [b"body-7"]
    finally:
        columns.close()
        rows.close()

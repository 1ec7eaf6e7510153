"""Batches as the broker appends them: the stored bytes, the tag codes and the index keys of
every record, whatever mix of messages a batch holds, and the refusals of a bad message
inside a batch. The batches here have 20 messages or more where the point is a big batch:
the store encodes those column by column, and small ones one message at a time.

The oracle for the bytes is the shared record codec (``encode_record``), which the store's
batch encoder does not use for IPv4 records: two encoders have to agree byte for byte.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import message, small_config

from tidemq.protocol.message import (
    decode_record,
    decode_records,
    encode_properties,
    encode_record,
    pack_host,
    tags_code,
)
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import GetStatus, PutResult, PutStatus, StoreMessage
from tidemq.store.memory_store import MemoryMessageStore

TOPIC = "Orders"
STORE_HOST = "127.0.0.1:10911"  # small_config's default store host


def expected_records(messages: list[StoreMessage], result: PutResult) -> list[bytes]:
    """What the store must have written for ``messages``, by the shared codec."""
    records = []
    store_address, store_port, _ = pack_host(STORE_HOST)
    for index, m in enumerate(messages):
        born_address, born_port, _ = pack_host(m.born_host)
        text = m.properties_text if m.properties_text is not None else encode_properties(
            {name: None if value is None else str(value) for name, value in m.properties.items()}
        )
        records.append(bytes(encode_record(
            topic=m.topic.encode(), body=m.body, properties=text.encode(), queue_id=m.queue_id,
            flag=m.flag, queue_offset=result.queue_offset + index,
            physical_offset=0,  # compared apart: the batch may have rolled to a new segment
            sysflag=m.sysflag, born_timestamp=m.born_timestamp,
            born_host=(born_address, born_port), store_timestamp=result.store_timestamp,
            store_host=(store_address, store_port), reconsume_times=m.reconsume_times,
            prepared_transaction_offset=m.prepared_transaction_offset,
        )))
    return records


def stored_records(store, result: PutResult) -> list[bytes]:
    """The records the put wrote, PHYSICALOFFSET zeroed after checking it is their own."""
    records = []
    for msg_id in result.msg_ids:
        physical_offset = int(msg_id[-16:], 16)
        record = store.read_message(physical_offset)
        assert record is not None
        assert decode_record(record).physical_offset == physical_offset
        records.append(record[:28] + bytes(8) + record[36:])
    return records


property_names = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "ORDER_ID", "é"])
property_values = st.one_of(
    st.text(alphabet="abcXYZ019-_ #", min_size=0, max_size=12),
    st.text(min_size=1, max_size=6),  # any code point, non-ASCII included
)


@st.composite
def store_messages(draw, born_host: str) -> StoreMessage:
    properties = draw(st.dictionaries(property_names, property_values, max_size=5))
    properties = {name: value for name, value in properties.items() if value}
    text = encode_properties(properties) if draw(st.booleans()) else None
    return StoreMessage(
        topic=TOPIC,
        queue_id=3,
        body=draw(st.binary(max_size=300)),
        properties=properties,
        flag=draw(st.integers(-(2**31), 2**31 - 1)),
        sysflag=draw(st.sampled_from([0, 0x1, 0x2])),
        born_timestamp=draw(st.integers(0, 2**62)),
        born_host=born_host,
        reconsume_times=draw(st.integers(0, 16)),
        tags_code=draw(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))),
        properties_text=text,
    )


@st.composite
def batches(draw) -> list[StoreMessage]:
    born_host = draw(st.sampled_from(["10.0.0.7:51000", "[fe80::1]:7000", "127.0.0.1:1"]))
    # Up to 30: small batches are encoded one message at a time, larger ones column by column.
    return draw(st.lists(store_messages(born_host), min_size=1, max_size=30))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch_list=st.lists(batches(), min_size=1, max_size=4))
def test_stored_batches_match_the_record_codec_byte_for_byte(batch_list):
    # 4 KiB segments: batches roll over segment ends now and then.
    store = MemoryMessageStore(small_config("unused", mapped_file_size_commit_log=4096))
    try:
        queue_offset = 0
        for messages in batch_list:
            result = store.put_messages(messages)
            assert result.status is PutStatus.PUT_OK, result.remark
            assert result.queue_offset == queue_offset
            assert stored_records(store, result) == expected_records(messages, result)
            # The consume queue holds each message's tag code: the override, else TAGS'.
            for index, m in enumerate(messages):
                code = m.tags_code if m.tags_code is not None else tags_code(
                    m.properties.get("TAGS"))
                got = store.get_messages(TOPIC, 3, queue_offset + index, 1, 1 << 30, [code])
                assert got.status is GetStatus.FOUND
                assert decode_record(got.body).queue_offset == queue_offset + index
            queue_offset += len(messages)
    finally:
        store.close()


def test_a_batch_is_found_by_every_unique_key_and_keys_token(store):
    messages = [
        message(body=b"m%d" % i, tags="paid", keys=f"order-{i} user-{i % 3}",
                unique_key=f"AC11000200002A9F0000000000{i:06X}")
        for i in range(40)
    ]
    result = store.put_messages(messages)
    assert result.status is PutStatus.PUT_OK
    offsets = [int(msg_id[-16:], 16) for msg_id in result.msg_ids]
    for i in range(40):
        found = store.query_messages(TOPIC, f"AC11000200002A9F0000000000{i:06X}", 10, 0, 2**62)
        assert [decode_record(r).physical_offset for r in found.records] == [offsets[i]]
        found = store.query_messages(TOPIC, f"order-{i}", 10, 0, 2**62)
        assert [decode_record(r).body for r in found.records] == [b"m%d" % i]
    # A token several messages share finds them all, newest first.
    found = store.query_messages(TOPIC, "user-1", 64, 0, 2**62)
    assert [decode_record(r).body for r in found.records] == [
        b"m%d" % i for i in reversed(range(40)) if i % 3 == 1
    ]


def test_properties_text_is_stored_as_given_and_keys_come_from_the_properties(store):
    properties = {"TAGS": "paid", "KEYS": "o-1", "UNIQ_KEY": "U-1", "CLUSTER": "c1"}

    def as_text(props: dict[str, str]) -> str:
        # The same properties in another order than the dict's: the text is what is stored.
        return encode_properties(dict(reversed(props.items())))

    messages = [
        StoreMessage(TOPIC, 0, b"body%d" % i, dict(properties, KEYS=f"o-{i}"),
                     properties_text=as_text(dict(properties, KEYS=f"o-{i}")))
        for i in range(20)
    ]
    single = StoreMessage(TOPIC, 0, b"single", properties, properties_text=as_text(properties))
    first = store.put_message(single)
    assert first.status is PutStatus.PUT_OK
    result = store.put_messages(messages)
    assert result.status is PutStatus.PUT_OK
    stored = [store.read_message(first.physical_offset)] + [
        store.read_message(int(msg_id[-16:], 16)) for msg_id in result.msg_ids
    ]
    for record, m in zip(stored, [single, *messages], strict=True):
        assert record.endswith(m.properties_text.encode())
    records = [decode_record(record) for record in stored[1:]]
    assert [r.properties["KEYS"] for r in records] == [f"o-{i}" for i in range(20)]
    found = store.query_messages(TOPIC, "o-4", 10, 0, 2**62)
    assert [decode_record(r).body for r in found.records] == [b"body4"]
    paid = store.get_messages(TOPIC, 0, 0, 32, 1 << 20, [tags_code("paid")])
    assert paid.message_count == 21


def test_property_values_that_are_not_strings_are_rendered_or_skipped(store):
    batch = [
        StoreMessage(TOPIC, 0, b"x", {"TAGS": "t", "COUNT": 5, "GONE": None})  # type: ignore[dict-item]
        for _ in range(20)
    ]
    result = store.put_messages(batch)
    assert result.status is PutStatus.PUT_OK
    record = decode_record(store.read_message(result.physical_offset))
    assert record.properties == {"TAGS": "t", "COUNT": "5"}


BIG = 4 * 1024 * 1024 + 1


@pytest.mark.parametrize(
    ("bad", "status", "words"),
    [
        (message(body=b"x" * BIG), PutStatus.MESSAGE_ILLEGAL, "max_message_size=4194304"),
        (message(body=b"x" * 70_000), PutStatus.MESSAGE_ILLEGAL, "mapped_file_size_commit_log"),
        (message(keys="k" * 40_000), PutStatus.PROPERTIES_SIZE_EXCEEDED, "32767"),
        (message(queue_id=1), PutStatus.MESSAGE_ILLEGAL, "one queue"),
        (message(topic="Other"), PutStatus.MESSAGE_ILLEGAL, "one queue"),
        (message(sysflag=0x4), PutStatus.MESSAGE_ILLEGAL, "transactional"),
        (message(born_host="nonsense"), PutStatus.MESSAGE_ILLEGAL, "born host"),
        (message(flag=2**40), PutStatus.MESSAGE_ILLEGAL, "does not fit"),
    ],
)
def test_one_bad_message_in_a_batch_refuses_the_batch(store, bad, status, words):
    store.put_message(message(body=b"first"))
    end = store.commit_log_max_offset()
    batch = [message(body=b"ok%d" % i, keys=f"k{i}") for i in range(19)]
    batch.insert(15, bad)
    result = store.put_messages(batch)
    assert result.status is status
    assert words in result.remark
    assert store.commit_log_max_offset() == end
    assert store.max_offset(TOPIC, 0) == 1


def test_a_body_over_max_message_size_in_a_batch_refuses_the_batch(tmp_path):
    with MemoryMessageStore(small_config(tmp_path, max_message_size=100)) as store:
        batch = [message(body=b"x" * 100) for _ in range(19)] + [message(body=b"x" * 101)]
        result = store.put_messages(batch)
        assert result.status is PutStatus.MESSAGE_ILLEGAL
        assert "101 bytes, larger than max_message_size=100" in result.remark
        assert store.put_messages(batch[:19]).status is PutStatus.PUT_OK


def test_file_store_batches_read_back_after_reopen(tmp_path):
    config = small_config(tmp_path / "store")
    messages = [message(body=bytes([i % 256]) * 500, tags="t", keys=f"k{i}") for i in range(300)]
    with FileMessageStore(config) as store:
        for start in range(0, 300, 64):
            assert store.put_messages(messages[start : start + 64]).ok
    with FileMessageStore(config) as store:
        got = []
        offset = 0
        while offset < 300:
            result = store.get_messages(TOPIC, 0, offset, 32, 1 << 20)
            assert result.status is GetStatus.FOUND
            got.extend(decode_records(result.body))
            offset = result.next_begin_offset
        assert [m.body for m in got] == [m.body for m in messages]
        found = store.query_messages(TOPIC, "k299", 5, 0, 2**62)
        assert [decode_record(r).body for r in found.records] == [bytes([299 % 256]) * 500]



def test_a_batch_of_committed_transactional_messages_is_stored_and_queued(store):
    # The transaction service commits many halves at once: all-COMMIT batches share one put.
    committed = [message(body=b"c%d" % i, keys=f"k{i}", sysflag=0x8) for i in range(20)]
    result = store.put_messages(committed)
    assert result.ok and result.message_count == 20
    assert store.max_offset(TOPIC, 0) == 20
    got = store.get_messages(TOPIC, 0, 0, 32, 1 << 20)
    assert got.message_count == 20


def test_a_committed_message_in_a_plain_batch_refuses_the_batch(store):
    batch = [message(body=b"p%d" % i) for i in range(19)]
    batch.insert(7, message(body=b"c", sysflag=0x8))
    result = store.put_messages(batch)
    assert result.status is PutStatus.MESSAGE_ILLEGAL
    assert "transactional" in result.remark
    assert store.max_offset(TOPIC, 0) == 0

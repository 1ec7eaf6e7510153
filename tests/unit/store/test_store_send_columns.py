"""put_send_columns: single sends given in columns are stored exactly as put_message_group
stores the same messages (commit-log bytes, consume-queue entries, index entries, results),
or left to it with nothing written."""

from __future__ import annotations

import itertools
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import small_config

from tidemq.protocol.message import (
    SYSFLAG_MULTI_TAGS,
    TRANSACTION_COMMIT_TYPE,
    decode_properties,
    decode_records,
    encode_properties,
)
from tidemq.store import record_encoder
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import PutStatus, SendColumns, StoreMessage
from tidemq.store.memory_store import MemoryMessageStore
from tidemq.store.record_encoder import index_keys

TOPIC = "Orders"
QUEUES = 8
NOW_S = 1_764_000_000.123  # the store time both stores take (time.time pinned)
SYSFLAG_COMPRESSED = 1


def columns_of(topic: str, queue_ids, bodies, property_maps, flags, sysflags,
               born_timestamps, born_host: str) -> SendColumns:
    """The columns a broker hands the store for these messages (tags and keys read from
    each message's properties, as broker/plain_sends.py reads them)."""
    tags = [properties.get("TAGS") for properties in property_maps]
    return SendColumns(
        topic, list(queue_ids), list(bodies), [encode_properties(p) for p in property_maps],
        list(flags), list(sysflags), list(born_timestamps), born_host,
        None if tags.count(None) == len(tags) else tags,
        [index_keys(properties) for properties in property_maps])


def messages_of(sends: SendColumns) -> list[StoreMessage]:
    """The same messages as put_message_group takes them (the text kept, as the broker's
    plain path passes it)."""
    return [
        StoreMessage(sends.topic, queue_id, body, decode_properties(text), flag, sysflag,
                     born_timestamp, sends.born_host, 0, 0, None, text)
        for queue_id, body, text, flag, sysflag, born_timestamp in zip(
            sends.queue_ids, sends.bodies, sends.properties, sends.flags, sends.sysflags,
            sends.born_timestamps, strict=True)
    ]


def everything_stored(store, sends: SendColumns):
    """Every byte the two paths must write alike: the commit log, each queue's entries,
    and what each index key finds."""
    entries = [store.consume_queue_entries(sends.topic, queue_id, 0, 10_000)
               for queue_id in range(QUEUES)]
    found = [
        store.query_messages(sends.topic, key, 64, 0, 2**62).records
        for key in sorted({key for keys in sends.keys for key in keys})
    ]
    return store.read_commit_log(0, 1 << 30), entries, found


def both_ways(make_store, sends: SendColumns, earlier: list[StoreMessage] = ()):
    """Put ``sends`` by columns into one store and as messages into another (each after
    ``earlier``); both results and both stores' contents."""
    with mock.patch("time.time", return_value=NOW_S):
        columns_store, reference = make_store("columns"), make_store("reference")
        try:
            for store in (columns_store, reference):
                if earlier:
                    assert all(r.ok for r in store.put_message_group(list(earlier)))
            put = columns_store.put_send_columns(sends)
            results = reference.put_message_group(messages_of(sends))
            return (put, results, everything_stored(columns_store, sends),
                    everything_stored(reference, sends))
        finally:
            columns_store.close()
            reference.close()


NAME_TEXT = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x2FF,
                                  blacklist_characters="\x01\x02 "), min_size=1, max_size=12)


@st.composite
def property_maps(draw, count: int):
    """Plain sends' properties: a UNIQ_KEY each, some with TAGS and KEYS (one token or
    several, spaces doubled), all with the CLUSTER the broker adds."""
    with_tags = draw(st.booleans())
    with_keys = draw(st.booleans())
    maps = []
    for n in range(count):
        properties = {"UNIQ_KEY": f"C0A80001{n:024X}"}
        if with_tags and draw(st.booleans()):
            properties["TAGS"] = draw(NAME_TEXT)
        if with_keys and draw(st.booleans()):
            properties["KEYS"] = draw(st.sampled_from(["k", "a b", " a  b ", "x\u00e9"]))
        properties["CLUSTER"] = "DefaultCluster"
        maps.append(properties)
    return maps


@settings(max_examples=50, deadline=None)
@given(data=st.data(), count=st.integers(2, 40),
       body_length=st.sampled_from([None, 0, 1, 1024]),  # None: each body its own length
       sysflag=st.sampled_from([0, SYSFLAG_MULTI_TAGS, SYSFLAG_COMPRESSED,
                                TRANSACTION_COMMIT_TYPE, None]),  # None: mixed
       born_port=st.integers(0, 65535))
def test_sends_in_columns_are_stored_as_put_message_group_stores_them(
        tmp_path_factory, data, count, body_length, sysflag, born_port):
    root = tmp_path_factory.mktemp("columns")
    counter = itertools.count()

    def make_store(name):
        return MemoryMessageStore(small_config(root / f"{name}{next(counter)}"))

    queue_ids = data.draw(st.lists(st.integers(0, QUEUES - 1), min_size=count, max_size=count))
    bodies = [bytes([n % 256]) * (n + 1 if body_length is None else body_length)
              for n in range(count)]
    flags = data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=count,
                               max_size=count))
    sysflags = ([sysflag] * count if sysflag is not None
                else [0, TRANSACTION_COMMIT_TYPE] * (count // 2) + [0] * (count % 2))
    born = data.draw(st.lists(st.integers(0, 2**63 - 1), min_size=count, max_size=count))
    sends = columns_of(TOPIC, queue_ids, bodies, data.draw(property_maps(count)), flags,
                       sysflags, born, f"10.0.0.7:{born_port}")
    earlier = [StoreMessage(TOPIC, queue_id, b"earlier", {"UNIQ_KEY": f"E{queue_id}"})
               for queue_id in range(0, QUEUES, 3)]

    put, results, by_columns, by_messages = both_ways(make_store, sends, earlier)

    if sysflag is None:
        # Two transaction types: not one queue group; left to put_message_group, unwritten.
        assert put is None
        assert by_columns[0] != by_messages[0]
        assert len(by_columns[0]) < len(by_messages[0])
        return
    assert put is not None
    assert put.status is PutStatus.PUT_OK
    assert put.put_results() == results
    assert put.first_result() == results[0]
    assert put.msg_ids == [result.msg_ids[0] for result in results]
    assert put.queue_offsets == [result.queue_offset for result in results]
    assert by_columns == by_messages
    assert len(by_columns[0]) > sum(map(len, bodies))


def test_a_group_spanning_a_segment_roll_is_stored_and_recovered_as_messages(tmp_path):
    # 1 KiB records in 64 KiB segments: the group rolls to a new segment part way; the
    # file stores reopen after a crash (abort left) with the same contents.
    count = 90
    sends = columns_of(
        TOPIC, [n % QUEUES for n in range(count)], [bytes([n]) * 1024 for n in range(count)],
        [{"UNIQ_KEY": f"U{n:031d}", "KEYS": f"k{n % 7}", "CLUSTER": "C"} for n in range(count)],
        [0] * count, [0] * count, [1_700_000_000_000 + n for n in range(count)],
        "127.0.0.1:45678")
    earlier = [StoreMessage(TOPIC, 0, b"x" * 40_000, {"UNIQ_KEY": "E"})]
    stores = {}

    def make_store(name):
        stores[name] = small_config(tmp_path / name)
        return FileMessageStore(stores[name])

    put, results, by_columns, by_messages = both_ways(make_store, sends, earlier)

    assert put is not None and put.put_results() == results
    assert by_columns == by_messages
    first_segment = 64 * 1024
    assert put.physical_offsets[0] < first_segment <= put.physical_offsets[-1]
    for name in stores:  # a crash: recovery rebuilds the queues and the index from the log
        (tmp_path / name / "abort").write_bytes(b"")
        with FileMessageStore(stores[name]) as reopened:
            assert everything_stored(reopened, sends) == by_messages


@pytest.mark.parametrize("case", ["one message", "ipv6 born host", "bad born host",
                                  "body too large", "bad topic", "closed store"])
def test_sends_the_columns_cannot_take_are_left_to_put_message_group_unwritten(tmp_path, case):
    count = 1 if case == "one message" else 4
    sends = columns_of(
        "Bad Topic!" if case == "bad topic" else TOPIC, [0] * count, [b"b"] * count,
        [{"UNIQ_KEY": f"U{n}", "CLUSTER": "C"} for n in range(count)], [0] * count,
        [0] * count, [1] * count,
        {"ipv6 born host": "[::1]:4242", "bad born host": "nowhere"}.get(case, "10.0.0.1:1"))
    config = small_config(tmp_path, max_message_size=4 if case == "body too large" else 4096)
    if case == "body too large":
        sends.bodies[2] = b"12345"
    store = MemoryMessageStore(config)
    if case == "closed store":
        store.close()
    try:
        assert store.put_send_columns(sends) is None
        assert store.commit_log_max_offset() == 0
    finally:
        store.close()


def test_a_failed_append_refuses_every_send_of_the_group(tmp_path):
    # The store stops taking writes between the columns' checks and the append (a dispatch
    # failed elsewhere): each send gets the refusal put_message_group gives.
    count = 3
    sends = columns_of(TOPIC, [0, 1, 2], [b"b"] * count,
                       [{"UNIQ_KEY": f"U{n}", "CLUSTER": "C"} for n in range(count)],
                       [0] * count, [0] * count, [1] * count, "10.0.0.1:1")
    with MemoryMessageStore(small_config(tmp_path)) as store:
        reason = "dispatch failed (test); restart the broker to rebuild"
        with mock.patch.object(type(store), "_write_refusal", return_value=None):
            store._not_writable_reason = reason
            put = store.put_send_columns(sends)
            expected = store.put_message_group(messages_of(sends))
        assert put is not None
        assert put.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert put.put_results() == expected
        assert put.first_result() == expected[0]
        assert store.commit_log_max_offset() == 0


def test_like_sends_are_packed_as_their_prefixes_joined():
    # Records of one size go with one pack each; the same records of the join path (each
    # prefix packed, then joined) are the same bytes, BODYCRC's high bit cleared in both.
    count = 16
    bodies = [bytes([n]) * 1024 for n in range(count)]
    sends = columns_of(TOPIC, [n % 3 for n in range(count)], bodies,
                       [{"UNIQ_KEY": f"U{n:031d}", "CLUSTER": "C"} for n in range(count)],
                       list(range(count)), [SYSFLAG_MULTI_TAGS] * count,
                       [1_700_000_000_000 + n for n in range(count)], "10.0.0.7:4242")
    packed = record_encoder.encode_send_columns(sends, (b"\x7f\x00\x00\x01", 10911), 5,
                                                4096, 1 << 20, True)
    with mock.patch.object(record_encoder, "_pack_like_sends", return_value=None):
        joined = record_encoder.encode_send_columns(sends, (b"\x7f\x00\x00\x01", 10911), 5,
                                                    4096, 1 << 20, True)
    assert packed is not None and joined is not None
    assert packed.buffer == joined.buffer
    records = decode_records(bytes(packed.buffer))
    assert [record.body for record in records] == bodies
    assert [record.queue_id for record in records] == sends.queue_ids
    assert [record.store_timestamp for record in records] == [5] * count

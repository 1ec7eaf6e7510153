"""A lone send's append (encode_single, CommitLog.append_one, dispatch_one): the same
records, queue entries, index keys and answers as the general path, without its steps."""

from __future__ import annotations

import pytest
from store_helpers import SEGMENT_SIZE, message, small_config

from tidemq.protocol.message import (
    POSITION_QUEUE_OFFSET,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    decode_records,
)
from tidemq.protocol.msgid import decode_offset_msg_id
from tidemq.store import store_core
from tidemq.store.config import SCHEDULE_TOPIC
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import PutStatus, StoreMessage
from tidemq.store.record_encoder import encode_messages, encode_single, ipv4_host_packed

STORE_HOST = "10.1.2.3:10911"
NOW_MS = 1_764_000_000_123
ALL_BYTES = 64 * 1024 * 1024
STORE_TIMESTAMP = slice(56, 64)  # STORETIMESTAMP of an IPv4 record


def encoded_both_ways(sent: StoreMessage, *, with_keys: bool = True):
    single = encode_single(sent, ipv4_host_packed(STORE_HOST), NOW_MS, 4 * 1024 * 1024,
                           SEGMENT_SIZE, with_keys)
    general = encode_messages([sent], store_host=STORE_HOST, store_timestamp=NOW_MS,
                              max_message_size=4 * 1024 * 1024, segment_size=SEGMENT_SIZE,
                              with_keys=with_keys)
    return single, general


LONE_SENDS = {
    "no properties": message(body=b""),
    "unique key only": message(unique_key="7F0000010001ABCDEF0123456789ABCDEF"),
    "tags keys and unique key": message(tags="paid", keys="o-42 o-43", unique_key="AB" * 16),
    "keys with doubled spaces": message(keys=" a  b ", unique_key="CD" * 16),
    "empty unique key": message(unique_key="", tags="t"),
    "unicode values and a big body": message(
        "Orders_x-1|%", 7, b"\xff" * 30_000,
        tags="t\u00e9", keys="cl\u00e9", unique_key="EF" * 16, flag=-5, sysflag=0x12,
        born_timestamp=2**40, born_host="192.168.7.9:65535", reconsume_times=3),
    "properties text given": StoreMessage(
        "Orders", 1, b"b", {"TAGS": "x", "UNIQ_KEY": "01" * 16},
        properties_text="TAGS\x01x\x02UNIQ_KEY\x01" + "01" * 16),
    "tag code given": StoreMessage("Orders", 2, b"b", {"TAGS": "x"}, tags_code=-77),
    "committed copy": message(
        sysflag=TRANSACTION_COMMIT_TYPE, prepared_transaction_offset=123_456, tags="c",
        unique_key="02" * 16),
}


@pytest.mark.parametrize("with_keys", [True, False])
@pytest.mark.parametrize("case", list(LONE_SENDS))
def test_single_encoder_writes_the_bytes_the_batch_encoder_writes(case, with_keys):
    sent = LONE_SENDS[case]
    single, general = encoded_both_ways(sent, with_keys=with_keys)
    assert single is not None
    assert bytes(single.buffer) == bytes(general.buffer)
    assert single.sizes == general.sizes == [len(general.buffer)]
    assert single.tag_codes == general.tag_codes
    assert single.keys == general.keys
    assert single.transaction_type == general.transaction_type
    assert single.store_timestamp_positions == general.store_timestamp_positions
    assert (single.topic, single.queue_id, single.queue_ids, single.delay_levels) == (
        general.topic, general.queue_id, general.queue_ids, general.delay_levels)


NOT_FOR_THE_SINGLE_ENCODER = {
    "an IPv6 born host": message(born_host="[::1]:5000"),
    "the schedule topic": StoreMessage(SCHEDULE_TOPIC, 2, b"b", {"DELAY": "3"}),
    "a half message": message(sysflag=TRANSACTION_PREPARED_TYPE),
    "a rollback record": message(sysflag=TRANSACTION_ROLLBACK_TYPE),
    "a property value that is not a string": StoreMessage("Orders", 0, b"b", {"N": 5}),  # type: ignore[dict-item]
    "a None property value": StoreMessage("Orders", 0, b"b", {"A": None, "B": "x"}),  # type: ignore[dict-item]
    "a bad topic": message("no spaces"),
    "a negative queue id": message(queue_id=-1),
    "a body over the limit": message(body=b"x" * 101),
    "a flag that is no int32": message(flag=2**40),
    "a record over the segment": message(body=b"x" * 90),
}


@pytest.mark.parametrize("case", list(NOT_FOR_THE_SINGLE_ENCODER))
def test_single_encoder_leaves_the_unusual_to_the_general_path(case):
    sent = NOT_FOR_THE_SINGLE_ENCODER[case]
    segment_size = 150 if case == "a record over the segment" else SEGMENT_SIZE
    assert encode_single(sent, ipv4_host_packed(STORE_HOST), NOW_MS, 100, segment_size,
                         True) is None


def test_an_ipv6_store_host_has_no_packed_form_for_the_single_encoder():
    assert ipv4_host_packed("[::1]:10911") is None
    assert ipv4_host_packed("not an address") is None
    assert ipv4_host_packed(STORE_HOST) == (bytes([10, 1, 2, 3]), 10911)


def test_a_lone_send_is_stored_without_the_batch_encoder(store, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a plain lone send went through encode_messages")

    monkeypatch.setattr(store_core, "encode_messages", refuse)
    first = store.put_message(message(tags="a", unique_key="0A" * 16))
    [second] = store.put_message_group([message(keys="k-2", unique_key="0B" * 16)])

    assert first.status is second.status is PutStatus.PUT_OK
    assert (first.queue_offset, second.queue_offset) == (0, 1)
    assert second.physical_offset == first.physical_offset + first.wrote_bytes
    records = decode_records(store.get_messages("Orders", 0, 0, 10, ALL_BYTES).body)
    assert [record.queue_offset for record in records] == [0, 1]
    assert [record.physical_offset for record in records] == [
        first.physical_offset, second.physical_offset]
    for result in (first, second):
        assert result.message_count == 1
        assert type(result.msg_ids) is list  # what the send answer's fast path takes as is
        assert list(result.msg_ids) == [store_core._offset_msg_ids(
            store._msg_id_prefix, [result.physical_offset])[0]]
        assert decode_offset_msg_id(result.msg_ids[0])[1] == result.physical_offset
    found = store.query_messages("Orders", "0A" * 16, 10, 0, 2**62)
    assert [decode_records(r)[0].physical_offset for r in found.records] == [
        first.physical_offset]
    found = store.query_messages("Orders", "k-2", 10, 0, 2**62)
    assert [decode_records(r)[0].physical_offset for r in found.records] == [
        second.physical_offset]


def test_lone_sends_store_what_the_general_path_stores(tmp_path):
    # The same sends, one store through the lone-send path, the other through the general
    # one: the same commit-log bytes (store times aside), queues, index and answers, across
    # segment rolls (64 KiB segments, 100-entry queue segments).
    fast = FileMessageStore(small_config(tmp_path / "fast"))
    general = FileMessageStore(small_config(tmp_path / "general"))
    try:
        sends = [
            message("Orders" if n % 3 else "Payments", n % 4, bytes([n % 251]) * (50 + n * 7),
                    tags=f"t{n % 5}", keys=f"k-{n}" if n % 2 else None, unique_key=f"{n:032X}",
                    sysflag=TRANSACTION_COMMIT_TYPE if n % 7 == 0 else 0)
            for n in range(300)
        ]
        for sent in sends:
            got = fast.put_message(sent)
            want = general._put((sent,))
            assert (got.status, got.physical_offset, got.queue_offset, got.wrote_bytes,
                    list(got.msg_ids), got.message_count) == (
                want.status, want.physical_offset, want.queue_offset, want.wrote_bytes,
                list(want.msg_ids), want.message_count)
        assert fast.commit_log_max_offset() == general.commit_log_max_offset()
        assert fast.commit_log_max_offset() > 3 * SEGMENT_SIZE  # rolled
        for topic in ("Orders", "Payments"):
            for queue_id in range(4):
                assert fast.consume_queue_entries(topic, queue_id, 0, 200) == (
                    general.consume_queue_entries(topic, queue_id, 0, 200))
                got = fast.get_messages(topic, queue_id, 0, 200, ALL_BYTES).body
                want = general.get_messages(topic, queue_id, 0, 200, ALL_BYTES).body
                assert _without_store_times(got) == _without_store_times(want)
        for n in (1, 99, 299):
            for key in (f"{n:032X}", f"k-{n}"):
                got = fast.query_messages(sends[n].topic, key, 10, 0, 2**62).records
                want = general.query_messages(sends[n].topic, key, 10, 0, 2**62).records
                assert [_without_store_times(r) for r in got] == [
                    _without_store_times(r) for r in want]
                assert len(got) == 1
    finally:
        fast.close()
        general.close()


def _without_store_times(records: bytes) -> bytes:
    masked = bytearray(records)
    position = 0
    while position < len(masked):
        size = int.from_bytes(masked[position:position + 4], "big")
        masked[position + STORE_TIMESTAMP.start:position + STORE_TIMESTAMP.stop] = bytes(8)
        assert int.from_bytes(
            masked[position + POSITION_QUEUE_OFFSET:position + POSITION_QUEUE_OFFSET + 8],
            "big") >= 0
        position += size
    return bytes(masked)


def test_a_lone_send_refused_by_a_limit_is_named_as_before(store):
    result = store.put_message(message(body=b"x" * (store.config.max_message_size + 1)))
    assert result.status is PutStatus.MESSAGE_ILLEGAL
    assert "max_message_size" in result.remark
    assert store.commit_log_max_offset() == 0
    half = store.put_message(message(sysflag=TRANSACTION_PREPARED_TYPE, unique_key="0C" * 16))
    assert half.status is PutStatus.PUT_OK
    assert half.queue_offset == 0  # a half record takes no queue offset
    assert store.max_offset("Orders", 0) == 0

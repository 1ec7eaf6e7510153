"""Pulled records: a MessageExt in all a caller sees, seldom read fields made on first use."""

import dataclasses
import pickle
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import RemoteProtocolError
from tidemq.protocol import crc, pulled_records
from tidemq.protocol.message import (
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_ZLIB,
    MessageExt,
    decode_records,
    encode_record,
)
from tidemq.protocol.pulled_records import (
    SAME_SIZE_RECORDS_MIN,
    PulledMessageExt,
    _decode_same_size,
    decode_pulled_records,
)

# The consumer's CRC check runs with protocol/crc.py's crc32 (ISA-L's when installed): the
# damaged-record tests run with it and with zlib's forced, which must agree.
crc32_implementations = pytest.mark.parametrize(
    "crc32", [zlib.crc32, crc.crc32], ids=["zlib", "configured"])


@pytest.fixture
def with_crc32(monkeypatch, crc32):
    monkeypatch.setattr(pulled_records, "body_crc32", crc32)


PROPERTIES = "KEYS\x01order-1 order-2\x02TAGS\x01paid\x02UNIQ_KEY\x017F0000010001\x02CLUSTER\x01C"


def stored(queue_offset: int, properties: str = PROPERTIES) -> bytes:
    return bytes(encode_record(topic=b"Orders", body=b"body-%d" % queue_offset,
                               properties=properties.encode(), queue_id=3,
                               queue_offset=queue_offset, born_timestamp=1_700_000_000_000,
                               born_host=(b"\x0a\x00\x00\x07", 50000)))


def test_pulled_records_equal_the_eagerly_decoded_ones():
    body = stored(7) + stored(8, "") + stored(9, "A\x01b\x02broken\x02\x01x")
    pulled = decode_pulled_records(body)
    eager = decode_records(body)
    assert all(type(m) is PulledMessageExt for m in pulled)
    assert pulled == eager
    assert eager == pulled  # both ways round
    assert [m.properties for m in pulled] == [
        {"KEYS": "order-1 order-2", "TAGS": "paid", "UNIQ_KEY": "7F0000010001", "CLUSTER": "C"},
        {},
        {"A": "b"},
    ]
    first = pulled[0]
    assert (first.tags, first.keys, first.msg_id) == ("paid", ["order-1", "order-2"],
                                                      "7F0000010001")
    assert first.born_host == "10.0.0.7:50000"
    assert isinstance(first, MessageExt)


def test_properties_are_parsed_once_and_changes_stick():
    message = decode_pulled_records(stored(1))[0]
    properties = message.properties
    assert message.properties is properties  # kept after the first read
    message.properties["TAGS"] = "refunded"
    assert message.tags == "refunded"
    message.properties = {"X": "1"}
    assert message.properties == {"X": "1"}


def test_a_pulled_message_pickles_and_shows_like_a_message_ext():
    message = decode_pulled_records(stored(2))[0]
    again = pickle.loads(pickle.dumps(message))
    assert again == message
    assert again.properties["TAGS"] == "paid"
    assert "properties={'KEYS': 'order-1 order-2'" in repr(message)
    assert message != decode_pulled_records(stored(3))[0]


def test_seldom_read_fields_are_made_on_first_read_and_assignments_stick():
    message = decode_pulled_records(stored(4), "broker-b")[0]
    eager = decode_records(stored(4))[0]
    with pytest.raises(AttributeError):  # not made yet: its slot is still empty
        MessageExt.__dict__["store_host"].__get__(message)
    assert (message.topic, message.queue_id, message.queue_offset, message.broker_name) == (
        "Orders", 3, 4, "broker-b")
    for name in ("flag", "physical_offset", "sysflag", "born_timestamp", "born_host",
                 "store_timestamp", "store_host", "reconsume_times",
                 "prepared_transaction_offset", "body_crc", "store_size"):
        assert getattr(message, name) == getattr(eager, name), name
    assert message.offset_msg_id == eager.offset_msg_id
    # A value assigned before the first read is the value read: nothing overwrites it.
    other = decode_pulled_records(stored(5))[0]
    other.reconsume_times = 9
    other.born_host = "10.0.0.9:1"
    other.properties = {"TAGS": "x"}
    assert (other.reconsume_times, other.born_host, other.tags) == (9, "10.0.0.9:1", "x")
    assert other.born_timestamp == 1_700_000_000_000
    with pytest.raises(AttributeError, match="no_such_field"):
        other.no_such_field  # noqa: B018


def test_fixed_part_fields_read_before_and_after_assignments_and_a_pickle():
    # The fixed part's fields are read from the record's bytes until something unpacks it
    # (an assignment, a host read); every order of reads and writes gives the same values.
    eager = decode_records(stored(6))[0]
    message = decode_pulled_records(stored(6))[0]
    assert message.store_timestamp == eager.store_timestamp  # from the bytes
    assert message.born_timestamp == 1_700_000_000_000
    message.store_timestamp = 5  # unpacks the fixed part, then replaces one value
    assert (message.store_timestamp, message.born_timestamp) == (5, 1_700_000_000_000)
    assert message.born_host == "10.0.0.7:50000"
    assert message.store_timestamp == 5
    again = pickle.loads(pickle.dumps(message))
    assert again == message and again.store_timestamp == 5
    assert again.physical_offset == eager.physical_offset
    assert message != eager  # the assigned store timestamp differs
    message.store_timestamp = eager.store_timestamp
    assert message == eager
    changed = dataclasses.replace(message, queue_id=9, store_timestamp=7)  # the constructor
    assert type(changed) is PulledMessageExt
    assert (changed.queue_id, changed.store_timestamp, changed.born_timestamp) == (
        9, 7, 1_700_000_000_000)
    assert changed.properties == message.properties and changed.body == message.body
    hosts_first = decode_pulled_records(stored(6))[0]
    assert hosts_first.store_host == eager.store_host  # the fixed part unpacked here
    assert hosts_first.sysflag == eager.sysflag and hosts_first.flag == eager.flag


def test_a_pull_of_several_topics_names_each_record_s_topic():
    def record(topic: bytes, offset: int) -> bytes:
        return bytes(encode_record(topic=topic, body=b"b", properties=b"", queue_id=0,
                                   queue_offset=offset))

    body = record(b"A", 0) + record(b"A", 1) + record(b"AB", 2) + record(b"B", 3) + record(
        b"A", 4)
    assert [m.topic for m in decode_pulled_records(body)] == ["A", "A", "AB", "B", "A"]


@crc32_implementations
def test_damaged_and_compressed_records_in_the_same_pass(with_crc32):
    compressed_body = zlib.compress(b"inflated " * 20)
    compressed = bytes(encode_record(topic=b"Orders", body=compressed_body, properties=b"",
                                     queue_id=3, queue_offset=11,
                                     sysflag=SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_ZLIB))
    bad = bytearray(stored(12))
    bad[88] ^= 0x01  # the body's first byte
    damaged: list[MessageExt] = []
    messages = decode_pulled_records(stored(10) + compressed + bytes(bad), "b",
                                     damaged=damaged, decompress=True)
    assert [m.queue_offset for m in messages] == [10, 11]
    assert messages[1].body == b"inflated " * 20
    assert messages[1].sysflag & (SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_ZLIB) == 0
    assert [m.queue_offset for m in damaged] == [12]
    # Without ``damaged`` nothing is checked; without ``decompress`` nothing is inflated.
    as_stored = decode_pulled_records(compressed + bytes(bad))
    assert as_stored[0].body == compressed_body and len(as_stored) == 2


def test_a_body_flagged_compressed_that_does_not_inflate_is_left_out_not_fatal():
    # A flipped SYSFLAG bit (no checksum covers it) makes a plain body "compressed": with the
    # damaged list it is left out and the records after it still decode; a seeded bit-flip run
    # lost every later message of the queue when this raised for the whole pull.
    flagged = bytes(encode_record(topic=b"Orders", body=b"plain, not zlib", properties=b"",
                                  queue_id=3, queue_offset=11, sysflag=SYSFLAG_COMPRESSED))
    body = stored(10) + flagged + stored(12)
    damaged: list[MessageExt] = []
    messages = decode_pulled_records(body, "b", damaged=damaged, decompress=True)
    assert [m.queue_offset for m in messages] == [10, 12]
    assert [m.queue_offset for m in damaged] == [11]
    with pytest.raises(RemoteProtocolError, match="does not decompress"):
        decode_pulled_records(body, "b", decompress=True)


# -- records of one size: the column pass (module docstring) ----------------------------------


def same_size(queue_offset: int, *, topic: bytes = b"Orders", body: bytes | None = None,
              properties: str = PROPERTIES, sysflag: int = 0) -> bytes:
    """A record whose size does not depend on ``queue_offset`` (a 6-byte body by default)."""
    return bytes(encode_record(topic=topic, body=body if body is not None else b"b-%04d" % (
        queue_offset % 10_000), properties=properties.encode(), queue_id=3,
        queue_offset=queue_offset, physical_offset=1_000 + queue_offset,
        born_timestamp=1_700_000_000_000 + queue_offset, sysflag=sysflag,
        born_host=(b"\x0a\x00\x00\x07", 50000)))


def test_a_body_of_one_size_decodes_like_record_by_record():
    body = b"".join(same_size(offset) for offset in range(40, 72))
    assert _decode_same_size(body, "", []) is not None  # the column pass takes it
    assert decode_pulled_records(body, damaged=[]) == decode_records(body)
    pulled = decode_pulled_records(body, "broker-b", damaged=[])
    assert all(type(m) is PulledMessageExt for m in pulled)
    assert [m.queue_offset for m in pulled] == list(range(40, 72))
    assert {m.broker_name for m in pulled} == {"broker-b"}
    assert pulled[5].body == b"b-0045" and pulled[5].properties["TAGS"] == "paid"
    assert pulled[5].born_timestamp == 1_700_000_000_045
    assert pulled[5].physical_offset == 1_045
    assert pulled[0].topic is pulled[-1].topic  # one topic string for the pull


def test_a_short_answer_of_one_size_is_decoded_record_by_record():
    # Below SAME_SIZE_RECORDS_MIN records the column pass's set-up costs more than it saves.
    short = b"".join(same_size(offset) for offset in range(SAME_SIZE_RECORDS_MIN - 1))
    assert _decode_same_size(short, "", []) is None
    assert decode_pulled_records(short, damaged=[]) == decode_records(short)
    enough = b"".join(same_size(offset) for offset in range(SAME_SIZE_RECORDS_MIN))
    assert _decode_same_size(enough, "", []) is not None


@crc32_implementations
def test_one_size_records_with_a_damaged_body_set_it_aside_and_keep_the_order(with_crc32):
    records = [bytearray(same_size(offset)) for offset in range(10)]
    records[3][90] ^= 0x40
    records[7][88] ^= 0x01
    damaged: list[MessageExt] = []
    messages = decode_pulled_records(b"".join(records), "b", damaged=damaged)
    assert [m.queue_offset for m in messages] == [0, 1, 2, 4, 5, 6, 8, 9]
    assert [m.queue_offset for m in damaged] == [3, 7]
    # Without ``damaged`` (check_crcs off) nothing is checked.
    assert len(decode_pulled_records(b"".join(records))) == 10


@pytest.mark.parametrize("odd_one", [
    same_size(5, topic=b"Orderz"),  # same size, another topic
    same_size(5, body=b"b-00055", properties=PROPERTIES[:-1]),  # same size, other lengths
    same_size(5, sysflag=0x4),  # another SYSFLAG (a transaction bit)
])
def test_a_record_of_the_same_size_but_another_layout_is_decoded_by_its_own_fields(odd_one):
    records = [same_size(offset) for offset in range(10)]
    assert len(odd_one) == len(records[0])
    records[5] = odd_one
    body = b"".join(records)
    assert _decode_same_size(body, "", []) is None  # left to the record-by-record pass
    pulled = decode_pulled_records(body, damaged=[])
    assert pulled == decode_records(body)
    assert (pulled[5].topic, pulled[5].body, pulled[5].sysflag) == (
        decode_records(odd_one)[0].topic, decode_records(odd_one)[0].body,
        decode_records(odd_one)[0].sysflag)


def test_compressed_records_of_one_size_are_inflated():
    compressed = zlib.compress(b"inflated " * 20)
    body = b"".join(same_size(offset, body=compressed,
                              sysflag=SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_ZLIB)
                    for offset in range(4))
    messages = decode_pulled_records(body, damaged=[], decompress=True)
    assert [m.body for m in messages] == [b"inflated " * 20] * 4


def test_a_torn_last_record_of_one_size_is_still_an_error():
    body = b"".join(same_size(offset) for offset in range(4))
    with pytest.raises(RemoteProtocolError):
        decode_pulled_records(body[:-1], damaged=[])


@given(st.lists(st.sampled_from([0, 1, 2]), min_size=1, max_size=12), st.data())
def test_any_mix_of_layouts_decodes_like_record_by_record(kinds, data):
    layouts = [
        lambda offset: same_size(offset),
        lambda offset: same_size(offset, topic=b"Orderz"),
        lambda offset: same_size(offset, body=b"longer body %d" % offset, properties=""),
    ]
    records = [bytearray(layouts[kind](offset)) for offset, kind in enumerate(kinds)]
    damaged_at = data.draw(st.sets(st.integers(0, len(records) - 1)))
    for index in damaged_at:
        records[index][88] ^= 0x20
    damaged: list[MessageExt] = []
    body = b"".join(records)
    pulled = decode_pulled_records(body, damaged=damaged)
    eager = decode_records(body)
    assert pulled == [m for i, m in enumerate(eager) if i not in damaged_at]
    assert damaged == [m for i, m in enumerate(eager) if i in damaged_at]


def test_the_column_pass_is_tried_only_for_enough_bytes_of_the_first_record_s_size(
        monkeypatch):
    tried = []
    column_pass = pulled_records._decode_same_size

    def spy(source, broker_name, damaged):
        tried.append(len(source))
        return column_pass(source, broker_name, damaged)

    monkeypatch.setattr(pulled_records, "_decode_same_size", spy)
    short = b"".join(same_size(offset) for offset in range(SAME_SIZE_RECORDS_MIN - 1))
    assert decode_pulled_records(short, damaged=[]) == decode_records(short)
    assert tried == []  # fewer records than the pass needs: not even tried
    enough = b"".join(same_size(offset) for offset in range(SAME_SIZE_RECORDS_MIN))
    assert decode_pulled_records(enough, damaged=[]) == decode_records(enough)
    assert tried == [len(enough)]


def test_topic_names_are_kept_by_their_bytes_and_the_table_stays_bounded(monkeypatch):
    monkeypatch.setattr(pulled_records, "_TOPIC_NAMES", {})
    monkeypatch.setattr(pulled_records, "TOPIC_NAMES_MAX", 4)

    def record(topic: bytes, offset: int) -> bytes:
        return bytes(encode_record(topic=topic, body=b"b", properties=b"", queue_id=0,
                                   queue_offset=offset))

    topics = [b"T%d" % number for number in range(10)] + [b"T1", "Tö".encode()]
    for offset, topic in enumerate(topics):
        (message,) = decode_pulled_records(record(topic, offset))
        assert message.topic == topic.decode()
        assert len(pulled_records._TOPIC_NAMES) <= 4
    first = decode_pulled_records(record(b"Same", 0))[0]
    again = decode_pulled_records(record(b"Same", 1))[0]
    assert first.topic == "Same" and again.topic is first.topic  # one string across answers

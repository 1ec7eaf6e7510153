"""Pulled records: a MessageExt in all a caller sees, seldom read fields made on first use."""

import pickle
import zlib

import pytest

from tidemq.errors import RemoteProtocolError
from tidemq.protocol.message import (
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_ZLIB,
    MessageExt,
    decode_records,
    encode_record,
)
from tidemq.protocol.pulled_records import PulledMessageExt, decode_pulled_records

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


def test_a_pull_of_several_topics_names_each_record_s_topic():
    def record(topic: bytes, offset: int) -> bytes:
        return bytes(encode_record(topic=topic, body=b"b", properties=b"", queue_id=0,
                                   queue_offset=offset))

    body = record(b"A", 0) + record(b"A", 1) + record(b"AB", 2) + record(b"B", 3) + record(
        b"A", 4)
    assert [m.topic for m in decode_pulled_records(body)] == ["A", "A", "AB", "B", "A"]


def test_damaged_and_compressed_records_in_the_same_pass():
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

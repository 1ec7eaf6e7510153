"""Pulled records: a MessageExt in all a caller sees, with properties parsed on first use."""

import pickle

from tidemq.protocol.message import MessageExt, decode_records, encode_record
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

"""The client checks each received body against its stored CRC (Kafka's check.crcs).

A damaged message is left out of what the application gets and logged as an ERROR that
names it; every other message of the same pull is delivered. ``check_crc=False`` turns the
check off (the damaged body is then delivered as it came).
"""

from __future__ import annotations

import logging

from tidemq.client.broker_api import decode_messages
from tidemq.protocol.message import decode_record, encode_record


def stored(index: int, *, damaged: bool = False) -> bytearray:
    body = f"message {index}".encode()
    record = encode_record(
        topic=b"Orders", body=body, properties=b"", queue_id=2, queue_offset=index,
        physical_offset=1000 * index,
    )
    if damaged:
        body_at = len(record) - len(b"Orders") - 1 - 2 - len(body)
        record[body_at] ^= 0x04  # one flipped bit in the body
        assert decode_record(record).body != body
    return record


def test_a_body_that_fails_its_crc_is_left_out_and_named(caplog):
    pull_body = bytes(stored(0) + stored(1, damaged=True) + stored(2))
    caplog.set_level(logging.ERROR, logger="tidemq.client.broker_api")
    messages = decode_messages(pull_body, "broker-a")
    assert [m.body for m in messages] == [b"message 0", b"message 2"]
    damaged = decode_record(stored(1, damaged=True))
    assert damaged.offset_msg_id in caplog.text
    assert "Orders queue 2 at queue offset 1 is damaged" in caplog.text


def test_the_check_can_be_turned_off():
    pull_body = bytes(stored(0) + stored(1, damaged=True))
    messages = decode_messages(pull_body, check_crc=False)
    assert len(messages) == 2 and messages[1].body != b"message 1"


def test_intact_messages_pass_untouched(caplog):
    pull_body = bytes(stored(0) + stored(1))
    caplog.set_level(logging.ERROR)
    assert [m.body for m in decode_messages(pull_body)] == [b"message 0", b"message 1"]
    assert caplog.text == ""

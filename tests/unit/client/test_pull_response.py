"""A PULL_MESSAGE answer read into a PullResult: its header's numbers, its records, its filter."""

from __future__ import annotations

import logging

import pytest

from tidemq.client.broker_api import decode_pull_response
from tidemq.client.errors import BrokerRejected
from tidemq.client.message import MessageQueue, PullStatus
from tidemq.client.subscription import parse_subscription
from tidemq.errors import RemoteProtocolError
from tidemq.protocol.command import FLAG_RESPONSE, RemotingCommand
from tidemq.protocol.message import encode_record

QUEUE = MessageQueue("Orders", "broker-a", 2)
HEADER = {"suggestWhichBrokerId": "1", "nextBeginOffset": "1046", "minOffset": "7",
          "maxOffset": "2000"}


def answer(fields: dict[str, str] | None, body: bytes | None = None,
           code: int = 0) -> RemotingCommand:
    return RemotingCommand(code, 1, FLAG_RESPONSE, None, fields, body)


def stored(offset: int, tags: str) -> bytes:
    return bytes(encode_record(topic=b"Orders", body=b"m%d" % offset,
                               properties=f"TAGS\x01{tags}\x02".encode(), queue_id=2,
                               queue_offset=offset))


def test_the_header_s_numbers_and_the_records_are_read():
    body = stored(1044, "paid") + stored(1045, "new")
    result = decode_pull_response(answer(HEADER, body), QUEUE, None)
    assert (result.status, result.next_begin_offset, result.min_offset, result.max_offset,
            result.suggest_which_broker_id) == (PullStatus.FOUND, 1046, 7, 2000, 1)
    assert [m.queue_offset for m in result.messages] == [1044, 1045]
    assert {m.broker_name for m in result.messages} == {"broker-a"}
    assert result.body_size == len(body) and result.messages_filtered == 0


def test_a_tag_subscription_keeps_its_tags_and_counts_the_rest():
    body = stored(1044, "paid") + stored(1045, "new")
    result = decode_pull_response(answer(HEADER, body), QUEUE,
                                  parse_subscription("Orders", "paid", "TAG"))
    assert [m.queue_offset for m in result.messages] == [1044]
    assert result.messages_filtered == 1


def test_numbers_in_other_texts_are_read_by_the_typed_header():
    result = decode_pull_response(
        answer({**HEADER, "minOffset": "-1", "maxOffset": "+2000"}, code=19), QUEUE, None)
    assert (result.status, result.min_offset, result.max_offset, result.messages) == (
        PullStatus.NO_NEW_MSG, -1, 2000, [])


@pytest.mark.parametrize(("fields", "named"), [
    ({k: v for k, v in HEADER.items() if k != "maxOffset"}, "maxOffset"),
    ({**HEADER, "nextBeginOffset": "12x"}, "'12x'"),
    (None, "suggestWhichBrokerId"),
])
def test_a_bad_header_is_an_error_naming_the_field_and_the_broker(fields, named):
    with pytest.raises(RemoteProtocolError) as error:
        decode_pull_response(answer(fields), QUEUE, None, "10.0.0.9:10911")
    assert "pull response from 10.0.0.9:10911" in str(error.value)
    assert named in str(error.value)


def test_an_error_code_is_rejected_before_the_header_is_read():
    with pytest.raises(BrokerRejected):
        decode_pull_response(answer(None, code=1), QUEUE, None)


def test_a_damaged_record_is_left_out_of_the_answer_and_named(caplog):
    damaged = bytearray(stored(1045, "paid"))
    damaged[88] ^= 0x04  # the body's first byte (after the 88-byte fixed part)
    body = stored(1044, "paid") + bytes(damaged) + stored(1046, "paid")
    caplog.set_level(logging.ERROR, logger="tidemq.client.broker_api")
    result = decode_pull_response(answer(HEADER, body), QUEUE, None)
    assert [m.queue_offset for m in result.messages] == [1044, 1046]
    assert "Orders queue 2 at queue offset 1045 is damaged" in caplog.text
    unchecked = decode_pull_response(answer(HEADER, body), QUEUE, None, check_crc=False)
    assert [m.queue_offset for m in unchecked.messages] == [1044, 1045, 1046]

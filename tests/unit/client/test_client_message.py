"""Building messages and the checks they must pass before anything is sent."""

from __future__ import annotations

import pytest

from tidemq.client.errors import InvalidMessage
from tidemq.client.message import (
    Message,
    MessageQueue,
    SendResult,
    SendStatus,
    check_properties_size,
    validate_message,
)
from tidemq.errors import InvalidTopicName, MessageTooLarge
from tidemq.protocol.message import decode_properties, encode_properties


def test_message_holds_tags_keys_delay_and_user_properties_as_rocketmq_properties():
    message = Message("Orders", "héllo", tags="paid", keys=["o-42", "u-7"],
                      properties={"region": "eu"}, flag=3, delay_level=2)
    assert message.body == "héllo".encode()
    assert message.flag == 3
    assert message.properties == {"region": "eu", "TAGS": "paid", "KEYS": "o-42 u-7",
                                  "DELAY": "2"}
    assert message.tags == "paid"
    assert message.keys == ["o-42", "u-7"]
    assert message.delay_level == 2
    # the properties survive RocketMQ's properties string both ways
    assert decode_properties(encode_properties(message.properties)) == message.properties


def test_message_helpers_set_and_clear_properties():
    message = Message("T", b"x", keys="single")
    assert message.keys == ["single"]
    message.tags = "t1"
    message.keys = None
    message.delay_level = 0
    assert message.properties == {"TAGS": "t1"}
    message.tags = None
    assert message.properties == {}


def test_wait_store_msg_ok_false_travels_as_a_property():
    assert Message("T", b"x", wait_store_msg_ok=False).properties == {"WAIT": "false"}
    assert "WAIT" not in Message("T", b"x").properties


def test_negative_delay_level_is_refused():
    with pytest.raises(InvalidMessage, match="delay_level -1"):
        Message("T", b"x", delay_level=-1)


def test_valid_message_passes():
    validate_message(Message("Orders_1-x", b"x"))


@pytest.mark.parametrize("topic", ["", "bad topic", "t" * 128, "a/b"])
def test_bad_topic_names_are_refused(topic):
    with pytest.raises(InvalidTopicName):
        validate_message(Message(topic, b"x"))


def test_empty_body_is_refused():
    with pytest.raises(InvalidMessage, match="empty body"):
        validate_message(Message("T", b""))


def test_body_over_the_limit_is_refused_naming_size_and_setting():
    with pytest.raises(MessageTooLarge, match=r"1025 bytes.*max_message_size=1024"):
        validate_message(Message("T", b"x" * 1025), max_message_size=1024)
    validate_message(Message("T", b"x" * 1024), max_message_size=1024)


def test_properties_over_32767_bytes_are_refused():
    check_properties_size("T", "é" * 16383)  # 32766 bytes
    with pytest.raises(MessageTooLarge, match="32768 bytes"):
        check_properties_size("T", "é" * 16384)


def test_message_queues_order_by_topic_broker_and_queue_id():
    queues = [MessageQueue("b", "x", 0), MessageQueue("a", "y", 1), MessageQueue("a", "y", 0),
              MessageQueue("a", "x", 5)]
    assert sorted(queues) == [MessageQueue("a", "x", 5), MessageQueue("a", "y", 0),
                              MessageQueue("a", "y", 1), MessageQueue("b", "x", 0)]
    queue = MessageQueue("T", "broker-a", 3)
    assert MessageQueue.from_json(queue.to_json()) == queue
    assert queue.to_json() == {"brokerName": "broker-a", "queueId": 3, "topic": "T"}
    assert {queue: 1}[MessageQueue("T", "broker-a", 3)] == 1


def test_batch_send_result_splits_ids_per_message():
    result = SendResult(SendStatus.SEND_OK, "K1,K2", "O1,O2", MessageQueue("T", "b", 0), 10)
    assert result.msg_ids == ["K1", "K2"]
    assert result.offset_msg_ids == ["O1", "O2"]


def test_a_send_result_made_by_its_setters_is_the_one_its_constructor_makes():
    from dataclasses import FrozenInstanceError

    from tidemq.client.message import new_send_result

    queue = MessageQueue("Orders", "broker-a", 3)
    values = (SendStatus.FLUSH_DISK_TIMEOUT, "K1", "O1", queue, 42, "eu", False, "tx-1")
    made = new_send_result(*values)
    built = SendResult(*values)
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    with pytest.raises(FrozenInstanceError):
        made.queue_offset = 43  # type: ignore[misc]

"""Delayed delivery and the dead-letter path on both brokers, and where they differ on
purpose (docs/differences.md: the delivered delay message's DELAY / DELAY_QUEUE_OFFSET, the
retry copy's ORIGIN_MESSAGE_ID, WAIT and DELAY)."""

from __future__ import annotations

import time

import pytest
import wire
from compare import assert_same, without_generated_unique_key

from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.message import decode_records
from tidemq.protocol.msgid import decode_offset_msg_id

pytestmark = pytest.mark.differential

SUCCESS_BOTH = (ResponseCode.SUCCESS, ResponseCode.SUCCESS)
DELIVERY_WAIT_S = 60.0


def view(message) -> dict:
    return {"topic": message.topic, "queue_id": message.queue_id, "body": message.body,
            "flag": message.flag, "sysflag": message.sysflag,
            "reconsume_times": message.reconsume_times, "properties": message.properties}


def test_delayed_message_is_delivered_to_its_topic_by_both(pair, unique):
    topic = unique("DiffDelay")
    assert pair.broker_call(lambda: wire.create_topic(topic, 2)).codes() == SUCCESS_BOTH
    sent = pair.broker_call(lambda: wire.send(topic, b"later", queue_id=1, keys="dk",
                                              properties={"DELAY": "1", "k": "v"}))
    assert sent.codes() == SUCCESS_BOTH
    # Both answer with the producer's queue and offset 0 of the schedule queue's real topic.
    assert sent.apache.ext_fields["queueId"] == sent.tidemq.ext_fields["queueId"] == "1"
    assert pair.broker_call(lambda: wire.heartbeat("diff_cg", [topic])).codes() == SUCCESS_BOTH
    deadline = time.monotonic() + DELIVERY_WAIT_S
    while True:
        pulled = pair.broker_call(lambda: wire.pull(topic, 1, 0))
        if pulled.codes() == SUCCESS_BOTH:
            break
        assert time.monotonic() < deadline, f"not delivered by both: {pulled.codes()}"
        time.sleep(0.2)
    apache, tidemq = (view(m) for m in (wire.messages(pulled.apache)[0],
                                        wire.messages(pulled.tidemq)[0]))
    tidemq["properties"] = without_generated_unique_key(apache["properties"],
                                                        tidemq["properties"])
    # Deliberate: Apache's delivered copy keeps DELAY and the sender's WAIT; tidemq's drops
    # DELAY and carries its crash-safe delivery mark instead.
    assert apache["properties"].pop("DELAY") == "1"
    apache["properties"].pop("WAIT", None)
    level, _, schedule_offset = tidemq["properties"].pop("DELAY_QUEUE_OFFSET").partition(":")
    assert level == "1" and schedule_offset.isdigit()
    assert_same(apache, tidemq, "delivered delay message")
    assert apache["properties"]["REAL_TOPIC"] == topic


def test_dead_lettered_copy_agrees(pair, unique):
    topic = unique("DiffDead")
    group = unique("cg_dead")
    assert pair.broker_call(lambda: wire.create_topic(topic, 1)).codes() == SUCCESS_BOTH
    sent = pair.broker_call(lambda: wire.send(topic, b"poison", keys="pk",
                                              properties={"UNIQ_KEY": "AB" * 16}))
    assert sent.codes() == SUCCESS_BOTH
    assert pair.broker_call(lambda: wire.heartbeat(group, [topic])).codes() == SUCCESS_BOTH

    def send_back(answer):
        offset = decode_offset_msg_id(answer.ext_fields["msgId"])[1]
        return lambda: wire.request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": str(offset), "group": group, "delayLevel": "-1",
            "originMsgId": "AB" * 16, "originTopic": topic, "unitMode": "false",
            "maxReconsumeTimes": "16"})

    apache_back = pair.call(pair.apache.broker_addr, send_back(sent.apache)())
    tidemq_back = pair.call(pair.tidemq_broker_addr, send_back(sent.tidemq)())
    assert (apache_back.code, tidemq_back.code) == SUCCESS_BOTH
    dlq = f"%DLQ%{group}"
    deadline = time.monotonic() + DELIVERY_WAIT_S
    while True:
        found = pair.broker_call(lambda: wire.request(RequestCode.QUERY_MESSAGE, {
            "topic": dlq, "key": "pk", "maxNum": "32", "beginTimestamp": "0",
            "endTimestamp": str(2**62)}))
        if found.codes() == SUCCESS_BOTH:
            break
        assert time.monotonic() < deadline, f"{dlq} not indexed by both: {found.codes()}"
        time.sleep(0.2)
    apache, tidemq = (view(decode_records(answer.body)[0])
                      for answer in (found.apache, found.tidemq))
    # Deliberate: Apache's copy says WAIT=false and DELAY=0 and names the first stored copy's
    # offset id as its origin; tidemq's keeps the id the consumer sent (its UNIQ_KEY).
    assert apache["properties"].pop("WAIT") == "false"
    assert apache["properties"].pop("DELAY") == "0"
    assert apache["properties"].pop("ORIGIN_MESSAGE_ID") == sent.apache.ext_fields["msgId"]
    assert tidemq["properties"].pop("ORIGIN_MESSAGE_ID") == "AB" * 16
    assert_same(apache, tidemq, "dead-lettered copy")
    assert apache["properties"]["RETRY_TOPIC"] == topic
    routes = pair.namesrv_call(lambda: wire.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                    {"topic": dlq}))
    assert routes.codes() == SUCCESS_BOTH
    # Both create the dead-letter topic readable and writable, with one queue.
    assert_same(jsonx.loads(routes.apache.body)["queueDatas"],
                jsonx.loads(routes.tidemq.body)["queueDatas"], f"route of {dlq}")

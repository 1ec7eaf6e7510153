"""Sends and pulls: the same raw requests to Apache's broker and to tidemq, answers compared.

What is compared is what a client can observe: response codes, the header fields a client
reads (queueId, queueOffset, the offset msg id's address, nextBeginOffset, minOffset,
maxOffset, suggestWhichBrokerId), and the stored messages (topic, queue, offsets, flag,
sysFlag, body, every property). Deliberate differences are in docs/differences.md.
"""

from __future__ import annotations

import pytest
import wire
from compare import assert_same, without_generated_unique_key

from tidemq.protocol.codes import RequestCode, ResponseCode, SerializeType
from tidemq.protocol.msgid import decode_offset_msg_id

pytestmark = pytest.mark.differential

MESSAGE_SIZE_MAX = 4 * 1024 * 1024  # both brokers' default maxMessageSize


def make_topic(pair, topic: str, queues: int = 4) -> None:
    answers = pair.broker_call(lambda: wire.create_topic(topic, queues))
    assert answers.codes() == (ResponseCode.SUCCESS, ResponseCode.SUCCESS)


def consume(pair, topic: str, group: str = "diff_cg") -> None:
    """Register ``group`` as a consumer of ``topic`` on both brokers (a pull needs it)."""
    answers = pair.broker_call(lambda: wire.heartbeat(group, [topic]))
    assert answers.codes() == (ResponseCode.SUCCESS, ResponseCode.SUCCESS)


def stored_view(message) -> dict:
    """What both brokers must agree on for one stored message."""
    return {"topic": message.topic, "queue_id": message.queue_id,
            "queue_offset": message.queue_offset, "flag": message.flag,
            "sysflag": message.sysflag, "body": message.body,
            "properties": message.properties, "reconsume_times": message.reconsume_times}


def assert_same_messages(pulled) -> list[dict]:
    """The FOUND pull's messages agree (less tidemq's deliberate UNIQ_KEY); Apache's views."""
    apache = [stored_view(m) for m in wire.messages(pulled.apache)]
    tidemq = [stored_view(m) for m in wire.messages(pulled.tidemq)]
    for apache_message, tidemq_message in zip(apache, tidemq, strict=False):
        tidemq_message["properties"] = without_generated_unique_key(
            apache_message["properties"], tidemq_message["properties"])
    assert_same(apache, tidemq, "pulled messages")
    return apache


def pull_fields(response) -> dict:
    fields = response.ext_fields or {}
    return {key: fields.get(key) for key in
            ("nextBeginOffset", "minOffset", "maxOffset", "suggestWhichBrokerId")}


@pytest.mark.parametrize("serialize_type", [SerializeType.JSON, SerializeType.ROCKETMQ])
@pytest.mark.parametrize("v2", [True, False], ids=["send_v2", "send_v1"])
def test_send_then_pull_agree(pair, unique, serialize_type, v2):
    topic = unique("DiffSend")
    make_topic(pair, topic)
    sends = []
    for i in range(3):
        answers = pair.broker_call(lambda i=i: wire.send(
            topic, f"body-{i}".encode(), queue_id=1, keys=f"k{i}",
            properties={"region": "eu", "n": str(i)}, v2=v2, serialize_type=serialize_type))
        sends.append(answers)
    for i, answers in enumerate(sends):
        assert answers.codes() == (ResponseCode.SUCCESS, ResponseCode.SUCCESS)
        apache, tidemq = answers.apache.ext_fields, answers.tidemq.ext_fields
        assert set(apache) <= set(tidemq), f"fields tidemq lacks: {set(apache) - set(tidemq)}"
        assert (apache["queueId"], apache["queueOffset"]) == ("1", str(i))
        assert (tidemq["queueId"], tidemq["queueOffset"]) == ("1", str(i))
        assert decode_offset_msg_id(apache["msgId"])[0] == pair.apache.broker_addr
        assert decode_offset_msg_id(tidemq["msgId"])[0] == pair.tidemq_broker_addr
        assert answers.tidemq.serialize_type == answers.apache.serialize_type == serialize_type
    consume(pair, topic)
    pair.wait_dispatched(topic, 1, 3)
    pulled = pair.broker_call(lambda: wire.pull(topic, 1, 0, serialize_type=serialize_type))
    assert pulled.codes() == (ResponseCode.SUCCESS, ResponseCode.SUCCESS)
    assert_same(pull_fields(pulled.apache), pull_fields(pulled.tidemq), "pull header fields")
    assert len(assert_same_messages(pulled)) == 3


@pytest.mark.parametrize(("offset_name", "expected_code"), [
    ("min", ResponseCode.SUCCESS),
    ("last", ResponseCode.SUCCESS),
    ("max", ResponseCode.PULL_NOT_FOUND),
    ("past_max", ResponseCode.PULL_OFFSET_MOVED),
    ("far_past_max", ResponseCode.PULL_OFFSET_MOVED),
    ("negative", ResponseCode.PULL_OFFSET_MOVED),
])
def test_pull_at_boundaries_agrees(pair, unique, offset_name, expected_code):
    topic = unique("DiffPullEdge")
    make_topic(pair, topic, 2)
    for i in range(5):
        pair.broker_call(lambda i=i: wire.send(topic, f"m{i}".encode(), queue_id=0))
    offset = {"min": 0, "last": 4, "max": 5, "past_max": 6, "far_past_max": 1000,
              "negative": -1}[offset_name]
    consume(pair, topic)
    pair.wait_dispatched(topic, 0, 5)
    answers = pair.broker_call(lambda: wire.pull(topic, 0, offset))
    assert answers.apache.code == expected_code, answers.apache.describe()
    assert answers.tidemq.code == answers.apache.code, (
        f"{answers.apache.describe()}\n{answers.tidemq.describe()}")
    assert_same(pull_fields(answers.apache), pull_fields(answers.tidemq), "pull header fields")
    if expected_code == ResponseCode.SUCCESS:
        assert_same_messages(answers)


def test_pull_from_an_empty_queue_and_an_unknown_topic_agree(pair, unique):
    topic = unique("DiffPullEmpty")
    make_topic(pair, topic, 2)
    consume(pair, topic)
    empty = pair.broker_call(lambda: wire.pull(topic, 1, 0))
    assert empty.tidemq.code == empty.apache.code
    assert_same(pull_fields(empty.apache), pull_fields(empty.tidemq), "pull header fields")
    missing = unique("DiffNoSuchTopic")
    unknown = pair.broker_call(lambda: wire.pull(missing, 0, 0))
    assert unknown.tidemq.code == unknown.apache.code == ResponseCode.TOPIC_NOT_EXIST
    beyond = pair.broker_call(lambda: wire.pull(topic, 7, 0))
    assert beyond.tidemq.code == beyond.apache.code, (
        f"{beyond.apache.describe()}\n{beyond.tidemq.describe()}")


@pytest.mark.parametrize("size_name", ["empty", "4MiB_less_1KiB", "4MiB", "4MiB_plus_1"])
def test_body_size_limits_agree(pair, unique, size_name):
    topic = unique("DiffSize")
    make_topic(pair, topic, 1)
    size = {"empty": 0, "4MiB_less_1KiB": MESSAGE_SIZE_MAX - 1024, "4MiB": MESSAGE_SIZE_MAX,
            "4MiB_plus_1": MESSAGE_SIZE_MAX + 1}[size_name]
    answers = pair.broker_call(lambda: wire.send(topic, b"x" * size))
    assert answers.tidemq.code == answers.apache.code, (
        f"{answers.apache.describe()}\n{answers.tidemq.describe()}")
    if answers.apache.code == ResponseCode.SUCCESS:
        consume(pair, topic)
        pair.wait_dispatched(topic, 0, 1)
        pulled = pair.broker_call(lambda: wire.pull(topic, 0, 0, max_msgs=1))
        assert len(assert_same_messages(pulled)) == 1


@pytest.mark.parametrize("topic", [
    "bad topic!", "a" * 128, "TBW102", "", "%RETRY%", "DefaultCluster", "tab\tname",
])
def test_illegal_topic_names_agree(pair, topic):
    sent = pair.broker_call(lambda: wire.send(topic, b"x"))
    created = pair.broker_call(lambda: wire.create_topic(topic, 1))
    assert (sent.tidemq.code, created.tidemq.code) == (sent.apache.code, created.apache.code), (
        f"send: {sent.apache.describe()}\n{sent.tidemq.describe()}\n"
        f"create: {created.apache.describe()}\n{created.tidemq.describe()}")


def test_unknown_request_code_agrees(pair):
    answers = pair.broker_call(lambda: wire.request(9999, {"a": "b"}))
    assert answers.codes() == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED,) * 2
    assert "9999" in answers.apache.remark and "9999" in answers.tidemq.remark

def test_pull_without_a_consumer_heartbeat_agrees(pair, unique):
    topic = unique("DiffNoHeartbeat")
    make_topic(pair, topic, 1)
    # Without FLAG_SUBSCRIPTION the broker looks the subscription up in the group's heartbeat.
    answers = pair.broker_call(lambda: wire.pull(topic, 0, 0, group=unique("cg_silent"),
                                                 sys_flag=0))
    assert answers.codes() == (ResponseCode.SUBSCRIPTION_NOT_EXIST,) * 2


def test_queue_offsets_and_search_agree(pair, unique):
    topic = unique("DiffOffsets")
    make_topic(pair, topic, 1)
    for i in range(4):
        pair.broker_call(lambda i=i: wire.send(topic, f"o{i}".encode()))
    pair.wait_dispatched(topic, 0, 4)
    for code in (RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET):
        answers = pair.broker_call(lambda code=code: wire.queue_request(code, topic))
        assert answers.codes() == (ResponseCode.SUCCESS, ResponseCode.SUCCESS)
        assert_same(answers.apache.ext_fields, answers.tidemq.ext_fields, code.name)
    for timestamp in ("0", "9999999999999"):
        answers = pair.broker_call(lambda t=timestamp: wire.queue_request(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic, timestamp=t))
        assert answers.codes() == (ResponseCode.SUCCESS, ResponseCode.SUCCESS)
        assert_same(answers.apache.ext_fields, answers.tidemq.ext_fields, f"search {timestamp}")
    answers = pair.broker_call(lambda: wire.queue_request(
        RequestCode.GET_EARLIEST_MSG_STORETIME, topic))
    assert answers.codes() == (ResponseCode.SUCCESS, ResponseCode.SUCCESS)
    assert set(answers.tidemq.ext_fields) == set(answers.apache.ext_fields)
    missing = pair.broker_call(lambda: wire.queue_request(RequestCode.GET_MAX_OFFSET,
                                                          unique("DiffNoTopic")))
    assert missing.tidemq.code == missing.apache.code
    assert missing.tidemq.ext_fields == missing.apache.ext_fields

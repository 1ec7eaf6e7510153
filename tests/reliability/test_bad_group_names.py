"""Malformed group names, in every request kind that carries one, against a live broker: each
is refused with a remark naming the field and the value, and nothing is written (no offset, no
subscription group, no retry or dead-letter topic). A valid group then works as before."""

from __future__ import annotations

import json

import pytest

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

pytestmark = pytest.mark.reliability

TOPIC = "NamedTopic"
BAD_GROUPS = ["bad group\x01", "x" * 256, "tab\tgroup", "new\nline", "slash/group", ""]


def requests_for(group: str) -> dict[str, RemotingCommand]:
    """One request of each kind naming ``group``."""
    queue = {"topic": TOPIC, "brokerName": "broker-a", "queueId": 0}
    heartbeat = {
        "clientID": "127.0.0.1@bad", "language": "PYTHON", "version": 435,
        "consumerDataSet": [{
            "groupName": group, "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "subscriptionDataSet": [{"topic": TOPIC, "subString": "*", "tagsSet": [],
                                     "codeSet": [], "subVersion": 1,
                                     "expressionType": "TAG", "classFilterMode": False}],
            "unitMode": False,
        }],
        "producerDataSet": [],
    }
    producer_heartbeat = {"clientID": "127.0.0.1@bad", "language": "PYTHON", "version": 435,
                          "consumerDataSet": [], "producerDataSet": [{"groupName": group}]}
    lock = {"consumerGroup": group, "clientId": "127.0.0.1@bad", "mqSet": [queue]}
    subscription_group = {"groupName": group, "consumeEnable": True,
                          "consumeFromMinEnable": True, "consumeBroadcastEnable": True,
                          "retryQueueNums": 1, "retryMaxTimes": 16, "brokerId": 0,
                          "whichBrokerWhenConsumeSlowly": 1}
    offsets = {"consumerGroup": group, "topic": TOPIC, "queueId": "0"}
    request = RemotingCommand.request
    return {
        "consumer heartbeat": request(RequestCode.HEART_BEAT, {},
                                      json.dumps(heartbeat).encode()),
        "producer heartbeat": request(RequestCode.HEART_BEAT, {},
                                      json.dumps(producer_heartbeat).encode()),
        "update offset": request(RequestCode.UPDATE_CONSUMER_OFFSET,
                                 {**offsets, "commitOffset": "5"}),
        "query offset": request(RequestCode.QUERY_CONSUMER_OFFSET, offsets),
        "pull": request(RequestCode.PULL_MESSAGE, {
            **offsets, "queueOffset": "0", "maxMsgNums": "1", "sysFlag": "2",
            "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*",
            "subVersion": "0", "expressionType": "TAG"}),
        "send back": request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": "0", "group": group, "delayLevel": "0", "originMsgId": "",
            "originTopic": TOPIC, "unitMode": "false", "maxReconsumeTimes": "16"}),
        "subscription group": request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                                      json.dumps(subscription_group).encode()),
        "delete subscription group": request(RequestCode.DELETE_SUBSCRIPTIONGROUP,
                                             {"groupName": group}),
        "lock": request(RequestCode.LOCK_BATCH_MQ, {}, json.dumps(lock).encode()),
        "unlock": request(RequestCode.UNLOCK_BATCH_MQ, {}, json.dumps(lock).encode()),
        "consumer list": request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                 {"consumerGroup": group}),
        "unregister": request(RequestCode.UNREGISTER_CLIENT,
                              {"clientID": "127.0.0.1@bad", "consumerGroup": group}),
    }


def config_text(store) -> str:
    parts = []
    for name in ("consumerOffset.json", "subscriptionGroup.json", "topics.json"):
        path = store / "config" / name
        parts.append(path.read_text(errors="replace") if path.exists() else "")
    return "\n".join(parts)


def test_every_request_kind_refuses_a_malformed_group_and_writes_nothing(
    tidemq_cluster, remoting_call
):
    cluster = tidemq_cluster()
    broker = cluster.brokers[0]
    create = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": TOPIC, "defaultTopic": "TBW102", "readQueueNums": "1",
        "writeQueueNums": "1", "perm": "6", "topicFilterType": "SINGLE_TAG"})
    assert remoting_call(broker.addr, create).code == ResponseCode.SUCCESS
    store = broker.workdir / "store"
    for group in BAD_GROUPS:
        for kind, request in requests_for(group).items():
            if group == "" and kind in ("unregister",):
                continue  # an empty optional group means "not this kind of client"
            response = remoting_call(broker.addr, request)
            where = f"{kind} with group {group!r}"
            assert response.code == ResponseCode.SYSTEM_ERROR, (where, response)
            assert repr(group) in (response.remark or ""), (where, response.remark)
    # A valid group goes through every one of these paths as before.
    for kind, request in requests_for("good_group").items():
        response = remoting_call(broker.addr, request)
        assert "is refused" not in (response.remark or ""), (kind, response.remark)
    assert broker.running
    # The broker's final save at a clean stop writes every table: no bad group in any.
    broker.stop()
    written = config_text(store)
    assert "good_group" in written
    for fragment in ("bad group", "%RETRY%bad", "%DLQ%bad", "slash/group", "tab\\tgroup",
                     "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
                     "new\\nline", '"%RETRY%"', '"%DLQ%"', '""'):
        assert fragment not in written, fragment

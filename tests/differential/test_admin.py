"""Admin and bookkeeping requests to Apache's broker and name server and to tidemq's.

Compared: codes, the header fields and body fields a tool reads (mqadmin's topicStatus,
consumerProgress, consumerConnection, brokerStatus, clusterList, topicRoute), consumer
offsets, subscription groups, queue locks, message lookup by key and by offset id. Remarks
are compared by meaning only: each side's must name the thing that is missing.
"""

from __future__ import annotations

import orjson
import pytest
import wire
from compare import assert_same

from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.message import decode_records

pytestmark = pytest.mark.differential

SUCCESS_BOTH = (ResponseCode.SUCCESS, ResponseCode.SUCCESS)

# Keys of GET_BROKER_RUNTIME_INFO that mqadmin brokerStatus users and the console read; both
# must serve them. Apache serves more (thread-pool queue sizes, latency buckets, disk ratios
# per path): docs/differences.md lists them.
RUNTIME_KEYS = {
    "brokerVersion", "brokerVersionDesc", "bootTimestamp", "runtime", "commitLogMaxOffset",
    "commitLogMinOffset", "commitLogDirCapacity", "msgPutTotalTodayNow", "msgGetTotalTodayNow",
    "msgPutTotalTodayMorning", "msgGetTotalTodayMorning", "msgPutTotalYesterdayMorning",
    "msgGetTotalYesterdayMorning", "putMessageTimesTotal", "putMessageSizeTotal",
    "putMessageAverageSize", "putMessageFailedTimes", "putMessageEntireTimeMax", "putTps",
    "getFoundTps", "getMissTps", "getTransferedTps", "getTotalTps", "earliestMessageTimeStamp",
    "startAcceptSendRequestTimeStamp", "dispatchBehindBytes",
}


def body(response):
    return jsonx.loads(response.body) if response.body else None


def queue_key_view(table: dict) -> dict:
    """A fastjson map keyed by MessageQueue objects -> {queueId: value}."""
    return {key.get("queueId"): value for key, value in table.items()}


def setup_topic(pair, unique, queues: int = 2, sends: int = 3, keys: str = "k"):
    topic = unique("DiffAdmin")
    assert pair.broker_call(lambda: wire.create_topic(topic, queues)).codes() == SUCCESS_BOTH
    for i in range(sends):
        answers = pair.broker_call(lambda i=i: wire.send(topic, b"x" * 100, queue_id=0,
                                                          keys=f"{keys}{i}"))
        assert answers.codes() == SUCCESS_BOTH
    pair.wait_dispatched(topic, 0, sends)
    return topic


def runtime_tables(pair, wait_until) -> dict[str, dict]:
    """Both brokers' runtime tables.

    Apache's broker answers SYSTEM_ERROR to this request until its store statistics have taken
    their first sample (about a second after start: an empty sample list throws in getPutTps),
    so a freshly started pair is asked again, bounded, until both answer.
    """
    answers = []

    def both_answered() -> bool:
        answers[:] = [pair.broker_call(
            lambda: wire.request(RequestCode.GET_BROKER_RUNTIME_INFO))]
        return answers[0].codes() == SUCCESS_BOTH

    wait_until(both_answered, 30.0, what="both brokers serving runtime info")
    answer = answers[0]
    return {"apache": body(answer.apache)["table"], "tidemq": body(answer.tidemq)["table"]}


def test_runtime_info_serves_the_same_counters(pair, unique, wait_until):
    before = runtime_tables(pair, wait_until)
    for side, table in before.items():
        assert set(table) >= RUNTIME_KEYS, f"{side} lacks {RUNTIME_KEYS - set(table)}"
    setup_topic(pair, unique, sends=4)
    after: dict[str, dict] = {}

    def grew(side: str, key: str) -> int:
        return int(after[side][key]) - int(before[side][key])

    def counted() -> bool:
        after.update(runtime_tables(pair, wait_until))
        return all(grew(side, "msgPutTotalTodayNow") >= 4 for side in after)

    # Apache counts a put just after answering it: wait (bounded) until both count all four.
    wait_until(counted, 30.0, what="both brokers counting the four puts")
    for side in after:
        assert grew(side, "msgPutTotalTodayNow") == 4, side
        # RocketMQ counts whole stored records (header, topic, properties), so the bytes put
        # are exactly how far the commit log grew.
        assert grew(side, "putMessageSizeTotal") == grew(side, "commitLogMaxOffset"), (
            f"{side}: putMessageSizeTotal grew {grew(side, 'putMessageSizeTotal')}, the "
            f"commit log {grew(side, 'commitLogMaxOffset')}")


def test_topic_stats_and_unknown_topic_agree(pair, unique):
    topic = setup_topic(pair, unique)
    stats = pair.broker_call(lambda: wire.request(RequestCode.GET_TOPIC_STATS_INFO,
                                                  {"topic": topic}))
    assert stats.codes() == SUCCESS_BOTH

    def offsets(answer):
        return {queue: {"min": value["minOffset"], "max": value["maxOffset"],
                        "touched": value["lastUpdateTimestamp"] > 0}
                for queue, value in queue_key_view(body(answer)["offsetTable"]).items()}

    assert_same(offsets(stats.apache), offsets(stats.tidemq), "topic stats")
    missing = unique("DiffNoTopic")
    unknown = pair.broker_call(lambda: wire.request(RequestCode.GET_TOPIC_STATS_INFO,
                                                    {"topic": missing}))
    assert unknown.codes() == (ResponseCode.TOPIC_NOT_EXIST,) * 2
    assert missing in unknown.apache.remark and missing in unknown.tidemq.remark


def test_consumer_offsets_stats_and_connections_agree(pair, unique):
    topic = setup_topic(pair, unique)
    group = unique("cg_admin")
    assert pair.broker_call(lambda: wire.heartbeat(group, [topic])).codes() == SUCCESS_BOTH

    def offset_request(code, **extra):
        return lambda: wire.request(code, {"consumerGroup": group, "topic": topic,
                                           "queueId": "0", **extra})

    first = pair.broker_call(offset_request(RequestCode.QUERY_CONSUMER_OFFSET))
    assert first.codes() == SUCCESS_BOTH
    assert first.apache.ext_fields["offset"] == first.tidemq.ext_fields["offset"] == "0"
    updated = pair.broker_call(offset_request(RequestCode.UPDATE_CONSUMER_OFFSET,
                                              commitOffset="2"))
    assert updated.codes() == SUCCESS_BOTH
    again = pair.broker_call(offset_request(RequestCode.QUERY_CONSUMER_OFFSET))
    assert again.apache.ext_fields["offset"] == again.tidemq.ext_fields["offset"] == "2"

    stats = pair.broker_call(lambda: wire.request(RequestCode.GET_CONSUME_STATS,
                                                  {"consumerGroup": group, "topic": topic}))
    assert stats.codes() == SUCCESS_BOTH

    def progress(answer):
        return {queue: (value["brokerOffset"], value["consumerOffset"])
                for queue, value in queue_key_view(body(answer)["offsetTable"]).items()}

    assert_same(progress(stats.apache), progress(stats.tidemq), "consume stats")
    assert progress(stats.apache)[0] == (3, 2)

    connections = pair.broker_call(lambda: wire.request(
        RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group}))
    assert connections.codes() == SUCCESS_BOTH

    def connection_view(answer):
        document = body(answer)
        return {"clients": sorted(c["clientId"] for c in document["connectionSet"]),
                "languages": sorted(c["language"] for c in document["connectionSet"]),
                "model": document["messageModel"], "type": document["consumeType"],
                "from": document["consumeFromWhere"],
                "subscriptions": {name: (value["subString"], value["expressionType"])
                                  for name, value in document["subscriptionTable"].items()}}

    assert_same(connection_view(connections.apache), connection_view(connections.tidemq),
                "consumer connections")
    members = pair.broker_call(lambda: wire.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                    {"consumerGroup": group}))
    assert body(members.apache) == body(members.tidemq)
    offline = unique("cg_offline")
    nobody = pair.broker_call(lambda: wire.request(RequestCode.GET_CONSUMER_CONNECTION_LIST,
                                                   {"consumerGroup": offline}))
    assert nobody.codes() == (ResponseCode.CONSUMER_NOT_ONLINE,) * 2
    assert offline in nobody.apache.remark and offline in nobody.tidemq.remark


def test_subscription_group_create_read_delete_agree(pair, unique):
    group = unique("cg_created")
    config = orjson.dumps({"groupName": group, "retryMaxTimes": 5, "consumeEnable": True,
                           "consumeBroadcastEnable": False, "retryQueueNums": 1})
    created = pair.broker_call(lambda: wire.request(
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, config))
    assert created.codes() == SUCCESS_BOTH
    table = pair.broker_call(lambda: wire.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
    assert_same(body(table.apache)["subscriptionGroupTable"][group],
                body(table.tidemq)["subscriptionGroupTable"][group], "subscription group")
    deleted = pair.broker_call(lambda: wire.request(RequestCode.DELETE_SUBSCRIPTIONGROUP,
                                                    {"groupName": group}))
    assert deleted.codes() == SUCCESS_BOTH
    table = pair.broker_call(lambda: wire.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
    assert group not in body(table.apache)["subscriptionGroupTable"]
    assert group not in body(table.tidemq)["subscriptionGroupTable"]


def test_topic_config_agrees(pair, unique):
    topic = setup_topic(pair, unique, queues=3, sends=0)
    table = pair.broker_call(lambda: wire.request(RequestCode.GET_ALL_TOPIC_CONFIG))
    assert table.codes() == SUCCESS_BOTH
    assert_same(body(table.apache)["topicConfigTable"][topic],
                body(table.tidemq)["topicConfigTable"][topic], "topic config")


def test_queue_locks_agree(pair, unique):
    topic = setup_topic(pair, unique, sends=0)
    group = unique("cg_lock")

    def lock(client_id):
        return lambda: wire.request(RequestCode.LOCK_BATCH_MQ, None, orjson.dumps({
            "consumerGroup": group, "clientId": client_id,
            "mqSet": [{"topic": topic, "brokerName": "broker-a", "queueId": q}
                      for q in (0, 1)]}))

    first = pair.broker_call(lock("client-1"))
    assert first.codes() == SUCCESS_BOTH
    assert_same(body(first.apache), body(first.tidemq), "lock by the first client")
    assert len(body(first.apache)["lockOKMQSet"]) == 2
    second = pair.broker_call(lock("client-2"))
    assert_same(body(second.apache), body(second.tidemq), "lock by a second client")
    assert body(second.apache)["lockOKMQSet"] == []


def test_message_lookup_by_key_and_offset_id_agrees(pair, unique):
    topic = setup_topic(pair, unique, keys="lookup")

    def query(key):
        return lambda: wire.request(RequestCode.QUERY_MESSAGE, {
            "topic": topic, "key": key, "maxNum": "32", "beginTimestamp": "0",
            "endTimestamp": str(2**62)})

    found = pair.broker_call(query("lookup1"))
    assert found.codes() == SUCCESS_BOTH
    apache = [(m.body, m.properties["KEYS"]) for m in decode_records(found.apache.body)]
    tidemq = [(m.body, m.properties["KEYS"]) for m in decode_records(found.tidemq.body)]
    assert apache == tidemq == [(b"x" * 100, "lookup1")]
    none = pair.broker_call(query("never-sent"))
    assert none.codes() == (ResponseCode.QUERY_NOT_FOUND,) * 2
    bad = pair.broker_call(lambda: wire.request(RequestCode.VIEW_MESSAGE_BY_ID,
                                                {"offset": "99999999"}))
    assert bad.codes() == (ResponseCode.SYSTEM_ERROR,) * 2
    assert "99999999" in bad.apache.remark and "99999999" in bad.tidemq.remark


def test_name_server_answers_agree(pair, unique):
    topic = setup_topic(pair, unique, sends=0)
    cluster = pair.namesrv_call(lambda: wire.request(RequestCode.GET_BROKER_CLUSTER_INFO))
    assert cluster.codes() == SUCCESS_BOTH

    def cluster_view(answer):
        document = body(answer)
        return {"clusters": {name: sorted(brokers)
                             for name, brokers in document["clusterAddrTable"].items()},
                "brokers": {name: sorted(data["brokerAddrs"])
                            for name, data in document["brokerAddrTable"].items()}}

    assert_same(cluster_view(cluster.apache), cluster_view(cluster.tidemq), "cluster info")
    missing = unique("DiffNoRoute")
    no_route = pair.namesrv_call(lambda: wire.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                      {"topic": missing}))
    assert no_route.codes() == (ResponseCode.TOPIC_NOT_EXIST,) * 2
    assert missing in no_route.apache.remark and missing in no_route.tidemq.remark
    routed = pair.namesrv_call(lambda: wire.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                    {"topic": topic}))
    assert routed.codes() == SUCCESS_BOTH
    assert_same(body(routed.apache)["queueDatas"], body(routed.tidemq)["queueDatas"], "queues")
    by_cluster = pair.namesrv_call(lambda: wire.request(RequestCode.GET_TOPICS_BY_CLUSTER,
                                                        {"cluster": "DefaultCluster"}))
    assert topic in body(by_cluster.apache)["topicList"]
    assert topic in body(by_cluster.tidemq)["topicList"]
    kv = pair.namesrv_call(lambda: wire.request(RequestCode.GET_KV_CONFIG,
                                                {"namespace": "ns", "key": missing}))
    assert kv.codes() == (ResponseCode.QUERY_NOT_FOUND,) * 2

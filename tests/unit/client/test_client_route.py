"""Route parsing (both JSON forms name servers write) and the queue lists derived from it."""

from __future__ import annotations

import pytest

from tidemq.client.message import MessageQueue
from tidemq.client.route import parse_cluster_info, parse_topic_route
from tidemq.errors import RemoteProtocolError

# What a pre-4.9.4 name server writes: brokerAddrs keys unquoted (not valid JSON).
UNQUOTED_ROUTE = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.2:10911",1:"10.0.0.3:10911"},'
    b'"brokerName":"broker-b","cluster":"c1"},'
    b'{"brokerAddrs":{0:"10.0.0.1:10911"},"brokerName":"broker-a","cluster":"c1"}],'
    b'"filterServerTable":{},"queueDatas":['
    b'{"brokerName":"broker-b","perm":6,"readQueueNums":2,"topicSysFlag":0,"writeQueueNums":3},'
    b'{"brokerName":"broker-a","perm":6,"readQueueNums":2,"topicSysFlag":0,"writeQueueNums":2}]}'
)


def test_route_with_unquoted_broker_id_keys_parses():
    route = parse_topic_route(UNQUOTED_ROUTE)
    assert route.broker("broker-b").broker_addrs == {0: "10.0.0.2:10911", 1: "10.0.0.3:10911"}
    assert route.master_addresses() == {"broker-a": "10.0.0.1:10911",
                                        "broker-b": "10.0.0.2:10911"}


def test_route_with_quoted_keys_and_old_sys_flag_name_parses():
    body = (
        '{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911"},"brokerName":"b",'
        '"cluster":"c"}],"queueDatas":[{"brokerName":"b","perm":6,"readQueueNums":1,'
        '"topicSynFlag":3,"writeQueueNums":1}]}'
    )
    route = parse_topic_route(body)
    assert route.broker("b").master_address == "127.0.0.1:10911"
    assert route.queue_datas[0].topic_sys_flag == 3


def test_publish_queues_are_sorted_by_broker_and_use_write_counts():
    route = parse_topic_route(UNQUOTED_ROUTE)
    assert route.publish_queues("T") == [
        MessageQueue("T", "broker-a", 0),
        MessageQueue("T", "broker-a", 1),
        MessageQueue("T", "broker-b", 0),
        MessageQueue("T", "broker-b", 1),
        MessageQueue("T", "broker-b", 2),
    ]


def test_subscribe_queues_use_read_counts():
    route = parse_topic_route(UNQUOTED_ROUTE)
    assert route.subscribe_queues("T") == [
        MessageQueue("T", "broker-a", 0),
        MessageQueue("T", "broker-a", 1),
        MessageQueue("T", "broker-b", 0),
        MessageQueue("T", "broker-b", 1),
    ]


def test_publish_skips_read_only_queues_and_brokers_without_master():
    body = (
        '{"brokerDatas":['
        '{"brokerAddrs":{"1":"10.0.0.9:10911"},"brokerName":"slave-only","cluster":"c"},'
        '{"brokerAddrs":{"0":"10.0.0.1:10911"},"brokerName":"read-only","cluster":"c"},'
        '{"brokerAddrs":{"0":"10.0.0.2:10911"},"brokerName":"ok","cluster":"c"}],'
        '"queueDatas":['
        '{"brokerName":"slave-only","perm":6,"readQueueNums":1,"writeQueueNums":1},'
        '{"brokerName":"read-only","perm":4,"readQueueNums":1,"writeQueueNums":1},'
        '{"brokerName":"ok","perm":6,"readQueueNums":1,"writeQueueNums":1}]}'
    )
    route = parse_topic_route(body)
    assert route.publish_queues("T") == [MessageQueue("T", "ok", 0)]
    assert [q.broker_name for q in route.subscribe_queues("T")] == ["ok", "read-only",
                                                                     "slave-only"]


def test_order_topic_conf_replaces_the_publish_list():
    body = (
        '{"brokerDatas":[{"brokerAddrs":{"0":"10.0.0.1:10911"},"brokerName":"a","cluster":"c"}],'
        '"orderTopicConf":"a:2;b:1","queueDatas":[{"brokerName":"a","perm":6,'
        '"readQueueNums":8,"writeQueueNums":8}]}'
    )
    route = parse_topic_route(body)
    assert route.publish_queues("T") == [
        MessageQueue("T", "a", 0), MessageQueue("T", "a", 1), MessageQueue("T", "b", 0)
    ]


def test_default_topic_route_is_capped_to_the_producer_queue_count():
    body = (
        '{"brokerDatas":[{"brokerAddrs":{0:"10.0.0.1:10911"},"brokerName":"a","cluster":"c"}],'
        '"queueDatas":[{"brokerName":"a","perm":7,"readQueueNums":8,"writeQueueNums":8}]}'
    )
    capped = parse_topic_route(body).with_queue_nums_capped(4)
    assert [q.queue_id for q in capped.publish_queues("New")] == [0, 1, 2, 3]


@pytest.mark.parametrize("body", [b"[1,2]", b'{"queueDatas":[{"perm":6}]}', b"{not json"])
def test_malformed_route_raises_protocol_error(body):
    with pytest.raises(RemoteProtocolError):
        parse_topic_route(body)


def test_cluster_info_with_unquoted_keys_lists_masters_per_cluster():
    body = (
        b'{"brokerAddrTable":{"b1":{"brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.5:10911"},'
        b'"brokerName":"b1","cluster":"c1"},"b2":{"brokerAddrs":{1:"10.0.0.6:10911"},'
        b'"brokerName":"b2","cluster":"c2"}},"clusterAddrTable":{"c1":["b1"],"c2":["b2"]}}'
    )
    info = parse_cluster_info(body)
    assert info.clusters == {"c1": ["b1"], "c2": ["b2"]}
    assert info.master_addresses("c1") == {"b1": "10.0.0.1:10911"}
    assert info.master_addresses("c2") == {}
    assert info.master_addresses() == {"b1": "10.0.0.1:10911"}

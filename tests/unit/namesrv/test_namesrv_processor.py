"""Name-server request handlers: request frames in, RocketMQ responses out."""

from __future__ import annotations

import asyncio
import json

import pytest

from tidemq.namesrv.config import NamesrvConfig
from tidemq.namesrv.kv_config import KVConfigManager
from tidemq.namesrv.processor import NamesrvProcessor
from tidemq.namesrv.register_body import RegisterBrokerBody, RegisteredTopicConfig
from tidemq.namesrv.route_data import DataVersion
from tidemq.namesrv.route_info_manager import RouteInfoManager
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import body_crc

MASTER = "10.0.0.1:10911"
SLAVE = "10.0.0.2:10911"


class FakeConnection:
    remote_address = "10.0.0.9:50000"


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def processor() -> NamesrvProcessor:
    return make_processor(NamesrvConfig())


def make_processor(config: NamesrvConfig) -> NamesrvProcessor:
    return NamesrvProcessor(config, RouteInfoManager(), KVConfigManager(), clock_ms=Clock())


def serve(processor: NamesrvProcessor, request: RemotingCommand,
          connection: object | None = None) -> RemotingCommand:
    handler = processor.handlers()[request.code]
    return asyncio.run(handler(request, connection or FakeConnection()))


def registration(broker_id=0, addr=MASTER, counter=1, topics=("Orders",), *, compressed=False,
                 crc=True, version=409) -> RemotingCommand:
    body = RegisterBrokerBody(
        DataVersion(counter, 99),
        {t: RegisteredTopicConfig(t, 4, 4, 6) for t in topics},
    ).encode(compressed=compressed)
    ext = {"brokerName": "broker-a", "brokerAddr": addr, "clusterName": "DefaultCluster",
           "haServerAddr": addr.replace("10911", "10912"), "brokerId": str(broker_id),
           "compressed": "true" if compressed else "false",
           "bodyCrc32": str(body_crc(body)) if crc else "0"}
    request = RemotingCommand.request(RequestCode.REGISTER_BROKER, ext, body)
    request.version = version
    return request


def route_request(topic: str, version: int = 409, **ext: str) -> RemotingCommand:
    request = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic, **ext})
    request.version = version
    return request


def test_register_then_route_in_standard_json_for_new_clients(processor):
    response = serve(processor, registration())
    assert response.code == ResponseCode.SUCCESS
    assert response.version == 409

    route = serve(processor, route_request("Orders", version=401))
    assert route.code == ResponseCode.SUCCESS and route.version == 409
    document = json.loads(route.body)  # standard JSON: parses with the stdlib
    assert document["brokerDatas"] == [
        {"brokerAddrs": {"0": MASTER}, "brokerName": "broker-a", "cluster": "DefaultCluster"}]
    assert document["queueDatas"] == [{"brokerName": "broker-a", "perm": 6, "readQueueNums": 4,
                                       "topicSysFlag": 0, "writeQueueNums": 4}]
    assert document["filterServerTable"] == {}
    assert "orderTopicConf" not in document


def test_old_clients_get_fastjson_unquoted_broker_ids(processor):
    serve(processor, registration())
    body = serve(processor, route_request("Orders", version=121)).body
    assert b'"brokerAddrs":{0:"10.0.0.1:10911"}' in body
    assert jsonx.loads(body)["brokerDatas"][0]["brokerAddrs"] == {0: MASTER}


def test_old_clients_may_ask_for_standard_json(processor):
    serve(processor, registration())
    body = serve(processor, route_request("Orders", version=121,
                                          acceptStandardJsonOnly="true")).body
    assert json.loads(body)["brokerDatas"][0]["brokerAddrs"] == {"0": MASTER}


def test_new_clients_get_non_ascii_names_escaped_old_clients_raw_utf8(processor):
    cluster = "集群-\u00e9-\U0001d11e"  # CJK, Latin-1 and a character outside the BMP
    request = registration()
    request.ext_fields["clusterName"] = cluster
    assert serve(processor, request).code == ResponseCode.SUCCESS
    standard = serve(processor, route_request("Orders", version=401)).body
    assert standard.isascii()
    assert b'"cluster":"\\u96c6\\u7fa4-\\u00e9-\\ud834\\udd1e"' in standard
    assert json.loads(standard)["brokerDatas"][0]["cluster"] == cluster
    asked = serve(processor, route_request("Orders", version=121,
                                           acceptStandardJsonOnly="true")).body
    assert asked == standard
    legacy = serve(processor, route_request("Orders", version=121)).body
    assert cluster.encode() in legacy
    assert jsonx.loads(legacy)["brokerDatas"][0]["cluster"] == cluster


def test_unknown_topic_is_topic_not_exist_naming_the_topic(processor):
    response = serve(processor, route_request("NoSuchTopic"))
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert "NoSuchTopic" in response.remark
    assert response.body is None


def test_compressed_registration(processor):
    assert serve(processor, registration(compressed=True)).code == ResponseCode.SUCCESS
    assert serve(processor, route_request("Orders")).code == ResponseCode.SUCCESS


def test_body_crc_mismatch_is_refused(processor):
    request = registration()
    request.ext_fields["bodyCrc32"] = str(body_crc(request.body) ^ 1)
    response = serve(processor, request)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark.startswith("crc32 not match")
    assert serve(processor, route_request("Orders")).code == ResponseCode.TOPIC_NOT_EXIST


def test_crc_zero_means_not_checked(processor):
    assert serve(processor, registration(crc=False)).code == ResponseCode.SUCCESS


def test_missing_header_field_is_system_error_naming_it(processor):
    request = registration()
    del request.ext_fields["brokerAddr"]
    response = serve(processor, request)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "brokerAddr" in response.remark


def test_malformed_body_is_system_error(processor):
    request = registration(crc=False)
    request.body = b"{not json"
    response = serve(processor, request)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "JSON" in response.remark


def test_slave_registration_answers_master_addresses(processor):
    serve(processor, registration())
    response = serve(processor, registration(broker_id=1, addr=SLAVE))
    assert response.ext_fields == {"masterAddr": MASTER, "haServerAddr": "10.0.0.1:10912"}


def test_cluster_info_uses_unquoted_broker_ids(processor):
    serve(processor, registration())
    serve(processor, registration(broker_id=1, addr=SLAVE))
    response = serve(processor, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
    assert response.code == ResponseCode.SUCCESS
    assert b'{0:"10.0.0.1:10911",1:"10.0.0.2:10911"}' in response.body
    document = jsonx.loads(response.body)
    assert document["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
    assert document["brokerAddrTable"]["broker-a"]["cluster"] == "DefaultCluster"


def test_unregister_removes_the_route(processor):
    serve(processor, registration())
    response = serve(processor, RemotingCommand.request(RequestCode.UNREGISTER_BROKER, {
        "brokerName": "broker-a", "brokerAddr": MASTER, "clusterName": "DefaultCluster",
        "brokerId": "0"}))
    assert response.code == ResponseCode.SUCCESS
    assert serve(processor, route_request("Orders")).code == ResponseCode.TOPIC_NOT_EXIST


def test_kv_config_put_get_list_delete(processor):
    def kv(code, **ext):
        return serve(processor, RemotingCommand.request(code, ext))

    missing = kv(RequestCode.GET_KV_CONFIG, namespace="ns", key="k")
    assert missing.code == ResponseCode.QUERY_NOT_FOUND and "ns" in missing.remark
    assert kv(RequestCode.PUT_KV_CONFIG, namespace="ns", key="k", value="v").code == 0
    found = kv(RequestCode.GET_KV_CONFIG, namespace="ns", key="k")
    assert found.code == ResponseCode.SUCCESS and found.ext_fields == {"value": "v"}
    listing = kv(RequestCode.GET_KVLIST_BY_NAMESPACE, namespace="ns")
    assert json.loads(listing.body) == {"table": {"k": "v"}}
    assert kv(RequestCode.DELETE_KV_CONFIG, namespace="ns", key="k").code == 0
    assert kv(RequestCode.GET_KV_CONFIG, namespace="ns", key="k").code == 22
    assert kv(RequestCode.GET_KVLIST_BY_NAMESPACE, namespace="ns").code == 22


def test_order_topic_conf_comes_from_the_kv_config_when_enabled():
    processor = make_processor(NamesrvConfig(order_message_enable=True))
    serve(processor, RemotingCommand.request(RequestCode.PUT_KV_CONFIG, {
        "namespace": "ORDER_TOPIC_CONFIG", "key": "Orders", "value": "broker-a:4"}))
    response = serve(processor, registration())
    # The broker learns the ordered-topic table from its registration response.
    assert json.loads(response.body) == {"table": {"Orders": "broker-a:4"}}
    route = json.loads(serve(processor, route_request("Orders")).body)
    assert route["orderTopicConf"] == "broker-a:4"


def test_order_topic_conf_is_left_out_when_disabled(processor):
    serve(processor, RemotingCommand.request(RequestCode.PUT_KV_CONFIG, {
        "namespace": "ORDER_TOPIC_CONFIG", "key": "Orders", "value": "broker-a:4"}))
    serve(processor, registration())
    assert "orderTopicConf" not in json.loads(serve(processor, route_request("Orders")).body)


def test_query_data_version(processor):
    def query(counter):
        return serve(processor, RemotingCommand.request(
            RequestCode.QUERY_DATA_VERSION,
            {"brokerName": "broker-a", "brokerAddr": MASTER, "clusterName": "DefaultCluster",
             "brokerId": "0"},
            jsonx.dumps({"counter": counter, "timestamp": 99})))

    unknown = query(1)
    assert unknown.ext_fields == {"changed": "true"} and unknown.body is None
    serve(processor, registration(counter=1))
    same = query(1)
    assert same.ext_fields == {"changed": "false"}
    assert json.loads(same.body) == {"counter": 1, "timestamp": 99}
    assert query(2).ext_fields == {"changed": "true"}


def test_wipe_and_add_write_perm(processor):
    serve(processor, registration(topics=("Orders", "Payments")))
    wiped = serve(processor, RemotingCommand.request(RequestCode.WIPE_WRITE_PERM_OF_BROKER,
                                                     {"brokerName": "broker-a"}))
    assert wiped.ext_fields == {"wipeTopicCount": "2"}
    route = json.loads(serve(processor, route_request("Orders")).body)
    assert route["queueDatas"][0]["perm"] == 4
    added = serve(processor, RemotingCommand.request(RequestCode.ADD_WRITE_PERM_OF_BROKER,
                                                     {"brokerName": "broker-a"}))
    assert added.ext_fields == {"addTopicCount": "2"}
    assert json.loads(serve(processor, route_request("Orders")).body)["queueDatas"][0][
        "perm"] == 6


def test_topic_lists(processor):
    serve(processor, registration(topics=("Orders", "Payments")))
    everything = serve(processor, RemotingCommand.request(
        RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
    assert json.loads(everything.body) == {"topicList": ["Orders", "Payments"]}
    by_cluster = serve(processor, RemotingCommand.request(RequestCode.GET_TOPICS_BY_CLUSTER,
                                                          {"cluster": "DefaultCluster"}))
    assert json.loads(by_cluster.body) == {"topicList": ["Orders", "Payments"]}


def test_topic_lists_can_be_disabled():
    processor = make_processor(NamesrvConfig(enable_all_topic_list=False,
                                             enable_topic_list=False))
    everything = serve(processor, RemotingCommand.request(
        RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
    assert everything.code == ResponseCode.SYSTEM_ERROR
    assert "enableAllTopicList" in everything.remark
    by_cluster = serve(processor, RemotingCommand.request(RequestCode.GET_TOPICS_BY_CLUSTER,
                                                          {"cluster": "c"}))
    assert "enableTopicList" in by_cluster.remark


def test_delete_topic_in_namesrv(processor):
    serve(processor, registration(topics=("Orders", "Payments")))
    response = serve(processor, RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV,
                                                        {"topic": "Orders"}))
    assert response.code == ResponseCode.SUCCESS
    assert serve(processor, route_request("Orders")).code == ResponseCode.TOPIC_NOT_EXIST
    assert serve(processor, route_request("Payments")).code == ResponseCode.SUCCESS

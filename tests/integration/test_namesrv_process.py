"""A real ``tidemq namesrv`` process answers over TCP as a RocketMQ 4.9.8 name server does."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from data_paths import CLIENT_FRAMES_DIR
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode, SerializeType
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import body_crc

pytestmark = pytest.mark.integration

ORACLE_FRAMES = CLIENT_FRAMES_DIR
ROUTE_FRAMES = sorted(ORACLE_FRAMES.glob("*/*_code105.bin"))
CLUSTER_FRAMES = sorted(ORACLE_FRAMES.glob("*/*_code106.bin"))
BROKER_ADDR = "127.0.0.1:10911"


def register_command(topics: list[str], *, broker_addr: str = BROKER_ADDR,
                     serialize_type: SerializeType = SerializeType.JSON) -> RemotingCommand:
    table = {
        topic: {"order": False, "perm": 6, "readQueueNums": 4, "topicFilterType": "SINGLE_TAG",
                "topicName": topic, "topicSysFlag": 0, "writeQueueNums": 4}
        for topic in topics
    }
    body = jsonx.dumps({"filterServerList": [], "topicConfigSerializeWrapper": {
        "dataVersion": {"counter": 1, "timestamp": 1_700_000_000_000},
        "topicConfigTable": table}})
    return RemotingCommand.request(
        RequestCode.REGISTER_BROKER,
        {"brokerName": "broker-a", "brokerAddr": broker_addr, "clusterName": "DefaultCluster",
         "haServerAddr": "127.0.0.1:10912", "brokerId": "0", "compressed": "false",
         "bodyCrc32": str(body_crc(body))},
        body, serialize_type=serialize_type)


def route_command(topic: str, serialize_type: SerializeType = SerializeType.JSON
                  ) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic},
                                   serialize_type=serialize_type)


@pytest.fixture
def namesrv(tidemq_cluster):
    return tidemq_cluster(namesrv_count=1, brokers=()).namesrvs[0]


def test_unknown_topic_is_topic_not_exist(namesrv, remoting_call):
    request = route_command("NoSuchTopic")
    response = remoting_call(namesrv.addr, request)
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert "NoSuchTopic" in response.remark
    assert (response.opaque, response.flag, response.version) == (request.opaque, 1, 409)


@pytest.mark.parametrize("serialize_type", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_register_then_route_in_both_header_types(namesrv, remoting_call, remoting_session,
                                                  serialize_type):
    broker = remoting_session(namesrv.addr)
    registered = broker.call(register_command(["Orders"], serialize_type=serialize_type))
    assert registered.code == ResponseCode.SUCCESS
    assert registered.serialize_type == serialize_type

    request = route_command("Orders", serialize_type)
    response = remoting_call(namesrv.addr, request)
    assert response.code == ResponseCode.SUCCESS
    assert response.serialize_type == serialize_type
    assert (response.opaque, response.flag, response.version) == (request.opaque, 1, 409)
    route = json.loads(response.body)  # our version (409) gets standard JSON
    assert route["brokerDatas"] == [{"brokerAddrs": {"0": BROKER_ADDR},
                                     "brokerName": "broker-a", "cluster": "DefaultCluster"}]
    assert [q["writeQueueNums"] for q in route["queueDatas"]] == [4]


def test_closing_the_broker_connection_drops_its_routes(namesrv, remoting_call,
                                                       remoting_session, wait_until):
    broker = remoting_session(namesrv.addr)
    assert broker.call(register_command(["Orders"])).code == ResponseCode.SUCCESS
    assert remoting_call(namesrv.addr, route_command("Orders")).code == ResponseCode.SUCCESS
    broker.close()

    wait_until(
        lambda: remoting_call(namesrv.addr, route_command("Orders")).code
        == ResponseCode.TOPIC_NOT_EXIST,
        timeout_s=20, what="the route of a broker whose connection closed to disappear",
    )


def test_unknown_code_is_request_code_not_supported(namesrv, remoting_call):
    response = remoting_call(namesrv.addr, RemotingCommand.request(999))
    assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert response.remark == " request type 999 not supported"


def test_garbage_closes_only_that_connection(namesrv, remoting_call):
    host, _, port = namesrv.addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as bad:
        bad.sendall(b"\x7f\xff\xff\xff garbage")
        assert bad.recv(1024) == b""
    assert remoting_call(namesrv.addr, route_command("X")).code == ResponseCode.TOPIC_NOT_EXIST


def test_oracle_frames_are_there():
    assert ROUTE_FRAMES and CLUSTER_FRAMES, f"expected code 105/106 frames under {ORACLE_FRAMES}"


def _captured_header(path: Path) -> dict:
    return json.loads(path.with_suffix(".json").read_text())["header"]


def test_oracle_route_requests_get_rocketmq_answers(namesrv, remoting_call, remoting_session):
    """Real clients' GET_ROUTEINFO_BY_TOPIC frames, byte for byte: known and unknown topics."""
    topics = sorted({_captured_header(path)["extFields"]["topic"] for path in ROUTE_FRAMES})
    served = topics[::2]  # register half of them, so both answers are exercised
    broker = remoting_session(namesrv.addr)
    assert broker.call(register_command(served)).code == ResponseCode.SUCCESS

    for path in ROUTE_FRAMES:
        header = _captured_header(path)
        topic = header["extFields"]["topic"]
        response = remoting_call(namesrv.addr, path.read_bytes())
        assert response.opaque == header["opaque"], path
        assert response.flag == 1, path
        assert response.version == 409, path
        assert response.serialize_type == SerializeType.JSON, path
        if topic not in served:
            assert response.code == ResponseCode.TOPIC_NOT_EXIST, path
            assert topic in response.remark, path
            continue
        assert response.code == ResponseCode.SUCCESS, path
        route = jsonx.loads(response.body)
        assert set(route) == {"brokerDatas", "filterServerTable", "queueDatas"}, path
        assert route["queueDatas"] == [{"brokerName": "broker-a", "perm": 6, "readQueueNums": 4,
                                        "topicSysFlag": 0, "writeQueueNums": 4}], path
        broker_addrs = route["brokerDatas"][0]["brokerAddrs"]
        if header["version"] < 401:
            # Pre-4.9.4 clients get fastjson's bare integer keys, as from RocketMQ itself.
            assert b'"brokerAddrs":{0:"127.0.0.1:10911"}' in response.body, path
            assert broker_addrs == {0: BROKER_ADDR}, path
        else:
            assert broker_addrs == {"0": BROKER_ADDR}, path


def test_oracle_cluster_info_requests(namesrv, remoting_call, remoting_session):
    empty = remoting_call(namesrv.addr, CLUSTER_FRAMES[0].read_bytes())
    assert empty.code == ResponseCode.SUCCESS
    assert jsonx.loads(empty.body) == {"brokerAddrTable": {}, "clusterAddrTable": {}}

    broker = remoting_session(namesrv.addr)
    assert broker.call(register_command(["Orders"])).code == ResponseCode.SUCCESS
    for path in CLUSTER_FRAMES:
        header = _captured_header(path)
        response = remoting_call(namesrv.addr, path.read_bytes())
        assert (response.code, response.opaque, response.flag) == (0, header["opaque"], 1), path
        assert b'"brokerAddrs":{0:"127.0.0.1:10911"}' in response.body, path
        info = jsonx.loads(response.body)
        assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}, path
        assert info["brokerAddrTable"]["broker-a"] == {
            "brokerAddrs": {0: BROKER_ADDR}, "brokerName": "broker-a",
            "cluster": "DefaultCluster"}, path

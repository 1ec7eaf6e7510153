"""NamesrvController in-process on loopback: a broker's connection closing or going silent
drops it; the KV config survives a restart when a file is configured."""

from __future__ import annotations

import asyncio
import json

import pytest

from tidemq.errors import ConfigFileCorrupt
from tidemq.namesrv import NamesrvConfig, NamesrvController
from tidemq.namesrv.kv_config import KVConfigManager
from tidemq.namesrv.register_body import RegisterBrokerBody, RegisteredTopicConfig
from tidemq.namesrv.route_data import DataVersion
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import body_crc
from tidemq.remoting.client import RemotingClient

TEST_TIMEOUT_S = 20
BROKER_ADDR = "127.0.0.1:10911"


def run(coro):
    async def bounded():
        async with asyncio.timeout(TEST_TIMEOUT_S):
            return await coro

    return asyncio.run(bounded())


def register_request() -> RemotingCommand:
    body = RegisterBrokerBody(DataVersion(1, 2), {"Orders": RegisteredTopicConfig("Orders", 4, 4,
                                                                                  6)}).encode()
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, {
        "brokerName": "broker-a", "brokerAddr": BROKER_ADDR, "clusterName": "DefaultCluster",
        "haServerAddr": "127.0.0.1:10912", "brokerId": "0", "bodyCrc32": str(body_crc(body))},
        body)


def route_request() -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})


async def wait_for_route_code(client, addr, code, attempts=200):
    for _ in range(attempts):
        response = await client.invoke(addr, route_request())
        if response.code == code:
            return response
        await asyncio.sleep(0.01)
    raise AssertionError(f"route code never became {code}")


def test_broker_connection_closing_drops_it_at_once():
    async def main():
        controller = NamesrvController(NamesrvConfig(listen_port=0))
        await controller.start()
        addr = controller.address
        broker, client = RemotingClient(), RemotingClient()
        try:
            assert (await broker.invoke(addr, register_request())).code == ResponseCode.SUCCESS
            assert (await client.invoke(addr, route_request())).code == ResponseCode.SUCCESS
            broker.close_connection(addr)
            await wait_for_route_code(client, addr, ResponseCode.TOPIC_NOT_EXIST)
            assert controller.route_info.live_broker_addrs() == []
        finally:
            await broker.close()
            await client.close()
            await controller.shutdown()

    run(main())


def test_silent_broker_is_dropped_by_the_scan_and_its_connection_closed():
    async def main():
        config = NamesrvConfig(listen_port=0, scan_not_active_broker_interval_ms=20,
                               broker_channel_expired_time_ms=50)
        controller = NamesrvController(config)
        await controller.start()
        addr = controller.address
        broker, client = RemotingClient(), RemotingClient()
        try:
            await broker.invoke(addr, register_request())
            connection = broker.connections[addr]
            await wait_for_route_code(client, addr, ResponseCode.TOPIC_NOT_EXIST)
            await asyncio.wait_for(connection.wait_closed(), 5)
        finally:
            await broker.close()
            await client.close()
            await controller.shutdown()

    run(main())


def test_unknown_code_is_request_code_not_supported_with_version_409():
    async def main():
        controller = NamesrvController(NamesrvConfig(listen_port=0))
        await controller.start()
        client = RemotingClient()
        try:
            response = await client.invoke(controller.address, RemotingCommand.request(12345))
            assert response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            assert response.version == 409
        finally:
            await client.close()
            await controller.shutdown()

    run(main())


def test_kv_config_survives_a_restart(tmp_path):
    path = tmp_path / "namesrv" / "kvConfig.json"
    first = KVConfigManager(path)
    first.load()
    first.put("ORDER_TOPIC_CONFIG", "Orders", "broker-a:4")
    first.put("ns", "k", "v")
    first.delete("ns", "k")
    assert json.loads(path.read_bytes()) == {
        "configTable": {"ORDER_TOPIC_CONFIG": {"Orders": "broker-a:4"}}}

    second = KVConfigManager(path)
    second.load()
    assert second.get("ORDER_TOPIC_CONFIG", "Orders") == "broker-a:4"
    assert second.namespace("ns") is None


def test_corrupt_kv_config_file_fails_start_naming_it(tmp_path):
    path = tmp_path / "kvConfig.json"
    path.write_text("{oops")
    with pytest.raises(ConfigFileCorrupt, match=r"kvConfig\.json"):
        KVConfigManager(path).load()

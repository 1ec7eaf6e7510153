"""A secured master/slave pair as real processes (issue 14): everything a broker opens itself
goes over TLS, and a slave of an ACL-enabled master signs with its own account.

One group: a name server that takes TLS only; a SYNC_MASTER and its slave, both with
tlsServerMode=enforcing and aclEnable=true (no white list). The slave trusts the test CA
(tlsClientTrustCertPath) and signs with innerClientAuthenticationCredentials, an account
that may touch no topic or group. Then: both brokers register (over TLS, or the enforcing
name server would not list them), the slave passes its master check and streams over TLS
(a SYNC_MASTER send is SEND_OK only once the slave acknowledged it), it copies the master's
topic table (signed requests), and a plain HA client is closed by the master unanswered.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from replication_group import BROKER_NAME, HA_TEST_SETTINGS
from tidemq.client import Admin, Credentials, Message, Producer, tls_context
from tidemq.client.message import SendStatus
from tidemq.errors import TidemqError
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.loop import run

pytestmark = pytest.mark.integration

OPERATOR = Credentials("operator", "operator-secret")
ACL_YAML = """\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: operator
    secretKey: operator-secret
    admin: true
  - accessKey: replicator
    secretKey: replicator-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
"""
TOPIC = "SecuredOrders"
WAIT_S = 90.0  # bounds every wait; a healthy pair needs a second or two (the table sync 10 s)


def secured_group(tidemq_cluster, pki, tmp_path):
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL_YAML)
    server_tls = {"tlsEnable": "true", "tlsServerMode": "enforcing",
                  "tlsServerCertPath": str(pki.server_cert),
                  "tlsServerKeyPath": str(pki.server_key)}
    secured = {**server_tls, **HA_TEST_SETTINGS, "brokerName": BROKER_NAME,
               "aclEnable": "true", "aclFilePath": str(acl_file),
               "tlsClientTrustCertPath": str(pki.ca_cert)}
    cluster = tidemq_cluster(
        brokers=("master", "slave"), namesrv_overrides=server_tls,
        broker_overrides={
            "master": {**secured, "brokerRole": "SYNC_MASTER"},
            "slave": {**secured, "brokerRole": "SLAVE", "brokerId": 1,
                      "innerClientAuthenticationCredentials":
                          '{"accessKey":"replicator","secretKey":"replicator-secret"}'},
        })
    return cluster, cluster.broker("master"), cluster.broker("slave")


async def until(what: str, condition) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        try:
            if await condition():
                return
        except TidemqError:
            pass  # not yet (a route, a connection)
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {WAIT_S:g} s waiting for {what}")
        await asyncio.sleep(0.1)


async def topics_of(client: RemotingClient, addr: str) -> set[str]:
    response = await client.invoke(addr, RemotingCommand.request(
        RequestCode.GET_ALL_TOPIC_CONFIG), 5000)
    assert response.code == ResponseCode.SUCCESS, response.remark
    return set(jsonx.loads(response.body)["topicConfigTable"])


def plain_ha_peer_is_closed_unanswered(ha_address: str) -> bool:
    host, _, port = ha_address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(struct.pack(">q", 0))  # an empty slave's first report
        try:
            return connection.recv(65536) == b""
        except ConnectionResetError:
            return True


def test_a_tls_and_acl_secured_sync_master_replicates_to_its_signing_slave(
        tidemq_cluster, pki, tmp_path):
    cluster, master, slave = secured_group(tidemq_cluster, pki, tmp_path)
    tls = tls_context(pki.ca_cert)

    async def main() -> str:
        async with Admin(cluster.namesrv_addr, tls=tls, credentials=OPERATOR) as admin:
            async def both_registered() -> bool:
                group = (await admin.cluster_list()).brokers.get(BROKER_NAME)
                return group is not None and set(group.broker_addrs) == {0, 1}

            await until("both brokers to register over TLS", both_registered)

            async def slave_in_sync() -> bool:
                info = await admin.broker_runtime_info(master.addr)
                return info.get("inSyncSlaveNums") == "1"

            await until("the slave to stream over TLS", slave_in_sync)
            ha_address = (await admin.broker_runtime_info(master.addr))["haListenAddress"]
            await admin.create_topic(TOPIC, 2)
            await until("the topic's route", lambda: _has_route(admin))
        async with Producer("secured-pg", cluster.namesrv_addr, tls=tls, credentials=OPERATOR,
                            retry_times_when_send_failed=0) as producer:
            for n in range(20):
                result = await producer.send(Message(TOPIC, f"m{n}".encode()))
                assert result.status is SendStatus.SEND_OK  # the slave acknowledged it
        client = RemotingClient(tls=tls, request_hook=OPERATOR.request_hook())
        try:
            async def slave_has_the_topic() -> bool:
                return TOPIC in await topics_of(client, slave.addr)

            await until("the slave to copy the master's topic table", slave_has_the_topic)
        finally:
            await client.close()
        return ha_address

    ha_address = run(main())
    assert plain_ha_peer_is_closed_unanswered(ha_address)
    assert "refuses" not in slave.log_tail() and "NO_PERMISSION" not in slave.log_tail()


async def _has_route(admin: Admin) -> bool:
    return bool((await admin.topic_route(TOPIC)).subscribe_queues(TOPIC))

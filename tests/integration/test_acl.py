"""Plain ACL on real ``tidemq broker`` and ``tidemq namesrv`` processes (aclEnable=true).

Each refusal is checked for its response code (NO_PERMISSION), a remark naming the key, the
resource and the missing permission, and that nothing was written or deleted. Signed
requests of the right accounts go through; white-listed peers pass unsigned; editing
plain_acl.yml grants and revokes within seconds, and a broken file keeps the old rules.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from routed_topics import create_routed_topic
from tidemq.client import Admin, BrokerRejected, Credentials, Message, Producer, PullConsumer
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.signature import SIGNATURE, Signer, sign_ext_fields
from tidemq.remoting.loop import run

pytestmark = pytest.mark.integration

ADMIN = Credentials("operator", "operator-secret")
PUBLISHER = Credentials("publisher", "publisher-secret")
CONSUMER = Credentials("consumer", "consumer-secret")

ACL_YAML = """\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: operator
    secretKey: operator-secret
    admin: true
  - accessKey: publisher
    secretKey: publisher-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Orders=PUB
  - accessKey: consumer
    secretKey: consumer-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
"""

WAIT_S = 60.0  # bounds waits for a reload or a route; a healthy server needs about a second


def acl_cluster(tidemq_cluster, tmp_path: Path, text: str = ACL_YAML, *, namesrv_acl=False):
    path = tmp_path / "plain_acl.yml"
    path.write_text(text)
    settings = {"aclEnable": "true", "aclFilePath": str(path)}
    cluster = tidemq_cluster(broker_overrides=settings,
                             namesrv_overrides=settings if namesrv_acl else None)
    return cluster, path


async def create_topic(namesrv: str, topic: str, credentials: Credentials) -> None:
    await create_routed_topic(namesrv, topic, 2, credentials=credentials)


async def max_offsets(namesrv: str, topic: str) -> int:
    async with Admin(namesrv, credentials=ADMIN) as admin:
        stats = await admin.topic_stats(topic)
    return sum(offset.max_offset for offset in stats.values())


def signed(command: RemotingCommand, access_key: str, secret_key: str) -> RemotingCommand:
    fields = dict(command.ext_fields or {})
    sign_ext_fields(fields, command.body, access_key, Signer(secret_key))
    command.ext_fields = fields
    return command


def send_request(topic: str, body: bytes = b"raw") -> RemotingCommand:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
        "a": "raw-pg", "b": topic, "c": "TBW102", "d": "4", "e": "0", "f": "0",
        "g": "1700000000000", "h": "0", "i": "", "j": "0", "k": "false", "m": "false",
    }, body)


def assert_refused(response: RemotingCommand, *fragments: str) -> None:
    assert response.code == ResponseCode.NO_PERMISSION, (response.code, response.remark)
    for fragment in fragments:
        assert fragment in response.remark, (fragment, response.remark)


def test_signed_clients_work_and_every_refusal_says_why_and_writes_nothing(
        tidemq_cluster, tmp_path, remoting_call):
    cluster, _ = acl_cluster(tidemq_cluster, tmp_path)
    namesrv, broker = cluster.namesrv_addr, cluster.brokers[0].addr

    async def main():
        await create_topic(namesrv, "Orders", ADMIN)
        async with Producer("pg", namesrv, credentials=PUBLISHER) as producer:
            for n in range(3):
                await producer.send(Message("Orders", f"order {n}".encode()))
        async with PullConsumer("billing", namesrv, credentials=CONSUMER,
                                consume_from="FIRST") as consumer:
            consumer.subscribe("Orders")
            received = []
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while len(received) < 3 and asyncio.get_running_loop().time() < deadline:
                received += await consumer.poll(timeout_ms=1000)
        assert sorted(m.body for m in received) == [b"order 0", b"order 1", b"order 2"]

        # SUB-only key sending, PUB-only key consuming, non-admin deleting a topic
        async with Producer("pg", namesrv, credentials=CONSUMER,
                            retry_times_when_send_failed=0) as producer:
            with pytest.raises(BrokerRejected) as caught:
                await producer.send(Message("Orders", b"must not be stored"))
        assert caught.value.code == ResponseCode.NO_PERMISSION
        assert "'consumer' has no PUB permission on topic 'Orders'" in caught.value.remark
        async with PullConsumer("billing", namesrv, credentials=PUBLISHER,
                                consume_from="FIRST") as consumer:
            queue = (await consumer.queues("Orders"))[0]
            with pytest.raises(BrokerRejected) as caught:
                await consumer.pull(queue, 0, 32)
        assert caught.value.code == ResponseCode.NO_PERMISSION
        assert "'publisher' has no SUB permission on topic 'Orders'" in caught.value.remark
        async with Admin(namesrv, credentials=CONSUMER) as admin:
            with pytest.raises(BrokerRejected) as caught:
                await admin.delete_topic("Orders")
        assert caught.value.code == ResponseCode.NO_PERMISSION
        assert "DELETE_TOPIC_IN_BROKER" in caught.value.remark
        assert "needs an admin account" in caught.value.remark
        return await max_offsets(namesrv, "Orders")

    assert run(main()) == 3

    # raw frames: unsigned, wrong secret, unknown key, garbled signature
    assert_refused(remoting_call(broker, send_request("Orders")), "not signed",
                   "globalWhiteRemoteAddresses")
    assert_refused(remoting_call(broker, signed(send_request("Orders"), "publisher", "nope")),
                   "'publisher'", "does not match")
    assert_refused(remoting_call(broker, signed(send_request("Orders"), "mallory", "x" * 8)),
                   "'mallory' is not an account")
    garbled = signed(send_request("Orders"), "publisher", "publisher-secret")
    garbled.ext_fields[SIGNATURE] = garbled.ext_fields[SIGNATURE][::-1]
    assert_refused(remoting_call(broker, garbled), "does not match")
    ok = remoting_call(broker, signed(send_request("Orders"), "publisher", "publisher-secret"))
    assert ok.code == ResponseCode.SUCCESS, ok.remark
    assert run(max_offsets(namesrv, "Orders")) == 4  # only the signed raw send was stored
    delete = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Orders"})
    assert_refused(remoting_call(broker, delete), "not signed")
    assert run(max_offsets(namesrv, "Orders")) == 4  # the topic is still there


def write_changed(path: Path, text: str) -> None:
    # write a new file and rename it in: the broker never reads half a file
    new = path.with_suffix(".new")
    new.write_text(text)
    new.replace(path)


def test_editing_the_file_grants_and_revokes_and_a_broken_file_keeps_the_old_rules(
        tidemq_cluster, tmp_path, remoting_call, wait_until):
    cluster, path = acl_cluster(tidemq_cluster, tmp_path)
    namesrv, broker = cluster.namesrv_addr, cluster.brokers[0]
    run(create_topic(namesrv, "Fresh", ADMIN))

    def publisher_send_code() -> int:
        response = remoting_call(broker.addr, signed(send_request("Fresh"), "publisher",
                                                     "publisher-secret"))
        return response.code

    assert publisher_send_code() == ResponseCode.NO_PERMISSION
    write_changed(path, ACL_YAML.replace("- Orders=PUB\n", "- Orders=PUB\n      - Fresh=PUB\n"))
    wait_until(lambda: publisher_send_code() == ResponseCode.SUCCESS, WAIT_S,
               what="the grant to take effect")
    write_changed(path, ACL_YAML)
    wait_until(lambda: publisher_send_code() == ResponseCode.NO_PERMISSION, WAIT_S,
               what="the revocation to take effect")
    # a white-listed address passes unsigned
    assert remoting_call(broker.addr, send_request("Fresh")).code == ResponseCode.NO_PERMISSION
    write_changed(path, ACL_YAML.replace("globalWhiteRemoteAddresses:\n",
                                         "globalWhiteRemoteAddresses: [127.0.0.*]\n"))
    wait_until(lambda: remoting_call(broker.addr, send_request("Fresh")).code
               == ResponseCode.SUCCESS, WAIT_S, what="the white list to take effect")
    # a broken file: logged, the white list stays in force
    write_changed(path, "accounts: [\n  - accessKey: broken\n")
    wait_until(lambda: "previous rules stay in force" in broker.log_tail(200), WAIT_S,
               what="the broker to report the broken file")
    assert remoting_call(broker.addr, send_request("Fresh")).code == ResponseCode.SUCCESS
    assert publisher_send_code() == ResponseCode.SUCCESS


def test_acl_enable_with_a_missing_file_refuses_to_start(tmp_path):
    missing = tmp_path / "nowhere" / "plain_acl.yml"
    for kind in ("broker", "namesrv"):
        result = subprocess.run(
            [sys.executable, "-m", "tidemq", kind, "--aclEnable", "true", "--aclFilePath",
             str(missing), "--listenPort", "0", *(("--storePathRootDir", str(tmp_path / "s"))
                                                  if kind == "broker" else ())],
            cwd=tmp_path, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 2, result.stderr
        assert f"ACL file {missing} does not exist" in result.stderr
        assert "Traceback" not in result.stderr


def test_name_server_write_operations_need_an_admin_account(tidemq_cluster, tmp_path,
                                                             remoting_call):
    cluster, _ = acl_cluster(tidemq_cluster, tmp_path, namesrv_acl=True)
    namesrv = cluster.namesrvs[0].addr
    put = RemotingCommand.request(RequestCode.PUT_KV_CONFIG,
                                  {"namespace": "ns", "key": "k", "value": "v"})
    assert_refused(remoting_call(namesrv, put), "not signed")
    put = RemotingCommand.request(RequestCode.PUT_KV_CONFIG,
                                  {"namespace": "ns", "key": "k", "value": "v"})
    assert_refused(remoting_call(namesrv, signed(put, "consumer", "consumer-secret")),
                   "needs an admin account")
    put = RemotingCommand.request(RequestCode.PUT_KV_CONFIG,
                                  {"namespace": "ns", "key": "k", "value": "v"})
    assert remoting_call(namesrv, signed(put, "operator", "operator-secret")).code == 0
    route = RemotingCommand.request(RequestCode.GET_KV_CONFIG, {"namespace": "ns", "key": "k"})
    answer = remoting_call(namesrv, route)  # reads stay open, unsigned
    assert answer.code == ResponseCode.SUCCESS and answer.ext_fields["value"] == "v"

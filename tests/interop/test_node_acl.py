"""The Node.js clients signing their requests against a tidemq broker with aclEnable=true:
ali-ons 3.12.0 (its accessKey / secretKey options) and rocketmq-nodejs 1.1.2 (the C++ 2.x
core's setSessionCredentials). Right credentials produce and consume; a wrong secret key is
refused and stores nothing."""

from __future__ import annotations

import json

import pytest
from test_cpp_acl import ACL_YAML, ADMIN, READER
from test_node_clients import CLIENTS, SEND_OK, expected_bodies, node_clients_installed  # noqa: F401
from tidemq_side import create_topic, produce, read_back

from tidemq.client import Message

pytestmark = pytest.mark.interop

NODE_ACL_YAML = ACL_YAML.replace("topicPerms: [CppSigned=PUB, TBW102=PUB]",
                                 "topicPerms: [NodeSigned_ons=PUB, NodeSigned_cpp2=PUB]")


@pytest.fixture
def acl_cluster(tidemq_cluster, tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(NODE_ACL_YAML)
    return tidemq_cluster(broker_overrides={"aclEnable": "true", "aclFilePath": str(path)})


@pytest.mark.parametrize("client", CLIENTS)
def test_node_client_with_credentials_is_accepted_and_wrong_ones_are_refused(
        client, acl_cluster, node_client, wait_until):
    topic, count = f"NodeSigned_{client}", 10
    create_topic(acl_cluster, topic, credentials=ADMIN)
    namesrv = acl_cluster.namesrv_addr
    result = node_client(client, "producer", "produce", "--namesrv", namesrv, "--topic", topic,
                         "--count", str(count), "--access-key", "cpp-producer",
                         "--secret-key", "cpp-producer-secret").result()
    assert [send["status"] for send in result["sends"]] == [SEND_OK[client]] * count
    assert sorted(m.body.decode() for m in read_back(namesrv, topic, credentials=READER)) == (
        expected_bodies(range(count)))

    process = node_client(client, "wrong", "produce", "--namesrv", namesrv, "--topic", topic,
                          "--count", "1", "--access-key", "cpp-producer",
                          "--secret-key", "not-the-secret", timeout_s=90)
    # The C++ 2.x core may crash while the process exits after a failed send (SIGSEGV in its
    # shutdown), so the result document it wrote before exiting is what counts.
    wait_until(lambda: process.out_path.exists(), 120, what="the wrong client's result")
    wrong = json.loads(process.out_path.read_text())
    process.kill()
    assert wrong["ok"] is False and wrong["sends"] == [], wrong
    if client == "cpp2":  # ali-ons reports only that the send failed, not the broker's remark
        assert "[ACL]" in wrong["error"] and "does not match" in wrong["error"]
    assert len(read_back(namesrv, topic, credentials=READER)) == count


@pytest.mark.parametrize("client", CLIENTS)
def test_node_push_consumer_with_credentials_gets_what_was_sent(client, acl_cluster,
                                                               node_client):
    topic, count = f"NodeSignedPush_{client}", 20
    create_topic(acl_cluster, topic, credentials=ADMIN)
    namesrv = acl_cluster.namesrv_addr
    consumer = node_client(client, "consumer", "consume", "--namesrv", namesrv, "--topic", topic,
                           "--group", f"node_acl_{client}", "--expect", str(count),
                           "--access-key", "cpp-consumer", "--secret-key", "cpp-consumer-secret")
    consumer.wait_for_output("CONSUMER STARTED")
    produce(namesrv, [Message(topic, f"msg-{i}") for i in range(count)], credentials=ADMIN)
    received = consumer.result()["received"]
    assert sorted(record["body"] for record in received) == expected_bodies(range(count))

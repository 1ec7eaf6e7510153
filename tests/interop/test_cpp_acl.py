"""The Apache C++ client 1.x (PyPI ``rocketmq`` 0.4.4) signing its requests (its
``set_session_credentials``) against a tidemq broker with aclEnable=true: right credentials
are accepted for producing and push-consuming, wrong ones are refused and store nothing."""

from __future__ import annotations

import pytest
from test_cpp_client import SEND_OK
from tidemq_side import create_topic, produce, read_back

from tidemq.client import Credentials, Message

pytestmark = pytest.mark.interop

ADMIN = Credentials("operator", "operator-secret")
READER = Credentials("reader1", "reader-secret")
ACL_YAML = """\
accounts:
  - accessKey: operator
    secretKey: operator-secret
    admin: true
  - accessKey: cpp-producer
    secretKey: cpp-producer-secret
    defaultTopicPerm: DENY
    topicPerms: [CppSigned=PUB, TBW102=PUB]
  - accessKey: cpp-consumer
    secretKey: cpp-consumer-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
  - accessKey: reader1
    secretKey: reader-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
"""


@pytest.fixture
def acl_cluster(tidemq_cluster, tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YAML)
    return tidemq_cluster(broker_overrides={"aclEnable": "true", "aclFilePath": str(path)})


def test_cpp_producer_with_credentials_is_accepted_and_wrong_ones_are_refused(
        acl_cluster, cpp_client):
    topic = "CppSigned"
    create_topic(acl_cluster, topic, credentials=ADMIN)
    namesrv = acl_cluster.namesrv_addr
    result = cpp_client("signed", "produce", "--namesrv", namesrv, "--topic", topic,
                        "--count", "10", "--batch", "5", "--access-key", "cpp-producer",
                        "--secret-key", "cpp-producer-secret").result()
    assert [send["status"] for send in result["sends"]] == [SEND_OK] * 10, result
    assert result["batch"]["status"] == SEND_OK
    assert len(read_back(namesrv, topic, credentials=READER)) == 15

    wrong = cpp_client("wrong", "produce", "--namesrv", namesrv, "--topic", topic,
                       "--count", "1", "--access-key", "cpp-producer",
                       "--secret-key", "not-the-secret", timeout_s=90)
    outcome = wrong.result(expect_status=2)
    assert "error" in outcome, outcome
    assert outcome["sends"] == []
    assert len(read_back(namesrv, topic, credentials=READER)) == 15  # nothing more stored


def test_cpp_push_consumer_with_credentials_gets_what_was_sent(acl_cluster, cpp_client):
    topic, count = "CppSignedPush", 30
    create_topic(acl_cluster, topic, credentials=ADMIN)
    namesrv = acl_cluster.namesrv_addr
    consumer = cpp_client("consumer", "consume", "--namesrv", namesrv, "--topic", topic,
                          "--group", "cpp_acl_group", "--expect", str(count),
                          "--access-key", "cpp-consumer", "--secret-key", "cpp-consumer-secret")
    consumer.wait_for_output("CONSUMER STARTED")
    produce(namesrv, [Message(topic, f"msg-{i}") for i in range(count)], credentials=ADMIN)
    received = consumer.result()["received"]
    assert sorted(record["body"] for record in received) == sorted(
        f"msg-{i}" for i in range(count))

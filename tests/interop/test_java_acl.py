"""The official RocketMQ Java client 4.9.8 signing with ``AclClientRPCHook`` against a tidemq
broker with aclEnable=true: a producer and a push consumer with their own keys work, a
forged signature is refused with NO_PERMISSION and stores nothing (Java group ``acl``; the
Java side checks each step)."""

from __future__ import annotations

import json

import pytest
from client_process import ClientProcess

from java_runtime import client_command

pytestmark = pytest.mark.interop

TIMEOUT_S = 90.0
ACL_YAML = """\
accounts:
  - accessKey: operator
    secretKey: operator-secret
    admin: true
  - accessKey: java-producer
    secretKey: java-producer-secret
    defaultTopicPerm: DENY
    topicPerms: [JavaSigned=PUB, TBW102=PUB]
  - accessKey: java-consumer
    secretKey: java-consumer-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
"""


def test_java_client_signs_with_acl_client_rpc_hook(tidemq_cluster, tmp_path):
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL_YAML)
    cluster = tidemq_cluster(broker_overrides={"aclEnable": "true",
                                               "aclFilePath": str(acl_file)})
    folder = tmp_path / "java-acl"
    folder.mkdir()
    process = ClientProcess("Java client acl", folder,
                            client_command(["acl", "--namesrv", cluster.namesrv_addr], folder),
                            TIMEOUT_S)
    try:
        document = process.start().result()
    finally:
        process.kill()
    outcome = document["scenarios"]["acl_signed_and_refused"]
    assert outcome["ok"], (f"the Java client failed:\n{outcome['error']}\n"
                           f"{json.dumps(outcome['observed'])}\n{process.report()}\n"
                           f"{cluster.brokers[0].log_tail()}")
    assert "refusal" in outcome["observed"], outcome["observed"]

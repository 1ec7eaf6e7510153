"""The ACL administration verbs of ``tidemq admin`` against a real broker with aclEnable=true:
accounts created, changed and deleted and the global white list replaced through the
broker, persisted to plain_acl.yml, in force at once; only an admin account may do it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_acl import ACL_YAML, acl_cluster, create_topic, send_request, signed

from tidemq.acl import load_acl_file
from tidemq.client import Credentials
from tidemq.protocol.codes import ResponseCode
from tidemq.remoting.loop import run

pytestmark = pytest.mark.integration

ADMIN_KEYS = ("--accessKey", "operator", "--secretKey", "operator-secret")


def tidemq_admin(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tidemq", "admin", *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})})


def test_acl_verbs_change_the_rules_in_force_and_in_the_file(tidemq_cluster, tmp_path,
                                                            remoting_call):
    cluster, path = acl_cluster(tidemq_cluster, tmp_path, ACL_YAML)
    namesrv, broker = cluster.namesrv_addr, cluster.brokers[0].addr
    run(create_topic(namesrv, "Orders", Credentials("operator", "operator-secret")))

    def send_as(access_key: str, secret_key: str) -> int:
        return remoting_call(broker, signed(send_request("Orders"), access_key, secret_key)).code

    assert send_as("newcomer", "newcomer-secret") == ResponseCode.NO_PERMISSION
    created = tidemq_admin(*ADMIN_KEYS, "updateAclConfig", "-n", namesrv, "-a", "newcomer",
                           "-s", "newcomer-secret", "-t", "Orders=PUB", "-i", "DENY")
    assert created.returncode == 0, created.stderr
    assert f"ACL account newcomer created or updated on {broker}" in created.stdout
    assert send_as("newcomer", "newcomer-secret") == ResponseCode.SUCCESS
    assert "newcomer" in load_acl_file(path).accounts

    # a non-admin account may not; the keys may come from the environment too
    refused = tidemq_admin("updateAclConfig", "-n", namesrv, "-a", "sneaky01", "-s", "sneaky-01",
                           env={"TIDEMQ_ACCESS_KEY": "consumer",
                                "TIDEMQ_SECRET_KEY": "consumer-secret"})
    assert refused.returncode == 1
    assert "UPDATE_AND_CREATE_ACL_CONFIG" in refused.stderr and "needs an admin" in refused.stderr
    assert "sneaky01" not in load_acl_file(path).accounts

    versions = tidemq_admin(*ADMIN_KEYS, "clusterAclConfigVersion", "-n", namesrv, "--json")
    assert versions.returncode == 0, versions.stderr
    (version,) = json.loads(versions.stdout)
    assert version["brokerName"] == "broker-a" and version["counter"] == 1

    shown = tidemq_admin(*ADMIN_KEYS, "getAclConfig", "-n", namesrv, "--json")
    assert shown.returncode == 0, shown.stderr
    accounts = {a["accessKey"]: a for a in json.loads(shown.stdout)[broker]["accounts"]}
    assert accounts["newcomer"]["topicPerms"] == ["Orders=PUB"]
    assert accounts["newcomer"]["secretKey"] == "******"  # never printed unless asked
    assert "newcomer-secret" not in shown.stdout

    deleted = tidemq_admin(*ADMIN_KEYS, "deleteAclConfig", "-n", namesrv, "-a", "newcomer")
    assert deleted.returncode == 0, deleted.stderr
    assert send_as("newcomer", "newcomer-secret") == ResponseCode.NO_PERMISSION
    assert "newcomer" not in load_acl_file(path).accounts

    assert remoting_call(broker, send_request("Orders")).code == ResponseCode.NO_PERMISSION
    white = tidemq_admin(*ADMIN_KEYS, "updateGlobalWhiteAddr", "-n", namesrv, "-g", "127.0.0.1")
    assert white.returncode == 0, white.stderr
    assert remoting_call(broker, send_request("Orders")).code == ResponseCode.SUCCESS
    assert [p.text for p in load_acl_file(path).global_white] == ["127.0.0.1"]
    assert load_acl_file(path).data_version_counter == 3

"""plain_acl.yml: loading, refusing broken files, hot reload that keeps the old rules on a
broken file, and changes by request written back atomically."""

from __future__ import annotations

import logging
import os

import pytest
from acl_helpers import ACL_YAML, write_acl

from tidemq.acl import AclFileError, AclService, load_acl_file
from tidemq.acl.permission import Perm


def test_rocketmq_shipped_file_loads(tmp_path):
    path = write_acl(tmp_path, """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
""")
    rules = load_acl_file(path)
    account = rules.accounts["RocketMQ"]
    assert account.secret_key == "12345678"
    assert account.resource_perms["topicB"] == Perm.PUB | Perm.SUB
    assert account.resource_perms["%RETRY%groupA"] == Perm.DENY
    assert account.default_group_perm == Perm.SUB
    assert rules.accounts["rocketmq2"].admin
    assert len(rules.global_white) == 2


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("accounts:\n  - accessKey: short\n    secretKey: 12345678\n", "longer than 6"),
        ("accounts:\n  - accessKey: abcdefgh\n", "secretKey is missing"),
        ("accounts:\n  - accessKey: abcdefgh\n    secretKey: 12345678\n"
         "    topicPerms: [a=PUBSUB]\n", "'a=PUBSUB'"),
        ("accounts:\n  - accessKey: abcdefgh\n    secretKey: 12345678\n"
         "    defaultTopicPerm: ALL\n", "defaultTopicPerm='ALL'"),
        ("globalWhiteRemoteAddresses: [10.0.0]\n", "10.0.0"),
        ("accounts:\n  - {accessKey: abcdefgh, secretKey: 12345678}\n"
         "  - {accessKey: abcdefgh, secretKey: 87654321}\n", "defined twice"),
        ("accounts: [\n", "not valid YAML"),
        ("- just a list\n", "at the top"),
    ],
)
def test_broken_files_are_refused_naming_the_problem(tmp_path, text, complaint):
    with pytest.raises(AclFileError, match=r"plain_acl\.yml") as caught:
        load_acl_file(write_acl(tmp_path, text))
    assert complaint in str(caught.value)


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(AclFileError, match="does not exist"):
        AclService(tmp_path / "nope.yml")


def _touch_changed(path, text):
    before = os.stat(path).st_mtime_ns
    path.write_text(text)
    # A file system with coarse timestamps could give the same mtime: move it on.
    if os.stat(path).st_mtime_ns == before:
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def test_reload_grants_and_revokes_and_a_broken_file_keeps_the_old_rules(tmp_path, caplog):
    path = write_acl(tmp_path)
    service = AclService(path)
    assert "newcomer" not in service.rules.accounts
    _touch_changed(path, ACL_YAML + "  - {accessKey: newcomer, secretKey: new-secret}\n")
    assert service.reload_if_changed()
    assert "newcomer" in service.rules.accounts
    with caplog.at_level(logging.WARNING, logger="tidemq.acl"):
        _touch_changed(path, "accounts: [\n")
        assert not service.reload_if_changed()
        assert not service.reload_if_changed()  # logged once per change, not per poll
    warnings = [r for r in caplog.records if "previous rules stay in force" in r.message]
    assert len(warnings) == 1 and "not valid YAML" in warnings[0].message
    assert "newcomer" in service.rules.accounts
    _touch_changed(path, ACL_YAML)
    assert service.reload_if_changed()
    assert "newcomer" not in service.rules.accounts


def test_changes_by_request_are_written_back_and_survive_a_reload(tmp_path):
    path = write_acl(tmp_path)
    service = AclService(path)
    service.update_account({"accessKey": "newcomer", "secretKey": "new-secret",
                            "defaultTopicPerm": "PUB", "topicPerms": ["Orders=SUB"]})
    assert service.rules.accounts["newcomer"].resource_perms["Orders"] == Perm.SUB
    assert service.rules.data_version_counter == 1
    service.update_account({"accessKey": "newcomer", "admin": True})
    reloaded = load_acl_file(path)
    assert reloaded.accounts["newcomer"].admin
    assert reloaded.accounts["newcomer"].default_topic_perm == Perm.PUB
    assert reloaded.data_version_counter == 2
    with pytest.raises(AclFileError, match="longer than 6"):
        service.update_account({"accessKey": "tiny", "secretKey": "new-secret"})
    assert service.delete_account("newcomer")
    assert not service.delete_account("newcomer")
    service.update_global_white(["10.0.0.*", " 10.0.1.1 "])
    reloaded = load_acl_file(path)
    assert "newcomer" not in reloaded.accounts
    assert [p.text for p in reloaded.global_white] == ["10.0.0.*", "10.0.1.1"]
    with pytest.raises(AclFileError, match="address pattern"):
        service.update_global_white(["10.0.0"])
    assert [p.text for p in load_acl_file(path).global_white] == ["10.0.0.*", "10.0.1.1"]
    assert not list(tmp_path.glob(".*.tmp"))

"""The aclEnable / aclFilePath / tls* keys of the broker and name server configs: RocketMQ's
tls.server.* names accepted, contradictions refused at load naming the key."""

from __future__ import annotations

import pytest

from tidemq.acl.acl_file import default_acl_file
from tidemq.broker.config import BrokerConfig
from tidemq.config_loader import load_config
from tidemq.errors import ConfigError
from tidemq.namesrv.config import NamesrvConfig
from tidemq.remoting.tls import TlsMode
from tidemq.store.config import StoreConfig


@pytest.mark.parametrize("targets", [[NamesrvConfig], [BrokerConfig, StoreConfig]])
def test_rocketmq_tls_names_are_accepted_and_checked(targets, pki, tmp_path):
    config = load_config(targets, None, {
        "tls.enable": "true", "tls.server.mode": "enforcing",
        "tls.server.certPath": str(pki.server_cert), "tls.server.keyPath": str(pki.server_key),
        "tls.server.needClientAuth": "require", "tls.server.trustCertPath": str(pki.ca_cert),
        "aclEnable": "true", "aclFilePath": str(tmp_path / "acl.yml")})[0]
    tls = config.server_tls()
    assert tls.mode is TlsMode.ENFORCING and tls.context is not None
    assert config.acl_enable and config.acl_file_path == str(tmp_path / "acl.yml")


@pytest.mark.parametrize(("settings", "complaint"), [
    ({"tlsServerMode": "enforcing"}, "tlsEnable=false"),
    ({"tlsEnable": "true"}, "tlsServerCertPath"),
    ({"tlsEnable": "true", "tlsServerMode": "disabled"}, "tlsServerMode=disabled"),
    ({"tlsEnable": "true", "tlsServerCertPath": "/nope.pem", "tlsServerKeyPath": "/nope.key"},
     "tlsServerCertPath=/nope.pem"),
    ({"tlsServerMode": "strict"}, "tlsServerMode"),
])
def test_contradictions_and_missing_files_fail_at_load(settings, complaint):
    with pytest.raises(ConfigError, match=complaint):
        load_config([BrokerConfig, StoreConfig], None, settings)


def test_default_acl_file_follows_rocketmq_home_then_the_config_file(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCKETMQ_HOME", str(tmp_path / "home"))
    assert default_acl_file(tmp_path / "etc" / "broker.conf") == (
        tmp_path / "home" / "conf" / "plain_acl.yml")
    monkeypatch.delenv("ROCKETMQ_HOME")
    assert default_acl_file(tmp_path / "etc" / "broker.conf") == (
        tmp_path / "etc" / "plain_acl.yml")
    assert str(default_acl_file(None)) == "conf/plain_acl.yml"

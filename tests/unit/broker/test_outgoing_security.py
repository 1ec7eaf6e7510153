"""The keys of a broker's own connections (BrokerSecurityConfig, broker/outgoing.py): when it
connects with TLS, what it verifies, how it signs, and that no secret leaves by
GET_BROKER_CONFIG or GET_NAMESRV_CONFIG."""

from __future__ import annotations

import ssl

import pytest

from tidemq.broker.config import BrokerConfig, config_properties
from tidemq.broker.outgoing import outgoing_security
from tidemq.config_loader import current_properties, load_config
from tidemq.errors import ConfigError
from tidemq.namesrv.config import NamesrvConfig
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.signature import Signer, signed_head
from tidemq.store.config import StoreConfig

CREDENTIALS = '{"accessKey": "replicator", "secretKey": "replicator-secret"}'


def broker(settings: dict[str, str]) -> BrokerConfig:
    return load_config([BrokerConfig, StoreConfig], None, settings)[0]


def server_keys(pki, mode: str) -> dict[str, str]:
    return {"tlsEnable": "true", "tlsServerMode": mode, "tlsServerCertPath": str(pki.server_cert),
            "tlsServerKeyPath": str(pki.server_key)}


def test_tls_out_follows_rocketmqs_rule_unless_told(pki):
    assert not broker({}).tls_client_on
    assert not broker(server_keys(pki, "permissive")).tls_client_on
    assert broker(server_keys(pki, "enforcing")).tls_client_on
    assert not broker(server_keys(pki, "enforcing") | {"tlsClientEnable": "false"}).tls_client_on
    assert broker({"tlsClientEnable": "true"}).tls_client_on
    assert outgoing_security(broker({})).tls is None


def test_the_outgoing_context_verifies_by_the_trust_file_and_presents_a_certificate(pki):
    config = broker({"tlsClientEnable": "true", "tls.client.trustCertPath": str(pki.ca_cert),
                     "tls.client.certPath": str(pki.client_cert),
                     "tls.client.keyPath": str(pki.client_key)})
    context = outgoing_security(config).tls
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    lax = outgoing_security(broker({"tlsClientEnable": "true",
                                    "tlsClientAuthServer": "false"})).tls
    assert lax is not None and lax.verify_mode is ssl.CERT_NONE


@pytest.mark.parametrize(("settings", "complaint"), [
    ({"tlsClientTrustCertPath": "/nope.pem"}, "tlsClientTrustCertPath=/nope.pem"),
    ({"tlsClientKeyPath": "/k.pem"}, "without tlsClientCertPath"),
    ({"innerClientAuthenticationCredentials": "replicator:s3cret-value"},
     "innerClientAuthenticationCredentials is not a JSON object"),
    ({"innerClientAuthenticationCredentials": '{"accessKey": "a", "secretKey": ""}'},
     "non-empty"),
])
def test_bad_outgoing_settings_fail_at_load_naming_the_key(settings, complaint):
    with pytest.raises(ConfigError, match=complaint) as refused:
        broker(settings)
    assert "s3cret-value" not in str(refused.value)


def test_inner_credentials_sign_every_request_the_broker_sends():
    hook = outgoing_security(
        broker({"innerClientAuthenticationCredentials": CREDENTIALS})).request_hook
    assert hook is not None
    request = RemotingCommand.request(201, {"topic": "T"}, b"body")
    hook(request)
    fields = request.ext_fields
    assert fields["AccessKey"] == "replicator"
    assert fields["Signature"] == Signer("replicator-secret").sign(signed_head(fields), b"body")
    assert outgoing_security(broker({})).request_hook is None


def test_secrets_are_masked_in_the_config_a_server_shows(pki):
    config = broker(server_keys(pki, "permissive") | {
        "tlsServerKeyPassword": "kp-secret", "tlsClientKeyPassword": "ckp-secret",
        "innerClientAuthenticationCredentials": CREDENTIALS})
    shown = config_properties(config)
    text = repr(shown) + repr(config)
    for secret in ("kp-secret", "ckp-secret", "replicator-secret"):
        assert secret not in text
    assert shown["tlsServerKeyPassword"] == "******"
    assert shown["innerClientAuthenticationCredentials"] == "******"
    assert shown["tlsClientKeyPath"] == ""
    namesrv = load_config([NamesrvConfig], None, server_keys(pki, "permissive") | {
        "tlsServerKeyPassword": "kp-secret"})[0]
    assert current_properties(namesrv)["tlsServerKeyPassword"] == "******"


def test_a_role_switch_keeps_the_ha_port_and_the_copy_secured(pki):
    """Either configured role gets both settings: a slave promoted listens on an enforcing
    HA port, a master demoted copies over TLS, signing (broker/role.py switches roles)."""
    import asyncio

    from tidemq.broker.config import BrokerRole
    from tidemq.broker.parts import _replication
    from tidemq.remoting.tls import TlsMode
    from tidemq.store.memory_store import MemoryMessageStore

    secured = server_keys(pki, "enforcing") | {
        "tlsClientTrustCertPath": str(pki.ca_cert),
        "innerClientAuthenticationCredentials": CREDENTIALS}

    async def main() -> None:
        slave_config = broker(secured | {"brokerRole": "SLAVE", "brokerId": "1"})
        promoted = _replication(slave_config, StoreConfig(), MemoryMessageStore(StoreConfig()))
        await promoted.run_as_master(BrokerRole.SYNC_MASTER)
        assert promoted.service is not None and promoted.service.tls.mode is TlsMode.ENFORCING

        master_config = broker(secured | {"brokerRole": "ASYNC_MASTER"})
        demoted = _replication(master_config, StoreConfig(), MemoryMessageStore(StoreConfig()))
        await demoted.run_as_slave("127.0.0.1:1", "127.0.0.1:2", lambda _truncation: None)
        assert demoted.client is not None and demoted.client._tls is not None
        check_client = demoted._remoting_client()
        assert check_client.request_hook is not None
        await demoted.stop()
        await promoted.stop()

    asyncio.run(main())

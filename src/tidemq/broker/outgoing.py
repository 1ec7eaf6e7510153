"""OutgoingSecurity: how a broker's own connections are secured, made once from its config.

The broker's remoting client (name-server registration, a slave's table sync and master
check) and a slave's HA connection all take their TLS context and request signing from
here, so every connection a broker opens follows the same keys (``BrokerSecurityConfig``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from tidemq.broker.security_config import BrokerSecurityConfig
from tidemq.errors import ConfigError
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.signature import Signer, sign_ext_fields
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.connection import RequestHook
from tidemq.remoting.tls import client_context


@dataclass(frozen=True, slots=True)
class OutgoingSecurity:
    """The TLS context (None: plain TCP) and the request hook (None: unsigned) of a broker's
    outgoing connections."""

    tls: ssl.SSLContext | None = None
    request_hook: RequestHook | None = None

    def remoting_client(self) -> RemotingClient:
        """A remoting client whose every connection and request follows these settings."""
        return RemotingClient(tls=self.tls, request_hook=self.request_hook)


PLAIN_UNSIGNED = OutgoingSecurity()


def outgoing_security(config: BrokerSecurityConfig) -> OutgoingSecurity:
    """The settings ``config``'s tlsClient* keys and innerClientAuthenticationCredentials ask
    for.

    Raises:
        ConfigError: a certificate, key or CA file does not load; the message names the key.
    """
    tls = _tls_context(config) if config.tls_client_on else None
    credentials = config.inner_credentials
    hook = None
    if credentials is not None:
        hook = signing_hook(credentials.access_key, credentials.secret_key)
    return OutgoingSecurity(tls, hook)


def signing_hook(access_key: str, secret_key: str) -> RequestHook:
    """A request hook that signs every request as RocketMQ's ``AclClientRPCHook`` does."""
    signer = Signer(secret_key)

    def sign(command: RemotingCommand) -> None:
        # A copy: callers may share one extFields template between requests.
        fields = dict(command.ext_fields) if command.ext_fields else {}
        sign_ext_fields(fields, command.body, access_key, signer)
        command.ext_fields = fields

    return sign


def _tls_context(config: BrokerSecurityConfig) -> ssl.SSLContext:
    try:
        return client_context(
            ca_file=config.tls_client_trust_cert_path,
            cert_file=config.tls_client_cert_path,
            key_file=config.tls_client_key_path,
            key_password=config.tls_client_key_password,
            verify_server=config.tls_client_auth_server,
        )
    except ConfigError as exc:
        raise ConfigError(
            f"the broker's outgoing TLS (tlsClientTrustCertPath="
            f"{config.tls_client_trust_cert_path}, tlsClientCertPath="
            f"{config.tls_client_cert_path}, tlsClientKeyPath={config.tls_client_key_path}): "
            f"{exc}"
        ) from exc


def refusal_hint(response_code: int) -> str:
    """What to add to a broker's log line when a peer refused one of its own requests:
    the key that fixes an ACL refusal (empty for any other code)."""
    if response_code != ResponseCode.NO_PERMISSION:
        return ""
    return (" (this broker signs its own requests with innerClientAuthenticationCredentials: "
            "give it an account of the other broker's ACL file)")

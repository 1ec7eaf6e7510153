"""BrokerSecurityConfig: the server security keys plus those of a broker's outgoing connections.

A broker is a client too: it registers with the name servers, a slave asks its master for
its tables (slave_sync.py) and checks it (ha/master_check.py) over the remoting port, and it
copies its master's commit log over the HA port. These keys say how those connections are
secured (docs/security.md, "Brokers' own connections"):

- TLS: RocketMQ's ``tls.client.*`` settings under tidemq's camel-case names. Whether the
  broker connects with TLS at all is ``tlsClientEnable``; unset, it follows RocketMQ's rule
  (TLS out exactly when the broker's own port is ``enforcing``). RocketMQ calls that switch
  ``tls.enable``, a name tidemq already gives to its server-side ``tlsEnable``.
- ACL: ``innerClientAuthenticationCredentials`` (RocketMQ 5's key and JSON form,
  ``{"accessKey": "...", "secretKey": "..."}``) signs every request the broker sends, so a
  slave of an ACL-enabled master needs an account rather than a white-listed address.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tidemq.errors import ConfigError
from tidemq.remoting.tls import TlsMode
from tidemq.server_security import ServerSecurityConfig


@dataclass(frozen=True, slots=True)
class InnerCredentials:
    """The account a broker signs its own requests with; the secret is never shown."""

    access_key: str
    secret_key: str = field(repr=False)


def parse_inner_credentials(text: str | None) -> InnerCredentials | None:
    """``innerClientAuthenticationCredentials`` as credentials (None when unset).

    Raises:
        ConfigError: not a JSON object with non-empty ``accessKey`` and ``secretKey``; the
            message never repeats the value (it holds a secret).
    """
    if text is None or not text.strip():
        return None
    problem = ("innerClientAuthenticationCredentials is not a JSON object with non-empty "
               "\"accessKey\" and \"secretKey\" strings (e.g. "
               "{\"accessKey\":\"broker-a\",\"secretKey\":\"...\"}); the value is not shown "
               "because it holds a secret")
    try:
        document = json.loads(text)
    except ValueError:
        raise ConfigError(problem) from None
    if not isinstance(document, dict):
        raise ConfigError(problem)
    access_key, secret_key = document.get("accessKey"), document.get("secretKey")
    if not (isinstance(access_key, str) and access_key and isinstance(secret_key, str)
            and secret_key):
        raise ConfigError(problem)
    return InnerCredentials(access_key, secret_key)


@dataclass(slots=True)
class BrokerSecurityConfig(ServerSecurityConfig):
    """``ServerSecurityConfig`` plus the keys of the broker's outgoing connections (module
    docstring)."""

    # Connect to name servers, to the master's remoting port and to its HA port with TLS.
    # Unset: on exactly when tlsServerMode is enforcing (RocketMQ's rule).
    tls_client_enable: bool | None = field(default=None, metadata={"key": "tlsClientEnable"})
    # Verify the certificate of every server the broker connects to (against
    # tlsClientTrustCertPath, else the system's CAs) and that it names the host or IP
    # connected to. RocketMQ's tls.client.authServer defaults to false; tidemq verifies.
    tls_client_auth_server: bool = field(default=True, metadata={
        "key": "tlsClientAuthServer", "aliases": ("tls.client.authServer",)})
    # PEM CA certificates the servers' certificates must chain to (unset: the system's CAs).
    tls_client_trust_cert_path: str | None = field(default=None, metadata={
        "key": "tlsClientTrustCertPath", "aliases": ("tls.client.trustCertPath",)})
    # PEM certificate the broker presents to servers that require one (mutual TLS).
    tls_client_cert_path: str | None = field(default=None, metadata={
        "key": "tlsClientCertPath", "aliases": ("tls.client.certPath",)})
    # PEM private key of tlsClientCertPath (unset: in the same file).
    tls_client_key_path: str | None = field(default=None, metadata={
        "key": "tlsClientKeyPath", "aliases": ("tls.client.keyPath",)})
    # Password of an encrypted tlsClientKeyPath.
    tls_client_key_password: str | None = field(default=None, repr=False, metadata={
        "key": "tlsClientKeyPassword", "aliases": ("tls.client.keyPassword",),
        "secret": True})
    # JSON {"accessKey": ..., "secretKey": ...} of an ACL account every request the broker
    # sends is signed with (slave metadata sync, master checks, name-server registration).
    inner_client_authentication_credentials: str | None = field(
        default=None, repr=False, metadata={"key": "innerClientAuthenticationCredentials",
                                            "secret": True})

    def __post_init__(self) -> None:
        ServerSecurityConfig.__post_init__(self)
        parse_inner_credentials(self.inner_client_authentication_credentials)
        if self.tls_client_key_path and not self.tls_client_cert_path:
            raise ConfigError("tlsClientKeyPath is set without tlsClientCertPath: give the "
                              "client certificate too (or leave both out)")
        for path, key in ((self.tls_client_trust_cert_path, "tlsClientTrustCertPath"),
                          (self.tls_client_cert_path, "tlsClientCertPath"),
                          (self.tls_client_key_path, "tlsClientKeyPath")):
            if path and not Path(path).is_file():
                raise ConfigError(f"{key}={path}: no such file (give the PEM file's path)")

    @property
    def tls_client_on(self) -> bool:
        """Whether the broker's own connections use TLS (``tlsClientEnable`` or its default)."""
        if self.tls_client_enable is not None:
            return self.tls_client_enable
        return self.tls_enable and self.server_tls(load=False).mode is TlsMode.ENFORCING

    @property
    def inner_credentials(self) -> InnerCredentials | None:
        """The account the broker signs its own requests with (None: unsigned)."""
        return parse_inner_credentials(self.inner_client_authentication_credentials)

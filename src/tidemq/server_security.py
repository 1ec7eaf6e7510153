"""ServerSecurityConfig: the ACL and TLS keys the broker and the name server share.

Both servers read the same keys under RocketMQ's names (docs/security.md), so they are
declared once here and inherited by ``BrokerConfig`` and ``NamesrvConfig``; it sits beside
``tidemq.config_loader`` so both server packages may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tidemq.remoting.tls import ServerTls, server_tls_of


@dataclass(slots=True)
class ServerSecurityConfig:
    """aclEnable, aclFilePath and the tls* keys of one server's remoting port.

    What aclEnable checks differs by server: a broker checks every request, a name server
    its write operations (KV config, topic deletion, broker write permission), as RocketMQ.
    """

    # -- security (docs/security.md) -----------------------------------------------------------
    # RocketMQ's aclEnable: requests are checked against plain_acl.yml (acl/).
    acl_enable: bool = field(default=False, metadata={"key": "aclEnable"})
    # The ACL file. Unset: $ROCKETMQ_HOME/conf/plain_acl.yml (RocketMQ's place), else
    # plain_acl.yml beside the config file given with -c, else conf/plain_acl.yml under the
    # working directory.
    acl_file_path: str | None = field(default=None, metadata={"key": "aclFilePath"})
    # TLS on the remoting port (RocketMQ's tls.server.* settings, also accepted by those names).
    tls_enable: bool = field(default=False, metadata={"key": "tlsEnable",
                                                      "aliases": ("tls.enable",)})
    tls_server_mode: str | None = field(default=None, metadata={
        "key": "tlsServerMode", "aliases": ("tls.server.mode",),
        "choices": ("disabled", "permissive", "enforcing")})
    tls_server_cert_path: str | None = field(default=None, metadata={
        "key": "tlsServerCertPath", "aliases": ("tls.server.certPath",)})
    tls_server_key_path: str | None = field(default=None, metadata={
        "key": "tlsServerKeyPath", "aliases": ("tls.server.keyPath",)})
    tls_server_key_password: str | None = field(default=None, repr=False, metadata={
        "key": "tlsServerKeyPassword", "aliases": ("tls.server.keyPassword",), "secret": True})
    tls_server_need_client_auth: str | None = field(default=None, metadata={
        "key": "tlsServerNeedClientAuth", "aliases": ("tls.server.needClientAuth",),
        "choices": ("none", "optional", "require")})
    tls_server_trust_cert_path: str | None = field(default=None, metadata={
        "key": "tlsServerTrustCertPath", "aliases": ("tls.server.trustCertPath",)})

    def __post_init__(self) -> None:
        self.server_tls(load=False)  # validates the tls* keys

    def server_tls(self, *, load: bool = True) -> ServerTls:
        """The TLS mode and context of the remoting port (``tidemq.remoting.tls``).

        Raises:
            ConfigError: the tls* keys contradict each other or name files that do not load.
        """
        return server_tls_of(self, load=load)

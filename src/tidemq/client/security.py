"""What a client needs to talk to a secured tidemq (or RocketMQ): ACL credentials and TLS.

``Credentials`` sign every request the client sends, exactly as RocketMQ's
``AclClientRPCHook`` does (``tidemq.protocol.signature``): the access key and the optional
security token go into the request's extFields, then the HMAC-SHA1 signature over them,
the other header fields and the body. The secret key itself never leaves the process and is
never shown (``repr`` hides it).

``tls`` options of the clients take ``True`` (verify the server against the system's CAs),
an ``ssl.SSLContext`` (see ``tls_context`` for one made from a CA file and, for mutual TLS,
a client certificate), or None/False for plain TCP.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.signature import Signer, sign_ext_fields
from tidemq.remoting.connection import RequestHook
from tidemq.remoting.tls import client_context

# Environment variables ``tidemq admin`` and ``Credentials.from_env`` read.
ACCESS_KEY_ENV = "TIDEMQ_ACCESS_KEY"
SECRET_KEY_ENV = "TIDEMQ_SECRET_KEY"
SECURITY_TOKEN_ENV = "TIDEMQ_SECURITY_TOKEN"

TlsOption = bool | ssl.SSLContext | None


@dataclass(frozen=True)
class Credentials:
    """An ACL account's keys (RocketMQ's ``SessionCredentials``).

    Args:
        access_key: the account's ``accessKey`` in the broker's ``plain_acl.yml``.
        secret_key: its ``secretKey``; signs requests, never sent.
        security_token: sent and signed as ``SecurityToken`` when given.

    Raises:
        ValueError: a key is empty.
    """

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError(
                "credentials need both an access key and a secret key (the accessKey and "
                "secretKey of an account in the broker's ACL file)"
            )

    @classmethod
    def from_env(cls) -> Credentials | None:
        """Credentials from TIDEMQ_ACCESS_KEY / TIDEMQ_SECRET_KEY (/ TIDEMQ_SECURITY_TOKEN);
        None when neither key is set.

        Raises:
            ValueError: only one of the two keys is set.
        """
        access_key = os.environ.get(ACCESS_KEY_ENV)
        secret_key = os.environ.get(SECRET_KEY_ENV)
        if not access_key and not secret_key:
            return None
        if not access_key or not secret_key:
            raise ValueError(f"set both {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}, or neither")
        return cls(access_key, secret_key, os.environ.get(SECURITY_TOKEN_ENV) or None)

    def request_hook(self) -> RequestHook:
        """A remoting request hook that signs every request with these credentials."""
        signer = Signer(self.secret_key)
        access_key, token = self.access_key, self.security_token

        def sign(command: RemotingCommand) -> None:
            # A copy: callers may share one extFields template between requests.
            fields = dict(command.ext_fields) if command.ext_fields else {}
            sign_ext_fields(fields, command.body, access_key, signer, token)
            command.ext_fields = fields

        return sign


def tls_context(
    ca_file: str | Path | None = None,
    *,
    cert_file: str | Path | None = None,
    key_file: str | Path | None = None,
    verify_server: bool = True,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client TLS context for the ``tls`` option: the server verified against ``ca_file``
    (None: the system's CAs); ``cert_file``/``key_file`` for servers that require a client
    certificate. See ``tidemq.remoting.tls.client_context``.

    Raises:
        ConfigError: a file is missing or not PEM.
    """
    return client_context(ca_file=ca_file, cert_file=cert_file, key_file=key_file,
                          verify_server=verify_server, check_hostname=check_hostname)


def resolve_tls(tls: TlsOption) -> ssl.SSLContext | None:
    """The context a ``tls`` option stands for (module docstring)."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return client_context()
    if isinstance(tls, ssl.SSLContext):
        return tls
    raise TypeError(f"tls must be True, False, None or an ssl.SSLContext, not {tls!r}")

"""TLS for the remoting port, as RocketMQ offers it (``tls.server.mode``), with the stdlib ``ssl``.

Server modes (``TlsMode``):

- ``disabled``: plain TCP only (no certificate needed);
- ``permissive``: one port serves both. A TLS client's first byte is always 0x16 (the
  record type of a handshake), and a remoting frame's first byte is the top byte of its
  length, 0x00 for every frame under 16 MiB (``FRAME_SIZE_MAX``); so the server peeks at the
  first byte of each new connection and starts TLS only when it is 0x16. This is what
  RocketMQ's Netty ``HandshakeHandler`` does;
- ``enforcing``: TLS only; a plain client's first frame fails the handshake and that
  connection is closed (it never reaches a handler).

Client certificates (mutual TLS): ``need_client_auth`` ``none`` (not asked for),
``optional`` (verified when sent) or ``require`` (a client without a certificate signed by
``trust_cert_path`` is refused in the handshake) — RocketMQ's ``tls.server.needClientAuth``.

Clients: ``client_context`` builds the context a ``RemotingClient`` wraps its connections
in: the server is verified against a CA file (or the system's CAs), its host name or IP
checked unless told not to; a client certificate is sent when given.

Certificates and keys are PEM files; nothing here makes or stores keys.
"""

from __future__ import annotations

import enum
import ssl
from dataclasses import dataclass
from pathlib import Path

from tidemq.errors import ConfigError

# The first byte of a TLS record carrying a handshake (RFC 8446 §5.1, ContentType 22).
TLS_HANDSHAKE_FIRST_BYTE = 0x16

# How long a new connection may take to send its first byte (permissive mode) and to finish
# the TLS handshake. Netty's default SslHandler handshake timeout is 10 s.
TLS_HANDSHAKE_TIMEOUT_S = 10.0


class TlsMode(enum.StrEnum):
    """RocketMQ's ``TlsMode``: how the remoting port treats TLS."""

    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"


class ClientAuth(enum.StrEnum):
    """RocketMQ's ``tls.server.needClientAuth``: whether clients must show a certificate."""

    NONE = "none"
    OPTIONAL = "optional"
    REQUIRE = "require"


@dataclass(frozen=True, slots=True)
class ServerTls:
    """What a ``RemotingServer`` needs for TLS: the mode and, unless disabled, the context."""

    mode: TlsMode
    context: ssl.SSLContext | None = None

    @property
    def enabled(self) -> bool:
        """True when some connections are served with TLS."""
        return self.mode is not TlsMode.DISABLED


PLAIN = ServerTls(TlsMode.DISABLED)


def server_tls(
    *,
    enable: bool,
    mode: str | None,
    cert_path: Path | str | None,
    key_path: Path | str | None,
    key_password: str | None = None,
    need_client_auth: str | None = None,
    trust_cert_path: Path | str | None = None,
    load: bool = True,
) -> ServerTls:
    """The ``ServerTls`` a server's TLS settings ask for (the keys of docs/security.md).

    ``enable`` false gives plain TCP; then setting ``mode`` to anything but disabled is a
    mistake worth stopping for. With ``enable``, ``mode`` defaults to permissive (RocketMQ's
    default ``tls.server.mode``) and a certificate and key are required. ``load=False``
    checks the settings and that the files exist without building the context (a config's
    own validation); the result then has no context.

    Raises:
        ConfigError: a missing or contradictory setting, or files that do not load; the
            message names the key.
    """
    try:
        chosen = TlsMode(mode.strip().lower()) if mode else None
        auth = ClientAuth((need_client_auth or "none").strip().lower())
    except ValueError:
        raise ConfigError(
            f"tlsServerMode={mode} / tlsServerNeedClientAuth={need_client_auth}: expected "
            "disabled, permissive or enforcing / none, optional or require"
        ) from None
    if not enable:
        if chosen not in (None, TlsMode.DISABLED):
            raise ConfigError(
                f"tlsServerMode={chosen} but tlsEnable=false: set tlsEnable=true to serve TLS "
                "(or leave tlsServerMode out)"
            )
        return PLAIN
    if chosen is TlsMode.DISABLED:
        raise ConfigError("tlsEnable=true with tlsServerMode=disabled: choose permissive or "
                          "enforcing, or set tlsEnable=false")
    if not cert_path or not key_path:
        raise ConfigError("tlsEnable=true needs tlsServerCertPath and tlsServerKeyPath (the "
                          "server's PEM certificate chain and private key)")
    if not load:
        for path, key in ((cert_path, "tlsServerCertPath"), (key_path, "tlsServerKeyPath"),
                          (trust_cert_path, "tlsServerTrustCertPath")):
            if path and not Path(path).is_file():
                raise ConfigError(f"{key}={path}: no such file (give the PEM file's path)")
        if auth is not ClientAuth.NONE and not trust_cert_path:
            raise ConfigError(f"tlsServerNeedClientAuth={auth} needs tlsServerTrustCertPath")
        return ServerTls(chosen or TlsMode.PERMISSIVE)
    context = server_context(cert_path, key_path, key_password=key_password,
                             need_client_auth=auth, trust_cert_path=trust_cert_path)
    return ServerTls(chosen or TlsMode.PERMISSIVE, context)


def server_tls_of(config: object, *, load: bool = True) -> ServerTls:
    """``server_tls`` from a server config carrying the ``tls_*`` fields of the broker's and
    the name server's configs (tlsEnable, tlsServerMode, tlsServerCertPath, ...)."""
    return server_tls(
        enable=config.tls_enable,  # type: ignore[attr-defined]
        mode=config.tls_server_mode,  # type: ignore[attr-defined]
        cert_path=config.tls_server_cert_path,  # type: ignore[attr-defined]
        key_path=config.tls_server_key_path,  # type: ignore[attr-defined]
        key_password=config.tls_server_key_password,  # type: ignore[attr-defined]
        need_client_auth=config.tls_server_need_client_auth,  # type: ignore[attr-defined]
        trust_cert_path=config.tls_server_trust_cert_path,  # type: ignore[attr-defined]
        load=load,
    )


def server_context(
    cert_path: Path | str,
    key_path: Path | str,
    *,
    key_password: str | None = None,
    need_client_auth: ClientAuth = ClientAuth.NONE,
    trust_cert_path: Path | str | None = None,
) -> ssl.SSLContext:
    """A server-side TLS context from PEM files.

    Args:
        cert_path: the server's certificate chain (PEM).
        key_path: its private key (PEM), encrypted with ``key_password`` when given.
        need_client_auth: whether clients must present a certificate (module docstring).
        trust_cert_path: CA certificates client certificates are verified against; required
            unless ``need_client_auth`` is ``none``.

    Raises:
        ConfigError: a file is missing or unreadable, the key does not match the
            certificate, or client verification was asked for without a trust file; the
            message names the setting.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert_path, key_path, key_password, "tlsServerCertPath",
                "tlsServerKeyPath")
    if need_client_auth is ClientAuth.NONE:
        context.verify_mode = ssl.CERT_NONE
        return context
    if trust_cert_path is None:
        raise ConfigError(
            f"tlsServerNeedClientAuth={need_client_auth} needs tlsServerTrustCertPath: the CA "
            "file client certificates are verified against"
        )
    _load_trust(context, trust_cert_path, "tlsServerTrustCertPath")
    context.verify_mode = (
        ssl.CERT_REQUIRED if need_client_auth is ClientAuth.REQUIRE else ssl.CERT_OPTIONAL
    )
    return context


def client_context(
    *,
    ca_file: Path | str | None = None,
    cert_file: Path | str | None = None,
    key_file: Path | str | None = None,
    key_password: str | None = None,
    verify_server: bool = True,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client-side TLS context.

    Args:
        ca_file: CA certificates (PEM) the server's certificate must chain to; None uses the
            system's default CAs.
        cert_file: a client certificate (PEM) to present, for servers that require one.
        key_file: its private key; defaults to ``cert_file`` (a PEM holding both).
        verify_server: False skips verifying the server (RocketMQ's
            ``tls.client.authServer=false``): encrypted but open to a man in the middle; for
            tests and trusted networks only.
        check_hostname: verify that the certificate names the host (or IP) connected to.

    Raises:
        ConfigError: a file is missing or unreadable.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if not verify_server:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.check_hostname = check_hostname
        if ca_file is not None:
            _load_trust(context, ca_file, "tls_ca_file")
        else:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cert_file is not None:
        _load_chain(context, cert_file, key_file or cert_file, key_password, "tls_cert_file",
                    "tls_key_file")
    return context


def _load_chain(
    context: ssl.SSLContext,
    cert_path: Path | str,
    key_path: Path | str,
    password: str | None,
    cert_setting: str,
    key_setting: str,
) -> None:
    for path, setting in ((cert_path, cert_setting), (key_path, key_setting)):
        if not Path(path).is_file():
            raise ConfigError(f"{setting}={path}: no such file (give the PEM file's path)")
    try:
        context.load_cert_chain(str(cert_path), str(key_path), password=password)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"cannot load the certificate {cert_setting}={cert_path} with the key "
            f"{key_setting}={key_path}: {exc} (both must be PEM and belong together; an "
            "encrypted key needs its password)"
        ) from exc


def _load_trust(context: ssl.SSLContext, path: Path | str, setting: str) -> None:
    if not Path(path).is_file():
        raise ConfigError(f"{setting}={path}: no such file (give the CA certificates' PEM file)")
    try:
        context.load_verify_locations(cafile=str(path))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"cannot load CA certificates from {setting}={path}: {exc} (it must be PEM)"
        ) from exc

"""The ACL and TLS options of the client commands (``tidemq admin``, ``tidemq bench``).

Given on the command group, before the verb, or by environment variable::

    tidemq admin --accessKey AK --secretKey SK --tlsCaFile ca.pem topicList
    TIDEMQ_ACCESS_KEY=AK TIDEMQ_SECRET_KEY=SK tidemq bench produce -t T

The secret key is never printed (not in help defaults, not in errors).
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tidemq.client.security import (
    ACCESS_KEY_ENV,
    SECRET_KEY_ENV,
    SECURITY_TOKEN_ENV,
    Credentials,
    tls_context,
)
from tidemq.errors import TidemqError


@dataclasses.dataclass(frozen=True)
class ClientSecurity:
    """The credentials and TLS context a command's clients use (None: unsigned / plain)."""

    credentials: Credentials | None = None
    tls: ssl.SSLContext | None = None


_OPTIONS = [
    click.option("--accessKey", "access_key", envvar=ACCESS_KEY_ENV, metavar="KEY",
                 help=f"ACL access key to sign every request with [env {ACCESS_KEY_ENV}]."),
    click.option("--secretKey", "secret_key", envvar=SECRET_KEY_ENV, metavar="KEY",
                 help=f"ACL secret key (never printed) [env {SECRET_KEY_ENV}]."),
    click.option("--securityToken", "security_token", envvar=SECURITY_TOKEN_ENV,
                 metavar="TOKEN", help=f"Optional ACL security token [env {SECURITY_TOKEN_ENV}]."),
    click.option("--tls/--no-tls", "use_tls", envvar="TIDEMQ_TLS", default=False,
                 help="Connect with TLS [env TIDEMQ_TLS]."),
    click.option("--tlsCaFile", "tls_ca_file", envvar="TIDEMQ_TLS_CA_FILE", metavar="PEM",
                 type=click.Path(dir_okay=False, path_type=Path),
                 help="CA certificates the servers' certificates must chain to (default: the "
                      "system's) [env TIDEMQ_TLS_CA_FILE]; implies --tls."),
    click.option("--tlsCertFile", "tls_cert_file", envvar="TIDEMQ_TLS_CERT_FILE", metavar="PEM",
                 type=click.Path(dir_okay=False, path_type=Path),
                 help="Client certificate for servers that require one (mutual TLS)."),
    click.option("--tlsKeyFile", "tls_key_file", envvar="TIDEMQ_TLS_KEY_FILE", metavar="PEM",
                 type=click.Path(dir_okay=False, path_type=Path),
                 help="The client certificate's private key (default: in --tlsCertFile)."),
]


def client_security_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """Add the options above to a click group; it gets them as keyword arguments and
    should pass them to ``client_security``."""
    for option in reversed(_OPTIONS):
        function = option(function)
    return function


def client_security(access_key: str | None, secret_key: str | None,
                    security_token: str | None, use_tls: bool, tls_ca_file: Path | None,
                    tls_cert_file: Path | None, tls_key_file: Path | None) -> ClientSecurity:
    """Build the settings from the options.

    Raises:
        click.UsageError: one key without the other, or TLS files that do not load.
    """
    if bool(access_key) != bool(secret_key):
        raise click.UsageError("give both --accessKey and --secretKey (or "
                               f"{ACCESS_KEY_ENV} and {SECRET_KEY_ENV}), or neither")
    credentials = (Credentials(access_key, secret_key, security_token or None)  # type: ignore[arg-type]
                   if access_key else None)
    tls = None
    if use_tls or tls_ca_file or tls_cert_file:
        try:
            tls = tls_context(tls_ca_file, cert_file=tls_cert_file, key_file=tls_key_file)
        except TidemqError as e:
            raise click.UsageError(str(e)) from None
    return ClientSecurity(credentials, tls)


def current_client_security() -> ClientSecurity:
    """The settings of the command group being run (none outside a click run)."""
    context = click.get_current_context(silent=True)
    found = context.find_object(ClientSecurity) if context is not None else None
    return found if found is not None else ClientSecurity()

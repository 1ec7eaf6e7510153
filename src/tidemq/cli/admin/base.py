"""What every ``tidemq admin`` verb shares: the click group, the -n option, the Admin runner,
the console and the JSON/time helpers.

A verb module imports ``admin`` from here and registers with ``@admin.command("camelName")``;
``tidemq.cli.admin_command`` imports every verb module, which is what makes a verb appear.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import functools
import re
import ssl
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import orjson
from rich.console import Console, ConsoleDimensions
from rich.table import Table

from tidemq.client.admin import Admin
from tidemq.client.producer import default_namesrv
from tidemq.client.security import (
    ACCESS_KEY_ENV,
    SECRET_KEY_ENV,
    SECURITY_TOKEN_ENV,
    Credentials,
    tls_context,
)
from tidemq.errors import TidemqError
from tidemq.remoting.loop import run as run_on_loop

# Output that is not read on a terminal (a file, a pipe, a test runner) is drawn this wide, so
# no cell is cut to "127.0.0.1:…"; tables are only as wide as their content needs.
NOT_A_TERMINAL_WIDTH = 10_000


class AdminConsole(Console):
    """A rich Console as wide as the terminal, or unbounded when not writing to one."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self.is_terminal:
            return size
        return ConsoleDimensions(NOT_A_TERMINAL_WIDTH, size.height)


console = AdminConsole()


def _canonical(name: str) -> str:
    return re.sub(r"[-_]", "", name).lower()


class _VerbGroup(click.Group):
    """Accepts a verb in camel case (mqadmin's), kebab case or any case; suggests the nearest
    verb for a misspelled one."""

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is not None:
            return command
        wanted = _canonical(name)
        for known in self.list_commands(ctx):
            if _canonical(known) == wanted:
                return super().get_command(ctx, known)
        return None

    def resolve_command(self, ctx: click.Context, args: list[str]):
        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            hint = did_you_mean(args[0], self.list_commands(ctx))
            raise click.UsageError(f"No such command {args[0]!r}.{hint}", ctx)
        name, command, rest = super().resolve_command(ctx, args)
        return (command.name if command is not None else name), command, rest


@dataclasses.dataclass(frozen=True)
class AdminSecurity:
    """How ``tidemq admin`` signs and encrypts: the group's --accessKey/--secretKey and --tls
    options (or their environment variables), shared by every verb."""

    credentials: Credentials | None = None
    tls: ssl.SSLContext | None = None


@click.group(cls=_VerbGroup)
@click.option("--accessKey", "access_key", envvar=ACCESS_KEY_ENV, metavar="KEY",
              help=f"ACL access key to sign every request with [env {ACCESS_KEY_ENV}].")
@click.option("--secretKey", "secret_key", envvar=SECRET_KEY_ENV, metavar="KEY",
              help=f"ACL secret key (never printed) [env {SECRET_KEY_ENV}].")
@click.option("--securityToken", "security_token", envvar=SECURITY_TOKEN_ENV, metavar="TOKEN",
              help=f"Optional ACL security token [env {SECURITY_TOKEN_ENV}].")
@click.option("--tls/--no-tls", "use_tls", envvar="TIDEMQ_TLS", default=False,
              help="Connect with TLS [env TIDEMQ_TLS].")
@click.option("--tlsCaFile", "tls_ca_file", envvar="TIDEMQ_TLS_CA_FILE", metavar="PEM",
              type=click.Path(dir_okay=False, path_type=Path),
              help="CA certificates the servers' certificates must chain to (default: the "
                   "system's) [env TIDEMQ_TLS_CA_FILE]; implies --tls.")
@click.option("--tlsCertFile", "tls_cert_file", envvar="TIDEMQ_TLS_CERT_FILE", metavar="PEM",
              type=click.Path(dir_okay=False, path_type=Path),
              help="Client certificate for servers that require one (mutual TLS).")
@click.option("--tlsKeyFile", "tls_key_file", envvar="TIDEMQ_TLS_KEY_FILE", metavar="PEM",
              type=click.Path(dir_okay=False, path_type=Path),
              help="The client certificate's private key (default: in --tlsCertFile).")
@click.pass_context
def admin(ctx: click.Context, access_key: str | None, secret_key: str | None,
          security_token: str | None, use_tls: bool, tls_ca_file: Path | None,
          tls_cert_file: Path | None, tls_key_file: Path | None) -> None:
    """Administer topics, groups and offsets; look messages up (mqadmin's verbs).

    Every verb takes -n/--namesrvAddr (default $NAMESRV_ADDR or 127.0.0.1:9876) and --json.
    Against servers with ACL or TLS on, give the options above before the verb:
    tidemq admin --accessKey AK --secretKey SK --tlsCaFile ca.pem topicList
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
    ctx.obj = AdminSecurity(credentials, tls)


def admin_security() -> AdminSecurity:
    """The group's security settings for the verb being run (none outside a click run)."""
    context = click.get_current_context(silent=True)
    found = context.find_object(AdminSecurity) if context is not None else None
    return found if found is not None else AdminSecurity()


def namesrv_option(function: Callable[..., Any]) -> Callable[..., Any]:
    """The ``-n/--namesrvAddr`` option every verb takes."""
    return click.option(
        "-n", "--namesrvAddr", "namesrv", default=default_namesrv, show_default="$NAMESRV_ADDR "
        "or 127.0.0.1:9876", help="Name server addresses, host:port;host:port.",
    )(function)


def json_option(function: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--json`` flag (passed as ``as_json``)."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print machine-readable JSON instead of a table.")(function)


def with_admin(function: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an ``async def verb(admin, **options)`` with a started Admin; errors become one
    line on stderr and exit status 1."""

    @functools.wraps(function)
    def wrapper(namesrv: str, **options: Any) -> None:
        async def main() -> None:
            security = admin_security()
            async with Admin(namesrv, credentials=security.credentials,
                             tls=security.tls) as client:
                await function(client, **options)

        try:
            run_on_loop(main())
        except (TidemqError, ValueError) as e:
            raise click.ClickException(str(e)) from None

    return wrapper


def did_you_mean(wanted: str, known: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the closest of ``known`` to ``wanted``, or ``""``."""
    close = difflib.get_close_matches(wanted, list(known), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def print_json(value: Any) -> None:
    """Print ``value`` as indented JSON with sorted keys."""
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
                            | orjson.OPT_NON_STR_KEYS).decode())


def format_ms(timestamp_ms: int) -> str:
    """A local time ``yyyy-MM-dd HH:mm:ss.SSS`` from ms since the epoch (``-`` for none)."""
    if timestamp_ms <= 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{timestamp_ms % 1000:03d}"


def parse_time(text: str) -> int:
    """ms since the epoch from ``now``, digits (ms), or ``yyyy-MM-dd#HH:mm:ss:SSS``."""
    if text == "now":
        return int(time.time() * 1000)
    if text.lstrip("-").isdigit():
        return int(text)
    for pattern in ("%Y-%m-%d#%H:%M:%S:%f", "%Y-%m-%d#%H:%M:%S", "%Y-%m-%dT%H:%M:%S"):
        try:
            return int(datetime.datetime.strptime(text, pattern).timestamp() * 1000)
        except ValueError:
            continue
    raise click.BadParameter(
        f"{text!r} is not a time: use 'now', ms since the epoch, or yyyy-MM-dd#HH:mm:ss:SSS"
    )


def print_table(title: str | None, columns: Sequence[str],
                rows: Iterable[Sequence[object]]) -> None:
    """Draw ``rows`` under ``columns`` (cells shown with ``str``; None as ``-``)."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("-" if cell is None else str(cell) for cell in row))
    console.print(table)


def print_settings(title: str, settings: Mapping[str, object]) -> None:
    """Draw ``key = value`` pairs sorted by key, as mqadmin prints a config."""
    print_table(title, ("Key", "Value"), sorted(settings.items()))

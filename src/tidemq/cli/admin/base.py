"""What every ``tidemq admin`` verb shares: the click group, the -n option, the Admin runner,
the console and the JSON/time helpers.

A verb module imports ``admin`` from here and registers with ``@admin.command("camelName")``;
``tidemq.cli.admin_command`` imports every verb module, which is what makes a verb appear.
"""

from __future__ import annotations

import datetime
import difflib
import functools
import re
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any

import click
import orjson
from rich.console import Console, ConsoleDimensions
from rich.table import Table

from tidemq.cli.client_security import (
    ClientSecurity,
    client_security,
    client_security_options,
    current_client_security,
)
from tidemq.client.admin import Admin
from tidemq.client.producer import default_namesrv
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


@click.group(cls=_VerbGroup)
@client_security_options
@click.pass_context
def admin(ctx: click.Context, **security: Any) -> None:
    """Administer topics, groups and offsets; look messages up (mqadmin's verbs).

    Every verb takes -n/--namesrvAddr (default $NAMESRV_ADDR or 127.0.0.1:9876) and --json.
    Against servers with ACL or TLS on, give the options above before the verb:
    tidemq admin --accessKey AK --secretKey SK --tlsCaFile ca.pem topicList
    """
    ctx.obj = client_security(**security)


def admin_security() -> ClientSecurity:
    """The group's ACL and TLS settings for the verb being run (``tidemq.cli.client_security``)."""
    return current_client_security()


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

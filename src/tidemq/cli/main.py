"""The ``tidemq`` command: one click group; each verb lives in its own module."""

from __future__ import annotations

import importlib

import click

from tidemq.cli.heap_pad import pad_heap_top

# verb -> "module:attribute" of a click command; imported only when the verb runs, so
# `tidemq store check` does not pay for importing the broker.
_COMMANDS = {
    "store": "tidemq.cli.store_command:store",
    "namesrv": "tidemq.cli.server_commands:namesrv",
    "broker": "tidemq.cli.server_commands:broker",
    "dev": "tidemq.cli.server_commands:dev",
    "admin": "tidemq.cli.admin_command:admin",
    "bench": "tidemq.cli.bench_command:bench",
    "docs": "tidemq.cli.reference_docs:docs",
    "console": "tidemq.cli.console_command:console",
    "controller": "tidemq.cli.controller_command:controller",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = _COMMANDS.get(name)
        if target is None:
            return None
        module_name, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module_name), attribute)


@click.group(cls=_LazyGroup)
@click.version_option(package_name="tidemq")
def main() -> None:
    """tidemq: a persistent, distributed message queue in the design of Apache RocketMQ 4.x."""
    # Servers and the load generator allocate and free a few hundred KB per pull; without a
    # heap top pad glibc returns that memory and faults it back in page by page (heap_pad.py).
    pad_heap_top()

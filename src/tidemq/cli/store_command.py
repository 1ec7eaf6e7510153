"""``tidemq store check|dump DIR``: verify or print a store offline (logic in tidemq.store)."""

from __future__ import annotations

import sys

import click

from tidemq.errors import StoreError


@click.group(name="store")
def store() -> None:
    """Verify or print a store directory offline (read-only; safe next to a running broker)."""


@store.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--no-crc", is_flag=True, help="Skip the body CRC check (faster).")
def check(directory: str, no_crc: bool) -> None:
    """Verify every record (magic, size, CRC) and every consume-queue entry.

    Exits 1 with one line per problem (file:position: what) when anything is wrong.
    """
    from tidemq.store.check import check_store

    try:
        report = check_store(directory, check_crc=not no_crc)
    except StoreError as e:
        raise click.ClickException(str(e)) from None
    for problem in report.problems:
        click.echo(str(problem))
    if report.problems_omitted:
        click.echo(f"... and {report.problems_omitted} more problems")
    click.echo(report.summary())
    sys.exit(0 if report.ok else 1)


@store.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--topic", default=None, help="Read through this topic's consume queue.")
@click.option("--queue", "queue_id", type=int, default=0, show_default=True,
              help="Queue id (with --topic).")
@click.option("--offset", type=int, default=None,
              help="Queue offset with --topic, else physical offset; default: the first.")
@click.option("--count", type=int, default=None, help="Print at most this many records.")
def dump(directory: str, topic: str | None, queue_id: int, offset: int | None,
         count: int | None) -> None:
    """Print records: offsets, topic, queue, times, properties and a body preview."""
    from tidemq.store.dump import dump_store

    try:
        for line in dump_store(directory, topic=topic, queue_id=queue_id, offset=offset,
                               count=count):
            click.echo(line)
    except StoreError as e:
        raise click.ClickException(str(e)) from None

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
@click.option("--max-hash-slot-num", type=int, default=None,
              help="maxHashSlotNum the broker writes its index with (default: RocketMQ's).")
@click.option("--max-index-num", type=int, default=None,
              help="maxIndexNum the broker writes its index with (default: RocketMQ's).")
def check(directory: str, no_crc: bool, max_hash_slot_num: int | None,
          max_index_num: int | None) -> None:
    """Verify every record (magic, size, CRC), every consume-queue entry and index file.

    Damage in the middle of the log is reported as ranges (the walk goes on at the next
    valid record); a consume queue missing or short against the log's records, and index
    entries whose key does not hash to them, are reported too. Exits 1 with one line per
    problem (file:position: what) when anything is wrong.
    """
    from tidemq.store.check import check_store
    from tidemq.store.check_derived import IndexSettings

    settings = IndexSettings()
    if max_hash_slot_num is not None:
        settings.max_hash_slot_num = max_hash_slot_num
    if max_index_num is not None:
        settings.max_index_num = max_index_num
    try:
        report = check_store(directory, check_crc=not no_crc, index_settings=settings)
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

"""Message verbs: look messages up by id, key or queue offset."""

from __future__ import annotations

from pathlib import Path

import click
import orjson
from rich.table import Table

from tidemq.cli.admin.base import admin, console, format_ms, namesrv_option, parse_time, with_admin
from tidemq.client.admin import Admin
from tidemq.client.message import MessageQueue
from tidemq.protocol.message import MessageExt

_BODY_PREVIEW_BYTES = 512

def _print_message(message: MessageExt, body_file: Path | None) -> None:
    body = message.body
    table = Table(show_header=False, box=None)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows = [
        ("OffsetID", message.offset_msg_id),
        ("MsgId", message.msg_id),
        ("Topic", message.topic),
        ("Tags", f"[{message.tags or ''}]"),
        ("Keys", f"[{' '.join(message.keys)}]"),
        ("Queue ID", str(message.queue_id)),
        ("Queue Offset", str(message.queue_offset)),
        ("CommitLog Offset", str(message.physical_offset)),
        ("Reconsume Times", str(message.reconsume_times)),
        ("Born Timestamp", format_ms(message.born_timestamp)),
        ("Store Timestamp", format_ms(message.store_timestamp)),
        ("Born Host", message.born_host),
        ("Store Host", message.store_host),
        ("System Flag", str(message.sysflag)),
        ("Properties", orjson.dumps(message.properties, option=orjson.OPT_SORT_KEYS).decode()),
        ("Body Length", str(len(body))),
    ]
    for name, value in rows:
        table.add_row(name, value)
    preview = body[:_BODY_PREVIEW_BYTES]
    try:
        shown = preview.decode("utf-8")
    except UnicodeDecodeError:
        shown = preview.hex(" ")
    if len(body) > _BODY_PREVIEW_BYTES:
        shown += f" ... ({len(body) - _BODY_PREVIEW_BYTES} more bytes)"
    table.add_row("Body", shown)
    console.print(table)
    if body_file is not None:
        body_file.write_bytes(body)
        click.echo(f"body written to {body_file}")


@admin.command("queryMsgById")
@namesrv_option
@click.option("-i", "--msgId", "msg_id", required=True,
              help="Offset message id, or client id (UNIQ_KEY) with -t.")
@click.option("-t", "--topic", help="The topic (needed to find a client id).")
@click.option("--body-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the whole body to this file.")
@with_admin
async def query_msg_by_id(client: Admin, msg_id: str, topic: str | None,
                          body_file: Path | None) -> None:
    """Show one message found by its id."""
    _print_message(await client.query_message_by_id(msg_id, topic), body_file)


@admin.command("queryMsgByKey")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-k", "--msgKey", "key", required=True)
@click.option("-b", "--beginTimestamp", "begin", default="0", show_default=True)
@click.option("-e", "--endTimestamp", "end", default="now", show_default=True)
@click.option("-c", "--maxNum", "max_num", type=int, default=64, show_default=True)
@with_admin
async def query_msg_by_key(client: Admin, topic: str, key: str, begin: str, end: str,
                           max_num: int) -> None:
    """List messages of a topic carrying a key."""
    messages = await client.query_message_by_key(
        topic, key, begin_ms=parse_time(begin), end_ms=parse_time(end), max_num=max_num
    )
    table = Table(title=f"messages of {topic} with key {key}")
    for column in ("Message ID", "Broker", "QID", "Offset", "Store Time", "Tags"):
        table.add_column(column)
    for message in messages:
        table.add_row(message.msg_id, message.broker_name, str(message.queue_id),
                      str(message.queue_offset), format_ms(message.store_timestamp),
                      message.tags or "")
    console.print(table)
    if not messages:
        click.echo("no message found")


@admin.command("queryMsgByOffset")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-b", "--brokerName", "broker_name", required=True)
@click.option("-i", "--queueId", "queue_id", type=int, required=True)
@click.option("-o", "--offset", type=int, required=True)
@click.option("--body-file", type=click.Path(dir_okay=False, path_type=Path))
@with_admin
async def query_msg_by_offset(client: Admin, topic: str, broker_name: str, queue_id: int,
                              offset: int, body_file: Path | None) -> None:
    """Show the message at a queue offset."""
    await client.topic_route(topic)  # learns the broker addresses
    message = await client.query_message_by_offset(
        MessageQueue(topic, broker_name, queue_id), offset
    )
    _print_message(message, body_file)

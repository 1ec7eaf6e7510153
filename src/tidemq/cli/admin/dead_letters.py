"""Dead-letter verbs: list and redrive a group's %DLQ% messages."""

from __future__ import annotations

import click
from rich.table import Table

from tidemq.cli.admin.base import (
    admin,
    console,
    format_ms,
    json_option,
    namesrv_option,
    print_json,
    with_admin,
)
from tidemq.client.admin import Admin


def _preview(body: bytes, limit: int = 64) -> str:
    try:
        text = body[:limit].decode("utf-8")
    except UnicodeDecodeError:
        text = body[:limit].hex(" ")
    return text + ("..." if len(body) > limit else "")


@admin.command("dlqList")
@namesrv_option
@click.option("-g", "--groupName", "group", required=True, help="The consumer group.")
@click.option("-c", "--maxNum", "max_num", type=int, default=1000, show_default=True,
              help="Dead letters read at most.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array (bodies as UTF-8 "
              "text where they decode, else hex).")
@with_admin
async def dlq_list(client: Admin, group: str, max_num: int, as_json: bool) -> None:
    """List the messages in a consumer group's dead-letter queue (%DLQ%<group>)."""
    letters = await client.dead_letters(group, max_num=max_num)
    if as_json:
        print_json([{
            "msgId": letter.message.msg_id,
            "offsetMsgId": letter.message.offset_msg_id,
            "originalTopic": letter.original_topic,
            "brokerName": letter.queue.broker_name,
            "queueId": letter.queue.queue_id,
            "queueOffset": letter.message.queue_offset,
            "reconsumeTimes": letter.message.reconsume_times,
            "storeTimestamp": letter.message.store_timestamp,
            "tags": letter.message.tags,
            "keys": letter.message.keys,
            "redriven": letter.redriven,
            "body": _preview(letter.message.body, len(letter.message.body)),
        } for letter in letters])
        return
    table = Table(title=f"dead letters of group {group}")
    for column in ("Message ID", "Original Topic", "Broker", "Offset", "Retries",
                   "Stored", "Tags", "Redriven", "Body"):
        table.add_column(column)
    for letter in letters:
        message = letter.message
        table.add_row(message.msg_id, letter.original_topic or "?", letter.queue.broker_name,
                      str(message.queue_offset), str(message.reconsume_times),
                      format_ms(message.store_timestamp), message.tags or "",
                      "yes" if letter.redriven else "no", _preview(message.body))
    console.print(table)
    if not letters:
        click.echo(f"no dead letter for group {group}")


@admin.command("dlqRedrive")
@namesrv_option
@click.option("-g", "--groupName", "group", required=True, help="The consumer group.")
@click.option("--all", "all_letters", is_flag=True,
              help="Every dead letter not redriven before.")
@click.option("-i", "--msgId", "msg_ids", multiple=True,
              help="One dead letter by message id, offset id or original id (repeatable).")
@click.option("--toRetryTopic", "to_retry_topic", is_flag=True,
              help="Send to %RETRY%<group> (only this group sees them again) instead of "
                   "the original topic (every group subscribing it does).")
@json_option
@with_admin
async def dlq_redrive(client: Admin, group: str, all_letters: bool, msg_ids: tuple[str, ...],
                      to_retry_topic: bool, as_json: bool) -> None:
    """Send dead letters of a consumer group back to be consumed again."""
    if all_letters == bool(msg_ids):
        raise click.UsageError("give either --all or one or more --msgId")
    sent = await client.redrive_dead_letters(
        group, msg_ids=list(msg_ids) if msg_ids else None, to_retry_topic=to_retry_topic)
    if as_json:
        print_json([{"msgId": letter.message.msg_id, "topic": result.queue.topic,
                     "brokerName": result.queue.broker_name, "queueId": result.queue.queue_id,
                     "queueOffset": result.queue_offset, "newMsgId": result.msg_id}
                    for letter, result in sent])
        return
    for letter, result in sent:
        click.echo(f"redrove {letter.message.msg_id} to {result.queue.topic} "
                   f"({result.queue.broker_name} queue {result.queue.queue_id}, offset "
                   f"{result.queue_offset})")
    if not sent:
        click.echo(f"no dead letter to redrive for group {group}")

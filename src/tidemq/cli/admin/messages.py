"""Message verbs: look messages up by id, key or queue offset."""

from __future__ import annotations

from pathlib import Path

import click
import orjson
from rich.table import Table

from tidemq.cli.admin.base import (
    admin,
    console,
    did_you_mean,
    format_ms,
    json_option,
    namesrv_option,
    parse_time,
    print_json,
    print_table,
    with_admin,
)
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
@json_option
@with_admin
async def query_msg_by_id(client: Admin, msg_id: str, topic: str | None,
                          body_file: Path | None, as_json: bool) -> None:
    """Show one message found by its id."""
    message = await client.query_message_by_id(msg_id, topic)
    if as_json:
        print_json(message_json(message))
        return
    _print_message(message, body_file)


@admin.command("queryMsgByKey")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-k", "--msgKey", "key", required=True)
@click.option("-b", "--beginTimestamp", "begin", default="0", show_default=True)
@click.option("-e", "--endTimestamp", "end", default="now", show_default=True)
@click.option("-c", "--maxNum", "max_num", type=int, default=64, show_default=True)
@json_option
@with_admin
async def query_msg_by_key(client: Admin, topic: str, key: str, begin: str, end: str,
                           max_num: int, as_json: bool) -> None:
    """List messages of a topic carrying a key."""
    await client.topic_route(topic)
    messages = await client.query_message_by_key(
        topic, key, begin_ms=parse_time(begin), end_ms=parse_time(end), max_num=max_num
    )
    if as_json:
        print_json([message_json(message) for message in messages])
        return
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
@json_option
@with_admin
async def query_msg_by_offset(client: Admin, topic: str, broker_name: str, queue_id: int,
                              offset: int, body_file: Path | None, as_json: bool) -> None:
    """Show the message at a queue offset."""
    queue = await checked_queue(client, topic, broker_name, queue_id)
    message = await client.query_message_by_offset(queue, offset)
    if as_json:
        print_json(message_json(message))
        return
    _print_message(message, body_file)


def message_json(message: MessageExt, body_limit: int | None = None) -> dict[str, object]:
    """A message as a JSON object (body as UTF-8 text where it decodes, else hex)."""
    body = message.body if body_limit is None else message.body[:body_limit]
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = body.hex()
    return {"msgId": message.msg_id, "offsetMsgId": message.offset_msg_id,
            "topic": message.topic, "brokerName": message.broker_name,
            "queueId": message.queue_id, "queueOffset": message.queue_offset,
            "commitLogOffset": message.physical_offset, "tags": message.tags,
            "keys": message.keys, "bornTimestamp": message.born_timestamp,
            "storeTimestamp": message.store_timestamp, "bornHost": message.born_host,
            "storeHost": message.store_host, "reconsumeTimes": message.reconsume_times,
            "sysFlag": message.sysflag, "properties": message.properties,
            "bodyLength": len(message.body), "body": text}


def print_message_rows(title: str, messages: list[MessageExt], print_body: bool,
                        charset: str) -> None:
    columns = ["Message ID", "Broker", "QID", "Offset", "Store Time", "Tags", "Keys"]
    if print_body:
        columns.append("Body")
    rows = []
    for message in messages:
        row = [message.msg_id, message.broker_name, message.queue_id, message.queue_offset,
               format_ms(message.store_timestamp), message.tags or "", " ".join(message.keys)]
        if print_body:
            row.append(message.body.decode(charset, "replace"))
        rows.append(row)
    print_table(title, columns, rows)


@admin.command("queryMsgByUniqueKey")
@namesrv_option
@click.option("-i", "--msgId", "msg_id", required=True, help="The message id (UNIQ_KEY).")
@click.option("-t", "--topic", required=True)
@click.option("-g", "--consumerGroup", "group", help="Accepted for mqadmin compatibility.")
@click.option("-d", "--clientId", "client_id", help="Accepted for mqadmin compatibility.")
@click.option("-a", "--showAll", "show_all", is_flag=True,
              help="Show every stored copy with this id (a resent message has several).")
@click.option("--body-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the whole body to this file.")
@json_option
@with_admin
async def query_msg_by_unique_key(client: Admin, msg_id: str, topic: str, group: str | None,
                                  client_id: str | None, show_all: bool,
                                  body_file: Path | None, as_json: bool) -> None:
    """Show a message found by its message id (UNIQ_KEY) in a topic."""
    messages = await client.query_message_by_unique_key(topic, msg_id)
    if not show_all:
        messages = messages[:1]
    if as_json:
        print_json([message_json(message) for message in messages])
        return
    for message in messages:
        _print_message(message, body_file)


@admin.command("printMsg")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-c", "--charsetName", "charset", default="utf-8", show_default=True)
@click.option("-s", "--subExpression", "sub_expression", default="*", show_default=True,
              help="Tag expression, e.g. 'a || b'.")
@click.option("-b", "--beginTimestamp", "begin", default="0", show_default=True)
@click.option("-e", "--endTimestamp", "end", default="now", show_default=True)
@click.option("-d", "--printBody", "print_body", type=bool, default=True, show_default=True)
@click.option("-m", "--maxNum", "max_num", type=int, default=1000, show_default=True,
              help="Messages printed at most.")
@json_option
@with_admin
async def print_msg(client: Admin, topic: str, charset: str, sub_expression: str, begin: str,
                    end: str, print_body: bool, max_num: int, as_json: bool) -> None:
    """Print the messages of a topic stored in a time range, from the running brokers."""
    messages = [message async for message in client.topic_messages(
        topic, parse_time(begin), parse_time(end), tag_expression=sub_expression,
        max_num=max_num)]
    if as_json:
        print_json([message_json(message) for message in messages])
        return
    print_message_rows(f"messages of {topic}", messages, print_body, charset)


@admin.command("printMsgByQueue")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-a", "--brokerName", "broker_name", required=True)
@click.option("-i", "--queueId", "queue_id", type=int, required=True)
@click.option("-c", "--charsetName", "charset", default="utf-8", show_default=True)
@click.option("-s", "--subExpression", "sub_expression", default="*", show_default=True)
@click.option("-b", "--beginTimestamp", "begin", default="0", show_default=True)
@click.option("-e", "--endTimestamp", "end", default="now", show_default=True)
@click.option("-p", "--print", "print_messages", type=bool, default=True, show_default=True,
              help="false: print only the per-tag counts.")
@click.option("-d", "--printBody", "print_body", type=bool, default=True, show_default=True)
@click.option("-f", "--calculate", is_flag=True, help="Count messages per tag.")
@click.option("-m", "--maxNum", "max_num", type=int, default=1000, show_default=True)
@json_option
@with_admin
async def print_msg_by_queue(client: Admin, topic: str, broker_name: str, queue_id: int,
                             charset: str, sub_expression: str, begin: str, end: str,
                             print_messages: bool, print_body: bool, calculate: bool,
                             max_num: int, as_json: bool) -> None:
    """Print the messages of one queue stored in a time range."""
    queue = await checked_queue(client, topic, broker_name, queue_id)
    begin_ms, end_ms = parse_time(begin), parse_time(end)
    first, last = await client.offsets_between(queue, begin_ms, end_ms)
    messages = [message async for message in client.queue_messages(
        queue, first, last, tag_expression=sub_expression, max_num=max_num)
        if begin_ms <= message.store_timestamp <= end_ms]
    tag_counts: dict[str, int] = {}
    for message in messages:
        tag_counts[message.tags or ""] = tag_counts.get(message.tags or "", 0) + 1
    if as_json:
        print_json({"messages": [message_json(m) for m in messages] if print_messages else [],
                    "tagCounts": tag_counts if calculate else {}})
        return
    if print_messages:
        print_message_rows(f"messages of {queue}", messages, print_body, charset)
    if calculate:
        print_table("messages per tag", ("Tag", "Count"), sorted(tag_counts.items()))


async def checked_queue(client: Admin, topic: str, broker_name: str,
                         queue_id: int) -> MessageQueue:
    route = await client.topic_route(topic)
    queues = route.subscribe_queues(topic)
    names = sorted({queue.broker_name for queue in queues})
    if broker_name not in names:
        raise click.ClickException(f"topic {topic!r} has no queue on broker {broker_name!r}."
                                   f"{did_you_mean(broker_name, names)} (its brokers: "
                                   f"{', '.join(names)})")
    queue = MessageQueue(topic, broker_name, queue_id)
    if queue not in queues:
        count = sum(1 for q in queues if q.broker_name == broker_name)
        raise click.ClickException(f"topic {topic!r} has queues 0 to {count - 1} on broker "
                                   f"{broker_name!r}; there is no queue {queue_id}")
    return queue


@admin.command("queryCq")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-q", "--queue", "queue_id", type=int, required=True)
@click.option("-i", "--index", type=int, required=True, help="First queue offset to show.")
@click.option("-c", "--count", type=int, default=10, show_default=True)
@click.option("-b", "--broker", "broker_name", help="Broker name (the first one by default).")
@json_option
@with_admin
async def query_cq(client: Admin, topic: str, queue_id: int, index: int, count: int,
                   broker_name: str | None, as_json: bool) -> None:
    """Show raw consume-queue entries: commit-log offset, size and tag code."""
    if broker_name is None:
        route = await client.topic_route(topic)
        broker_name = sorted(route.master_addresses())[0]
    queue = await checked_queue(client, topic, broker_name, queue_id)
    entries = await client.consume_queue(queue, index, count)
    if as_json:
        print_json([{"queueOffset": e.queue_offset, "physicOffset": e.physical_offset,
                     "physicSize": e.size, "tagsCode": e.tags_code} for e in entries])
        return
    print_table(f"consume queue of {queue}", ("Queue Offset", "CommitLog Offset", "Size",
                                              "Tags Code"),
                [(e.queue_offset, e.physical_offset, e.size, e.tags_code) for e in entries])

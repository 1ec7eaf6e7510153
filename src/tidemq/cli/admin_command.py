"""``tidemq admin``: RocketMQ's mqadmin verbs over the tidemq Admin client.

Verbs keep mqadmin's names and short options (``updateTopic -n ns -t T -c DefaultCluster``);
each may also be written in kebab case (``update-topic``). Expected failures (an unknown topic,
a broker refusal, a name server that is down) print one line naming the problem and exit with
status 1; only bugs show a traceback. Tables are drawn with rich; ``--json`` on the listing
verbs prints machine-readable output instead.
"""

from __future__ import annotations

import datetime
import functools
import re
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import click
import orjson
from rich.console import Console
from rich.table import Table

from tidemq.client.admin import Admin
from tidemq.client.message import MessageQueue
from tidemq.client.producer import default_namesrv
from tidemq.errors import TidemqError
from tidemq.protocol.message import MessageExt
from tidemq.remoting.loop import run as run_on_loop

_console = Console()
_BODY_PREVIEW_BYTES = 512


def _canonical(name: str) -> str:
    return re.sub(r"[-_]", "", name).lower()


class _VerbGroup(click.Group):
    """Accepts a verb in camel case (mqadmin's), kebab case or any case."""

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
        name, command, rest = super().resolve_command(ctx, args)
        return (command.name if command is not None else name), command, rest


@click.group(cls=_VerbGroup)
def admin() -> None:
    """Administer topics, groups and offsets; look messages up (mqadmin's verbs).

    Every verb takes -n/--namesrvAddr (default $NAMESRV_ADDR or 127.0.0.1:9876).
    """


def _namesrv_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "-n", "--namesrvAddr", "namesrv", default=default_namesrv, show_default="$NAMESRV_ADDR "
        "or 127.0.0.1:9876", help="Name server addresses, host:port;host:port.",
    )(function)


def _with_admin(function: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an ``async def verb(admin, **options)`` with a started Admin; errors become one
    line on stderr and exit status 1."""

    @functools.wraps(function)
    def wrapper(namesrv: str, **options: Any) -> None:
        async def main() -> None:
            async with Admin(namesrv) as client:
                await function(client, **options)

        try:
            run_on_loop(main())
        except (TidemqError, ValueError) as e:
            raise click.ClickException(str(e)) from None

    return wrapper


def _print_json(value: Any) -> None:
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode())


def _format_ms(timestamp_ms: int) -> str:
    if timestamp_ms <= 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{timestamp_ms % 1000:03d}"


def _parse_time(text: str) -> int:
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


# -- topics -------------------------------------------------------------------------------------


@admin.command("updateTopic")
@_namesrv_option
@click.option("-t", "--topic", required=True, help="Topic name.")
@click.option("-c", "--clusterName", "cluster", help="Create on every master of this cluster.")
@click.option("-b", "--brokerAddr", "broker_addr", help="Create on this broker only.")
@click.option("-r", "--readQueueNums", "read_queue_nums", type=int, default=8, show_default=True)
@click.option("-w", "--writeQueueNums", "write_queue_nums", type=int, default=8,
              show_default=True)
@click.option("-p", "--perm", type=int, default=6, show_default=True,
              help="Permission bits: 6 read+write, 4 read, 2 write.")
@click.option("-o", "--order", type=bool, default=False, show_default=True,
              help="Order topic (publishes brokerName:queues to the name servers).")
@_with_admin
async def update_topic(client: Admin, topic: str, cluster: str | None, broker_addr: str | None,
                       read_queue_nums: int, write_queue_nums: int, perm: int,
                       order: bool) -> None:
    """Create or update a topic."""
    updated = await client.create_topic(
        topic, perm=perm, cluster=cluster, broker_addr=broker_addr, order=order,
        read_queue_nums=read_queue_nums, write_queue_nums=write_queue_nums,
    )
    for address in updated:
        click.echo(f"create topic to {address} success.")
    click.echo(f"topic {topic}: {read_queue_nums} read / {write_queue_nums} write queues, "
               f"perm {perm}{', order' if order else ''}")


@admin.command("deleteTopic")
@_namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-c", "--clusterName", "cluster", help="Delete from every master of this cluster.")
@_with_admin
async def delete_topic(client: Admin, topic: str, cluster: str | None) -> None:
    """Delete a topic from the brokers, then from the name servers."""
    deleted = await client.delete_topic(topic, cluster=cluster)
    click.echo(f"delete topic [{topic}] from {', '.join(deleted) or 'no broker'} and from the "
               "name servers success.")


@admin.command("topicList")
@_namesrv_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@_with_admin
async def topic_list(client: Admin, as_json: bool) -> None:
    """List every topic the name servers know."""
    topics = await client.topic_list()
    if as_json:
        _print_json(topics)
    else:
        for topic in topics:
            click.echo(topic)


@admin.command("topicRoute")
@_namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the route as JSON.")
@_with_admin
async def topic_route(client: Admin, topic: str, as_json: bool) -> None:
    """Show a topic's route: brokers and their queues."""
    route = await client.topic_route(topic)
    if as_json:
        _print_json({
            "brokerDatas": [{"brokerAddrs": {str(k): v for k, v in b.broker_addrs.items()},
                             "brokerName": b.broker_name, "cluster": b.cluster}
                            for b in route.broker_datas],
            "queueDatas": [{"brokerName": q.broker_name, "perm": q.perm,
                            "readQueueNums": q.read_queue_nums,
                            "topicSysFlag": q.topic_sys_flag,
                            "writeQueueNums": q.write_queue_nums} for q in route.queue_datas],
            **({"orderTopicConf": route.order_topic_conf} if route.order_topic_conf else {}),
        })
        return
    table = Table(title=f"route of {topic}")
    for column in ("Cluster", "Broker Name", "Broker ID", "Address", "Read Queues",
                   "Write Queues", "Perm"):
        table.add_column(column)
    queue_data = {q.broker_name: q for q in route.queue_datas}
    for broker in sorted(route.broker_datas, key=lambda b: b.broker_name):
        data = queue_data.get(broker.broker_name)
        for broker_id, address in sorted(broker.broker_addrs.items()):
            table.add_row(broker.cluster, broker.broker_name, str(broker_id), address,
                          str(data.read_queue_nums) if data else "-",
                          str(data.write_queue_nums) if data else "-",
                          str(data.perm) if data else "-")
    _console.print(table)
    if route.order_topic_conf:
        click.echo(f"order topic conf: {route.order_topic_conf}")


@admin.command("topicStatus")
@_namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("--json", "as_json", is_flag=True)
@_with_admin
async def topic_status(client: Admin, topic: str, as_json: bool) -> None:
    """Show min/max offset and last update of every queue of a topic."""
    stats = await client.topic_stats(topic)
    if as_json:
        _print_json([{"brokerName": q.broker_name, "queueId": q.queue_id,
                      "minOffset": o.min_offset, "maxOffset": o.max_offset,
                      "lastUpdateTimestamp": o.last_update_timestamp}
                     for q, o in stats.items()])
        return
    table = Table(title=f"status of {topic}")
    for column in ("Broker Name", "QID", "Min Offset", "Max Offset", "Last Updated"):
        table.add_column(column, justify="right" if column != "Broker Name" else "left")
    for queue, offset in stats.items():
        table.add_row(queue.broker_name, str(queue.queue_id), str(offset.min_offset),
                      str(offset.max_offset), _format_ms(offset.last_update_timestamp))
    _console.print(table)


# -- clusters and brokers -----------------------------------------------------------------------


@admin.command("clusterList")
@_namesrv_option
@click.option("--json", "as_json", is_flag=True)
@_with_admin
async def cluster_list(client: Admin, as_json: bool) -> None:
    """List clusters and their broker groups."""
    info = await client.cluster_list()
    rows = []
    for cluster, names in sorted(info.clusters.items()):
        for name in names:
            broker = info.brokers.get(name)
            for broker_id, address in sorted((broker.broker_addrs if broker else {}).items()):
                rows.append((cluster, name, broker_id, address))
    if as_json:
        _print_json([{"cluster": c, "brokerName": n, "brokerId": i, "address": a}
                     for c, n, i, a in rows])
        return
    table = Table(title="clusters")
    for column in ("Cluster Name", "Broker Name", "BID", "Address", "Version", "Put TPS",
                   "Get TPS"):
        table.add_column(column)
    for cluster, name, broker_id, address in rows:
        try:
            runtime = await client.broker_runtime_info(address)
        except TidemqError:
            runtime = {}
        table.add_row(cluster, name, str(broker_id), address,
                      runtime.get("brokerVersionDesc", "?"),
                      runtime.get("putTps", "?").split(" ")[0],
                      runtime.get("getTransferedTps", runtime.get("getTotalTps", "?"))
                      .split(" ")[0])
    _console.print(table)


@admin.command("brokerStatus")
@_namesrv_option
@click.option("-b", "--brokerAddr", "broker_addr", help="One broker's address.")
@click.option("-c", "--clusterName", "cluster", help="Every master of a cluster.")
@click.option("--json", "as_json", is_flag=True)
@_with_admin
async def broker_status(client: Admin, broker_addr: str | None, cluster: str | None,
                        as_json: bool) -> None:
    """Show a broker's runtime statistics."""
    if broker_addr:
        addresses = [broker_addr]
    else:
        info = await client.cluster_list()
        addresses = list(info.master_addresses(cluster).values())
        if not addresses:
            raise click.ClickException("no broker found; give -b host:port or -c cluster")
    results = {address: await client.broker_runtime_info(address) for address in addresses}
    if as_json:
        _print_json(results)
        return
    for address, table_values in results.items():
        table = Table(title=f"broker {address}")
        table.add_column("Key")
        table.add_column("Value")
        for key, value in sorted(table_values.items()):
            table.add_row(key, value)
        _console.print(table)


# -- groups and offsets -------------------------------------------------------------------------


@admin.command("consumerProgress")
@_namesrv_option
@click.option("-g", "--groupName", "group", required=True)
@click.option("-t", "--topic", help="Only this topic.")
@click.option("--json", "as_json", is_flag=True)
@_with_admin
async def consumer_progress(client: Admin, group: str, topic: str | None,
                            as_json: bool) -> None:
    """Show a consumer group's offsets and lag per queue."""
    stats = await client.consume_stats(group, topic)
    if as_json:
        _print_json({"consumeTps": stats.consume_tps, "diffTotal": stats.total_lag,
                     "offsets": [{"topic": q.topic, "brokerName": q.broker_name,
                                  "queueId": q.queue_id, "brokerOffset": o.broker_offset,
                                  "consumerOffset": o.consumer_offset, "diff": o.lag,
                                  "lastTimestamp": o.last_timestamp}
                                 for q, o in stats.offsets.items()]})
        return
    table = Table(title=f"progress of group {group}")
    for column in ("Topic", "Broker Name", "QID", "Broker Offset", "Consumer Offset", "Diff",
                   "Last Time"):
        table.add_column(column)
    for queue, offset in stats.offsets.items():
        table.add_row(queue.topic, queue.broker_name, str(queue.queue_id),
                      str(offset.broker_offset), str(offset.consumer_offset), str(offset.lag),
                      _format_ms(offset.last_timestamp))
    _console.print(table)
    click.echo(f"Consume TPS: {stats.consume_tps:.2f}")
    click.echo(f"Diff Total: {stats.total_lag}")


@admin.command("resetOffsetByTime")
@_namesrv_option
@click.option("-g", "--group", required=True)
@click.option("-t", "--topic", required=True)
@click.option("-s", "--timestamp", required=True,
              help="'now', ms since the epoch, -1 (the end), or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option("-f", "--force", type=bool, default=True, show_default=True,
              help="false: only move queues backwards.")
@_with_admin
async def reset_offset_by_time(client: Admin, group: str, topic: str, timestamp: str,
                               force: bool) -> None:
    """Move a group's offsets in a topic to a point in time; its live consumers move too."""
    offsets = await client.reset_offset_by_time(group, topic, _parse_time(timestamp),
                                                force=force)
    table = Table(title=f"offsets of {group} in {topic} reset")
    for column in ("Broker Name", "QID", "New Offset"):
        table.add_column(column)
    for queue, offset in offsets.items():
        table.add_row(queue.broker_name, str(queue.queue_id), str(offset))
    _console.print(table)


@admin.command("consumerStatus")
@_namesrv_option
@click.option("-g", "--consumerGroup", "group", required=True)
@click.option("-i", "--clientId", "client_id", required=True,
              help="The consumer's client id (ip@instance).")
@click.option("-s", "--jstack", is_flag=True, help="Include the consumer's stacks.")
@click.option("--json", "as_json", is_flag=True)
@_with_admin
async def consumer_status(client: Admin, group: str, client_id: str, jstack: bool,
                          as_json: bool) -> None:
    """Show what a live consumer reports: settings, subscriptions, the queues it owns."""
    info = await client.consumer_running_info(group, client_id, jstack=jstack)
    if as_json:
        _print_json({"properties": info.properties, "subscriptionSet": info.subscriptions,
                     "mqTable": [{**queue.to_json(), **state}
                                 for queue, state in info.queues.items()],
                     "statusTable": info.status, "jstack": info.jstack})
        return
    for key, value in sorted(info.properties.items()):
        click.echo(f"{key:<40} {value}")
    for subscription in info.subscriptions:
        click.echo(f"subscription: {subscription.get('topic')} {subscription.get('subString')}")
    table = Table(title=f"queues of {client_id}")
    for column in ("Topic", "Broker Name", "QID", "Commit Offset", "Cached", "Locked"):
        table.add_column(column)
    for queue, state in info.queues.items():
        table.add_row(queue.topic, queue.broker_name, str(queue.queue_id),
                      str(state.get("commitOffset")), str(state.get("cachedMsgCount")),
                      str(state.get("locked")))
    _console.print(table)
    if info.jstack:
        click.echo(info.jstack)


@admin.command("getConsumerStatus")
@_namesrv_option
@click.option("-g", "--group", required=True)
@click.option("-t", "--topic", required=True)
@click.option("-i", "--originClientId", "client_id", help="Only this consumer.")
@click.option("--json", "as_json", is_flag=True)
@_with_admin
async def get_consumer_status(client: Admin, group: str, topic: str, client_id: str | None,
                              as_json: bool) -> None:
    """Show each live consumer's own offsets of a topic."""
    status = await client.consumer_status(group, topic, client_id)
    if as_json:
        _print_json({member: [{**queue.to_json(), "offset": offset}
                              for queue, offset in offsets.items()]
                     for member, offsets in status.items()})
        return
    table = Table(title=f"offsets of {group}'s consumers in {topic}")
    for column in ("Client Id", "Broker Name", "QID", "Offset"):
        table.add_column(column)
    for member, offsets in status.items():
        for queue, offset in offsets.items():
            table.add_row(member, queue.broker_name, str(queue.queue_id), str(offset))
    _console.print(table)


@admin.command("updateSubGroup")
@_namesrv_option
@click.option("-g", "--groupName", "group", required=True)
@click.option("-c", "--clusterName", "cluster")
@click.option("-b", "--brokerAddr", "broker_addr")
@click.option("-s", "--consumeEnable", "consume_enable", type=bool, default=True,
              show_default=True)
@click.option("-m", "--consumeFromMinEnable", "consume_from_min_enable", type=bool,
              default=True, show_default=True)
@click.option("-d", "--consumeBroadcastEnable", "consume_broadcast_enable", type=bool,
              default=True, show_default=True)
@click.option("-q", "--retryQueueNums", "retry_queue_nums", type=int, default=1,
              show_default=True)
@click.option("-r", "--retryMaxTimes", "retry_max_times", type=int, default=16,
              show_default=True)
@_with_admin
async def update_sub_group(client: Admin, group: str, cluster: str | None,
                           broker_addr: str | None, consume_enable: bool,
                           consume_from_min_enable: bool, consume_broadcast_enable: bool,
                           retry_queue_nums: int, retry_max_times: int) -> None:
    """Create or update a subscription (consumer) group's config."""
    updated = await client.update_subscription_group(
        group, cluster=cluster, broker_addr=broker_addr, consumeEnable=consume_enable,
        consumeFromMinEnable=consume_from_min_enable,
        consumeBroadcastEnable=consume_broadcast_enable, retryQueueNums=retry_queue_nums,
        retryMaxTimes=retry_max_times,
    )
    for address in updated:
        click.echo(f"create subscription group to {address} success.")


# -- messages -----------------------------------------------------------------------------------


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
        ("Born Timestamp", _format_ms(message.born_timestamp)),
        ("Store Timestamp", _format_ms(message.store_timestamp)),
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
    _console.print(table)
    if body_file is not None:
        body_file.write_bytes(body)
        click.echo(f"body written to {body_file}")


@admin.command("queryMsgById")
@_namesrv_option
@click.option("-i", "--msgId", "msg_id", required=True,
              help="Offset message id, or client id (UNIQ_KEY) with -t.")
@click.option("-t", "--topic", help="The topic (needed to find a client id).")
@click.option("--body-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the whole body to this file.")
@_with_admin
async def query_msg_by_id(client: Admin, msg_id: str, topic: str | None,
                          body_file: Path | None) -> None:
    """Show one message found by its id."""
    _print_message(await client.query_message_by_id(msg_id, topic), body_file)


@admin.command("queryMsgByKey")
@_namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-k", "--msgKey", "key", required=True)
@click.option("-b", "--beginTimestamp", "begin", default="0", show_default=True)
@click.option("-e", "--endTimestamp", "end", default="now", show_default=True)
@click.option("-c", "--maxNum", "max_num", type=int, default=64, show_default=True)
@_with_admin
async def query_msg_by_key(client: Admin, topic: str, key: str, begin: str, end: str,
                           max_num: int) -> None:
    """List messages of a topic carrying a key."""
    messages = await client.query_message_by_key(
        topic, key, begin_ms=_parse_time(begin), end_ms=_parse_time(end), max_num=max_num
    )
    table = Table(title=f"messages of {topic} with key {key}")
    for column in ("Message ID", "Broker", "QID", "Offset", "Store Time", "Tags"):
        table.add_column(column)
    for message in messages:
        table.add_row(message.msg_id, message.broker_name, str(message.queue_id),
                      str(message.queue_offset), _format_ms(message.store_timestamp),
                      message.tags or "")
    _console.print(table)
    if not messages:
        click.echo("no message found")


@admin.command("queryMsgByOffset")
@_namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-b", "--brokerName", "broker_name", required=True)
@click.option("-i", "--queueId", "queue_id", type=int, required=True)
@click.option("-o", "--offset", type=int, required=True)
@click.option("--body-file", type=click.Path(dir_okay=False, path_type=Path))
@_with_admin
async def query_msg_by_offset(client: Admin, topic: str, broker_name: str, queue_id: int,
                              offset: int, body_file: Path | None) -> None:
    """Show the message at a queue offset."""
    await client.topic_route(topic)  # learns the broker addresses
    message = await client.query_message_by_offset(
        MessageQueue(topic, broker_name, queue_id), offset
    )
    _print_message(message, body_file)


# -- dead letters -------------------------------------------------------------------------------


def _preview(body: bytes, limit: int = 64) -> str:
    try:
        text = body[:limit].decode("utf-8")
    except UnicodeDecodeError:
        text = body[:limit].hex(" ")
    return text + ("..." if len(body) > limit else "")


@admin.command("dlqList")
@_namesrv_option
@click.option("-g", "--groupName", "group", required=True, help="The consumer group.")
@click.option("-c", "--maxNum", "max_num", type=int, default=1000, show_default=True,
              help="Dead letters read at most.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array (bodies as UTF-8 "
              "text where they decode, else hex).")
@_with_admin
async def dlq_list(client: Admin, group: str, max_num: int, as_json: bool) -> None:
    """List the messages in a consumer group's dead-letter queue (%DLQ%<group>)."""
    letters = await client.dead_letters(group, max_num=max_num)
    if as_json:
        _print_json([{
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
                      _format_ms(message.store_timestamp), message.tags or "",
                      "yes" if letter.redriven else "no", _preview(message.body))
    _console.print(table)
    if not letters:
        click.echo(f"no dead letter for group {group}")


@admin.command("dlqRedrive")
@_namesrv_option
@click.option("-g", "--groupName", "group", required=True, help="The consumer group.")
@click.option("--all", "all_letters", is_flag=True,
              help="Every dead letter not redriven before.")
@click.option("-i", "--msgId", "msg_ids", multiple=True,
              help="One dead letter by message id, offset id or original id (repeatable).")
@click.option("--toRetryTopic", "to_retry_topic", is_flag=True,
              help="Send to %RETRY%<group> (only this group sees them again) instead of "
                   "the original topic (every group subscribing it does).")
@_with_admin
async def dlq_redrive(client: Admin, group: str, all_letters: bool, msg_ids: tuple[str, ...],
                      to_retry_topic: bool) -> None:
    """Send dead letters of a consumer group back to be consumed again."""
    if all_letters == bool(msg_ids):
        raise click.UsageError("give either --all or one or more --msgId")
    sent = await client.redrive_dead_letters(
        group, msg_ids=list(msg_ids) if msg_ids else None, to_retry_topic=to_retry_topic)
    for letter, result in sent:
        click.echo(f"redrove {letter.message.msg_id} to {result.queue.topic} "
                   f"({result.queue.broker_name} queue {result.queue.queue_id}, offset "
                   f"{result.queue_offset})")
    if not sent:
        click.echo(f"no dead letter to redrive for group {group}")

"""Consumer-group verbs: progress, offsets, live consumers, group configs."""

from __future__ import annotations

import click
from rich.table import Table

from tidemq.cli.admin.base import (
    admin,
    console,
    format_ms,
    json_option,
    namesrv_option,
    parse_time,
    print_json,
    print_settings,
    print_table,
    with_admin,
)
from tidemq.client.admin import Admin


@admin.command("consumerProgress")
@namesrv_option
@click.option("-g", "--groupName", "group", required=True)
@click.option("-t", "--topic", help="Only this topic.")
@click.option("--json", "as_json", is_flag=True)
@with_admin
async def consumer_progress(client: Admin, group: str, topic: str | None,
                            as_json: bool) -> None:
    """Show a consumer group's offsets and lag per queue."""
    stats = await client.consume_stats(group, topic)
    if as_json:
        print_json({"consumeTps": stats.consume_tps, "diffTotal": stats.total_lag,
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
                      format_ms(offset.last_timestamp))
    console.print(table)
    click.echo(f"Consume TPS: {stats.consume_tps:.2f}")
    click.echo(f"Diff Total: {stats.total_lag}")


@admin.command("resetOffsetByTime")
@namesrv_option
@click.option("-g", "--group", required=True)
@click.option("-t", "--topic", required=True)
@click.option("-s", "--timestamp", required=True,
              help="'now', ms since the epoch, -1 (the end), or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option("-f", "--force", type=bool, default=True, show_default=True,
              help="false: only move queues backwards.")
@json_option
@with_admin
async def reset_offset_by_time(client: Admin, group: str, topic: str, timestamp: str,
                               force: bool, as_json: bool) -> None:
    """Move a group's offsets in a topic to a point in time; its live consumers move too."""
    await client.check_group(group)
    offsets = await client.reset_offset_by_time(group, topic, parse_time(timestamp),
                                                force=force)
    if as_json:
        print_json([{**queue.to_json(), "offset": offset} for queue, offset in offsets.items()])
        return
    table = Table(title=f"offsets of {group} in {topic} reset")
    for column in ("Broker Name", "QID", "New Offset"):
        table.add_column(column)
    for queue, offset in offsets.items():
        table.add_row(queue.broker_name, str(queue.queue_id), str(offset))
    console.print(table)


@admin.command("consumerStatus")
@namesrv_option
@click.option("-g", "--consumerGroup", "group", required=True)
@click.option("-i", "--clientId", "client_id", required=True,
              help="The consumer's client id (ip@instance).")
@click.option("-s", "--jstack", is_flag=True, help="Include the consumer's stacks.")
@click.option("--json", "as_json", is_flag=True)
@with_admin
async def consumer_status(client: Admin, group: str, client_id: str, jstack: bool,
                          as_json: bool) -> None:
    """Show what a live consumer reports: settings, subscriptions, the queues it owns."""
    info = await client.consumer_running_info(group, client_id, jstack=jstack)
    if as_json:
        print_json({"properties": info.properties, "subscriptionSet": info.subscriptions,
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
    console.print(table)
    if info.jstack:
        click.echo(info.jstack)


@admin.command("getConsumerStatus")
@namesrv_option
@click.option("-g", "--group", required=True)
@click.option("-t", "--topic", required=True)
@click.option("-i", "--originClientId", "client_id", help="Only this consumer.")
@click.option("--json", "as_json", is_flag=True)
@with_admin
async def get_consumer_status(client: Admin, group: str, topic: str, client_id: str | None,
                              as_json: bool) -> None:
    """Show each live consumer's own offsets of a topic."""
    status = await client.consumer_status(group, topic, client_id)
    if as_json:
        print_json({member: [{**queue.to_json(), "offset": offset}
                              for queue, offset in offsets.items()]
                     for member, offsets in status.items()})
        return
    table = Table(title=f"offsets of {group}'s consumers in {topic}")
    for column in ("Client Id", "Broker Name", "QID", "Offset"):
        table.add_column(column)
    for member, offsets in status.items():
        for queue, offset in offsets.items():
            table.add_row(member, queue.broker_name, str(queue.queue_id), str(offset))
    console.print(table)


@admin.command("updateSubGroup")
@namesrv_option
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
@json_option
@with_admin
async def update_sub_group(client: Admin, group: str, cluster: str | None,
                           broker_addr: str | None, consume_enable: bool,
                           consume_from_min_enable: bool, consume_broadcast_enable: bool,
                           retry_queue_nums: int, retry_max_times: int,
                           as_json: bool) -> None:
    """Create or update a subscription (consumer) group's config."""
    updated = await client.update_subscription_group(
        group, cluster=cluster, broker_addr=broker_addr, consumeEnable=consume_enable,
        consumeFromMinEnable=consume_from_min_enable,
        consumeBroadcastEnable=consume_broadcast_enable, retryQueueNums=retry_queue_nums,
        retryMaxTimes=retry_max_times,
    )
    if as_json:
        print_json({"groupName": group, "updated": updated})
        return
    for address in updated:
        click.echo(f"create subscription group to {address} success.")


@admin.command("deleteSubGroup")
@namesrv_option
@click.option("-g", "--groupName", "group", required=True)
@click.option("-b", "--brokerAddr", "broker_addr", help="Delete from this broker only.")
@click.option("-c", "--clusterName", "cluster", help="Delete from every master of the cluster.")
@click.option("-r", "--removeOffset", "remove_offset", type=bool, default=False,
              show_default=True, help="Drop the group's committed offsets too.")
@json_option
@with_admin
async def delete_sub_group(client: Admin, group: str, broker_addr: str | None,
                           cluster: str | None, remove_offset: bool, as_json: bool) -> None:
    """Delete a consumer group's config (and, with -r true, its offsets)."""
    deleted = await client.delete_subscription_group(
        group, cluster=cluster, broker_addr=broker_addr, remove_offset=remove_offset)
    if as_json:
        print_json({"groupName": group, "deleted": deleted, "removeOffset": remove_offset})
        return
    for address in deleted:
        click.echo(f"delete subscription group [{group}] from broker [{address}] success.")


@admin.command("getConsumerConfig")
@namesrv_option
@click.option("-g", "--groupName", "group", required=True)
@json_option
@with_admin
async def get_consumer_config(client: Admin, group: str, as_json: bool) -> None:
    """Show a consumer group's config on each master that has it."""
    configs = await client.group_config(group)
    if as_json:
        print_json(configs)
        return
    for address, config in configs.items():
        print_settings(f"config of group {group} on {address}", config)


@admin.command("cloneGroupOffset")
@namesrv_option
@click.option("-s", "--srcGroup", "source_group", required=True)
@click.option("-d", "--destGroup", "target_group", required=True)
@click.option("-t", "--topic", required=True)
@click.option("-o", "--offline", type=bool, default=True, show_default=True,
              help="Accepted for mqadmin compatibility; offsets are always written directly.")
@json_option
@with_admin
async def clone_group_offset(client: Admin, source_group: str, target_group: str, topic: str,
                             offline: bool, as_json: bool) -> None:
    """Copy one group's committed offsets of a topic to another group."""
    await client.topic_route(topic)
    written = await client.clone_group_offset(source_group, target_group, topic)
    if as_json:
        print_json([{**queue.to_json(), "offset": offset} for queue, offset in written.items()])
        return
    print_table(f"offsets of {source_group} cloned to {target_group} in {topic}",
                ("Broker Name", "QID", "Offset"),
                [(q.broker_name, q.queue_id, o) for q, o in written.items()])


@admin.command("brokerConsumeStats")
@namesrv_option
@click.option("-b", "--brokerAddr", "broker_addr", required=True)
@click.option("-t", "--timeoutMillis", "timeout_ms", type=int, default=50_000,
              show_default=True, help="Accepted for mqadmin compatibility.")
@click.option("-l", "--level", type=int, default=0, show_default=True,
              help="Show only queues whose lag is above this.")
@click.option("-o", "--order", type=bool, default=False, show_default=True,
              help="Accepted for mqadmin compatibility.")
@json_option
@with_admin
async def broker_consume_stats(client: Admin, broker_addr: str, timeout_ms: int, level: int,
                               order: bool, as_json: bool) -> None:
    """Show every group's progress on one broker, per queue."""
    stats = await client.broker_consume_stats(broker_addr)
    rows = [(queue.topic, group, queue.broker_name, queue.queue_id, offset.broker_offset,
             offset.consumer_offset, offset.lag, format_ms(offset.last_timestamp))
            for group, group_stats in stats.items()
            for queue, offset in group_stats.offsets.items() if offset.lag >= level]
    if as_json:
        print_json([dict(zip(("topic", "group", "brokerName", "queueId", "brokerOffset",
                              "consumerOffset", "diff", "lastTime"), row, strict=True))
                    for row in rows])
        return
    print_table(f"consume stats of broker {broker_addr}",
                ("Topic", "Group", "Broker Name", "QID", "Broker Offset", "Consumer Offset",
                 "Diff", "LastTime"), rows)
    click.echo(f"Diff Total: {sum(row[6] for row in rows)}")

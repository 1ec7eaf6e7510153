"""Topic verbs: create, delete, list, route and status of topics."""

from __future__ import annotations

import click
from rich.table import Table

from tidemq.cli.admin.base import admin, console, format_ms, namesrv_option, print_json, with_admin
from tidemq.client.admin import Admin


@admin.command("updateTopic")
@namesrv_option
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
@with_admin
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
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-c", "--clusterName", "cluster", help="Delete from every master of this cluster.")
@with_admin
async def delete_topic(client: Admin, topic: str, cluster: str | None) -> None:
    """Delete a topic from the brokers, then from the name servers."""
    deleted = await client.delete_topic(topic, cluster=cluster)
    click.echo(f"delete topic [{topic}] from {', '.join(deleted) or 'no broker'} and from the "
               "name servers success.")


@admin.command("topicList")
@namesrv_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@with_admin
async def topic_list(client: Admin, as_json: bool) -> None:
    """List every topic the name servers know."""
    topics = await client.topic_list()
    if as_json:
        print_json(topics)
    else:
        for topic in topics:
            click.echo(topic)


@admin.command("topicRoute")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the route as JSON.")
@with_admin
async def topic_route(client: Admin, topic: str, as_json: bool) -> None:
    """Show a topic's route: brokers and their queues."""
    route = await client.topic_route(topic)
    if as_json:
        print_json({
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
    console.print(table)
    if route.order_topic_conf:
        click.echo(f"order topic conf: {route.order_topic_conf}")


@admin.command("topicStatus")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("--json", "as_json", is_flag=True)
@with_admin
async def topic_status(client: Admin, topic: str, as_json: bool) -> None:
    """Show min/max offset and last update of every queue of a topic."""
    stats = await client.topic_stats(topic)
    if as_json:
        print_json([{"brokerName": q.broker_name, "queueId": q.queue_id,
                      "minOffset": o.min_offset, "maxOffset": o.max_offset,
                      "lastUpdateTimestamp": o.last_update_timestamp}
                     for q, o in stats.items()])
        return
    table = Table(title=f"status of {topic}")
    for column in ("Broker Name", "QID", "Min Offset", "Max Offset", "Last Updated"):
        table.add_column(column, justify="right" if column != "Broker Name" else "left")
    for queue, offset in stats.items():
        table.add_row(queue.broker_name, str(queue.queue_id), str(offset.min_offset),
                      str(offset.max_offset), format_ms(offset.last_update_timestamp))
    console.print(table)

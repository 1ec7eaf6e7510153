"""Topic verbs: create, delete, list, route and status of topics."""

from __future__ import annotations

import click
from rich.table import Table

from tidemq.cli.admin.base import (
    admin,
    console,
    did_you_mean,
    format_ms,
    json_option,
    namesrv_option,
    print_json,
    print_table,
    with_admin,
)
from tidemq.client.admin import ORDER_TOPIC_CONFIG_NAMESPACE, Admin
from tidemq.errors import TidemqError


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
@json_option
@with_admin
async def update_topic(client: Admin, topic: str, cluster: str | None, broker_addr: str | None,
                       read_queue_nums: int, write_queue_nums: int, perm: int,
                       order: bool, as_json: bool) -> None:
    """Create or update a topic."""
    if broker_addr:
        await client.check_broker_addr(broker_addr)
    updated = await client.create_topic(
        topic, perm=perm, cluster=cluster, broker_addr=broker_addr, order=order,
        read_queue_nums=read_queue_nums, write_queue_nums=write_queue_nums,
    )
    if as_json:
        print_json({"topic": topic, "updated": updated, "readQueueNums": read_queue_nums,
                    "writeQueueNums": write_queue_nums, "perm": perm, "order": order})
        return
    for address in updated:
        click.echo(f"create topic to {address} success.")
    click.echo(f"topic {topic}: {read_queue_nums} read / {write_queue_nums} write queues, "
               f"perm {perm}{', order' if order else ''}")


@admin.command("deleteTopic")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-c", "--clusterName", "cluster", help="Delete from every master of this cluster.")
@json_option
@with_admin
async def delete_topic(client: Admin, topic: str, cluster: str | None, as_json: bool) -> None:
    """Delete a topic from the brokers, then from the name servers."""
    await client.topic_route(topic)  # an unknown topic is an error, with a did-you-mean
    deleted = await client.delete_topic(topic, cluster=cluster)
    if as_json:
        print_json({"topic": topic, "deleted": deleted})
        return
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


@admin.command("updateTopicPerm")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-p", "--perm", type=click.Choice(["2", "4", "6"]), required=True,
              help="6 read+write, 4 read only, 2 write only.")
@click.option("-b", "--brokerAddr", "broker_addr", help="Change on this broker only.")
@click.option("-c", "--clusterName", "cluster", help="Change on every master of the cluster.")
@json_option
@with_admin
async def update_topic_perm(client: Admin, topic: str, perm: str, broker_addr: str | None,
                            cluster: str | None, as_json: bool) -> None:
    """Change a topic's permission, keeping its queue counts."""
    route = await client.topic_route(topic)
    if broker_addr or cluster:
        targets = await client.broker_targets(cluster, broker_addr)
    else:
        targets = sorted(route.master_addresses().values())
    changed = []
    for address in targets:
        config = (await client.topic_configs(address)).get(topic)
        if config is None:
            raise click.ClickException(f"topic {topic!r} is not on broker {address}")
        old_perm = int(config.get("perm", 6))
        await client.create_topic(
            topic, perm=int(perm), broker_addr=address, order=bool(config.get("order")),
            read_queue_nums=int(config.get("readQueueNums", 8)),
            write_queue_nums=int(config.get("writeQueueNums", 8)))
        changed.append({"brokerAddr": address, "oldPerm": old_perm, "newPerm": int(perm)})
    if as_json:
        print_json(changed)
        return
    for change in changed:
        click.echo(f"update topic {topic} perm from {change['oldPerm']} to {perm} on "
                   f"{change['brokerAddr']} success.")


@admin.command("updateOrderConf")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-v", "--orderConf", "order_conf",
              help="brokerName:queueNum;brokerName:queueNum (for put).")
@click.option("-m", "--method", type=click.Choice(["get", "put", "delete"]), default="get",
              show_default=True)
@json_option
@with_admin
async def update_order_conf(client: Admin, topic: str, order_conf: str | None, method: str,
                            as_json: bool) -> None:
    """Get, put or delete a topic's order config (ORDER_TOPIC_CONFIG on the name servers)."""
    if method == "put":
        if not order_conf:
            raise click.UsageError("-m put needs -v brokerName:queueNum;...")
        for part in order_conf.split(";"):
            name, _, count = part.partition(":")
            if not count.isdigit():
                raise click.BadParameter(f"{part!r} is not brokerName:queueNum", param_hint="-v")
            await client.check_broker_name(name)
        await client.put_kv_config(ORDER_TOPIC_CONFIG_NAMESPACE, topic, order_conf)
    current = await client.get_kv_config(ORDER_TOPIC_CONFIG_NAMESPACE, topic)
    if method in ("get", "delete") and current is None:
        known = await client.kv_list(ORDER_TOPIC_CONFIG_NAMESPACE)
        raise click.ClickException(
            f"topic {topic!r} has no order config.{did_you_mean(topic, known)}")
    if method == "delete":
        await client.delete_kv_config(ORDER_TOPIC_CONFIG_NAMESPACE, topic)
    if as_json:
        print_json({"topic": topic, "method": method, "orderConf": current})
        return
    click.echo(f"{method} orderConf success. topic={topic}, orderConf={current}")


@admin.command("topicClusterList")
@namesrv_option
@click.option("-t", "--topic", required=True)
@json_option
@with_admin
async def topic_cluster_list(client: Admin, topic: str, as_json: bool) -> None:
    """List the clusters a topic is on."""
    route = await client.topic_route(topic)
    clusters = sorted({broker.cluster for broker in route.broker_datas})
    if as_json:
        print_json(clusters)
        return
    for cluster in clusters:
        click.echo(cluster)


@admin.command("statsAll")
@namesrv_option
@click.option("-a", "--activeTopic", "active_only", is_flag=True,
              help="Only topics with at least one consumer group.")
@click.option("-t", "--topic", help="Only this topic.")
@json_option
@with_admin
async def stats_all(client: Admin, active_only: bool, topic: str | None, as_json: bool) -> None:
    """Per topic and consumer group: messages stored and not yet consumed.

    tidemq brokers keep no per-topic 24-hour counters (mqadmin's InTPS/OutTPS and 24h
    columns), so this shows what the offsets say: messages held and each group's lag.
    """
    topics = [topic] if topic else [t for t in await client.topic_list()
                                    if not t.startswith(("%RETRY%", "%DLQ%", "rmq_sys_"))]
    info = await client.cluster_list()
    groups_of: dict[str, set[str]] = {}
    for address in sorted(info.master_addresses().values()):
        for stored_topic, group in await client.consumer_offsets(address):
            groups_of.setdefault(stored_topic, set()).add(group)
    rows = []
    for name in topics:
        try:
            stats = await client.topic_stats(name)
        except TidemqError:
            if topic:
                raise
            continue  # a topic being deleted, or a built-in one without queues here
        held = sum(o.max_offset - o.min_offset for o in stats.values())
        groups = sorted(groups_of.get(name, ()))
        if not groups and not active_only:
            rows.append((name, None, held, None))
        for group in groups:
            lag = (await client.consume_stats(group, name)).total_lag
            rows.append((name, group, held, lag))
    if as_json:
        print_json([{"topic": t, "group": g, "messages": m, "accumulation": a}
                    for t, g, m, a in rows])
        return
    print_table("topics and groups", ("Topic", "Consumer Group", "Messages", "Accumulation"),
                rows)

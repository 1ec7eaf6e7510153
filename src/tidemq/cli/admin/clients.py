"""Client verbs: who is connected for a group, and how a topic's queues would be shared."""

from __future__ import annotations

import click

from tidemq.cli.admin.base import (
    admin,
    json_option,
    namesrv_option,
    print_json,
    print_table,
    with_admin,
)
from tidemq.client.admin import Admin
from tidemq.client.admin_groups import GroupConnections
from tidemq.client.rebalance import allocate_averagely


def _print_connections(title: str, found: GroupConnections) -> None:
    print_table(title, ("#", "ClientId", "ClientAddr", "Language", "Version"), [
        (index, c.get("clientId"), c.get("clientAddr"), c.get("language"), c.get("version"))
        for index, c in enumerate(found.connections, 1)])


def _connections_json(found: GroupConnections) -> dict[str, object]:
    return {"connectionSet": found.connections, "subscriptionTable": found.subscriptions,
            "consumeType": found.consume_type, "messageModel": found.message_model,
            "consumeFromWhere": found.consume_from_where}


@admin.command("consumerConnection")
@namesrv_option
@click.option("-g", "--consumerGroup", "group", required=True)
@click.option("-b", "--brokerAddr", "broker_addr", help="Ask this broker only.")
@json_option
@with_admin
async def consumer_connection(client: Admin, group: str, broker_addr: str | None,
                              as_json: bool) -> None:
    """List a consumer group's live members and what they subscribe."""
    found = await client.consumer_connection(group, broker_addr)
    if as_json:
        print_json(_connections_json(found))
        return
    _print_connections(f"consumers of group {group}", found)
    print_table("subscriptions", ("Topic", "SubExpression"), [
        (topic, data.get("subString")) for topic, data in sorted(found.subscriptions.items())])
    click.echo(f"ConsumeType: {found.consume_type}")
    click.echo(f"MessageModel: {found.message_model}")
    click.echo(f"ConsumeFromWhere: {found.consume_from_where}")


@admin.command("producerConnection")
@namesrv_option
@click.option("-g", "--producerGroup", "group", required=True)
@click.option("-t", "--topic", required=True)
@json_option
@with_admin
async def producer_connection(client: Admin, group: str, topic: str, as_json: bool) -> None:
    """List a producer group's live connections to a topic's brokers."""
    found = await client.producer_connection(group, topic)
    if as_json:
        print_json({"connectionSet": found.connections})
        return
    _print_connections(f"producers of group {group}", found)


@admin.command("allocateMQ")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-i", "--ipList", "ip_list", required=True,
              help="Consumer ids, comma separated (e.g. 10.0.0.1,10.0.0.2).")
@json_option
@with_admin
async def allocate_mq(client: Admin, topic: str, ip_list: str, as_json: bool) -> None:
    """Show how the average strategy shares a topic's queues among the given consumers."""
    members = sorted({member.strip() for member in ip_list.split(",") if member.strip()})
    if not members:
        raise click.BadParameter("give at least one consumer id", param_hint="-i")
    queues = sorted((await client.topic_route(topic)).subscribe_queues(topic))
    result = {member: allocate_averagely(queues, members, member) for member in members}
    if as_json:
        print_json({"result": {member: [queue.to_json() for queue in owned]
                               for member, owned in result.items()}})
        return
    print_table(f"allocation of {topic}", ("Consumer", "Broker Name", "QID"), [
        (member, queue.broker_name, queue.queue_id)
        for member, owned in result.items() for queue in owned])

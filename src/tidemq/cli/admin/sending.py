"""Verbs that send or consume test messages: sendMessage, consumeMessage, checkMsgSendRT,
clusterRT and sendMsgStatus (mqadmin's probes of a live cluster)."""

from __future__ import annotations

import os
import statistics
import time

import click

from tidemq.cli.admin.base import (
    admin,
    admin_security,
    json_option,
    namesrv_option,
    parse_time,
    print_json,
    print_table,
    with_admin,
)
from tidemq.cli.admin.messages import checked_queue, message_json, print_message_rows
from tidemq.client.admin import Admin
from tidemq.client.message import Message, MessageQueue
from tidemq.client.producer import Producer

TOOLS_PRODUCER_GROUP = "TOOLS_PRODUCER"  # the producer group of the admin tool's probes
_PROBE_SIZE_DEFAULT = 128  # bytes; mqadmin's default message size for send probes


def _producer(client: Admin) -> Producer:
    security = admin_security()  # the same keys and TLS as the admin client
    return Producer(TOOLS_PRODUCER_GROUP, client.namesrv_addresses,
                    credentials=security.credentials, tls=security.tls)


@admin.command("sendMessage")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-p", "--body", required=True, help="The message body (UTF-8 text).")
@click.option("-k", "--key", "keys", help="Keys, space separated.")
@click.option("-c", "--tags")
@click.option("-b", "--broker", "broker_name", help="Send to this broker (with -i).")
@click.option("-i", "--qid", "queue_id", type=int, help="Send to this queue (with -b).")
@json_option
@with_admin
async def send_message(client: Admin, topic: str, body: str, keys: str | None,
                       tags: str | None, broker_name: str | None, queue_id: int | None,
                       as_json: bool) -> None:
    """Send one message and show where it was stored."""
    queue = None
    if broker_name is not None or queue_id is not None:
        if broker_name is None or queue_id is None:
            raise click.UsageError("give -b brokerName and -i queueId together")
        queue = await checked_queue(client, topic, broker_name, queue_id)
    else:
        await client.topic_route(topic)
    async with _producer(client) as producer:
        result = await producer.send(
            Message(topic, body, tags=tags, keys=keys.split() if keys else None), queue=queue)
    row = {"brokerName": result.queue.broker_name, "queueId": result.queue.queue_id,
           "queueOffset": result.queue_offset, "sendStatus": result.status.name,
           "msgId": result.msg_id, "offsetMsgId": result.offset_msg_id}
    if as_json:
        print_json(row)
        return
    print_table(None, ("Broker Name", "Queue ID", "Queue Offset", "Send Result", "MsgId"),
                [(row["brokerName"], row["queueId"], row["queueOffset"], row["sendStatus"],
                  row["msgId"])])


@admin.command("consumeMessage")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-b", "--brokerName", "broker_name", help="Only this broker (with -i).")
@click.option("-i", "--queueId", "queue_id", type=int, help="Only this queue.")
@click.option("-o", "--offset", type=int, help="First queue offset (with -b and -i).")
@click.option("-g", "--consumerGroup", "group", help="Accepted for mqadmin compatibility; "
              "reads commit no offset.")
@click.option("-s", "--beginTimestamp", "begin", default="0", show_default=True)
@click.option("-e", "--endTimestamp", "end", default="now", show_default=True)
@click.option("-c", "--MessageNumber", "count", type=int, default=128, show_default=True)
@json_option
@with_admin
async def consume_message(client: Admin, topic: str, broker_name: str | None,
                          queue_id: int | None, offset: int | None, group: str | None,
                          begin: str, end: str, count: int, as_json: bool) -> None:
    """Read messages of a topic (or of one queue from an offset) without committing."""
    if offset is not None and (broker_name is None or queue_id is None):
        raise click.UsageError("-o needs -b brokerName and -i queueId")
    if broker_name is not None and queue_id is not None:
        queue = await checked_queue(client, topic, broker_name, queue_id)
        if offset is None:
            first, last = await client.offsets_between(queue, parse_time(begin),
                                                       parse_time(end))
        else:
            first, last = offset, None
        messages = [m async for m in client.queue_messages(queue, first, last,
                                                           max_num=count)]
    else:
        messages = [m async for m in client.topic_messages(
            topic, parse_time(begin), parse_time(end), max_num=count)]
    if as_json:
        print_json([message_json(message) for message in messages])
        return
    print_message_rows(f"messages of {topic}", messages, True, "utf-8")
    if not messages:
        click.echo("no message found")


async def _timed_sends(producer: Producer, queue: MessageQueue, amount: int,
                       size: int) -> list[float]:
    """Send ``amount`` probes of ``size`` bytes to ``queue``; the round trips in ms."""
    body = os.urandom(size // 2).hex().encode()[:size] or b"x"
    times = []
    for _ in range(amount):
        started = time.perf_counter()
        await producer.send(Message(queue.topic, body), queue=queue)
        times.append((time.perf_counter() - started) * 1000)
    return times


def _summary(times: list[float]) -> dict[str, float]:
    return {"count": len(times), "avgRT": round(statistics.fmean(times), 3),
            "maxRT": round(max(times), 3), "minRT": round(min(times), 3)}


@admin.command("checkMsgSendRT")
@namesrv_option
@click.option("-t", "--topic", required=True)
@click.option("-a", "--amount", type=click.IntRange(1, 100_000), default=100,
              show_default=True, help="Messages per queue.")
@click.option("-s", "--size", type=click.IntRange(1, 4 * 1024 * 1024),
              default=_PROBE_SIZE_DEFAULT, show_default=True, help="Message size in bytes.")
@json_option
@with_admin
async def check_msg_send_rt(client: Admin, topic: str, amount: int, size: int,
                            as_json: bool) -> None:
    """Time sends to every queue of a topic (round trip per message, in ms)."""
    queues = sorted((await client.topic_route(topic)).publish_queues(topic))
    results = []
    async with _producer(client) as producer:
        for queue in queues:
            results.append({**queue.to_json(),
                            **_summary(await _timed_sends(producer, queue, amount, size))})
    if as_json:
        print_json(results)
        return
    print_table(f"send RT to {topic} ({amount} x {size} B per queue)",
                ("Broker Name", "QID", "Sent", "Avg RT ms", "Max RT ms", "Min RT ms"),
                [(r["brokerName"], r["queueId"], r["count"], r["avgRT"], r["maxRT"],
                  r["minRT"]) for r in results])


@admin.command("clusterRT")
@namesrv_option
@click.option("-c", "--cluster", help="Only this cluster.")
@click.option("-a", "--amount", type=click.IntRange(1, 100_000), default=100,
              show_default=True, help="Messages per broker.")
@click.option("-s", "--size", type=click.IntRange(1, 4 * 1024 * 1024),
              default=_PROBE_SIZE_DEFAULT, show_default=True)
@click.option("-p", "--print", "print_log", type=bool, default=False,
              help="Accepted for mqadmin compatibility.")
@click.option("-m", "--machineRoom", "machine_room", default="noname",
              help="Shown in the output, as mqadmin does.")
@click.option("-i", "--interval", type=int, default=10,
              help="Accepted for mqadmin compatibility (one round is run).")
@json_option
@with_admin
async def cluster_rt(client: Admin, cluster: str | None, amount: int, size: int,
                     print_log: bool, machine_room: str, interval: int,
                     as_json: bool) -> None:
    """Time sends to every master (each broker's own topic, named after it)."""
    info = await client.cluster_list()
    await client.broker_targets(cluster, None)  # checks the cluster name
    results = []
    async with _producer(client) as producer:
        for cluster_name, names in sorted(info.clusters.items()):
            if cluster is not None and cluster_name != cluster:
                continue
            for name in sorted(names):
                times = await _timed_sends(producer, MessageQueue(name, name, 0), amount, size)
                results.append({"cluster": cluster_name, "brokerName": name,
                                "machineRoom": machine_room, **_summary(times)})
    if as_json:
        print_json(results)
        return
    print_table("send RT per broker", ("Cluster", "Broker Name", "Machine Room", "Sent",
                                       "Avg RT ms", "Max RT ms", "Min RT ms"),
                [(r["cluster"], r["brokerName"], r["machineRoom"], r["count"], r["avgRT"],
                  r["maxRT"], r["minRT"]) for r in results])


@admin.command("sendMsgStatus")
@namesrv_option
@click.option("-b", "--brokerName", "broker_name", required=True)
@click.option("-s", "--messageSize", "size", type=click.IntRange(1, 4 * 1024 * 1024),
              default=_PROBE_SIZE_DEFAULT, show_default=True)
@click.option("-c", "--count", type=click.IntRange(1, 100_000), default=50, show_default=True)
@json_option
@with_admin
async def send_msg_status(client: Admin, broker_name: str, size: int, count: int,
                          as_json: bool) -> None:
    """Send probes to one broker (its own topic) and show each round trip."""
    await client.check_broker_name(broker_name)
    async with _producer(client) as producer:
        times = await _timed_sends(producer, MessageQueue(broker_name, broker_name, 0), count,
                                   size)
    if as_json:
        print_json({"brokerName": broker_name, "rt": [round(t, 3) for t in times],
                    **_summary(times)})
        return
    for index, rt in enumerate(times, 1):
        click.echo(f"rt={rt:.3f}ms, #{index} to {broker_name}")
    click.echo(f"avg {statistics.fmean(times):.3f} ms, max {max(times):.3f} ms")

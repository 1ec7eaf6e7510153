"""Two name servers and two brokers as separate processes: messages through tidemq's Python
client are neither lost nor doubled, and a broker killed with SIGKILL costs nothing acked.

Each test starts its own cluster on free loopback ports (tests/integration/conftest.py).
Messages carry their number in a ``seq`` property, so what comes back can be matched to what
was sent field by field.
"""

from __future__ import annotations

import asyncio
import collections
import signal
from collections.abc import Iterable

import pytest

from tidemq.client import (
    Admin,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PullConsumer,
    SendResult,
    SendStatus,
)
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

pytestmark = pytest.mark.integration

BROKERS = ("broker-a", "broker-b")
QUEUES_PER_BROKER = 4
ROUTE_WAIT_S = 20.0
CONSUME_WAIT_S = 120.0  # bounds the read-back; 20,000 messages take a few seconds
ASYNC_IN_FLIGHT = 256  # concurrent sends on the async path
BATCH_SIZE = 100


def route_of(remoting_call, namesrv_addr: str, topic: str) -> dict | None:
    response = remoting_call(namesrv_addr, RemotingCommand.request(
        RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))
    return jsonx.loads(response.body) if response.code == ResponseCode.SUCCESS else None


def routed_brokers(remoting_call, namesrv_addr: str, topic: str) -> dict[str, int]:
    """Broker name -> write queue count in ``topic``'s route on one name server ({} = none)."""
    route = route_of(remoting_call, namesrv_addr, topic)
    if route is None:
        return {}
    live = {data["brokerName"] for data in route["brokerDatas"]}
    return {queue["brokerName"]: queue["writeQueueNums"] for queue in route["queueDatas"]
            if queue["brokerName"] in live}


def create_topic_everywhere(cluster, remoting_call, wait_until, topic: str) -> None:
    """Create ``topic`` with QUEUES_PER_BROKER queues on every master; wait for the routes."""

    async def create() -> list[str]:
        async with Admin(namesrv=cluster.namesrv_addr) as admin:
            return await admin.create_topic(topic, QUEUES_PER_BROKER)

    assert sorted(asyncio.run(create())) == sorted(b.addr for b in cluster.brokers)
    expected = {broker.name: QUEUES_PER_BROKER for broker in cluster.brokers}
    for namesrv in cluster.namesrvs:
        wait_until(lambda addr=namesrv.addr: routed_brokers(remoting_call, addr, topic)
                   == expected, timeout_s=ROUTE_WAIT_S,
                   what=f"{namesrv.name} to route {topic} on {sorted(expected)}")


def body_of(seq: int) -> bytes:
    """Bodies of several sizes, binary (not UTF-8), a few past the 4 KiB compression bar."""
    size = 5000 if seq % 997 == 0 else 16 + seq % 300
    stamp = seq.to_bytes(4, "big") + b"\xff\x00"
    return (stamp * (size // len(stamp) + 1))[:size]


def make_message(topic: str, seq: int, kind: str) -> Message:
    return Message(topic, body_of(seq), tags=f"tag-{kind}", keys=[f"key-{seq}", f"{kind}-key"],
                   properties={"seq": str(seq), "kind": kind, "note": f"n\u00e9-{seq % 5}"})


def assert_intact(message: MessageExt, topic: str, kind: str) -> None:
    seq = int(message.properties["seq"])
    assert message.topic == topic
    assert message.uncompressed_body() == body_of(seq), f"body of seq {seq}"
    assert message.tags == f"tag-{kind}"
    assert message.keys == [f"key-{seq}", f"{kind}-key"]
    assert message.properties["kind"] == kind
    assert message.properties["note"] == f"n\u00e9-{seq % 5}"


async def read_everything(namesrv: str, queues: Iterable[MessageQueue], expected: int,
                          group: str) -> list[MessageExt]:
    """Poll ``queues`` from their first offset until ``expected`` messages arrived (bounded)."""
    received: list[MessageExt] = []
    async with PullConsumer(group, namesrv=namesrv, consume_from="FIRST",
                            auto_commit=False) as consumer:
        consumer.assign(queues)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONSUME_WAIT_S
        while len(received) < expected and loop.time() < deadline:
            received.extend(await consumer.poll(timeout_ms=1000))
        # One more short poll: anything beyond `expected` is a duplicate and must show.
        received.extend(await consumer.poll(timeout_ms=500))
    return received


def test_20000_messages_sync_async_and_batch_through_two_brokers_none_lost_or_doubled(
        tidemq_cluster, remoting_call, wait_until):
    cluster = tidemq_cluster(namesrv_count=2, brokers=BROKERS)
    topic = "ClusterOrders"
    for namesrv in cluster.namesrvs:  # every broker registered with every name server
        response = remoting_call(namesrv.addr, RemotingCommand.request(
            RequestCode.GET_BROKER_CLUSTER_INFO))
        assert sorted(jsonx.loads(response.body)["clusterAddrTable"]["DefaultCluster"]) == [
            *BROKERS]
    create_topic_everywhere(cluster, remoting_call, wait_until, topic)
    plan = {"sync": range(0, 2000), "async": range(2000, 10_000),
            "batch": range(10_000, 20_000)}
    total = sum(len(seqs) for seqs in plan.values())

    async def produce() -> list[SendResult]:
        results: list[SendResult] = []
        async with Producer("cluster_producer", namesrv=cluster.namesrv_addr) as producer:
            for seq in plan["sync"]:
                results.append(await producer.send(make_message(topic, seq, "sync")))
            in_flight = asyncio.Semaphore(ASYNC_IN_FLIGHT)

            async def send_one(seq: int) -> SendResult:
                async with in_flight:
                    return await producer.send(make_message(topic, seq, "async"))

            results += await asyncio.gather(*(send_one(seq) for seq in plan["async"]))
            batch_seqs = list(plan["batch"])
            for start in range(0, len(batch_seqs), BATCH_SIZE):
                batch = [make_message(topic, seq, "batch")
                         for seq in batch_seqs[start:start + BATCH_SIZE]]
                results += await producer.send_batch(batch)
        return results

    results = asyncio.run(produce())
    assert {result.status for result in results} == {SendStatus.SEND_OK}
    assert sum(len(result.msg_ids) for result in results) == total
    used = collections.Counter(result.queue.broker_name for result in results)
    assert set(used) == set(BROKERS), f"sends should spread over both brokers: {used}"

    async def consume() -> list[MessageExt]:
        async with Admin(namesrv=cluster.namesrv_addr) as admin:
            queues = (await admin.topic_route(topic)).subscribe_queues(topic)
        assert len(queues) == QUEUES_PER_BROKER * len(BROKERS)
        return await read_everything(cluster.namesrv_addr, queues, total, "cluster_reader")

    received = asyncio.run(consume())
    seqs = collections.Counter(int(message.properties["seq"]) for message in received)
    doubled = sorted(seq for seq, count in seqs.items() if count > 1)
    lost = sorted(set(range(total)) - set(seqs))
    assert not doubled, f"{len(doubled)} messages came back twice, e.g. {doubled[:10]}"
    assert not lost, f"{len(lost)} messages are missing, e.g. {lost[:10]}"
    kind_of = {seq: kind for kind, seqs_of_kind in plan.items() for seq in seqs_of_kind}
    for message in received:
        assert_intact(message, topic, kind_of[int(message.properties["seq"])])
    # Per queue, messages come back in queue-offset order with no gap.
    by_queue: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    for message in received:
        by_queue[message.broker_name, message.queue_id].append(message.queue_offset)
    for queue, offsets in by_queue.items():
        assert offsets == list(range(len(offsets))), f"queue {queue} offsets"
    # The client's message id (UNIQ_KEY) of every send names exactly one stored message.
    sent_ids = {msg_id for result in results for msg_id in result.msg_ids}
    assert sent_ids == {message.unique_key for message in received}


def test_sigkill_of_one_broker_keeps_producers_going_and_loses_nothing_acked(
        tidemq_cluster, remoting_call, wait_until):
    # SYNC_FLUSH on broker-a: a send is acknowledged only once its bytes are on disk, so
    # "acked" means "survives SIGKILL" (with ASYNC_FLUSH the last 500 ms could be lost).
    cluster = tidemq_cluster(namesrv_count=2, brokers=BROKERS, broker_overrides={
        "broker-a": {"flushDiskType": "SYNC_FLUSH"}, "broker-b": {}})
    topic = "ClusterFailover"
    create_topic_everywhere(cluster, remoting_call, wait_until, topic)
    broker_a = cluster.broker("broker-a")
    before, after = 400, 400

    async def send_range(producer: Producer, seqs: range, kind: str) -> list[SendResult]:
        return [await producer.send(make_message(topic, seq, kind)) for seq in seqs]

    async def scenario() -> tuple[list[SendResult], list[SendResult]]:
        async with Producer("failover_producer", namesrv=cluster.namesrv_addr) as producer:
            acked_before = await send_range(producer, range(before), "before")
            broker_a.kill(signal.SIGKILL)
            # The name servers drop broker-a as soon as its connections close.
            for namesrv in cluster.namesrvs:
                await asyncio.to_thread(
                    wait_until,
                    lambda addr=namesrv.addr: routed_brokers(remoting_call, addr, topic)
                    == {"broker-b": QUEUES_PER_BROKER},
                    ROUTE_WAIT_S, what=f"{namesrv.name} to drop broker-a from the route")
            # The producer still holds the old route: sends that pick broker-a fail to
            # connect and are retried on broker-b; none may fail.
            acked_after = await send_range(producer, range(before, before + after), "after")
        return acked_before, acked_after

    acked_before, acked_after = asyncio.run(scenario())
    assert {r.queue.broker_name for r in acked_before} == set(BROKERS)
    assert {r.status for r in acked_before + acked_after} == {SendStatus.SEND_OK}
    assert {r.queue.broker_name for r in acked_after} == {"broker-b"}

    broker_a.start()  # same port, same store: recovers after the crash and registers again
    expected = {broker.name: QUEUES_PER_BROKER for broker in cluster.brokers}
    for namesrv in cluster.namesrvs:
        wait_until(lambda addr=namesrv.addr: routed_brokers(remoting_call, addr, topic)
                   == expected, timeout_s=ROUTE_WAIT_S, what=f"{namesrv.name} to route "
                   "broker-a again")

    async def read_broker_a() -> list[MessageExt]:
        queues = [MessageQueue(topic, "broker-a", queue_id)
                  for queue_id in range(QUEUES_PER_BROKER)]
        on_a = [r for r in acked_before if r.queue.broker_name == "broker-a"]
        return await read_everything(cluster.namesrv_addr, queues, len(on_a), "failover_reader")

    stored_on_a = asyncio.run(read_broker_a())
    acked_on_a = {r.msg_id: r for r in acked_before if r.queue.broker_name == "broker-a"}
    found = {message.unique_key: message for message in stored_on_a}
    missing = sorted(set(acked_on_a) - set(found))
    assert not missing, f"{len(missing)} messages acked by broker-a are gone after SIGKILL"
    assert len(stored_on_a) == len(acked_on_a), "nothing doubled, nothing unacked stored"
    for msg_id, result in acked_on_a.items():
        message = found[msg_id]
        assert (message.queue_id, message.queue_offset) == (result.queue.queue_id,
                                                            result.queue_offset)
        assert_intact(message, topic, "before")


def test_clients_find_routes_through_the_name_server_that_is_still_up(
        tidemq_cluster, remoting_call, wait_until):
    cluster = tidemq_cluster(namesrv_count=2, brokers=BROKERS)
    topic, count = "ClusterOneNamesrvDown", 200
    create_topic_everywhere(cluster, remoting_call, wait_until, topic)
    cluster.namesrvs[0].kill(signal.SIGKILL)  # the first one every client tries

    async def scenario() -> tuple[list[SendResult], list[MessageExt]]:
        # New clients: they have no cached route and must get one from the second server.
        async with Producer("one_namesrv_producer", namesrv=cluster.namesrv_addr) as producer:
            results = [await producer.send(make_message(topic, seq, "sync"))
                       for seq in range(count)]
        async with Admin(namesrv=cluster.namesrv_addr) as admin:
            queues = (await admin.topic_route(topic)).subscribe_queues(topic)
        return results, await read_everything(cluster.namesrv_addr, queues, count,
                                              "one_namesrv_reader")

    results, received = asyncio.run(scenario())
    assert {r.queue.broker_name for r in results} == set(BROKERS)
    assert sorted(int(m.properties["seq"]) for m in received) == list(range(count))

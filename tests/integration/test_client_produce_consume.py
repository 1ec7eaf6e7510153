"""The Python client against real ``tidemq namesrv`` and ``tidemq broker`` processes.

Every way of sending (sync, many concurrent awaits, batch, oneway, compressed, ordered by key)
and every way of reading back (poll, low-level pull, seek, commit) goes through the public
client API; what comes back is compared field by field with what was sent.
"""

from __future__ import annotations

import asyncio
import collections

import pytest

from server_processes import metric_value
from tidemq.client import (
    Admin,
    BrokerRejected,
    ConsumeFrom,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PullConsumer,
    PullStatus,
    SendStatus,
)
from tidemq.protocol.codes import ResponseCode
from tidemq.remoting.loop import run

pytestmark = pytest.mark.integration

QUEUES = 4
READ_WAIT_S = 60.0  # bounds every read-back; a healthy broker needs well under a second


async def create_topic(namesrv: str, topic: str, queues: int = QUEUES) -> list[MessageQueue]:
    """Create ``topic`` on every master and wait (bounded) until the name server routes it."""
    async with Admin(namesrv) as admin:
        await admin.create_topic(topic, queues)
        for _ in range(200):
            try:
                route = await admin.topic_route(topic)
                queues_found = route.subscribe_queues(topic)
                if queues_found:
                    return queues_found
            except Exception:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"topic {topic} never showed up in the route")


async def read_all(namesrv: str, queues: list[MessageQueue], expected: int, group: str,
                   **options) -> list[MessageExt]:
    received: list[MessageExt] = []
    options.setdefault("consume_from", "FIRST")
    async with PullConsumer(group, namesrv, **options) as consumer:
        consumer.assign(queues)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READ_WAIT_S
        while len(received) < expected and loop.time() < deadline:
            received.extend(await consumer.poll(500))
        received.extend(await consumer.poll(300))  # anything more would be a duplicate
    return received


def test_every_send_path_round_trips_bodies_keys_tags_and_properties(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    topic = "ClientRoundTrip"

    def message(seq: int, kind: str) -> Message:
        size = 20_000 if seq % 50 == 0 else 10 + seq % 200  # some past the 4 KiB compression bar
        body = (f"{kind}-{seq}|".encode() * (size // 8 + 1))[:size]
        return Message(topic, body, tags=f"tag-{kind}", keys=[f"k{seq}", kind],
                       properties={"seq": str(seq), "kind": kind, "uni": "ü€😀"}, flag=seq)

    async def scenario() -> tuple[dict[int, Message], list[MessageExt], dict[int, str]]:
        queues = await create_topic(namesrv, topic)
        sent: dict[int, Message] = {}
        ids: dict[int, str] = {}
        async with Producer("client_it_producer", namesrv) as producer:
            for seq in range(0, 100):
                sent[seq] = message(seq, "sync")
                result = await producer.send(sent[seq])
                assert result.status is SendStatus.SEND_OK
                ids[seq] = result.msg_id
            concurrent = [message(seq, "async") for seq in range(100, 600)]
            results = await asyncio.gather(*(producer.send(m) for m in concurrent))
            for m, result in zip(concurrent, results, strict=True):
                sent[int(m.properties["seq"])] = m
                ids[int(m.properties["seq"])] = result.msg_id
            batch = [message(seq, "batch") for seq in range(600, 1100)]
            for m in batch:
                m.body = m.body[:3000]  # batches are not compressed; keep them moderate
            batch_results = await producer.send_batch(batch)
            batch_ids = [i for r in batch_results for i in r.msg_ids]
            for m, msg_id in zip(batch, batch_ids, strict=True):
                sent[int(m.properties["seq"])] = m
                ids[int(m.properties["seq"])] = msg_id
            for seq in range(1100, 1150):
                sent[seq] = message(seq, "oneway")
                await producer.send_oneway(sent[seq])
        received = await read_all(namesrv, queues, len(sent), "client_it_reader")
        return sent, received, ids

    sent, received, ids = run(scenario())
    by_seq = collections.Counter(int(m.properties["seq"]) for m in received)
    assert sorted(by_seq) == sorted(sent), "every message sent comes back"
    assert set(by_seq.values()) == {1}, "and only once"
    for got in received:
        seq = int(got.properties["seq"])
        want = sent[seq]
        assert got.topic == topic
        assert got.body == want.body, f"body of {seq}"
        assert got.flag == seq
        assert got.tags == want.tags
        assert got.keys == want.keys
        assert got.properties["uni"] == "ü€😀"
        assert got.properties["kind"] == want.properties["kind"]
        assert got.unique_key == want.properties["UNIQ_KEY"]
        if seq in ids:
            assert got.msg_id == ids[seq]
        assert got.broker_name == "broker-a"


def test_same_sharding_key_keeps_one_queue_and_its_order(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    topic = "ClientOrdered"
    keys = [f"order-{n}" for n in range(8)]

    async def scenario() -> tuple[dict[str, set[MessageQueue]], list[MessageExt]]:
        queues = await create_topic(namesrv, topic)
        placed: dict[str, set[MessageQueue]] = collections.defaultdict(set)
        async with Producer("client_it_ordered", namesrv) as producer:
            for step in range(30):
                for key in keys:
                    result = await producer.send(
                        Message(topic, f"{key}:{step}", keys=key), sharding_key=key)
                    placed[key].add(result.queue)
        received = await read_all(namesrv, queues, 30 * len(keys), "client_it_ordered_reader")
        return placed, received

    placed, received = run(scenario())
    assert all(len(queue_set) == 1 for queue_set in placed.values())
    assert len({q for qs in placed.values() for q in qs}) > 1, "keys spread over queues"
    steps: dict[str, list[int]] = collections.defaultdict(list)
    for got in received:
        key, step = got.body.decode().split(":")
        assert MessageQueue(topic, got.broker_name, got.queue_id) in placed[key]
        steps[key].append(int(step))
    assert all(order == list(range(30)) for order in steps.values())


def test_consumer_commits_seeks_and_resumes_where_the_group_left_off(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    topic = "ClientOffsets"

    async def scenario() -> None:
        queues = await create_topic(namesrv, topic, queues=1)
        (queue,) = queues
        async with Producer("client_it_offsets", namesrv) as producer:
            for i in range(60):
                await producer.send(Message(topic, f"m{i}", tags="even" if i % 2 == 0
                                            else "odd"))
        # auto_commit off: with it, close() would commit the position (60) over our 40.
        async with PullConsumer("client_it_group", namesrv, consume_from=ConsumeFrom.FIRST,
                                max_poll_records=25, auto_commit=False) as consumer:
            consumer.assign(queues)
            first = await consumer.poll(5000)
            assert [m.body for m in first] == [f"m{i}".encode() for i in range(25)]
            await consumer.commit_sync()
            assert await consumer.committed(queue) == 25
            await consumer.seek(queue, 10)
            again = await consumer.poll(5000)
            assert again[0].body == b"m10"
            await consumer.seek_to_end(queue)
            assert consumer.position(queue) == 60
            await consumer.commit_sync({queue: 40})
        # A new consumer of the same group starts at the committed offset.
        async with PullConsumer("client_it_group", namesrv, consume_from="LAST") as resumed:
            resumed.assign(queues, "even")
            got = await resumed.poll(5000)
            assert got and got[0].body == b"m40"
            assert {m.tags for m in got} == {"even"}
        # The low-level pull sees the queue bounds and the end.
        async with PullConsumer("client_it_tool", namesrv) as tool:
            result = await tool.pull(queue, 55, 32)
            assert result.status is PullStatus.FOUND
            assert [m.queue_offset for m in result.messages] == list(range(55, 60))
            assert (result.min_offset, result.max_offset) == (0, 60)
            at_end = await tool.pull(queue, 60)
            assert at_end.status is PullStatus.NO_NEW_MSG

    run(scenario())


def test_poll_long_polls_until_a_message_arrives(tidemq_cluster, free_port):
    metrics_port = free_port()
    cluster = tidemq_cluster(broker_overrides={"metricsExporterType": "PROM",
                                               "metricsPromExporterPort": metrics_port})
    namesrv = cluster.namesrv_addr
    topic = "ClientLongPoll"
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"

    async def scenario() -> None:
        queues = await create_topic(namesrv, topic, queues=1)
        async with PullConsumer("client_it_lp", namesrv, consume_from="LAST") as consumer, \
                Producer("client_it_lp_producer", namesrv) as producer:
            consumer.assign(queues)
            assert await consumer.poll(300) == []
            # LAST is resolved by the first fetch, which on a busy machine can come after that
            # poll: a message sent before it would not be new to this consumer.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while consumer.position(queues[0]) is None and loop.time() < deadline:
                await asyncio.sleep(0.05)
            assert consumer.position(queues[0]) == 0
            waiting = asyncio.ensure_future(consumer.poll(20_000))
            # The message is sent once the broker holds the consumer's pull (its fetch runs
            # in the background), so it is the arrival that answers the long poll.
            deadline = loop.time() + READ_WAIT_S
            while await loop.run_in_executor(None, metric_value, metrics_url,
                                              "tidemq_broker_pulls_parked") < 1:
                assert loop.time() < deadline, f"no pull parked after {READ_WAIT_S} s"
                assert not waiting.done(), f"poll returned {waiting.result()} before a send"
                await asyncio.sleep(0.05)
            assert not waiting.done()
            await producer.send(Message(topic, b"wake up"))
            got = await waiting
            assert [m.body for m in got] == [b"wake up"]

    run(scenario())


def test_group_members_share_a_topics_queues(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    topic = "ClientGroupShare"

    async def scenario() -> None:
        await create_topic(namesrv, topic, queues=6)
        one = PullConsumer("client_it_share", namesrv, instance_name="one")
        two = PullConsumer("client_it_share", namesrv, instance_name="two")
        one.subscribe(topic)
        two.subscribe(topic)
        await one.start()
        await two.start()
        try:
            for _ in range(100):  # bounded: a broker notifies members within moments
                await one.rebalance()
                await two.rebalance()
                mine, theirs = set(one.assignment()), set(two.assignment())
                if mine and theirs and not mine & theirs and len(mine | theirs) == 6:
                    break
                await asyncio.sleep(0.1)
            assert len(mine) == len(theirs) == 3 and not mine & theirs
        finally:
            await two.close()
            await one.close()

    run(scenario())


def test_broker_refusal_surfaces_as_typed_error(tidemq_cluster):
    cluster = tidemq_cluster(broker_overrides={"autoCreateTopicEnable": "false"})
    namesrv = cluster.namesrv_addr

    async def scenario() -> None:
        await create_topic(namesrv, "ClientKnown", queues=1)
        async with Producer("client_it_refusal", namesrv) as producer:
            with pytest.raises(BrokerRejected) as caught:
                await producer.send(Message("ClientKnown", b"x"),
                                    queue=MessageQueue("ClientKnown", "broker-a", 99))
            assert caught.value.code == ResponseCode.SYSTEM_ERROR
            assert caught.value.remark

    run(scenario())

"""PushConsumer against real name server and broker processes: groups share queues without
loss or duplicates, groups and broadcasting consumers each get everything, tag filters work
on the broker, failed messages come back on the retry schedule and end in the DLQ, from
where ``tidemq admin`` redrives them.

Consumers run in this process on one event loop; servers are real processes on loopback
(tests/integration/conftest.py). Waits are bounded; nothing asserts how fast things are,
except that a retry never comes before its delay level allows.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Callable

import orjson
import pytest
from click.testing import CliRunner

from tidemq.cli.admin_command import admin as admin_cli
from tidemq.client import (
    Admin,
    ConsumeResult,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)

pytestmark = pytest.mark.integration

BROKERS = ("broker-a", "broker-b")
QUEUES_PER_BROKER = 4
ROUTE_WAIT_S = 20.0
ASSIGN_WAIT_S = 60.0
CONSUME_WAIT_S = 120.0
BATCH = 200
# Short delay levels: a first retry (level 3) waits 1 s, the second (level 4) 2 s, the third
# (level 5) 4 s; the rest 1 s.
DELAY_LEVELS = "1s 1s 1s 2s 4s " + " ".join(["1s"] * 13)
LEVEL_DELAY_S = {3: 1.0, 4: 2.0, 5: 4.0}


async def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` on the loop until true; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def create_topic(namesrv: str, topic: str, queues: int = QUEUES_PER_BROKER) -> None:
    """Create ``topic`` on every master and wait until the name server routes all of them."""
    async with Admin(namesrv) as admin:
        masters = await admin.create_topic(topic, queues)
        deadline = time.monotonic() + ROUTE_WAIT_S
        while True:
            try:
                route = await admin.topic_route(topic)
                if len(route.queue_datas) == len(masters):
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic} not routed on {len(masters)} brokers")
            await asyncio.sleep(0.1)


async def produce(namesrv: str, topic: str, bodies: list[str], tags: str | None = None) -> None:
    async with Producer("push_it_producer", namesrv) as producer:
        for start in range(0, len(bodies), BATCH):
            await producer.send_batch([Message(topic, body, tags=tags)
                                       for body in bodies[start:start + BATCH]])


def consumer_of(namesrv: str, group: str, topic: str, expression: str = "*",
                **options) -> PushConsumer:
    options.setdefault("consume_from", "FIRST")
    consumer = PushConsumer(group, namesrv, **options)
    consumer.subscribe(topic, expression)
    return consumer


async def stable_assignment(consumers: list[PushConsumer], topic: str, queue_count: int) -> None:
    """Wait until the consumers own every queue of ``topic`` exactly once between them."""

    def stable() -> bool:
        owned = [q for c in consumers for q in c.assignment() if q.topic == topic]
        return len(owned) == queue_count and len(set(owned)) == queue_count

    await wait_for(stable, ASSIGN_WAIT_S, f"{len(consumers)} consumers to share {topic}")


def test_three_consumers_of_a_group_consume_every_message_once(tidemq_cluster):
    cluster = tidemq_cluster(brokers=BROKERS)
    topic, total = "PushShared", 30_000
    bodies = [f"m-{i}" for i in range(total)]

    async def main() -> collections.Counter[str]:
        await create_topic(cluster.namesrv_addr, topic)
        seen: collections.Counter[str] = collections.Counter()
        consumers = []
        for index in range(3):
            consumer = consumer_of(cluster.namesrv_addr, "push_it_shared", topic,
                                   instance_name=f"shared-{index}", pull_batch_size=64)

            @consumer.listener
            def on_messages(messages: list[MessageExt]) -> ConsumeResult:
                for message in messages:
                    seen[message.body.decode()] += 1
                return ConsumeResult.SUCCESS

            consumers.append(consumer)
        try:
            for consumer in consumers:
                await consumer.start()
            await stable_assignment(consumers, topic, len(BROKERS) * QUEUES_PER_BROKER)
            shares = [len([q for q in c.assignment() if q.topic == topic]) for c in consumers]
            assert sorted(shares) == [2, 3, 3]
            await produce(cluster.namesrv_addr, topic, bodies)
            await wait_for(lambda: len(seen) == total, CONSUME_WAIT_S, "every message")
            await asyncio.sleep(1.0)  # anything consumed twice would show up by now
        finally:
            for consumer in consumers:
                await consumer.close()
        assert sum(c.stats().consumed for c in consumers) == sum(seen.values())
        return seen

    seen = asyncio.run(main())
    assert set(seen) == set(bodies)
    assert [body for body, count in seen.items() if count > 1] == []


def test_two_groups_each_receive_every_message(tidemq_cluster):
    cluster = tidemq_cluster(brokers=BROKERS)
    topic, total = "PushTwoGroups", 2_000
    bodies = [f"g-{i}" for i in range(total)]

    async def main() -> dict[str, collections.Counter[str]]:
        await create_topic(cluster.namesrv_addr, topic)
        seen = {group: collections.Counter() for group in ("push_it_g1", "push_it_g2")}
        consumers = []
        for group, counter in seen.items():
            for index in range(2):
                consumer = consumer_of(cluster.namesrv_addr, group, topic,
                                       instance_name=f"{group}-{index}")

                @consumer.listener
                async def on_messages(messages, counter=counter):
                    counter.update(m.body.decode() for m in messages)

                consumers.append(consumer)
        try:
            for consumer in consumers:
                await consumer.start()
            for group in seen:
                await stable_assignment([c for c in consumers if c.group == group], topic,
                                        len(BROKERS) * QUEUES_PER_BROKER)
            await produce(cluster.namesrv_addr, topic, bodies)
            await wait_for(lambda: all(len(c) == total for c in seen.values()),
                           CONSUME_WAIT_S, "both groups to get every message")
        finally:
            for consumer in consumers:
                await consumer.close()
        return seen

    for group, counter in asyncio.run(main()).items():
        assert set(counter) == set(bodies), group
        assert max(counter.values()) == 1, group


def test_broadcasting_consumers_each_get_every_message_and_resume_from_local_offsets(
        tidemq_cluster, tmp_path):
    cluster = tidemq_cluster(brokers=BROKERS)
    topic = "PushBroadcast"
    first = [f"b1-{i}" for i in range(300)]
    second = [f"b2-{i}" for i in range(200)]

    def broadcaster(index: int, counter: collections.Counter[str]) -> PushConsumer:
        consumer = consumer_of(cluster.namesrv_addr, "push_it_broadcast", topic,
                               message_model="BROADCASTING", instance_name=f"bc-{index}",
                               offset_store_dir=str(tmp_path / "offsets"))

        @consumer.listener
        def on_messages(messages):
            counter.update(m.body.decode() for m in messages)

        return consumer

    async def main() -> tuple[list[collections.Counter[str]], collections.Counter[str]]:
        await create_topic(cluster.namesrv_addr, topic)
        counters = [collections.Counter() for _ in range(3)]
        consumers = [broadcaster(i, counters[i]) for i in range(3)]
        restarted_counter: collections.Counter[str] = collections.Counter()
        try:
            for consumer in consumers:
                await consumer.start()
            for consumer in consumers:  # broadcasting: each owns every queue, no retry topic
                assert len(consumer.assignment()) == len(BROKERS) * QUEUES_PER_BROKER
            await produce(cluster.namesrv_addr, topic, first)
            await wait_for(lambda: all(len(c) == len(first) for c in counters),
                           CONSUME_WAIT_S, "every broadcasting consumer to get every message")
            await consumers[0].close()  # commits its offsets to its local file
            await produce(cluster.namesrv_addr, topic, second)
            await wait_for(lambda: all(len(c) == len(first) + len(second)
                                       for c in counters[1:]), CONSUME_WAIT_S,
                           "the running consumers to get the second round")
            consumers[0] = broadcaster(0, restarted_counter)
            await consumers[0].start()
            await wait_for(lambda: len(restarted_counter) == len(second), CONSUME_WAIT_S,
                           "the restarted consumer to catch up")
            await asyncio.sleep(1.0)
        finally:
            for consumer in consumers:
                await consumer.close()
        return counters, restarted_counter

    counters, restarted = asyncio.run(main())
    assert set(counters[0]) == set(first)
    for counter in counters[1:]:
        assert set(counter) == set(first + second)
        assert max(counter.values()) == 1
    # The restarted consumer resumed from its file: the second round only, nothing again.
    assert set(restarted) == set(second)
    assert max(restarted.values()) == 1


def test_tag_filter_delivers_only_matching_messages_and_the_broker_skips_the_rest(
        tidemq_cluster):
    cluster = tidemq_cluster(brokers=BROKERS)
    topic = "PushTags"

    async def main() -> tuple[collections.Counter[str], object]:
        await create_topic(cluster.namesrv_addr, topic)
        tags_seen: collections.Counter[str] = collections.Counter()
        consumer = consumer_of(cluster.namesrv_addr, "push_it_tags", topic, "TagA || TagC")

        @consumer.listener
        def on_messages(messages):
            tags_seen.update(m.tags for m in messages)

        try:
            await consumer.start()
            for tag in ("TagA", "TagB", "TagC", "TagB"):
                await produce(cluster.namesrv_addr, topic,
                              [f"{tag}-{i}" for i in range(250)], tags=tag)
            await wait_for(lambda: sum(tags_seen.values()) >= 500, CONSUME_WAIT_S,
                           "the TagA and TagC messages")
            await asyncio.sleep(1.0)
            stats = consumer.stats()
        finally:
            await consumer.close()
        return tags_seen, stats

    tags_seen, stats = asyncio.run(main())
    assert tags_seen == {"TagA": 250, "TagC": 250}
    # The broker filtered by tag code: only matching messages were ever pulled, none had to
    # be dropped on the client.
    assert stats.messages_pulled == 500
    assert stats.messages_filtered == 0


def test_failed_message_returns_with_growing_reconsume_times_after_each_delay_level(
        tidemq_cluster):
    cluster = tidemq_cluster(brokers=("broker-a",),
                             broker_overrides={"messageDelayLevel": DELAY_LEVELS})
    topic = "PushRetry"

    async def main() -> list[tuple[float, MessageExt]]:
        await create_topic(cluster.namesrv_addr, topic, 2)
        deliveries: list[tuple[float, MessageExt]] = []
        consumer = consumer_of(cluster.namesrv_addr, "push_it_retry", topic)

        @consumer.listener
        def on_messages(messages):
            deliveries.extend((time.time(), m) for m in messages)
            if messages[0].reconsume_times < 3:
                return ConsumeResult.RECONSUME_LATER
            return ConsumeResult.SUCCESS

        try:
            await consumer.start()
            await produce(cluster.namesrv_addr, topic, ["retry-me"], tags="t")
            await wait_for(lambda: len(deliveries) >= 4, CONSUME_WAIT_S, "4 deliveries")
            await asyncio.sleep(2.0)  # a fifth delivery would be a bug
        finally:
            await consumer.close()
        return deliveries

    deliveries = asyncio.run(main())
    assert [m.reconsume_times for _, m in deliveries] == [0, 1, 2, 3]
    assert {m.body for _, m in deliveries} == {b"retry-me"}
    assert {m.topic for _, m in deliveries} == {topic}  # shown with the original topic
    assert len({m.msg_id for _, m in deliveries}) == 1  # the same message id each time
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(deliveries)]
    for gap, level in zip(gaps, (3, 4, 5), strict=True):
        # never before its level's delay (clock granularity aside)
        assert gap >= LEVEL_DELAY_S[level] - 0.05, (gaps, level)
    assert gaps[2] > gaps[0]  # the 4 s level waits longer than the 1 s one


def test_always_failing_message_lands_in_the_dlq_and_is_redriven_by_the_admin_cli(
        tidemq_cluster):
    cluster = tidemq_cluster(brokers=("broker-a",),
                             broker_overrides={"messageDelayLevel": DELAY_LEVELS})
    topic, group = "PushDead", "push_it_dead"
    namesrv = cluster.namesrv_addr

    async def fail_until_dead() -> list[int]:
        await create_topic(namesrv, topic, 2)
        tries: list[int] = []
        consumer = consumer_of(namesrv, group, topic, max_reconsume_times=2)

        @consumer.listener
        async def on_messages(messages):
            tries.extend(m.reconsume_times for m in messages)
            raise RuntimeError("this listener always fails")

        try:
            await consumer.start()
            await produce(namesrv, topic, ["doomed"], tags="d")
            async with Admin(namesrv) as admin:
                await wait_for(lambda: len(tries) >= 3, CONSUME_WAIT_S, "3 failed deliveries")
                deadline = time.monotonic() + CONSUME_WAIT_S
                while not await admin.dead_letters(group):
                    assert time.monotonic() < deadline, "no dead letter arrived"
                    await asyncio.sleep(0.2)
            await asyncio.sleep(1.5)  # no fourth delivery after the DLQ
        finally:
            await consumer.close()
        return tries

    tries = asyncio.run(fail_until_dead())
    assert tries == [0, 1, 2]  # first delivery and max_reconsume_times=2 retries, then DLQ

    runner = CliRunner()
    listed = runner.invoke(admin_cli, ["dlqList", "-n", namesrv, "-g", group, "--json"])
    assert listed.exit_code == 0, listed.output
    letters = orjson.loads(listed.output)
    assert len(letters) == 1
    assert letters[0]["originalTopic"] == topic and letters[0]["redriven"] is False
    assert letters[0]["body"] == "doomed"
    msg_id = letters[0]["msgId"]

    async def consume_redriven() -> list[MessageExt]:
        got: list[MessageExt] = []
        consumer = consumer_of(namesrv, group, topic)

        @consumer.listener
        def on_messages(messages):
            got.extend(messages)

        try:
            await consumer.start()
            redriven = await asyncio.to_thread(
                runner.invoke, admin_cli, ["dlqRedrive", "-n", namesrv, "-g", group, "--all"])
            assert redriven.exit_code == 0, redriven.output
            assert msg_id in redriven.output
            await wait_for(lambda: len(got) >= 1, CONSUME_WAIT_S, "the redriven message")
            await asyncio.sleep(1.0)
        finally:
            await consumer.close()
        return got

    got = asyncio.run(consume_redriven())
    assert [(m.body, m.topic, m.msg_id, m.reconsume_times) for m in got] == [
        (b"doomed", topic, msg_id, 0)]
    again = runner.invoke(admin_cli, ["dlqList", "-n", namesrv, "-g", group, "--json"])
    assert [letter["redriven"] for letter in orjson.loads(again.output)] == [True]
    nothing = runner.invoke(admin_cli, ["dlqRedrive", "-n", namesrv, "-g", group, "--all"])
    assert nothing.exit_code == 0 and "no dead letter to redrive" in nothing.output


def test_rebalance_spreads_queues_by_the_chosen_strategy(tidemq_cluster):
    cluster = tidemq_cluster(brokers=BROKERS)
    topic = "PushCircle"

    async def main() -> list[list[MessageQueue]]:
        await create_topic(cluster.namesrv_addr, topic)
        consumers = [consumer_of(cluster.namesrv_addr, "push_it_circle", topic,
                                 allocation="AVG_BY_CIRCLE", instance_name=f"circle-{i}")
                     for i in range(2)]
        for consumer in consumers:
            consumer.listener(lambda messages: None)
        try:
            for consumer in consumers:
                await consumer.start()
            await stable_assignment(consumers, topic, len(BROKERS) * QUEUES_PER_BROKER)
            return [[q for q in c.assignment() if q.topic == topic] for c in consumers]
        finally:
            for consumer in consumers:
                await consumer.close()

    shares = asyncio.run(main())
    for share in shares:  # dealt like cards: each member gets queues of both brokers
        assert {q.broker_name for q in share} == set(BROKERS)
        assert len(share) == QUEUES_PER_BROKER

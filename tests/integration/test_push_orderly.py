"""Orderly push consumption against real brokers: per sharding key, every message exactly
once and in order, while queues move between two consumers and one of them restarts.

Messages of 20 sharding keys (500 each, numbered) go to a topic of 4 queues on 2 brokers.
Two orderly consumers of one group consume them; midway one consumer is closed and a new one
(a new member: another client id) joins. Queue locks on the brokers must make every handoff
clean: the delivery log, across all consumers in the order the listener saw the messages,
holds each key's numbers 0..499 strictly increasing with no gap and no repeat.
"""

from __future__ import annotations

import asyncio
import collections
import time

import pytest

from tidemq.client import Admin, ConsumeResult, Message, MessageExt, Producer, PushConsumer

pytestmark = pytest.mark.integration

BROKERS = ("broker-a", "broker-b")
QUEUES_PER_BROKER = 2
TOPIC = "PushOrderly"
GROUP = "push_it_orderly"
KEYS = [f"key-{k:02d}" for k in range(20)]
PER_KEY = 500
CONSUME_WAIT_S = 180.0
ROUTE_WAIT_S = 20.0


async def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


def test_orderly_consumers_keep_each_key_in_order_across_a_restart(tidemq_cluster):
    cluster = tidemq_cluster(brokers=BROKERS)
    namesrv = cluster.namesrv_addr
    log: list[tuple[str, str, int]] = []  # (consumer, key, number) in delivery order
    failures_injected = 0

    def orderly_consumer(name: str) -> PushConsumer:
        consumer = PushConsumer(GROUP, namesrv, consume_from="FIRST", instance_name=name,
                                suspend_current_queue_time_ms=100)

        @consumer.orderly_listener
        async def on_messages(messages: list[MessageExt]) -> ConsumeResult:
            nonlocal failures_injected
            message = messages[0]
            key, number = message.body.decode().split(":")
            if int(number) == 250 and message.reconsume_times == 0:
                failures_injected += 1  # fail once: the same message must come again first
                return ConsumeResult.SUSPEND_CURRENT_QUEUE_A_MOMENT
            await asyncio.sleep(0.0005)  # slow enough for the restart to land midway
            log.append((name, key, int(number)))
            return ConsumeResult.SUCCESS

        consumer.subscribe(TOPIC, "*")
        return consumer

    async def produce() -> None:
        async with Producer("push_it_orderly_producer", namesrv) as producer:
            async def send_key(key: str) -> None:
                for number in range(PER_KEY):
                    await producer.send(Message(TOPIC, f"{key}:{number}"), sharding_key=key)

            await asyncio.gather(*(send_key(key) for key in KEYS))

    async def main() -> list[str]:
        async with Admin(namesrv) as admin:
            await admin.create_topic(TOPIC, QUEUES_PER_BROKER)
            deadline = time.monotonic() + ROUTE_WAIT_S
            while len((await admin.topic_route(TOPIC)).queue_datas) < len(BROKERS):
                assert time.monotonic() < deadline, "topic not routed on both brokers"
                await asyncio.sleep(0.1)
        first, second = orderly_consumer("orderly-a"), orderly_consumer("orderly-b")
        replacement = orderly_consumer("orderly-c")
        try:
            await first.start()
            await second.start()
            producing = asyncio.ensure_future(produce())
            await wait_for(lambda: len(log) >= len(KEYS) * PER_KEY * 2 // 5, CONSUME_WAIT_S,
                           "two fifths of the messages")
            await second.close()  # commits, unlocks, leaves: its queues move to the first
            await replacement.start()  # a new member: queues move again
            await producing
            await wait_for(lambda: len(log) >= len(KEYS) * PER_KEY, CONSUME_WAIT_S,
                           "every message")
            await asyncio.sleep(1.0)  # a repeat would show up by now
        finally:
            for consumer in (first, second, replacement):
                await consumer.close()
        return sorted({name for name, _, _ in log})

    consumers = asyncio.run(main())
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    for _, key, number in log:
        per_key[key].append(number)
    assert sorted(per_key) == KEYS
    for key, numbers in per_key.items():
        assert numbers == list(range(PER_KEY)), f"{key} out of order, repeated or missing"
    assert consumers == ["orderly-a", "orderly-b", "orderly-c"]  # all three took part
    assert failures_injected == len(KEYS)

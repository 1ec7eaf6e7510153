"""Admin questions a broker forwards to live consumers, end to end over real processes.

A PushConsumer runs in this process against a real name server and broker; an Admin (and
``tidemq admin`` in a subprocess) asks through the broker for its running info
(GET_CONSUMER_RUNNING_INFO), its own offsets (INVOKE_BROKER_TO_GET_CONSUMER_STATUS ->
GET_CONSUMER_STATUS_FROM_CLIENT), and resets the group's offsets while it runs
(INVOKE_BROKER_TO_RESET_OFFSET -> RESET_CONSUMER_CLIENT_OFFSET): the live consumer gets every
message again without a restart. Waits are bounded; nothing is timed.
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
import time

import orjson
import pytest

from tidemq.client import (
    Admin,
    ConsumeResult,
    Message,
    MessageQueue,
    NoRouteError,
    Producer,
    PushConsumer,
)

pytestmark = pytest.mark.integration

TOPIC = "ConsumerAdminTopic"
GROUP = "consumer_admin_group"
QUEUES = 2
MESSAGES = 10
WAIT_S = 60.0
CLI_TIMEOUT_S = 120.0


async def wait_for(condition, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def wait_for_route(admin: Admin) -> None:
    for _ in range(400):  # x 0.05 s
        try:
            await admin.topic_route(TOPIC)
            return
        except NoRouteError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"{TOPIC} never routed")


async def tidemq_admin_json(namesrv: str, *args: str) -> object:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tidemq", "admin", *args, "-n", namesrv, "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL, env={**os.environ, "COLUMNS": "200"})
    try:
        async with asyncio.timeout(CLI_TIMEOUT_S):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode == 0, stderr.decode()
    return orjson.loads(stdout)


def test_admin_reaches_a_live_consumer_through_the_broker(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    queues = [MessageQueue(TOPIC, "broker-a", queue_id) for queue_id in range(QUEUES)]
    received: collections.Counter[bytes] = collections.Counter()

    async def scenario() -> None:
        async with Admin(namesrv) as admin:
            await admin.create_topic(TOPIC, QUEUES)
            await wait_for_route(admin)
            async with Producer("consumer_admin_producer", namesrv) as producer:
                for i in range(MESSAGES):
                    await producer.send(Message(TOPIC, f"m-{i}"), queue=queues[i % QUEUES])
            consumer = PushConsumer(GROUP, namesrv, consume_from="FIRST",
                                    persist_consumer_offset_interval_ms=200)

            @consumer.listener
            async def on_messages(messages) -> ConsumeResult:
                received.update(message.body for message in messages)
                return ConsumeResult.SUCCESS

            consumer.subscribe(TOPIC, "*")
            async with consumer:
                await wait_for(lambda: len(received) == MESSAGES, "the first delivery")
                await wait_for(lambda: sum(consumer.consumer_offsets(TOPIC).values())
                               == MESSAGES, "the consumer's offsets to reach the end")
                await check_running_info(admin, consumer)
                await check_consumer_status(admin, consumer)
                await check_cli(namesrv, consumer)
                await check_reset_reaches_the_live_consumer(admin)

    async def check_running_info(admin: Admin, consumer: PushConsumer) -> None:
        info = await admin.consumer_running_info(GROUP, consumer.client_id, jstack=True)
        assert info.properties["consumerGroup"] == GROUP
        assert info.properties["PROP_CONSUMEORDERLY"] == "false"
        assert {s["topic"] for s in info.subscriptions} == {TOPIC, f"%RETRY%{GROUP}"}
        assert set(queues) <= set(info.queues)
        assert sum(info.queues[queue]["commitOffset"] for queue in queues) == MESSAGES
        assert "tidemq" in (info.jstack or "")  # the consumer's own frames are in its stacks
        with pytest.raises(NoRouteError, match="nobody@0"):
            await admin.consumer_running_info(GROUP, "nobody@0")

    async def check_consumer_status(admin: Admin, consumer: PushConsumer) -> None:
        status = await admin.consumer_status(GROUP, TOPIC)
        assert status == {consumer.client_id: {queue: MESSAGES // QUEUES for queue in queues}}

    async def check_cli(namesrv: str, consumer: PushConsumer) -> None:
        shown = await tidemq_admin_json(namesrv, "getConsumerStatus", "-g", GROUP, "-t", TOPIC)
        assert sorted(entry["offset"] for entry in shown[consumer.client_id]) == [5, 5]
        shown = await tidemq_admin_json(namesrv, "consumerStatus", "-g", GROUP, "-i",
                                        consumer.client_id)
        assert shown["properties"]["consumerGroup"] == GROUP

    async def check_reset_reaches_the_live_consumer(admin: Admin) -> None:
        reset = await admin.reset_offset_by_time(GROUP, TOPIC, 0)
        assert reset == {queue: 0 for queue in queues}
        await wait_for(lambda: all(count == 2 for count in received.values()),
                       "every message a second time after the reset")

    asyncio.run(scenario())
    assert received == {f"m-{i}".encode(): 2 for i in range(MESSAGES)}


def test_reset_without_live_consumers_commits_directly(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    queue = MessageQueue(TOPIC, "broker-a", 0)

    async def scenario() -> None:
        async with Admin(namesrv) as admin:
            await admin.create_topic(TOPIC, 1)
            await wait_for_route(admin)
            async with Producer("consumer_admin_producer", namesrv) as producer:
                for i in range(3):
                    await producer.send(Message(TOPIC, f"m-{i}"), queue=queue)
            assert await admin.reset_offset_by_time(GROUP, TOPIC, -1) == {queue: 3}
            assert await admin.committed_offset(GROUP, queue) == 3
            with pytest.raises(NoRouteError, match=GROUP):
                await admin.consumer_status(GROUP, TOPIC)

    asyncio.run(scenario())

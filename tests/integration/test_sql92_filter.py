"""SQL92 property filters end to end: a PushConsumer subscribed with SQL92 gets exactly the
matching messages from a real broker with enablePropertyFilter=true, while another group with
a TAG subscription on the same topic gets its own share; a broker with the setting off makes
the SQL92 consumer's start fail with the broker's reason and the fix.

Consumers run in this process on one event loop; servers are real processes on loopback.
Waits are bounded; nothing asserts how fast things are.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

import pytest

from tidemq.client import Admin, Message, MessageExt, Producer, PushConsumer
from tidemq.client.errors import InvalidSubscription
from tidemq.protocol.codes import ResponseCode

pytestmark = pytest.mark.integration

QUEUES = 4
ROUTE_WAIT_S = 20.0
CONSUME_WAIT_S = 120.0
TOTAL = 200
SQL = "region = 'eu' AND amount > 100 OR vip IS NOT NULL"


def message_of(index: int) -> Message:
    """Mixed properties: regions alternate, amounts climb, every 7th is a vip, some lack
    amount, tags cycle A/B/C."""
    properties = {"region": ("eu", "us", "apac")[index % 3]}
    if index % 5:
        properties["amount"] = str(index * 3)
    if index % 7 == 0:
        properties["vip"] = "yes"
    return Message("SqlOrders", f"o-{index}".encode(), tags="ABC"[index % 4 % 3],
                   properties=properties)


def expected_by_sql(index: int) -> bool:
    region = ("eu", "us", "apac")[index % 3]
    amount = index * 3 if index % 5 else None
    vip = index % 7 == 0
    return (region == "eu" and amount is not None and amount > 100) or vip


async def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def create_topic(namesrv: str, topic: str) -> None:
    async with Admin(namesrv) as admin:
        masters = await admin.create_topic(topic, QUEUES)
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
                raise AssertionError(f"{topic} not routed")
            await asyncio.sleep(0.1)


def test_sql92_consumer_gets_exactly_the_matching_messages_beside_a_tag_group(tidemq_cluster):
    cluster = tidemq_cluster(broker_overrides={"enablePropertyFilter": "true"})
    namesrv = cluster.namesrv_addr
    wanted_sql = {f"o-{i}" for i in range(TOTAL) if expected_by_sql(i)}
    wanted_tag = {f"o-{i}" for i in range(TOTAL) if "ABC"[i % 4 % 3] in ("A", "C")}
    assert 0 < len(wanted_sql) < TOTAL

    async def main() -> tuple[collections.Counter[str], collections.Counter[str]]:
        await create_topic(namesrv, "SqlOrders")
        seen_sql: collections.Counter[str] = collections.Counter()
        seen_tag: collections.Counter[str] = collections.Counter()
        by_sql = PushConsumer("sql_it_sql", namesrv, consume_from="FIRST")
        by_sql.subscribe("SqlOrders", SQL, expression_type="SQL92")
        by_tag = PushConsumer("sql_it_tag", namesrv, consume_from="FIRST")
        by_tag.subscribe("SqlOrders", "A || C")

        @by_sql.listener
        def on_sql(messages: list[MessageExt]) -> None:
            seen_sql.update(m.body.decode() for m in messages)

        @by_tag.listener
        def on_tag(messages: list[MessageExt]) -> None:
            seen_tag.update(m.body.decode() for m in messages)

        try:
            await by_sql.start()
            await by_tag.start()
            async with Producer("sql_it_producer", namesrv) as producer:
                for index in range(TOTAL):
                    await producer.send(message_of(index))
            await wait_for(lambda: len(seen_sql) >= len(wanted_sql)
                           and len(seen_tag) >= len(wanted_tag), CONSUME_WAIT_S,
                           "both groups to get their messages")
            await asyncio.sleep(1.0)  # anything extra or doubled would show up by now
        finally:
            await by_sql.close()
            await by_tag.close()
        return seen_sql, seen_tag

    seen_sql, seen_tag = asyncio.run(main())
    assert set(seen_sql) == wanted_sql
    assert max(seen_sql.values()) == 1
    assert set(seen_tag) == wanted_tag


def test_sql92_consumer_start_fails_with_the_fix_when_the_broker_has_it_off(tidemq_cluster):
    cluster = tidemq_cluster()  # enablePropertyFilter defaults to false
    namesrv = cluster.namesrv_addr

    async def main() -> InvalidSubscription:
        await create_topic(namesrv, "SqlOff")
        consumer = PushConsumer("sql_it_off", namesrv)
        consumer.subscribe("SqlOff", "a > 5", expression_type="SQL92")
        consumer.listener(lambda messages: None)
        with pytest.raises(InvalidSubscription) as caught:
            await consumer.start()
        assert consumer.state == "closed"
        return caught.value

    error = asyncio.run(main())
    assert error.code == ResponseCode.SYSTEM_ERROR
    text = str(error)
    assert "enablePropertyFilter=true" in text and "SqlOff" in text and "a > 5" in text

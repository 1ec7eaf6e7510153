"""tidemq's own Python client on the other side of the interop tests: it creates topics, sends
what a third-party consumer should get, and reads back what a third-party producer stored."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tidemq.client import Admin, Message, MessageExt, Producer, PullConsumer, PullStatus
from tidemq.client.errors import NoRouteError

ROUTE_WAIT_S = 20.0
ROUTE_POLL_S = 0.05
PULL_ROUNDS_MAX = 200  # bounds read-back loops: far more than the messages of any test here


def create_topic(cluster, topic: str, queue_nums: int = 4, credentials=None) -> None:
    """Create ``topic`` on the cluster's brokers; wait (bounded) until every name server of
    ``cluster`` (a tests/server_processes.py TidemqCluster) routes it."""

    async def create() -> None:
        async with Admin(namesrv=cluster.namesrv_addr, credentials=credentials) as admin:
            await admin.create_topic(topic, queue_nums)
        for namesrv in cluster.namesrvs:
            async with Admin(namesrv=namesrv.addr) as admin:
                for _ in range(int(ROUTE_WAIT_S / ROUTE_POLL_S)):
                    try:
                        if (await admin.topic_route(topic)).queue_datas:
                            break
                    except NoRouteError:
                        pass
                    await asyncio.sleep(ROUTE_POLL_S)
                else:
                    raise AssertionError(f"{namesrv.name} never routed topic {topic} "
                                         f"(waited {ROUTE_WAIT_S} s)")

    asyncio.run(create())


def produce(namesrv: str, messages: Sequence[Message], credentials=None) -> None:
    """Send ``messages`` one by one, in order, with tidemq's Producer."""

    async def send_all() -> None:
        async with Producer("py_interop_producer", namesrv=namesrv,
                            credentials=credentials) as producer:
            for message in messages:
                await producer.send(message)

    asyncio.run(send_all())


def read_back(namesrv: str, topic: str, credentials=None) -> list[MessageExt]:
    """Every message stored in ``topic``, pulled queue by queue from offset 0."""

    async def pull_all() -> list[MessageExt]:
        stored: list[MessageExt] = []
        async with PullConsumer("py_interop_reader", namesrv=namesrv,
                                credentials=credentials) as consumer:
            for queue in await consumer.queues(topic):
                offset = 0
                for _ in range(PULL_ROUNDS_MAX):
                    result = await consumer.pull(queue, offset, 32)
                    stored.extend(result.messages)
                    if result.status is PullStatus.NO_NEW_MSG:
                        break
                    offset = result.next_begin_offset
                else:
                    raise AssertionError(f"{queue} still had messages after {PULL_ROUNDS_MAX}"
                                         " pulls")
        return stored

    return asyncio.run(pull_all())

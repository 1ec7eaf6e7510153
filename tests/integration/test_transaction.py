"""Transactional messages end to end: real ``tidemq namesrv`` / ``tidemq broker`` processes,
the Python TransactionProducer and a PullConsumer reading the topic from its beginning.

What a user relies on: a committed message reaches consumers exactly once; a rolled-back,
undecided or discarded one never does; an undecided one is settled by the producer's check;
a broker killed between the half and its end settles it after the restart.

The last two tests shorten the broker's check timing with transactionTimeOut,
transactionCheckInterval and transactionCheckMax (RocketMQ's BrokerConfig keys).
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from routed_topics import create_routed_topic
from tidemq.client import Admin, Message, MessageExt, MessageQueue, PullConsumer
from tidemq.client.transaction_producer import (
    TransactionProducer,
    TransactionState,
    transaction_id_of,
)
from tidemq.remoting.loop import run

pytestmark = pytest.mark.integration

QUEUES = 4
READ_WAIT_S = 60.0  # bounds every read-back; a healthy broker needs well under a second
SETTLE_S = 1.5  # how long a reader keeps polling after it has what it expects
# Short check timing for the tests that need checks to come round quickly.
FAST_CHECKS = {
    "transactionTimeOut": "1000",
    "transactionCheckInterval": "1000",
    "transactionCheckMax": "2",
}


async def create_topic(namesrv: str, topic: str, queues: int = QUEUES) -> list[MessageQueue]:
    """Create ``topic`` and wait (bounded) until the name server routes it."""
    return await create_routed_topic(namesrv, topic, queues)


async def read_topic(namesrv: str, queues: list[MessageQueue], expected: int,
                     group: str) -> list[MessageExt]:
    """Everything in ``queues`` from the start: until ``expected`` arrived, then SETTLE_S more
    (a duplicate or a stray half would show up then)."""
    received: list[MessageExt] = []
    async with PullConsumer(group, namesrv, consume_from="FIRST") as consumer:
        consumer.assign(queues)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READ_WAIT_S
        while len(received) < expected and loop.time() < deadline:
            received.extend(await consumer.poll(300))
        settle_until = loop.time() + SETTLE_S
        while loop.time() < settle_until:
            received.extend(await consumer.poll(300))
    return received


async def wait_until(condition, what: str, timeout_s: float = READ_WAIT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.2)


def bodies(messages: list[MessageExt]) -> list[bytes]:
    return sorted(message.body for message in messages)


def test_consumers_get_committed_messages_once_and_never_rolled_back_ones(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    topic = "TxOrders"

    def local_tx(message: Message) -> TransactionState:
        paid = message.properties["paid"] == "yes"
        return TransactionState.COMMIT if paid else TransactionState.ROLLBACK

    async def scenario():
        queues = await create_topic(namesrv, topic)
        async with TransactionProducer("tx-orders", namesrv) as producer:
            results = await asyncio.gather(*(
                producer.send_in_transaction(
                    Message(topic, f"order-{n}".encode(),
                            properties={"paid": "yes" if n % 2 == 0 else "no"}),
                    local_tx)
                for n in range(20)
            ))
        return results, await read_topic(namesrv, queues, 10, "tx-orders-reader")

    results, received = run(scenario())
    assert [r.local_state for r in results] == [
        TransactionState.COMMIT if n % 2 == 0 else TransactionState.ROLLBACK for n in range(20)
    ]
    assert bodies(received) == sorted(f"order-{n}".encode() for n in range(0, 20, 2))
    committed_ids = {r.msg_id for r in results if r.local_state is TransactionState.COMMIT}
    assert {m.msg_id for m in received} == committed_ids
    for message in received:
        assert "TRAN_MSG" not in message.properties and "REAL_TOPIC" not in message.properties


def test_undecided_transactions_are_settled_by_the_producers_check(tidemq_cluster):
    """Default timing: the broker first checks a half once it is 6 s old."""
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    topic = "TxUndecided"
    checked: list[str] = []

    def check(message: MessageExt) -> TransactionState:
        checked.append(transaction_id_of(message))
        keep = message.body.startswith(b"keep")
        return TransactionState.COMMIT if keep else TransactionState.ROLLBACK

    async def scenario():
        queues = await create_topic(namesrv, topic)
        async with TransactionProducer("tx-undecided", namesrv, check=check) as producer:
            results = [
                await producer.send_in_transaction(
                    Message(topic, body), lambda m: TransactionState.UNKNOWN)
                for body in (b"keep-1", b"drop-1", b"keep-2")
            ]
            received = await read_topic(namesrv, queues, 2, "tx-undecided-reader")
        return results, received

    results, received = run(scenario())
    assert bodies(received) == [b"keep-1", b"keep-2"]
    assert sorted(checked) == sorted(r.transaction_id for r in results)


def test_a_half_whose_producer_is_gone_is_discarded_after_its_last_check(tidemq_cluster):
    cluster = tidemq_cluster(broker_overrides=FAST_CHECKS)
    namesrv = cluster.namesrv_addr
    topic = "TxAbandoned"

    async def scenario():
        queues = await create_topic(namesrv, topic)
        async with TransactionProducer("tx-abandoned", namesrv) as producer:
            result = await producer.send_in_transaction(
                Message(topic, b"abandoned"), lambda m: TransactionState.UNKNOWN)
        # The producer is gone: two unanswered checks, then the half is discarded.
        async with Admin(namesrv) as admin:
            async def discarded() -> bool:
                try:
                    route = await admin.topic_route("TRANS_CHECK_MAX_TIME_TOPIC")
                except Exception:
                    return False
                return bool(route.subscribe_queues("TRANS_CHECK_MAX_TIME_TOPIC"))

            await wait_until(discarded, "the discard topic to be created")
            discard_queues = (await admin.topic_route("TRANS_CHECK_MAX_TIME_TOPIC")
                              ).subscribe_queues("TRANS_CHECK_MAX_TIME_TOPIC")
        in_discard = await read_topic(namesrv, discard_queues, 1, "tx-discard-reader")
        in_topic = await read_topic(namesrv, queues, 0, "tx-abandoned-reader")
        return result, in_discard, in_topic

    result, in_discard, in_topic = run(scenario())
    [discarded] = in_discard
    assert discarded.body == b"abandoned"
    assert discarded.properties["REAL_TOPIC"] == topic
    assert transaction_id_of(discarded) == result.transaction_id
    assert in_topic == []


def test_a_broker_killed_between_half_and_end_settles_it_after_restart(tidemq_cluster):
    # Checks every second, and enough of them that the producer surely reconnects in time.
    cluster = tidemq_cluster(broker_overrides={**FAST_CHECKS, "transactionCheckMax": "30"})
    namesrv = cluster.namesrv_addr
    broker = cluster.broker("broker-a")
    topic = "TxCrash"

    def kill_broker_then_commit(message: Message) -> TransactionState:
        broker.kill(signal.SIGKILL)  # the half is stored; its END_TRANSACTION will be lost
        return TransactionState.COMMIT

    async def scenario():
        queues = await create_topic(namesrv, topic)
        async with TransactionProducer(
            "tx-crash", namesrv, check=lambda m: TransactionState.COMMIT,
            heartbeat_broker_interval_ms=200, send_timeout_ms=2_000,
        ) as producer:
            before = await producer.send_in_transaction(
                Message(topic, b"committed before"), lambda m: TransactionState.COMMIT)
            await read_topic(namesrv, queues, 1, "tx-crash-before")
            during = await producer.send_in_transaction(
                Message(topic, b"open at the crash"), kill_broker_then_commit)
            # Same port and store: recovery, then the check settles it. Started from a
            # thread, so the producer's loop stays free to reconnect and answer.
            await asyncio.to_thread(broker.start)
            received = await read_topic(namesrv, queues, 2, "tx-crash-reader")
        return before, during, received

    before, during, received = run(scenario())
    assert during.local_state is TransactionState.COMMIT
    assert bodies(received) == [b"committed before", b"open at the crash"]
    assert {m.msg_id for m in received} == {before.msg_id, during.msg_id}

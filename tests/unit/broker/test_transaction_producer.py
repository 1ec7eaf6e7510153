"""TransactionProducer (asyncio and synchronous) against an in-process name server and broker.

The servers run on loopback in the test's own event loop (the synchronous twin talks to them
from its private loop thread); the broker's transaction clock is moved forward to make halves
due for a check instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import threading

import pytest

from tidemq.broker.transaction import Outcome
from tidemq.broker.transaction.service import wall_clock_ms
from tidemq.client.errors import BrokerRejected
from tidemq.client.message import Message, SendStatus
from tidemq.client.transaction_producer import (
    TransactionProducer,
    TransactionState,
    transaction_id_of,
)
from tidemq.client.transaction_sync import TransactionProducer as SyncTransactionProducer
from tidemq.namesrv import NamesrvConfig, NamesrvController
from tidemq.protocol.message import decode_records

TOPIC = "Payments"
GROUP = "payment-tx"
WAIT_BOUND_S = 10.0


def run(coro):
    async def bounded():
        async with asyncio.timeout(WAIT_BOUND_S * 3):
            return await coro
    return asyncio.run(bounded())


@contextlib.asynccontextmanager
async def servers(make_broker):
    namesrv = NamesrvController(NamesrvConfig(listen_port=0))
    await namesrv.start()
    broker = make_broker(namesrv_addr=namesrv.address)
    await broker.start()
    try:
        yield namesrv.address, broker
    finally:
        await broker.shutdown(grace_s=1.0)
        await namesrv.shutdown()


def messages_in(broker, topic: str = TOPIC) -> list:
    found = []
    for queue_id in range(8):
        result = broker.store.get_messages(topic, queue_id, 0, 64, 1 << 24)
        found += decode_records(result.body)
    return found


async def wait_for(condition, what: str) -> None:
    """Poll ``condition`` (bounded); AssertionError naming ``what`` when it never holds."""
    for _ in range(int(WAIT_BOUND_S / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {WAIT_BOUND_S} s waiting for {what}")


async def make_due(broker) -> None:
    """Age the broker's halves past transactionTimeOut and run its check round now."""
    service = broker.transaction_service
    service.clock_ms = lambda: wall_clock_ms() + service.settings.timeout_ms + 5_000
    await service.tick()


def ended(broker, result) -> bool:
    """The half's end is decided and its records are written: the end writer marks a half
    ended when it queues the end and writes the records in a callback after, so a test that
    read the store on the mark alone could find the committed message missing."""
    service = broker.transaction_service
    return (service.outcome(result.queue_offset)[0]
            and service.writer.queued_answer(result.queue_offset) is None)


def producer_connected(broker, group: str = GROUP) -> bool:
    return bool(broker.producer_manager.channels(group))


def test_commit_delivers_the_message_to_its_topic(make_broker):
    seen: list[Message] = []

    def local_tx(message: Message) -> TransactionState:
        seen.append(message)
        return TransactionState.COMMIT

    async def scenario():
        async with (
            servers(make_broker) as (namesrv, broker),
            TransactionProducer(GROUP, namesrv) as producer,
        ):
            result = await producer.send_in_transaction(Message(TOPIC, b"pay 10"), local_tx)
            await wait_for(lambda: messages_in(broker), "the committed message")
            return result, messages_in(broker)

    result, messages = run(scenario())
    assert result.status is SendStatus.SEND_OK
    assert result.local_state is TransactionState.COMMIT
    assert result.transaction_id == result.msg_id == transaction_id_of(seen[0])
    [message] = messages
    assert message.body == b"pay 10" and message.msg_id == result.msg_id
    assert message.queue_id == result.queue.queue_id


def test_rollback_delivers_nothing(make_broker):
    async def scenario():
        async with (
            servers(make_broker) as (namesrv, broker),
            TransactionProducer(GROUP, namesrv) as producer,
        ):
            result = await producer.send_in_transaction(
                Message(TOPIC, b"refused"), lambda m: TransactionState.ROLLBACK)
            await wait_for(lambda: ended(broker, result), "the rollback")
            return result, broker.transaction_service.outcome(result.queue_offset), \
                messages_in(broker)

    result, outcome, messages = run(scenario())
    assert result.local_state is TransactionState.ROLLBACK
    assert outcome == (True, Outcome.ROLLBACK)
    assert messages == []


@pytest.mark.parametrize(("answer", "delivered"), [
    (TransactionState.COMMIT, [b"decided later"]),
    (TransactionState.ROLLBACK, []),
])
def test_an_unknown_transaction_is_settled_by_the_check(make_broker, answer, delivered):
    checked = []

    async def check(message):  # a coroutine function works as well as a plain one
        checked.append(message)
        return answer

    async def scenario():
        async with (
            servers(make_broker) as (namesrv, broker),
            TransactionProducer(GROUP, namesrv, check=check) as producer,
        ):
            result = await producer.send_in_transaction(
                Message(TOPIC, b"decided later"), lambda m: None)  # None = UNKNOWN
            await wait_for(lambda: producer_connected(broker), "the producer's heartbeat")
            assert not ended(broker, result)
            await make_due(broker)
            await wait_for(lambda: ended(broker, result), "the check's answer")
            return result, [m.body for m in messages_in(broker)]

    result, bodies = run(scenario())
    assert result.local_state is TransactionState.UNKNOWN
    assert bodies == delivered
    [message] = checked
    assert message.topic == TOPIC and message.body == b"decided later"
    assert transaction_id_of(message) == result.transaction_id


def test_a_failing_local_transaction_raises_and_leaves_the_decision_to_the_check(make_broker):
    class PaymentDeclined(Exception):
        pass

    def local_tx(message):
        raise PaymentDeclined("card expired")

    async def scenario():
        async with servers(make_broker) as (namesrv, broker), TransactionProducer(
            GROUP, namesrv, check=lambda m: TransactionState.ROLLBACK
        ) as producer:
            message = Message(TOPIC, b"x")
            with pytest.raises(PaymentDeclined):
                await producer.send_in_transaction(message, local_tx)
            half = broker.transaction_service.find_half(GROUP, transaction_id_of(message))
            assert not ended(broker, half)  # told UNKNOWN
            await wait_for(lambda: producer_connected(broker), "the producer's heartbeat")
            await make_due(broker)
            await wait_for(lambda: ended(broker, half), "the check's rollback")
            return broker.transaction_service.outcome(half.queue_offset), messages_in(broker)

    outcome, messages = run(scenario())
    assert outcome == (True, Outcome.ROLLBACK)
    assert messages == []


def test_another_process_can_commit_a_half_by_its_send_result(make_broker):
    async def scenario():
        async with servers(make_broker) as (namesrv, broker):
            async with TransactionProducer(GROUP, namesrv) as sender:
                half = await sender.send_half(Message(TOPIC, b"epoch 7"),
                                              transaction_id="sink-epoch-7")
            handed_over = pickle.loads(pickle.dumps(half))
            found = broker.transaction_service.find_half(GROUP, "sink-epoch-7")
            async with TransactionProducer(GROUP, namesrv) as coordinator:
                await coordinator.end_transaction(handed_over, TransactionState.COMMIT,
                                                  wait=True)
                with pytest.raises(BrokerRejected, match="already committed") as refused:
                    await coordinator.end_transaction(handed_over, TransactionState.ROLLBACK,
                                                      wait=True)
            return half, found, refused.value, messages_in(broker)

    half, found, refused, messages = run(scenario())
    assert half.transaction_id == "sink-epoch-7"
    assert found.queue_offset == half.queue_offset
    assert not refused.retriable
    assert [m.body for m in messages] == [b"epoch 7"]
    assert messages[0].properties["__transactionId__"] == "sink-epoch-7"


def test_any_producer_of_the_group_answers_checks_for_halves_of_an_earlier_one(make_broker):
    async def scenario():
        async with servers(make_broker) as (namesrv, broker):
            async with TransactionProducer(GROUP, namesrv) as crashed:
                result = await crashed.send_half(Message(TOPIC, b"orphan"))
            async with TransactionProducer(
                GROUP, namesrv, check=lambda m: TransactionState.COMMIT,
                check_topics=[TOPIC], heartbeat_broker_interval_ms=100,
            ) as successor:
                members = broker.producer_manager.channels
                await wait_for(lambda: [c.client_id for c in members(GROUP)] ==
                               [successor.client_id], "only the successor to be connected")
                await make_due(broker)
                await wait_for(lambda: ended(broker, result), "the successor's answer")
                assert successor.check is not None
            return [m.body for m in messages_in(broker)]

    assert run(scenario()) == [b"orphan"]


def test_the_sync_producer_runs_local_transactions_and_checks_off_the_loop(make_broker):
    threads: dict[str, threading.Thread] = {}

    def local_tx(message):
        threads["local"] = threading.current_thread()
        return TransactionState.UNKNOWN

    def check(message):
        threads["check"] = threading.current_thread()
        return TransactionState.COMMIT

    async def scenario():
        async with servers(make_broker) as (namesrv, broker):
            def use_sync_producer():
                with SyncTransactionProducer(GROUP, namesrv, check=check) as producer:
                    result = producer.send_in_transaction(Message(TOPIC, b"sync"), local_tx)
                    threads["loop"] = producer._runner.thread
                    return result, producer

            result, _ = await asyncio.to_thread(use_sync_producer)
            # Re-open: the check must reach a live producer of the group.
            sync_producer = await asyncio.to_thread(
                lambda: SyncTransactionProducer(GROUP, namesrv, check=check,
                                                check_topics=[TOPIC]))
            await asyncio.to_thread(sync_producer.start)
            try:
                await wait_for(lambda: producer_connected(broker), "the heartbeat")
                await make_due(broker)
                await wait_for(lambda: ended(broker, result), "the check's commit")
            finally:
                await asyncio.to_thread(sync_producer.close)
            return result, [m.body for m in messages_in(broker)]

    result, bodies = run(scenario())
    assert result.local_state is TransactionState.UNKNOWN
    assert bodies == [b"sync"]
    assert threads["local"] is not threads["loop"]
    assert threads["check"] is not threads["loop"]


def test_a_message_refused_before_sending_runs_no_local_transaction(make_broker):
    ran = []

    async def scenario():
        async with (
            servers(make_broker) as (namesrv, broker),
            TransactionProducer(GROUP, namesrv) as producer,
        ):
            with pytest.raises(Exception, match="empty body"):
                await producer.send_in_transaction(Message(TOPIC, b""), ran.append)
            return messages_in(broker, "RMQ_SYS_TRANS_HALF_TOPIC")

    assert run(scenario()) == []
    assert ran == []

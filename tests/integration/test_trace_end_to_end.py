"""Message trace against real name server and broker processes: a traced send and a traced
consume (one failed call, one retry) leave Pub, SubBefore and SubAfter records in
RMQ_SYS_TRACE_TOPIC that ``query_message_trace`` and ``tidemq admin QueryMsgTraceById``
read back (the Pub although the first write of its trace message failed: it is retried);
records in RocketMQ's own layout (as the Apache clients write them) read the same way; and a
trace topic that cannot be written never fails or holds up a send.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from click.testing import CliRunner

from tidemq.cli.admin_command import admin as admin_cli
from tidemq.client import (
    Admin,
    ConsumeResult,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionProducer,
    TransactionState,
)
from tidemq.client.trace_data import MessageType, TraceType
from tidemq.client.trace_query import MessageTrace, query_message_trace
from tidemq.remoting.errors import RemotingTimeout

pytestmark = pytest.mark.integration

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
WAIT_S = 90.0
# A failed message comes back after level 3 (the first retry): 1 s here instead of 10 s.
DELAY_LEVELS = "1s 1s 1s 2s 4s " + " ".join(["1s"] * 13)


async def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def create_topic(admin: Admin, topic: str) -> None:
    await admin.create_topic(topic, 2)
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            await admin.topic_route(topic)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


async def wait_for_trace(admin: Admin, msg_id: str, done: Callable[[MessageTrace], bool],
                         what: str) -> MessageTrace:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            trace = await query_message_trace(admin, msg_id)
        except Exception:  # the trace topic may not be routed yet
            trace = MessageTrace(msg_id)
        if done(trace):
            return trace
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; found {trace.records}")
        await asyncio.sleep(0.2)


def fail_first_trace_write(dispatcher) -> None:
    """Make the first trace message ``dispatcher`` writes fail as a timed-out send does."""
    send = dispatcher._send
    failed: list[bool] = []

    async def failing_once(topic: str, body: bytes, keys: list[str]) -> None:
        if not failed:
            failed.append(True)
            raise RemotingTimeout("injected: the trace topic's first write timed out")
        await send(topic, body, keys)

    dispatcher._send = failing_once


def test_traced_send_and_consume_show_the_message_life(tidemq_cluster) -> None:
    cluster = tidemq_cluster(broker_overrides={"traceTopicEnable": "true",
                                               "messageDelayLevel": DELAY_LEVELS})
    namesrv = cluster.namesrv_addr
    broker_addr = cluster.broker("broker-a").addr

    async def scenario() -> tuple[str, MessageTrace, str, str]:
        async with Admin(namesrv) as admin:
            await create_topic(admin, "TracedOrders")
            await create_topic(admin, "TracedLines")
            before_ms = int(time.time() * 1000)
            async with Producer("traced_producer", namesrv, enable_msg_trace=True) as producer:
                dispatcher = producer.tracer.dispatcher
                fail_first_trace_write(dispatcher)
                result = await producer.send(Message("TracedOrders", b'{"id": 42}',
                                                     tags="paid", keys=["order-42"]))
                producer_id = producer.client_id
                # A batch's Pub records (one per message) fill a trace message over 4 KiB,
                # which is stored compressed, as Java's trace producer stores it.
                batch = await producer.send_batch([
                    Message("TracedLines", b"x" * (n + 1), keys=[f"line-{n}"])
                    for n in range(64)])
            # The first trace message's write failed and its retry stored it (it held the
            # single send's record, and the batch's when they came within the linger);
            # the sends never saw either.
            assert (dispatcher.sent, dispatcher.failed) == (65, 0)
            assert dispatcher.retried in (1, 65)
            batch_ids = [msg_id for result in batch for msg_id in result.msg_ids]
            batch_trace = await wait_for_trace(admin, batch_ids[37], lambda t: len(t.sends) == 1,
                                               "the Pub record of a batch's message")
            assert (batch_trace.sends[0].body_length, batch_trace.sends[0].keys) == (
                38, "line-37")
            # (a query answers with the body inflated; the stored record is what shrank)
            stored = await admin.query_message_by_key(TRACE_TOPIC, batch_ids[37])
            assert stored and all(m.store_size < len(m.body) for m in stored)
            calls: list[MessageExt] = []
            consumer = PushConsumer("traced_consumer", namesrv, consume_from="FIRST",
                                    enable_msg_trace=True)
            consumer.subscribe("TracedOrders", "*")

            @consumer.listener
            def on_messages(messages: list[MessageExt]) -> ConsumeResult:
                calls.extend(messages)
                # the first delivery fails, its retry succeeds
                return (ConsumeResult.RECONSUME_LATER if len(calls) == 1
                        else ConsumeResult.SUCCESS)

            async with consumer:
                await wait_for(lambda: len(calls) >= 2, WAIT_S, "the message and its retry")
                consumer_id = consumer.client_id
            trace = await wait_for_trace(
                admin, result.msg_id,
                lambda t: len(t.sends) == 1 and sum(
                    a.success is not None and a.began_ms > 0
                    for a in t.consume_attempts()) >= 2,
                "Pub and two complete consume attempts")
            assert before_ms <= trace.sends[0].timestamp_ms <= int(time.time() * 1000)
            # The trace messages are indexed by the message's own keys too.
            by_key = await admin.query_message_by_key(TRACE_TOPIC, "order-42")
            assert by_key, "no trace message found by the user key"
            return result.msg_id, trace, producer_id, consumer_id

    msg_id, trace, producer_id, consumer_id = asyncio.run(scenario())
    pub = trace.sends[0]
    assert (pub.group, pub.topic, pub.tags, pub.keys) == (
        "traced_producer", "TracedOrders", "paid", "order-42")
    assert pub.store_host == broker_addr
    assert pub.client_host == producer_id
    assert pub.success is True
    assert pub.body_length == len(b'{"id": 42}')
    assert pub.cost_ms >= 0 and pub.offset_msg_id
    attempts = trace.consume_attempts()[:2]
    for attempt in attempts:
        assert attempt.group == "traced_consumer"
        assert attempt.client == consumer_id
        assert attempt.began_ms >= pub.timestamp_ms
        assert attempt.ended_ms >= attempt.began_ms
        assert attempt.cost_ms >= 0
    assert [(a.retry_times, a.success) for a in attempts] == [(0, False), (1, True)]
    befores = [r for r in trace.records if r.type is TraceType.SUB_BEFORE]
    afters = [r for r in trace.records if r.type is TraceType.SUB_AFTER]
    assert len(befores) >= 2 and len(afters) >= 2

    output = CliRunner().invoke(admin_cli, ["QueryMsgTraceById", "-n", namesrv, "-i", msg_id],
                                terminal_width=250)
    assert output.exit_code == 0, output.output
    text = output.output
    assert "Pub" in text and "Sub" in text
    assert "traced_producer" in text and "traced_consumer" in text
    assert "success" in text and "failed" in text
    assert "retry 1" in text


def test_trace_records_in_rocketmq_layout_read_the_same(tidemq_cluster) -> None:
    """Records as the Apache clients' enableMsgTrace writes them: 14-field Pub (no client
    field), 9-field SubAfter, ``null`` for missing values, keys as the message id."""
    cluster = tidemq_cluster(broker_overrides={"traceTopicEnable": "true"})
    namesrv = cluster.namesrv_addr
    msg_id = "7F00000100002A9F0000000000000042"
    body = (
        f"Pub\x011764150000000\x01DefaultRegion\x01java_producer\x01Orders\x01{msg_id}\x01"
        "TagA\x01null\x01127.0.0.1:10911\x0111\x013\x010\x01"
        "7F00000100002A9F0000000000000000\x01true\x02"
        f"SubBefore\x011764150000100\x01DefaultRegion\x01java_consumer\x01req-1\x01{msg_id}"
        "\x010\x01null\x02"
        f"SubAfter\x01req-1\x01{msg_id}\x017\x01true\x01null\x010\x011764150000107\x01"
        "java_consumer\x02"
    )

    async def scenario() -> MessageTrace:
        async with Producer("java_like_trace_writer", namesrv) as producer:
            await producer.send(Message(TRACE_TOPIC, body.encode(), keys=[msg_id]))
        async with Admin(namesrv) as admin:
            return await wait_for_trace(admin, msg_id, lambda t: len(t.records) == 3,
                                        "the three records")

    trace = asyncio.run(scenario())
    pub = trace.sends[0]
    assert (pub.group, pub.topic, pub.tags, pub.keys, pub.cost_ms) == (
        "java_producer", "Orders", "TagA", None, 3)
    assert pub.client_host and pub.client_host.startswith("127.0.0.1:")  # the born host
    (attempt,) = trace.consume_attempts()
    assert (attempt.group, attempt.began_ms, attempt.ended_ms, attempt.cost_ms,
            attempt.success) == ("java_consumer", 1764150000100, 1764150000107, 7, True)


def test_send_succeeds_when_the_trace_topic_cannot_be_written(tidemq_cluster) -> None:
    cluster = tidemq_cluster(broker_overrides={"autoCreateTopicEnable": "false"})
    namesrv = cluster.namesrv_addr

    async def scenario() -> tuple[int, int, int]:
        async with Admin(namesrv) as admin:
            await create_topic(admin, "Payments")
        producer = Producer("untraceable_producer", namesrv, enable_msg_trace=True,
                            trace_topic="NoSuchTraceTopic")
        async with producer:
            results = [await producer.send(Message("Payments", f"p-{i}")) for i in range(5)]
            results += await producer.send_batch(
                [Message("Payments", f"b-{i}") for i in range(20)])
            assert all(r.status.name == "SEND_OK" for r in results)
            dispatcher = producer.tracer.dispatcher
            await wait_for(lambda: dispatcher.failed == 25, WAIT_S,
                           "the trace writes to fail")
            return dispatcher.sent, dispatcher.failed, len(results)

    sent, failed, results = asyncio.run(scenario())
    assert (sent, failed, results) == (0, 25, 6)


def test_transaction_trace_has_the_half_and_its_end(tidemq_cluster) -> None:
    cluster = tidemq_cluster(broker_overrides={"traceTopicEnable": "true"})
    namesrv = cluster.namesrv_addr

    async def scenario() -> MessageTrace:
        async with TransactionProducer("traced_tx_producer", namesrv,
                                       enable_msg_trace=True) as producer:
            result = await producer.send_in_transaction(
                Message("TracedTx", b"debit 10", keys=["tx-7"]),
                lambda message: TransactionState.COMMIT)
        async with Admin(namesrv) as admin:
            return await wait_for_trace(
                admin, result.msg_id,
                lambda t: len(t.sends) == 1 and len(t.transaction_ends) == 1,
                "the half's Pub and its EndTransaction")

    trace = asyncio.run(scenario())
    (pub,) = trace.sends
    (end,) = trace.transaction_ends
    assert pub.msg_type == MessageType.TRANSACTION_HALF and pub.keys == "tx-7"
    assert (end.group, end.topic, end.keys, end.transaction_state,
            end.from_transaction_check) == (
        "traced_tx_producer", "TracedTx", "tx-7", "COMMIT_MESSAGE", False)
    assert end.msg_type == MessageType.TRANSACTION_COMMIT
    assert end.transaction_id == trace.msg_id
    assert end.timestamp_ms >= pub.timestamp_ms

"""Long polling against a real broker process: a pull parked on a drained queue is answered
because a message for that queue arrived, and otherwise when its suspend time is up.

What answered a parked pull is read from the broker's ``tidemq_broker_parked_pulls_answered``
counter by cause (a message, the 5 s re-check, the timeout), not told apart by timing: a
broker that only noticed new messages at its re-check would answer within the same seconds on
a busy machine.
"""

from __future__ import annotations

import asyncio
import functools
import socket

import pytest

from server_processes import metric_value
from tidemq.client import (
    Admin,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PullResult,
    PullStatus,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

pytestmark = pytest.mark.integration

SUSPEND_MS = 20_000
# A parked pull must still be parked this long after it was sent (it was not answered at once)
# and after a message went to another queue (that message is not its business).
STILL_PARKED_CHECK_S = 1.0
ROUNDS = 3
QUEUES = ROUNDS + 1  # one queue per round, plus one that only gets distractions
PULL_SYSFLAG_SUSPEND_SUBSCRIPTION = 0x2 | 0x4
ROUTE_WAIT_S = 20.0
PARK_WAIT_S = 30.0  # bounds the wait for the broker to hold a pull (its parked-pulls gauge)
ANSWERED = "tidemq_broker_parked_pulls_answered_total"


def create_topic(cluster, remoting_call, wait_until, topic: str) -> list[MessageQueue]:
    async def create() -> None:
        async with Admin(namesrv=cluster.namesrv_addr) as admin:
            await admin.create_topic(topic, QUEUES)

    asyncio.run(create())
    request = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    wait_until(lambda: remoting_call(cluster.namesrv_addr, request).code == ResponseCode.SUCCESS,
               timeout_s=ROUTE_WAIT_S, what=f"a route for {topic}")
    return [MessageQueue(topic, "broker-a", queue_id) for queue_id in range(QUEUES)]


def test_parked_pulls_are_answered_right_after_a_message_for_their_queue_arrives(
        tidemq_cluster, remoting_call, wait_until, free_port):
    metrics_port = free_port()
    cluster = tidemq_cluster(broker_overrides={"metricsExporterType": "PROM",
                                               "metricsPromExporterPort": metrics_port})
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    queues = create_topic(cluster, remoting_call, wait_until, "LongPollWake")
    distraction_queue = queues[-1]

    async def parked_pulls() -> float:
        return await asyncio.get_running_loop().run_in_executor(
            None, metric_value, metrics_url, "tidemq_broker_pulls_parked")

    async def answered_by_cause() -> dict[str, float]:
        return {cause: await asyncio.get_running_loop().run_in_executor(
                    None, functools.partial(metric_value, metrics_url, ANSWERED, cause=cause))
                for cause in ("message", "recheck", "timeout")}

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with Producer("lp_producer", namesrv=cluster.namesrv_addr) as producer, \
                PullConsumer("lp_group_a", namesrv=cluster.namesrv_addr) as group_a, \
                PullConsumer("lp_group_b", namesrv=cluster.namesrv_addr) as group_b:
            for round_number, queue in enumerate(queues[:ROUNDS]):
                # Two groups park a pull each on the same drained queue.
                parked = [loop.create_task(consumer.pull(queue, 0, 32,
                                                         suspend_timeout_ms=SUSPEND_MS))
                          for consumer in (group_a, group_b)]
                # Both held by the broker (on a busy machine a pull may take a while to get
                # there; one sent after the message would find it without any waking).
                deadline = loop.time() + PARK_WAIT_S
                while await parked_pulls() < 2:
                    assert not any(task.done() for task in parked), "answered without a message"
                    assert loop.time() < deadline, f"not both pulls parked in {PARK_WAIT_S} s"
                    await asyncio.sleep(0.05)
                await asyncio.sleep(STILL_PARKED_CHECK_S)
                assert not any(task.done() for task in parked), "answered without a message"

                await producer.send(Message(queue.topic, f"elsewhere-{round_number}"),
                                    queue=distraction_queue)
                await asyncio.sleep(STILL_PARKED_CHECK_S)
                assert not any(task.done() for task in parked), (
                    "a message to another queue answered the parked pulls")

                before = await answered_by_cause()
                await producer.send(Message(queue.topic, f"wake-{round_number}"), queue=queue)
                results: list[PullResult] = await asyncio.gather(*parked)
                for result in results:
                    assert result.status is PullStatus.FOUND
                    assert [m.body for m in result.messages] == [f"wake-{round_number}".encode()]
                    assert result.next_begin_offset == 1
                after = await answered_by_cause()
                assert {cause: after[cause] - before[cause] for cause in after} == {
                    "message": 2, "recheck": 0, "timeout": 0}, (
                    f"round {round_number}: the broker did not answer both parked pulls "
                    f"because the message arrived (answers by cause before {before}, "
                    f"after {after})")

    asyncio.run(scenario())


def test_parked_pull_with_no_message_is_answered_not_found_when_its_suspend_time_is_up(
        tidemq_cluster, remoting_call, wait_until):
    cluster = tidemq_cluster()
    queue = create_topic(cluster, remoting_call, wait_until, "LongPollTimeout")[0]
    suspend_ms = 3000

    async def scenario() -> tuple[PullResult, float]:
        loop = asyncio.get_running_loop()
        async with PullConsumer("lp_timeout", namesrv=cluster.namesrv_addr) as consumer:
            started = loop.time()
            result = await consumer.pull(queue, 0, 32, suspend_timeout_ms=suspend_ms)
            return result, loop.time() - started

    result, held_s = asyncio.run(scenario())
    assert result.status is PullStatus.NO_NEW_MSG
    assert (result.next_begin_offset, result.min_offset, result.max_offset) == (0, 0, 0)
    # Held for (about) its suspend time rather than answered at once; 0.9 absorbs clock
    # granularity between the two processes.
    assert held_s >= suspend_ms / 1000 * 0.9, f"answered after {held_s:.2f} s"


def test_parked_pull_whose_connection_closed_does_not_disturb_the_broker(
        tidemq_cluster, remoting_call, wait_until):
    cluster = tidemq_cluster()
    queue = create_topic(cluster, remoting_call, wait_until, "LongPollClosed")[0]
    broker = cluster.broker("broker-a")

    # Park a pull over a raw connection, then hang up on it.
    request = RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "lp_closed", "topic": queue.topic, "queueId": "0", "queueOffset": "0",
        "maxMsgNums": "32", "sysFlag": str(PULL_SYSFLAG_SUSPEND_SUBSCRIPTION),
        "commitOffset": "0", "suspendTimeoutMillis": str(SUSPEND_MS), "subscription": "*",
        "subVersion": "0", "expressionType": "TAG"})
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as connection:
        connection.sendall(request.encode())
        connection.settimeout(STILL_PARKED_CHECK_S)
        with pytest.raises(TimeoutError):
            connection.recv(1)  # parked: nothing comes back

    async def scenario() -> PullResult:
        async with Producer("lp_closed_producer", namesrv=cluster.namesrv_addr) as producer, \
                PullConsumer("lp_closed", namesrv=cluster.namesrv_addr) as consumer:
            await producer.send(Message(queue.topic, "after-hang-up"), queue=queue)
            return await consumer.pull(queue, 0, 32)

    result = asyncio.run(scenario())
    assert [m.body for m in result.messages] == [b"after-hang-up"]
    assert broker.running
    response = remoting_call(broker.addr, RemotingCommand.request(
        RequestCode.GET_MAX_OFFSET, {"topic": queue.topic, "queueId": "0"}))
    assert (response.code, response.ext_fields["offset"]) == (ResponseCode.SUCCESS, "1")
    assert "Traceback" not in broker.stderr_path.read_text(errors="replace")

"""Exactly-once batches end to end: real ``tidemq namesrv`` / ``tidemq broker`` processes, the
``ExactlyOnceClient`` (what the exactly-once Spark sink uses) and a PullConsumer reading the
topic from its beginning.

What a user relies on: halves are invisible until their batch commits; a commit makes
exactly the listed writers' rows visible, once; a replayed commit of the same (query id,
batch id) commits nothing and rolls the replay's rows back; a commit naming halves that are
not there is refused and commits nothing; halves nobody commits are rolled back after their
timeout; a broker killed while committing finishes the batch after its restart.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from routed_topics import create_routed_topic
from tidemq.client import Admin, MessageExt, MessageQueue, PullConsumer
from tidemq.client.errors import BrokerRejected, NoRouteError
from tidemq.client.exactly_once import EosIdentity, ExactlyOnceClient, WriterHalves
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.message import BatchEntry, encode_batch_body
from tidemq.remoting.loop import run

pytestmark = pytest.mark.integration

GROUP = "eos-writer"
QUEUES = 2
READ_WAIT_S = 60.0  # bounds every read-back; a healthy broker needs well under a second
SETTLE_S = 1.5  # how long a reader keeps polling after it has what it expects
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"


async def create_topic(namesrv: str, topic: str) -> list[MessageQueue]:
    """Create ``topic`` and wait (bounded) until the name server routes it."""
    return sorted(await create_routed_topic(namesrv, topic, QUEUES))


async def read_topic(namesrv: str, queues: list[MessageQueue], expected: int) -> list[bytes]:
    """Bodies of everything in ``queues``: until ``expected`` arrived, then SETTLE_S more (a
    duplicate or a stray half would show up then)."""
    received: list[MessageExt] = []
    group = f"eos-reader-{uuid.uuid4().hex[:8]}"
    async with PullConsumer(group, namesrv, consume_from="FIRST") as consumer:
        consumer.assign(queues)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READ_WAIT_S
        while len(received) < expected and loop.time() < deadline:
            received.extend(await consumer.poll(300))
        settle_until = loop.time() + SETTLE_S
        while loop.time() < settle_until:
            received.extend(await consumer.poll(300))
    return sorted(message.body for message in received)


def rows(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{n:04d}".encode() for n in range(count)]


async def write_halves(client: ExactlyOnceClient, identity: EosIdentity,
                       queues: list[MessageQueue], bodies: list[bytes],
                       per_request: int = 50) -> WriterHalves:
    """Send ``bodies`` as half batches of ``identity``, spread over ``queues``; the writer's
    halves (one broker in these tests)."""
    halves = WriterHalves(identity.writer_id)
    for index, first in enumerate(range(0, len(bodies), per_request)):
        chunk = bodies[first:first + per_request]
        body = encode_batch_body([BatchEntry(b) for b in chunk])
        result = await client.send_half_batch(identity, queues[index % len(queues)], body,
                                              len(chunk))
        halves.add(result.queue_offset, result.count)
    return halves


def identity(query_id: str, batch_id: int, partition: int = 0,
             timeout_ms: int = 300_000) -> EosIdentity:
    return EosIdentity(GROUP, query_id, batch_id, partition, uuid.uuid4().hex, timeout_ms)


def test_a_commit_makes_exactly_the_listed_writers_rows_visible_once(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    topic = "EosOrders"

    async def scenario():
        queues = await create_topic(namesrv, topic)
        async with ExactlyOnceClient(GROUP, namesrv) as client:
            first = await write_halves(client, identity("q1", 0, 0), queues, rows("p0", 120))
            second = await write_halves(client, identity("q1", 0, 1), queues, rows("p1", 80))
            # A killed attempt of partition 1: its writer is not part of the commit.
            await write_halves(client, identity("q1", 0, 1), queues, rows("dead", 30))
            before = await read_topic(namesrv, queues, 0)
            result = await client.commit_batch("broker-a", topic, GROUP, "q1", 0,
                                               [first, second])
            after = await read_topic(namesrv, queues, 200)
        return before, result, after

    before, result, after = run(scenario())
    assert before == []
    assert result.committed_count == 200 and not result.already_committed
    assert after == sorted(rows("p0", 120) + rows("p1", 80))


def test_a_replayed_commit_commits_nothing_and_rolls_back_the_replay(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    topic = "EosReplay"

    async def scenario():
        queues = await create_topic(namesrv, topic)
        async with ExactlyOnceClient(GROUP, namesrv) as client:
            run_1 = await write_halves(client, identity("q2", 7), queues, rows("row", 100))
            first = await client.commit_batch("broker-a", topic, GROUP, "q2", 7, [run_1])
            # The driver died before Spark recorded the commit: the batch runs again.
            run_2 = await write_halves(client, identity("q2", 7), queues, rows("row", 100))
            replay = await client.commit_batch("broker-a", topic, GROUP, "q2", 7, [run_2])
            # A commit retried with the first run's writers changes nothing either.
            retried = await client.commit_batch("broker-a", topic, GROUP, "q2", 7, [run_1])
            # The replay's halves are gone: aborting them finds nothing left to roll back.
            aborted = await client.abort_batch("broker-a", topic, GROUP, "q2", 7, [run_2])
            received = await read_topic(namesrv, queues, 100)
        return first, replay, retried, aborted, received

    first, replay, retried, aborted, received = run(scenario())
    assert (first.committed_count, first.already_committed) == (100, False)
    assert (replay.committed_count, replay.already_committed) == (100, True)
    assert replay.rolled_back_count == 100
    assert (retried.already_committed, retried.rolled_back_count) == (True, 0)
    assert aborted.rolled_back_count == 0
    assert received == rows("row", 100)


def test_a_commit_naming_missing_or_foreign_halves_is_refused_and_commits_nothing(
        tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    topic = "EosIncomplete"

    async def scenario():
        queues = await create_topic(namesrv, topic)
        async with ExactlyOnceClient(GROUP, namesrv) as client:
            writer = await write_halves(client, identity("q3", 1), queues, rows("row", 60))
            other = await write_halves(client, identity("q3", 1, 1), queues, rows("other", 10))
            too_many = WriterHalves(writer.writer_id)
            for first, count in writer.ranges:
                too_many.add(first, count)
            too_many.add(10_000, 5)  # offsets this broker never gave the writer
            errors = []
            foreign = WriterHalves(writer.writer_id)
            foreign.add(other.ranges[0][0], other.count)  # another writer's halves
            for bad in (too_many, foreign):
                with pytest.raises(BrokerRejected) as caught:
                    await client.commit_batch("broker-a", topic, GROUP, "q3", 1, [bad])
                errors.append(caught.value)
            nothing = await read_topic(namesrv, queues, 0)
            # Nothing was decided: the right commit still goes through.
            good = await client.commit_batch("broker-a", topic, GROUP, "q3", 1, [writer])
            received = await read_topic(namesrv, queues, 60)
        return errors, nothing, good, received

    errors, nothing, good, received = run(scenario())
    assert [e.code for e in errors] == [ResponseCode.EOS_BATCH_INCOMPLETE] * 2
    assert "not stored" in errors[0].remark
    assert "not a half message of writer" in errors[1].remark
    assert nothing == []
    assert good.committed_count == 60 and not good.already_committed
    assert received == rows("row", 60)


def test_halves_nobody_commits_are_rolled_back_after_their_timeout(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    topic = "EosTimeout"

    async def scenario():
        queues = await create_topic(namesrv, topic)
        async with ExactlyOnceClient(GROUP, namesrv) as client, Admin(namesrv) as admin:
            writer = await write_halves(client, identity("q4", 3, timeout_ms=1_000), queues,
                                        rows("late", 40))
            op_queue = MessageQueue(OP_TOPIC, "broker-a", 0)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + READ_WAIT_S
            # The broker writes op records when it rolls the halves back on its own.
            while loop.time() < deadline:
                try:
                    if await admin.max_offset(op_queue) > 0:
                        break
                except (BrokerRejected, NoRouteError):
                    pass  # no op record yet: the op topic has no route
                await asyncio.sleep(0.2)
            with pytest.raises(BrokerRejected) as caught:
                await client.commit_batch("broker-a", topic, GROUP, "q4", 3, [writer])
            received = await read_topic(namesrv, queues, 0)
        return caught.value, received

    error, received = run(scenario())
    assert error.code == ResponseCode.EOS_BATCH_INCOMPLETE
    assert "rolled back" in error.remark and "exactlyOnce.timeoutMs" in error.remark
    assert received == []


@pytest.mark.parametrize("kill_after_commits", [0, 150])
def test_a_broker_killed_while_committing_finishes_the_batch_after_restart(
        tidemq_cluster, monkeypatch, kill_after_commits):
    # The broker kills itself (SIGKILL) after writing the decision and committing
    # ``kill_after_commits`` halves: a deterministic crash point between decide and apply.
    monkeypatch.setenv("TIDEMQ_TEST_EOS_KILL_AFTER_COMMITS", str(kill_after_commits))
    cluster = tidemq_cluster()
    monkeypatch.delenv("TIDEMQ_TEST_EOS_KILL_AFTER_COMMITS")
    namesrv = cluster.namesrv_addr
    broker = cluster.broker("broker-a")
    topic = "EosCrash"

    async def scenario():
        queues = await create_topic(namesrv, topic)
        async with ExactlyOnceClient(GROUP, namesrv, send_timeout_ms=5_000) as client:
            writer = await write_halves(client, identity("q5", 2), queues, rows("row", 300))
            with pytest.raises(Exception):  # noqa: B017 - the broker dies mid-request
                await client.commit_batch("broker-a", topic, GROUP, "q5", 2, [writer])
            broker.process.wait(30)
            await asyncio.to_thread(broker.start)  # same port and store, no test hook
            received = await read_topic(namesrv, queues, 300)
            # The driver, restarted, commits the batch again: it was decided already.
            replay = await client.commit_batch("broker-a", topic, GROUP, "q5", 2, [writer])
        return received, replay

    received, replay = run(scenario())
    assert received == rows("row", 300)
    assert replay.already_committed and replay.committed_count == 300

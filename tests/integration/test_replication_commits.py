"""Transaction and exactly-once commits on a SYNC_MASTER (issue 11 item 2), real processes: a
commit is answered SUCCESS only once a slave holds its committed copies; with no slave in sync
it is answered SLAVE_NOT_AVAILABLE / FLUSH_SLAVE_TIMEOUT, stays committed on the master, and a
repeated commit after the slave returns is confirmed.
"""

from __future__ import annotations

import asyncio
import signal
import uuid

import pytest

from replication_group import max_offset, runtime, start_group, wait_caught_up
from routed_topics import create_routed_topic
from server_processes import wait_until
from tidemq.client import Message, MessageQueue, PullConsumer
from tidemq.client.errors import BrokerRejected
from tidemq.client.exactly_once import EosIdentity, ExactlyOnceClient, WriterHalves
from tidemq.client.message import SendStatus
from tidemq.client.transaction_producer import TransactionProducer, TransactionState
from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.message import BatchEntry, encode_batch_body
from tidemq.remoting.loop import run

pytestmark = pytest.mark.integration

TOPIC = "SyncCommits"
GROUP = "sync-commit-writer"
NOT_CONFIRMED = {ResponseCode.SLAVE_NOT_AVAILABLE, ResponseCode.FLUSH_SLAVE_TIMEOUT}


async def create_topic(namesrv: str) -> list[MessageQueue]:
    return sorted(await create_routed_topic(namesrv, TOPIC, 2))


async def write_halves(client: ExactlyOnceClient, query_id: str, batch_id: int,
                       queues: list[MessageQueue], prefix: str) -> WriterHalves:
    identity = EosIdentity(GROUP, query_id, batch_id, 0, uuid.uuid4().hex, 300_000)
    halves = WriterHalves(identity.writer_id)
    for index in range(2):
        bodies = [f"{prefix}-{index}-{n}".encode() for n in range(20)]
        body = encode_batch_body([BatchEntry(b) for b in bodies])
        result = await client.send_half_batch(identity, queues[index], body, len(bodies))
        halves.add(result.queue_offset, result.count)
    return halves


async def bodies_on(namesrv: str, queues: list[MessageQueue], expected: int) -> set[bytes]:
    """Bodies readable through the routes (the master's, or the slave's when it is down)."""
    received: set[bytes] = set()
    async with PullConsumer(f"sync-reader-{uuid.uuid4().hex[:8]}", namesrv,
                            consume_from="FIRST") as consumer:
        consumer.assign(queues)
        deadline = asyncio.get_running_loop().time() + 60
        while len(received) < expected and asyncio.get_running_loop().time() < deadline:
            received.update(m.body for m in await consumer.poll(300))
    return received


def test_commits_wait_for_the_slave_and_say_so_when_none_is_in_sync(tidemq_cluster):
    cluster, master, slave = start_group(
        tidemq_cluster, role="SYNC_MASTER", master={"syncFlushTimeout": "1000"})
    namesrv = cluster.namesrv_addr
    queues = run(create_topic(namesrv))

    async def commit_both(query_id: str, prefix: str, stop_slave: bool
                          ) -> tuple[object, object]:
        """Halves written while the slave is in sync, then (``stop_slave``: with the slave
        gone) an EOS batch commit and a transaction commit, each waiting for its answer:
        the answer, or the BrokerRejected raised."""
        async with (ExactlyOnceClient(GROUP, namesrv) as client,
                    TransactionProducer(f"{GROUP}-tx", namesrv) as producer):
            halves = await write_halves(client, query_id, 1, queues, prefix)
            half = await producer.send_half(Message(TOPIC, f"{prefix}-tx".encode()))
            assert half.status is SendStatus.SEND_OK
            if stop_slave:
                slave.kill(signal.SIGKILL)
                await asyncio.to_thread(
                    wait_until, lambda: runtime(master.addr)["inSyncSlaveNums"] == "0", 60,
                    0.1, "the master to notice the slave is gone")
            try:
                eos: object = await client.commit_batch("broker-a", TOPIC, GROUP, query_id, 1,
                                                        [halves])
            except BrokerRejected as exc:
                eos = exc
            try:
                tx: object = await producer.end_transaction(half, TransactionState.COMMIT,
                                                            wait=True)
            except BrokerRejected as exc:
                tx = exc
        return eos, tx

    # With the slave in sync: both confirmed, and the slave holds what the master wrote.
    eos, tx = run(commit_both("up", "up", stop_slave=False))
    assert not isinstance(eos, BrokerRejected), eos
    assert eos.committed_count == 40 and tx is None
    master_end = max_offset(master)
    assert max_offset(slave) >= master_end  # acknowledged before the answers were given

    # Without a slave in sync: committed on the master, but not answered SUCCESS.
    eos, tx = run(commit_both("down", "down", stop_slave=True))
    assert isinstance(eos, BrokerRejected) and eos.code in NOT_CONFIRMED, eos
    assert "committed on this master" in (eos.remark or "")
    assert isinstance(tx, BrokerRejected) and tx.code in NOT_CONFIRMED, tx
    assert "the half is ended" in (tx.remark or "")
    expected = {f"up-{i}-{n}".encode() for i in range(2) for n in range(20)}
    expected |= {f"down-{i}-{n}".encode() for i in range(2) for n in range(20)}
    expected |= {b"up-tx", b"down-tx"}
    assert run(bodies_on(namesrv, queues, len(expected))) == expected

    # The slave returns and catches up: a repeated commit is now confirmed (and commits
    # nothing twice).
    slave.start()
    wait_caught_up(master, slave)
    wait_until(lambda: runtime(master.addr)["inSyncSlaveNums"] == "1", 60, 0.1, "in sync")

    async def commit_again() -> object:
        async with ExactlyOnceClient(GROUP, namesrv) as client:
            return await client.commit_batch("broker-a", TOPIC, GROUP, "down", 1, [])

    again = run(commit_again())
    assert again.already_committed and again.committed_count == 40

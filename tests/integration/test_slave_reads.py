"""Consumption through a master outage (issue 11 items 3 and 4), with real processes: a push
consumer keeps consuming from the slave while its master is SIGKILLed, without gaps; what it
committed to the slave meanwhile reaches the master when it returns (the slave hands it back),
so neither it nor a consumer started afterwards consumes a committed message again.
"""

from __future__ import annotations

import asyncio
import threading
import time

from replication_group import runtime, start_group, wait_caught_up
from routed_topics import create_routed_topic
from server_processes import remoting_call, wait_until
from tidemq.client import ConsumeResult, Message, Producer, PullConsumer, PushConsumer
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting.loop import run

TOPIC = "SlaveReads"
GROUP = "cg_slave_reads"
QUEUES = 4
FIRST, SECOND = 200, 20
# Bounds of waits, not assertions: a restart and a slave sync (every 10 s) on a busy machine.
WAIT_S = 120.0
# Quick route refreshes and commits, so the test sees the group follow the brokers.
CONSUMER_SETTINGS = {"poll_name_server_interval_ms": 1000, "heartbeat_broker_interval_ms": 1000,
                     "persist_consumer_offset_interval_ms": 500, "rebalance_interval_ms": 1000}


async def send(namesrv: str, bodies: list[bytes]) -> None:
    async with Producer("pg_slave_reads", namesrv) as producer:
        for body in bodies:
            await producer.send(Message(TOPIC, body))


def committed(addr: str) -> list[int | None]:
    """The group's committed offset of each queue at the broker at ``addr``."""
    offsets: list[int | None] = []
    for queue_id in range(QUEUES):
        response = remoting_call(addr, RemotingCommand.request(
            RequestCode.QUERY_CONSUMER_OFFSET,
            {"consumerGroup": GROUP, "topic": TOPIC, "queueId": str(queue_id)}))
        offsets.append(int(response.ext_fields["offset"])
                       if response.code == ResponseCode.SUCCESS else None)
    return offsets


def queue_ends(addr: str) -> list[int]:
    ends = []
    for queue_id in range(QUEUES):
        response = remoting_call(addr, RemotingCommand.request(
            RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": str(queue_id)}))
        ends.append(int(response.ext_fields["offset"]))
    return ends


class Consumer:
    """A PushConsumer on its own loop in a thread, recording every body it consumed."""

    def __init__(self, namesrv: str, slow_s: float = 0.0) -> None:
        self.bodies: list[bytes] = []
        self.slow_s = slow_s
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        # Small pulls and a short queue: most messages are still on the brokers at the kill.
        self._consumer = PushConsumer(GROUP, namesrv, consume_from="FIRST",
                                      listener_threads=True, consume_concurrency=2,
                                      pull_batch_size=4, pull_threshold_for_queue=8,
                                      **CONSUMER_SETTINGS)
        self._consumer.subscribe(TOPIC, "*")
        self._consumer.listener(self._on_messages)
        asyncio.run_coroutine_threadsafe(self._consumer.start(), self._loop).result(WAIT_S)

    def _on_messages(self, messages) -> ConsumeResult:
        if self.slow_s:
            time.sleep(self.slow_s)
        with self._lock:
            self.bodies.extend(m.body for m in messages)
        return ConsumeResult.SUCCESS

    def distinct(self) -> set[bytes]:
        with self._lock:
            return set(self.bodies)

    def count(self) -> int:
        with self._lock:
            return len(self.bodies)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._consumer.close(), self._loop).result(WAIT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT_S)
        self._loop.close()


def test_consumption_goes_on_from_the_slave_and_no_commit_is_lost(tidemq_cluster):
    cluster, master, slave = start_group(tidemq_cluster)
    namesrv = cluster.namesrv_addr
    run(create_routed_topic(namesrv, TOPIC, QUEUES))
    first = [f"first-{n:04d}".encode() for n in range(FIRST)]
    run(send(namesrv, first))
    wait_caught_up(master, slave)
    # The slave copies the topic from its master within a sync period (10 s).
    wait_until(lambda: TOPIC.encode() in (remoting_call(slave.addr, RemotingCommand.request(
        RequestCode.GET_ALL_TOPIC_CONFIG)).body or b""), WAIT_S, 0.2, "the slave's topic copy")
    consumer = Consumer(namesrv, slow_s=0.03)  # slow: the kill lands mid-way
    try:
        wait_until(lambda: consumer.count() >= FIRST // 4, WAIT_S, 0.05, "consuming started")
        master.kill()  # SIGKILL
        wait_until(lambda: consumer.distinct() >= set(first), WAIT_S, 0.1,
                   "every message consumed, from the slave after the kill")
        assert consumer.distinct() == set(first)  # no gap, nothing foreign
        ends = queue_ends(slave.addr)
        assert sum(ends) == FIRST
        assert int(runtime(slave.addr)["msgGetTotalTodayNow"]) > 0  # read from the slave
        # The consumer committed to the slave while the master was away.
        wait_until(lambda: committed(slave.addr) == ends, WAIT_S, 0.2,
                   "the offsets committed to the slave")
        before_restart = consumer.count()
        master.start()
        # The slave hands its consumers' offsets back to the master within a sync period;
        # the consumer itself sends nothing (its offsets did not change since).
        wait_until(lambda: committed(master.addr) == ends, WAIT_S, 0.2,
                   "the slave to hand the offsets back to the master")
        # The consumer goes back to the master and consumes only what is new.
        second = [f"second-{n:04d}".encode() for n in range(SECOND)]
        run(send(namesrv, second))
        wait_until(lambda: consumer.distinct() >= set(second), WAIT_S, 0.1,
                   "new messages consumed after the master returned")
        after = consumer.bodies[before_restart:]
        assert not set(after) & set(first), "a committed message was consumed again"
    finally:
        consumer.close()
    # A consumer of the group started now starts where the group stopped.
    late = Consumer(namesrv)
    try:
        third = [f"third-{n:04d}".encode() for n in range(SECOND)]
        run(send(namesrv, third))
        wait_until(lambda: late.distinct() >= set(third), WAIT_S, 0.1, "the late consumer")
        assert late.distinct() == set(third)
    finally:
        late.close()


def test_a_master_behind_in_memory_sends_its_readers_to_the_slave(tidemq_cluster):
    # Ratio 0: any data behind the log's end counts as out of memory, so with slave reads
    # enabled the master suggests whichBrokerWhenConsumeSlowly (1) and the slave keeps them.
    reads = {"slaveReadEnable": "true", "accessMessageInMemoryMaxRatio": "0"}
    cluster, master, slave = start_group(tidemq_cluster, master=reads, slave=reads)
    namesrv = cluster.namesrv_addr
    run(create_routed_topic(namesrv, TOPIC, QUEUES))
    bodies = [f"suggested-{n:04d}".encode() for n in range(FIRST)]
    run(send(namesrv, bodies))
    wait_caught_up(master, slave)
    wait_until(lambda: TOPIC.encode() in (remoting_call(slave.addr, RemotingCommand.request(
        RequestCode.GET_ALL_TOPIC_CONFIG)).body or b""), WAIT_S, 0.2, "the slave's topic copy")
    consumer = Consumer(namesrv)
    try:
        wait_until(lambda: consumer.distinct() >= set(bodies), WAIT_S, 0.1, "every message")
    finally:
        consumer.close()
    assert consumer.distinct() == set(bodies)
    served_by_slave = int(runtime(slave.addr)["msgGetTotalTodayNow"])
    served_by_master = int(runtime(master.addr)["msgGetTotalTodayNow"])
    assert served_by_slave > 0, "no pull followed the master's suggestion"
    assert served_by_slave + served_by_master >= FIRST


def test_a_pull_consumer_polls_on_from_the_slave_and_its_commits_reach_the_master(
        tidemq_cluster):
    cluster, master, slave = start_group(tidemq_cluster)
    namesrv = cluster.namesrv_addr
    run(create_routed_topic(namesrv, TOPIC, QUEUES))
    bodies = [f"polled-{n:04d}".encode() for n in range(FIRST)]
    run(send(namesrv, bodies))
    wait_caught_up(master, slave)
    wait_until(lambda: TOPIC.encode() in (remoting_call(slave.addr, RemotingCommand.request(
        RequestCode.GET_ALL_TOPIC_CONFIG)).body or b""), WAIT_S, 0.2, "the slave's topic copy")

    async def consume() -> list[bytes]:
        got: list[bytes] = []
        async with PullConsumer(GROUP, namesrv, consume_from="FIRST", pull_batch_size=4,
                                pull_threshold_for_queue=8, max_poll_records=8,
                                poll_name_server_interval_ms=1000,
                                heartbeat_broker_interval_ms=1000,
                                rebalance_interval_ms=1000) as consumer:
            consumer.subscribe(TOPIC)
            while len(got) < FIRST // 4:
                got.extend(m.body for m in await consumer.poll(500))
            await consumer.commit_sync()
            master.kill()  # SIGKILL; the rest comes from the slave
            deadline = time.monotonic() + WAIT_S
            while set(got) < set(bodies) and time.monotonic() < deadline:
                got.extend(m.body for m in await consumer.poll(500))
            await consumer.commit_sync()  # to the slave: the master is gone
        return got

    got = run(consume())
    assert sorted(set(got)) == sorted(bodies)
    ends = queue_ends(slave.addr)
    assert committed(slave.addr) == ends
    master.start()
    wait_until(lambda: committed(master.addr) == ends, WAIT_S, 0.2,
               "the slave to hand the offsets back to the master")

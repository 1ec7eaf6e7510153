"""Replication under faults, real processes (issue 11 items 1 and 2): a SYNC_MASTER killed
under load loses no acknowledged message; a missing slave never yields SEND_OK; an
ASYNC_MASTER's slave stays close behind; a slave rebuilt from an empty disk copies the
master's oldest retained segment on.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time

from replication_group import (
    commit_log_bytes,
    max_offset,
    runtime,
    start_group,
    wait_caught_up,
)
from routed_topics import create_routed_topic
from server_processes import remoting_call, wait_until
from tidemq.client import Message, Producer
from tidemq.client.message import SendStatus
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.msgid import decode_offset_msg_id
from tidemq.remoting.loop import run

TOPIC = "SyncOrders"
PRODUCERS = 4
NOT_OK = {SendStatus.SLAVE_NOT_AVAILABLE, SendStatus.FLUSH_SLAVE_TIMEOUT}


async def create_topic(namesrv: str, topic: str = TOPIC) -> None:
    await create_routed_topic(namesrv, topic, 4)


def view(addr: str, physical_offset: int) -> bytes | None:
    """The record at ``physical_offset`` on the broker at ``addr`` (VIEW_MESSAGE_BY_ID)."""
    request = RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID,
                                      {"offset": str(physical_offset)})
    response = remoting_call(addr, request)
    return response.body if response.code == ResponseCode.SUCCESS else None


def test_sync_master_killed_under_load_loses_no_acknowledged_message(tidemq_cluster):
    cluster, master, slave = start_group(
        tidemq_cluster, role="SYNC_MASTER", master={"flushDiskType": "SYNC_FLUSH"})
    namesrv = cluster.namesrv_addr
    run(create_topic(namesrv))
    acknowledged: list[tuple[int, bytes]] = []  # (physical offset, body)
    counter = itertools.count()

    async def producer(index: int, stop: asyncio.Event) -> None:
        async with Producer(f"sync-{index}", namesrv, retry_times_when_send_failed=0,
                            send_timeout_ms=3000) as p:
            while not stop.is_set():
                body = f"p{index}-m{next(counter)}".encode()
                try:
                    result = await p.send(Message(TOPIC, body))
                except Exception:
                    continue  # the master is gone; unacknowledged, nothing to check
                if result.status is SendStatus.SEND_OK:
                    acknowledged.append((decode_offset_msg_id(result.offset_msg_id)[1], body))

    async def scenario() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(producer(i, stop)) for i in range(PRODUCERS)]
        deadline = asyncio.get_running_loop().time() + 60
        while len(acknowledged) < 400 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        master.kill(signal.SIGKILL)  # mid-flight: sends are still arriving
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)

    run(scenario())
    assert len(acknowledged) >= 400
    missing = [(offset, body) for offset, body in acknowledged
               if (record := view(slave.addr, offset)) is None or body not in record]
    assert not missing, f"{len(missing)} of {len(acknowledged)} SEND_OK messages not on the slave"


def test_without_a_slave_sync_sends_are_never_send_ok_and_recover_after_it_returns(
        tidemq_cluster):
    cluster, master, slave = start_group(
        tidemq_cluster, role="SYNC_MASTER", master={"syncFlushTimeout": "1000"})
    namesrv = cluster.namesrv_addr
    run(create_topic(namesrv))

    async def send_some(count: int) -> list[SendStatus]:
        async with Producer("sync-statuses", namesrv, retry_times_when_send_failed=0) as p:
            results = await asyncio.gather(*(p.send(Message(TOPIC, f"m{i}".encode()))
                                             for i in range(count)))
        return [r.status for r in results]

    assert set(run(send_some(20))) == {SendStatus.SEND_OK}
    slave.kill(signal.SIGKILL)
    wait_until(lambda: runtime(master.addr)["inSyncSlaveNums"] == "0", 60, 0.1,
               "the master to notice the slave is gone")
    statuses = run(send_some(30))
    assert set(statuses) <= NOT_OK, statuses
    slave.start()
    wait_caught_up(master, slave)
    wait_until(lambda: runtime(master.addr)["inSyncSlaveNums"] == "1", 60, 0.1, "in sync")
    assert set(run(send_some(20))) == {SendStatus.SEND_OK}
    # ... and what was stored while it was away reached it too.
    assert max_offset(slave) == max_offset(master)


def test_async_master_slave_lag_stays_bounded_under_steady_load(tidemq_cluster):
    cluster, master, slave = start_group(tidemq_cluster, role="ASYNC_MASTER")
    namesrv = cluster.namesrv_addr
    run(create_topic(namesrv))
    behind: list[int] = []

    async def scenario() -> None:
        async with Producer("async-steady", namesrv) as p:
            loop = asyncio.get_running_loop()
            end = loop.time() + 8
            sent = 0
            while loop.time() < end:
                await asyncio.gather(*(p.send(Message(TOPIC, b"x" * 1024)) for _ in range(20)))
                sent += 20
                # Sample the master's view of its slave as an operator would.
                info = await asyncio.to_thread(runtime, master.addr)
                behind.append(int(info["slaveFallBehindMuch"]))
                await asyncio.sleep(0.05)
            assert sent > 0

    run(scenario())
    wait_caught_up(master, slave, timeout_s=60)
    assert behind and max(behind) < 4 * 1024 * 1024, max(behind)
    # Copied is not yet readable: the slave's dispatch follows (dispatchBehindBytes to 0).
    deadline = time.monotonic() + 60
    while runtime(slave.addr)["dispatchBehindBytes"] != "0":
        assert time.monotonic() < deadline, "the slave's dispatch did not catch up"
        time.sleep(0.05)
    lag = runtime(slave.addr)["haReplicationLagMs"]
    assert int(runtime(slave.addr)["haReplicationLagSamples"]) > 10
    assert lag.startswith("p50 "), lag


def test_a_slave_from_an_empty_disk_copies_from_the_masters_oldest_retained_segment(
        tidemq_cluster):
    hour = time.localtime().tm_hour
    retention = {"mappedFileSizeCommitLog": str(256 * 1024), "fileReservedTime": "0",
                 "deleteWhen": f"{hour:02d};{(hour + 1) % 24:02d}"}
    cluster, master, _ = start_group(tidemq_cluster, master=retention, with_slave=False)
    namesrv = cluster.namesrv_addr
    run(create_topic(namesrv))

    async def fill() -> None:
        async with Producer("fill", namesrv) as p:
            for _ in range(40):
                await p.send_batch([Message(TOPIC, b"y" * 1000) for _ in range(32)])

    run(fill())
    # Retention (every 10 s) deletes the expired segments but the last.
    wait_until(lambda: int(runtime(master.addr)["commitLogMinOffset"]) > 0, 90, 0.5,
               "retention on the master")
    start = int(runtime(master.addr)["commitLogMinOffset"])
    slave = tidemq_cluster(namesrv_count=0, brokers=("fresh",), broker_overrides={"fresh": {
        "brokerName": "broker-a", "brokerId": 1, "brokerRole": "SLAVE",
        "mappedFileSizeCommitLog": str(256 * 1024), "namesrvAddr": namesrv}}).broker("fresh")
    end = wait_caught_up(master, slave)
    assert int(runtime(slave.addr)["commitLogMinOffset"]) == start
    assert commit_log_bytes(slave, start, end) == commit_log_bytes(master, start, end)

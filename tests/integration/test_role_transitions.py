"""Role transitions with real processes (issue 12, broker/role.py): a master and a slave
switched at run time through NOTIFY_BROKER_ROLE_CHANGED while producers send.

The story: A is master of epoch 1 and B its slave (SYNC_MASTER + SYNC_FLUSH, so SEND_OK means
"on both"). Producers keep sending while B is promoted (epoch 2) and A demoted; every message
answered SEND_OK must be readable from B afterwards. Between the two switches A still takes
sends addressed to it; having no slave any more it answers them SLAVE_NOT_AVAILABLE (stored on
A only, never SEND_OK): that is A's unreplicated tail. A rejoins as B's slave, truncates
exactly those records (its log names them) and ends with commit-log files byte-identical to
B's.
"""

from __future__ import annotations

import asyncio
import threading
import time

from replication_group import (
    BROKER_NAME,
    HA_TEST_SETTINGS,
    max_offset,
    runtime,
    store_check,
    store_dir,
    wait_caught_up,
)
from routed_topics import create_routed_topic
from server_processes import remoting_call, wait_until
from tidemq.client import Message, Producer, PullConsumer
from tidemq.client.message import SendStatus
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import SendMessageRequestHeader
from tidemq.remoting.loop import run

TOPIC = "Switched"
QUEUES = 2
SETTINGS = {"brokerName": BROKER_NAME, "flushDiskType": "SYNC_FLUSH",
            "registerNameServerPeriod": "10000", **HA_TEST_SETTINGS}


def notify(addr: str, master_addr: str, epoch: int, broker_id: int | None = None) -> str:
    fields = {"masterAddress": master_addr, "masterEpoch": str(epoch)}
    if broker_id is not None:
        fields["brokerId"] = str(broker_id)
    response = remoting_call(addr, RemotingCommand.request(
        RequestCode.NOTIFY_BROKER_ROLE_CHANGED, fields))
    assert response.code == ResponseCode.SUCCESS, response.remark
    return response.remark or ""


def direct_send(addr: str, key: str) -> RemotingCommand:
    header = SendMessageRequestHeader(
        producer_group="direct", topic=TOPIC, default_topic="TBW102",
        default_topic_queue_nums=QUEUES, queue_id=0, sys_flag=0,
        born_timestamp=int(time.time() * 1000), flag=0,
        properties=f"UNIQ_KEY\x01{key}\x02KEYS\x01{key}\x02WAIT\x01true\x02")
    return remoting_call(addr, RemotingCommand.request(
        RequestCode.SEND_MESSAGE_V2, header.to_ext_fields(), key.encode() * 10))


def commit_log_files(server) -> dict[str, bytes]:
    directory = store_dir(server) / "commitlog"
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())
            if path.name.isdigit()}


class Senders:
    """Producers sending in a thread until stopped; records every answer by body."""

    def __init__(self, namesrv: str) -> None:
        self.namesrv = namesrv
        self.acked: set[str] = set()
        self.other: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    async def _run(self) -> None:
        async with Producer("switch-senders", self.namesrv, send_timeout_ms=3000,
                            retry_times_when_send_failed=0,
                            poll_name_server_interval_ms=500) as producer:
            async def one(lane: int) -> None:
                i = 0
                while not self._stop.is_set():
                    body = f"lane{lane}-{i}"
                    i += 1
                    try:
                        result = await producer.send(Message(TOPIC, body.encode()))
                    except Exception as e:  # refused during the switch: not acknowledged
                        self.other[body] = type(e).__name__
                        await asyncio.sleep(0.05)
                        continue
                    if result.status is SendStatus.SEND_OK:
                        self.acked.add(body)
                    else:
                        self.other[body] = result.status.value
            await asyncio.gather(*(one(lane) for lane in range(4)))


async def read_all(namesrv: str) -> list[str]:
    bodies: list[str] = []
    consumer = PullConsumer("switch-check", namesrv, consume_from="FIRST")
    consumer.subscribe(TOPIC, "*")
    async with consumer:
        idle = 0
        while idle < 5:
            batch = await consumer.poll(timeout_ms=1000)
            idle = 0 if batch else idle + 1
            bodies += [m.body.decode() for m in batch]
    return bodies


def test_switch_under_load_then_the_old_master_rejoins_byte_identical(tidemq_cluster):
    cluster = tidemq_cluster(brokers=("a", "b"), broker_overrides={
        "a": {**SETTINGS, "brokerRole": "SYNC_MASTER"},
        "b": {**SETTINGS, "brokerRole": "SLAVE", "brokerId": 1},
    })
    a, b = cluster.broker("a"), cluster.broker("b")
    notify(a.addr, a.addr, 1)
    notify(b.addr, a.addr, 1, broker_id=1)
    wait_until(lambda: runtime(a.addr).get("inSyncSlaveNums") == "1", 60, 0.1, "b in sync")
    run(create_routed_topic(cluster.namesrv_addr, TOPIC, QUEUES))

    senders = Senders(cluster.namesrv_addr)
    senders.start()
    wait_until(lambda: len(senders.acked) >= 100, 120, 0.05, "100 acknowledged sends")
    # The switch, with sends in flight: B first (it stops copying and takes writes as the
    # master of epoch 2), then A (it refuses writes, then follows B).
    assert "master of epoch 2" in notify(b.addr, b.addr, 2)
    tail = [direct_send(a.addr, f"tail-{i}") for i in range(5)]
    assert [r.code for r in tail] == [ResponseCode.SLAVE_NOT_AVAILABLE] * 5
    assert "slave 1" in notify(a.addr, b.addr, 2, broker_id=1)
    acked_at_switch = len(senders.acked)
    wait_until(lambda: len(senders.acked) >= acked_at_switch + 100, 120, 0.05,
               "sends acknowledged by the new master")
    senders.stop()

    wait_until(lambda: "dropped a divergent tail" in a.log_tail(400), 60, 0.1,
               "a to truncate its tail")
    wait_caught_up(b, a)
    assert runtime(b.addr)["masterEpoch"] == "2" and runtime(a.addr)["brokerRole"] == "SLAVE"
    log = a.log_tail(400)
    line = "\n".join(text for text in log.splitlines() if "dropped" in text)
    # Every SEND_OK message is on the new master; none twice.
    bodies = run(read_all(cluster.namesrv_addr))
    assert senders.acked <= set(bodies), sorted(senders.acked - set(bodies))[:10]
    assert len(bodies) == len(set(bodies))
    assert not any(body.startswith("tail-") for body in bodies)
    assert all(f"tail-{i}" in line for i in range(5)), line
    end = max_offset(b)
    for server in (b, a):
        assert server.stop() == 0
    files = commit_log_files(a)
    assert files and files == commit_log_files(b), f"logs differ (end {end})"
    for server in (a, b):
        checked = store_check(server)
        assert checked.returncode == 0, checked.stdout + checked.stderr

"""Master/slave replication with real processes (issue 11 items 1 and 5): a slave's commit log
is the master's byte for byte, it answers the same reads, and it refuses masters and logs it
must not copy.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import subprocess
import sys

from replication_group import (
    BROKER_NAME,
    commit_log_bytes,
    max_offset,
    runtime,
    start_group,
    store_check,
    wait_caught_up,
    wait_quiet,
)
from routed_topics import create_routed_topic
from server_processes import remoting_call, wait_until
from tidemq.client import Message, Producer
from tidemq.client.message import SendStatus
from tidemq.client.transaction_producer import TransactionProducer, TransactionState
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting.loop import run
from tidemq.store.config import StoreConfig
from tidemq.store.file_store import FileMessageStore

TOPIC = "Replicated"
QUEUES = 4


async def mixed_sends(namesrv: str, rounds: int = 6) -> int:
    """Single, batch, compressed (large bodies) and transactional sends; returns the count."""
    await create_routed_topic(namesrv, TOPIC, QUEUES)
    sent = 0
    async with Producer("ha-mixed", namesrv) as producer:
        for r in range(rounds):
            result = await producer.send(Message(TOPIC, f"single-{r}".encode(), tags="one",
                                                 keys=[f"key-{r}"]))
            assert result.status is SendStatus.SEND_OK
            await producer.send_batch([Message(TOPIC, f"batch-{r}-{i}".encode() * 20,
                                               keys=[f"batch-{r}-{i}"]) for i in range(50)])
            big = (f"compressible-{r} " * 2000).encode()  # over 4 KiB: the client zips it
            await producer.send(Message(TOPIC, big, tags="zip", keys=[f"zip-{r}"]))
            sent += 53
    async with TransactionProducer("ha-tx", namesrv) as producer:
        for r in range(rounds):
            state = TransactionState.COMMIT if r % 2 == 0 else TransactionState.ROLLBACK
            await producer.send_in_transaction(
                Message(TOPIC, f"tx-{r}".encode(), keys=[f"tx-{r}"]), lambda _m, s=state: s)
            sent += 1
    return sent


def queue_max_offsets(addr: str) -> list[int]:
    offsets = []
    for queue_id in range(QUEUES):
        request = RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                          {"topic": TOPIC, "queueId": str(queue_id)})
        response = remoting_call(addr, request)
        assert response.code == ResponseCode.SUCCESS, response.remark
        offsets.append(int(response.ext_fields["offset"]))
    return offsets


def test_slave_log_equals_the_masters_and_answers_the_same_reads(tidemq_cluster):
    cluster, master, slave = start_group(tidemq_cluster)
    run(mixed_sends(cluster.namesrv_addr))
    end = wait_quiet(master, slave)
    assert queue_max_offsets(slave.addr) == queue_max_offsets(master.addr)
    assert sum(queue_max_offsets(master.addr)) > 300
    master_info, slave_info = runtime(master.addr), runtime(slave.addr)
    assert master_info["brokerRole"] == "ASYNC_MASTER" and slave_info["brokerRole"] == "SLAVE"
    assert master_info["inSyncSlaveNums"] == "1"
    assert slave_info["haClientConnected"] == "true"
    start = int(master_info["commitLogMinOffset"])
    for server in (master, slave):
        assert server.stop() == 0
    assert commit_log_bytes(slave, start, end) == commit_log_bytes(master, start, end)
    for server in (master, slave):
        checked = store_check(server)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    # Every pull and key query answers the same from both stores.
    stores = []
    for server in (master, slave):
        stores.append(FileMessageStore(StoreConfig(
            store_path_root_dir=str(server.workdir / "store"),
            mapped_file_size_commit_log=16 * 1024 * 1024,
            mapped_file_size_consume_queue=30_000 * 20, max_hash_slot_num=50_000,
            max_index_num=200_000)))
    try:
        ours, theirs = stores[1], stores[0]
        for queue_id in range(QUEUES):
            a = theirs.get_messages(TOPIC, queue_id, 0, 10_000, 1 << 30)
            b = ours.get_messages(TOPIC, queue_id, 0, 10_000, 1 << 30)
            assert (a.status, a.body, a.message_count) == (b.status, b.body, b.message_count)
        for key in ("key-0", "batch-3-7", "zip-5", "tx-0", "tx-1"):
            a = theirs.query_messages(TOPIC, key, 32, 0, 1 << 62)
            b = ours.query_messages(TOPIC, key, 32, 0, 1 << 62)
            assert sorted(a.records) == sorted(b.records) and (key == "tx-1" or a.records)
    finally:
        for store in stores:
            store.close()


def test_cluster_list_shows_roles_and_how_far_a_slave_is_behind(tidemq_cluster):
    cluster, master, slave = start_group(tidemq_cluster)
    run(mixed_sends(cluster.namesrv_addr, rounds=1))
    wait_caught_up(master, slave)
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", "clusterList", "-n", cluster.namesrv_addr,
         "--json"], capture_output=True, text=True, timeout=60, check=True)

    rows = {row["brokerId"]: row for row in json.loads(out.stdout)}
    assert rows[0]["role"] == "ASYNC_MASTER" and rows[0]["behindBytes"] is None
    assert rows[1]["role"] == "SLAVE" and rows[1]["behindBytes"] == 0
    table = subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", "clusterList", "-n", cluster.namesrv_addr],
        capture_output=True, text=True, timeout=60, check=True).stdout
    assert "SLAVE" in table and "ASYNC_MASTER" in table
    status = subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", "brokerStatus", "-n", cluster.namesrv_addr,
         "-b", master.addr, "--json"], capture_output=True, text=True, timeout=60, check=True)
    table = json.loads(status.stdout)[master.addr]
    for key in ("masterCommitLogMaxOffset", "inSyncSlaveNums", "slaveFallBehindMuch",
                "haConnectionInfo"):
        assert key in table, key
    # One connect and one caught-up line, not one per chunk.
    log = (master.workdir / "stdout.log").read_text() + (master.workdir / "stderr.log").read_text()
    assert log.count("caught up") == 1, log
    assert log.count("connected to broker") == 1, log


def test_garbage_on_the_ha_port_closes_that_connection_only(tidemq_cluster):
    cluster, master, slave = start_group(tidemq_cluster)
    ha_port = int(master.addr.rpartition(":")[2]) + 1
    for garbage in (struct.pack(">q", -1), b"\xff\x00" * 11, b"GET / HTTP/1.1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", ha_port), timeout=10) as sock:
            sock.sendall(garbage)
            sock.settimeout(15)
            try:
                while sock.recv(65536):
                    pass
            except (TimeoutError, ConnectionResetError):
                pass
    run(mixed_sends(cluster.namesrv_addr, rounds=1))
    wait_caught_up(master, slave)
    assert runtime(master.addr)["inSyncSlaveNums"] == "1"
    assert master.running


def test_a_slave_of_another_broker_name_or_cluster_refuses(tidemq_cluster):
    cluster, master, _ = start_group(tidemq_cluster, with_slave=False)
    run(mixed_sends(cluster.namesrv_addr, rounds=1))
    ha_address = f"127.0.0.1:{int(master.addr.rpartition(':')[2]) + 1}"
    for name, wrong in (("other-name", {"brokerName": "broker-b"}),
                        ("other-cluster", {"brokerClusterName": "ClusterB"})):
        stray = tidemq_cluster(namesrv_count=0, brokers=(name,), broker_overrides={
            name: {"brokerId": 1, "brokerRole": "SLAVE", "haMasterAddress": ha_address,
                   "brokerName": BROKER_NAME, **wrong}}).broker(name)
        wait_until(lambda s=stray: "refuses to copy" in s.log_tail(200), 60, 0.2, "refusal")
        text = stray.log_tail(200)
        assert "a slave copies only the master of its own brokerName and brokerClusterName" in text
        assert max_offset(stray) == 0
        assert runtime(stray.addr)["haRefused"]


def test_a_slave_whose_log_differs_or_is_ahead_refuses_naming_both_offsets(tidemq_cluster):
    cluster, master, _ = start_group(tidemq_cluster, with_slave=False)
    run(mixed_sends(cluster.namesrv_addr, rounds=1))
    master_end = max_offset(master)
    ha_address = f"127.0.0.1:{int(master.addr.rpartition(':')[2]) + 1}"
    # Brokers that were masters of their own first: their logs hold other bytes, one
    # shorter than the master's, one longer.
    for name, count, words in (("former-short", 20, "logs differ"),
                               ("former-long", 400, "ahead of the master's")):
        former = tidemq_cluster(namesrv_count=0, brokers=(name,), broker_overrides={
            name: {"brokerName": BROKER_NAME}}).broker(name)
        run(mixed_sends_to(former, count))
        former_end = max_offset(former)
        assert (former_end < master_end) == (count == 20)
        assert former.stop() == 0
        former.make_args = _with(former.make_args, {"brokerId": "1", "brokerRole": "SLAVE",
                                                    "haMasterAddress": ha_address})
        former.start()
        wait_until(lambda f=former: "refuses to copy" in f.log_tail(200), 60, 0.2, "refusal")
        text = former.log_tail(200)
        assert words in text and str(former_end) in text and str(master_end) in text, text
        assert max_offset(former) == former_end  # nothing truncated, nothing appended
        assert "truncated" not in text.split("refuses to copy")[1]


def _with(make_args, extra: dict[str, str]):
    """``make_args`` with ``--key value`` for each of ``extra`` added (they win)."""
    def make(port: int) -> list[str]:
        args = make_args(port)
        for key, value in extra.items():
            args += [f"--{key}", value]
        return args

    return make


async def mixed_sends_to(server, count: int) -> None:
    """Sends straight to a broker that registers with no name server."""
    for i in range(count):
        request = RemotingCommand.request(RequestCode.SEND_MESSAGE, {
            "producerGroup": "g", "topic": "Former", "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
            "bornTimestamp": "0", "flag": "0", "properties": "", "reconsumeTimes": "0",
            "unitMode": "false", "batch": "false"}, f"former-{i}".encode() * 20)
        response = await asyncio.to_thread(remoting_call, server.addr, request)
        assert response.code == ResponseCode.SUCCESS, response.remark


def test_a_slave_started_before_its_master_finds_it_within_seconds(tidemq_cluster):
    from replication_group import HA_TEST_SETTINGS

    cluster = tidemq_cluster(brokers=("slave", "master"), broker_overrides={
        "slave": {"brokerName": BROKER_NAME, "brokerId": 1, "brokerRole": "SLAVE",
                  **HA_TEST_SETTINGS},
        "master": {"brokerName": BROKER_NAME, "brokerRole": "SYNC_MASTER", **HA_TEST_SETTINGS},
    })
    master = cluster.broker("master")
    # Well before registerNameServerPeriod (30 s): the slave asks again every 2 s until
    # the name server's answer names its master.
    wait_until(lambda: runtime(master.addr)["inSyncSlaveNums"] == "1", 20, 0.2,
               "the slave to find its master")

"""Role switches in one process (issue 12, broker/role.py): two brokers on file stores over
loopback, switched by ``become_master`` / ``become_slave`` / ``fence`` and by
NOTIFY_BROKER_ROLE_CHANGED; an old master with an unreplicated tail rejoins as a slave,
truncates exactly that tail and ends byte-identical to the new master.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from server_processes import free_port
from tidemq.broker.config import BrokerRole
from tidemq.broker.controller import BrokerController
from tidemq.broker.ha.wire import encode_report
from tidemq.broker.metrics import BrokerCollector
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import SendMessageRequestHeader
from tidemq.remoting.client import RemotingClient
from tidemq.store.epochs import EpochEntry


class FakePeer:
    """The parts of a Connection the send handlers read."""

    def __init__(self, remote_address: str = "127.0.0.1:45678") -> None:
        self.remote_address = remote_address
        self.attributes: dict = {}
        self.on_close: list = []
        self.is_closing = False
        self.loop = asyncio.get_running_loop()

    def flush(self) -> None:
        """Nothing is corked here: a handler's responses are returned to the caller."""


HA_FAST = {"ha_send_heartbeat_interval_ms": 200, "ha_housekeeping_interval_ms": 3000}
WAIT_S = 30.0


def free_pair() -> int:
    """A port p with p, p - 2 and p + 1 free (listenPort, its VIP port and its HA port),
    below the kernel's ephemeral range and in this xdist worker's slice
    (server_processes.free_port): a port the kernel handed out as free (bind to 0) was taken
    by some connection before the broker listened on it, on a busy machine ("address already
    in use"). p - 2 is reserved too: without it the second broker of a pair could be given
    the first one's VIP port (the likely cause of a CI run's "address already in use")."""
    return free_port(neighbours=(-2, 1))


def send_request(topic: str, body: bytes, key: str) -> RemotingCommand:
    header = SendMessageRequestHeader(
        producer_group="pg", topic=topic, default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=0, sys_flag=0, born_timestamp=1, flag=0,
        properties=f"KEYS\x01{key}\x02UNIQ_KEY\x01{key}-id\x02WAIT\x01true\x02",
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_ext_fields(), body)


async def until(condition, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def commit_log_files(broker: BrokerController) -> dict[str, bytes]:
    """Every commit-log segment file of a stopped broker, whole (zeros past the end too)."""
    directory = Path(broker.store_config.store_path_root_dir) / "commitlog"
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())
            if path.name.isdigit()}


def make_pair(make_broker, role: BrokerRole = BrokerRole.ASYNC_MASTER
              ) -> tuple[BrokerController, BrokerController]:
    brokers = []
    for _ in range(2):
        brokers.append(make_broker(
            store_kind="file", listen_port=free_pair(), broker_name="broker-r",
            broker_role=role, store_overrides=HA_FAST))
    return brokers[0], brokers[1]


def identity_metrics(broker: BrokerController) -> dict:
    """The role, brokerId, epoch and writability a scrape of the broker's metrics shows."""
    samples = {sample.name: sample for family in BrokerCollector(broker.parts, lambda: 0)
               .collect() for sample in family.samples}
    info = samples["tidemq_broker_info"].labels
    return {"role": info["role"], "broker_id": info["broker_id"],
            "epoch": samples["tidemq_broker_master_epoch"].value,
            "writable": samples["tidemq_broker_accepts_writes"].value}


async def send(client: RemotingClient, broker: BrokerController, key: str) -> RemotingCommand:
    return await client.invoke(broker.broker_address,
                               send_request("Orders", f"body of {key}".encode() * 8, key), 5000)


def test_an_old_master_rejoins_truncates_exactly_its_unreplicated_tail(make_broker, caplog):
    a, b = make_pair(make_broker)

    async def scenario():
        await a.start()
        await b.start()
        client = RemotingClient()
        try:
            await a.role.become_master(1)
            await b.role.become_slave(1, a.broker_address, a.ha_server_address, 1)
            await until(lambda: a.role.replication.service.in_sync_slave_count() == 1,
                        "b in sync")
            for i in range(30):
                response = await send(client, a, f"acked-{i}")
                assert response.code == ResponseCode.SUCCESS, response.remark
            await until(lambda: b.store.commit_log_max_offset() == a.store.commit_log_max_offset(),
                        "b to catch up")
            shared_end = a.store.commit_log_max_offset()
            # The slave is cut off (its HA client stops as it is promoted); the old master
            # still takes writes (an ASYNC_MASTER answers at once): its unreplicated tail.
            await b.role.become_master(2)
            tail = []
            for i in range(7):
                response = await send(client, a, f"tail-{i}")
                assert response.code == ResponseCode.SUCCESS, response.remark
                tail.append(f"tail-{i}-id")
            for i in range(5):
                response = await send(client, b, f"new-{i}")
                assert response.code == ResponseCode.SUCCESS, response.remark
            assert a.store.commit_log_max_offset() > shared_end
            # The old master rejoins as a slave of the new one, through the admin request.
            notice = RemotingCommand.request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, {
                "masterAddress": b.broker_address, "masterEpoch": "2", "brokerId": "1",
                "syncStateSetEpoch": "1"})
            response = await client.invoke(a.broker_address, notice, 5000)
            assert response.code == ResponseCode.SUCCESS, response.remark
            refused = await send(client, a, "to-a-slave")
            assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
            await until(lambda: a.role.last_truncation is not None, "a to truncate")
            await until(lambda: a.store.commit_log_max_offset() == b.store.commit_log_max_offset(),
                        "a to catch up with b")
            truncation = a.role.last_truncation
            epochs_b = await client.invoke(
                b.broker_address, RemotingCommand.request(RequestCode.GET_BROKER_EPOCH_CACHE), 5000)
            # The dropped messages left the queues and the index; the new master's records now
            # at the same offsets are indexed (the index was cut back and rebuilt).
            queries = {key: len(a.store.query_messages("Orders", key, 32, 0, 1 << 62).records)
                       for key in ("tail-3", "new-3", "acked-7")}
            assert a.store.max_offset("Orders", 0) == b.store.max_offset("Orders", 0) == 35
            # As a slave it remembers what consumers commit to it (handed back to its master).
            a.consumer_offset_manager.commit_offset("g", "Orders", 0, 5)
            assert a.consumer_offset_manager.local_commits == {("g", "Orders", 0): 5}
            assert a.slave_sync is not None
            return shared_end, tail, truncation, jsonx.loads(epochs_b.body), queries
        finally:
            await client.close()
            await a.shutdown(grace_s=1.0)
            await b.shutdown(grace_s=1.0)

    with caplog.at_level(logging.WARNING, logger="tidemq.broker.role"):
        shared_end, tail, truncation, epochs_b, queries = asyncio.run(scenario())
    assert truncation.new_end == shared_end
    assert truncation.count == 7
    assert [record.msg_id for record in truncation.records] == tail
    assert "dropped a divergent tail" in caplog.text and "tail-6-id" in caplog.text
    files = commit_log_files(a)
    assert files and files == commit_log_files(b)
    assert [e["epoch"] for e in epochs_b["epochList"]] == [1, 2]
    assert epochs_b["epochList"][1]["startOffset"] == shared_end
    assert a.store.epochs.entries == [EpochEntry(1, 0), EpochEntry(2, shared_end)]
    assert a.role.broker_id == 1 and a.role.is_slave
    assert queries == {"tail-3": 0, "new-3": 1, "acked-7": 1}


def test_fence_answers_a_waiting_send_unacknowledged_and_refuses_later_ones(make_broker):
    a, _ = make_pair(make_broker, BrokerRole.SYNC_MASTER)

    async def scenario():
        await a.start()
        client = RemotingClient()
        try:
            await a.role.become_master(1)
            # A slave that reports once (in sync) and then never acknowledges again.
            host, _, port = a.ha_server_address.rpartition(":")
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(encode_report(a.store.commit_log_max_offset()))
            service = a.role.replication.service
            await until(lambda: service.in_sync_slave_count() == 1, "the stub slave in sync")
            waiting = asyncio.ensure_future(send(client, a, "in-flight"))
            await until(lambda: len(service.waits) > 0, "the send to wait for the slave")
            a.role.fence("lost its lease")
            answer = await waiting
            refused = await send(client, a, "after-fence")
            writer.close()
            return answer, refused
        finally:
            await client.close()
            await a.shutdown(grace_s=1.0)

    answer, refused = asyncio.run(scenario())
    assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "changed role while this send waited" in answer.remark
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "lost its lease" in refused.remark


def test_sends_stored_together_are_all_refused_when_the_master_is_demoted_meanwhile(
        make_broker):
    # Sends read together are stored in one append and answered one after another; the
    # second's wait starts only after the first's. A demotion during the first wait must not
    # let the second be answered SEND_OK by a broker that is a slave by then (the integration
    # test caught exactly that).
    a, other = make_pair(make_broker, BrokerRole.SYNC_MASTER)

    async def scenario():
        await a.start()
        try:
            await a.role.become_master(1)
            host, _, port = a.ha_server_address.rpartition(":")
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(encode_report(a.store.commit_log_max_offset()))
            service = a.role.replication.service
            await until(lambda: service.in_sync_slave_count() == 1, "the stub slave in sync")
            group = asyncio.ensure_future(a.send_processor.handle_group(
                [send_request("Orders", b"x" * 50, f"g-{i}") for i in range(3)], FakePeer()))
            await until(lambda: len(service.waits) > 0, "the first send to wait")
            await a.role.become_slave(2, other.broker_address, other.ha_server_address, 1)
            answers = await group
            writer.close()
            return answers
        finally:
            await a.shutdown(grace_s=1.0)

    answers = asyncio.run(scenario())
    assert [answer.code for answer in answers] == [ResponseCode.SERVICE_NOT_AVAILABLE] * 3
    assert all("not acknowledged" in answer.remark for answer in answers)


def test_a_promoted_slave_takes_writes_as_sync_master_and_delivers_delayed_messages(
        make_broker):
    slave = make_broker(store_kind="file", listen_port=free_pair(), broker_name="broker-r",
                        broker_role=BrokerRole.SLAVE, broker_id=1, store_overrides=HA_FAST)

    async def scenario():
        await slave.start()
        client = RemotingClient()
        try:
            refused = await send(client, slave, "before")
            identity_before = identity_metrics(slave)
            await slave.role.become_master(3)
            header = SendMessageRequestHeader(
                producer_group="pg", topic="Orders", default_topic="TBW102",
                default_topic_queue_nums=4, queue_id=0, sys_flag=0, born_timestamp=1, flag=0,
                properties="DELAY\x011\x02WAIT\x01true\x02")
            delayed = await client.invoke(slave.broker_address, RemotingCommand.request(
                RequestCode.SEND_MESSAGE_V2, header.to_ext_fields(), b"later"), 5000)
            await until(lambda: slave.store.max_offset("Orders", 0) == 1,
                        "the delayed message to be delivered")
            config = await client.invoke(slave.broker_address, RemotingCommand.request(
                RequestCode.GET_BROKER_CONFIG), 5000)
            # Told again (a re-election of the same broker): nothing it wrote is cut.
            end = slave.store.commit_log_max_offset()
            await slave.role.become_master(4)
            assert slave.store.commit_log_max_offset() == end > 0
            assert slave.role.last_truncation is None
            return refused, delayed, config.body.decode(), identity_before
        finally:
            await client.close()
            await slave.shutdown(grace_s=1.0)

    refused, delayed, config, identity_before = asyncio.run(scenario())
    # The metrics follow the switch, not the configuration.
    assert identity_before == {"role": "SLAVE", "broker_id": "1", "epoch": 0.0, "writable": 0.0}
    assert identity_metrics(slave) == {"role": "SYNC_MASTER", "broker_id": "0", "epoch": 4.0,
                                       "writable": 1.0}
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
    # No slave yet: stored on this master only, said so (never SEND_OK without a copy).
    assert delayed.code == ResponseCode.SLAVE_NOT_AVAILABLE
    assert "brokerRole=SYNC_MASTER" in config and "brokerId=0" in config
    assert slave.role.epoch == 4
    assert slave.store.epochs.entries[0] == EpochEntry(3, 0)
    assert slave.store.epochs.entries[1].epoch == 4


def test_a_promoted_slave_checks_the_half_messages_it_copied(make_broker):
    a, _ = make_pair(make_broker)
    b = make_broker(store_kind="file", listen_port=free_pair(), broker_name="broker-r",
                    broker_role=BrokerRole.SLAVE, broker_id=1, store_overrides=HA_FAST)

    async def scenario():
        await a.start()
        await b.start()
        client = RemotingClient()
        try:
            await a.role.become_master(1)
            await b.role.become_slave(1, a.broker_address, a.ha_server_address, 1)
            header = SendMessageRequestHeader(
                producer_group="order-tx", topic="Orders", default_topic="TBW102",
                default_topic_queue_nums=4, queue_id=0, sys_flag=4, born_timestamp=1, flag=0,
                properties="TRAN_MSG\x01true\x02PGROUP\x01order-tx\x02KEYS\x01o-1\x02")
            half = await client.invoke(a.broker_address, RemotingCommand.request(
                RequestCode.SEND_MESSAGE_V2, header.to_ext_fields(), b"order-1"), 5000)
            assert half.code == ResponseCode.SUCCESS, half.remark
            await until(lambda: b.store.commit_log_max_offset() == a.store.commit_log_max_offset(),
                        "b to copy the half")
            before = len(b.transaction_service.progress.pending)
            await b.role.become_master(2)
            # Its check task scans the half queue it copied and tracks the open half.
            await until(lambda: len(b.transaction_service.progress.pending) == 1,
                        "the new master to track the half")
            return before, len(b.transaction_service.progress.pending)
        finally:
            await client.close()
            await a.shutdown(grace_s=1.0)
            await b.shutdown(grace_s=1.0)

    before, after = asyncio.run(scenario())
    assert (before, after) == (0, 1)  # a slave tracks nothing; the new master checks the half


def test_a_fenced_master_stops_registering_until_it_is_told_its_role(make_broker,
                                                                   fake_namesrv):
    async def scenario():
        async with fake_namesrv() as namesrv:
            broker = make_broker(store_kind="file", listen_port=free_pair(),
                                 broker_name="broker-r", namesrv_addr=namesrv.address)
            await broker.start()
            try:
                await broker.role.become_master(1)
                registered = len(namesrv.registrations)
                broker.role.fence("lost its lease")
                await broker.registration.register_all()  # a periodic round: skipped
                fenced_rounds = len(namesrv.registrations) - registered
                await broker.role.become_slave(2, "127.0.0.1:1", "127.0.0.1:2", 3)
                await namesrv.wait_registrations(registered + 1)
                return fenced_rounds, namesrv.registrations[-1].ext_fields["brokerId"]
            finally:
                await broker.shutdown(grace_s=1.0)

    fenced_rounds, broker_id = asyncio.run(scenario())
    assert fenced_rounds == 0
    assert broker_id == "3"  # told its role: registered again, as the slave it now is


def test_stored_now_agrees_with_stored_status_now_across_a_fence(make_broker):
    # The plain sends' answers ask stored_now(first offset) instead of stored_status_now of
    # a PutResult made for it: the two must agree for a put with no SYNC_FLUSH future.
    from tidemq.store.interface import PutResult, PutStatus, StoreMessage

    broker = make_broker()
    role = broker.role
    stored = broker.store.put_message(StoreMessage("Orders", 0, b"before", {}))
    assert stored.ok
    fenced_at = broker.store.commit_log_max_offset()

    def agree(physical_offset: int) -> bool:
        put = PutResult(PutStatus.PUT_OK, "", physical_offset, 10, 0, ["id"], 0, 1, None)
        now = role.stored_now(physical_offset)
        assert now == (role.stored_status_now(put) is PutStatus.PUT_OK)
        return now

    assert agree(0) and agree(fenced_at)
    role.fence("lost its lease")  # puts stored before this are no longer answered SEND_OK
    assert not agree(0) and not agree(fenced_at - 1)
    assert agree(fenced_at)

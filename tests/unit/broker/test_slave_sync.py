"""A slave copies its master's tables every 10 s (slave_sync.py), and offsets committed to the
slave while its master was away are kept and handed back instead of thrown away."""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path

import orjson

from tidemq.broker.consumer_offset_manager import KEEP_LARGER_EXT_FIELD
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.store.config_tables import SubscriptionGroupConfig, TopicConfig

GROUP = "cg_sync"
TOPIC = "Orders"


def update_offset(offset: int, queue_id: int = 0, **extra: str) -> RemotingCommand:
    fields = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": str(queue_id),
              "commitOffset": str(offset), **extra}
    return RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, fields)


def make_pair(make_broker, tmp_path, *, delay_offsets: dict[str, int] | None = None):
    """A master (to be served) and a slave of the same broker name (not started)."""
    master_root = tmp_path / "master"
    if delay_offsets is not None:
        (master_root / "config").mkdir(parents=True)
        (master_root / "config" / "delayOffset.json").write_bytes(
            orjson.dumps({"offsetTable": delay_offsets}))
    master = make_broker(root=master_root)
    slave = make_broker(root=tmp_path / "slave", broker_role="SLAVE", broker_id=1)
    return master, slave


def test_slave_copies_topics_groups_and_delay_offsets(make_broker, handlers, serve, tmp_path):
    master, slave = make_pair(make_broker, tmp_path, delay_offsets={"2": 5, "3": 9})
    master.topic_config_manager.update(TopicConfig(TOPIC, 4, 4))
    master.subscription_group_manager.update_subscription_group_config(
        SubscriptionGroupConfig(GROUP, retry_max_times=3))

    async def scenario():
        async with serve(master):
            assert not await slave.slave_sync.sync_all()  # no master known yet: nothing
            slave.role.learn_master(master.broker_address, None)
            assert await slave.slave_sync.sync_all()
        await slave.remoting_client.close()

    asyncio.run(scenario())
    assert slave.topic_config_manager.get(TOPIC) == TopicConfig(TOPIC, 4, 4)
    assert slave.topic_config_manager.data_version == master.topic_config_manager.data_version
    assert slave.subscription_group_manager.get(GROUP).retry_max_times == 3
    assert slave.schedule_service.offset(2) == 5 and slave.schedule_service.offset(3) == 9
    # Written to the slave's own files, so a restarted slave starts from them.
    saved = orjson.loads((tmp_path / "slave" / "config" / "topics.json").read_bytes())
    assert TOPIC in saved["topicConfigTable"]


def test_offsets_committed_to_the_slave_while_the_master_was_away_are_handed_back(
        make_broker, handlers, serve, tmp_path, caplog):
    master, slave = make_pair(make_broker, tmp_path)
    master.topic_config_manager.update(TopicConfig(TOPIC, 4, 4))
    master_ask = handlers(master).ask
    slave_ask = handlers(slave).ask

    async def scenario():
        # Before the outage both know queue 0 at 10 and queue 1 at 20.
        for queue_id, offset in ((0, 10), (1, 20)):
            assert (await master_ask(update_offset(offset, queue_id))).code == 0
        async with serve(master):
            slave.role.learn_master(master.broker_address, None)
            await slave.slave_sync.sync_all()
            assert slave.consumer_offset_manager.query_offset(GROUP, TOPIC, 0) == 10
            # The master is away (to the slave: nothing answers at its address). The
            # consumer commits queue 0 to 15 on the slave; a sync cannot reach the master
            # and keeps everything.
            slave.role.learn_master("127.0.0.1:1", None)
            assert (await slave_ask(update_offset(15, 0))).code == 0
            with caplog.at_level(logging.WARNING, logger="tidemq.broker"):
                await slave.slave_sync.sync_all()
            assert any("could not copy the consumer offsets" in r.getMessage()
                       for r in caplog.records)
            assert slave.consumer_offset_manager.query_offset(GROUP, TOPIC, 0) == 15
            # The master is back (it moved queue 1 meanwhile): the slave keeps its 15,
            # takes the master's 25, and hands 15 back.
            assert (await master_ask(update_offset(25, 1))).code == 0
            slave.role.learn_master(master.broker_address, None)
            await slave.slave_sync.sync_all()
            assert master.consumer_offset_manager.query_offset(GROUP, TOPIC, 0) == 15
            assert slave.consumer_offset_manager.query_offset(GROUP, TOPIC, 0) == 15
            assert slave.consumer_offset_manager.query_offset(GROUP, TOPIC, 1) == 25
            # Once the master has it, the slave forgets it was its own: a later reset on
            # the master (an operator moving the group back) reaches the slave as it is.
            await slave.slave_sync.sync_all()
            assert slave.consumer_offset_manager.local_commits == {}
            assert (await master_ask(update_offset(3, 0))).code == 0
            await slave.slave_sync.sync_all()
            assert slave.consumer_offset_manager.query_offset(GROUP, TOPIC, 0) == 3
        await slave.remoting_client.close()

    asyncio.run(scenario())


def test_keep_larger_commit_never_moves_an_offset_back(broker, handlers):
    ask = handlers(broker).ask

    async def scenario():
        assert (await ask(update_offset(40))).code == ResponseCode.SUCCESS
        assert (await ask(update_offset(30, **{KEEP_LARGER_EXT_FIELD: "true"}))).code == 0
        assert broker.consumer_offset_manager.query_offset(GROUP, TOPIC, 0) == 40
        assert (await ask(update_offset(50, **{KEEP_LARGER_EXT_FIELD: "true"}))).code == 0
        assert broker.consumer_offset_manager.query_offset(GROUP, TOPIC, 0) == 50
        # An ordinary commit still sets the offset as it is (a client resetting back).
        assert (await ask(update_offset(5))).code == 0
        assert broker.consumer_offset_manager.query_offset(GROUP, TOPIC, 0) == 5

    asyncio.run(scenario())


def test_a_master_starts_no_synchronizer(broker):
    assert broker.slave_sync is None


def test_a_master_answering_garbage_leaves_the_slaves_tables_as_they_were(make_broker, caplog):
    from tidemq.remoting.server import RemotingServer

    slave = make_broker(broker_role="SLAVE", broker_id=1)
    slave.topic_config_manager.update(TopicConfig(TOPIC, 2, 2))
    before = slave.topic_config_manager.to_json()

    async def garbage(request: RemotingCommand, connection) -> RemotingCommand:
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=b"{not json")

    async def scenario():
        bogus = RemotingServer("127.0.0.1", [0])
        for code in (RequestCode.GET_ALL_TOPIC_CONFIG, RequestCode.GET_ALL_CONSUMER_OFFSET,
                     RequestCode.GET_ALL_DELAY_OFFSET,
                     RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG):
            bogus.register(code, garbage)
        await bogus.start()
        try:
            slave.role.learn_master(f"127.0.0.1:{bogus.bound_ports[0]}", None)
            with caplog.at_level(logging.WARNING, logger="tidemq.broker"):
                assert await slave.slave_sync.sync_all()
        finally:
            await bogus.stop(grace_s=1.0)
            await slave.remoting_client.close()

    asyncio.run(scenario())
    assert slave.topic_config_manager.to_json() == before
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4 and all("could not copy" in w for w in warnings)


def test_a_slave_restarted_while_its_master_is_away_still_hands_its_commits_back(
        make_broker, handlers, serve, tmp_path):
    master, slave = make_pair(make_broker, tmp_path)
    master.topic_config_manager.update(TopicConfig(TOPIC, 4, 4))

    async def commit_on_slave():
        assert (await handlers(slave).ask(update_offset(42, 2))).code == 0
        slave.consumer_offset_manager.persist()

    asyncio.run(commit_on_slave())
    asyncio.run(slave.shutdown(grace_s=1.0))
    saved = orjson.loads((tmp_path / "slave" / "config" / "consumerOffset.json").read_bytes())
    assert saved["offsetTable"][f"{TOPIC}@{GROUP}"] == {"2": 42}  # RocketMQ's part, as ever
    again = make_broker(root=tmp_path / "slave", broker_role="SLAVE", broker_id=1)
    assert again.consumer_offset_manager.local_commits == {(GROUP, TOPIC, 2): 42}

    async def scenario():
        async with serve(master):
            again.role.learn_master(master.broker_address, None)
            await again.slave_sync.sync_all()
            assert master.consumer_offset_manager.query_offset(GROUP, TOPIC, 2) == 42
            await again.slave_sync.sync_all()  # the master has it now: forgotten, and saved so
        again.consumer_offset_manager.persist()
        await again.remoting_client.close()

    asyncio.run(scenario())
    assert again.consumer_offset_manager.local_commits == {}
    saved = orjson.loads((tmp_path / "slave" / "config" / "consumerOffset.json").read_bytes())
    assert "tidemqLocalCommits" not in saved


def test_an_acl_refusal_names_the_key_that_signs_the_slaves_requests(make_broker, caplog):
    from tidemq.remoting.server import RemotingServer

    slave = make_broker(broker_role="SLAVE", broker_id=1)

    async def refuse(request: RemotingCommand, connection) -> RemotingCommand:
        return RemotingCommand.response_to(request, ResponseCode.NO_PERMISSION,
                                           remark="[ACL] the request is not signed")

    async def scenario():
        master = RemotingServer("127.0.0.1", [0])
        master.register_default(refuse)
        await master.start()
        try:
            slave.role.learn_master(f"127.0.0.1:{master.bound_ports[0]}", None)
            with caplog.at_level(logging.WARNING, logger="tidemq.broker"):
                await slave.slave_sync.sync_all()
        finally:
            await master.stop(grace_s=1.0)
            await slave.remoting_client.close()

    asyncio.run(scenario())
    warnings = [r.getMessage() for r in caplog.records if "could not copy" in r.getMessage()]
    assert warnings and all("innerClientAuthenticationCredentials" in w for w in warnings)


def test_a_copy_that_cannot_be_saved_on_a_full_disk_says_so_without_a_traceback(
        make_broker, serve, tmp_path, caplog, monkeypatch):
    # The slave's volume is full: the delay offsets are taken in memory but delayOffset.json
    # cannot be written (ENOSPC, as on a full volume). One WARNING names the file and the fix,
    # says the copy is kept in memory (not "keeping its own"), and carries no traceback.
    from tidemq.store import config_file

    master, slave = make_pair(make_broker, tmp_path, delay_offsets={"2": 5})

    def full_disk(fd: int, data: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    saved = Path(slave.config_dir) / "delayOffset.json"

    async def scenario():
        async with serve(master):
            slave.role.learn_master(master.broker_address, None)
            monkeypatch.setattr(config_file, "_write_all", full_disk)
            with caplog.at_level(logging.WARNING, logger="tidemq.broker"):
                assert await slave.slave_sync.sync_all()
                assert await slave.slave_sync.sync_all()  # still full: no second warning
            monkeypatch.undo()
            unsaved = saved.exists() and '"2":5' in saved.read_text().replace(" ", "")
            # Space again: the next round saves the copy, although the master's offsets
            # did not change since (a slave runs no periodic save of its own).
            with caplog.at_level(logging.INFO, logger="tidemq.broker"):
                assert await slave.slave_sync.sync_all()
        await slave.remoting_client.close()
        return unsaved

    assert asyncio.run(scenario()) is False
    assert slave.schedule_service.offset(2) == 5
    warnings = [r for r in caplog.records
                if r.levelno >= logging.WARNING and "delay offsets" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is None
    message = warnings[0].getMessage()
    assert "could not save" in message and "kept in memory" in message
    assert "delayOffset.json" in message and "free disk space on that volume" in message
    assert '"2":5' in saved.read_text().replace(" ", "").replace("\n", "")
    assert any("copies the delay offsets of master" in r.getMessage() for r in caplog.records)

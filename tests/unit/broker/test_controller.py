"""BrokerController: start, name-server registration, ports, clean shutdown and restart."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
import zlib
from collections.abc import Iterator

import pytest

from server_processes import free_port
from tidemq.broker.topic_config_manager import TopicConfig
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import SendMessageRequestHeader
from tidemq.protocol.message import decode_records
from tidemq.remoting.errors import RemotingListenError


def send(topic: str, body: bytes = b"m") -> RemotingCommand:
    header = SendMessageRequestHeader(
        producer_group="pg",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=1,
        flag=0,
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_ext_fields(), body)


@contextlib.contextmanager
def refused_address() -> Iterator[str]:
    """A loopback address where connections are refused: a socket bound but not listening,
    held for the whole ``with``. (A port bound and closed again could be given to the
    test's own servers or clients, which bind port 0, before it was used.)"""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{holder.getsockname()[1]}"


def test_start_registers_and_shutdown_unregisters(make_broker, fake_namesrv):
    async def scenario():
        async with fake_namesrv() as namesrv:
            broker = make_broker(namesrv_addr=namesrv.address, broker_name="broker-r")
            await broker.start()
            registered_at_start = list(namesrv.registrations)
            version = broker.topic_config_manager.data_version.counter
            await broker.shutdown(grace_s=1.0)
            return broker, registered_at_start, version, namesrv.unregistrations

    broker, registrations, version, unregistrations = asyncio.run(scenario())
    assert len(registrations) == 1  # start waits for the first round
    request = registrations[0]
    ext = request.ext_fields
    assert ext["brokerName"] == "broker-r"
    assert ext["brokerAddr"] == broker.broker_address
    assert ext["clusterName"] == "DefaultCluster"
    assert ext["brokerId"] == "0"
    port = int(broker.broker_address.rpartition(":")[2])
    assert ext["haServerAddr"] == f"127.0.0.1:{port + 1}"
    assert ext["compressed"] == "false"
    assert ext["bodyCrc32"] == str(zlib.crc32(request.body) & 0x7FFFFFFF)
    body = json.loads(request.body)
    assert body["filterServerList"] == []
    wrapper = body["topicConfigSerializeWrapper"]
    assert wrapper["dataVersion"]["counter"] == version
    table = wrapper["topicConfigTable"]
    assert table["TBW102"]["perm"] == 7
    assert table["TBW102"]["writeQueueNums"] == 8
    assert {"SELF_TEST_TOPIC", "DefaultCluster", "broker-r", "SCHEDULE_TOPIC_XXXX"} <= set(table)
    assert len(unregistrations) == 1
    assert unregistrations[0].ext_fields["brokerName"] == "broker-r"
    assert unregistrations[0].ext_fields["brokerAddr"] == broker.broker_address


def test_one_unreachable_name_server_blocks_nobody_and_is_logged_once(
    make_broker, fake_namesrv, caplog
):
    async def scenario(dead: str):
        async with fake_namesrv() as namesrv:
            broker = make_broker(namesrv_addr=f"{dead};{namesrv.address}")
            await broker.start()
            try:
                second_round = await broker.registration.register_all()
                return namesrv.address, second_round, len(namesrv.registrations)
            finally:
                await broker.shutdown(grace_s=1.0)

    with refused_address() as dead, caplog.at_level(logging.INFO, logger="tidemq.broker"):
        alive, second_round, registrations = asyncio.run(scenario(dead))
    assert second_round == {dead: False, alive: True}
    assert registrations == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and dead in r.message]
    assert len(warnings) == 1  # two failed rounds, one warning
    assert "namesrvAddr" in warnings[0].message


def test_name_server_refusal_is_a_failed_registration(make_broker, fake_namesrv, caplog):
    async def scenario():
        async with fake_namesrv() as namesrv:
            namesrv.answer_code = ResponseCode.SYSTEM_ERROR
            broker = make_broker(namesrv_addr=namesrv.address)
            try:
                await broker.start()
                return namesrv.address, await broker.registration.register_all()
            finally:
                await broker.shutdown(grace_s=1.0)

    with caplog.at_level(logging.WARNING, logger="tidemq.broker"):
        address, outcome = asyncio.run(scenario())
    assert outcome == {address: False}
    assert "answered code 1" in caplog.text


def test_read_only_broker_registers_every_topic_read_only(make_broker, fake_namesrv):
    async def scenario():
        async with fake_namesrv() as namesrv:
            broker = make_broker(namesrv_addr=namesrv.address, broker_permission=4)
            await broker.start()
            await broker.shutdown(grace_s=1.0)
            return namesrv.registrations[0]

    registration = asyncio.run(scenario())
    table = json.loads(registration.body)["topicConfigSerializeWrapper"]["topicConfigTable"]
    assert {config["perm"] for config in table.values()} == {4}


def test_topic_change_triggers_a_registration_round(make_broker, fake_namesrv):
    async def scenario():
        async with fake_namesrv() as namesrv:
            broker = make_broker(namesrv_addr=namesrv.address)
            await broker.start()
            try:
                broker.topic_config_manager.update(TopicConfig("Added", 2, 2))
                await namesrv.wait_registrations(2)
                broker.topic_config_manager.delete("Added")
                await namesrv.wait_registrations(3)
                return [json.loads(r.body) for r in namesrv.registrations[1:3]]
            finally:
                await broker.shutdown(grace_s=1.0)

    added, deleted = asyncio.run(scenario())
    # A created topic is registered alone; a removal sends the whole (smaller) table.
    assert list(added["topicConfigSerializeWrapper"]["topicConfigTable"]) == ["Added"]
    assert "Added" not in deleted["topicConfigSerializeWrapper"]["topicConfigTable"]
    assert "TBW102" in deleted["topicConfigSerializeWrapper"]["topicConfigTable"]
    assert (
        deleted["topicConfigSerializeWrapper"]["dataVersion"]["counter"]
        > added["topicConfigSerializeWrapper"]["dataVersion"]["counter"]
    )


def test_clean_shutdown_and_restart_keep_messages_topics_and_offsets(make_broker, serve, tmp_path):
    root = tmp_path / "restarted"

    async def first_life():
        broker = make_broker(store_kind="file", root=root)
        async with serve(broker) as link:
            response = await link.invoke(send("Kept", b"survives"))
            broker.consumer_offset_manager.commit_offset("g1", "Kept", 0, 1)
            return response

    assert asyncio.run(first_life()).code == ResponseCode.SUCCESS
    assert not (root / "abort").exists()  # closed cleanly

    broker = make_broker(store_kind="file", root=root)
    assert broker.topic_config_manager.get("Kept").write_queue_nums == 4
    assert broker.consumer_offset_manager.query_offset("g1", "Kept", 0) == 1
    result = broker.store.get_messages("Kept", 0, 0, 10, 1 << 20)
    assert [record.body for record in decode_records(result.body)] == [b"survives"]


def test_broker_also_listens_on_the_vip_port(make_broker, serve):
    for _attempt in range(5):  # another process may take a port between probe and bind
        # Below the ephemeral range, with the VIP port (-2) and the HA port (+1) free too.
        port = free_port(neighbours=(-2, 1))
        broker = make_broker(listen_port=port)

        async def scenario(broker=broker, port=port):
            async with serve(broker) as link:
                assert broker.broker_address == f"127.0.0.1:{port}"
                main = await link.invoke(send("Vip"))
                vip = await link.client.invoke(f"127.0.0.1:{port - 2}", send("Vip"))
                return main, vip

        try:
            main, vip = asyncio.run(scenario())
        except RemotingListenError:
            continue
        assert main.code == vip.code == ResponseCode.SUCCESS
        assert vip.ext_fields["queueOffset"] == "1"
        return
    pytest.fail("could not bind a free port pair in 5 attempts")


def test_port_in_use_fails_start_naming_the_port(make_broker):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        broker = make_broker(listen_port=port)
        with pytest.raises(RemotingListenError, match=f"{port}.*listenPort"):
            asyncio.run(broker.start())
    assert broker.stopped  # what was opened is closed again


def test_port_zero_reports_the_bound_port(make_broker, serve):
    broker = make_broker()

    async def scenario():
        async with serve(broker) as link:
            response = await link.invoke(send("Anywhere"))
            return link.address, response

    address, response = asyncio.run(scenario())
    assert address.startswith("127.0.0.1:") and not address.endswith(":0")
    assert response.code == ResponseCode.SUCCESS


def test_topics_become_routable_through_a_real_name_server(make_broker, handlers):
    """End to end with tidemq's own name server: registration, auto-create, unregistration."""
    from tidemq.namesrv.config import NamesrvConfig
    from tidemq.namesrv.controller import NamesrvController
    from tidemq.remoting.client import RemotingClient

    def route_request(topic: str) -> RemotingCommand:
        return RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})

    async def scenario():
        namesrv = NamesrvController(NamesrvConfig(listen_port=0))
        await namesrv.start()
        client = RemotingClient()
        try:
            broker = make_broker(namesrv_addr=namesrv.address, broker_name="broker-n")
            await broker.start()
            template = await client.invoke(namesrv.address, route_request("TBW102"))
            before = await client.invoke(namesrv.address, route_request("Created"))
            sent = await handlers(broker).ask(send("Created"))
            for _ in range(100):  # the registration of the new topic runs in the background
                after = await client.invoke(namesrv.address, route_request("Created"))
                if after.code == ResponseCode.SUCCESS:
                    break
                await asyncio.sleep(0.05)
            await broker.shutdown(grace_s=1.0)
            gone = await client.invoke(namesrv.address, route_request("Created"))
            return broker, template, before, sent, after, gone
        finally:
            await client.close()
            await namesrv.shutdown(grace_s=1.0)

    broker, template, before, sent, after, gone = asyncio.run(scenario())
    assert template.code == ResponseCode.SUCCESS
    route = json.loads(template.body)
    assert route["queueDatas"][0]["perm"] == 7
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": broker.broker_address}
    assert before.code == ResponseCode.TOPIC_NOT_EXIST
    assert sent.code == ResponseCode.SUCCESS
    assert after.code == ResponseCode.SUCCESS
    queue_data = json.loads(after.body)["queueDatas"][0]
    assert (queue_data["brokerName"], queue_data["writeQueueNums"]) == ("broker-n", 4)
    assert gone.code == ResponseCode.TOPIC_NOT_EXIST  # unregistered at shutdown


def test_topics_created_together_all_reach_a_real_name_server(make_broker):
    """Increments built while other topics were being created carry the table's newest
    DataVersion; each must carry every topic changed so far, or the name server skips the
    later ones as unchanged and their routes never appear."""
    from tidemq.namesrv.config import NamesrvConfig
    from tidemq.namesrv.controller import NamesrvController
    from tidemq.remoting.client import RemotingClient

    names = [f"Together{i}" for i in range(40)]

    async def scenario():
        namesrv = NamesrvController(NamesrvConfig(listen_port=0))
        await namesrv.start()
        client = RemotingClient()
        try:
            broker = make_broker(namesrv_addr=namesrv.address, broker_name="broker-t")
            await broker.start()
            try:
                # Without the periodic task, whose own round could carry them all by luck:
                # the admin path's rounds alone, as when creates arrive while rounds are in
                # flight.
                await broker.registration.stop()
                for name in names:  # each create bumps the version before any round runs
                    broker.topic_config_manager.update(TopicConfig(name, 1, 1))
                outcomes = [await broker.registration.register_topics([name])
                            for name in names]
                codes = {}
                for name in names:  # every round was answered: no waiting needed
                    request = RemotingCommand.request(
                        RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": name})
                    codes[name] = (await client.invoke(namesrv.address, request)).code
                return outcomes, codes
            finally:
                await broker.shutdown(grace_s=1.0)
        finally:
            await client.close()
            await namesrv.shutdown(grace_s=1.0)

    outcomes, codes = asyncio.run(scenario())
    assert all(all(outcome.values()) for outcome in outcomes)
    assert [name for name, code in codes.items() if code != ResponseCode.SUCCESS] == []


def test_topics_json_is_written_in_the_background_and_at_shutdown(make_broker, tmp_path):
    root = tmp_path / "store"
    topics_file = root / "config" / "topics.json"

    async def scenario():
        broker = make_broker(root=root)
        await broker.start()
        try:
            for index in range(50):  # one save in the background carries many changes
                broker.topic_config_manager.update(TopicConfig(f"Burst{index}", 1, 1))
            async with asyncio.timeout(10):
                while not topics_file.exists() or "Burst49" not in topics_file.read_text():
                    await asyncio.sleep(0.01)
            broker.topic_config_manager.update(TopicConfig("AtTheEnd", 1, 1))
        finally:
            await broker.shutdown(grace_s=1.0)

    asyncio.run(scenario())
    saved = json.loads(topics_file.read_text())["topicConfigTable"]
    assert "Burst0" in saved and "AtTheEnd" in saved


def test_new_groups_are_saved_in_the_background_and_at_shutdown(make_broker, tmp_path):
    root = tmp_path / "store"
    groups_file = root / "config" / "subscriptionGroup.json"

    async def scenario():
        broker = make_broker(root=root)
        await broker.start()
        try:
            groups = broker.subscription_group_manager
            for index in range(50):
                groups.find_subscription_group_config(f"cg_burst_{index}")
            async with asyncio.timeout(10):
                while not groups_file.exists() or "cg_burst_49" not in groups_file.read_text():
                    await asyncio.sleep(0.01)
            groups.find_subscription_group_config("cg_at_the_end")
        finally:
            await broker.shutdown(grace_s=1.0)

    asyncio.run(scenario())
    saved = json.loads(groups_file.read_text())["subscriptionGroupTable"]
    assert "cg_burst_0" in saved and "cg_at_the_end" in saved


def test_a_shutdown_on_a_full_disk_logs_what_it_could_not_save_and_closes_the_store(
        make_broker, tmp_path, caplog, monkeypatch):
    # The last persists of consumer offsets, delay offsets and transaction progress meet a
    # full disk (the config files' writes fail with ENOSPC, as on a full volume). Each is an
    # ERROR line naming the file and the fix, without a traceback, and the shutdown goes on to
    # close the store; before, the first StoreFull left shutdown there, the store unclosed.
    from tidemq.store import config_file

    broker = make_broker(root=tmp_path / "store")
    closed = []
    close = broker.store.close

    def recording_close() -> None:
        closed.append(True)
        close()

    broker.store.close = recording_close

    def full_disk(fd: int, data: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    async def scenario():
        await broker.start()
        broker.consumer_offset_manager.commit_offset("cg_full", "TopicFull", 0, 7)
        broker.schedule_service._offsets.commit(2, 5)  # a delivery moved level 2 on
        monkeypatch.setattr(config_file, "_write_all", full_disk)
        with caplog.at_level(logging.ERROR, "tidemq.broker"):
            await broker.shutdown(grace_s=1.0)

    asyncio.run(scenario())
    assert closed == [True]
    errors = [r for r in caplog.records if "at shutdown failed" in r.getMessage()]
    assert errors and all(r.levelno == logging.ERROR and r.exc_info is None for r in errors)
    assert {name for name in ("consumerOffset.json", "delayOffset.json",
                              "transactionProgress.json")
            if any(name in r.getMessage() for r in errors)} == {
        "consumerOffset.json", "delayOffset.json", "transactionProgress.json"}
    assert all("free disk space on that volume" in r.getMessage() for r in errors)

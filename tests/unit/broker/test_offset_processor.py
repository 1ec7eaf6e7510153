"""Offsets: QUERY/UPDATE_CONSUMER_OFFSET, GET_MAX/MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP,
GET_EARLIEST_MSG_STORETIME, and consumerOffset.json / subscriptionGroup.json persistence."""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
import pytest

from tidemq.errors import StoreFull
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.store.config_tables import SubscriptionGroupConfig, TopicConfig
from tidemq.store.interface import StoreMessage

TOPIC = "TopicOffsets"
GROUP = "cg_offsets"
WAIT_BOUND_S = 10.0


def put(broker, *, queue_id: int = 0, body: bytes = b"m") -> int:
    result = broker.store.put_message(StoreMessage(
        TOPIC, queue_id, body, {}, born_timestamp=int(time.time() * 1000),
        born_host="127.0.0.1:50000",
    ))
    assert result.ok, result.remark
    return result.store_timestamp


def query_request(queue_id: int = 0, group: str = GROUP) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": TOPIC, "queueId": str(queue_id),
    })


def update_request(offset: int, queue_id: int = 0, group: str = GROUP) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": TOPIC, "queueId": str(queue_id),
        "commitOffset": str(offset),
    })


def queue_request(code: int, queue_id: int = 0, **extra: str) -> RemotingCommand:
    return RemotingCommand.request(code, {"topic": TOPIC, "queueId": str(queue_id), **extra})


@pytest.fixture
def setup(make_broker, handlers):
    def build(**overrides):
        broker = make_broker(**overrides)
        broker.topic_config_manager.update(TopicConfig(TOPIC, 4, 4))
        table = handlers(broker)

        def ask(request: RemotingCommand) -> RemotingCommand:
            response = asyncio.run(table.ask(request))
            assert response.opaque == request.opaque
            return response

        return broker, ask

    return build


def test_committed_offset_is_returned_by_query(setup):
    _, ask = setup()
    assert ask(update_request(42, queue_id=1)).code == ResponseCode.SUCCESS
    response = ask(query_request(queue_id=1))
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields == {"offset": "42"}


def test_new_group_on_an_untrimmed_queue_starts_at_0(setup):
    broker, ask = setup()
    put(broker)
    for queue_id in (0, 3):  # a written queue, and one never written
        response = ask(query_request(queue_id=queue_id))
        assert response.code == ResponseCode.SUCCESS
        assert response.ext_fields == {"offset": "0"}


def test_new_group_on_a_trimmed_queue_is_query_not_found(setup):
    broker, ask = setup(store_overrides={"mapped_file_size_commit_log": 4096})
    for _ in range(12):
        put(broker, body=b"x" * 900)
    assert broker.store.run_retention(int(time.time() * 1000), disk_used_ratio=99.0) >= 1
    assert broker.store.min_offset(TOPIC, 0) > 0
    response = ask(query_request())
    assert response.code == ResponseCode.QUERY_NOT_FOUND
    assert GROUP in response.remark and TOPIC in response.remark


def test_negative_commits_are_ignored(setup):
    # ali-ons sends commitOffset -1 for queues it has not consumed from yet.
    _, ask = setup()
    ask(update_request(7))
    assert ask(update_request(-1)).code == ResponseCode.SUCCESS
    assert ask(query_request()).ext_fields == {"offset": "7"}


def test_offset_requests_with_a_missing_field_name_it(setup):
    _, ask = setup()
    request = update_request(1)
    del request.ext_fields["commitOffset"]
    response = ask(request)
    assert response.code == ResponseCode.SYSTEM_ERROR and "commitOffset" in response.remark
    request = queue_request(RequestCode.GET_MAX_OFFSET)
    request.ext_fields["queueId"] = "zero"
    response = ask(request)
    assert response.code == ResponseCode.SYSTEM_ERROR and "queueId" in response.remark


@pytest.mark.parametrize("request_of", [
    query_request, lambda: update_request(3),
    lambda: queue_request(RequestCode.GET_MAX_OFFSET),
    lambda: queue_request(RequestCode.GET_MIN_OFFSET),
    lambda: queue_request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, timestamp="0"),
    lambda: queue_request(RequestCode.GET_EARLIEST_MSG_STORETIME),
], ids=["query", "update", "max", "min", "search", "earliest"])
def test_every_offset_request_without_a_topic_is_refused_naming_it(setup, request_of):
    _, ask = setup()
    request = request_of()
    del request.ext_fields["topic"]
    response = ask(request)
    assert response.code == ResponseCode.SYSTEM_ERROR and "topic" in response.remark
    assert ask(queue_request(RequestCode.GET_MAX_OFFSET)).code == ResponseCode.SUCCESS


def test_max_and_min_offsets_of_a_queue(setup):
    broker, ask = setup()
    for _ in range(3):
        put(broker, queue_id=2)
    max_offset = ask(queue_request(RequestCode.GET_MAX_OFFSET, queue_id=2))
    assert (max_offset.code, max_offset.ext_fields) == (ResponseCode.SUCCESS, {"offset": "3"})
    min_offset = ask(queue_request(RequestCode.GET_MIN_OFFSET, queue_id=2))
    assert (min_offset.code, min_offset.ext_fields) == (ResponseCode.SUCCESS, {"offset": "0"})
    empty = ask(queue_request(RequestCode.GET_MAX_OFFSET, queue_id=1))
    assert empty.ext_fields == {"offset": "0"}


def test_search_offset_by_timestamp_and_earliest_store_time(setup):
    broker, ask = setup()
    first = put(broker)
    time.sleep(0.005)
    put(broker)
    time.sleep(0.005)
    third = put(broker)
    search = ask(queue_request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, timestamp=str(third)))
    assert (search.code, search.ext_fields) == (ResponseCode.SUCCESS, {"offset": "2"})
    before = ask(queue_request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, timestamp="0"))
    assert before.ext_fields == {"offset": "0"}
    earliest = ask(queue_request(RequestCode.GET_EARLIEST_MSG_STORETIME))
    assert (earliest.code, earliest.ext_fields) == (
        ResponseCode.SUCCESS, {"timestamp": str(first)})


def test_offsets_are_persisted_at_shutdown_and_reloaded(make_broker, serve, handlers, tmp_path):
    root = tmp_path / "store"
    first = make_broker(root=root)

    async def commit_then_stop():
        async with serve(first) as link:
            response = await link.invoke(update_request(17, queue_id=2))
            assert response.code == ResponseCode.SUCCESS

    asyncio.run(commit_then_stop())
    saved = orjson.loads((root / "config" / "consumerOffset.json").read_bytes())
    assert saved == {"offsetTable": {f"{TOPIC}@{GROUP}": {"2": 17}}}
    second = make_broker(root=root)
    response = asyncio.run(handlers(second).ask(query_request(queue_id=2)))
    assert response.ext_fields == {"offset": "17"}


def test_offsets_are_persisted_periodically_while_running(make_broker, serve, tmp_path):
    root = tmp_path / "store"
    broker = make_broker(root=root, flush_consumer_offset_interval_ms=10)
    offsets_file = root / "config" / "consumerOffset.json"

    def persisted() -> dict:
        return orjson.loads(offsets_file.read_bytes()) if offsets_file.exists() else {}

    async def main():
        async with serve(broker) as link:
            await link.invoke(update_request(5))
            async with asyncio.timeout(WAIT_BOUND_S):
                while persisted().get("offsetTable", {}).get(f"{TOPIC}@{GROUP}") != {"0": 5}:
                    await asyncio.sleep(0.01)

    asyncio.run(main())


def test_subscription_groups_are_persisted_and_reloaded(make_broker, handlers, tmp_path):
    root = tmp_path / "store"
    first = make_broker(root=root)
    first.subscription_group_manager.update_subscription_group_config(
        SubscriptionGroupConfig(GROUP, retry_max_times=3, consume_broadcast_enable=False)
    )
    # A group auto-created by its first pull is kept too.
    pull = RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "cg_auto", "topic": "SomeTopic", "queueId": "0", "queueOffset": "0",
        "maxMsgNums": "1", "sysFlag": "4", "commitOffset": "0", "suspendTimeoutMillis": "0",
        "subVersion": "0", "subscription": "*",
    })
    asyncio.run(handlers(first).ask(pull))
    saved = orjson.loads((root / "config" / "subscriptionGroup.json").read_bytes())
    assert saved["subscriptionGroupTable"][GROUP]["retryMaxTimes"] == 3
    second = make_broker(root=root, auto_create_subscription_group=False)
    assert second.subscription_group_manager.get(GROUP) == SubscriptionGroupConfig(
        GROUP, retry_max_times=3, consume_broadcast_enable=False
    )
    assert second.subscription_group_manager.find_subscription_group_config("cg_auto") is not None
    assert second.subscription_group_manager.find_subscription_group_config("cg_other") is None


def test_deleting_a_topic_forgets_its_offsets(setup):
    broker, ask = setup()
    ask(update_request(9))
    deleted = ask(RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": TOPIC}))
    assert deleted.code == ResponseCode.SUCCESS, deleted.remark
    assert broker.consumer_offset_manager.query_offset(GROUP, TOPIC, 0) is None
    assert ask(query_request()).ext_fields == {"offset": "0"}


def test_stopping_while_a_periodic_offset_save_runs_keeps_the_newest_offsets(
        make_broker, handlers, tmp_path, monkeypatch, caplog):
    """Shutdown's final save waits for a periodic save still writing in its worker thread
    (both use consumerOffset.json.tmp) and the file ends with the offsets of the last commit."""
    import os
    import threading

    root = tmp_path / "store"
    broker = make_broker(root=root, flush_consumer_offset_interval_ms=10)
    offsets_file = root / "config" / "consumerOffset.json"
    real_open, real_write = os.open, os.write
    temp_fds: set[int] = set()
    parked, release = threading.Event(), threading.Event()

    def open_noting_temp(path, flags, mode=0o777, **kwargs):
        fd = real_open(path, flags, mode, **kwargs)
        if str(path).endswith("consumerOffset.json.tmp"):
            temp_fds.add(fd)
        return fd

    def write_parking_the_first_offset_save(fd, data):
        if fd in temp_fds and not parked.is_set():
            parked.set()  # the periodic save has opened its .tmp and not written it yet
            release.wait(WAIT_BOUND_S)
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", open_noting_temp)
    monkeypatch.setattr(os, "write", write_parking_the_first_offset_save)

    async def main():
        await broker.start()
        handler_table = handlers(broker)
        await handler_table.ask(update_request(5))
        async with asyncio.timeout(WAIT_BOUND_S):
            while not parked.is_set():
                await asyncio.sleep(0.005)
        await handler_table.ask(update_request(7))  # newer than what the parked save holds
        stopping = asyncio.ensure_future(broker.shutdown(grace_s=1.0))
        for _ in range(20):  # let shutdown reach its final save before the periodic one ends
            await asyncio.sleep(0.005)
        release.set()
        await stopping

    asyncio.run(main())
    saved = orjson.loads(offsets_file.read_bytes())
    assert saved["offsetTable"][f"{TOPIC}@{GROUP}"] == {"0": 7}
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []
    assert not offsets_file.with_name("consumerOffset.json.tmp").exists()


def test_a_periodic_offset_persist_on_a_full_disk_is_logged_without_a_traceback(
    make_broker, caplog
):
    # A full disk is an operator's problem the message names (file and fix), not a bug: the
    # broker logs it as BackgroundSaver does, without a traceback (tests/reliability's full
    # disk test fails on any traceback in the broker's log), and tries again.
    broker = make_broker(flush_consumer_offset_interval_ms=10)
    offsets = broker.parts.offsets
    attempts = []

    def full_disk_write(snapshot) -> None:
        attempts.append(snapshot)
        raise StoreFull("no space left to save config file consumerOffset.json (98 bytes): "
                        "[Errno 28] No space left on device; free disk space on that volume")

    async def scenario():
        await broker.consumption.start()
        offsets.write_snapshot = full_disk_write
        try:
            offsets.commit_offset("cg_full", "TopicFull", 0, 1)
            async with asyncio.timeout(10):
                while len(attempts) < 2:  # failed, and the loop went on to try again
                    await asyncio.sleep(0.01)
        finally:
            del offsets.write_snapshot
            await broker.consumption.shutdown()

    with caplog.at_level(logging.ERROR, "tidemq.broker"):
        asyncio.run(scenario())
    failures = [r for r in caplog.records if "persisting consumer offsets failed" in r.message]
    assert failures, caplog.text
    assert all(r.levelno == logging.ERROR and r.exc_info is None for r in failures)
    assert "free disk space on that volume" in failures[0].getMessage()

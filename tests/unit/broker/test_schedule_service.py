"""Delay messages: SCHEDULE_TOPIC_XXXX, delivery when due, and exactly-once across restarts.

Most tests drive one tick at a time (``schedule_service.deliver_due``) with a fake clock
injected into the service, on a broker that is not started; a few start the broker so the
level timers run by themselves. Store times are real; the fake clock starts at the real
time and only moves when a test moves it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import shutil
import time
from pathlib import Path

import pytest

from tidemq.broker.schedule_service import (
    PROPERTY_DELAY_QUEUE_OFFSET,
    TICK_INTERVAL_MAX_MS,
    TICK_INTERVAL_MIN_MS,
    redirect_delayed,
)
from tidemq.broker.topic_config_manager import TopicConfig
from tidemq.errors import StoreFull
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import SendMessageRequestHeader
from tidemq.protocol.message import (
    BatchEntry,
    decode_records,
    encode_batch_body,
    encode_properties,
    tags_code,
)
from tidemq.store.config import SCHEDULE_TOPIC
from tidemq.store.interface import StoreMessage

DELAY_MARK = PROPERTY_DELAY_QUEUE_OFFSET
LEVELS = "1s 2s 3s"
LEVEL_MS = {1: 1000, 2: 2000, 3: 3000}
WAIT_BOUND_S = 10.0  # bounds waits for the running timers; never a timing assertion


class FakeClock:
    """Wall-clock milliseconds that move only when told."""

    def __init__(self) -> None:
        self.now_ms = time.time_ns() // 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def copy_as_crashed(root: Path, crashed: Path) -> None:
    """Copy a running broker's store as a crash would leave it.

    The broker keeps working during the copy: a config save may rename its ``.tmp`` file
    away between the listing and the copy. A crash at that instant leaves either name, so a
    file that vanished is simply not part of the copy (rather than failing the test).
    """

    def copy_if_present(source: str, target: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.copy2(source, target)

    shutil.copytree(root, crashed, copy_function=copy_if_present)


def delay_broker(make_broker, levels: str = LEVELS, **overrides):
    """A broker with short delay levels, in both the broker's and the store's config."""
    broker = make_broker(message_delay_level=levels,
                         store_overrides={"message_delay_level": levels}, **overrides)
    broker.topic_config_manager.update(TopicConfig("Orders", 4, 4))
    return broker


def send_request(topic: str, *, delay: int | str | None = None, queue_id: int = 0,
                 key: str = "k1", extra: dict[str, str] | None = None,
                 reconsume_times: int | None = None) -> RemotingCommand:
    properties = {"TAGS": "TagA", "KEYS": key, "WAIT": "true", **(extra or {})}
    if delay is not None:
        properties["DELAY"] = str(delay)
    header = SendMessageRequestHeader(
        producer_group="pg", topic=topic, default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=queue_id, sys_flag=0, born_timestamp=1_700_000_000_123, flag=7,
        properties=encode_properties(properties), reconsume_times=reconsume_times,
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_ext_fields(),
                                   f"body-{key}".encode())


def batch_request(topic: str, entries: list[BatchEntry], queue_id: int = 0) -> RemotingCommand:
    header = SendMessageRequestHeader(
        producer_group="pg", topic=topic, default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=queue_id, sys_flag=0, born_timestamp=1_700_000_000_123, flag=0,
        properties=encode_properties({"WAIT": "true"}), batch=True,
    )
    return RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, header.to_ext_fields(),
                                   encode_batch_body(entries))


async def send_all(broker, handlers, *requests) -> list[RemotingCommand]:
    """Call the broker's handlers in-process; every request must succeed."""
    table = handlers(broker)
    responses = [await table.ask(request, peer_address="127.0.0.1:45678")
                 for request in requests]
    for response in responses:
        assert response.code == ResponseCode.SUCCESS, response.remark
    return responses


def ask(broker, handlers, *requests) -> list[RemotingCommand]:
    return asyncio.run(send_all(broker, handlers, *requests))


def stored(broker, topic: str, queue_id: int = 0, tag_codes=None):
    result = broker.store.get_messages(topic, queue_id, 0, 1000, 64 * 1024 * 1024, tag_codes)
    return decode_records(result.body)


def scheduled(broker, level: int):
    return stored(broker, SCHEDULE_TOPIC, level - 1)


# -- storing ------------------------------------------------------------------------------------


def test_delayed_send_waits_in_the_schedule_queue_of_its_level(make_broker, handlers):
    broker = delay_broker(make_broker)
    (response,) = ask(broker, handlers, send_request("Orders", delay=2, queue_id=1))
    assert response.ext_fields["queueId"] == "1", "the producer is told its own queue"
    assert stored(broker, "Orders", 1) == []
    (waiting,) = scheduled(broker, 2)
    assert waiting.properties["REAL_TOPIC"] == "Orders"
    assert waiting.properties["REAL_QID"] == "1"
    assert waiting.properties["DELAY"] == "2"
    assert response.ext_fields["msgId"] == waiting.offset_msg_id


def test_level_above_the_configured_levels_is_capped_to_the_last(make_broker, handlers):
    broker = delay_broker(make_broker)
    ask(broker, handlers, send_request("Orders", delay=18))
    (waiting,) = scheduled(broker, 3)
    assert waiting.properties["DELAY"] == "3"


@pytest.mark.parametrize("delay", [0, -1])
def test_level_zero_or_below_is_delivered_at_once(make_broker, handlers, delay):
    broker = delay_broker(make_broker)
    ask(broker, handlers, send_request("Orders", delay=delay))
    (message,) = stored(broker, "Orders")
    assert "REAL_TOPIC" not in message.properties
    assert all(scheduled(broker, level) == [] for level in (1, 2, 3))


def test_a_delay_that_is_not_a_number_is_refused(make_broker, handlers):
    broker = delay_broker(make_broker)
    table = handlers(broker)
    response = asyncio.run(table.ask(send_request("Orders", delay="soon")))
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert "'soon'" in response.remark and "1..3" in response.remark
    assert stored(broker, "Orders") == []


def test_a_producer_cannot_set_the_delivery_mark(make_broker, handlers):
    broker = delay_broker(make_broker)
    ask(broker, handlers,
        send_request("Orders", extra={PROPERTY_DELAY_QUEUE_OFFSET: "1:99"}),
        send_request("Orders", delay=1, key="k2", extra={PROPERTY_DELAY_QUEUE_OFFSET: "1:99"}))
    (plain,) = stored(broker, "Orders")
    (waiting,) = scheduled(broker, 1)
    assert PROPERTY_DELAY_QUEUE_OFFSET not in plain.properties
    assert PROPERTY_DELAY_QUEUE_OFFSET not in waiting.properties


# -- delivering ---------------------------------------------------------------------------------


def test_delayed_message_is_invisible_until_due_then_delivered_unchanged(make_broker, handlers):
    broker = delay_broker(make_broker)
    clock = broker.schedule_service.clock_ms = FakeClock()
    ask(broker, handlers, send_request("Orders", delay=2, queue_id=1))
    (waiting,) = scheduled(broker, 2)
    due_ms = waiting.store_timestamp + LEVEL_MS[2]

    clock.now_ms = due_ms - 1
    wait_ms = broker.schedule_service.deliver_due(2)
    assert TICK_INTERVAL_MIN_MS <= wait_ms <= TICK_INTERVAL_MAX_MS
    assert stored(broker, "Orders", 1) == []
    assert broker.schedule_service.offset(2) == 0

    clock.now_ms = due_ms
    broker.schedule_service.deliver_due(2)
    (delivered,) = stored(broker, "Orders", 1, tag_codes={tags_code("TagA")})
    assert delivered.topic == "Orders" and delivered.queue_id == 1
    assert delivered.unique_key == waiting.unique_key
    assert delivered.body == waiting.body == b"body-k1"
    assert delivered.flag == 7
    assert delivered.keys == ["k1"] and delivered.tags == "TagA"
    assert delivered.born_timestamp == 1_700_000_000_123
    assert delivered.born_host == waiting.born_host == "127.0.0.1:45678"
    assert "DELAY" not in delivered.properties
    assert delivered.properties[PROPERTY_DELAY_QUEUE_OFFSET] == "2:0"
    assert broker.schedule_service.offset(2) == 1
    found = broker.store.query_messages("Orders", waiting.unique_key, 10, 0, 2**62)
    assert len(found.records) == 1, "the delivered copy is indexed under its UNIQ_KEY"


def test_delivery_keeps_queue_order_and_stops_at_the_first_message_not_due(
    make_broker, handlers
):
    broker = delay_broker(make_broker)
    clock = broker.schedule_service.clock_ms = FakeClock()
    ask(broker, handlers, *(send_request("Orders", delay=1, key=f"k{i}") for i in range(5)))
    waiting = scheduled(broker, 1)
    clock.now_ms = waiting[2].store_timestamp + LEVEL_MS[1]
    if waiting[3].store_timestamp == waiting[2].store_timestamp:
        clock.now_ms = waiting[4].store_timestamp + LEVEL_MS[1]  # all share one millisecond
    broker.schedule_service.deliver_due(1)
    delivered = stored(broker, "Orders")
    due = [m for m in waiting if m.store_timestamp + LEVEL_MS[1] <= clock.now_ms]
    assert [m.unique_key for m in delivered] == [m.unique_key for m in due]
    assert broker.schedule_service.offset(1) == len(due)

    clock.now_ms += 10_000
    broker.schedule_service.deliver_due(1)
    assert [m.keys for m in stored(broker, "Orders")] == [[f"k{i}"] for i in range(5)]


def test_delay_offsets_are_served_by_get_all_delay_offset(make_broker, handlers):
    broker = delay_broker(make_broker)
    clock = broker.schedule_service.clock_ms = FakeClock()
    ask(broker, handlers, send_request("Orders", delay=3), send_request("Orders", delay=3))
    clock.now_ms += 60_000
    broker.schedule_service.deliver_due(3)
    table = handlers(broker)
    response = asyncio.run(table.ask(RemotingCommand.request(RequestCode.GET_ALL_DELAY_OFFSET)))
    assert response.code == ResponseCode.SUCCESS
    assert json.loads(response.body) == {"offsetTable": {"3": 2}}


def test_running_timers_deliver_by_themselves_not_before_the_due_time(make_broker, handlers):
    broker = delay_broker(make_broker, levels="1s")
    seen = []

    async def scenario():
        await broker.start()
        try:
            await send_all(broker, handlers, send_request("Orders", delay=1))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_BOUND_S
            while not seen and loop.time() < deadline:
                seen.extend(stored(broker, "Orders"))
                await asyncio.sleep(0.05)
            seen.extend(scheduled(broker, 1))
        finally:
            await broker.shutdown(grace_s=1.0)

    asyncio.run(scenario())
    delivered, waiting = seen
    assert delivered.unique_key == waiting.unique_key
    assert delivered.store_timestamp >= waiting.store_timestamp + LEVEL_MS[1]


# -- restarts -----------------------------------------------------------------------------------


def unique_keys_in(broker, topic: str = "Orders") -> collections.Counter:
    return collections.Counter(
        m.unique_key for queue_id in range(4) for m in stored(broker, topic, queue_id)
    )


async def send_pending(broker, handlers, count: int, level: int) -> list[str]:
    """Send ``count`` messages delayed by ``level``; return the UNIQ_KEYs now waiting."""
    await send_all(broker, handlers,
                   *(send_request("Orders", delay=level, key=f"L{level}-{i}", queue_id=i % 4)
                     for i in range(count)))
    return [m.unique_key for m in scheduled(broker, level)]


def test_clean_restart_delivers_each_delayed_message_exactly_once(make_broker, handlers,
                                                                  tmp_path):
    root = tmp_path / "store"
    first = delay_broker(make_broker, store_kind="file", root=root)
    clock = first.schedule_service.clock_ms = FakeClock()
    expected = []

    async def before_restart():
        await first.start()
        expected.extend(await send_pending(first, handlers, 6, level=1))
        expected.extend(await send_pending(first, handlers, 4, level=3))
        clock.now_ms = max(m.store_timestamp for m in scheduled(first, 1)) + LEVEL_MS[1]
        first.schedule_service.deliver_due(1)  # level 1 delivered, level 3 pending
        assert len(unique_keys_in(first)) == 6
        await first.shutdown(grace_s=1.0)

    asyncio.run(before_restart())
    second = delay_broker(make_broker, store_kind="file", root=root)
    assert second.schedule_service.offset(1) == 6
    second.schedule_service.clock_ms = lambda: clock.now_ms + 3_600_000
    for level in (1, 2, 3):
        second.schedule_service.deliver_due(level)
    keys = unique_keys_in(second)
    assert sorted(keys) == sorted(expected)
    assert set(keys.values()) == {1}


def test_restart_after_a_crash_delivers_each_delayed_message_exactly_once(
    make_broker, handlers, tmp_path
):
    root = tmp_path / "store"
    crashed = tmp_path / "crashed"
    first = delay_broker(make_broker, store_kind="file", root=root)
    clock = first.schedule_service.clock_ms = FakeClock()
    expected = []

    async def until_crash():
        await first.start()  # writes delayOffset.json once; the next write is 10 s away
        expected.extend(await send_pending(first, handlers, 5, level=1))
        expected.extend(await send_pending(first, handlers, 3, level=2))
        clock.now_ms = max(m.store_timestamp for m in scheduled(first, 1)) + LEVEL_MS[1]
        first.schedule_service.deliver_due(1)
        assert len(unique_keys_in(first)) == 5
        # A process crash leaves the files as the kernel has them: mapped pages included,
        # the abort file present, delayOffset.json as last written.
        copy_as_crashed(root, crashed)
        await first.shutdown(grace_s=1.0)

    asyncio.run(until_crash())
    persisted = json.loads((crashed / "config" / "delayOffset.json").read_text())
    assert persisted["offsetTable"].get("1", 0) == 0, "the crash lost the offsets' progress"
    assert (crashed / "abort").exists()

    second = delay_broker(make_broker, store_kind="file", root=crashed)
    second.schedule_service.clock_ms = lambda: clock.now_ms + 3_600_000

    async def after_restart():
        await second.start()  # scans the commit log before its timers run
        for level in (1, 2, 3):
            second.schedule_service.deliver_due(level)
        keys = unique_keys_in(second)
        await second.shutdown(grace_s=1.0)
        return keys

    keys = asyncio.run(after_restart())
    assert sorted(keys) == sorted(expected)
    assert set(keys.values()) == {1}


def test_a_forged_mark_does_not_skip_pending_messages_after_a_crash(
    make_broker, handlers, tmp_path
):
    root = tmp_path / "store"
    crashed = tmp_path / "crashed"
    first = delay_broker(make_broker, store_kind="file", root=root)
    first.schedule_service.clock_ms = FakeClock()  # nothing comes due
    pending = []

    async def until_crash():
        await first.start()
        pending.extend(await send_pending(first, handlers, 3, level=1))
        # Batches are stored as sent; this one claims level 1 delivered up to offset 2.
        forged = BatchEntry(b"x", encode_properties({PROPERTY_DELAY_QUEUE_OFFSET: "1:2"}))
        await send_all(first, handlers, batch_request("Orders", [forged]))
        copy_as_crashed(root, crashed)
        await first.shutdown(grace_s=1.0)

    asyncio.run(until_crash())
    second = delay_broker(make_broker, store_kind="file", root=crashed)
    # The same frozen clock: on a busy machine the real one can pass the level's delay
    # before the offset is read, and delivering the messages moves it too.
    second.schedule_service.clock_ms = first.schedule_service.clock_ms

    async def after_restart():
        await second.start()
        offset = second.schedule_service.offset(1)
        await second.shutdown(grace_s=1.0)
        return offset

    assert asyncio.run(after_restart()) == 0
    assert len(pending) == 3


def test_due_messages_are_all_delivered_then_the_level_idles(make_broker, handlers):
    broker = delay_broker(make_broker)
    clock = broker.schedule_service.clock_ms = FakeClock()
    expected = asyncio.run(send_pending(broker, handlers, 4, level=2))
    clock.now_ms += 60_000
    assert broker.schedule_service.deliver_due(2) == TICK_INTERVAL_MAX_MS  # idle afterwards
    assert broker.schedule_service.deliver_due(2) == TICK_INTERVAL_MAX_MS
    assert sorted(unique_keys_in(broker)) == sorted(expected)


def test_delay_offset_file_keeps_rocketmq_shape_plus_the_scan_position(make_broker, handlers,
                                                                        tmp_path):
    root = tmp_path / "store"
    broker = delay_broker(make_broker, store_kind="file", root=root)
    clock = broker.schedule_service.clock_ms = FakeClock()

    async def scenario():
        await broker.start()
        await send_pending(broker, handlers, 2, level=1)
        clock.now_ms += 60_000
        broker.schedule_service.deliver_due(1)
        await broker.shutdown(grace_s=1.0)

    asyncio.run(scenario())
    saved = json.loads(Path(root, "config", "delayOffset.json").read_text())
    assert saved["offsetTable"] == {"1": 2}
    assert saved["tailScanPhysicalOffset"] > 0


def test_a_waiting_message_without_its_real_topic_is_skipped_not_blocking_its_level(
    make_broker, handlers, caplog
):
    broker = delay_broker(make_broker)
    clock = broker.schedule_service.clock_ms = FakeClock()
    broken = StoreMessage(SCHEDULE_TOPIC, 0, b"lost", {"DELAY": "1", "UNIQ_KEY": "BROKEN"})
    assert broker.store.put_message(broken).ok
    (good,) = asyncio.run(send_pending(broker, handlers, 1, level=1))[-1:]
    clock.now_ms += 60_000
    broker.schedule_service.deliver_due(1)
    assert [m.unique_key for m in stored(broker, "Orders")] == [good]
    assert broker.schedule_service.offset(1) == 2
    assert "cannot be delivered" in caplog.text


def test_a_pre_rendered_properties_text_does_not_hide_the_reroute(make_broker):
    broker = delay_broker(make_broker)
    properties = {"DELAY": "2", "UNIQ_KEY": "PRERENDERED", DELAY_MARK: "2:0"}
    message = StoreMessage("Orders", 1, b"x", dict(properties),
                           properties_text=encode_properties(properties))
    assert broker.store.put_message(redirect_delayed(message, 3)).ok
    (waiting,) = scheduled(broker, 2)
    assert waiting.properties["REAL_TOPIC"] == "Orders"
    assert waiting.properties["REAL_QID"] == "1"
    assert DELAY_MARK not in waiting.properties


def test_a_periodic_persist_on_a_full_disk_is_logged_as_an_error_without_a_traceback(
    make_broker, caplog, monkeypatch
):
    # A full disk is an operator's problem the message names (file and fix), not a bug: the
    # broker logs it as BackgroundSaver does, without a traceback (tests/reliability's full
    # disk test fails on any traceback in the broker's log).
    monkeypatch.setattr("tidemq.broker.schedule_service.PERSIST_INTERVAL_MS", 10)
    broker = delay_broker(make_broker)
    service = broker.schedule_service
    attempts = []

    async def full_disk_persist() -> None:
        attempts.append(1)
        raise StoreFull("no space left to save config file delayOffset.json (40 bytes): "
                        "[Errno 28] No space left on device; free disk space on that volume")

    async def scenario():
        await service.start()
        service.persist = full_disk_persist
        try:
            async with asyncio.timeout(WAIT_BOUND_S):
                while len(attempts) < 2:  # failed, and the loop went on to try again
                    await asyncio.sleep(0.01)
        finally:
            del service.persist
            await service.shutdown()

    with caplog.at_level(logging.ERROR, "tidemq.broker"):
        asyncio.run(scenario())
    failures = [r for r in caplog.records if "persisting delay offsets failed" in r.message]
    assert failures, caplog.text
    assert all(r.levelno == logging.ERROR and r.exc_info is None for r in failures)
    assert "free disk space on that volume" in failures[0].getMessage()

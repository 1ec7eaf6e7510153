"""Delay messages against a real ``tidemq broker`` process with short levels ("1s 2s 3s").

Requests go straight to the broker over loopback (no name server): SEND_MESSAGE_V2 with a
DELAY property, PULL_MESSAGE on the real topic, VIEW_MESSAGE_BY_ID for the waiting copy.
Assertions are about order, never durations: a delayed message is not visible, nor stored in
its topic, before the due time computed from its own store timestamp. Waits for it to show
up are bounded generously.
"""

from __future__ import annotations

import collections
import signal
import time

import pytest

from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import SendMessageRequestHeader
from tidemq.protocol.message import MessageExt, decode_record, decode_records, encode_properties
from tidemq.protocol.msgid import decode_offset_msg_id

pytestmark = pytest.mark.integration

LEVELS = "1s 2s 3s"
LEVEL_MS = {1: 1000, 2: 2000, 3: 3000}
BROKER_SETTINGS = {"messageDelayLevel": LEVELS}
TOPIC = "DelayedOrders"
QUEUES = 4
ARRIVAL_WAIT_S = 60.0  # bounds every wait for deliveries; a healthy broker needs seconds
POLL_INTERVAL_S = 0.05


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def send_delayed(remoting_call, addr: str, key: str, level: int, queue_id: int = 0) -> int:
    """Send one message delayed by ``level``; return the commit-log offset of its waiting copy."""
    header = SendMessageRequestHeader(
        producer_group="delay_it_producer", topic=TOPIC, default_topic="TBW102",
        default_topic_queue_nums=QUEUES, queue_id=queue_id, sys_flag=0,
        born_timestamp=now_ms(), flag=0,
        properties=encode_properties({"KEYS": key, "TAGS": "delayed", "DELAY": str(level),
                                      "WAIT": "true"}),
    )
    request = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_ext_fields(),
                                      key.encode())
    response = remoting_call(addr, request)
    assert response.code == ResponseCode.SUCCESS, response.remark
    assert response.ext_fields["queueId"] == str(queue_id)
    return decode_offset_msg_id(response.ext_fields["msgId"])[1]


def view(remoting_call, addr: str, physical_offset: int) -> MessageExt:
    request = RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID,
                                      {"offset": str(physical_offset)})
    response = remoting_call(addr, request)
    assert response.code == ResponseCode.SUCCESS, response.remark
    return decode_record(response.body)


def pull_all(remoting_call, addr: str) -> list[MessageExt]:
    """Every message in the topic's queues right now (one pull per queue, from offset 0)."""
    messages: list[MessageExt] = []
    for queue_id in range(QUEUES):
        fields = {"consumerGroup": "delay_it_reader", "topic": TOPIC, "queueId": str(queue_id),
                  "queueOffset": "0", "maxMsgNums": "1000", "sysFlag": "4",
                  "commitOffset": "0", "suspendTimeoutMillis": "0", "subscription": "*",
                  "subVersion": "0"}
        response = remoting_call(addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, fields))
        if response.code == ResponseCode.SUCCESS:
            messages.extend(decode_records(response.body))
        else:
            assert response.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED,
                                     ResponseCode.TOPIC_NOT_EXIST), response.remark
    return messages


def delay_offsets(remoting_call, addr: str) -> dict[str, int]:
    """GET_ALL_DELAY_OFFSET's offsetTable: level -> next offset to deliver."""
    response = remoting_call(addr, RemotingCommand.request(RequestCode.GET_ALL_DELAY_OFFSET))
    assert response.code == ResponseCode.SUCCESS, response.remark
    table = jsonx.loads(response.body)["offsetTable"]
    return {str(level): offset for level, offset in table.items()}


def test_a_level_3_message_is_not_visible_before_it_is_due_then_arrives(
        tidemq_cluster, remoting_call):
    cluster = tidemq_cluster(namesrv_count=0, broker_overrides=BROKER_SETTINGS)
    addr = cluster.brokers[0].addr
    waiting = view(remoting_call, addr, send_delayed(remoting_call, addr, "late-1", 3, 2))
    assert waiting.properties["REAL_TOPIC"] == TOPIC
    due_ms = waiting.store_timestamp + LEVEL_MS[3]

    polls: list[tuple[int, int]] = []  # (time the answer came, messages seen)
    deadline = time.monotonic() + ARRIVAL_WAIT_S
    seen: list[MessageExt] = []
    while not seen and time.monotonic() < deadline:
        seen = pull_all(remoting_call, addr)
        polls.append((now_ms(), len(seen)))
        time.sleep(POLL_INTERVAL_S)

    assert seen, f"the delayed message did not arrive within {ARRIVAL_WAIT_S} s"
    (delivered,) = seen
    for answered_ms, count in polls:
        if count:
            assert answered_ms >= due_ms, "visible before its due time"
    assert delivered.store_timestamp >= due_ms, "stored in its topic before its due time"
    assert delivered.unique_key == waiting.unique_key
    assert delivered.queue_id == 2 and delivered.topic == TOPIC
    assert delivered.body == b"late-1"
    assert "DELAY" not in delivered.properties


def test_delayed_messages_pending_across_a_sigkill_are_delivered_exactly_once(
        tidemq_cluster, remoting_call, wait_until):
    cluster = tidemq_cluster(namesrv_count=0, broker_overrides=BROKER_SETTINGS)
    broker = cluster.brokers[0]
    addr = broker.addr
    early = [f"early-{i}" for i in range(12)]
    late = [f"late-{i}" for i in range(12)]
    for i, key in enumerate(early):
        send_delayed(remoting_call, addr, key, 1, i % QUEUES)
    for i, key in enumerate(late):
        send_delayed(remoting_call, addr, key, 3, i % QUEUES)

    # Kill once the 1 s messages are delivered: their progress is (very likely) not yet in
    # delayOffset.json (written every 10 s), and the 3 s messages are (likely) still waiting.
    def early_delivered() -> bool:
        keys = {m.keys[0] for m in pull_all(remoting_call, addr)}
        return set(early) <= keys

    wait_until(early_delivered, timeout_s=ARRIVAL_WAIT_S, interval_s=POLL_INTERVAL_S,
               what="the level-1 messages")
    broker.kill(signal.SIGKILL)
    broker.start()

    # Once both levels' offsets passed every waiting message, every delivery (a double too)
    # has been stored.
    drained = {"1": len(early), "3": len(late)}
    wait_until(lambda: delay_offsets(remoting_call, addr) == drained,
               timeout_s=ARRIVAL_WAIT_S, interval_s=POLL_INTERVAL_S,
               what=f"delay offsets {drained} after the restart")
    expected = set(early) | set(late)
    counts = collections.Counter(m.keys[0] for m in pull_all(remoting_call, addr))
    assert set(counts) == expected
    doubled = {key: count for key, count in counts.items() if count != 1}
    assert not doubled, f"delivered more than once: {doubled}"

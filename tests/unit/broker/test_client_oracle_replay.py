"""Replay what real third-party RocketMQ 4.x consumers sent (oracle frames) against a broker.

tests/data/frames holds frames captured from ali-ons (JavaScript), the C++ 1.x
client (Python ``rocketmq`` 0.4.4) and rocketmq-nodejs (C++ 2.x core). Their consumer-side
frames — HEART_BEAT, GET_CONSUMER_LIST_BY_GROUP, QUERY/UPDATE_CONSUMER_OFFSET, GET_MAX_OFFSET,
PULL_MESSAGE, LOCK/UNLOCK_BATCH_MQ, UNREGISTER_CLIENT — are decoded and sent, in capture order
and one loopback connection per captured connection, to a broker whose topics hold messages.
Each answer must be what those clients need (oracle README): never a SYSTEM_ERROR for their
header or body quirks, the caller's own id in the consumer list, offset 0 for a new group on
an untrimmed queue, and the four pull header fields on every pull answer.
"""

from __future__ import annotations

import asyncio
import json
import time

import orjson
import pytest

from data_paths import CLIENT_FRAMES_DIR
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import decode_command
from tidemq.remoting.client import RemotingClient
from tidemq.store.config_tables import TopicConfig
from tidemq.store.interface import StoreMessage

ORACLE = CLIENT_FRAMES_DIR
CAPTURES = ("alions_ordered_small", "alions_producer_consumer", "alions_tags_small",
            "cpp_orderly", "cpp_produce_consume", "nodecpp_produce_consume")
CONSUMER_CODES = {
    RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
    RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET,
    RequestCode.GET_MAX_OFFSET, RequestCode.PULL_MESSAGE, RequestCode.LOCK_BATCH_MQ,
    RequestCode.UNLOCK_BATCH_MQ,
}
PULL_HEADER_FIELDS = {"suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset"}


def captured_frames(capture: str) -> list[tuple[int, bytes]]:
    """(captured connection number, frame bytes after the length prefix), in capture order."""
    frames = []
    for described in sorted((ORACLE / capture).glob("*_c2s_code*.json")):
        meta = json.loads(described.read_text())
        if meta["header"]["code"] in CONSUMER_CODES:
            frames.append((meta["conn"], described.with_suffix(".bin").read_bytes()[4:]))
    return frames


def topics_of(frames: list[tuple[int, bytes]]) -> set[str]:
    topics = set()
    for _, frame in frames:
        ext = decode_command(frame).ext_fields or {}
        if "topic" in ext and not ext["topic"].startswith("%RETRY%"):
            topics.add(ext["topic"])
    return topics


@pytest.mark.parametrize("capture", CAPTURES)
def test_real_consumers_frames_get_the_answers_they_need(capture, make_broker, serve):
    assert (ORACLE / capture).is_dir(), f"oracle capture {capture} is missing"
    frames = captured_frames(capture)
    assert frames
    # Short polling of 0 ms: a suspended pull is answered at once, so the replay never waits.
    broker = make_broker(long_polling_enable=False, short_polling_time_ms=0)
    for topic in topics_of(frames):
        broker.topic_config_manager.update(TopicConfig(topic, 8, 8))
        for queue_id in range(4):
            for tags in ("TagA", "TagB", "TagA"):
                broker.store.put_message(StoreMessage(
                    topic, queue_id, b"body", {"TAGS": tags},
                    born_timestamp=int(time.time() * 1000), born_host="127.0.0.1:50000",
                ))

    async def replay():
        async with serve(broker) as link:
            clients: dict[int, RemotingClient] = {}
            members: dict[str, set[str]] = {}  # group -> client ids registered by our replay
            try:
                for conn, frame in frames:
                    request = decode_command(frame)
                    client = clients.setdefault(conn, RemotingClient())
                    if request.is_oneway:  # rocketmq-nodejs commits offsets oneway
                        await client.invoke_oneway(link.address, request)
                        continue
                    response = await client.invoke(link.address, request, 5000)
                    check(request, response, members)
            finally:
                for client in clients.values():
                    await client.close()

    asyncio.run(replay())


def check(request, response, members: dict[str, set[str]]) -> None:
    code = request.code
    ext = request.ext_fields or {}
    where = f"{request.describe()} -> {response.describe()}"
    if code == RequestCode.HEART_BEAT:
        assert response.code == ResponseCode.SUCCESS, where
        heartbeat = orjson.loads(request.body)
        for consumer in heartbeat.get("consumerDataSet") or []:
            members.setdefault(consumer["groupName"], set()).add(heartbeat["clientID"])
    elif code == RequestCode.UNREGISTER_CLIENT:
        assert response.code == ResponseCode.SUCCESS, where
        members.get(ext.get("consumerGroup", ""), set()).discard(ext["clientID"])
    elif code == RequestCode.GET_CONSUMER_LIST_BY_GROUP:
        expected = members.get(ext["consumerGroup"], set())
        if expected:
            assert response.code == ResponseCode.SUCCESS, where
            assert set(orjson.loads(response.body)["consumerIdList"]) == expected, where
        else:
            assert response.code == ResponseCode.SYSTEM_ERROR, where
    elif code == RequestCode.QUERY_CONSUMER_OFFSET:
        assert response.code == ResponseCode.SUCCESS, where  # committed, or 0 on a new group
        assert int(response.ext_fields["offset"]) >= 0, where
    elif code in (RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.UNLOCK_BATCH_MQ):
        assert response.code == ResponseCode.SUCCESS, where
    elif code == RequestCode.GET_MAX_OFFSET:
        assert response.code == ResponseCode.SUCCESS, where
        assert int(response.ext_fields["offset"]) >= 0, where
    elif code == RequestCode.LOCK_BATCH_MQ:
        assert response.code == ResponseCode.SUCCESS, where
        locked = orjson.loads(response.body)["lockOKMQSet"]
        assert locked == orjson.loads(request.body)["mqSet"], where
    elif code == RequestCode.PULL_MESSAGE:
        assert response.code in (
            ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND,
            ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_OFFSET_MOVED,
        ), where
        assert set(response.ext_fields) >= PULL_HEADER_FIELDS, where
        if response.code == ResponseCode.SUCCESS:
            assert response.body, where

"""Request-reply round trips with the tidemq client at both ends, through a real broker:
SEND_REPLY_MESSAGE_V2 from the replier, PUSH_REPLY_MESSAGE_TO_CLIENT to the requester."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from server_processes import remoting_call, wait_until
from tidemq.client import Admin as AsyncAdmin
from tidemq.client import Message as AsyncMessage
from tidemq.client import Producer as AsyncProducer
from tidemq.client import RequestTimeout
from tidemq.client import replying as async_replying
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import PROPERTY_CORRELATION_ID, encode_properties
from tidemq.remoting.loop import run
from tidemq.sync import Admin, Message, Producer, PushConsumer, replying

pytestmark = pytest.mark.integration

REQUEST_TIMEOUT_MS = 20_000  # generous: the machine is shared; a healthy reply takes ms


def create_topic(namesrv: str, topic: str) -> None:
    with Admin(namesrv) as admin:
        admin.create_topic(topic, 2)
        wait_until(lambda: topic in admin.topic_list(), what=f"topic {topic} routed")


def test_sync_request_gets_the_reply_of_a_replying_consumer(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    create_topic(namesrv, "Requests")
    with Producer("replier-producer", namesrv) as replier:
        consumer = PushConsumer("replier-group", namesrv, consume_from="FIRST")
        consumer.subscribe("Requests", "*")
        consumer.listener(replying(replier, lambda request: b"echo:" + request.body))
        with consumer, Producer("requester", namesrv) as requester:
            reply = requester.request(Message("Requests", b"ping"), REQUEST_TIMEOUT_MS)
            assert reply.body == b"echo:ping"
            assert reply.topic == "DefaultCluster_REPLY_TOPIC"
            assert reply.properties[PROPERTY_CORRELATION_ID]
            futures = [requester.request_async(Message("Requests", f"n{i}"), REQUEST_TIMEOUT_MS)
                       for i in range(5)]
            bodies = sorted(f.result(timeout=60).body for f in futures)
            assert bodies == sorted(f"echo:n{i}".encode() for i in range(5))
    # storeReplyMessageEnable (default true): the replies are kept in the reply topic
    with Admin(namesrv) as admin:
        stats = admin.topic_stats("DefaultCluster_REPLY_TOPIC")
        assert sum(offset.max_offset for offset in stats.values()) == 6


def test_async_request_callback_and_timeout(tidemq_cluster):
    cluster = tidemq_cluster(broker_overrides={"storeReplyMessageEnable": "false"})
    namesrv = cluster.namesrv_addr
    create_topic(namesrv, "AsyncRequests")
    create_topic(namesrv, "Unanswered")

    async def main() -> None:
        from tidemq.client import PushConsumer as AsyncPushConsumer

        async with AsyncProducer("async-replier", namesrv) as replier:
            consumer = AsyncPushConsumer("async-replier-group", namesrv, consume_from="FIRST")
            consumer.subscribe("AsyncRequests", "*")

            async def answer(request):
                return request.body.upper()

            consumer.listener(async_replying(replier, answer))
            async with consumer, AsyncProducer("async-requester", namesrv) as requester:
                reply = await requester.request(AsyncMessage("AsyncRequests", b"hello"),
                                                REQUEST_TIMEOUT_MS)
                assert reply.body == b"HELLO"
                done: asyncio.Future = asyncio.get_running_loop().create_future()
                requester.request_with_callback(
                    AsyncMessage("AsyncRequests", b"callback"), done.set_result,
                    done.set_exception, timeout_ms=REQUEST_TIMEOUT_MS)
                assert (await asyncio.wait_for(done, 60)).body == b"CALLBACK"
                with pytest.raises(RequestTimeout, match="no reply"):
                    await requester.request(AsyncMessage("Unanswered", b"?"), 1500)
        async with AsyncAdmin(namesrv) as admin:
            stats = await admin.topic_stats("DefaultCluster_REPLY_TOPIC")
            assert sum(o.max_offset for o in stats.values()) == 0  # storing was off

    run(main())


def test_a_reply_for_a_requester_not_connected_is_refused_with_a_remark(tidemq_cluster):
    cluster = tidemq_cluster()
    properties = encode_properties({"REPLY_TO_CLIENT": "10.9.9.9@gone", "MSG_TYPE": "reply",
                                    "CORRELATION_ID": "c-1", "CLUSTER": "DefaultCluster"})
    fields = {"a": "replier", "b": "DefaultCluster_REPLY_TOPIC", "c": "TBW102", "d": "4",
              "e": "0", "f": "0", "g": "0", "h": "0", "i": properties}
    response = remoting_call(cluster.broker("broker-a").addr, RemotingCommand.request(
        RequestCode.SEND_REPLY_MESSAGE_V2, fields, b"late"))
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "10.9.9.9@gone" in response.remark and "not connected" in response.remark


def test_sync_request_times_out_without_a_replier(tidemq_cluster):
    cluster = tidemq_cluster()
    create_topic(cluster.namesrv_addr, "Silent")
    with Producer("lonely", cluster.namesrv_addr) as requester:
        future = requester.request_async(Message("Silent", b"anyone?"), 1000)
        with pytest.raises(RequestTimeout):
            future.result(timeout=60)
        assert isinstance(future, concurrent.futures.Future)

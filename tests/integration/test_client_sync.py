"""The synchronous twins (tidemq.sync) against real server processes, from plain threads."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from tidemq.client import NoRouteError
from tidemq.sync import (
    Admin,
    ConsumeResult,
    Message,
    Producer,
    PullConsumer,
    PushConsumer,
    SendStatus,
)

pytestmark = pytest.mark.integration


def test_sync_clients_produce_and_consume_without_an_event_loop(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    with Admin(namesrv) as admin:
        admin.create_topic("SyncTopic", 2)
        for _ in range(200):
            try:
                queues = admin.topic_route("SyncTopic").subscribe_queues("SyncTopic")
                break
            except NoRouteError:
                threading.Event().wait(0.05)
        else:
            raise AssertionError("SyncTopic never routed")

    with Producer("sync_producer", namesrv) as producer:
        result = producer.send(Message("SyncTopic", "plain call", tags="a"))
        assert result.status is SendStatus.SEND_OK
        futures = [producer.send_async(Message("SyncTopic", f"async {i}")) for i in range(50)]
        done = [f.result(timeout=60) for f in futures]
        assert all(r.status is SendStatus.SEND_OK for r in done)
        batch = producer.send_batch([Message("SyncTopic", f"batch {i}") for i in range(20)])
        assert sum(len(r.msg_ids) for r in batch) == 20

        # twins work from several threads at once
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            threaded = list(pool.map(
                lambda i: producer.send(Message("SyncTopic", f"thread {i}")), range(20)))
        assert len({r.msg_id for r in threaded}) == 20

    bodies: list[bytes] = []
    with PullConsumer("sync_group", namesrv, consume_from="FIRST") as consumer:
        consumer.assign(queues)
        assert consumer.assignment() == sorted(queues)
        for _ in range(100):
            bodies.extend(m.body for m in consumer.poll(500))
            if len(bodies) >= 91:
                break
        consumer.commit_sync()
        assert sum(consumer.committed(q) or 0 for q in queues) == 91
    assert len(bodies) == 91
    assert b"plain call" in bodies and b"thread 19" in bodies


def test_sync_admin_reaches_a_sync_push_consumer_through_the_broker(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    topic, group, count = "SyncAdminTopic", "sync_admin_group", 6
    received: list[bytes] = []
    got_all = threading.Event()
    with Admin(namesrv) as admin:
        admin.create_topic(topic, 1)
        for _ in range(200):
            try:
                queue = admin.topic_route(topic).subscribe_queues(topic)[0]
                break
            except NoRouteError:
                threading.Event().wait(0.05)
        else:
            raise AssertionError(f"{topic} never routed")
        with Producer("sync_admin_producer", namesrv) as producer:
            for i in range(count):
                producer.send(Message(topic, f"m{i}"))

        consumer = PushConsumer(group, namesrv, consume_from="FIRST")
        consumer.subscribe(topic, "*")

        @consumer.listener
        def on_messages(messages):
            received.extend(m.body for m in messages)
            if len(received) >= count:
                got_all.set()
            return ConsumeResult.SUCCESS

        with consumer:
            assert got_all.wait(60), f"consumed only {len(received)} of {count}"
            for _ in range(400):  # the consumer's own offset follows its last ack
                if consumer.consumer_offsets(topic).get(queue) == count:
                    break
                threading.Event().wait(0.05)
            assert consumer.consumer_offsets(topic) == {queue: count}

            info = admin.consumer_running_info(group, consumer.client_id)
            assert info.properties["consumerGroup"] == group
            status = admin.consumer_status(group, topic)
            assert status == {consumer.client_id: {queue: count}}

            # A reset moves offsets the broker holds: wait for the consumer's commit (its
            # next pull or its periodic persist) to reach it.
            for _ in range(400):
                if admin.committed_offset(group, queue) == count:
                    break
                threading.Event().wait(0.05)
            # Back to the start while it runs: every message comes again.
            got_all.clear()
            received.clear()
            assert admin.reset_offset_by_time(group, topic, 0, force=True) == {queue: 0}
            assert got_all.wait(60), f"consumed again only {len(received)} of {count}"
    assert sorted(received) == sorted(f"m{i}".encode() for i in range(count))

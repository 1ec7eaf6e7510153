"""The synchronous twins (tidemq.sync) against real server processes, from plain threads."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from tidemq.client import NoRouteError
from tidemq.sync import Admin, Message, Producer, PullConsumer, SendStatus

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

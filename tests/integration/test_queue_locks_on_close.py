"""Orderly consumers' queue locks end with the holder's connection, not 60 s later.

A real orderly PushConsumer runs in its own process and consumes (so it holds its queues'
locks on the broker). Another member of the group asks for the same queues with raw
LOCK_BATCH_MQ requests: refused while the holder lives; once the holder's process is killed
(SIGKILL, so nothing is unlocked politely) the broker sees its connection close and grants
them. The wait for that is bounded well below the 60 s lease the locks would otherwise live.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidemq.client import Admin, Message, MessageQueue, Producer
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

pytestmark = pytest.mark.integration

TOPIC = "LocksOnClose"
GROUP = "locks_on_close"
QUEUES = 2
ROUTE_WAIT_S = 20.0
CONSUMER_START_WAIT_S = 60.0
# Far below the 60 s lease (RocketMQ's lockMaxLiveTime): granted within this bound means the
# close released the locks, not the lease running out. It bounds a wait, it times nothing.
RELEASE_WAIT_S = 20.0

HOLDER_SCRIPT = """
import asyncio, sys
from tidemq.client import ConsumeResult, PushConsumer

async def main(namesrv, topic, group):
    consumer = PushConsumer(group, namesrv, consume_from="FIRST", instance_name="holder")
    seen = set()

    @consumer.orderly_listener
    async def on_messages(messages):
        for message in messages:
            if message.queue_id not in seen:
                seen.add(message.queue_id)
                print("consuming", message.queue_id, flush=True)
        return ConsumeResult.SUCCESS

    consumer.subscribe(topic, "*")
    async with consumer:
        await asyncio.sleep(300)  # the test kills this process long before

asyncio.run(main(*sys.argv[1:4]))
"""


def lock_request(client_id: str, queues: list[MessageQueue]) -> RemotingCommand:
    body = json.dumps({"clientId": client_id, "consumerGroup": GROUP, "mqSet": [
        {"brokerName": q.broker_name, "queueId": q.queue_id, "topic": q.topic} for q in queues
    ]}).encode()
    return RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, body=body)


def test_killed_orderly_consumer_gives_its_queue_locks_to_the_group_at_once(
        tidemq_cluster, remoting_call, wait_until, tmp_path: Path):
    cluster = tidemq_cluster()
    broker = cluster.broker("broker-a")
    queues = [MessageQueue(TOPIC, "broker-a", queue_id) for queue_id in range(QUEUES)]

    async def prepare() -> None:
        async with Admin(namesrv=cluster.namesrv_addr) as admin:
            await admin.create_topic(TOPIC, QUEUES)
            deadline = time.monotonic() + ROUTE_WAIT_S
            while not (await admin.topic_route(TOPIC)).queue_datas:
                assert time.monotonic() < deadline, "topic never routed"
                await asyncio.sleep(0.1)
        async with Producer("locks_on_close_producer", namesrv=cluster.namesrv_addr) as p:
            for queue in queues:
                await p.send(Message(TOPIC, b"m"), queue=queue)

    asyncio.run(prepare())
    script = tmp_path / "holder.py"
    script.write_text(HOLDER_SCRIPT)
    output = tmp_path / "holder.out"
    with open(output, "wb") as stdout:
        holder = subprocess.Popen(
            [sys.executable, str(script), cluster.namesrv_addr, TOPIC, GROUP],
            stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    try:
        def consuming_every_queue() -> bool:
            assert holder.poll() is None, f"holder exited:\n{output.read_text()}"
            return output.read_text().count("consuming") == QUEUES

        wait_until(consuming_every_queue, CONSUMER_START_WAIT_S,
                   what="the orderly holder to consume from every queue")
        refused = remoting_call(broker.addr, lock_request("survivor@1", queues))
        assert refused.code == ResponseCode.SUCCESS
        assert json.loads(refused.body) == {"lockOKMQSet": []}, "the holder's locks are live"

        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)

        def survivor_locks_every_queue() -> bool:
            response = remoting_call(broker.addr, lock_request("survivor@1", queues))
            return len(json.loads(response.body)["lockOKMQSet"]) == QUEUES

        wait_until(survivor_locks_every_queue, RELEASE_WAIT_S, interval_s=0.2,
                   what="the killed holder's queue locks to be released")
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(10)

"""Admin client, ``tidemq admin`` and ``tidemq bench`` against real server processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import orjson
import pytest

from tidemq.client import (
    Admin,
    BrokerRejected,
    Message,
    MessageQueue,
    NoRouteError,
    Producer,
    PullConsumer,
)
from tidemq.protocol.codes import ResponseCode
from tidemq.remoting.loop import run

pytestmark = pytest.mark.integration

CLI_TIMEOUT_S = 120.0


def tidemq_cli(*args: str, namesrv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq", *args], capture_output=True, text=True,
        timeout=CLI_TIMEOUT_S, env={**os.environ, "NAMESRV_ADDR": namesrv, "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
    )


async def wait_for_route(admin: Admin, topic: str, present: bool = True) -> None:
    for _ in range(200):
        try:
            await admin.topic_route(topic)
            if present:
                return
        except NoRouteError:
            if not present:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"route of {topic} never became {'present' if present else 'absent'}")


def test_admin_creates_inspects_queries_and_deletes_topics(tidemq_cluster):
    cluster = tidemq_cluster(brokers=("broker-a", "broker-b"))
    namesrv = cluster.namesrv_addr
    topic = "AdminTopic"

    async def scenario() -> None:
        async with Admin(namesrv) as admin:
            info = await admin.cluster_list()
            assert info.clusters == {"DefaultCluster": ["broker-a", "broker-b"]}
            updated = await admin.create_topic(topic, 3)
            assert sorted(updated) == sorted(b.addr for b in cluster.brokers)
            await wait_for_route(admin, topic)
            route = await admin.topic_route(topic)
            assert {(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm)
                    for q in route.queue_datas} == {("broker-a", 3, 3, 6), ("broker-b", 3, 3, 6)}
            assert topic in await admin.topic_list()

            async with Producer("admin_it_producer", namesrv) as producer:
                results = [await producer.send(Message(topic, f"m{i}", keys=[f"key-{i % 3}"],
                                                       tags="t"))
                           for i in range(30)]
            stats = await admin.topic_stats(topic)
            assert set(stats) == {MessageQueue(topic, b, i) for b in ("broker-a", "broker-b")
                                  for i in range(3)}
            assert sum(o.max_offset - o.min_offset for o in stats.values()) == 30

            # by the broker's offset message id, with or without the topic
            by_offset_id = await admin.query_message_by_id(results[4].offset_msg_id)
            assert by_offset_id.body == b"m4" and by_offset_id.topic == topic
            # by the client's message id (UNIQ_KEY): needs the topic
            by_unique = await admin.query_message_by_id(results[7].msg_id, topic)
            assert by_unique.body == b"m7"
            with pytest.raises(NoRouteError):
                await admin.query_message_by_id("0" * 32, topic)
            # by key, across both brokers
            keyed = await admin.query_message_by_key(topic, "key-1")
            assert sorted(m.body for m in keyed) == sorted(f"m{i}".encode()
                                                         for i in range(1, 30, 3))
            assert await admin.query_message_by_key(topic, "no-such-key") == []
            # by queue offset
            first = results[0]
            at_offset = await admin.query_message_by_offset(first.queue, first.queue_offset)
            assert at_offset.body == b"m0"

            # offsets and progress of a group
            queue = first.queue
            assert await admin.max_offset(queue) == stats[queue].max_offset
            assert await admin.min_offset(queue) == 0
            async with PullConsumer("admin_it_group", namesrv, consume_from="FIRST") as consumer:
                consumer.assign(sorted(stats))
                got = 0
                for _ in range(100):
                    got += len(await consumer.poll(500))
                    if got >= 30:
                        break
                await consumer.commit_sync()
            progress = await admin.consume_stats("admin_it_group", topic)
            assert progress.total_lag == 0
            assert {q for q in progress.offsets} == set(stats)
            reset = await admin.reset_offset_by_time("admin_it_group", topic, 0)
            assert set(reset.values()) == {0}
            assert (await admin.consume_stats("admin_it_group", topic)).total_lag == 30

            runtime = await admin.broker_runtime_info(cluster.brokers[0].addr)
            assert runtime  # a table of strings

            deleted = await admin.delete_topic(topic)
            assert sorted(deleted) == sorted(b.addr for b in cluster.brokers)
            await wait_for_route(admin, topic, present=False)
            assert topic not in await admin.topic_list()

    run(scenario())


def test_admin_cli_verbs_print_tables_and_fail_cleanly(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr

    created = tidemq_cli("admin", "updateTopic", "-t", "CliTopic", "-c", "DefaultCluster",
                         "-r", "2", "-w", "2", namesrv=namesrv)
    assert created.returncode == 0, created.stderr
    assert "success" in created.stdout

    listed = tidemq_cli("admin", "topic-list", "--json", namesrv=namesrv)  # kebab case works
    assert listed.returncode == 0, listed.stderr
    assert "CliTopic" in orjson.loads(listed.stdout)

    route = tidemq_cli("admin", "topicRoute", "-t", "CliTopic", "--json", namesrv=namesrv)
    assert orjson.loads(route.stdout)["queueDatas"][0]["writeQueueNums"] == 2

    async def send() -> str:
        async with Producer("cli_it_producer", namesrv) as producer:
            return (await producer.send(Message("CliTopic", b"hello cli", keys="ck"))).msg_id

    msg_id = run(send())
    shown = tidemq_cli("admin", "queryMsgById", "-i", msg_id, "-t", "CliTopic",
                       namesrv=namesrv)
    assert shown.returncode == 0, shown.stderr
    assert "hello cli" in shown.stdout and "CliTopic" in shown.stdout

    status = tidemq_cli("admin", "topicStatus", "-t", "CliTopic", "--json", namesrv=namesrv)
    assert sum(q["maxOffset"] for q in orjson.loads(status.stdout)) == 1

    clusters = tidemq_cli("admin", "clusterList", namesrv=namesrv)
    assert clusters.returncode == 0 and "broker-a" in clusters.stdout

    # a group whose consumption is disabled is refused by the broker
    disabled = tidemq_cli("admin", "updateSubGroup", "-g", "cli_disabled", "-c",
                          "DefaultCluster", "-s", "false", namesrv=namesrv)
    assert disabled.returncode == 0, disabled.stderr

    async def pull_disabled() -> int:
        async with PullConsumer("cli_disabled", namesrv) as consumer:
            queue = (await consumer.queues("CliTopic"))[0]
            with pytest.raises(BrokerRejected) as caught:
                await consumer.pull(queue, 0)
            return caught.value.code

    assert run(pull_disabled()) == ResponseCode.NO_PERMISSION

    missing = tidemq_cli("admin", "topicRoute", "-t", "NoSuchTopic", namesrv=namesrv)
    assert missing.returncode == 1
    assert "NoSuchTopic" in missing.stderr and "Traceback" not in missing.stderr

    down = tidemq_cli("admin", "topicList", namesrv="127.0.0.1:1")
    assert down.returncode == 1
    assert "no name server answered" in down.stderr and "Traceback" not in down.stderr


def test_bench_produce_and_consume_report_json_summaries(tidemq_cluster):
    cluster = tidemq_cluster()
    namesrv = cluster.namesrv_addr
    produced = tidemq_cli("bench", "produce", "-t", "BenchIt", "--size", "256", "--batch", "16",
                          "--count", "2000", "--json", namesrv=namesrv)
    assert produced.returncode == 0, produced.stderr
    summary = orjson.loads(produced.stdout)
    assert summary["messages"] == 2000 and summary["errors"] == 0
    assert summary["requests"] == 125 and summary["msgs_per_s"] > 0
    assert summary["latency_ms_p50"] <= summary["latency_ms_p99"] <= summary["latency_ms_p999"]
    assert 0 < summary["cpu_s"] < 60  # the client's own CPU over the timed part

    single = tidemq_cli("bench", "produce", "-t", "BenchIt", "--batch", "0", "--seconds", "1",
                        "--json", namesrv=namesrv)
    assert single.returncode == 0, single.stderr
    assert orjson.loads(single.stdout)["messages"] > 0

    consumed = tidemq_cli("bench", "consume", "-t", "BenchIt", "--count", "2000", "--latency",
                          "--json", namesrv=namesrv)
    assert consumed.returncode == 0, consumed.stderr
    summary = orjson.loads(consumed.stdout)
    assert summary["messages"] >= 2000
    assert summary["latency_ms_p50"] is not None and summary["latency_ms_p50"] >= 0
    big_pulls = tidemq_cli("bench", "consume", "-t", "BenchIt", "-g", "BENCH_BIG_PULLS",
                           "--count", "2000", "--pull-batch-size", "1024", "--json",
                           namesrv=namesrv)
    assert big_pulls.returncode == 0, big_pulls.stderr
    assert orjson.loads(big_pulls.stdout)["messages"] >= 2000

    unbounded = tidemq_cli("bench", "produce", namesrv=namesrv)
    assert unbounded.returncode != 0 and "--count or --seconds" in unbounded.stderr

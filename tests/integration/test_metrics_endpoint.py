"""Prometheus metrics of real broker and name server processes (metricsExporterType=PROM):
scraped over HTTP during a produce/consume run, parsed with prometheus_client's parser; the
counters match what was sent and consumed, the lag matches consumerProgress (Admin
consume_stats), requests are counted per request code, and the name server counts its live
brokers and topics.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_processes import free_port
from tidemq.client import Admin, ConsumeResult, Message, MessageExt, Producer, PushConsumer

pytestmark = pytest.mark.integration

WAIT_S = 90.0
TOPIC = "MeteredOrders"
GROUP = "metered_group"


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> [(labels, value)] of every sample the endpoint exposes."""
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(samples, name: str, **labels: str) -> float:
    matching = [v for found, v in samples.get(name, ())
                if all(found.get(k) == want for k, want in labels.items())]
    assert len(matching) == 1, f"{name}{labels}: {matching} in {samples.get(name)}"
    return matching[0]


def test_broker_and_namesrv_metrics_follow_a_produce_consume_run(tidemq_cluster) -> None:
    broker_metrics_port = free_port()
    namesrv_metrics_port = free_port()
    cluster = tidemq_cluster(
        broker_overrides={"metricsExporterType": "PROM",
                          "metricsPromExporterPort": broker_metrics_port},
        namesrv_overrides={"metricsExporterType": "PROM",
                           "metricsPromExporterPort": str(namesrv_metrics_port)})
    namesrv = cluster.namesrv_addr
    broker_url = f"http://127.0.0.1:{broker_metrics_port}/metrics"
    namesrv_url = f"http://127.0.0.1:{namesrv_metrics_port}/metrics"
    batches, batch_size, singles = 5, 100, 20
    sent = batches * batch_size + singles
    late = 30

    async def scenario() -> tuple[dict, dict, int, int]:
        loop = asyncio.get_running_loop()
        async with Admin(namesrv) as admin:
            await admin.create_topic(TOPIC, 4)
            deadline = time.monotonic() + WAIT_S
            while True:
                try:
                    await admin.topic_route(TOPIC)
                    break
                except Exception:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.1)
            consumed: list[MessageExt] = []
            consumer = PushConsumer(GROUP, namesrv, consume_from="FIRST",
                                    persist_consumer_offset_interval_ms=200)
            consumer.subscribe(TOPIC, "*")
            consumer.listener(lambda messages: consumed.extend(messages))
            async with Producer("metered_producer", namesrv) as producer:
                async with consumer:
                    for i in range(batches):
                        await producer.send_batch([Message(TOPIC, f"b{i}-{j}".encode() * 10)
                                                   for j in range(batch_size)])
                        during = await loop.run_in_executor(None, scrape, broker_url)
                        assert value(during, "tidemq_broker_messages_in_total",
                                     topic=TOPIC) == (i + 1) * batch_size
                    with_consumer = value(during, "tidemq_broker_connections")
                    for i in range(singles):
                        await producer.send(Message(TOPIC, f"s-{i}"))
                    deadline = time.monotonic() + WAIT_S
                    while len(consumed) < sent:
                        assert time.monotonic() < deadline, f"consumed {len(consumed)}"
                        await asyncio.sleep(0.05)
                # The consumer closed and committed; these stay unconsumed: lag. Once the
                # broker has seen its connection close: a pull it left parked until then
                # would take the first late message (handed out, counted out, never consumed).
                deadline = time.monotonic() + WAIT_S
                while value(await loop.run_in_executor(None, scrape, broker_url),
                            "tidemq_broker_connections") >= with_consumer:
                    assert time.monotonic() < deadline, "the consumer's connection stays open"
                    await asyncio.sleep(0.05)
                for i in range(late):
                    await producer.send(Message(TOPIC, f"late-{i}"))
            progress = await admin.consume_stats(GROUP, TOPIC)
            broker = await loop.run_in_executor(None, scrape, broker_url)
            names = await loop.run_in_executor(None, scrape, namesrv_url)
            return broker, names, progress.total_lag, len(consumed)

    broker, names, progress_lag, consumed = asyncio.run(scenario())
    assert consumed == sent
    assert value(broker, "tidemq_broker_messages_in_total", topic=TOPIC) == sent + late
    assert value(broker, "tidemq_broker_messages_out_total", topic=TOPIC, group=GROUP) == sent
    body_bytes = sum(len(f"b{i}-{j}") * 10 for i in range(batches)
                     for j in range(batch_size)) + sum(
        len(f"s-{i}") for i in range(singles)) + sum(len(f"late-{i}") for i in range(late))
    # bytes in are whole stored records (RocketMQ's putMessageSizeTotal); this topic's are the
    # only records in the commit log
    stored = value(broker, "tidemq_broker_bytes_in_total", topic=TOPIC)
    assert stored == value(broker, "tidemq_broker_commit_log_offset", position="max")
    assert stored > body_bytes
    assert progress_lag == late
    assert value(broker, "tidemq_broker_consumer_lag", group=GROUP, topic=TOPIC) == late
    assert value(broker, "tidemq_broker_topic_max_offset", topic=TOPIC) == sent + late
    assert value(broker, "tidemq_broker_requests_total", request="SEND_BATCH_MESSAGE",
                 response_code="0") == batches
    assert value(broker, "tidemq_broker_requests_total", request="SEND_MESSAGE_V2",
                 response_code="0") == singles + late
    assert value(broker, "tidemq_broker_request_latency_seconds_count",
                 request="SEND_BATCH_MESSAGE", response_code="0") == batches
    puts = value(broker, "tidemq_broker_put_latency_seconds_count")
    assert puts >= batches + 1  # singles that arrive together share one store put
    assert value(broker, "tidemq_broker_put_latency_seconds_bucket", le="+Inf") == puts
    assert value(broker, "tidemq_broker_commit_log_offset", position="max") > body_bytes
    assert value(broker, "tidemq_broker_disk_bytes", kind="total") > 0
    assert 0 < value(broker, "tidemq_broker_disk_used_ratio") < 1
    assert value(broker, "tidemq_broker_connections") >= 0
    assert value(broker, "tidemq_broker_info", broker="broker-a") == 1
    assert value(names, "tidemq_namesrv_live_brokers", cluster="DefaultCluster",
                 role="master") == 1
    assert value(names, "tidemq_namesrv_topics") >= 1
    assert value(names, "tidemq_namesrv_requests_total", request="REGISTER_BROKER",
                 response_code="0") >= 1


def test_dlq_and_retry_depth(tidemq_cluster) -> None:
    port = free_port()
    cluster = tidemq_cluster(broker_overrides={
        "metricsExporterType": "PROM", "metricsPromExporterPort": port,
        "messageDelayLevel": "1s 1s 1s 2s 4s " + " ".join(["1s"] * 13)})
    namesrv = cluster.namesrv_addr
    url = f"http://127.0.0.1:{port}/metrics"

    async def scenario() -> dict:
        async with Producer("dlq_metrics_producer", namesrv) as producer:
            for i in range(3):
                await producer.send(Message("PoisonTopic", f"poison-{i}"))
        consumer = PushConsumer("poisoned_group", namesrv, consume_from="FIRST",
                                max_reconsume_times=0)
        consumer.subscribe("PoisonTopic", "*")
        consumer.listener(lambda messages: ConsumeResult.RECONSUME_LATER)
        async with consumer, Admin(namesrv) as admin:
            deadline = time.monotonic() + WAIT_S
            while len(await admin.dead_letters("poisoned_group")) < 3:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
        return await asyncio.get_running_loop().run_in_executor(None, scrape, url)

    samples = asyncio.run(scenario())
    assert value(samples, "tidemq_broker_dlq_depth", group="poisoned_group") == 3


def test_metrics_endpoint_answers_only_get_metrics(tidemq_cluster) -> None:
    port = free_port()
    tidemq_cluster(broker_overrides={"metricsExporterType": "PROM",
                                     "metricsPromExporterPort": port})
    with pytest.raises(urllib.error.HTTPError) as not_found:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=30)
    not_found.value.close()
    assert not_found.value.code == 404
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x",
                                     method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    refused.value.close()
    assert refused.value.code == 405

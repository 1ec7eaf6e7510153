"""spark.readStream.format("tidemq"): checkpoints, rate limits, new queues, consumer groups."""

from __future__ import annotations

import json
import math

import pytest
from streaming_queries import run_until_terminated, start_and_process_available

from tidemq.client.message import Message

pytestmark = pytest.mark.spark


def stream(spark, cluster, **options):
    reader = spark.readStream.format("tidemq").option("namesrvAddr", cluster.namesrv_addr)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def messages(topic: str, start: int, stop: int, **fields) -> list[Message]:
    return [Message(topic, f"msg-{i}".encode(), **fields) for i in range(start, stop)]


def run_available_now(df, output, checkpoint):
    return run_until_terminated(
        lambda: df.select("msgId", "topic", "brokerName", "queueId", "queueOffset", "body")
        .writeStream.format("parquet").option("path", str(output))
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())


def test_checkpointed_stream_delivers_every_message_exactly_once_across_restarts(
        spark, cluster, topic_name, tmp_path):
    cluster.create_topic(topic_name)
    cluster.produce(topic_name, messages(topic_name, 0, 120))
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    df = stream(spark, cluster, subscribe=topic_name, startingOffsets="earliest")
    run_available_now(df, output, checkpoint)
    cluster.produce(topic_name, messages(topic_name, 120, 200))
    run_available_now(df, output, checkpoint)  # the same checkpoint: goes on where it stopped

    rows = spark.read.parquet(str(output)).collect()
    assert sorted(r.body for r in rows) == sorted(f"msg-{i}".encode() for i in range(200))
    assert len({r.msgId for r in rows}) == 200


def test_max_offsets_per_trigger_caps_every_micro_batch(spark, cluster, topic_name, tmp_path):
    cluster.create_topic(topic_name)
    cluster.produce(topic_name, messages(topic_name, 0, 250))

    df = stream(spark, cluster, subscribe=topic_name, startingOffsets="earliest",
                maxOffsetsPerTrigger="60")
    query = run_available_now(df, tmp_path / "out", tmp_path / "checkpoint")

    batches = [p["numInputRows"] for p in query.recentProgress]
    assert all(rows <= 60 for rows in batches), batches
    assert sum(batches) == 250
    assert len([rows for rows in batches if rows]) == math.ceil(250 / 60)


def test_latest_start_tag_filter_and_consumer_group_progress(spark, cluster, topic_name):
    group = f"cg_{topic_name}"[:60]
    cluster.create_topic(topic_name)
    cluster.produce(topic_name, messages(topic_name, 0, 30, tags="old"))

    df = stream(spark, cluster, subscribe=topic_name, startingOffsets="latest",
                tagExpression="paid", consumerGroup=group)
    query = start_and_process_available(
        lambda: df.select("body", "tags").writeStream.format("memory")
        .queryName(topic_name).start())
    try:
        cluster.produce(topic_name, messages(topic_name, 30, 60, tags="paid"))
        cluster.produce(topic_name, messages(topic_name, 60, 70, tags="other"))
        query.processAllAvailable()
        end = json.loads(query.lastProgress["sources"][0]["endOffset"])
    finally:
        query.stop()

    rows = spark.sql(f"select body, tags from {topic_name}").collect()
    assert sorted(r.body for r in rows) == sorted(f"msg-{i}".encode() for i in range(30, 60))
    assert {r.tags for r in rows} == {"paid"}
    # The group's offsets on the brokers are the offsets the query has processed.
    stats = cluster.admin.consume_stats(group, topic_name)
    committed = {f"{q.broker_name}:{q.queue_id}": o.consumer_offset
                 for q, o in stats.offsets.items()}
    assert committed == end[topic_name]
    assert sum(end[topic_name].values()) == 70  # filtered messages are passed, not stuck
    assert stats.total_lag == 0


def test_new_queues_of_a_topic_are_read_from_their_earliest_offset(
        spark, cluster, topic_name, tmp_path):
    cluster.create_topic(topic_name, queues_per_broker=2)
    cluster.produce(topic_name, messages(topic_name, 0, 40))
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = stream(spark, cluster, subscribe=topic_name, startingOffsets="earliest")
    run_available_now(df, output, checkpoint)

    cluster.create_topic(topic_name, queues_per_broker=4)  # the topic grows to 8 queues
    cluster.produce_to_queues(topic_name, messages(topic_name, 40, 120))
    run_available_now(df, output, checkpoint)

    rows = spark.read.parquet(str(output)).collect()
    assert sorted(r.body for r in rows) == sorted(f"msg-{i}".encode() for i in range(120))
    assert {(r.brokerName, r.queueId) for r in rows} == {
        (b, q) for b in ("broker-a", "broker-b") for q in range(4)}


def test_fail_on_data_loss_when_a_topic_is_deleted_and_re_created(
        spark, cluster, topic_name, tmp_path):
    cluster.create_topic(topic_name)
    cluster.produce_to_queues(topic_name, messages(topic_name, 0, 40))  # offsets 0..4 per queue
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    run_available_now(stream(spark, cluster, subscribe=topic_name,
                             startingOffsets="earliest"), output, checkpoint)
    cluster.admin.delete_topic(topic_name)
    cluster.create_topic(topic_name)
    cluster.produce_to_queues(topic_name, messages(topic_name, 100, 116))  # offsets 0..1

    with pytest.raises(Exception, match="set option failOnDataLoss=false"):
        run_available_now(stream(spark, cluster, subscribe=topic_name), output, checkpoint)
    run_available_now(stream(spark, cluster, subscribe=topic_name, failOnDataLoss="false"),
                      output, checkpoint)

    rows = spark.read.parquet(str(output)).collect()
    assert sorted(r.body for r in rows) == sorted(
        [f"msg-{i}".encode() for i in range(40)] + [f"msg-{i}".encode() for i in range(100, 116)])

"""The exactly-once sink (``exactlyOnce=true``) in one Spark session: batch and streaming
writes store every row once and nothing before the commit; a query restarted from its
checkpoint after its last batch was committed on the brokers but not in Spark's checkpoint
stores nothing twice."""

from __future__ import annotations

import pytest
from streaming_queries import run_until_terminated

from tidemq.client.message import Message

pytestmark = pytest.mark.spark


def read_bodies(spark, cluster, topic) -> list[bytes]:
    return sorted(r.body for r in (spark.read.format("tidemq")
                                   .option("namesrvAddr", cluster.namesrv_addr)
                                   .option("subscribe", topic).load().collect()))


def stream_copy(spark, cluster, source, target, checkpoint, max_offsets=100):
    """Copy ``source`` to ``target`` exactly once, every available message, then stop."""
    return run_until_terminated(
        lambda: spark.readStream.format("tidemq").option("namesrvAddr", cluster.namesrv_addr)
        .option("subscribe", source).option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets)).load()
        .select("body")
        .writeStream.format("tidemq").option("namesrvAddr", cluster.namesrv_addr)
        .option("topic", target).option("exactlyOnce", "true")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True).start())


def test_batch_write_exactly_once_stores_every_row_once(spark, cluster, topic_name):
    cluster.create_topic(topic_name)
    rows = [(f"row-{i}".encode(), f"tag{i % 3}") for i in range(500)]
    df = spark.createDataFrame(rows, "body binary, tags string").repartition(3)

    (df.write.format("tidemq").option("namesrvAddr", cluster.namesrv_addr)
     .option("topic", topic_name).option("exactlyOnce", "true").option("sendBatchSize", "64")
     .mode("append").save())

    read = (spark.read.format("tidemq").option("namesrvAddr", cluster.namesrv_addr)
            .option("subscribe", topic_name).load().collect())
    assert sorted((r.body, r.tags) for r in read) == sorted(rows)
    assert {r.brokerName for r in read} == {"broker-a", "broker-b"}


def test_streaming_exactly_once_copies_each_message_once_across_a_replayed_batch(
        spark, cluster, topic_name, tmp_path):
    source, target = topic_name + "_in", topic_name + "_out"
    for topic in (source, target):
        cluster.create_topic(topic)
    cluster.produce(source, [Message(source, f"m-{i}".encode()) for i in range(300)])
    checkpoint = tmp_path / "checkpoint"

    query = stream_copy(spark, cluster, source, target, checkpoint)
    batches = [p["batchId"] for p in query.recentProgress if p["numInputRows"]]
    assert len(batches) >= 3
    assert read_bodies(spark, cluster, target) == sorted(f"m-{i}".encode() for i in range(300))

    # As if the driver died after the brokers committed the last batch but before Spark
    # wrote commits/N: the restarted query runs that batch again.
    last = max(batches)
    for name in (str(last), f".{last}.crc"):  # the commit file and Hadoop's checksum of it
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    stream_copy(spark, cluster, source, target, checkpoint)

    assert (checkpoint / "commits" / str(last)).exists()
    assert read_bodies(spark, cluster, target) == sorted(f"m-{i}".encode() for i in range(300))

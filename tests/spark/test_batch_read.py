"""spark.read.format("tidemq") over a real cluster of two brokers with four queues each.

No test calls ``spark.dataSource.register``: the format is found by Spark's discovery of
the installed top-level ``pyspark_tidemq`` module, as users get it.
"""

from __future__ import annotations

import json
import time

import pytest

from tidemq.client.message import Message

pytestmark = pytest.mark.spark


def read(spark, cluster, **options):
    reader = spark.read.format("tidemq").option("namesrvAddr", cluster.namesrv_addr)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def make_messages(topic: str, count: int, prefix: str = "m") -> list[Message]:
    return [
        Message(topic, f"{prefix}-{i}".encode(), tags=f"t{i % 3}", keys=[f"{prefix}{i}", "k"],
                properties={"index": str(i), "prefix": prefix})
        for i in range(count)
    ]


def test_batch_read_returns_exactly_what_was_produced_on_every_queue(spark, cluster, topic_name):
    cluster.create_topic(topic_name)
    messages = make_messages(topic_name, 200)
    before_ms = int(time.time() * 1000)
    cluster.produce_to_queues(topic_name, messages)
    after_ms = int(time.time() * 1000)

    rows = read(spark, cluster, subscribe=topic_name, includeProperties="true").collect()

    assert len(rows) == len(messages)
    produced = {m.properties["UNIQ_KEY"]: m for m in messages}
    assert {r.msgId for r in rows} == set(produced)
    for row in rows:
        sent = produced[row.msgId]
        assert row.topic == topic_name
        assert row.body == sent.body
        assert row.keys == " ".join(sent.keys)
        assert row.tags == sent.tags
        assert row.properties == {"index": sent.properties["index"], "prefix": "m"}
        assert before_ms <= row.bornTimestamp.timestamp() * 1000 <= after_ms
        assert row.bornTimestamp <= row.storeTimestamp
        assert row.storeTimestamp.timestamp() * 1000 <= after_ms
    by_queue: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        by_queue.setdefault((row.brokerName, row.queueId), []).append(row.queueOffset)
    assert sorted(by_queue) == [(b, q) for b in ("broker-a", "broker-b") for q in range(4)]
    assert all(sorted(offsets) == list(range(25)) for offsets in by_queue.values())
    # Each queue holds its messages in the order they were sent.
    ordered = sorted(rows, key=lambda r: (r.brokerName, r.queueId, r.queueOffset))
    first_queue = [int(r.properties["index"]) for r in ordered[:25]]
    assert first_queue == sorted(first_queue)


def test_start_and_end_by_offsets_and_split_partitions(spark, cluster, topic_name):
    cluster.create_topic(topic_name)
    cluster.produce_to_queues(topic_name, make_messages(topic_name, 80))  # 10 per queue

    df = read(
        spark, cluster, subscribe=topic_name,
        startingOffsets=json.dumps({topic_name: {"broker-a:0": 2, "broker-b:3": -2}}),
        endingOffsets=json.dumps({topic_name: {"broker-a:0": 7, "broker-a:1": 4,
                                               "broker-b:3": -1}}),
        maxRecordsPerPartition="3",
    )
    rows = df.select("brokerName", "queueId", "queueOffset").collect()

    got: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        got.setdefault((row.brokerName, row.queueId), []).append(row.queueOffset)
    expected = {("broker-a", 0): list(range(2, 7)), ("broker-a", 1): list(range(4))}
    expected.update({(b, q): list(range(10)) for b in ("broker-a", "broker-b")
                     for q in range(4) if (b, q) not in expected})
    assert {k: sorted(v) for k, v in got.items()} == expected
    # 5, 4 and six ranges of 10 offsets, at most 3 per partition: 2 + 2 + 6 * 4.
    assert df.rdd.getNumPartitions() == 28


def test_start_and_end_by_store_timestamp(spark, cluster, topic_name):
    cluster.create_topic(topic_name)
    cluster.produce(topic_name, make_messages(topic_name, 40, "before"))
    time.sleep(0.02)  # keep the boundaries off the milliseconds messages were stored in
    start_ms = int(time.time() * 1000)
    time.sleep(0.02)
    cluster.produce(topic_name, make_messages(topic_name, 50, "inside"))
    time.sleep(0.02)
    end_ms = int(time.time() * 1000)
    time.sleep(0.02)
    cluster.produce(topic_name, make_messages(topic_name, 30, "after"))

    rows = read(spark, cluster, subscribe=topic_name, includeProperties="true",
                startingTimestamp=str(start_ms), endingTimestamp=str(end_ms)).collect()

    assert sorted(r.body for r in rows) == sorted(f"inside-{i}".encode() for i in range(50))
    assert all(start_ms <= r.storeTimestamp.timestamp() * 1000 < end_ms for r in rows)


def test_tag_expression_reads_only_those_tags(spark, cluster, topic_name):
    cluster.create_topic(topic_name)
    cluster.produce(topic_name, make_messages(topic_name, 90))

    rows = read(spark, cluster, subscribe=topic_name, tagExpression="t0 || t2").collect()

    assert sorted(r.body for r in rows) == sorted(
        f"m-{i}".encode() for i in range(90) if i % 3 in (0, 2))


def test_subscribe_pattern_and_assign_choose_topics_and_queues(spark, cluster, topic_name):
    other = topic_name + "_other"
    for topic in (topic_name, other):
        cluster.create_topic(topic)
        cluster.produce_to_queues(topic, make_messages(topic, 16))

    by_pattern = read(spark, cluster, subscribePattern=topic_name + ".*").collect()
    assigned = read(spark, cluster,
                    assign=json.dumps({other: ["broker-b:1", "broker-a:2"]})).collect()

    assert sorted({r.topic for r in by_pattern}) == sorted([topic_name, other])
    assert len(by_pattern) == 32
    assert sorted({(r.topic, r.brokerName, r.queueId) for r in assigned}) == [
        (other, "broker-a", 2), (other, "broker-b", 1)]
    assert len(assigned) == 4


def test_a_bad_option_fails_on_the_driver_naming_it(spark, cluster, topic_name):
    with pytest.raises(Exception, match="startingOffsets='soon'"):
        read(spark, cluster, subscribe=topic_name, startingOffsets="soon").collect()


def test_an_unknown_topic_fails_naming_it(spark, cluster, topic_name):
    with pytest.raises(Exception, match=f"topic '{topic_name}' does not exist"):
        read(spark, cluster, subscribe=topic_name).collect()

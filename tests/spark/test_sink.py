"""df.write / df.writeStream .format("tidemq"): rows become messages, read back intact."""

from __future__ import annotations

import pytest
from streaming_queries import run_until_terminated

from tidemq.client.message import Message

pytestmark = pytest.mark.spark

ROW_SCHEMA = "body binary, keys string, tags string, properties map<string,string>"


def read_back(spark, cluster, topic):
    return (spark.read.format("tidemq").option("namesrvAddr", cluster.namesrv_addr)
            .option("subscribe", topic).option("includeProperties", "true").load().collect())


def writer(df, cluster, **options):
    out = df.write.format("tidemq").option("namesrvAddr", cluster.namesrv_addr).mode("append")
    for key, value in options.items():
        out = out.option(key, value)
    return out


def test_batch_write_round_trip_keeps_body_keys_tags_and_properties(spark, cluster, topic_name):
    cluster.create_topic(topic_name)
    rows = [(f"row-{i}".encode(), f"id-{i} order-{i % 7}", f"tag{i % 4}",
             {"n": str(i), "source": "spark"}) for i in range(300)]
    df = spark.createDataFrame(rows, ROW_SCHEMA).repartition(3)

    writer(df, cluster, topic=topic_name, sendBatchSize="32").save()

    read = read_back(spark, cluster, topic_name)
    assert len(read) == 300
    got = sorted((r.body, r.keys, r.tags, r.properties["n"], r.properties["source"])
                 for r in read)
    assert got == sorted((b, k, t, p["n"], p["source"]) for b, k, t, p in rows)
    # Each task sends its ~100 rows as 4 requests of at most 32, round robin over queues.
    assert len({(r.brokerName, r.queueId) for r in read}) >= 4


def test_topic_column_string_body_and_key_arrays(spark, cluster, topic_name):
    first, second = topic_name + "_x", topic_name + "_y"
    for topic in (first, second):
        cluster.create_topic(topic)
    df = spark.createDataFrame(
        [(first if i % 2 else second, f"text-{i}", [f"a{i}", f"b{i}"]) for i in range(40)],
        "topic string, body string, keys array<string>")

    writer(df, cluster).save()

    for topic, parity in ((first, 1), (second, 0)):
        read = read_back(spark, cluster, topic)
        assert sorted(r.body for r in read) == sorted(
            f"text-{i}".encode() for i in range(40) if i % 2 == parity)
        assert all(r.keys == f"a{r.body[5:].decode()} b{r.body[5:].decode()}" for r in read)


def test_sharding_key_keeps_each_keys_rows_on_one_queue_in_order(spark, cluster, topic_name):
    cluster.create_topic(topic_name)
    rows = [(f"{key}:{seq}".encode(), key) for seq in range(50) for key in ("k1", "k2", "k3")]
    df = spark.createDataFrame(rows, "body binary, shardingKey string").coalesce(1)

    writer(df, cluster, topic=topic_name, sendBatchSize="8").save()

    read = read_back(spark, cluster, topic_name)
    assert len(read) == 150
    for key in ("k1", "k2", "k3"):
        mine = [r for r in read if r.body.startswith(f"{key}:".encode())]
        assert len({(r.brokerName, r.queueId) for r in mine}) == 1
        in_queue_order = sorted(mine, key=lambda r: r.queueOffset)
        assert [int(r.body.split(b":")[1]) for r in in_queue_order] == list(range(50))


def test_queue_id_and_broker_name_columns_pick_the_queue(spark, cluster, topic_name):
    cluster.create_topic(topic_name)
    df = spark.createDataFrame(
        [(b"to-b2", 2, "broker-b"), (b"to-a1", 1, "broker-a"), (b"to-first-3", 3, None)],
        "body binary, queueId int, brokerName string")

    writer(df, cluster, topic=topic_name).save()

    placed = {r.body: (r.brokerName, r.queueId) for r in read_back(spark, cluster, topic_name)}
    assert placed == {b"to-b2": ("broker-b", 2), b"to-a1": ("broker-a", 1),
                      b"to-first-3": ("broker-a", 3)}


def test_streaming_write_copies_a_topic(spark, cluster, topic_name, tmp_path):
    source, target = topic_name + "_in", topic_name + "_out"
    for topic in (source, target):
        cluster.create_topic(topic)
    cluster.produce(source, [Message(source, f"copy-{i}".encode(), tags="t", keys=[f"c{i}"],
                                     properties={"i": str(i)}) for i in range(150)])

    run_until_terminated(
        lambda: spark.readStream.format("tidemq").option("namesrvAddr", cluster.namesrv_addr)
        .option("subscribe", source).option("startingOffsets", "earliest")
        .option("includeProperties", "true").load()
        .writeStream.format("tidemq").option("namesrvAddr", cluster.namesrv_addr)
        .option("topic", target).option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True).start())

    read = read_back(spark, cluster, target)
    assert sorted(r.body for r in read) == sorted(f"copy-{i}".encode() for i in range(150))
    assert all(r.tags == "t" and r.keys == f"c{r.properties['i']}" for r in read)


def test_input_without_a_body_column_fails_before_any_task(spark, cluster, topic_name):
    df = spark.createDataFrame([("x",)], "payload string")

    with pytest.raises(Exception, match="needs a column 'body'"):
        writer(df, cluster, topic=topic_name).save()


def test_an_empty_body_fails_the_write_naming_the_row(spark, cluster, topic_name):
    cluster.create_topic(topic_name)
    df = spark.createDataFrame([(b"fine",), (b"",)], "body binary").coalesce(1)

    with pytest.raises(Exception, match="has an empty body"):
        writer(df, cluster, topic=topic_name).save()

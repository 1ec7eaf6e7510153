"""Streaming pipeline: errors per service per minute, from JSON log lines in tidemq.

    python examples/log_error_counts.py [--namesrv 127.0.0.1:9876] [--topic AppLogs]
        [--counts-topic ErrorCounts] [--output ./log-pipeline-output] [--follow]

Reads the log topic (``log_app.py`` fills it) with ``readStream.format("tidemq")``, parses each
body as JSON, keeps the ERROR lines and counts them per service in one-minute event-time
windows, with a one-minute watermark so that late lines still count and each window is
final once the watermark passes it. Every closed window goes to two sinks, each its own query
with its own checkpoint:

- the tidemq topic ``--counts-topic``: one message per window and service, body
  ``{"window_start": ..., "window_end": ..., "service": ..., "errors": n}``, key = service,
  tag = ``error-count``;
- Parquet files under ``--output``/counts.

By default each query processes what is in the topic now and stops (``availableNow``); with
``--follow`` they keep running (Ctrl-C to stop). Run it again later: the checkpoints under
``--output``/checkpoints make it go on where it stopped.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

LOG_SCHEMA = "ts timestamp, service string, level string, message string, host string"


def error_counts(spark: SparkSession, namesrv: str, topic: str):
    """The streaming DataFrame of closed (window, service, errors) rows."""
    logs = (spark.readStream.format("tidemq")
            .option("namesrvAddr", namesrv)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("tagExpression", "ERROR")  # the broker filters by tag: only errors travel
            .option("maxOffsetsPerTrigger", 50_000)
            .load())
    lines = logs.select(F.from_json(F.col("body").cast("string"), LOG_SCHEMA).alias("line"))
    return (lines.select("line.*")
            .where(F.col("level") == "ERROR")
            .withWatermark("ts", "1 minute")
            .groupBy(F.window("ts", "1 minute"), "service")
            .count()
            .select(F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"), "service",
                    F.col("count").alias("errors")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namesrv", default="127.0.0.1:9876")
    parser.add_argument("--topic", default="AppLogs")
    parser.add_argument("--counts-topic", default="ErrorCounts")
    parser.add_argument("--output", default="log-pipeline-output")
    parser.add_argument("--follow", action="store_true", help="keep running (Ctrl-C to stop)")
    args = parser.parse_args()
    output = Path(args.output).resolve()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("log-error-counts")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    from tidemq.sync import Admin

    with Admin(args.namesrv) as admin:
        admin.create_topic(args.counts_topic, 4)

    counts = error_counts(spark, args.namesrv, args.topic)
    to_topic = (counts.select(
                    F.to_json(F.struct("window_start", "window_end", "service", "errors"))
                    .alias("body"),
                    F.col("service").alias("keys"),
                    F.lit("error-count").alias("tags"))
                .writeStream.format("tidemq")
                .option("namesrvAddr", args.namesrv)
                .option("topic", args.counts_topic)
                .option("checkpointLocation", str(output / "checkpoints" / "to-topic"))
                .outputMode("append"))
    to_files = (counts.writeStream.format("parquet")
                .option("path", str(output / "counts"))
                .option("checkpointLocation", str(output / "checkpoints" / "to-files"))
                .outputMode("append"))
    if not args.follow:
        to_topic, to_files = to_topic.trigger(availableNow=True), to_files.trigger(
            availableNow=True)
    queries = [to_topic.start(), to_files.start()]
    try:
        for query in queries:
            query.awaitTermination()
    except KeyboardInterrupt:
        for query in queries:
            query.stop()
    written = spark.read.parquet(str(output / "counts")) if (output / "counts").exists() \
        else None
    if written is not None:
        written.orderBy("window_start", "service").show(20, truncate=False)
    print(f"error counts per service per minute went to tidemq topic {args.counts_topic} at "
          f"{args.namesrv} (read them with: tidemq admin queryMsgByKey -t {args.counts_topic} "
          f"-k checkout) and to Parquet files under {output / 'counts'}; checkpoints under "
          f"{output / 'checkpoints'}")
    spark.stop()


if __name__ == "__main__":
    main()

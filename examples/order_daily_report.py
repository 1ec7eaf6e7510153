"""Batch job: a daily report of the order events stored in tidemq during one day.

    python examples/order_daily_report.py [--namesrv 127.0.0.1:9876] [--topic OrderEvents]
        [--day 2024-05-01] [--output ./order-report-output]

Reads the messages the brokers stored during ``--day`` (UTC; default today) with
``spark.read.format("tidemq")`` and ``startingTimestamp`` / ``endingTimestamp`` (the brokers
find the first offset stored at each bound, so only that day's messages are pulled), parses
the JSON bodies and writes two tables, as CSV with a header, under ``--output``/``<day>``:

- ``summary``: per event type (created, paid, refunded), the number of events and the amount;
- ``top_customers``: the ten customers who paid the most, net of refunds.

Both are printed too.
"""

from __future__ import annotations

import argparse
import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

EVENT_SCHEMA = ("order_id string, customer string, event string, amount double, "
                "currency string, ts timestamp")


def day_bounds_ms(day: date) -> tuple[int, int]:
    """Milliseconds since the epoch of the day's first instant and the next day's (UTC)."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return (int(start.timestamp() * 1000),
            int((start + timedelta(days=1)).timestamp() * 1000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namesrv", default="127.0.0.1:9876")
    parser.add_argument("--topic", default="OrderEvents")
    parser.add_argument("--day", type=date.fromisoformat, default=datetime.now(UTC).date())
    parser.add_argument("--output", default="order-report-output")
    args = parser.parse_args()
    output = Path(args.output).resolve() / args.day.isoformat()
    start_ms, end_ms = day_bounds_ms(args.day)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("order-daily-report")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")

    events = (spark.read.format("tidemq")
              .option("namesrvAddr", args.namesrv)
              .option("subscribe", args.topic)
              .option("startingTimestamp", start_ms)
              .option("endingTimestamp", end_ms)
              .load()
              .select(F.from_json(F.col("body").cast("string"), EVENT_SCHEMA).alias("e"))
              .select("e.*")
              .cache())
    summary = (events.groupBy("event")
               .agg(F.count("*").alias("events"), F.round(F.sum("amount"), 2).alias("amount"))
               .orderBy("event"))
    signed = F.when(F.col("event") == "paid", F.col("amount")) \
        .when(F.col("event") == "refunded", -F.col("amount")).otherwise(0.0)
    top_customers = (events.groupBy("customer")
                     .agg(F.round(F.sum(signed), 2).alias("net_paid"))
                     .orderBy(F.desc("net_paid"), "customer").limit(10))

    for name, table in (("summary", summary), ("top_customers", top_customers)):
        table.coalesce(1).write.mode("overwrite").option("header", True).csv(str(output / name))
        print(f"{name} of {args.day}:")
        table.show(truncate=False)
    print(f"report of {events.count()} order events stored on {args.day} (UTC) in topic "
          f"{args.topic} went to {output / 'summary'} and {output / 'top_customers'} (CSV)")
    spark.stop()


if __name__ == "__main__":
    main()

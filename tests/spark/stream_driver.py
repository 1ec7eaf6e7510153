"""A Spark driver the crash test starts as a child process and SIGKILLs mid-batch.

    python stream_driver.py NAMESRV TOPIC CHECKPOINT OUTPUT SCRATCH MAX_OFFSETS BATCH_DELAY_S

Runs a streaming query from a tidemq topic to a Parquet file sink with a checkpoint, at most
MAX_OFFSETS offsets per micro-batch, each batch slowed down by about BATCH_DELAY_S seconds
(a Python UDF sleeps per row) so the parent has time to kill the process while a batch is in
flight. It runs until killed, or for at most RUN_TIME_MAX_S.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pyspark.sql.functions import udf
from spark_session import build_spark_session
from streaming_queries import run_until_terminated

RUN_TIME_MAX_S = 300  # a bound: the parent kills it long before


def main() -> None:
    namesrv, topic, checkpoint, output, scratch, max_offsets, delay_s = sys.argv[1:8]
    spark = build_spark_session(Path(scratch))
    source = (spark.readStream.format("tidemq").option("namesrvAddr", namesrv)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", max_offsets).load())
    delay_per_row_s = float(delay_s) / float(max_offsets)

    @udf("binary")
    def slowly(body):
        time.sleep(delay_per_row_s)  # a slow transformation: the batch stays in flight a while
        return body

    def start():
        query = (source.select("msgId", "brokerName", "queueId", "queueOffset",
                               slowly("body").alias("body"))
                 .writeStream.format("parquet").option("path", output)
                 .option("checkpointLocation", checkpoint).start())
        print("query started", flush=True)
        return query

    run_until_terminated(start, RUN_TIME_MAX_S)


if __name__ == "__main__":
    main()

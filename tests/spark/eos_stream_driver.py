"""A Spark driver the exactly-once crash test starts as a child process; it crashes itself.

    python eos_stream_driver.py NAMESRV SOURCE TARGET CHECKPOINT SCRATCH MAX_OFFSETS \
        CRASH_BATCH CRASH_POINT TIMEOUT_MS

Copies SOURCE to TARGET with the exactly-once sink (``tidemq_crashing``, crashing_sink.py)
from a checkpoint, MAX_OFFSETS offsets per micro-batch, ``availableNow``. In micro-batch
CRASH_BATCH it SIGKILLs its own process group at CRASH_POINT. It exits 0 if the query ends
first, and runs at most RUN_TIME_MAX_S.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from crashing_sink import PGID_ENV, CrashingTidemq
from spark_session import build_spark_session
from streaming_queries import run_until_terminated

RUN_TIME_MAX_S = 240  # a bound: the crash comes long before


def main() -> None:
    (namesrv, source, target, checkpoint, scratch, max_offsets, crash_batch, crash_point,
     timeout_ms) = sys.argv[1:10]
    os.environ[PGID_ENV] = str(os.getpgid(0))  # inherited by the JVM and its Python workers
    spark = build_spark_session(Path(scratch))
    spark.dataSource.register(CrashingTidemq)
    def start():
        query = (spark.readStream.format("tidemq").option("namesrvAddr", namesrv)
                 .option("subscribe", source).option("startingOffsets", "earliest")
                 .option("maxOffsetsPerTrigger", max_offsets).load().select("body")
                 .writeStream.format("tidemq_crashing").option("namesrvAddr", namesrv)
                 .option("topic", target).option("exactlyOnce", "true")
                 .option("exactlyOnce.timeoutMs", timeout_ms)
                 .option("crashBatch", crash_batch).option("crashPoint", crash_point)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        print("query started", flush=True)
        return query

    run_until_terminated(start, RUN_TIME_MAX_S)


if __name__ == "__main__":
    main()

"""``format("tidemq_crashing")``: the tidemq sink with a crash point, for the crash test only.

The child driver of test_exactly_once_crash.py registers this data source. Its stream writer
is tidemq's, except that in micro-batch ``crashBatch`` it SIGKILLs the whole driver (the
process group named by $TIDEMQ_TEST_DRIVER_PGID: the driver, its JVM and Python workers)
at ``crashPoint``:

- ``in_tasks``: a write task has stored its rows as half messages, nothing is committed;
- ``before_commit``: every task finished, the driver has not committed on any broker;
- ``between_brokers``: the driver committed on the first broker (by name) only;
- ``after_commit``: the brokers committed, Spark has not recorded the batch.

The test picks the batch and the point from its seed.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pyspark_tidemq.exactly_once import ExactlyOnceCommitMessage
from pyspark_tidemq.options import parse_sink_options
from pyspark_tidemq.source import TidemqDataSource
from pyspark_tidemq.writer import TidemqStreamWriter

PGID_ENV = "TIDEMQ_TEST_DRIVER_PGID"
MARKER_ENV = "TIDEMQ_TEST_CRASH_MARKER"  # a file the crash writes where it happened
CRASH_POINTS = ("in_tasks", "before_commit", "between_brokers", "after_commit")


def crash(where: str) -> None:
    # Workers' stdout goes to the JVM, so the test learns where the crash happened from a file.
    with open(os.environ[MARKER_ENV], "w") as marker:
        marker.write(f"crash point reached: {where}\n")
    os.killpg(int(os.environ[PGID_ENV]), signal.SIGKILL)


class CrashingTidemq(TidemqDataSource):
    """tidemq's data source whose stream writer crashes the driver once (module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "tidemq_crashing"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = dict(self.options)
        batch = int(options.pop("crashbatch"))
        point = options.pop("crashpoint")
        assert point in CRASH_POINTS, point
        return CrashingStreamWriter(parse_sink_options(options), schema, batch, point)


class CrashingStreamWriter(TidemqStreamWriter):
    def __init__(self, options, schema: StructType, crash_batch: int, crash_point: str):
        super().__init__(options, schema)
        self.crash_batch = crash_batch
        self.crash_point = crash_point

    def _crashes(self, batch_id: int, point: str) -> bool:
        return batch_id == self.crash_batch and self.crash_point == point

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        report = super().write(iterator)
        batch_text = TaskContext.get().getLocalProperty("streaming.sql.batchId")
        if self._crashes(int(batch_text), "in_tasks"):
            crash(f"batch {batch_text}: halves stored by a task")
        return report

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self._crashes(batchId, "before_commit"):
            crash(f"batch {batchId}: before any broker commit")
        if self._crashes(batchId, "between_brokers"):
            reports = [m for m in messages if isinstance(m, ExactlyOnceCommitMessage)]
            first = min(b for r in reports for b, h in r.halves.items() if h.count)
            for report in reports:
                report.halves = {b: h for b, h in report.halves.items() if b == first}
            super().commit(reports, batchId)
            crash(f"batch {batchId}: committed on {first} only")
        super().commit(messages, batchId)
        if self._crashes(batchId, "after_commit"):
            crash(f"batch {batchId}: committed on the brokers, not in the checkpoint")

"""``spark.readStream.format("tidemq")``: micro-batches over per-queue offsets.

Theory of operation
-------------------
Spark drives this reader from one long-lived Python process on the driver, and keeps the
offsets in its checkpoint (the source of truth; see ``offsets`` for the JSON form):

- ``initialOffset()``: where a new query starts. ``latest`` and ``startingTimestamp`` are
  resolved once and kept, because Spark may ask again (twice for batch 0).
- ``latestOffset(start, limit)``: the end of the next micro-batch. Each call lists the
  queues again (a topic that grew, or a new topic matching ``subscribePattern``, is picked up;
  new queues start at their earliest offset) and caps the batch at ``limit`` offsets
  (``maxOffsetsPerTrigger``, spread over queues by backlog). Under
  ``trigger(availableNow=True)`` the end never goes past the offsets seen when the query
  started.
- ``partitions(start, end)``: one ``QueueRange`` per queue that moved, split as the options
  ask. Spark calls it again with the same offsets when it re-runs a batch after a crash, and
  the ranges are the same, which is what makes a replay read the same messages.
- ``read(partition)`` runs in executors on a copy of this reader: it opens its own client.
- ``commit(end)``: the batch ending at ``end`` is done. With ``consumerGroup`` the offsets are
  written to the brokers as that group's, so ``tidemq admin consumerProgress`` and lag tools
  see the pipeline. Spark calls ``commit`` for a batch only when it plans the next one, so
  the last batch before a pause (or the end of an availableNow run) would stay uncommitted;
  but Spark runs batches one after the other, so the ``start`` of ``latestOffset`` is always
  the end of a finished batch, and it is committed there too (each offset set once). The
  checkpoint stays the source of truth: a failed commit is logged, not raised, and a
  restarted query never reads these offsets back.

The driver-side admin client lives in ``_catalog`` and is left out when Spark pickles the
reader for executors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pyspark_tidemq.catalog import QueueBounds, QueueCatalog
from pyspark_tidemq.errors import DataLossError
from pyspark_tidemq.offsets import (
    QueueOffsets,
    QueueRange,
    limit_by_backlog,
    offsets_from_json,
    offsets_to_json,
    ranges_between,
    split_ranges,
)
from pyspark_tidemq.options import OffsetKind, SourceOptions
from pyspark_tidemq.range_reader import read_queue_range
from tidemq.client.message import MessageQueue

log = logging.getLogger("pyspark_tidemq")


class TidemqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reads of tidemq queues with admission control and availableNow.

    Args:
        options: validated source options (``parse_source_options(..., streaming=True)``).
    """

    def __init__(self, options: SourceOptions):
        self.options = options
        self._catalog: QueueCatalog | None = None
        self._initial: QueueOffsets | None = None
        self._latest: QueueOffsets | None = None
        self._bounds: dict[MessageQueue, QueueBounds] = {}
        self._available_now_target: QueueOffsets | None = None
        self._committed: QueueOffsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_catalog"] = None  # connections stay on the driver
        return state

    @property
    def catalog(self) -> QueueCatalog:
        """The driver's queue catalog, opened on first use."""
        if self._catalog is None:
            self._catalog = QueueCatalog(self.options, missing_ok=True)
        return self._catalog

    # -- offsets ---------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        """Where a query without a checkpoint starts (resolved once, then kept)."""
        if self._initial is None:
            options = self.options
            bounds = self._refresh_bounds()
            self._initial = self.catalog.resolve(
                options.starting_offsets, options.starting_timestamp_ms, bounds,
                default=OffsetKind.EARLIEST,
            )
        return offsets_to_json(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` as a row limit, else everything available."""
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit is not None else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next micro-batch: at most ``limit`` offsets past ``start``."""
        start_offsets = offsets_from_json(start, what="start offsets")
        self._commit_processed(start_offsets)
        if self._available_now_target is not None:
            latest = self._available_now_target
        else:
            latest = {q: b.max_offset for q, b in self._refresh_bounds().items()}
        self._latest = latest
        begin = self._with_new_queues(start_offsets, latest)
        end = limit_by_backlog(begin, latest, _max_rows(limit))
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict | None:
        """The newest offsets seen by the last ``latestOffset`` (for query progress)."""
        return offsets_to_json(self._latest) if self._latest is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end of an availableNow run at the queues' current max offsets."""
        self._available_now_target = {
            q: b.max_offset for q, b in self._refresh_bounds().items()
        }

    def _refresh_bounds(self) -> dict[MessageQueue, QueueBounds]:
        self._bounds = self.catalog.queue_bounds()
        return self._bounds

    def _with_new_queues(self, start: QueueOffsets, latest: QueueOffsets) -> QueueOffsets:
        """``start`` plus every queue of ``latest`` it lacks (at its earliest offset), with
        queues whose offsets went backwards handled per failOnDataLoss."""
        begin = dict(start)
        for queue, newest in latest.items():
            if queue not in begin:
                bounds = self._bounds.get(queue)
                begin[queue] = bounds.min_offset if bounds is not None else 0
                log.info("reading new queue %s from offset %d", queue, begin[queue])
            elif newest < begin[queue]:
                # The queue was deleted and re-created: what it held before is gone, and
                # what it holds now starts again from its earliest offset.
                bounds = self._bounds.get(queue)
                earliest = bounds.min_offset if bounds is not None else 0
                what = (f"queue {queue} now ends at offset {newest}, before offset "
                        f"{begin[queue]} this query already read up to (was the topic "
                        "deleted and re-created?)")
                if self.options.fail_on_data_loss:
                    raise DataLossError(
                        f"{what}; set option failOnDataLoss=false to go on from its earliest "
                        f"offset {earliest}"
                    )
                log.warning("%s; going on from its earliest offset %d (failOnDataLoss=false)",
                            what, earliest)
                begin[queue] = earliest
        return begin

    # -- partitions and reads --------------------------------------------------------------

    def partitions(self, start: dict, end: dict) -> list[QueueRange]:
        """The ranges of the micro-batch from ``start`` to ``end`` (the same on a re-run)."""
        start_offsets = offsets_from_json(start, what="start offsets")
        end_offsets = offsets_from_json(end, what="end offsets")
        needs_earliest = any(q not in start_offsets or end_offsets[q] < start_offsets[q]
                             for q in end_offsets)  # new or re-created queues
        if needs_earliest and not self._bounds:
            self._refresh_bounds()  # a re-run after a driver restart
        earliest = {q: b.min_offset for q, b in self._bounds.items()}
        ranges = ranges_between(start_offsets, end_offsets, earliest=earliest)
        return split_ranges(ranges, min_partitions=self.options.min_partitions,
                            max_records_per_partition=self.options.max_records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The messages of one range as Arrow record batches (runs in executors)."""
        assert isinstance(partition, QueueRange), partition
        return read_queue_range(self.options, partition)

    def commit(self, end: dict) -> None:
        """Spark finished the batch ending at ``end``: commit it for ``consumerGroup``."""
        self._commit_processed(offsets_from_json(end, what="committed offsets"))

    def _commit_processed(self, offsets: QueueOffsets) -> None:
        if self.options.consumer_group is None or offsets == self._committed:
            return
        try:
            self.catalog.commit(offsets)
        except Exception as e:  # the checkpoint holds the truth; lag tools catch up next time
            log.warning("committing offsets of consumer group %s failed (the query goes on; "
                        "its checkpoint is unaffected): %s", self.options.consumer_group, e)
            return
        self._committed = offsets

    def stop(self) -> None:
        """Close the driver's clients."""
        if self._catalog is not None:
            self._catalog.close()
            self._catalog = None


def _max_rows(limit: ReadLimit) -> int | None:
    if isinstance(limit, ReadMaxRows):
        return limit.max_rows
    return None

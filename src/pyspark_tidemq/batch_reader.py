"""``spark.read.format("tidemq")``: read fixed offset ranges of queues once.

``partitions()`` runs on the driver when Spark plans the query: it finds the queues, resolves
startingOffsets/startingTimestamp and endingOffsets/endingTimestamp into concrete offsets, and
returns one ``QueueRange`` per queue (cut further by maxRecordsPerPartition and
minPartitions). ``read()`` runs in executors on a copy of this reader; it opens its own client
for its range (``range_reader.read_queue_range``). The reader keeps nothing but its options, so
it pickles.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from pyspark_tidemq.catalog import QueueCatalog
from pyspark_tidemq.errors import InvalidOption
from pyspark_tidemq.offsets import QueueRange, ranges_between, split_ranges
from pyspark_tidemq.options import OffsetKind, SourceOptions
from pyspark_tidemq.range_reader import read_queue_range


class TidemqBatchReader(DataSourceReader):
    """Plans and reads a batch query over tidemq queues.

    Args:
        options: validated source options (``parse_source_options(..., streaming=False)``).
    """

    def __init__(self, options: SourceOptions):
        self.options = options

    def partitions(self) -> list[QueueRange]:
        """One range per queue with something to read, split as the options ask.

        Raises:
            NoRouteError: a topic or assigned queue does not exist.
            InvalidOption: a queue's resolved start is after its end.
        """
        options = self.options
        with QueueCatalog(options, missing_ok=False) as catalog:
            bounds = catalog.queue_bounds()
            start = catalog.resolve(options.starting_offsets, options.starting_timestamp_ms,
                                    bounds, default=OffsetKind.EARLIEST)
            end = catalog.resolve(options.ending_offsets, options.ending_timestamp_ms,
                                  bounds, default=OffsetKind.LATEST)
        for queue, first in start.items():
            if first > end[queue]:
                raise InvalidOption(
                    f"queue {queue} would start at offset {first}, after its end offset "
                    f"{end[queue]} (it holds [{bounds[queue].min_offset}, "
                    f"{bounds[queue].max_offset})); check startingOffsets / endingOffsets"
                )
        return split_ranges(ranges_between(start, end),
                            min_partitions=options.min_partitions,
                            max_records_per_partition=options.max_records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The messages of one range as Arrow record batches."""
        if not isinstance(partition, QueueRange):
            return iter(())  # Spark's stand-in partition when there is nothing to read
        return read_queue_range(self.options, partition)

"""``TidemqDataSource``: the ``format("tidemq")`` entry point Spark finds and calls.

Spark creates the data source with the user's options on the driver and asks it for a
schema and a reader or writer; each method checks the options of its role there, so a bad
option fails before any task starts. Everything it returns pickles (no clients inside).
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pyspark_tidemq.batch_reader import TidemqBatchReader
from pyspark_tidemq.options import parse_sink_options, parse_source_options
from pyspark_tidemq.schema import spark_schema
from pyspark_tidemq.stream_reader import TidemqStreamReader
from pyspark_tidemq.writer import TidemqBatchWriter, TidemqStreamWriter

FORMAT_NAME = "tidemq"


class TidemqDataSource(DataSource):
    """Read tidemq topics into Spark, batch or streaming, and write rows to them.

    See ``pyspark_tidemq.options`` for the options and ``pyspark_tidemq.schema`` /
    ``pyspark_tidemq.sink_rows`` for the columns read and written.
    """

    @classmethod
    def name(cls) -> str:
        """The short name: ``spark.read.format("tidemq")``."""
        return FORMAT_NAME

    def _include_properties(self) -> bool:
        value = str(self.options.get("includeProperties", "false")).strip().lower()
        return value == "true"

    def schema(self) -> StructType:
        """The columns read (``properties`` only with ``includeProperties=true``)."""
        return spark_schema(self._include_properties())

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader (options checked here).

        Raises:
            InvalidOption: an option is missing, unknown or malformed.
        """
        return TidemqBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A micro-batch reader (options checked here).

        Raises:
            InvalidOption: an option is missing, unknown or malformed.
        """
        return TidemqStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch writer; ``overwrite`` appends too (a topic cannot be truncated).

        Raises:
            InvalidOption / InvalidSinkInput: a bad option or input column.
        """
        return TidemqBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """A streaming writer (at least once).

        Raises:
            InvalidOption / InvalidSinkInput: a bad option or input column.
        """
        return TidemqStreamWriter(parse_sink_options(self.options), schema)

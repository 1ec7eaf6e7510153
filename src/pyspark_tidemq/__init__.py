"""pyspark_tidemq: tidemq as a PySpark data source and sink, ``format("tidemq")``.

Installed with tidemq's ``spark`` extra (pyspark>=4.2, pyarrow). Spark finds
``DefaultSource`` in every top-level ``pyspark_*`` module, so no ``register()`` is needed::

    df = (spark.read.format("tidemq")
          .option("namesrvAddr", "127.0.0.1:9876").option("subscribe", "Orders").load())

    (spark.readStream.format("tidemq").option("namesrvAddr", "127.0.0.1:9876")
     .option("subscribe", "Logs").option("maxOffsetsPerTrigger", 100000).load())

    df.write.format("tidemq").option("namesrvAddr", "127.0.0.1:9876") \\
        .option("topic", "Counts").mode("append").save()

Layout: ``source`` (the DataSource), ``options`` (checked on the driver), ``catalog``
(driver-side queue and offset lookups), ``offsets`` (offset JSON, partitions, rate limits),
``batch_reader`` / ``stream_reader``, ``range_reader`` (executor-side pulls),
``record_batch`` (pull bodies to Arrow), ``schema``, ``sink_rows`` and ``writer`` (the sink).
"""

from pyspark_tidemq.errors import DataLossError, InvalidOption, InvalidSinkInput
from pyspark_tidemq.source import FORMAT_NAME, TidemqDataSource

DefaultSource = TidemqDataSource

__all__ = [
    "FORMAT_NAME",
    "DataLossError",
    "DefaultSource",
    "InvalidOption",
    "InvalidSinkInput",
    "TidemqDataSource",
]

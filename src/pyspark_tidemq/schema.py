"""The rows the tidemq source produces: one Spark schema, and the Arrow schema it implies.

Spark checks every Arrow record batch a Python source yields against
``to_arrow_schema(schema, timezone="UTC")``: the types must be exactly those below (``int32``
for INT, ``timestamp[us, tz=UTC]`` for TIMESTAMP, a map whose keys are non-null), every field
nullable. ``arrow_schema`` builds that schema by hand so that the executors need no JVM, and a
test checks it against Spark's own conversion.

==============  =====================  ==================================================
column          type                   from the stored message
==============  =====================  ==================================================
topic           STRING                 TOPIC
brokerName      STRING                 the broker group the queue lives on
queueId         INT                    QUEUEID
queueOffset     BIGINT                 QUEUEOFFSET (the logical offset in the queue)
msgId           STRING                 UNIQ_KEY, else the offset message id
keys            STRING                 KEYS (space-separated, as stored), null if absent
tags            STRING                 TAGS, null if absent
body            BINARY                 BODY (zlib bodies decompressed)
bornTimestamp   TIMESTAMP              BORNTIMESTAMP (producer clock)
storeTimestamp  TIMESTAMP              STORETIMESTAMP (broker clock)
properties      MAP<STRING,STRING>     user properties (only with includeProperties=true)
==============  =====================  ==================================================
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

BASE_FIELDS: tuple[tuple[str, object], ...] = (
    ("topic", StringType()),
    ("brokerName", StringType()),
    ("queueId", IntegerType()),
    ("queueOffset", LongType()),
    ("msgId", StringType()),
    ("keys", StringType()),
    ("tags", StringType()),
    ("body", BinaryType()),
    ("bornTimestamp", TimestampType()),
    ("storeTimestamp", TimestampType()),
)
PROPERTIES_FIELD = ("properties", MapType(StringType(), StringType(), valueContainsNull=True))

ARROW_TIMESTAMP = pa.timestamp("us", tz="UTC")
ARROW_PROPERTIES = pa.map_(pa.string(), pa.string())
_ARROW_TYPES = {
    "topic": pa.string(),
    "brokerName": pa.string(),
    "queueId": pa.int32(),
    "queueOffset": pa.int64(),
    "msgId": pa.string(),
    "keys": pa.string(),
    "tags": pa.string(),
    "body": pa.binary(),
    "bornTimestamp": ARROW_TIMESTAMP,
    "storeTimestamp": ARROW_TIMESTAMP,
    "properties": ARROW_PROPERTIES,
}


def spark_schema(include_properties: bool = False) -> StructType:
    """The Spark schema of rows read from tidemq (``properties`` only when asked for)."""
    fields = list(BASE_FIELDS) + ([PROPERTIES_FIELD] if include_properties else [])
    return StructType([StructField(name, data_type, True) for name, data_type in fields])


def arrow_schema(include_properties: bool = False) -> pa.Schema:
    """The Arrow schema Spark expects of record batches with ``spark_schema``'s columns."""
    names = [name for name, _ in BASE_FIELDS]
    if include_properties:
        names.append(PROPERTIES_FIELD[0])
    return pa.schema([pa.field(name, _ARROW_TYPES[name], nullable=True) for name in names])

"""What the sink accepts: its input columns, and Arrow batches turned into messages.

==============  =====================================  ======================================
column          type                                   becomes
==============  =====================================  ======================================
body            BINARY or STRING (UTF-8)  (required)    the message body; must not be empty
topic           STRING                                  the topic (the ``topic`` option wins)
keys            STRING (space-separated) or ARRAY       KEYS (indexed for query by key)
tags            STRING                                  TAGS (consumers filter on it)
properties      MAP<STRING,STRING>                      user properties
queueId         INT                                     send to this queue id (ordered) ...
brokerName      STRING                                  ... on this broker (else the first
                                                        broker, by name, that has the id)
shardingKey     STRING                                  send to the queue the key hashes to
==============  =====================================  ======================================

Other columns are ignored, so a DataFrame read from tidemq can be written back as it is
(``queueOffset``, ``msgId`` and the timestamps are the broker's to assign). Column names match
case-insensitively, as Spark's do. ``queueId`` and ``shardingKey`` exclude each other. System
properties (``TAGS``, ``KEYS``, ``UNIQ_KEY``, ``DELAY``, ...) cannot be set through
``properties``: they have columns of their own or belong to the broker.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from pyspark_tidemq.errors import InvalidSinkInput
from pyspark_tidemq.options import SinkOptions
from pyspark_tidemq.record_batch import SYSTEM_PROPERTIES
from tidemq.limits import PROPERTIES_SIZE_MAX
from tidemq.protocol.message import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_TAGS, encode_properties

_STRING = (StringType,)
_INTEGER = (IntegerType, LongType, ShortType, ByteType)
SINK_COLUMNS: dict[str, str] = {
    "body": "BINARY or STRING",
    "topic": "STRING",
    "keys": "STRING or ARRAY<STRING>",
    "tags": "STRING",
    "properties": "MAP<STRING,STRING>",
    "queueId": "INT",
    "brokerName": "STRING",
    "shardingKey": "STRING",
}

_ZERO_LENGTH = pa.scalar(0, pa.int32())  # built once (see record_batch on kernel arguments)

# A row's route: None (any queue, round robin), a sharding key, or (broker name or None,
# queue id).
Route = None | str | tuple[str | None, int]


@dataclass(frozen=True)
class SinkLayout:
    """Which sink columns the input has, by their names as written in the DataFrame."""

    names: dict[str, str]  # canonical sink column -> the DataFrame's column name
    topic_option: str | None

    def has(self, column: str) -> bool:
        return column in self.names


def _type_ok(column: str, data_type: DataType) -> bool:
    if column == "body":
        return isinstance(data_type, (BinaryType, StringType))
    if column == "keys":
        return isinstance(data_type, StringType) or (
            isinstance(data_type, ArrayType) and isinstance(data_type.elementType, StringType))
    if column == "properties":
        return (isinstance(data_type, MapType) and isinstance(data_type.keyType, StringType)
                and isinstance(data_type.valueType, StringType))
    if column == "queueId":
        return isinstance(data_type, _INTEGER)
    return isinstance(data_type, _STRING)


def sink_layout(schema: StructType, options: SinkOptions) -> SinkLayout:
    """Check the input columns of a write (on the driver) and note which are there.

    Raises:
        InvalidSinkInput: no body column, a sink column of the wrong type, no topic at all,
            or both queueId and shardingKey.
    """
    canonical = {name.lower(): name for name in SINK_COLUMNS}
    names: dict[str, str] = {}
    for field in schema.fields:
        column = canonical.get(field.name.lower())
        if column is None:
            continue
        if not _type_ok(column, field.dataType):
            raise InvalidSinkInput(
                f"column {field.name!r} is {field.dataType.simpleString()}; the tidemq sink "
                f"needs {SINK_COLUMNS[column]} (cast it, or rename it if it is not meant for "
                "the sink)"
            )
        names[column] = field.name
    if "body" not in names:
        raise InvalidSinkInput(
            "the tidemq sink needs a column 'body' (BINARY or STRING); columns given: "
            + ", ".join(schema.fieldNames())
        )
    if options.topic is None and "topic" not in names:
        raise InvalidSinkInput(
            "no topic: set option topic, or give a STRING column 'topic' naming each row's topic"
        )
    if "queueId" in names and "shardingKey" in names:
        raise InvalidSinkInput(
            "columns queueId and shardingKey are both given; keep one (each picks the queue)"
        )
    return SinkLayout(names, options.topic)


@dataclass(frozen=True)
class SinkColumns:
    """One Arrow batch of input rows, as the encoder needs them (row order kept).

    Attributes:
        topics: each row's topic, or None when the ``topic`` option names one for all.
        bodies: each row's body.
        properties: each row's encoded properties string (KEYS, TAGS, user properties), or
            None when no row has any.
        routes: each row's route (a queue id, a sharding key), or None when no row has one.
    """

    topics: list[str] | None
    bodies: list[bytes]
    properties: list[bytes] | None
    routes: list[Route] | None


def batch_columns(batch: pa.RecordBatch, layout: SinkLayout) -> SinkColumns:
    """Take one Arrow batch of input rows apart into the columns the encoder needs.

    Raises:
        InvalidSinkInput: a row has no body or topic, sets a system property, or its
            properties exceed 32767 bytes.
    """
    count = batch.num_rows
    names = layout.names

    def column(name: str) -> list | None:
        actual = names.get(name)
        return batch.column(actual).to_pylist() if actual is not None else None

    body_column = batch.column(names["body"])
    _check_bodies(body_column)
    if not pa.types.is_binary(body_column.type):
        body_column = body_column.cast(pa.binary())  # UTF-8 strings: the same bytes
    bodies = body_column.to_pylist()
    topics = None
    if layout.topic_option is None:
        topic_column = batch.column(names["topic"])
        if topic_column.null_count:
            row = topic_column.is_null().to_pylist().index(True)
            raise InvalidSinkInput(f"row {row} has a null topic and no option topic is set")
        topics = topic_column.to_pylist()
    keys, tags, user = column("keys"), column("tags"), column("properties")
    properties = None
    if keys is not None or tags is not None or user is not None:
        properties = [_properties_bytes(row, keys, tags, user) for row in range(count)]
    routes = _routes(batch, layout, count) if (
        layout.has("shardingKey") or layout.has("queueId")) else None
    return SinkColumns(topics, bodies, properties, routes)


def _properties_bytes(row: int, keys: list | None, tags: list | None,
                      user: list | None) -> bytes:
    properties: dict[str, str] = {}
    row_user = user[row] if user is not None else None
    if row_user:
        properties = dict(row_user)
        _check_properties(row, properties)
    row_keys = keys[row] if keys is not None else None
    if row_keys:
        properties[PROPERTY_KEYS] = (row_keys if isinstance(row_keys, str)
                                     else KEY_SEPARATOR.join(row_keys))
    row_tags = tags[row] if tags is not None else None
    if row_tags:
        properties[PROPERTY_TAGS] = row_tags
    data = encode_properties(properties).encode("utf-8")
    if len(data) > PROPERTIES_SIZE_MAX:
        raise InvalidSinkInput(
            f"row {row}: its keys, tags and properties take {len(data)} bytes, more than the "
            f"limit of {PROPERTIES_SIZE_MAX}; use fewer or shorter properties")
    return data


def _check_bodies(bodies: pa.Array) -> None:
    empty = pc.fill_null(pc.equal(pc.binary_length(bodies), _ZERO_LENGTH), True)
    if pc.any(empty).as_py():
        row = empty.to_pylist().index(True)
        kind = "null" if not bodies[row].is_valid else "empty"
        raise InvalidSinkInput(
            f"row {row} of a batch has an {kind} body; tidemq stores no empty messages "
            "(filter such rows out first)"
        )


def _check_properties(row: int, properties: dict[str, str]) -> None:
    reserved = SYSTEM_PROPERTIES.intersection(properties)
    if reserved:
        raise InvalidSinkInput(
            f"row {row} sets system properties {', '.join(sorted(reserved))} in column "
            "'properties'; use the columns tags / keys for TAGS / KEYS, the others are the "
            "broker's"
        )
    for name, value in properties.items():
        if value is None:
            raise InvalidSinkInput(f"row {row}: property {name!r} is null; give a string")


def _routes(batch: pa.RecordBatch, layout: SinkLayout, count: int) -> list[Route]:
    if layout.has("shardingKey"):
        return batch.column(layout.names["shardingKey"]).to_pylist()
    if layout.has("queueId"):
        queue_ids = batch.column(layout.names["queueId"]).to_pylist()
        brokers = (batch.column(layout.names["brokerName"]).to_pylist()
                   if layout.has("brokerName") else [None] * count)
        return [None if queue_id is None else (broker, queue_id)
                for broker, queue_id in zip(brokers, queue_ids, strict=True)]
    return [None] * count

"""Pull bodies become Arrow batches Spark accepts, with every field of every record intact."""

from __future__ import annotations

import zlib

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema

from pyspark_tidemq import record_batch
from pyspark_tidemq.record_batch import SYSTEM_PROPERTIES, pull_body_to_batch
from pyspark_tidemq.schema import arrow_schema, spark_schema
from tidemq.errors import RemoteProtocolError
from tidemq.protocol.message import (
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_ZLIB,
    encode_properties,
    encode_record,
    pack_host,
)
from tidemq.protocol.msgid import encode_offset_msg_id

pytestmark = pytest.mark.spark

STORE_HOST = "10.1.2.3:10911"


def record(
    queue_offset: int,
    body: bytes = b"hello",
    properties: dict[str, str] | None = None,
    *,
    topic: str = "Orders",
    queue_id: int = 3,
    born_ms: int = 1_700_000_000_000,
    store_ms: int = 1_700_000_000_005,
    born_host: str = "127.0.0.1:5555",
    compress: bool = False,
) -> bytes:
    """One stored record as a broker sends it in a pull."""
    stored = zlib.compress(body) if compress else body
    born_packed, born_port, _ = pack_host(born_host)
    store_packed, store_port, _ = pack_host(STORE_HOST)
    return bytes(encode_record(
        topic=topic.encode(), body=stored,
        properties=encode_properties(properties or {}).encode(),
        queue_id=queue_id, queue_offset=queue_offset, physical_offset=1000 + queue_offset,
        sysflag=(SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_ZLIB) if compress else 0,
        born_timestamp=born_ms, born_host=(born_packed, born_port),
        store_timestamp=store_ms, store_host=(store_packed, store_port),
    ))


def test_arrow_schema_is_the_one_spark_checks_read_batches_against():
    for include_properties in (False, True):
        expected = to_arrow_schema(spark_schema(include_properties), timezone="UTC")
        assert arrow_schema(include_properties).equals(expected)


def test_every_column_is_decoded_from_the_stored_record():
    body = b"".join([
        record(7, b"first", {"KEYS": "k1 k2", "TAGS": "paid", "UNIQ_KEY": "ID-7", "color": "red"},
               born_ms=1_700_000_000_123, store_ms=1_700_000_000_456),
        record(8, b"second", {"WAIT": "true", "size": "L"}),
    ])

    batch = pull_body_to_batch(body, "broker-a", "Orders", include_properties=True)

    assert batch.schema.equals(arrow_schema(True))
    rows = batch.to_pylist()
    assert [r["queueOffset"] for r in rows] == [7, 8]
    first, second = rows
    assert first["topic"] == "Orders" and first["brokerName"] == "broker-a"
    assert first["queueId"] == 3
    assert first["msgId"] == "ID-7"
    assert first["keys"] == "k1 k2" and first["tags"] == "paid"
    assert first["body"] == b"first"
    assert first["bornTimestamp"].timestamp() == 1_700_000_000.123
    assert first["storeTimestamp"].timestamp() == 1_700_000_000.456
    assert first["properties"] == [("color", "red")]
    # No UNIQ_KEY: the message is known by its offset message id, as RocketMQ shows it.
    assert second["msgId"] == encode_offset_msg_id(STORE_HOST, 1008)
    assert second["keys"] is None and second["tags"] is None
    assert second["properties"] == [("size", "L")]


def test_stop_offset_leaves_out_records_at_and_past_the_end_of_the_range():
    body = b"".join(record(offset) for offset in range(10, 20))

    batch = pull_body_to_batch(body, "broker-a", "Orders", stop_offset=15)

    assert batch.column("queueOffset").to_pylist() == [10, 11, 12, 13, 14]


def test_an_empty_body_gives_an_empty_batch_of_the_right_schema():
    batch = pull_body_to_batch(b"", "broker-a", "Orders")

    assert batch.num_rows == 0 and batch.schema.equals(arrow_schema(False))


def test_compressed_bodies_and_ipv6_hosts_are_decoded_the_same_way():
    plain = record(1, b"z" * 5000, {"TAGS": "t", "UNIQ_KEY": "A"})
    compressed = record(2, b"y" * 5000, {"TAGS": "t", "UNIQ_KEY": "B"}, compress=True)
    ipv6 = record(3, b"v6", {"UNIQ_KEY": "C"}, born_host="[::1]:7000")

    rows = pull_body_to_batch(plain + compressed + ipv6, "b", "Orders").to_pylist()

    assert [r["body"] for r in rows] == [b"z" * 5000, b"y" * 5000, b"v6"]
    assert [r["msgId"] for r in rows] == ["A", "B", "C"]


def test_records_of_another_topic_keep_their_own_topic():
    # Never the case for a queue's pull, but the stored topic is what a row must show.
    body = record(1, topic="Orders") + record(2, topic="Refunds")

    rows = pull_body_to_batch(body, "b", "Orders").to_pylist()

    assert [r["topic"] for r in rows] == ["Orders", "Refunds"]


def test_a_malformed_record_raises_naming_the_problem():
    good = record(1)
    broken = bytearray(record(2))
    broken[4:8] = b"\x00\x00\x00\x01"  # not the v1 magic code

    with pytest.raises(RemoteProtocolError, match="magic"):
        pull_body_to_batch(good + bytes(broken), "b", "Orders")


def test_a_cut_record_raises():
    whole = record(1, b"x" * 100)

    with pytest.raises(RemoteProtocolError):
        pull_body_to_batch(whole + whole[:50], "b", "Orders")


def test_system_properties_stay_out_of_the_properties_column():
    reserved = {name: "v" for name in sorted(SYSTEM_PROPERTIES)}

    rows = pull_body_to_batch(record(1, properties={**reserved, "mine": "yes"}), "b", "Orders",
                              include_properties=True).to_pylist()

    assert rows[0]["properties"] == [("mine", "yes")]


_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                       blacklist_characters="\x00\x01\x02"),
                min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(st.lists(
    st.tuples(st.binary(min_size=1, max_size=300),
              st.dictionaries(_text, _text, max_size=4),
              st.booleans()),
    min_size=1, max_size=20,
))
def test_fast_and_careful_decoding_agree(messages):
    # The fast columnar path handles plain IPv4 records; one compressed record sends the
    # whole body down the record-by-record path. Both must give the same rows.
    plain = b"".join(record(i, body, props) for i, (body, props, _) in enumerate(messages))
    mixed = b"".join(record(i, body, props, compress=compress)
                     for i, (body, props, compress) in enumerate(messages))

    # Called directly so the test fails if plain records ever leave the fast path.
    fast = record_batch._fast_batch(plain, "b", "Orders", True, None)
    careful = pull_body_to_batch(mixed + record(len(messages), b"end", compress=True), "b",
                                 "Orders", include_properties=True).slice(0, len(messages))

    assert fast.to_pylist() == careful.to_pylist()
    for row, (body, props, _) in zip(fast.to_pylist(), messages, strict=True):
        assert row["body"] == body
        expected = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES}
        assert dict(row["properties"]) == expected


def test_batches_are_arrow_record_batches():
    assert isinstance(pull_body_to_batch(record(0), "b", "Orders"), pa.RecordBatch)

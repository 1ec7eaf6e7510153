"""The stored message record, properties, Java string hash and batch body (docs/protocol.md §6)."""

import contextlib
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import LocalProtocolError, RemoteProtocolError
from tidemq.protocol.message import (
    BATCH_ENTRY_FIXED_SIZE,
    MAGIC_V1,
    RECORD_FIXED_SIZE_IPV4,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_ZLIB,
    SYSFLAG_STOREHOST_V6,
    TRANSACTION_COMMIT_TYPE,
    BatchEntry,
    body_crc,
    decode_batch_body,
    decode_properties,
    decode_record,
    decode_records,
    encode_batch_body,
    encode_properties,
    encode_record,
    java_string_hash,
    pack_host,
    record_size,
    store_timestamp_position,
    tags_code,
)


def make_record(
    *, topic="Orders", body=b"hello", properties=None, born="10.0.0.7:51000",
    store="172.16.0.1:10911", sysflag=0, queue_id=0, **fields,
) -> bytearray:
    born_address, born_port, _ = pack_host(born)
    store_address, store_port, _ = pack_host(store)
    props = encode_properties(properties if properties is not None else {"TAGS": "paid"})
    return encode_record(
        topic=topic.encode(), body=body, properties=props.encode(), sysflag=sysflag,
        queue_id=queue_id, born_host=(born_address, born_port),
        store_host=(store_address, store_port), **fields,
    )


# -- Java String.hashCode -----------------------------------------------------------------------


def reference_java_hash(text: str) -> int:
    value = 0
    encoded = text.encode("utf-16-be")
    for index in range(0, len(encoded), 2):
        value = (value * 31 + int.from_bytes(encoded[index : index + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("TagA", 2598919),
        ("*", 42),
        ("polygenelubricants", -2147483648),
        ("", 0),
        ("\U0001F600", 1772899),  # one non-BMP character = two UTF-16 units 0xD83D 0xDE00
        ("Ab\U0001F600é", reference_java_hash("Ab\U0001F600é")),
    ],
)
def test_java_string_hash_vectors(text, expected):
    assert java_string_hash(text) == expected


@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=50))
def test_java_string_hash_matches_the_definition(text):
    assert java_string_hash(text) == reference_java_hash(text)


def test_java_string_hash_of_a_long_string_matches_the_definition():
    text = "tag-é-\U0001F600" * 700  # beyond the precomputed weights
    assert java_string_hash(text) == reference_java_hash(text)


def test_tags_code_is_zero_without_tags():
    assert tags_code(None) == 0
    assert tags_code("") == 0
    assert tags_code("TagA") == 2598919


# -- properties ---------------------------------------------------------------------------------


def test_properties_string_uses_rocketmq_separators():
    text = encode_properties({"TAGS": "paid", "KEYS": "o-1 o-2", "SKIP": None})
    assert text == "TAGS\x01paid\x02KEYS\x01o-1 o-2"
    assert decode_properties(text) == {"TAGS": "paid", "KEYS": "o-1 o-2"}
    assert encode_properties({}) == encode_properties(None) == ""
    assert decode_properties("") == {}


def test_properties_decode_ignores_malformed_pieces_and_trailing_separator():
    text = "TAGS\x01paid\x02\x02noseparator\x02\x01novalue\x02nokey\x01\x02KEYS\x01k\x02"
    assert decode_properties(text) == {"TAGS": "paid", "KEYS": "k"}


names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), min_size=1
)


@given(st.dictionaries(names, names, max_size=8))
def test_properties_round_trip(properties):
    assert decode_properties(encode_properties(properties)) == properties


# -- stored record ------------------------------------------------------------------------------


def test_ipv4_record_has_rocketmq_size_and_fixed_positions():
    record = make_record(body=b"hello", properties={"TAGS": "paid"}, queue_offset=7,
                         physical_offset=4096, store_timestamp=1_700_000_000_123)
    assert len(record) == RECORD_FIXED_SIZE_IPV4 + 5 + len("Orders") + len("TAGS\x01paid")
    assert len(record) == record_size(5, 6, 9)
    assert struct.unpack_from(">ii", record, 0) == (len(record), MAGIC_V1)
    assert struct.unpack_from(">q", record, 20)[0] == 7
    assert struct.unpack_from(">q", record, 28)[0] == 4096
    assert struct.unpack_from(">q", record, store_timestamp_position(0))[0] == 1_700_000_000_123
    assert struct.unpack_from(">i", record, 8)[0] == body_crc(b"hello")
    assert body_crc(b"hello") == zlib.crc32(b"hello") & 0x7FFFFFFF


def test_record_round_trips_every_field():
    record = make_record(
        topic="Orders", body=b"\x00body\xff", properties={"TAGS": "paid", "KEYS": "a b"},
        queue_id=3, flag=9, queue_offset=11, physical_offset=2**40, sysflag=TRANSACTION_COMMIT_TYPE,
        born_timestamp=1_700_000_000_000, store_timestamp=1_700_000_000_005, reconsume_times=2,
        prepared_transaction_offset=512,
    )
    message = decode_record(record)
    assert message.topic == "Orders"
    assert message.body == b"\x00body\xff"
    assert message.properties == {"TAGS": "paid", "KEYS": "a b"}
    assert message.tags == "paid" and message.keys == ["a", "b"]
    assert (message.queue_id, message.flag, message.queue_offset) == (3, 9, 11)
    assert message.physical_offset == 2**40
    assert message.transaction_type == TRANSACTION_COMMIT_TYPE
    assert message.born_timestamp == 1_700_000_000_000
    assert message.store_timestamp == 1_700_000_000_005
    assert message.born_host == "10.0.0.7:51000"
    assert message.store_host == "172.16.0.1:10911"
    assert message.reconsume_times == 2
    assert message.prepared_transaction_offset == 512
    assert message.body_crc == body_crc(b"\x00body\xff")
    assert message.store_size == len(record)


@pytest.mark.parametrize(
    ("born", "store", "flags"),
    [
        ("[2001:db8::1]:51000", "172.16.0.1:10911", SYSFLAG_BORNHOST_V6),
        ("10.0.0.7:51000", "[::1]:10911", SYSFLAG_STOREHOST_V6),
        ("[fe80::2]:1", "[2001:db8::9]:10911", SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6),
    ],
)
def test_ipv6_hosts_grow_the_record_and_set_their_sysflag_bits(born, store, flags):
    record = make_record(born=born, store=store, store_timestamp=123)
    message = decode_record(record)
    assert message.born_host == born
    assert message.store_host == store
    assert message.sysflag & (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6) == flags
    grown = 12 * bin(flags).count("1")
    assert len(record) == RECORD_FIXED_SIZE_IPV4 + grown + 5 + 6 + len("TAGS\x01paid")
    assert struct.unpack_from(">q", record, store_timestamp_position(message.sysflag))[0] == 123


def test_compressed_body_is_stored_compressed_and_read_back_plain():
    plain = b"payload " * 1000
    stored = zlib.compress(plain, 5)
    for sysflag in (SYSFLAG_COMPRESSED, SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_ZLIB):
        message = decode_record(make_record(body=stored, sysflag=sysflag))
        assert message.body == stored
        assert message.body_crc == body_crc(stored)
        assert message.uncompressed_body() == plain
    assert decode_record(make_record(body=b"plain")).uncompressed_body() == b"plain"


def test_unsupported_or_corrupt_compression_raises_protocol_error():
    lz4 = decode_record(make_record(body=b"x", sysflag=SYSFLAG_COMPRESSED | 0x100))
    with pytest.raises(RemoteProtocolError, match="type 1"):
        lz4.uncompressed_body()
    corrupt = decode_record(make_record(body=b"not zlib", sysflag=SYSFLAG_COMPRESSED))
    with pytest.raises(RemoteProtocolError, match="does not decompress"):
        corrupt.uncompressed_body()


def test_concatenated_records_decode_in_order():
    records = [make_record(body=f"m{i}".encode(), queue_offset=i) for i in range(5)]
    messages = decode_records(b"".join(records))
    assert [m.body for m in messages] == [f"m{i}".encode() for i in range(5)]
    assert [m.queue_offset for m in messages] == list(range(5))
    assert decode_records(b"") == []


def test_record_limits_are_checked_on_encode():
    with pytest.raises(LocalProtocolError, match="127"):
        make_record(topic="t" * 128)
    make_record(topic="t" * 127)
    with pytest.raises(LocalProtocolError, match="32767"):
        make_record(properties={"K": "v" * 32767})


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda r: r[:7], "cut"),
        (lambda r: r[:4] + b"\x00\x00\x00\x00" + r[8:], "magic"),
        (lambda r: r[:-1], "claims"),
        (lambda r: struct.pack(">i", 50) + r[4:], "claims 50"),
        (lambda r: struct.pack(">i", -1) + r[4:], "claims -1"),
        (lambda r: r[:84] + struct.pack(">i", 10_000) + r[88:], "body length 10000"),
        (lambda r: r[:84] + struct.pack(">i", -5) + r[88:], "body length -5"),
        (lambda r: r[:93] + b"\x7f" + r[94:], "topic length 127"),
        (lambda r: r[:-11] + struct.pack(">h", 3) + r[-9:], "properties length 3"),
    ],
)
def test_malformed_records_raise_remote_protocol_error(mutate, words):
    record = bytes(make_record(body=b"hello", properties={"TAGS": "paid"}))
    with pytest.raises(RemoteProtocolError, match=words):
        decode_record(mutate(record))


@given(st.binary(max_size=300), st.integers(0, 200), st.binary(min_size=1, max_size=8))
def test_any_corruption_of_a_record_decodes_or_raises_protocol_error(body, at, garbage):
    record = bytearray(make_record(body=body))
    at = min(at, len(record) - 1)
    record[at : at + len(garbage)] = garbage
    with contextlib.suppress(RemoteProtocolError):
        decode_records(record)


# -- batch body ---------------------------------------------------------------------------------


def test_batch_body_layout_is_what_the_java_client_writes():
    body = encode_batch_body([BatchEntry(body=b"abc", properties="TAGS\x01t", flag=5)])
    assert len(body) == BATCH_ENTRY_FIXED_SIZE + 3 + 6
    assert struct.unpack_from(">iiiii", body, 0) == (len(body), 0, 0, 5, 3)
    assert body[20:23] == b"abc"
    assert struct.unpack_from(">h", body, 23)[0] == 6


entries = st.lists(
    st.builds(
        BatchEntry,
        body=st.binary(max_size=40),
        properties=st.text(st.characters(blacklist_categories=("Cs",)), max_size=30),
        flag=st.integers(-(2**31), 2**31 - 1),
    ),
    max_size=6,
)


@given(entries)
def test_batch_body_round_trips(batch):
    assert decode_batch_body(encode_batch_body(batch)) == batch


def test_batch_entry_properties_limit_is_checked_on_encode():
    with pytest.raises(LocalProtocolError, match="32767"):
        encode_batch_body([BatchEntry(body=b"", properties="x" * 32768)])


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (bytes(10), "cut"),
        (struct.pack(">iiiii", 10, 0, 0, 0, 0) + b"\x00\x00", "claims 10"),
        (struct.pack(">iiiii", 22, 0, 0, 0, -1) + b"\x00\x00", "-1-byte body"),
        (struct.pack(">iiiii", 30, 0, 0, 0, 0) + b"\x00\x00", "claims 30"),
        (struct.pack(">iiiii", 24, 0, 0, 0, 0) + b"\x00\x05xx", "properties length 5"),
        (struct.pack(">iiiii", 22, 0, 0, 0, 100) + b"\x00\x00", "100-byte body"),
    ],
)
def test_malformed_batch_bodies_raise_remote_protocol_error(body, words):
    with pytest.raises(RemoteProtocolError, match=words):
        decode_batch_body(body)


@given(entries, st.integers(0, 500), st.binary(min_size=1, max_size=6))
def test_any_corruption_of_a_batch_body_decodes_or_raises_protocol_error(batch, at, garbage):
    body = bytearray(encode_batch_body(batch) or b"\x00")
    at = min(at, len(body) - 1)
    body[at : at + len(garbage)] = garbage
    with contextlib.suppress(RemoteProtocolError):
        decode_batch_body(body)

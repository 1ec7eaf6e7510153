"""A batch in columns (``put_batch``) is stored exactly as the same messages through
``put_messages``, and its properties merge (batch_properties.py) gives the dict path's bytes."""

from __future__ import annotations

import itertools
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import small_config

from tidemq.protocol import crc
from tidemq.protocol.message import (
    MAGIC_V1,
    decode_properties,
    decode_records,
    encode_properties,
    tags_code,
)
from tidemq.store import record_encoder
from tidemq.store.batch_properties import merge_batch_properties
from tidemq.store.interface import MessageBatch, PutStatus
from tidemq.store.memory_store import MemoryMessageStore
from tidemq.store.record_encoder import index_keys

STORE_TIMESTAMP_POSITION = 56  # IPv4 born host


def key_factory():
    counter = itertools.count()
    return lambda: f"GENERATED{next(counter):023d}"


def keys_factory():
    one = key_factory()
    return lambda count: [one() for _ in range(count)]


def dict_path(texts: list[bytes], batch_properties: dict[str, str], new_key) -> list[dict]:
    """The broker's rule with a dict per message: less WAIT, updated, UNIQ_KEY added."""
    merged = []
    for raw in texts:
        properties = decode_properties(str(raw, "utf-8", "replace"))
        properties.pop("WAIT", None)
        properties.update(batch_properties)
        if "UNIQ_KEY" not in properties:
            properties["UNIQ_KEY"] = new_key()
        merged.append(properties)
    return merged


def texts_of(dicts: list[dict]) -> list[bytes]:
    return [encode_properties(d).encode("utf-8") for d in dicts]


NAMES = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "CLUSTER", "a%s", "n\u00e9", "x"])
VALUES = st.text(
    alphabet=st.sampled_from(["a", "b", " ", "%", "\u00e9", "\x01", "0"]), max_size=6
)
SHAPES = st.lists(st.tuples(NAMES, VALUES), max_size=5)


@settings(max_examples=300, deadline=None)
@given(
    shape=SHAPES,
    values=st.lists(st.lists(VALUES, min_size=5, max_size=5), min_size=1, max_size=6),
    batch=st.dictionaries(
        st.sampled_from(["CLUSTER", "TAGS", "KEYS", "UNIQ_KEY", "b"]), VALUES.filter(bool)
    ),
    drop=st.sets(st.sampled_from(["b", "x", "TAGS", "REAL_TOPIC"])),
)
def test_merge_gives_the_dict_paths_bytes_tags_and_keys(shape, values, batch, drop):
    # Entries share a shape (names in order) with their own values: the common form when
    # well-formed; anything else must come back None, never different bytes.
    texts = [
        "\x02".join(f"{name}\x01{own[k]}" for k, (name, _) in enumerate(shape)).encode()
        for own in values
    ]
    batch_properties = {**batch, "CLUSTER": "DefaultCluster", "REAL_TOPIC": "T"}
    merged = merge_batch_properties(texts, batch_properties, keys_factory(), drop)
    if merged is None:
        return
    expected = dict_path(texts, batch_properties, key_factory())
    assert merged.properties == texts_of(expected)
    # Without the dropped batch properties: the commit's rule, pop them from the dict.
    if drop and not drop & {name for name, _ in shape}:
        assert merged.without_dropped == texts_of(
            [{k: v for k, v in d.items() if k not in drop} for d in expected])
    else:
        assert merged.without_dropped is None
    assert [list(keys) for keys in merged.keys] == [index_keys(d) for d in expected]
    if any("TAGS" in d for d in expected):
        assert merged.tags == [d["TAGS"] for d in expected]
    else:
        assert merged.tags is None


@pytest.mark.parametrize(
    "texts",
    [
        [b"UNIQ_KEY\x01K0", b"UNIQ_KEY\x01K1"],
        [
            b"TAGS\x01t\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01K0",
            b"TAGS\x01u\x02KEYS\x01k3\x02UNIQ_KEY\x01K1",
        ],
        [b"WAIT\x01true\x02TAGS\x01t", b"WAIT\x01false\x02TAGS\x01u"],
        [b"CLUSTER\x01mine\x02UNIQ_KEY\x01K0", b"CLUSTER\x01yours\x02UNIQ_KEY\x01K1"],
        [b"", b"", b""],  # the Spark sink's rows: no properties of their own
    ],
)
def test_common_batches_take_the_column_path(texts):
    batch_properties = {"CLUSTER": "DefaultCluster"}
    merged = merge_batch_properties(texts, batch_properties, keys_factory())
    assert merged is not None
    assert merged.properties == texts_of(dict_path(texts, batch_properties, key_factory()))


@pytest.mark.parametrize(
    "texts",
    [
        [b"UNIQ_KEY\x01K0", b"TAGS\x01t\x02UNIQ_KEY\x01K1"],  # shapes differ
        [b"UNIQ_KEY\x01K0\x02UNIQ_KEY\x01K9"],  # a name twice
        [b"UNIQ_KEY\x01"],  # an empty value
        [b"UNIQ_KEY\x01K0\x02garbage"],  # a piece without a separator
        [b"DELAY\x013"],  # the broker must refuse it
        [b"TAGS\x01\xff"],  # not UTF-8: stored as the dict path decodes it
        [b"", b"UNIQ_KEY\x01K1"],  # some entries have properties, some none
    ],
)
def test_other_batches_are_left_to_the_dict_path(texts):
    assert merge_batch_properties(texts, {"CLUSTER": "c"}, keys_factory()) is None


def raw_records(store, topic: str, count: int) -> list[bytes]:
    found = store.get_messages(topic, 0, 0, count, 1 << 30)
    assert found.message_count == count
    records, position = [], 0
    while position < len(found.body):
        (size,) = struct.unpack_from(">i", found.body, position)
        record = bytearray(found.body[position : position + size])
        record[STORE_TIMESTAMP_POSITION : STORE_TIMESTAMP_POSITION + 8] = bytes(8)
        records.append(bytes(record))
        position += size
    return records


@pytest.mark.parametrize("count", [1, 5, 64])
def test_put_batch_stores_what_put_messages_stores(tmp_path, count):
    texts = [f"TAGS\x01t{n % 3}\x02KEYS\x01k{n}\x02UNIQ_KEY\x01U{n:031d}".encode()
             for n in range(count)]
    merged = merge_batch_properties(texts, {"CLUSTER": "DefaultCluster"}, keys_factory())
    assert merged is not None
    batch = MessageBatch(
        "Orders", 0, [bytes([n]) * (n + 1) for n in range(count)], merged.properties,
        list(range(count)), merged.tags, merged.keys, sysflag=2, born_timestamp=1_700_000_000_000,
        born_host="10.0.0.7:4242", reconsume_times=0,
    )
    with MemoryMessageStore(small_config(tmp_path / "a")) as columns, \
            MemoryMessageStore(small_config(tmp_path / "b")) as reference:
        result = columns.put_batch(batch)
        assert result.status is PutStatus.PUT_OK and result.message_count == count
        assert len(result.msg_ids) == count
        assert reference.put_messages(batch.to_store_messages()).status is PutStatus.PUT_OK
        assert raw_records(columns, "Orders", count) == raw_records(reference, "Orders", count)
        records = decode_records(columns.get_messages("Orders", 0, 0, count, 1 << 30).body)
        assert [r.properties["KEYS"] for r in records] == [f"k{n}" for n in range(count)]
        # Tag codes and index keys came from the columns: filter by tag, find by key.
        tagged = columns.get_messages("Orders", 0, 0, count, 1 << 30,
                                      tag_codes={tags_code("t1")})
        assert [r.body for r in decode_records(tagged.body)] == [
            bytes([n]) * (n + 1) for n in range(count) if n % 3 == 1
        ]
        assert columns.query_messages("Orders", f"k{count - 1}", 4, 0, 1 << 62).records
        assert columns.query_messages("Orders", f"U{0:031d}", 4, 0, 1 << 62).records
        # Without msg ids (committed copies: nobody is told them) the same records follow.
        quiet = columns.put_batch(batch, msg_ids=False)
        assert quiet.status is PutStatus.PUT_OK and quiet.msg_ids == []
        again = decode_records(columns.read_records(quiet.physical_offset, quiet.wrote_bytes))
        first = decode_records(columns.read_records(result.physical_offset, result.wrote_bytes))
        assert [(r.body, r.properties, r.queue_offset - count) for r in again] == [
            (r.body, r.properties, r.queue_offset) for r in first]


def test_put_batch_refuses_an_oversized_body_naming_the_limit(tmp_path):
    with MemoryMessageStore(small_config(tmp_path, max_message_size=16)) as store:
        batch = MessageBatch("Orders", 0, [b"x" * 17], [b"UNIQ_KEY\x01K"], [0], None, [("K",)])
        result = store.put_batch(batch)
        assert result.status is PutStatus.MESSAGE_ILLEGAL
        assert "max_message_size=16" in result.remark
        assert store.commit_log_max_offset() == 0


def test_index_keys_are_the_unique_key_then_each_non_empty_keys_token() -> None:
    assert index_keys({"UNIQ_KEY": "U1", "KEYS": "a b"}) == ["U1", "a", "b"]
    assert index_keys({"UNIQ_KEY": "U1", "KEYS": " a  b "}) == ["U1", "a", "b"]
    assert index_keys({"KEYS": "a"}) == ["a"]
    assert index_keys({"UNIQ_KEY": "", "KEYS": ""}) == []
    assert index_keys({}) == []


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 20),
    flags=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=20, max_size=20),
    sysflag=st.sampled_from([0, 2, 8, 2 | 8]),  # multi tags, committed
    born_timestamp=st.integers(0, 2**63 - 1),
    born_port=st.integers(0, 65535),
    reconsume_times=st.integers(0, 2**31 - 1),
    body_length=st.sampled_from([None, 0, 1, 1024]),  # None: each body its own length
)
def test_put_batch_fields_are_stored_as_put_messages_stores_them(
    tmp_path_factory, count, flags, sysflag, born_timestamp, born_port, reconsume_times,
    body_length,
):
    # Every field a batch shares is packed once for the batch, and records of one size in
    # one pack each (record_encoder.py): the records must still be those put_messages
    # writes message by message.
    root = tmp_path_factory.mktemp("fields")
    batch = MessageBatch(
        "Orders", 0,
        [bytes([n]) * (n + 1 if body_length is None else body_length) for n in range(count)],
        [f"UNIQ_KEY\x01U{n:031d}".encode() for n in range(count)], flags[:count], None,
        [(f"U{n:031d}",) for n in range(count)], sysflag=sysflag,
        born_timestamp=born_timestamp, born_host=f"10.0.0.7:{born_port}",
        reconsume_times=reconsume_times,
    )
    with MemoryMessageStore(small_config(root / "a")) as columns, \
            MemoryMessageStore(small_config(root / "b")) as reference:
        assert columns.put_batch(batch).status is PutStatus.PUT_OK
        assert reference.put_messages(batch.to_store_messages()).status is PutStatus.PUT_OK
        assert raw_records(columns, "Orders", count) == raw_records(reference, "Orders", count)


def test_records_of_one_size_are_packed_as_the_joined_parts() -> None:
    # The one-pack path for like records gives the bytes of prefix + body + tail joined;
    # other batches (bodies or properties of several lengths, a body the struct does not
    # take) are left to the join.
    count = 16
    bodies = [bytes([n]) * 1024 for n in range(count)]
    assert any(zlib.crc32(body) >> 31 for body in bodies)  # a CRC with its high bit set
    properties = [f"UNIQ_KEY\x01U{n:031d}".encode() for n in range(count)]
    shared = bytes(range(64))
    topic_field = b"\x06Orders"
    body_lengths = [1024] * count
    properties_lengths = list(map(len, properties))
    size = 88 + 1024 + len(topic_field) + 2 + properties_lengths[0]
    sizes = [size] * count
    crcs = record_encoder.body_crcs(bodies)
    flags = list(range(count))
    packed = record_encoder._pack_like_records(
        count, sizes, crcs, 3, flags, shared, bodies, topic_field, properties, body_lengths,
        properties_lengths)
    prefixes = [
        struct.pack(">iiiii64si", size, MAGIC_V1, crc, 3, flag, shared, 1024)
        for crc, flag in zip(crcs, flags, strict=True)
    ]
    joined = record_encoder._join_records(prefixes, bodies, topic_field, properties,
                                          properties_lengths)
    assert packed == joined
    # CRCs computed there (each high bit cleared in the buffer), as body_crcs gives them.
    assert record_encoder._pack_like_records(
        count, sizes, None, 3, flags, shared, bodies, topic_field, properties, body_lengths,
        properties_lengths) == joined
    mixed = [*body_lengths[:-1], 1023]
    assert record_encoder._pack_like_records(
        count, sizes, crcs, 3, flags, shared, [*bodies[:-1], bodies[-1][:-1]], topic_field,
        properties, mixed, properties_lengths) is None
    viewed = [*bodies[:-1], memoryview(bodies[-1])]
    assert record_encoder._pack_like_records(
        count, sizes, crcs, 3, flags, shared, viewed, topic_field, properties, body_lengths,
        properties_lengths) is None


@pytest.mark.parametrize("crc32", [zlib.crc32, crc.crc32], ids=["zlib", "configured"])
@pytest.mark.parametrize("body_length", [None, 1024])  # None: each body its own length
def test_stored_bytes_do_not_depend_on_the_crc32_implementation(
    tmp_path, monkeypatch, crc32, body_length
) -> None:
    # The encoder computes BODYCRC with protocol/crc.py's crc32 (ISA-L's when installed):
    # with zlib's forced, or with whichever is configured, the records are the same bytes,
    # and each BODYCRC is zlib's CRC of the body masked to 31 bits.
    monkeypatch.setattr(record_encoder, "crc32", crc32)
    count = 24
    bodies = [bytes([n]) * (1024 if body_length is None else n + 1) for n in range(count)]
    assert any(zlib.crc32(body) >> 31 for body in bodies)  # a CRC with its high bit set
    batch = MessageBatch(
        "Orders", 0, bodies, [f"UNIQ_KEY\x01U{n:031d}".encode() for n in range(count)],
        [0] * count, None, [(f"U{n:031d}",) for n in range(count)],
        born_host="10.0.0.7:4242",
    )
    with MemoryMessageStore(small_config(tmp_path)) as store:
        assert store.put_batch(batch).status is PutStatus.PUT_OK
        records = decode_records(store.get_messages("Orders", 0, 0, count, 1 << 30).body)
    assert [r.body for r in records] == bodies
    assert [r.body_crc for r in records] == [zlib.crc32(body) & 0x7FFFFFFF for body in bodies]

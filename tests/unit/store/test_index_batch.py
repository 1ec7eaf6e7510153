"""Indexing a batch at once (``IndexService.put_many``, ``index_key_hashes``): the same files,
byte for byte, and the same query answers as indexing its messages one by one."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.protocol.message import java_string_hash, java_string_hashes
from tidemq.store.index_file import IndexService, index_key_hash, index_key_hashes

T0 = 1_700_000_000_000  # ms
FOREVER = (0, 2**62)


def service(directory, slots: int, entries: int) -> IndexService:
    index = IndexService(directory, max_hash_slot_num=slots, max_index_num=entries)
    index.load(True, 0)
    return index


def file_bytes(directory) -> list[bytes]:
    return [path.read_bytes() for path in sorted(directory.iterdir())]


# Keys as producers write them: unique keys (hex), order ids, the odd space-free token with
# non-ASCII, empty tokens; repeated keys, within a batch too.
keys = st.one_of(
    st.text(alphabet="0123456789ABCDEF", min_size=32, max_size=32),
    st.from_regex(r"order-[0-9]{1,6}", fullmatch=True),
    st.sampled_from(["same", "same", "k1", ""]),
    # Any character but a space (the KEYS separator) and a lone surrogate (UTF-8 on the wire
    # cannot carry one, and Java's hash is over valid UTF-16).
    st.text(alphabet=st.characters(blacklist_characters=" ", blacklist_categories=("Cs",)),
            min_size=1, max_size=8),
)
messages_keys = st.lists(st.lists(keys, max_size=4), min_size=1, max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(batches=st.lists(messages_keys, min_size=1, max_size=5), slots=st.sampled_from([1, 7, 64]))
def test_put_many_writes_the_files_put_writes(tmp_path_factory, batches, slots):
    # 40-entry files: batches roll over to new files in the middle.
    root = tmp_path_factory.mktemp("index")
    one_by_one = service(root / "one", slots, 40)
    batched = service(root / "batch", slots, 40)
    physical_offset = 1000
    for second, batch in enumerate(batches):
        timestamp = T0 + second * 1500
        entries = []
        for message_keys in batch:
            one_by_one.put("Orders", message_keys, physical_offset, timestamp)
            entries.append((physical_offset, message_keys))
            physical_offset += 1200
        batched.put_many("Orders", entries, timestamp)
    for index in (one_by_one, batched):
        index.flush()
    assert file_bytes(root / "batch") == file_bytes(root / "one")
    assert batched.last_update_physical_offset == one_by_one.last_update_physical_offset
    assert batched.last_update_timestamp_ms == one_by_one.last_update_timestamp_ms
    for key in {key for batch in batches for message_keys in batch for key in message_keys}:
        assert batched.query("Orders", key, 1000, *FOREVER) == one_by_one.query(
            "Orders", key, 1000, *FOREVER
        )
    one_by_one.close()
    batched.close()


def test_a_batch_is_queryable_by_every_key_newest_first(tmp_path):
    index = service(tmp_path / "index", 1024, 10_000)
    entries = [(100 * i, [f"U{i:030d}", f"order-{i % 7}"]) for i in range(1, 200)]
    index.put_many("Orders", entries, T0)
    assert index.query("Orders", f"U{150:030d}", 10, *FOREVER) == [15_000]
    assert index.query("Orders", "order-3", 100, *FOREVER) == [
        100 * i for i in reversed(range(1, 200)) if i % 7 == 3
    ]
    assert index.query("Other", "order-3", 100, *FOREVER) == []
    assert index.last_update_physical_offset == 19_900
    index.close()


def test_put_many_skips_messages_already_indexed(tmp_path):
    # Recovery re-dispatches from a point before the index's end: nothing is indexed twice.
    index = service(tmp_path / "index", 64, 1000)
    index.put_many("Orders", [(100, ["a"]), (200, ["b"]), (300, ["c"])], T0)
    index.put_many("Orders", [(200, ["b"]), (300, ["c"]), (400, ["d"]), (500, [])], T0)
    index.put_many("Orders", [(100, ["a"]), (300, ["c"])], T0)
    for key, offsets in {"a": [100], "b": [200], "c": [300], "d": [400]}.items():
        assert index.query("Orders", key, 10, *FOREVER) == offsets
    assert index.last_update_physical_offset == 400  # a message without keys is not indexed
    index.put_many("Orders", [], T0)
    index.put_many("Orders", [(600, []), (700, [""])], T0)
    assert index.last_update_physical_offset == 400
    index.close()


texts = st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=50), max_size=20)


@given(texts=texts, prefix=st.sampled_from(["", "Orders#", "a b#", "Zürich#"]))
def test_batch_java_hashes_equal_one_at_a_time(texts, prefix):
    assert java_string_hashes(texts, prefix) == [java_string_hash(prefix + t) for t in texts]


# Strings of one length, mostly from "0".."N" (uppercase hex keys hash by a shorter path),
# sometimes with a character just outside that range, a space or a non-ASCII one.
equal_length_texts = st.integers(1, 40).flatmap(
    lambda length: st.lists(
        st.text(alphabet="0123456789ABCDEF:@N/Oa é", min_size=length, max_size=length),
        min_size=1, max_size=20,
    )
)


@given(texts=equal_length_texts, prefix=st.sampled_from(["", "Orders#", "Zürich#"]))
def test_batch_java_hashes_of_equal_length_strings_equal_one_at_a_time(texts, prefix):
    assert java_string_hashes(texts, prefix) == [java_string_hash(prefix + t) for t in texts]


@given(keys=st.lists(keys, max_size=20))
def test_batch_index_key_hashes_equal_one_at_a_time(keys):
    assert index_key_hashes("Orders", keys) == [index_key_hash("Orders#" + k) for k in keys]


def test_batch_hashes_cover_long_and_min_value_keys():
    long_keys = ["x" * 3000, "y" * 2047, "z" * 2048] + [f"k{i}" for i in range(8)]
    assert java_string_hashes(long_keys, "T#") == [java_string_hash("T#" + k) for k in long_keys]
    # "T#ANTVRBUG" hashes to Integer.MIN_VALUE in Java, whose abs() is not an int: the index
    # stores 0 for it.
    assert java_string_hash("T#ANTVRBUG") == -(2**31)
    assert java_string_hashes(["ANTVRBUG"] * 5, "T#") == [-(2**31)] * 5
    assert index_key_hashes("T", ["ANTVRBUG"] * 5) == [0] * 5
    assert index_key_hash("T#ANTVRBUG") == 0

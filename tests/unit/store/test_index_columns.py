"""Indexing a batch as producers send it (``IndexService.put_columns``): every message with a
UNIQ_KEY and as many KEYS tokens, keys that share a head, slots that are mostly free, so the
batch takes the whole-batch write. The files must be byte for byte those of ``put`` one
message at a time, and the batch key hashes those of Java's String.hashCode one at a time.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.protocol import message
from tidemq.protocol.message import (
    java_string_abs_hashes,
    java_string_hash,
    java_string_hashes,
)
from tidemq.protocol.msgid import new_unique_keys
from tidemq.store.index_file import IndexService, index_key_hash

T0 = 1_700_000_000_000  # ms
FOREVER = (0, 2**62)


def service(directory, slots: int, entries: int) -> IndexService:
    index = IndexService(directory, max_hash_slot_num=slots, max_index_num=entries)
    index.load(True, 0)
    return index


def file_bytes(directory) -> list[bytes]:
    return [path.read_bytes() for path in sorted(directory.iterdir())]


# A batch: a run of unique keys of one process, and 0-2 KEYS tokens per message that share
# a head ("order-10041", "order-10042", ...), sometimes one repeated or empty.
@st.composite
def producer_batches(draw) -> tuple[list[int], list[list[str]]]:
    count = draw(st.integers(1, 70))
    width = draw(st.integers(0, 2))
    base = draw(st.integers(0, 10**6))
    unique_keys = new_unique_keys(count)
    key_lists = []
    for n in range(count):
        tokens = [f"order-{base + n * (column + 1)}" for column in range(width)]
        if draw(st.integers(0, 30)) == 0:
            tokens.append(draw(st.sampled_from(["", "same", tokens[0] if tokens else "x"])))
        key_lists.append([unique_keys[n], *tokens])
    return key_lists


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(batches=st.lists(producer_batches(), min_size=1, max_size=4),
       entries=st.sampled_from([50, 10_000]))
def test_put_columns_writes_the_files_put_writes(tmp_path_factory, batches, entries):
    # 50-entry files: batches roll over to new files in the middle; 10,000: they do not.
    root = tmp_path_factory.mktemp("index")
    one_by_one = service(root / "one", 100_003, entries)
    batched = service(root / "batch", 100_003, entries)
    physical_offset = 1000
    for second, key_lists in enumerate(batches):
        timestamp = T0 + second * 1500
        offsets = []
        for message_keys in key_lists:
            one_by_one.put("Orders", message_keys, physical_offset, timestamp)
            offsets.append(physical_offset)
            physical_offset += 1200
        batched.put_columns("Orders", offsets, key_lists, timestamp)
    for index in (one_by_one, batched):
        index.flush()
    assert file_bytes(root / "batch") == file_bytes(root / "one")
    assert batched.last_update_physical_offset == one_by_one.last_update_physical_offset
    for key in {key for key_lists in batches for keys in key_lists for key in keys if key}:
        assert batched.query("Orders", key, 1000, *FOREVER) == one_by_one.query(
            "Orders", key, 1000, *FOREVER
        )
    one_by_one.close()
    batched.close()


def test_a_wide_batch_is_found_by_every_key_after_reopening(tmp_path):
    index = service(tmp_path / "index", 100_003, 10_000)
    unique_keys = new_unique_keys(64)
    offsets = [1000 + 1100 * n for n in range(64)]
    index.put_columns("Orders", offsets, [(u, f"order-{n}") for n, u in enumerate(unique_keys)],
                      T0)
    index.close()
    reopened = service(tmp_path / "index", 100_003, 10_000)
    for n in (0, 31, 63):
        assert reopened.query("Orders", unique_keys[n], 10, *FOREVER) == [offsets[n]]
        assert reopened.query("Orders", f"order-{n}", 10, *FOREVER) == [offsets[n]]
    assert reopened.last_update_physical_offset == offsets[-1]
    reopened.close()


def test_a_few_trace_messages_of_many_keys_each_hash_all_keys_as_one_batch(tmp_path):
    """Trace messages (a UNIQ_KEY and ~480 msg ids each) stored a few at a time: their keys
    are hashed together, not column by column (columns of 3 keys each went one key at a
    time, twice the cost), and the files are those ``put`` writes."""
    key_lists = [new_unique_keys(481) for _ in range(3)]
    offsets = [1000, 21000, 41000]
    assert IndexService._hash_columns("RMQ_SYS_TRACE_TOPIC", offsets, key_lists) is None
    one_by_one = service(tmp_path / "one", 100_003, 10_000)
    batched = service(tmp_path / "batch", 100_003, 10_000)
    for offset, keys in zip(offsets, key_lists, strict=True):
        one_by_one.put("RMQ_SYS_TRACE_TOPIC", keys, offset, T0)
    batched.put_columns("RMQ_SYS_TRACE_TOPIC", offsets, key_lists, T0)
    for index in (one_by_one, batched):
        index.flush()
    assert file_bytes(tmp_path / "batch") == file_bytes(tmp_path / "one")
    for offset, keys in zip(offsets, key_lists, strict=True):
        assert batched.query("RMQ_SYS_TRACE_TOPIC", keys[240], 10, *FOREVER) == [offset]
    one_by_one.close()
    batched.close()


# Strings of one length sharing a head of any characters (a space, non-ASCII, outside
# "0".."N"), their rest mostly from the window "0".."N", sometimes not.
@st.composite
def headed_texts(draw) -> list[str]:
    head = draw(st.text(alphabet="kA0 é#-Zz9", max_size=30))
    length = draw(st.integers(1, 8))
    rests = draw(st.lists(
        st.text(alphabet="0123456789ABCDEFN" + draw(st.sampled_from(["", "a", "é", " "])),
                min_size=length, max_size=length),
        min_size=1, max_size=70,
    ))
    texts = [head + rest for rest in rests]
    if len(texts) > 2 and draw(st.booleans()):
        texts[len(texts) // 2] = "x" + texts[len(texts) // 2][1:]  # one without the head
    return texts


@given(texts=headed_texts(), prefix=st.sampled_from(["", "Orders#", "Zürich#"]))
def test_batch_hashes_of_strings_with_a_shared_head_equal_one_at_a_time(texts, prefix):
    expected = [java_string_hash(prefix + text) for text in texts]
    assert java_string_hashes(texts, prefix) == expected
    assert java_string_abs_hashes(texts, prefix) == [
        index_key_hash(prefix + text) for text in texts
    ]


def test_batch_abs_hashes_give_zero_for_min_value_and_magnitudes_otherwise():
    # "T#ANTVRBUG" hashes to Integer.MIN_VALUE: RocketMQ's index stores 0 for it.
    keys = ["ANTVRBUG"] * 5 + ["ANTVRBUH", "ANTVRBUF", "order-1", "order-2"]
    assert java_string_abs_hashes(keys, "T#") == [index_key_hash("T#" + k) for k in keys]
    assert java_string_abs_hashes(keys, "T#")[:5] == [0] * 5
    assert all(0 <= h < 2**31 for h in java_string_abs_hashes(keys, "T#"))


def one_at_a_time(texts: list[str], prefix: str) -> list[int]:
    return [index_key_hash(prefix + text) for text in texts]


def test_a_producers_unique_keys_are_hashed_in_lanes_as_one_at_a_time():
    # A batch's UNIQ_KEYs (one head, a tail of a few characters) take the lane arithmetic,
    # whole requests' worth and three requests' worth (made apart, so a shorter head).
    for keys in (new_unique_keys(16), new_unique_keys(64),
                 new_unique_keys(64) + new_unique_keys(64) + new_unique_keys(64)):
        lanes = message._lane_abs_hashes(keys, "Orders#")
        assert lanes is not None
        assert lanes == one_at_a_time(keys, "Orders#")
        assert java_string_abs_hashes(keys, "Orders#") == lanes


def test_lane_hashes_keep_min_value_at_zero_and_every_sign():
    # "T#ANTVRBUG" hashes to Integer.MIN_VALUE (0 in the index); its neighbours (the last
    # character within the lanes' "0".."N") to both signs.
    keys = ["ANTVRBUG"] * 8 + [f"ANTVRBU{last}" for last in "0123456789ABCDEFGHN"]
    hashes = message._lane_abs_hashes(keys, "T#")
    assert hashes == one_at_a_time(keys, "T#")
    assert hashes[:8] == [0] * 8
    assert {java_string_hash("T#" + key) < 0 for key in keys} == {True, False}


def test_strings_of_other_lengths_that_add_up_alike_are_not_taken_as_lanes():
    # Lengths 4, 2, 6 join to the length three strings of 4 would: the separators then sit
    # elsewhere, and the lanes would read the wrong characters.
    keys = ["AB12", "AB", "AB1234"] * 6
    assert message._lane_abs_hashes(keys, "T#") is None
    assert java_string_abs_hashes(keys, "T#") == one_at_a_time(keys, "T#")


@given(
    head=st.text(alphabet="AZ09#é ", max_size=20),
    tails=st.lists(st.text(alphabet="0189ABNOa ", min_size=1, max_size=14), min_size=16,
                   max_size=80),
    prefix=st.sampled_from(["", "T#", "Zürich#"]),
)
def test_batch_abs_hashes_of_many_strings_equal_one_at_a_time(head, tails, prefix):
    # Enough strings for the lanes; tails of any length up to past the lanes' 12, some
    # outside the window ("O", "a"), a space, a head outside it: lanes or not, the same.
    texts = [head + tail for tail in tails]
    assert java_string_abs_hashes(texts, prefix) == one_at_a_time(texts, prefix)

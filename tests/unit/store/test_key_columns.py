"""KeyColumns: a batch's index keys as columns read as the per-message key tuples they stand
for, and batches written together join their columns (no tuple per message on the way)."""

from __future__ import annotations

import pytest

from tidemq.store.batch_properties import merge_batch_properties
from tidemq.store.key_columns import KeyColumns, concatenated_keys, key_count


def test_key_columns_read_as_the_list_of_each_messages_keys():
    keys = KeyColumns((["u0", "u1", "u2"], ["k0", "", "k2"]))
    as_list = [("u0", "k0"), ("u1", ""), ("u2", "k2")]
    assert len(keys) == 3
    assert keys[1] == ("u1", "")
    assert keys[-1] == ("u2", "k2")
    assert keys[1:] == as_list[1:] and isinstance(keys[1:], KeyColumns)
    assert keys[3:] == [] and len(keys[3:]) == 0
    assert list(keys) == as_list
    assert keys == as_list and keys == [list(each) for each in as_list]
    assert keys != as_list[:2]
    assert key_count(keys) == 6 == key_count(as_list)


def test_columns_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="equal length"):
        KeyColumns((["u0", "u1"], ["k0"]))
    with pytest.raises(ValueError):
        KeyColumns(())


def test_batches_of_one_width_join_column_by_column_and_others_become_tuples():
    first = KeyColumns((["u0", "u1"], ["k0", "k1"]))
    second = KeyColumns((["u2"], ["k2"]))
    joined = concatenated_keys([first, second])
    assert isinstance(joined, KeyColumns)
    assert joined.columns == (["u0", "u1", "u2"], ["k0", "k1", "k2"])
    assert first.columns == (["u0", "u1"], ["k0", "k1"])  # the parts are left as they were
    narrow = KeyColumns((["u3"],))
    mixed = concatenated_keys([first, narrow, [("u4", "k4", "x")]])
    assert mixed == [("u0", "k0"), ("u1", "k1"), ("u3",), ("u4", "k4", "x")]


def test_the_batch_path_makes_columns_of_the_keys_it_merges():
    merged = merge_batch_properties(
        [b"KEYS\x01order-1\x02UNIQ_KEY\x01U1", b"KEYS\x01order-2\x02UNIQ_KEY\x01U2"],
        {"CLUSTER": "C"}, lambda n: [f"new{i}" for i in range(n)])
    assert merged is not None
    assert isinstance(merged.keys, KeyColumns)
    assert merged.keys == [("U1", "order-1"), ("U2", "order-2")]
    # KEYS holding several tokens: one list per message (tokens split, empty ones dropped).
    merged = merge_batch_properties([b"KEYS\x01a b\x02UNIQ_KEY\x01U1"], {},
                                    lambda n: [f"new{i}" for i in range(n)])
    assert merged is not None
    assert merged.keys == [["U1", "a", "b"]]

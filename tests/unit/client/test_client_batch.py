"""Batch checks and splitting a batch into request-sized SEND_BATCH_MESSAGE bodies."""

from __future__ import annotations

import itertools

import pytest

from tidemq.client.batch import check_batch, split_batch
from tidemq.client.errors import InvalidMessage
from tidemq.client.message import Message
from tidemq.errors import MessageTooLarge
from tidemq.protocol.message import (
    BatchEntry,
    decode_batch_body,
    decode_properties,
    encode_batch_body,
    encode_properties,
)


def key_maker():
    counter = itertools.count()
    return lambda: f"KEY{next(counter):04d}"


def decoded(chunks):
    return [entry for chunk in chunks for entry in decode_batch_body(chunk.body)]


def test_small_batch_is_one_chunk_in_order_with_unique_keys():
    messages = [Message("T", f"m{i}", tags="t", keys=f"k{i}", flag=i) for i in range(5)]
    chunks = split_batch(messages, key_maker())
    assert len(chunks) == 1
    assert chunks[0].unique_keys == [f"KEY{i:04d}" for i in range(5)]
    entries = decoded(chunks)
    assert [e.body for e in entries] == [f"m{i}".encode() for i in range(5)]
    assert [e.flag for e in entries] == list(range(5))
    for i, entry in enumerate(entries):
        assert decode_properties(entry.properties) == {
            "TAGS": "t", "KEYS": f"k{i}", "UNIQ_KEY": f"KEY{i:04d}"
        }
    # the caller can read each message's id afterwards
    assert [m.properties["UNIQ_KEY"] for m in messages] == chunks[0].unique_keys


def test_batch_is_split_so_no_chunk_exceeds_the_limit_and_order_is_kept():
    messages = [Message("T", bytes([i]) * 300) for i in range(40)]
    limit = 1000
    chunks = split_batch(messages, key_maker(), max_message_size=limit)
    assert len(chunks) > 1
    assert all(len(chunk.body) <= limit for chunk in chunks)
    assert [e.body for e in decoded(chunks)] == [m.body for m in messages]
    assert sum(chunk.message_count for chunk in chunks) == 40


def test_message_that_keeps_its_unique_key_is_not_given_another():
    message = Message("T", b"x", properties={"UNIQ_KEY": "MINE"})
    chunks = split_batch([message], key_maker())
    assert chunks[0].unique_keys == ["MINE"]


def test_single_entry_over_the_limit_is_refused():
    with pytest.raises(MessageTooLarge, match="max_message_size=100"):
        split_batch([Message("T", b"x" * 90, properties={"p": "v" * 20})], key_maker(),
                    max_message_size=100)


def test_batch_rules_are_checked_before_sending():
    with pytest.raises(InvalidMessage, match="no messages"):
        check_batch([], 1024)
    with pytest.raises(InvalidMessage, match="one topic"):
        check_batch([Message("A", b"x"), Message("B", b"x")], 1024)
    with pytest.raises(InvalidMessage, match="delay"):
        check_batch([Message("A", b"x"), Message("A", b"x", delay_level=3)], 1024)
    with pytest.raises(InvalidMessage, match="retry topic"):
        check_batch([Message("%RETRY%g", b"x")], 1024)
    with pytest.raises(InvalidMessage, match="empty body"):
        check_batch([Message("A", b"x"), Message("A", b"")], 1024)
    assert check_batch([Message("A", b"x"), Message("A", b"y")], 1024) == "A"


def test_chunk_body_is_what_the_batch_codec_writes():
    # Plain messages (the one-pass UNIQ_KEY path) and messages with properties, mixed.
    messages = [
        Message("Orders", b"p%d" % n, flag=n) if n % 2 else
        Message("Orders", b"t%d" % n, tags="t", keys=["k", "\u00e9"], flag=n)
        for n in range(6)
    ]
    (chunk,) = split_batch(messages, iter(f"{n:032X}" for n in range(6)).__next__)
    expected = encode_batch_body([
        BatchEntry(m.body, encode_properties(m.properties), m.flag) for m in messages
    ])
    assert chunk.body == expected
    assert chunk.unique_keys == [f"{n:032X}" for n in range(6)]

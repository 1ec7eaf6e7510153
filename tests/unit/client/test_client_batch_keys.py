"""split_batch with the process's own unique keys (the producer's default): one run of keys
for the batch, each message its own, a re-sent message keeping the key it has."""

from __future__ import annotations

import re

import pytest

from tidemq.client.batch import split_batch
from tidemq.client.message import Message
from tidemq.protocol.message import decode_batch_body, decode_properties
from tidemq.protocol.msgid import new_unique_key

KEY = re.compile(r"[0-9A-F]{32}")


@pytest.mark.parametrize("key_maker", [None, new_unique_key])
def test_each_message_gets_its_own_process_key_in_the_body_and_the_chunk(key_maker):
    messages = [Message("T", f"m{i}", keys=f"k{i}") for i in range(100)]
    chunks = split_batch(messages, key_maker, max_message_size=1000)
    assert len(chunks) > 1  # the keys run on across chunks
    unique_keys = [key for chunk in chunks for key in chunk.unique_keys]
    assert len(set(unique_keys)) == 100 and all(KEY.fullmatch(k) for k in unique_keys)
    entries = [entry for chunk in chunks for entry in decode_batch_body(chunk.body)]
    assert [decode_properties(e.properties)["UNIQ_KEY"] for e in entries] == unique_keys
    assert [m.properties["UNIQ_KEY"] for m in messages] == unique_keys


def test_a_resent_message_keeps_its_key_among_new_ones():
    messages = [Message("T", f"m{i}") for i in range(5)]
    messages[2].properties["UNIQ_KEY"] = "A" * 32
    (chunk,) = split_batch(messages)
    assert chunk.unique_keys[2] == "A" * 32
    assert len(set(chunk.unique_keys)) == 5

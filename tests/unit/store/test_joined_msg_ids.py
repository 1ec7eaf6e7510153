"""A batch's msg ids held as its answer's comma-joined text (interface.JoinedMsgIds)."""

from __future__ import annotations

import pytest

from tidemq.protocol.msgid import decode_offset_msg_id, encode_offset_msg_id
from tidemq.store import store_core
from tidemq.store.interface import JoinedMsgIds, joined_msg_ids

STORE_HOST = "10.1.2.3:10911"


@pytest.mark.parametrize("offsets", [[0], [1, 2, 3], [2**63 - 1, 0x0123456789ABCDEF, 4096]])
def test_joined_ids_are_the_offset_msg_ids_comma_joined(offsets: list[int]) -> None:
    prefix = encode_offset_msg_id(STORE_HOST, 0)[:-16]
    ids = store_core._joined_offset_msg_ids(prefix, offsets)
    expected = [encode_offset_msg_id(STORE_HOST, offset) for offset in offsets]
    assert ids.text == ",".join(expected)
    assert joined_msg_ids(ids) == ",".join(expected)
    assert ids == expected and expected == ids
    assert len(ids) == len(offsets)
    assert list(ids) == expected and ids[0] == expected[0] and ids[-1:] == expected[-1:]
    assert [decode_offset_msg_id(msg_id)[1] for msg_id in ids] == offsets


def test_joined_ids_compare_as_lists() -> None:
    assert JoinedMsgIds("") == [] and len(JoinedMsgIds("")) == 0
    assert JoinedMsgIds("A,B") == JoinedMsgIds("A,B") != JoinedMsgIds("A")
    assert JoinedMsgIds("A,B") != ["A"]
    assert joined_msg_ids(["A", "B"]) == "A,B"

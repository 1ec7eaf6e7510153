"""SEND_BATCH_MESSAGE through the column path stores each entry's properties exactly as the
dict rule says (entry's less WAIT, updated with the batch's, CLUSTER, UNIQ_KEY when missing),
read back as raw record bytes."""

from __future__ import annotations

import struct

import pytest
from test_send_processor import ask, send_request, with_topic

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.message import BatchEntry, encode_batch_body, encode_properties


def stored_properties(broker, topic: str, count: int) -> list[bytes]:
    """Each record's PROPERTIES bytes, cut out of the stored record by its length fields."""
    found = broker.store.get_messages(topic, 0, 0, count, 1 << 30)
    assert found.message_count == count
    body, texts, position = found.body, [], 0
    while position < len(body):
        (size,) = struct.unpack_from(">i", body, position)
        (body_length,) = struct.unpack_from(">i", body, position + 84)
        topic_length_at = position + 88 + body_length
        length_at = topic_length_at + 1 + body[topic_length_at]
        (properties_length,) = struct.unpack_from(">h", body, length_at)
        texts.append(body[length_at + 2 : length_at + 2 + properties_length])
        assert length_at + 2 + properties_length == position + size
        position += size
    return texts


@pytest.mark.parametrize(
    "entry_properties",
    [
        [{"UNIQ_KEY": f"U{n:031d}"} for n in range(40)],
        [{"WAIT": "true", "TAGS": f"t{n}", "KEYS": f"k{n} x", "UNIQ_KEY": f"U{n}"}
         for n in range(40)],
        [{"TAGS": "100%", "CLUSTER": "mine", "UNIQ_KEY": f"U{n}"} for n in range(40)],
        [{"TAGS": "t"} if n % 2 else {"UNIQ_KEY": f"U{n}"} for n in range(40)],  # mixed shapes
    ],
)
def test_batch_properties_are_stored_as_the_dict_rule_renders_them(
    broker, handlers, entry_properties
):
    with_topic(broker, "Orders")
    entries = [BatchEntry(b"m%d" % n, encode_properties(p)) for n, p in enumerate(entry_properties)]
    request = send_request(
        "Orders", encode_batch_body(entries), code=RequestCode.SEND_BATCH_MESSAGE,
        properties={"WAIT": "true", "b": "batch"},
    )
    response = ask(broker, handlers, request)
    assert response.code == ResponseCode.SUCCESS
    texts = stored_properties(broker, "Orders", len(entries))
    for text, own in zip(texts, entry_properties, strict=True):
        expected = {k: v for k, v in own.items() if k != "WAIT"}
        expected.update({"b": "batch", "CLUSTER": broker.config.broker_cluster_name})
        if "UNIQ_KEY" not in expected:
            expected["UNIQ_KEY"] = text.decode().rsplit("UNIQ_KEY\x01", 1)[1]
        assert text == encode_properties(expected).encode()
    for n, own in enumerate(entry_properties):
        if "KEYS" in own:  # indexed under each KEYS token
            found = broker.store.query_messages("Orders", f"k{n}", 4, 0, 1 << 62)
            assert len(found.records) == 1

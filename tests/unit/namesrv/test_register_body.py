"""REGISTER_BROKER bodies: the JSON form, the compressed form, and what is not a body."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from tidemq.errors import RemoteProtocolError
from tidemq.namesrv.register_body import (
    REGISTER_BODY_PLAINTEXT_MAX,
    RegisterBrokerBody,
    RegisteredTopicConfig,
    decode_register_broker_body,
)
from tidemq.namesrv.route_data import DataVersion

VERSION = 409


def sample() -> RegisterBrokerBody:
    return RegisterBrokerBody(
        DataVersion(7, 1_700_000_000_123),
        {
            "Orders": RegisteredTopicConfig("Orders", 4, 4, 6),
            "TBW102": RegisteredTopicConfig("TBW102", 8, 8, 7),
        },
        ["10.0.0.1:9999"],
    )


def test_json_body_round_trip_and_shape():
    encoded = sample().encode()
    document = json.loads(encoded)
    assert document["topicConfigSerializeWrapper"]["dataVersion"] == {
        "counter": 7, "timestamp": 1_700_000_000_123}
    assert document["topicConfigSerializeWrapper"]["topicConfigTable"]["Orders"] == {
        "order": False, "perm": 6, "readQueueNums": 4, "topicFilterType": "SINGLE_TAG",
        "topicName": "Orders", "topicSysFlag": 0, "writeQueueNums": 4}
    assert decode_register_broker_body(encoded, compressed=False, version=VERSION) == sample()


def test_compressed_body_round_trip():
    encoded = sample().encode(compressed=True)
    assert decode_register_broker_body(encoded, compressed=True, version=VERSION) == sample()


def test_compressed_body_written_by_hand_from_the_layout():
    # int32-length-prefixed DataVersion JSON, topic count, topic lines, filter-server JSON.
    def chunk(data: bytes) -> bytes:
        return struct.pack(">i", len(data)) + data

    plain = (chunk(b'{"counter":2,"timestamp":5}') + struct.pack(">i", 1)
             + chunk(b"T1 3 2 6 MULTI_TAG") + chunk(b"[]"))
    decoded = decode_register_broker_body(zlib.compress(plain), compressed=True,
                                          version=VERSION)
    assert decoded.data_version == DataVersion(2, 5)
    config = decoded.topic_configs["T1"]
    assert (config.read_queue_nums, config.write_queue_nums, config.perm,
            config.topic_filter_type) == (3, 2, 6, "MULTI_TAG")


def test_old_brokers_send_the_bare_topic_config_wrapper():
    wrapper = {"dataVersion": {"counter": 1, "timestamp": 2},
               "topicConfigTable": {"T": {"topicName": "T", "readQueueNums": 2,
                                          "writeQueueNums": 2, "perm": 6,
                                          "topicSynFlag": 3}}}
    decoded = decode_register_broker_body(json.dumps(wrapper).encode(), compressed=False,
                                          version=36)
    assert decoded.topic_configs["T"].topic_sys_flag == 3
    assert decoded.data_version == DataVersion(1, 2)


def test_empty_body_is_an_empty_table_at_version_zero():
    decoded = decode_register_broker_body(None, compressed=False, version=VERSION)
    assert decoded == RegisterBrokerBody(DataVersion(0, 0), {}, [])


@pytest.mark.parametrize(
    ("body", "compressed", "problem"),
    [
        (b"not json", False, "JSON"),
        (b"[1,2]", False, "RegisterBrokerBody is a list"),
        (b'{"topicConfigSerializeWrapper":{"dataVersion":{"counter":"x"}}}', False, "counter"),
        (b"\x78\x9cgarbage", True, "zlib"),
        (zlib.compress(struct.pack(">i", 1000)), True, "1000 bytes"),
        (zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", 99999)), True,
         "99999 topics"),
        (zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", 1)
                       + struct.pack(">i", 5) + b"a b c"), True, "topic line"),
    ],
)
def test_malformed_bodies_raise_a_protocol_error_saying_what(body, compressed, problem):
    with pytest.raises(RemoteProtocolError, match=problem):
        decode_register_broker_body(body, compressed=compressed, version=VERSION)


def test_compressed_body_cannot_expand_without_bound():
    bomb = zlib.compress(b"\0" * (REGISTER_BODY_PLAINTEXT_MAX + 1), 9)
    with pytest.raises(RemoteProtocolError, match="expands beyond"):
        decode_register_broker_body(bomb, compressed=True, version=VERSION)

"""Offset message ids and client unique keys (docs/protocol.md §8)."""

import itertools
import re
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import InvalidMessageId, LocalProtocolError, RemoteProtocolError
from tidemq.protocol import msgid
from tidemq.protocol.msgid import (
    decode_offset_msg_id,
    encode_offset_msg_id,
    new_unique_key,
    unique_key_timestamp,
)


def test_offset_msg_id_matches_rocketmq_example():
    assert encode_offset_msg_id("172.16.0.1:10911", 0xA3C) == "AC10000100002A9F0000000000000A3C"
    assert decode_offset_msg_id("AC10000100002A9F0000000000000A3C") == ("172.16.0.1:10911", 0xA3C)


def test_offset_msg_id_reads_lowercase_hex_too():
    assert decode_offset_msg_id("ac10000100002a9f0000000000000a3c") == ("172.16.0.1:10911", 2620)


def test_ipv6_offset_msg_id_is_56_characters():
    msg_id = encode_offset_msg_id("[2001:db8::7]:10911", 2**40)
    assert len(msg_id) == 56
    assert msg_id == msg_id.upper()
    assert decode_offset_msg_id(msg_id) == ("[2001:db8::7]:10911", 2**40)


@given(
    st.ip_addresses(),
    st.integers(0, 65535),
    st.integers(0, 2**63 - 1),
)
def test_offset_msg_id_round_trips(ip, port, offset):
    host = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    msg_id = encode_offset_msg_id(host, offset)
    assert re.fullmatch(r"[0-9A-F]{32}|[0-9A-F]{56}", msg_id)
    assert decode_offset_msg_id(msg_id) == (host, offset)


@pytest.mark.parametrize(
    "msg_id",
    ["", "AC10", "AC10000100002A9F0000000000000A3", "ZZ10000100002A9F0000000000000A3C",
     "AC10000100002A9F0000000000000A3C0", "AC10 000100002A9F0000000000000A3C", "A" * 40],
)
def test_malformed_offset_msg_id_raises_invalid_message_id(msg_id):
    with pytest.raises(InvalidMessageId, match="32 \\(IPv4\\) or 56 \\(IPv6\\) hex"):
        decode_offset_msg_id(msg_id)
    assert issubclass(InvalidMessageId, RemoteProtocolError)


@pytest.mark.parametrize(
    ("host", "offset"), [("broker-a:10911", 0), ("1.2.3.4", 0), ("1.2.3.4:1", -(2**63) - 1)]
)
def test_encoding_a_bad_host_or_offset_raises_local_protocol_error(host, offset):
    with pytest.raises(LocalProtocolError):
        encode_offset_msg_id(host, offset)


def test_unique_keys_are_32_uppercase_hex_and_distinct():
    keys = [new_unique_key() for _ in range(5000)]
    assert all(re.fullmatch(r"[0-9A-F]{32}", key) for key in keys)
    assert len(set(keys)) == len(keys)
    # The first 10 bytes are fixed per process.
    assert len({key[:20] for key in keys}) == 1


@pytest.mark.parametrize("counter", [0x0000, 0x00FF, 0x0100, 0xABCD, 0xFFFF, 0x1_0001])
def test_a_unique_keys_last_four_digits_are_its_counters_low_16_bits(monkeypatch, counter):
    state = msgid._key_head()[0]
    monkeypatch.setattr(state, "counter", itertools.count(counter))
    keys = [new_unique_key(), new_unique_key()]
    assert [key[-4:] for key in keys] == [f"{counter & 0xFFFF:04X}",
                                          f"{(counter + 1) & 0xFFFF:04X}"]


def test_a_unique_key_made_at_a_given_time_reads_back_that_time():
    made_ms = time.time_ns() // 1_000_000 - 5_000  # a clock reading the caller made earlier
    key = new_unique_key(made_ms)
    assert re.fullmatch(r"[0-9A-F]{32}", key)
    assert unique_key_timestamp(key) == made_ms
    assert new_unique_key(made_ms)[:28] == key[:28]  # the same time part from that reading


def test_unique_keys_from_many_threads_are_distinct():
    keys: list[str] = []
    lock = threading.Lock()

    def make() -> None:
        made = [new_unique_key() for _ in range(2000)]
        with lock:
            keys.extend(made)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(keys)) == 8000


def test_unique_key_timestamp_recovers_when_the_key_was_made():
    before = time.time_ns() // 1_000_000
    key = new_unique_key()
    after = time.time_ns() // 1_000_000
    assert before <= unique_key_timestamp(key) <= after


def test_unique_key_timestamp_reads_a_captured_cpp_client_key(monkeypatch):
    # The C++ client's key and the send's bornTimestamp from the same captured frame
    # (oracle nodecpp_produce_consume/0005); the capture ran on UTC.
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        stamp = unique_key_timestamp("7F0000016BF92E6959896F7389E10000", now_ms=1795361042914)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert stamp == 1795361042913


def test_unique_key_timestamp_of_garbage_is_none():
    assert unique_key_timestamp("not a key") is None
    assert unique_key_timestamp("") is None


def test_unique_key_from_late_last_month_reads_as_last_month(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        twenty_days_ms = 20 * 86_400_000
        key = "C0000202AAAA12345678" + f"{twenty_days_ms:08X}" + "0001"
        march_2nd = 1772409600000  # 2026-03-02T00:00:00Z
        stamp = unique_key_timestamp(key, now_ms=march_2nd)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert stamp == 1769904000000 + twenty_days_ms  # 2026-02-01T00:00:00Z + 20 days

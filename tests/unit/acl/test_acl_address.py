"""White-address patterns: RocketMQ's forms, and typos refused at load."""

from __future__ import annotations

import pytest

from tidemq.acl.address import AddressPattern, peer_ip


def matches(pattern: str, address: str) -> bool:
    return AddressPattern.parse(pattern).matches(peer_ip(f"{address}:1234"))


@pytest.mark.parametrize(
    ("pattern", "address", "expected"),
    [
        ("*", "10.1.2.3", True),
        ("*.*.*.*", "10.1.2.3", True),
        ("", "10.1.2.3", False),
        ("10.1.2.3", "10.1.2.3", True),
        ("10.1.2.3", "10.1.2.4", False),
        ("10.1.2.3,10.1.2.9", "10.1.2.9", True),
        ("10.1.2.{3,9}", "10.1.2.9", True),
        ("10.1.2.{3,9}", "10.1.2.4", False),
        ("10.1.2.*", "10.1.2.200", True),
        ("10.1.2.*", "10.1.3.1", False),
        ("10.1.2.1-100", "10.1.2.100", True),
        ("10.1.2.1-100", "10.1.2.101", False),
        ("10.1.1-9.*", "10.1.5.77", True),
        ("10.1.1-9.*", "10.1.10.1", False),
        ("2001:db8::1", "2001:db8:0:0:0:0:0:1", True),
        ("2001:db8::{1,2}", "2001:db8::2", True),
        ("2001:db8::1-ff", "2001:db8::a0", True),
        ("2001:db8::1-ff", "2001:db8::100", False),
        ("2001:db8:*:*:*:*:*:*", "2001:db8::5", True),
        ("127.0.0.1", "::ffff:127.0.0.1", True),
        ("10.1.2.*", "2001:db8::5", False),
    ],
)
def test_pattern_matches_as_rocketmq_means_it(pattern, address, expected):
    assert matches(pattern, address) is expected


@pytest.mark.parametrize("bad", ["10.1.2", "10.1.2.300", "10.1.2.9-3", "10.1.x.*", "hello",
                                 "10.1.2.{a,b}", "1:2:3"])
def test_a_pattern_that_is_not_one_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="address pattern"):
        AddressPattern.parse(bad)


def test_a_peer_without_an_ip_matches_only_everything():
    assert peer_ip("?") is None
    assert AddressPattern.parse("*").matches(None)
    assert not AddressPattern.parse("10.0.0.*").matches(None)

"""Remote-address patterns of RocketMQ's plain ACL (``whiteRemoteAddress``,
``globalWhiteRemoteAddresses``).

Forms (RocketMQ's ``RemoteAddressStrategyFactory``), IPv4 shown, IPv6 alike with hex groups:

- blank: matches nothing (an account without a white address must sign);
- ``*``, ``*.*.*.*`` or ``*:*:*:*:*:*:*:*``: matches every address;
- one address: ``192.168.0.1``, ``2001:db8::1``;
- a list: ``192.168.0.1,192.168.0.2`` (addresses separated by commas);
- a list in the last part: ``192.168.0.{1,2,5}``;
- ranges and wildcards per part: ``192.168.0.*``, ``192.168.1-10.*``, ``192.168.0.1-100``.

RocketMQ accepts a wildcard or range only in the parts that follow fixed ones; tidemq
accepts a range or ``*`` in any part and means the same by the forms RocketMQ accepts. A
pattern that is none of these raises ``ValueError`` naming it, so a typo in the file is
reported at load instead of silently matching nothing. Matching takes the peer's address as
the remoting layer gives it (``ip:port``); an IPv4-mapped IPv6 address matches as IPv4.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

_IPV4_PARTS = 4
_IPV6_GROUPS = 8


def peer_ip(remote_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP of an ``"ip:port"`` peer address (IPv6 without brackets); None when it is not
    an IP (a Unix socket, ``"?"``)."""
    host = remote_address.rpartition(":")[0] if ":" in remote_address else remote_address
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


@dataclass(frozen=True, slots=True)
class AddressPattern:
    """One parsed address pattern; ``matches(ip)`` says whether a peer is covered.

    Attributes:
        text: the pattern as written in the file.
    """

    text: str
    _everything: bool
    _exact: frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]
    _v4_ranges: tuple[tuple[int, int], ...] | None
    _v6_ranges: tuple[tuple[int, int], ...] | None

    @classmethod
    def parse(cls, text: str | None) -> AddressPattern:
        """Parse a pattern (module docstring); None or blank gives one that matches nothing.

        Raises:
            ValueError: ``text`` is not a pattern; the message names it.
        """
        text = (text or "").strip()
        nothing = cls(text, False, frozenset(), None, None)
        if not text:
            return nothing
        if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
            return cls(text, True, frozenset(), None, None)
        if text.endswith("}"):
            head, brace, tail = text.partition("{")
            if not brace or "}" in head or not tail.endswith("}"):
                raise ValueError(_bad(text, "a list goes in braces at the end, e.g. 10.0.0.{1,2}"))
            members = [head + item.strip() for item in tail[:-1].split(",") if item.strip()]
            return cls(text, False, frozenset(_one_ip(text, m) for m in members), None, None)
        if "," in text:
            members = [item.strip() for item in text.split(",") if item.strip()]
            return cls(text, False, frozenset(_one_ip(text, m) for m in members), None, None)
        if "*" in text or "-" in text:
            if ":" in text:
                return cls(text, False, frozenset(), None, _v6_ranges(text))
            return cls(text, False, frozenset(), _v4_ranges(text), None)
        return cls(text, False, frozenset({_one_ip(text, text)}), None, None)

    def matches(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
        """True when the peer at ``ip`` is covered; None (no IP) is covered only by ``*``."""
        if self._everything:
            return True
        if ip is None:
            return False
        if self._exact:
            return ip in self._exact
        if isinstance(ip, ipaddress.IPv4Address):
            ranges, parts = self._v4_ranges, ip.packed
        else:
            ranges = self._v6_ranges
            packed = ip.packed
            parts = [int.from_bytes(packed[i : i + 2], "big") for i in range(0, 16, 2)]
        if ranges is None:
            return False
        return all(low <= part <= high for (low, high), part in zip(ranges, parts, strict=True))


def _bad(text: str, why: str) -> str:
    return f"address pattern {text!r} is not valid: {why}"


def _one_ip(pattern: str, text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(_bad(pattern, f"{text!r} is not an IPv4 or IPv6 address")) from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _part_range(pattern: str, part: str, base: int, top: int) -> tuple[int, int]:
    part = part.strip()
    if part == "*":
        return 0, top
    try:
        if "-" in part:
            low_text, _, high_text = part.partition("-")
            low, high = int(low_text, base), int(high_text, base)
        else:
            low = high = int(part, base)
    except ValueError:
        raise ValueError(_bad(pattern, f"part {part!r} is not a number, a range or *")) from None
    if not 0 <= low <= high <= top:
        raise ValueError(_bad(pattern, f"part {part!r} is outside 0-{top} or runs backwards"))
    return low, high


def _v4_ranges(text: str) -> tuple[tuple[int, int], ...]:
    parts = text.split(".")
    if len(parts) != _IPV4_PARTS:
        raise ValueError(_bad(text, "an IPv4 pattern has four parts, e.g. 10.0.0.* or 10.0.1-9.*"))
    return tuple(_part_range(text, part, 10, 255) for part in parts)


def _v6_ranges(text: str) -> tuple[tuple[int, int], ...]:
    head, double, tail = text.partition("::")
    if double:
        head_parts = head.split(":") if head else []
        tail_parts = tail.split(":") if tail else []
        missing = _IPV6_GROUPS - len(head_parts) - len(tail_parts)
        if missing < 1:
            raise ValueError(_bad(text, "'::' stands for no group at all"))
        parts = head_parts + ["0"] * missing + tail_parts
    else:
        parts = text.split(":")
    if len(parts) != _IPV6_GROUPS:
        raise ValueError(_bad(text, "an IPv6 pattern has eight groups (or '::')"))
    return tuple(_part_range(text, part, 16, 0xFFFF) for part in parts)

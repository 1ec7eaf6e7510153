"""Compare what Apache's broker and tidemq answered, and say exactly where they differ."""

from __future__ import annotations

from typing import Any

VALUE_CHARS_MAX = 120  # a 4 MiB body in a failure message helps no one


def _short(value: Any) -> str:
    text = repr(value)
    if len(text) <= VALUE_CHARS_MAX:
        return text
    return f"{text[:VALUE_CHARS_MAX]}... ({len(text)} chars)"


def differences(apache: Any, tidemq: Any, path: str = "") -> list[str]:
    """Lines ``path: apache=<a> tidemq=<t>`` for every leaf where the two differ."""
    if isinstance(apache, dict) and isinstance(tidemq, dict):
        lines = []
        for key in sorted(set(apache) | set(tidemq), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in tidemq:
                lines.append(f"{where}: apache={_short(apache[key])} tidemq=(absent)")
            elif key not in apache:
                lines.append(f"{where}: apache=(absent) tidemq={_short(tidemq[key])}")
            else:
                lines += differences(apache[key], tidemq[key], where)
        return lines
    if isinstance(apache, list) and isinstance(tidemq, list):
        if len(apache) != len(tidemq):
            return [f"{path}: apache has {len(apache)} items, tidemq {len(tidemq)}"]
        lines = []
        for index, (left, right) in enumerate(zip(apache, tidemq, strict=True)):
            lines += differences(left, right, f"{path}[{index}]")
        return lines
    return [] if apache == tidemq else [f"{path}: apache={_short(apache)} tidemq={_short(tidemq)}"]


def assert_same(apache: Any, tidemq: Any, what: str) -> None:
    """AssertionError listing every difference between the two answers about ``what``."""
    lines = differences(apache, tidemq)
    assert not lines, f"{what} differ:\n  " + "\n  ".join(lines)


UNIQUE_KEY = "UNIQ_KEY"


def without_generated_unique_key(apache_properties: dict[str, str],
                                 tidemq_properties: dict[str, str]) -> dict[str, str]:
    """tidemq's properties less the UNIQ_KEY it generated where the sender gave none.

    Deliberate difference (docs/differences.md): tidemq gives every stored message a
    UNIQ_KEY, so even a message from a client that sets none can be found by id; Apache's
    4.9 broker stores such a message without one. The generated key must look like a
    client's (32 hex digits).
    """
    if UNIQUE_KEY in apache_properties or UNIQUE_KEY not in tidemq_properties:
        return tidemq_properties
    generated = tidemq_properties[UNIQUE_KEY]
    assert len(generated) == 32 and all(c in "0123456789ABCDEF" for c in generated), generated
    return {key: value for key, value in tidemq_properties.items() if key != UNIQUE_KEY}

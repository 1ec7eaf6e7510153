"""How RocketMQ's SQL92 filter compares values (its ``ComparisonExpression``, with string
conversion on, as RocketMQ's parser always sets it).

Values are Python ``None`` (SQL NULL: a missing property), ``bool``, ``int``, ``float`` and
``str``. Message properties are always strings; numbers come from literals. Java tells
Integer from Long; here an ``int`` is an Integer when it fits in 32 bits, else a Long, which
only matters for how wide a string converted against it may be.

``java_compare(left, right)`` is RocketMQ's ``__compare``: when the two types differ, one side
is converted towards the other:

    left \\ right   bool             int               float             str
    bool            compare          -1                -1                fails (1)
    int             -1               compare           as doubles        right -> int (2)
    float           -1               as doubles        compare           right -> double (3)
    str             left -> bool (4) left -> int (2)   left -> double (3) compare (5)

(1) RocketMQ casts the Boolean to a String there and throws; (2) Java ``Integer.valueOf`` /
``Long.valueOf``: an optional sign and decimal digits only; (3) Java ``Double.valueOf``
(surrounding blanks, ``NaN``, ``Infinity``, a trailing ``d``/``f`` allowed; hexadecimal
floats are not supported here); (4) ``"true"`` in any case is true, anything else false;
(5) code-point order (only ``=``/``<>`` reach it: ``>``-style operators compare two strings as
doubles). A conversion that fails raises ``EvaluationFailed``: RocketMQ then counts the whole
expression as not matching, whatever the rest of it says. -1 means "unequal, and less", also
for types that cannot be compared at all. Doubles compare as Java's ``Double.compareTo``:
NaN equals itself and is above everything, -0.0 is below 0.0.
"""

from __future__ import annotations

import math
import re

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

Value = None | bool | int | float | str

_JAVA_INTEGER = re.compile(r"[+-]?\d+")
_JAVA_DOUBLE = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)"
)
# Java's String.trim() strips every char <= ' ' before Double.valueOf parses.
_JAVA_BLANKS = "".join(chr(code) for code in range(0x21))


class EvaluationFailed(Exception):
    """A comparison RocketMQ would throw on (a string that is not a number, ...). The
    expression as a whole does not match the message."""


def java_integer(text: str, *, wide: bool) -> int:
    """Java ``Long.valueOf`` (``wide``) or ``Integer.valueOf`` of ``text``.

    Raises:
        EvaluationFailed: not an optional sign and digits, or out of the type's range.
    """
    if _JAVA_INTEGER.fullmatch(text) is None:
        raise EvaluationFailed(f"{text[:40]!r} is not an integer")
    value = int(text)
    low, high = (INT64_MIN, INT64_MAX) if wide else (INT32_MIN, INT32_MAX)
    if not low <= value <= high:
        raise EvaluationFailed(f"{text[:40]!r} is out of the {'Long' if wide else 'Integer'} "
                               "range")
    return value


def java_double(text: str) -> float:
    """Java ``Double.valueOf`` of ``text`` (decimal forms, NaN, Infinity).

    Raises:
        EvaluationFailed: not a number Java would read.
    """
    trimmed = text.strip(_JAVA_BLANKS)
    if _JAVA_DOUBLE.fullmatch(trimmed) is None:
        raise EvaluationFailed(f"{text[:40]!r} is not a number")
    if trimmed[-1] in "fFdD":  # NaN and Infinity end otherwise
        trimmed = trimmed[:-1]
    return float(trimmed.replace("Infinity", "inf"))


def is_wide(value: int) -> bool:
    """True when Java would hold this integer literal as a Long (outside Integer's range)."""
    return not INT32_MIN <= value <= INT32_MAX


def double_compare(left: float, right: float) -> int:
    """Java ``Double.compare``: NaN equals NaN and is above all; -0.0 is below 0.0."""
    if left < right:
        return -1
    if left > right:
        return 1
    left_nan = left != left
    right_nan = right != right
    if left_nan or right_nan:
        return int(left_nan) - int(right_nan)
    if left == 0.0:
        return int(math.copysign(1.0, left) > 0) - int(math.copysign(1.0, right) > 0)
    return 0


def java_compare(left: Value, right: Value) -> int:
    """RocketMQ's ``__compare`` of two non-null values (see the module table).

    Raises:
        EvaluationFailed: a conversion the table says fails.
    """
    left_type = type(left)
    right_type = type(right)
    if left_type is right_type:
        if left_type is float:
            return double_compare(left, right)  # type: ignore[arg-type]
        return (left > right) - (left < right)  # type: ignore[operator]
    if left_type is bool:
        if right_type is str:
            raise EvaluationFailed("a boolean cannot be compared with a string")
        return -1
    if left_type is int:
        if right_type is float:
            return double_compare(float(left), right)  # type: ignore[arg-type]
        if right_type is str:
            converted = java_integer(right, wide=is_wide(left))  # type: ignore[arg-type]
            return (left > converted) - (left < converted)  # type: ignore[operator]
        return -1
    if left_type is float:
        if right_type is int:
            return double_compare(left, float(right))  # type: ignore[arg-type]
        if right_type is str:
            return double_compare(left, java_double(right))  # type: ignore[arg-type]
        return -1
    # left is a str
    if right_type is bool:
        as_bool = left.lower() == "true"  # type: ignore[union-attr]
        return (as_bool > right) - (as_bool < right)  # type: ignore[operator]
    if right_type is int:
        converted = java_integer(left, wide=is_wide(right))  # type: ignore[arg-type]
        return (converted > right) - (converted < right)  # type: ignore[operator]
    return double_compare(java_double(left), right)  # type: ignore[arg-type]

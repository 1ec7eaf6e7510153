"""JSON as RocketMQ's Java peers write it: fastjson's quirks on read, fastjson's shape on write.

Theory of operation
-------------------
RocketMQ bodies and config files are written by fastjson (docs/protocol.md §5, §10.5), which
differs from standard JSON in two ways a Python peer must read:

* ``Map<Integer|Long, V>`` is written with unquoted numeric keys: ``{0:"10.0.0.1:10911"}``.
* ``Map<MessageQueue, V>`` is written with a JSON object as the key:
  ``{{"brokerName":"b","queueId":0,"topic":"T"}:{"maxOffset":5}}``.

``loads`` tries orjson first (standard JSON, the common case, at C speed) and only on failure
runs a small recursive-descent parser that also accepts those two key forms. Integer keys
become ``int``; object keys become a hashable :class:`JsonObjectKey`. Quoted keys stay ``str``
(``"0"`` is not turned into ``0``: callers that expect integer keys convert, so both forms read
the same). The tolerant parser bounds nesting at ``JSON_DEPTH_MAX`` and raises
:class:`JsonDecodeError` instead of ``RecursionError``.

``dumps`` writes what fastjson writes: keys sorted alphabetically, enums by name, ``None``
kept (callers omit the fields fastjson would omit), integer keys quoted unless
``unquoted_int_keys`` asks for fastjson's legacy form, and :class:`JsonObjectKey` keys (or any
key with a ``to_json_key()`` method returning a dict) written as JSON objects. Objects made of
plain ``dict``/``list``/``tuple``/``str``/``int``/``float``/``bool``/``None`` go straight to
orjson; anything else goes through a Python writer that produces byte-identical layout
(compact, or orjson's two-space indentation when ``pretty``).
"""

from __future__ import annotations

import enum
import json.decoder
import json.encoder
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import orjson

from tidemq.errors import LocalProtocolError, RemoteProtocolError

# Deep enough for every RocketMQ body (the deepest, ConsumerRunningInfo, nests about 6
# levels), shallow enough that the recursive parser stays far below Python's recursion limit
# of 1000 frames (two frames per level).
JSON_DEPTH_MAX = 200


class JsonDecodeError(RemoteProtocolError):
    """Bytes that are not JSON, even by fastjson's looser rules. ``position`` is a char index."""

    def __init__(self, message: str, position: int | None = None):
        super().__init__(message)
        self.position = position


class JsonShapeError(JsonDecodeError):
    """Valid JSON that is not the shape expected (a missing field, a string for an int)."""


class JsonEncodeError(LocalProtocolError):
    """An object that cannot be written as JSON (unknown type, int over 64 bits, a cycle)."""


class JsonObjectKey(tuple):
    """A JSON object used as a map key (fastjson's ``Map<MessageQueue, V>`` form), hashable.

    A tuple of ``(name, value)`` pairs sorted by name; nested objects are ``JsonObjectKey``
    and arrays are tuples, so the whole key is hashable. Two keys with the same fields are
    equal whatever their original order.

    >>> key = JsonObjectKey({"topic": "T", "queueId": 0, "brokerName": "b"})
    >>> key.get("queueId"), key.as_dict()["topic"]
    (0, 'T')
    """

    __slots__ = ()

    def __new__(cls, fields: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> JsonObjectKey:
        items = fields.items() if isinstance(fields, Mapping) else fields
        return super().__new__(cls, sorted((name, _freeze(value)) for name, value in items))

    def get(self, name: str, default: Any = None) -> Any:
        """The value of field ``name``, or ``default`` when the key has no such field."""
        for field_name, value in self:
            if field_name == name:
                return value
        return default

    def keys(self) -> Iterator[str]:
        """The field names, sorted."""
        return (name for name, _ in self)

    def as_dict(self) -> dict[str, Any]:
        """The key as a plain ``dict`` (nested keys as dicts, arrays as lists)."""
        return {name: _thaw(value) for name, value in self}

    def to_json_key(self) -> dict[str, Any]:
        """What ``dumps`` writes for this key: the fields as a JSON object."""
        return self.as_dict()

    def __repr__(self) -> str:
        return f"JsonObjectKey({self.as_dict()!r})"


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return JsonObjectKey(value)
    if isinstance(value, list):
        return tuple(_freeze(item) for item in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, JsonObjectKey):
        return value.as_dict()
    if isinstance(value, tuple):
        return [_thaw(item) for item in value]
    return value


# -- reading ------------------------------------------------------------------------------------


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON as Java peers and RocketMQ config files write it.

    Args:
        data: UTF-8 bytes or text holding exactly one JSON value (whitespace around it is fine).

    Returns:
        The value: dicts, lists, str, int, float, bool, None. Unquoted integer keys come back
        as ``int``, object keys as :class:`JsonObjectKey`, quoted keys as ``str``.

    Raises:
        JsonDecodeError: the input is not JSON even by fastjson's rules, is not UTF-8, or
            nests deeper than ``JSON_DEPTH_MAX``; the message names the position.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonDecodeError(
                f"JSON is not valid UTF-8 at byte {exc.start}: {exc.reason}", exc.start
            ) from None
    return _parse_document(text)


_WHITESPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_INTEGER_KEY = re.compile(r"-?(?:0|[1-9][0-9]*)")
_LITERALS = (("true", True), ("false", False), ("null", None))
_scanstring = json.decoder.scanstring


def _parse_document(text: str) -> Any:
    position = _WHITESPACE.match(text, 0).end()
    value, position = _parse_value(text, position, 0)
    position = _WHITESPACE.match(text, position).end()
    if position != len(text):
        _fail(text, position, "unexpected data after the JSON value")
    return value


def _parse_value(text: str, position: int, depth: int) -> tuple[Any, int]:
    if position >= len(text):
        _fail(text, position, "unexpected end of data, expected a JSON value")
    char = text[position]
    if char == '"':
        return _parse_string(text, position)
    if char == "{":
        return _parse_object(text, position, depth + 1)
    if char == "[":
        return _parse_array(text, position, depth + 1)
    match = _NUMBER.match(text, position)
    if match:
        number = match.group()
        if match.group(1) or match.group(2):
            value = float(number)
            if value in (float("inf"), float("-inf")):
                _fail(text, position, f"number {number} is out of the range of a double")
            return value, match.end()
        return int(number), match.end()
    for word, value in _LITERALS:
        if text.startswith(word, position):
            return value, position + len(word)
    _fail(text, position, f"unexpected character {char!r}, expected a JSON value")


def _parse_string(text: str, position: int) -> tuple[str, int]:
    try:
        return _scanstring(text, position + 1, True)
    except json.JSONDecodeError as exc:
        _fail(text, exc.pos, exc.msg)


def _parse_object(text: str, position: int, depth: int) -> tuple[dict[Any, Any], int]:
    if depth > JSON_DEPTH_MAX:
        _fail(text, position, f"JSON nests deeper than JSON_DEPTH_MAX={JSON_DEPTH_MAX} levels")
    result: dict[Any, Any] = {}
    position = _WHITESPACE.match(text, position + 1).end()
    if text.startswith("}", position):
        return result, position + 1
    while True:
        key, position = _parse_key(text, position, depth)
        position = _WHITESPACE.match(text, position).end()
        if not text.startswith(":", position):
            _fail(text, position, "expected ':' after an object key")
        position = _WHITESPACE.match(text, position + 1).end()
        result[key], position = _parse_value(text, position, depth)
        position = _WHITESPACE.match(text, position).end()
        if text.startswith(",", position):
            position = _WHITESPACE.match(text, position + 1).end()
        elif text.startswith("}", position):
            return result, position + 1
        else:
            _fail(text, position, "expected ',' or '}' after an object member")


def _parse_key(text: str, position: int, depth: int) -> tuple[Any, int]:
    """A member key: a string, fastjson's unquoted integer, or fastjson's object key."""
    if text.startswith('"', position):
        return _parse_string(text, position)
    if text.startswith("{", position):
        fields, position = _parse_object(text, position, depth + 1)
        return JsonObjectKey(fields), position
    match = _INTEGER_KEY.match(text, position)
    if match:
        return int(match.group()), match.end()
    if position >= len(text):
        _fail(text, position, "unexpected end of data, expected an object key")
    _fail(text, position, "expected an object key (a string, an integer or an object)")


def _parse_array(text: str, position: int, depth: int) -> tuple[list[Any], int]:
    if depth > JSON_DEPTH_MAX:
        _fail(text, position, f"JSON nests deeper than JSON_DEPTH_MAX={JSON_DEPTH_MAX} levels")
    result: list[Any] = []
    position = _WHITESPACE.match(text, position + 1).end()
    if text.startswith("]", position):
        return result, position + 1
    while True:
        value, position = _parse_value(text, position, depth)
        result.append(value)
        position = _WHITESPACE.match(text, position).end()
        if text.startswith(",", position):
            position = _WHITESPACE.match(text, position + 1).end()
        elif text.startswith("]", position):
            return result, position + 1
        else:
            _fail(text, position, "expected ',' or ']' after an array element")


def _fail(text: str, position: int, problem: str) -> Any:
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    near = text[max(0, position - 20) : position + 20]
    raise JsonDecodeError(
        f"malformed JSON at character {position} (line {line}, column {column}): {problem}; "
        f"near {near!r}",
        position,
    )


# -- writing ------------------------------------------------------------------------------------

_FAST_SCALARS = frozenset({str, int, float, bool, type(None)})
_FAST_KEYS = frozenset({str, int, bool, type(None)})


def dumps(
    obj: Any,
    *,
    pretty: bool = False,
    sort_keys: bool = True,
    unquoted_int_keys: bool = False,
) -> bytes:
    """Write ``obj`` as fastjson would, in UTF-8.

    Args:
        obj: dicts, lists, tuples, str, int, float, bool, None and enums (written by name).
            Dict keys may be str, int, bool, enums, or objects with ``to_json_key()``
            (:class:`JsonObjectKey` has one) written as JSON objects.
        pretty: two-space indentation (files); compact otherwise (bodies).
        sort_keys: sort keys alphabetically by their written text, as fastjson does.
        unquoted_int_keys: write int keys bare (``{0:"a"}``), fastjson's legacy form that
            pre-4.9.4 Java readers of some bodies expect. Not standard JSON.

    Raises:
        JsonEncodeError: a value or key of a type JSON cannot carry, an int outside the
            64-bit range, or nesting deeper than ``JSON_DEPTH_MAX`` (a cycle, say).
    """
    if not unquoted_int_keys and _is_plain(obj, 0):
        option = orjson.OPT_NON_STR_KEYS
        if sort_keys:
            option |= orjson.OPT_SORT_KEYS
        if pretty:
            option |= orjson.OPT_INDENT_2
        try:
            return orjson.dumps(obj, option=option)
        except orjson.JSONEncodeError as exc:
            raise JsonEncodeError(f"cannot write JSON: {exc}") from None
    writer = _Writer(pretty, sort_keys, unquoted_int_keys)
    writer.write(obj, 0)
    try:
        return "".join(writer.pieces).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise JsonEncodeError(f"cannot write JSON: a string is not valid UTF-8 ({exc})") from None


def _is_plain(value: Any, depth: int) -> bool:
    """True when orjson writes ``value`` exactly as fastjson would (no enums, no object keys)."""
    if depth > JSON_DEPTH_MAX:
        return False
    kind = type(value)
    if kind in _FAST_SCALARS:
        return True
    if kind is dict:
        for key, item in value.items():
            if type(key) not in _FAST_KEYS:
                return False
            if type(item) not in _FAST_SCALARS and not _is_plain(item, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:
            if type(item) not in _FAST_SCALARS and not _is_plain(item, depth + 1):
                return False
        return True
    return False


class _Writer:
    """The slow path: writes what orjson would, plus enums by name and object keys.

    Builds text pieces (one ``join`` and ``encode`` at the end); strings are escaped by the
    stdlib's C ``encode_basestring``, which escapes exactly what orjson does.
    """

    __slots__ = ("pieces", "pretty", "sort_keys", "unquoted_int_keys")

    def __init__(self, pretty: bool, sort_keys: bool, unquoted_int_keys: bool):
        self.pieces: list[str] = []
        self.pretty = pretty
        self.sort_keys = sort_keys
        self.unquoted_int_keys = unquoted_int_keys

    def write(self, value: Any, depth: int) -> None:
        kind = type(value)
        if kind is str:
            self.pieces.append(_quote(value))
        elif kind is int:
            self.pieces.append(_int_text(value))
        elif kind is dict:
            self._write_object(value, depth)
        elif kind is list or kind is tuple:
            self._write_array(value, depth)
        else:
            self._write_other(value, depth)

    def _write_other(self, value: Any, depth: int) -> None:
        if value is None or value is True or value is False:
            self.pieces.append(_LITERAL_TEXT[value])
        elif isinstance(value, enum.Enum):
            self.pieces.append(_quote(value.name))
        elif isinstance(value, JsonObjectKey) or hasattr(value, "to_json_key"):
            self._write_object(value.to_json_key(), depth)
        elif isinstance(value, Mapping):
            self._write_object(value, depth)
        elif isinstance(value, list | tuple):
            self._write_array(value, depth)
        elif isinstance(value, str):
            self.pieces.append(_quote(value))
        elif isinstance(value, int):
            self.pieces.append(_int_text(int(value)))
        else:
            # Floats (orjson's shortest round-trip form) and what orjson writes natively.
            self.pieces.append(_orjson_text(value))

    def _write_object(self, mapping: Mapping[Any, Any], depth: int) -> None:
        if not mapping:
            self.pieces.append("{}")
            return
        depth += 1
        if depth > JSON_DEPTH_MAX:
            raise JsonEncodeError(
                f"cannot write JSON nested deeper than JSON_DEPTH_MAX={JSON_DEPTH_MAX} levels "
                "(is there a reference cycle?)"
            )
        members = [(*self._key_text(key), value) for key, value in mapping.items()]
        if self.sort_keys:
            members.sort(key=_sort_text)
        pieces = self.pieces
        separator, colon, opening = self._punctuation(depth)
        pieces.append("{")
        pieces.append(opening)
        first = True
        for _, key_json, value in members:
            if not first:
                pieces.append(separator)
            first = False
            pieces.append(key_json)
            pieces.append(colon)
            self.write(value, depth)
        pieces.append(self._closing(depth, "}"))

    def _write_array(self, items: list[Any] | tuple[Any, ...], depth: int) -> None:
        if not items:
            self.pieces.append("[]")
            return
        depth += 1
        if depth > JSON_DEPTH_MAX:
            raise JsonEncodeError(
                f"cannot write JSON nested deeper than JSON_DEPTH_MAX={JSON_DEPTH_MAX} levels "
                "(is there a reference cycle?)"
            )
        pieces = self.pieces
        separator, _, opening = self._punctuation(depth)
        pieces.append("[")
        pieces.append(opening)
        first = True
        for item in items:
            if not first:
                pieces.append(separator)
            first = False
            self.write(item, depth)
        pieces.append(self._closing(depth, "]"))

    def _punctuation(self, depth: int) -> tuple[str, str, str]:
        """(between members, after a key, after the opening bracket) at nesting ``depth``."""
        if not self.pretty:
            return ",", ":", ""
        newline = "\n" + "  " * depth
        return "," + newline, ": ", newline

    def _closing(self, depth: int, bracket: str) -> str:
        return "\n" + "  " * (depth - 1) + bracket if self.pretty else bracket

    def _key_text(self, key: Any) -> tuple[str, str]:
        """(text to sort by, JSON to write) for a dict key, as orjson's OPT_NON_STR_KEYS."""
        kind = type(key)
        if kind is str:
            return key, _quote(key)
        if kind is int:
            text = _int_text(key)
            return text, text if self.unquoted_int_keys else '"' + text + '"'
        if isinstance(key, enum.Enum):
            return key.name, _quote(key.name)
        if key is None or isinstance(key, bool):
            text = _LITERAL_TEXT[key]
            return text, '"' + text + '"'
        if isinstance(key, str):
            return str(key), _quote(key)
        if isinstance(key, int):
            return self._key_text(int(key))
        if isinstance(key, float):
            text = _orjson_text(key)
            return text, '"' + text + '"'
        if isinstance(key, JsonObjectKey) or hasattr(key, "to_json_key"):
            # An object key is always compact, even in a pretty document, as fastjson writes it.
            writer = _Writer(False, self.sort_keys, self.unquoted_int_keys)
            writer.write(key.to_json_key(), 0)
            text = "".join(writer.pieces)
            return text, text
        raise JsonEncodeError(
            f"cannot write a dict key of type {type(key).__name__} ({key!r:.80}) as JSON; "
            "use str, int, an enum, or an object with to_json_key()"
        )


_quote = json.encoder.encode_basestring  # C, escapes like orjson, leaves non-ASCII as is
_LITERAL_TEXT = {None: "null", True: "true", False: "false"}
_INT_MIN = -(2**63)  # orjson's range: int64 and uint64
_INT_MAX = 2**64 - 1


def _sort_text(member: tuple[str, str, Any]) -> str:
    return member[0]


def _int_text(value: int) -> str:
    if not _INT_MIN <= value <= _INT_MAX:
        raise JsonEncodeError(f"cannot write int {value} as JSON: Integer exceeds 64-bit range")
    return str(value)


def _orjson_text(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as exc:
        raise JsonEncodeError(
            f"cannot write {type(value).__name__} value {value!r:.80} as JSON: {exc}"
        ) from None


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _unicode_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code > 0xFFFF:  # outside the BMP: a UTF-16 surrogate pair, as Java strings hold it
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def escape_non_ascii(data: bytes) -> bytes:
    """``data`` (UTF-8 JSON text) with every non-ASCII character written as ``\\uXXXX``.

    fastjson's BrowserCompatible feature does this; RocketMQ 4.9.4+ name servers use it for
    route data in standard JSON (docs/protocol.md §5). Non-ASCII characters only occur inside
    JSON strings, so escaping them everywhere keeps the document's meaning. ASCII input (the
    usual case) is returned as it is.
    """
    if data.isascii():
        return data
    return _NON_ASCII.sub(_unicode_escape, data.decode("utf-8")).encode("ascii")

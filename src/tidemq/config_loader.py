"""Server configuration: RocketMQ-style ``.properties`` files and ``--<key> value`` overrides.

A name server or broker reads its settings the way RocketMQ's do: a Java properties file of
camelCase keys (``brokerClusterName=DefaultCluster``), where any key may also be given on the
command line as ``--<key> value`` (which wins over the file). The values land in plain config
dataclasses (``NamesrvConfig``, ``BrokerConfig``, ``StoreConfig``); nothing else in tidemq
parses configuration text.

How a config dataclass declares its keys (the contract for every config class):

- ``field(metadata={"key": "flushDiskType"})``: the camelCase key RocketMQ uses. Without it the
  key is derived from the field name: snake_case becomes camelCase and a unit suffix (``_ms``,
  ``_s``, ``_seconds``, ``_hours``, ``_bytes``) is dropped, because RocketMQ's keys carry no
  units (``flush_interval_commit_log_ms`` -> ``flushIntervalCommitLog``). A field whose name is
  already camelCase is its own key.
- ``metadata={"choices": ("ASYNC_FLUSH", "SYNC_FLUSH")}``: the allowed values of a ``str``
  field. An ``enum.Enum`` field allows its member names (and its values when they are strings).
- ``metadata={"aliases": ("oldName",)}``: other spellings accepted for the same field.
- ``metadata={"min": 0, "max": 65535}``: bounds of a number.
- ``metadata={"config": False}``: the field is not configurable (derived at run time).
- Types understood: ``int``, ``float``, ``bool`` (``true``/``false``, any case), ``str``,
  ``pathlib.Path``, ``Enum`` subclasses, and ``X | None`` of those (an empty value -> None).

Keys are matched exactly first, then ignoring case (RocketMQ spells some keys with capitals,
e.g. ``checkCRCOnRecover``, that a derived name writes ``checkCrcOnRecover``). A key declared by
several targets is given to each of them, so they can never disagree.

Unknown keys and bad values fail at once with ``ConfigError`` naming the key, the value, where
it came from and what is allowed ("unknown key brokerNmae in broker.conf; did you mean
brokerName?"). A short, explicit list of keys that RocketMQ has but tidemq ignores on purpose
(thread-pool sizes, Netty buffer tuning, ``rocketmqHome``) is accepted with a logged notice, so
an existing RocketMQ config file works unchanged.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import logging
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tidemq.errors import ConfigError

log = logging.getLogger(__name__)

# RocketMQ keys that tidemq accepts and ignores: they tune things tidemq does not have (Netty
# thread pools and buffers, JVM paths, Java-only features). Failing on them would make every
# stock RocketMQ config file unusable; ignoring them silently would hide a typo'd real key, so
# each is logged once at start.
IGNORED_KEYS: Mapping[str, str] = {
    "rocketmqHome": "tidemq has no install directory to find",
    "configStorePath": "tidemq does not write its settings back to a file",
    "productEnvName": "tidemq has no product environments",
    "clusterTest": "tidemq has no cluster-test mode",
    "serverWorkerThreads": "tidemq serves each process on one event loop",
    "serverCallbackExecutorThreads": "tidemq serves each process on one event loop",
    "serverSelectorThreads": "tidemq serves each process on one event loop",
    "serverOnewaySemaphoreValue": "tidemq bounds requests per connection instead",
    "serverAsyncSemaphoreValue": "tidemq bounds requests per connection instead",
    "serverSocketSndBufSize": "tidemq leaves socket buffers to the kernel",
    "serverSocketRcvBufSize": "tidemq leaves socket buffers to the kernel",
    "serverPooledByteBufAllocatorEnable": "a Netty setting",
    "useEpollNativeSelector": "a Netty setting",
    "sendMessageThreadPoolNums": "tidemq serves each process on one event loop",
    "pullMessageThreadPoolNums": "tidemq serves each process on one event loop",
    "useReentrantLockWhenPutMessage": "tidemq has one writer per commit log",
}

COMMAND_LINE = "the command line"  # the source named in messages for --<key> value options
_UNIT_SUFFIXES = ("_ms", "_seconds", "_s", "_hours", "_bytes")
_TRUE_WORDS = ("true",)
_FALSE_WORDS = ("false",)
_INT_PATTERN = re.compile(r"[+-]?\d+")


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    """One configurable key: where it goes and what it accepts."""

    key: str
    target: type
    field_name: str
    value_type: Any
    optional: bool
    choices: tuple[str, ...] | None
    minimum: float | None
    maximum: float | None


def config_keys(target: type) -> list[ConfigKey]:
    """The configurable keys of one config dataclass, primary keys and aliases alike.

    Raises:
        TypeError: ``target`` is not a dataclass (a programming error).
    """
    if not dataclasses.is_dataclass(target):
        raise TypeError(f"{target!r} is not a config dataclass")
    hints = typing.get_type_hints(target)
    keys: list[ConfigKey] = []
    for field in dataclasses.fields(target):
        metadata = field.metadata
        if not field.init or metadata.get("config", True) is False:
            continue
        value_type, optional = _unwrap_optional(hints.get(field.name, str))
        choices = metadata.get("choices")
        if choices is None and isinstance(value_type, type) and issubclass(value_type, enum.Enum):
            choices = tuple(member.name for member in value_type)
        names = [metadata.get("key") or _derived_key(field.name), *metadata.get("aliases", ())]
        for name in names:
            keys.append(
                ConfigKey(
                    key=name,
                    target=target,
                    field_name=field.name,
                    value_type=value_type,
                    optional=optional,
                    choices=tuple(str(choice) for choice in choices) if choices else None,
                    minimum=metadata.get("min"),
                    maximum=metadata.get("max"),
                )
            )
    return keys


def load_config(
    targets: Sequence[type],
    file: Path | None,
    overrides: Mapping[str, str],
    *,
    ignored_keys: Mapping[str, str] = IGNORED_KEYS,
) -> list[Any]:
    """Build one instance of each target from a properties file and command-line overrides.

    Args:
        targets: config dataclasses; every key is looked up in all of them.
        file: a ``.properties`` file, or None for defaults only.
        overrides: ``{key: value}`` from ``--<key> value`` options; they win over the file.
        ignored_keys: keys accepted without effect (logged), with the reason.

    Returns:
        One instance per target, in the order of ``targets``.

    Raises:
        ConfigError: the file cannot be read, a key is unknown, or a value does not fit its
            field; the message names the key, the value, its source and what is allowed.
    """
    settings: list[tuple[str, str, str]] = []  # (key, value, source)
    if file is not None:
        settings += [(k, v, str(file)) for k, v in read_properties_file(file).items()]
    settings += [(k, v, COMMAND_LINE) for k, v in overrides.items()]
    by_key: dict[str, list[ConfigKey]] = {}
    for target in targets:
        for config_key in config_keys(target):
            by_key.setdefault(config_key.key, []).append(config_key)
    by_lower_key: dict[str, list[str]] = {}
    for key in by_key:
        by_lower_key.setdefault(key.lower(), []).append(key)

    values: dict[type, dict[str, Any]] = {target: {} for target in targets}
    for key, text, source in settings:
        matches = by_key.get(key)
        if matches is None and len(by_lower_key.get(key.lower(), ())) == 1:
            matches = by_key[by_lower_key[key.lower()][0]]
        if matches is None:
            if key in ignored_keys:
                log.info("ignoring %s=%s from %s: %s", key, text, source, ignored_keys[key])
                continue
            raise ConfigError(_unknown_key_message(key, source, list(by_key), list(ignored_keys)))
        for config_key in matches:
            values[config_key.target][config_key.field_name] = convert_value(
                config_key, text, source
            )
    return [target(**values[target]) for target in targets]


def convert_value(config_key: ConfigKey, text: str, source: str = COMMAND_LINE) -> Any:
    """Convert the text of one setting to its field's type.

    Raises:
        ConfigError: the text is not a value the field allows.
    """
    text = text.strip()
    value_type = config_key.value_type
    if text == "" and config_key.optional:
        return None

    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{config_key.key}={text} (from {source}): expected {expected}")

    if isinstance(value_type, type) and issubclass(value_type, enum.Enum):
        for member in value_type:
            if text == member.name or (isinstance(member.value, str) and text == member.value):
                return member
        raise bad(f"one of {', '.join(config_key.choices or ())}")
    if value_type is bool:
        if text.lower() in _TRUE_WORDS:
            return True
        if text.lower() in _FALSE_WORDS:
            return False
        raise bad("true or false")
    if value_type is int:
        if not _INT_PATTERN.fullmatch(text):
            raise bad("a whole number")
        value: Any = int(text)
    elif value_type is float:
        try:
            value = float(text)
        except ValueError:
            raise bad("a number") from None
    elif value_type is Path:
        value = Path(text).expanduser()
    else:
        value = text
    if config_key.choices is not None and str(value) not in config_key.choices:
        raise bad(f"one of {', '.join(config_key.choices)}")
    if config_key.minimum is not None and value < config_key.minimum:
        raise bad(f"at least {config_key.minimum}")
    if config_key.maximum is not None and value > config_key.maximum:
        raise bad(f"at most {config_key.maximum}")
    return value


def known_keys(targets: Iterable[type]) -> list[str]:
    """Every key the targets accept (primary keys and aliases), sorted."""
    return sorted({config_key.key for target in targets for config_key in config_keys(target)})


# -- Java .properties ---------------------------------------------------------------------------


def read_properties_file(path: Path) -> dict[str, str]:
    """Read a Java ``.properties`` file (UTF-8; Latin-1 when it is not valid UTF-8).

    Raises:
        ConfigError: the file cannot be read; the message names it.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(
            f"cannot read config file {path}: {e.strerror or e}; check the path given with -c"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")  # what java.util.Properties.load(InputStream) assumes
    return parse_properties(text)


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java properties text into ``{key: value}`` (later keys win, as in Java).

    Follows ``java.util.Properties.load``: ``#`` or ``!`` starts a comment line; the key ends
    at the first unescaped ``=``, ``:`` or whitespace; whitespace around the separator and at
    the start of a line is dropped; a line ending in an odd number of backslashes continues on
    the next line (its leading whitespace dropped); ``\\t \\n \\r \\f \\uXXXX`` are escapes and
    any other escaped character stands for itself (``\\:`` ``\\=`` ``\\ `` ``\\\\``).
    """
    result: dict[str, str] = {}
    for logical_line in _logical_lines(text):
        key, value = _split_key_value(logical_line)
        result[_unescape(key)] = _unescape(value)
    return result


def _logical_lines(text: str) -> Iterable[str]:
    pending: str | None = None
    for raw_line in _LINE_BREAK.split(text):
        line = raw_line.lstrip(" \t\f")
        if pending is None:
            if not line or line[0] in "#!":
                continue
        else:
            line = pending + line
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending = line[:-1]
            continue
        pending = None
        yield line
    if pending is not None:
        yield pending


def _split_key_value(line: str) -> tuple[str, str]:
    index = 0
    length = len(line)
    while index < length:
        char = line[index]
        if char == "\\":
            index += 2  # an escaped character never ends the key
            continue
        if char in "=: \t\f":
            break
        index += 1
    key = line[:index]
    value = line[index:].lstrip(" \t\f")
    if value[:1] in ("=", ":"):
        value = value[1:].lstrip(" \t\f")
    value = value.rstrip(" \t\f")
    if (len(value) - len(value.rstrip("\\"))) % 2 == 1:
        value += " "  # the value ended in an escaped space, which the strip above cut
    return key, value


_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # Java's line ends; str.splitlines knows more
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_ESCAPE_PATTERN = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text

    def replace(match: re.Match[str]) -> str:
        escaped = match.group(1)
        if len(escaped) == 5:
            return chr(int(escaped[1:], 16))
        return _ESCAPES.get(escaped, escaped)

    return _ESCAPE_PATTERN.sub(replace, text)


# -- command-line overrides ---------------------------------------------------------------------


def parse_override_args(args: Sequence[str]) -> dict[str, str]:
    """Turn extra command-line words ``--<key> value`` / ``--<key>=value`` into ``{key: value}``.

    Raises:
        ConfigError: a word is not an option, or an option has no value.
    """
    overrides: dict[str, str] = {}
    index = 0
    while index < len(args):
        word = args[index]
        if not word.startswith("--") or len(word) == 2:
            raise ConfigError(
                f"unexpected argument {word!r}: give settings as --<key> value "
                "(for example --listenPort 10911)"
            )
        key, equals, value = word[2:].partition("=")
        if not equals:
            if index + 1 >= len(args) or args[index + 1].startswith("--"):
                raise ConfigError(f"option --{key} needs a value (--{key} <value>)")
            index += 1
            value = args[index]
        overrides[key] = value
        index += 1
    return overrides


# -- helpers ------------------------------------------------------------------------------------


def _derived_key(field_name: str) -> str:
    if "_" not in field_name:
        return field_name  # already camelCase (or one word)
    for suffix in _UNIT_SUFFIXES:
        if field_name.endswith(suffix) and len(field_name) > len(suffix):
            field_name = field_name[: -len(suffix)]
            break
    head, *rest = field_name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        members = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(members) == 1:
            return members[0], True
        return str, True
    return hint, False


def _unknown_key_message(key: str, source: str, known: list[str], ignored: list[str]) -> str:
    where = f"on {source}" if source == COMMAND_LINE else f"in {source}"
    message = f"unknown key {key} {where}"
    candidates = [*known, *ignored]
    suggestions = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if not suggestions:
        lowered = {candidate.lower(): candidate for candidate in candidates}
        close = difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.6)
        suggestions = [lowered[match] for match in close]
    if suggestions:
        return f"{message}; did you mean {suggestions[0]}?"
    if len(known) <= _KEYS_LISTED_MAX:
        return f"{message}; known keys: {', '.join(sorted(known))}"
    return f"{message}; check its spelling against RocketMQ's key names"


# Few enough keys to list them all in an unknown-key message (the name server has ~10).
_KEYS_LISTED_MAX = 20


# -- settings of a running server -----------------------------------------------------------------


def current_properties(*configs: Any) -> dict[str, str]:
    """Every key of the given config instances with its current value as properties text
    would hold it (``true``/``false``, enums by value, None as empty); aliases are left out,
    and a secret that is set (``"secret"`` field metadata: a key password) shows as ******."""
    properties: dict[str, str] = {}
    for config in configs:
        primary = {config_key.field_name: config_key.key for config_key in
                   reversed(config_keys(type(config)))}
        secret = {f.name for f in dataclasses.fields(config) if f.metadata.get("secret")}
        for field_name, key in primary.items():
            value = getattr(config, field_name)
            if field_name in secret and value:
                text = "******"
            elif isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, enum.Enum):
                text = str(value.value)
            elif value is None:
                text = ""
            else:
                text = str(value)
            properties[key] = text
    return dict(sorted(properties.items()))


def apply_runtime_settings(configs: Sequence[Any], text: str,
                           runtime_keys: Iterable[str]) -> dict[str, str]:
    """Change settings of a running server from properties text (UPDATE_*_CONFIG bodies).

    All or nothing: every key is checked (known, changeable at run time, valid value) before
    any is set.

    Args:
        configs: the server's config instances; a key is set on each that declares it.
        text: ``key=value`` lines.
        runtime_keys: the keys that may change while the server runs.

    Returns:
        ``{key: text}`` of what was applied.

    Raises:
        ConfigError: an unknown key, a key that takes effect only at start, or a bad value;
            the message names it and what is allowed.
    """
    settings = parse_properties(text)
    if not settings:
        raise ConfigError("no setting given: send key=value lines")
    allowed = set(runtime_keys)
    by_key: dict[str, list[ConfigKey]] = {}
    for config in configs:
        for config_key in config_keys(type(config)):
            by_key.setdefault(config_key.key, []).append(config_key)
    planned: list[tuple[Any, str, Any]] = []
    for key, value_text in settings.items():
        matches = by_key.get(key)
        if matches is None:
            raise ConfigError(_unknown_key_message(key, "the request", list(by_key), []))
        if key not in allowed:
            raise ConfigError(
                f"{key} takes effect only at start; change it in the config file and restart "
                f"(changeable at run time: {', '.join(sorted(allowed))})")
        for config_key in matches:
            value = convert_value(config_key, value_text, "the request")
            for config in configs:
                if type(config) is config_key.target:
                    planned.append((config, config_key.field_name, value))
    before = [(config, field_name, getattr(config, field_name))
              for config, field_name, _ in planned]
    for config, field_name, value in planned:
        setattr(config, field_name, value)
    try:  # the class's own checks (ranges, combinations), as at start
        for config in configs:
            validate = getattr(config, "__post_init__", None)
            if validate is not None:
                validate()
    except ConfigError:
        for config, field_name, value in before:
            setattr(config, field_name, value)
        raise
    return {key: value.strip() for key, value in settings.items()}

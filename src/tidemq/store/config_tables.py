"""The broker's four persisted tables, as plain data with RocketMQ's JSON shapes (§10.6).

Each table lives in ``<storePathRootDir>/config/<file_name>`` (saved through
:class:`~tidemq.store.config_file.ConfigFile`, pretty-printed, with a ``.bak``), and the same
JSON, compact, is the body of the matching GET_ALL_* response::

    topics.json             TopicConfigTable         GET_ALL_TOPIC_CONFIG
      {"dataVersion":{"counter":3,"timestamp":1700000000000},
       "topicConfigTable":{"T":{"order":false,"perm":6,"readQueueNums":4,
           "topicFilterType":"SINGLE_TAG","topicName":"T","topicSysFlag":0,"writeQueueNums":4}}}
    consumerOffset.json     ConsumerOffsetTable      GET_ALL_CONSUMER_OFFSET
      {"offsetTable":{"T@group1":{"0":125,"1":130}}}           "topic@group" -> queueId -> offset
    subscriptionGroup.json  SubscriptionGroupTable   GET_ALL_SUBSCRIPTIONGROUP_CONFIG
      {"dataVersion":{...},"subscriptionGroupTable":{"group1":{"brokerId":0,
       "consumeBroadcastEnable":true,"consumeEnable":true,"consumeFromMinEnable":true,
       "groupName":"group1","notifyConsumerIdsChangedEnable":true,"retryMaxTimes":16,
       "retryQueueNums":1,"whichBrokerWhenConsumeSlowly":1}}}
    delayOffset.json        DelayOffsetTable         GET_ALL_DELAY_OFFSET
      {"offsetTable":{"1":0,"2":5}}                            delay level -> next queue offset

Integer map keys are written quoted (standard JSON, which fastjson reads too) and read in
either form, since fastjson writes them unquoted. Unknown fields (5.x additions such as
``attributes``) are ignored on read. Every table carries a :class:`DataVersion` bumped on each
change; the offset tables keep theirs in memory only, as 4.x writes no ``dataVersion`` there.

Plain data: no locks, no auto-creation. The broker's managers own a table each, mutate it on
one thread, and call ``to_json`` there; ``save`` may then run elsewhere with those bytes.
"""

from __future__ import annotations

import bisect
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Self, TypeVar

from tidemq.protocol import jsonx
from tidemq.protocol.jsonx import JsonShapeError
from tidemq.store.config_file import ConfigFile

CONFIG_DIR_NAME = "config"
TOPIC_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")
TOPIC_GROUP_SEPARATOR = "@"

# Permission bits (docs/protocol.md §11.2); 6 = read + write, what ordinary topics get.
PERM_READ = 0x4
PERM_WRITE = 0x2


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- checked reads of decoded JSON --------------------------------------------------------------


def _object(value: Any, where: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise JsonShapeError(f"{where} is {_show(value)}, expected a JSON object")
    return value


def _typed(value: Any, kind: type, where: str) -> Any:
    # bool is an int in Python but never one in Java's JSON.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = {int: "an integer", bool: "true or false", str: "a string"}[kind]
        raise JsonShapeError(f"{where} is {_show(value)}, expected {expected}")
    return value


_INTEGER_TEXT = re.compile(r"-?[0-9]{1,19}")


def _int_key(key: Any, where: str) -> int:
    """A map key that is an integer: unquoted (fastjson) or quoted (standard JSON)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and _INTEGER_TEXT.fullmatch(key):
        return int(key)
    raise JsonShapeError(f"{where} has key {_show(key)}, expected an integer")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- records with camelCase fields --------------------------------------------------------------

# (attribute, JSON name, type) for every field a record writes, in the order of the dataclass.
_Fields = tuple[tuple[str, str, type], ...]


def _record_to_json(record: Any, fields: _Fields) -> dict[str, Any]:
    return {name: getattr(record, attribute) for attribute, name, _ in fields}


def _record_from_json(cls: type, obj: Any, fields: _Fields, where: str, **given: Any) -> Any:
    """Build ``cls`` from a JSON object; absent fields take the dataclass defaults."""
    obj = _object(obj, where)
    values = dict(given)
    for attribute, name, kind in fields:
        if name in obj and attribute not in given:
            values[attribute] = _typed(obj[name], kind, f"{where}.{name}")
    return cls(**values)


@dataclass(slots=True)
class DataVersion:
    """A table's version: ``counter`` counts changes; equal versions mean equal tables.

    The name server compares the broker's topic-config version to skip unchanged
    registrations; a slave compares versions to skip unchanged syncs.
    """

    counter: int = 0
    timestamp_ms: int = field(default_factory=_now_ms)

    def bump(self) -> None:
        """Record one change (RocketMQ ``DataVersion.nextVersion``)."""
        self.counter += 1
        self.timestamp_ms = _now_ms()

    def to_json_object(self) -> dict[str, int]:
        return {"counter": self.counter, "timestamp": self.timestamp_ms}

    @classmethod
    def from_json_object(cls, obj: Any, where: str = "dataVersion") -> DataVersion:
        obj = _object(obj, where)
        return cls(
            counter=_typed(obj.get("counter", 0), int, f"{where}.counter"),
            timestamp_ms=_typed(obj.get("timestamp", 0), int, f"{where}.timestamp"),
        )


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """One topic's queues and permissions (RocketMQ ``TopicConfig``; defaults of the class).

    Frozen: change a topic with ``dataclasses.replace`` and :meth:`TopicConfigTable.put`, so
    the table sees every change and bumps its version.
    """

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def to_json_object(self) -> dict[str, Any]:
        return _record_to_json(self, _TOPIC_CONFIG_FIELDS)

    @classmethod
    def from_json_object(cls, obj: Any, where: str = "topicConfig") -> TopicConfig:
        """Raises JsonShapeError naming the field when ``obj`` is not a TopicConfig."""
        config = _record_from_json(cls, obj, _TOPIC_CONFIG_FIELDS, where)
        if config.topic_filter_type not in TOPIC_FILTER_TYPES:
            raise JsonShapeError(
                f"{where}.topicFilterType is {config.topic_filter_type!r}, expected one of "
                f"{', '.join(TOPIC_FILTER_TYPES)}"
            )
        return config


_TOPIC_CONFIG_FIELDS: _Fields = (
    ("topic_name", "topicName", str),
    ("read_queue_nums", "readQueueNums", int),
    ("write_queue_nums", "writeQueueNums", int),
    ("perm", "perm", int),
    ("topic_filter_type", "topicFilterType", str),
    ("topic_sys_flag", "topicSysFlag", int),
    ("order", "order", bool),
)


@dataclass(frozen=True, slots=True)
class SubscriptionGroupConfig:
    """One consumer group's settings (RocketMQ ``SubscriptionGroupConfig``, §5.5 defaults)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

    def to_json_object(self) -> dict[str, Any]:
        return _record_to_json(self, _SUBSCRIPTION_GROUP_FIELDS)

    @classmethod
    def from_json_object(
        cls, obj: Any, where: str = "subscriptionGroupConfig"
    ) -> SubscriptionGroupConfig:
        """Raises JsonShapeError naming the field when ``obj`` is not a group config."""
        return _record_from_json(cls, obj, _SUBSCRIPTION_GROUP_FIELDS, where)


_SUBSCRIPTION_GROUP_FIELDS: _Fields = (
    ("group_name", "groupName", str),
    ("consume_enable", "consumeEnable", bool),
    ("consume_from_min_enable", "consumeFromMinEnable", bool),
    ("consume_broadcast_enable", "consumeBroadcastEnable", bool),
    ("retry_queue_nums", "retryQueueNums", int),
    ("retry_max_times", "retryMaxTimes", int),
    ("broker_id", "brokerId", int),
    ("which_broker_when_consume_slowly", "whichBrokerWhenConsumeSlowly", int),
    ("notify_consumer_ids_changed_enable", "notifyConsumerIdsChangedEnable", bool),
)


# -- the tables ---------------------------------------------------------------------------------


class ConfigTable:
    """What every table shares: JSON in both directions and persistence through ConfigFile."""

    file_name: ClassVar[str]
    data_version: DataVersion

    def to_json_object(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_json_object(cls, obj: Any) -> Self:
        raise NotImplementedError

    def to_json(self, *, pretty: bool = False) -> bytes:
        """The table as JSON: compact for a GET_ALL_* body, ``pretty`` for the file."""
        return jsonx.dumps(self.to_json_object(), pretty=pretty)

    @classmethod
    def from_json(cls, data: bytes | str) -> Self:
        """Parse a file or a GET_ALL_* body.

        Raises:
            JsonDecodeError: not JSON; JsonShapeError (a subclass): not this table's shape,
                naming the field.
        """
        return cls.from_json_object(jsonx.loads(data))

    @classmethod
    def path_in(cls, store_path_root_dir: str | os.PathLike[str]) -> Path:
        """``<storePathRootDir>/config/<file_name>``."""
        return Path(store_path_root_dir) / CONFIG_DIR_NAME / cls.file_name

    @classmethod
    def load(cls, config_file: ConfigFile | str | os.PathLike[str]) -> Self:
        """Read the table from its file (or the ``.bak``); an empty table when neither exists.

        Raises:
            ConfigFileCorrupt: neither the file nor its backup holds this table.
        """
        config_file = _as_config_file(config_file)
        table = config_file.load_parsed(cls.from_json)
        return cls() if table is None else table

    def save(self, config_file: ConfigFile | str | os.PathLike[str]) -> None:
        """Write the table atomically (pretty JSON, previous version kept as ``.bak``).

        Raises:
            StoreFull, StoreError: as ConfigFile.save.
        """
        _as_config_file(config_file).save(self.to_json(pretty=True))


def _as_config_file(target: ConfigFile | str | os.PathLike[str]) -> ConfigFile:
    return target if isinstance(target, ConfigFile) else ConfigFile(target)


C = TypeVar("C", TopicConfig, SubscriptionGroupConfig)


class _NamedConfigTable(ConfigTable, Generic[C]):
    """A versioned table of configs keyed by their own names (topics, subscription groups).

    Subclasses name the JSON fields and the config type; every change that alters the table
    bumps ``data_version``, which the broker sends with its name-server registration.
    """

    table_field: ClassVar[str]  # the JSON object holding the entries, e.g. "topicConfigTable"
    name_field: ClassVar[str]  # each entry's own name field, e.g. "topicName"
    what: ClassVar[str]  # how error messages call the table
    config_type: ClassVar[Any]

    def __init__(self, configs: Iterable[C] = (), data_version: DataVersion | None = None):
        self._configs: dict[str, C] = {self._name_of(config): config for config in configs}
        self.data_version = data_version or DataVersion()
        # The names in the file's order and each entry's text at the same index, kept
        # across saves: a save joins cached bytes instead of re-serializing every entry (at
        # 10,000 topics that took 20-30 ms of the event loop per create) and looks nothing
        # up by name (10,000 dict lookups cost ~2 ms on a busy machine: cache misses).
        # Built on the first save.
        self._sorted_names: list[str] | None = None
        self._sorted_texts: list[bytes] = []
        self._stale: set[str] = set()  # names whose text is to be made at the next save

    @staticmethod
    def _name_of(config: C) -> str:
        raise NotImplementedError

    def get(self, name: str) -> C | None:
        return self._configs.get(name)

    def put(self, config: C) -> None:
        """Add or replace a config; bumps the version when anything changed."""
        name = self._name_of(config)
        before = self._configs.get(name)
        if before != config:
            self._configs[name] = config
            self.data_version.bump()
            if self._sorted_names is not None:
                self._stale.add(name)
                if before is None:
                    index = bisect.bisect_left(self._sorted_names, name)
                    self._sorted_names.insert(index, name)
                    self._sorted_texts.insert(index, b"")

    def remove(self, name: str) -> C | None:
        """Drop an entry; returns its config, or None (and no version bump) when absent."""
        config = self._configs.pop(name, None)
        if config is not None:
            self.data_version.bump()
            if self._sorted_names is not None:
                self._stale.discard(name)
                index = bisect.bisect_left(self._sorted_names, name)
                del self._sorted_names[index]
                del self._sorted_texts[index]
        return config

    def names(self) -> list[str]:
        return list(self._configs)

    def __contains__(self, name: object) -> bool:
        return name in self._configs

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._configs.values()))

    def __len__(self) -> int:
        return len(self._configs)

    def to_json_object(self) -> dict[str, Any]:
        return {
            "dataVersion": self.data_version.to_json_object(),
            self.table_field: {
                name: config.to_json_object() for name, config in self._configs.items()
            },
        }

    def to_json(self, *, pretty: bool = False) -> bytes:
        """The table as JSON: compact for a GET_ALL_* body, ``pretty`` for the file.

        The pretty form is the bytes ``jsonx.dumps(self.to_json_object(), pretty=True)``
        writes, assembled from per-entry text cached since the last change of each entry,
        so a save after one change serializes one entry, not the table.
        """
        if not pretty:
            return super().to_json()
        names = self._sorted_names
        if names is None:
            # Python orders str by code point, which is the UTF-8 byte order the writer uses.
            names = self._sorted_names = sorted(self._configs)
            self._sorted_texts = [b""] * len(names)
            self._stale = set(names)
        return b"".join(self.file_parts())

    def file_parts(self) -> list[bytes | memoryview]:
        """The pretty form (``to_json(pretty=True)``) as pieces to write one after another,
        the cached text of each entry among them: no copy of the table's bytes is made
        (at 10,000 topics one 2 MB copy, with its fresh pages, cost milliseconds on a busy
        machine). The list is the caller's; the pieces are never changed."""
        names = self._sorted_names
        if names is None:
            # Python orders str by code point, which is the UTF-8 byte order the writer uses.
            names = self._sorted_names = sorted(self._configs)
            self._sorted_texts = [b""] * len(names)
            self._stale = set(names)
        texts = self._sorted_texts
        for name in self._stale:
            # Each text ends with the separator; the last one's is left out below.
            texts[bisect.bisect_left(names, name)] = _pretty_entry(
                name, self._configs[name].to_json_object()) + b",\n"
        self._stale.clear()
        head = jsonx.dumps(
            {"dataVersion": self.data_version.to_json_object(), self.table_field: {}},
            pretty=True,
        )
        if not names:
            return [head]
        # The table is the last key ("dataVersion" sorts first): splice the entries into its {}.
        if not head.endswith(_EMPTY_LAST_OBJECT):
            raise AssertionError(f"unexpected layout of {self.what} JSON: {head[-40:]!r}")
        parts: list[bytes | memoryview] = [head[: -len(_EMPTY_LAST_OBJECT)] + b"{\n"]
        parts += texts
        parts[-1] = memoryview(texts[-1])[:-2]
        parts.append(b"\n  }\n}")
        return parts

    @classmethod
    def from_json_object(cls, obj: Any) -> Self:
        obj = _object(obj, cls.what)
        table = _object(obj.get(cls.table_field, {}), cls.table_field)
        configs = []
        for name, value in table.items():
            where = f"{cls.table_field}[{name!r}]"
            config = cls.config_type.from_json_object(
                _with_name(value, cls.name_field, name), where
            )
            if cls._name_of(config) != name:
                raise JsonShapeError(
                    f"{where}.{cls.name_field} is {cls._name_of(config)!r}, "
                    f"but the entry's key is {name!r}"
                )
            configs.append(config)
        return cls(configs, _data_version_of(obj))


_EMPTY_LAST_OBJECT = b"{}\n}"


def _pretty_entry(name: str, obj: dict[str, Any]) -> bytes:
    """One ``"name": {...}`` member of a table object, as the pretty writer lays it out two
    levels deep (JSON strings hold no raw newline, so re-indenting by lines is exact)."""
    text = jsonx.dumps({name: obj}, pretty=True)  # {\n  "name": {\n    ...\n  }\n}
    return b"  " + text[2:-2].replace(b"\n", b"\n  ")


class TopicConfigTable(_NamedConfigTable[TopicConfig]):
    """Every topic of a broker: ``topics.json`` and GET_ALL_TOPIC_CONFIG
    (TopicConfigSerializeWrapper)."""

    file_name = "topics.json"
    table_field = "topicConfigTable"
    name_field = "topicName"
    what = "topic config table"
    config_type = TopicConfig

    @staticmethod
    def _name_of(config: TopicConfig) -> str:
        return config.topic_name

    def topic_names(self) -> list[str]:
        return self.names()


class SubscriptionGroupTable(_NamedConfigTable[SubscriptionGroupConfig]):
    """Every consumer group's settings: ``subscriptionGroup.json`` and
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG (SubscriptionGroupWrapper)."""

    file_name = "subscriptionGroup.json"
    table_field = "subscriptionGroupTable"
    name_field = "groupName"
    what = "subscription group table"
    config_type = SubscriptionGroupConfig

    @staticmethod
    def _name_of(config: SubscriptionGroupConfig) -> str:
        return config.group_name

    def group_names(self) -> list[str]:
        return self.names()


class ConsumerOffsetTable(ConfigTable):
    """Committed consume offsets: ``consumerOffset.json`` and GET_ALL_CONSUMER_OFFSET.

    Keyed ``topic@group`` (neither name may contain ``@``) then queue id, as RocketMQ does;
    keys read from a file that lack the ``@`` are kept and written back unchanged.
    """

    file_name = "consumerOffset.json"

    def __init__(
        self,
        offsets: dict[str, dict[int, int]] | None = None,
        data_version: DataVersion | None = None,
    ):
        self._offsets = {key: dict(queues) for key, queues in (offsets or {}).items()}
        self.data_version = data_version or DataVersion()

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record ``group``'s next offset to consume in ``topic``'s queue ``queue_id``."""
        queues = self._offsets.setdefault(topic + TOPIC_GROUP_SEPARATOR + group, {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self.data_version.bump()

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        """The committed offset, or None when the group never committed one for that queue."""
        queues = self._offsets.get(topic + TOPIC_GROUP_SEPARATOR + group)
        return None if queues is None else queues.get(queue_id)

    def offsets_of(self, group: str, topic: str) -> dict[int, int]:
        """queue id -> offset of one group in one topic (a copy; empty when none)."""
        return dict(self._offsets.get(topic + TOPIC_GROUP_SEPARATOR + group, {}))

    def offsets_of_group(self, group: str) -> dict[str, dict[int, int]]:
        """topic -> queue id -> offset for every topic ``group`` committed in (a copy)."""
        return {
            topic: dict(queues) for (topic, owner), queues in self._split_items() if owner == group
        }

    def topics_of_group(self, group: str) -> set[str]:
        return {topic for (topic, owner), _ in self._split_items() if owner == group}

    def groups_of_topic(self, topic: str) -> set[str]:
        return {owner for (name, owner), _ in self._split_items() if name == topic}

    def remove_group(self, group: str) -> int:
        """Forget every offset of ``group``; returns how many topic entries went."""
        return self._remove(lambda topic, owner: owner == group)

    def remove_topic(self, topic: str) -> int:
        """Forget every group's offsets in ``topic``; returns how many group entries went."""
        return self._remove(lambda name, owner: name == topic)

    def __len__(self) -> int:
        return len(self._offsets)

    def items(self) -> list[tuple[tuple[str, str], dict[int, int]]]:
        """Every ((topic, group), queue id -> offset), copied (safe to keep)."""
        return [(key, dict(queues)) for key, queues in self._split_items()]

    def _split_items(self) -> Iterator[tuple[tuple[str, str], dict[int, int]]]:
        for key, queues in self._offsets.items():
            topic, separator, group = key.partition(TOPIC_GROUP_SEPARATOR)
            if separator:
                yield (topic, group), queues

    def _remove(self, matches: Callable[[str, str], bool]) -> int:
        doomed = [
            key
            for key in self._offsets
            if TOPIC_GROUP_SEPARATOR in key and matches(*key.split(TOPIC_GROUP_SEPARATOR, 1))
        ]
        for key in doomed:
            del self._offsets[key]
        if doomed:
            self.data_version.bump()
        return len(doomed)

    def to_json_object(self) -> dict[str, Any]:
        return {"offsetTable": {key: dict(queues) for key, queues in self._offsets.items()}}

    @classmethod
    def from_json_object(cls, obj: Any) -> ConsumerOffsetTable:
        obj = _object(obj, "consumer offset table")
        offsets: dict[str, dict[int, int]] = {}
        for key, queues in _object(obj.get("offsetTable", {}), "offsetTable").items():
            where = f"offsetTable[{key!r}]"
            _typed(key, str, f"offsetTable key {key!r}")
            offsets[key] = _int_map(queues, where)
        return cls(offsets, _data_version_of(obj))


class DelayOffsetTable(ConfigTable):
    """Progress of the delay scheduler: ``delayOffset.json`` and GET_ALL_DELAY_OFFSET.

    Delay level (1..18 by default) -> the next offset to deliver in queue ``level - 1`` of
    ``SCHEDULE_TOPIC_XXXX``.
    """

    file_name = "delayOffset.json"

    def __init__(
        self, offsets: dict[int, int] | None = None, data_version: DataVersion | None = None
    ):
        self._offsets = dict(offsets or {})
        self.data_version = data_version or DataVersion()

    def commit(self, level: int, offset: int) -> None:
        """Record the next offset to deliver for delay ``level``."""
        if level < 1:
            raise ValueError(f"delay level {level} is below 1; levels count from 1")
        if self._offsets.get(level) != offset:
            self._offsets[level] = offset
            self.data_version.bump()

    def query(self, level: int) -> int | None:
        """The next offset to deliver for ``level``, or None when it never advanced."""
        return self._offsets.get(level)

    def levels(self) -> list[int]:
        return sorted(self._offsets)

    def __len__(self) -> int:
        return len(self._offsets)

    def to_json_object(self) -> dict[str, Any]:
        return {"offsetTable": dict(self._offsets)}

    @classmethod
    def from_json_object(cls, obj: Any) -> DelayOffsetTable:
        obj = _object(obj, "delay offset table")
        offsets = _int_map(obj.get("offsetTable", {}), "offsetTable")
        for level in offsets:
            if level < 1:
                raise JsonShapeError(f"offsetTable has delay level {level}, expected 1 or more")
        return cls(offsets, _data_version_of(obj))


def _int_map(obj: Any, where: str) -> dict[int, int]:
    return {
        _int_key(key, where): _typed(value, int, f"{where}[{key!r}]")
        for key, value in _object(obj, where).items()
    }


def _with_name(obj: Any, name_field: str, name: str) -> Any:
    """The entry, with its name taken from the map key when the entry itself omits it."""
    if isinstance(obj, dict) and name_field not in obj:
        return {**obj, name_field: name}
    return obj


def _data_version_of(obj: dict[Any, Any]) -> DataVersion:
    if "dataVersion" not in obj:
        return DataVersion()
    return DataVersion.from_json_object(obj["dataVersion"])

"""The body of REGISTER_BROKER: a broker's topic table, as JSON or in compressed form.

Uncompressed (``compressed=false``, what brokers send by default), fastjson JSON
(docs/protocol.md §5.4)::

    {"filterServerList":[],
     "topicConfigSerializeWrapper":{
        "dataVersion":{"counter":3,"timestamp":1700000000000},
        "topicConfigTable":{"T":{"order":false,"perm":6,"readQueueNums":4,
                                 "topicFilterType":"SINGLE_TAG","topicName":"T",
                                 "topicSysFlag":0,"writeQueueNums":4}, ...}}}

Brokers older than V3_0_11 (version ordinal 37) send the ``topicConfigSerializeWrapper``
object alone, without the outer object.

Compressed (``compressed=true``): a zlib stream whose plaintext is, big-endian::

    int32  n        length of the DataVersion JSON
    n      bytes    DataVersion JSON, UTF-8
    int32  count    number of topics
    count times:
      int32  m      length of the line
      m      bytes  "topicName readQueueNums writeQueueNums perm topicFilterType" (UTF-8,
                    space separated; sysFlag and order are not carried)
    int32  k        length of the filter-server list JSON
    k      bytes    JSON array of "ip:port" strings

Every length is checked against what remains before slicing, and the plaintext is capped at
``REGISTER_BODY_PLAINTEXT_MAX`` bytes so a small compressed body cannot expand without bound.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from tidemq.errors import RemoteProtocolError
from tidemq.namesrv.route_data import (
    PERM_READ,
    PERM_WRITE,
    DataVersion,
    int_field,
    require_object,
)
from tidemq.protocol import jsonx

_INT32 = struct.Struct(">i")

# A topic line is under 200 bytes; 64 MiB holds ~300,000 topics, beyond any real broker,
# and bounds the memory a hostile 16 MiB compressed frame could make us allocate.
REGISTER_BODY_PLAINTEXT_MAX = 64 * 1024 * 1024

# The version from which brokers wrap the topic table in RegisterBrokerBody (V3_0_11).
VERSION_WITH_FILTER_SERVER = 37


@dataclass(slots=True)
class RegisteredTopicConfig:
    """The part of a broker's TopicConfig the name server keeps as a topic's QueueData."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_sys_flag: int = 0
    topic_filter_type: str = "SINGLE_TAG"
    order: bool = False

    def to_json_dict(self) -> dict[str, Any]:
        """The fastjson shape of TopicConfig."""
        return {
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }


@dataclass(slots=True)
class RegisterBrokerBody:
    """What a broker registers: its topic table, the table's version, its filter servers."""

    data_version: DataVersion = field(default_factory=DataVersion)
    topic_configs: dict[str, RegisteredTopicConfig] = field(default_factory=dict)
    filter_server_list: list[str] = field(default_factory=list)

    def encode(self, *, compressed: bool = False) -> bytes:
        """The body as a broker sends it (JSON, or the compressed form)."""
        if compressed:
            return _encode_compressed(self)
        wrapper = {
            "dataVersion": self.data_version.to_json_dict(),
            "topicConfigTable": {
                name: config.to_json_dict() for name, config in self.topic_configs.items()
            },
        }
        return jsonx.dumps(
            {"filterServerList": list(self.filter_server_list),
             "topicConfigSerializeWrapper": wrapper}
        )


def decode_register_broker_body(
    body: bytes | None, *, compressed: bool, version: int
) -> RegisterBrokerBody:
    """Decode a REGISTER_BROKER body.

    Args:
        body: the request body; None or empty means an empty table at DataVersion(0, 0).
        compressed: the request's ``compressed`` header field.
        version: the request's version; below ``VERSION_WITH_FILTER_SERVER`` the body is the
            bare TopicConfigSerializeWrapper.

    Raises:
        RemoteProtocolError: the body is not what a broker sends (bad JSON, wrong shape, a
            broken zlib stream, a lying length); the message says what was wrong.
    """
    if not body:
        return RegisterBrokerBody()
    if compressed:
        return _decode_compressed(body)
    document = jsonx.loads(body)
    if version < VERSION_WITH_FILTER_SERVER:
        return _from_wrapper(document, [])
    fields = require_object(document, "RegisterBrokerBody")
    filter_servers = fields.get("filterServerList") or []
    if not isinstance(filter_servers, list):
        raise jsonx.JsonShapeError("RegisterBrokerBody filterServerList is not an array")
    return _from_wrapper(
        fields.get("topicConfigSerializeWrapper") or {}, [str(addr) for addr in filter_servers]
    )


def _from_wrapper(value: Any, filter_servers: list[str]) -> RegisterBrokerBody:
    wrapper = require_object(value, "TopicConfigSerializeWrapper")
    data_version = DataVersion.from_json_dict(wrapper.get("dataVersion") or {})
    table = wrapper.get("topicConfigTable") or {}
    table = require_object(table, "topicConfigTable")
    configs = {}
    for name, config_value in table.items():
        configs[str(name)] = _topic_config_from_json(str(name), config_value)
    return RegisterBrokerBody(data_version, configs, filter_servers)


def _topic_config_from_json(name: str, value: Any) -> RegisteredTopicConfig:
    what = f"TopicConfig {name!r}"
    fields = require_object(value, what)
    topic_name = fields.get("topicName") or name
    if not isinstance(topic_name, str):
        raise jsonx.JsonShapeError(f"{what} topicName is {topic_name!r}, expected a string")
    # 4.8 and older brokers spell the flag topicSynFlag.
    sys_flag_key = "topicSysFlag" if "topicSysFlag" in fields else "topicSynFlag"
    filter_type = fields.get("topicFilterType", "SINGLE_TAG")
    return RegisteredTopicConfig(
        topic_name=topic_name,
        read_queue_nums=int_field(fields, "readQueueNums", what, 16),
        write_queue_nums=int_field(fields, "writeQueueNums", what, 16),
        perm=int_field(fields, "perm", what, PERM_READ | PERM_WRITE),
        topic_sys_flag=int_field(fields, sys_flag_key, what, 0),
        topic_filter_type=str(filter_type),
        order=bool(fields.get("order", False)),
    )


# -- compressed form ----------------------------------------------------------------------------


def _encode_compressed(body: RegisterBrokerBody) -> bytes:
    parts: list[bytes] = []

    def put(data: bytes) -> None:
        parts.append(_INT32.pack(len(data)))
        parts.append(data)

    put(jsonx.dumps(body.data_version.to_json_dict()))
    parts.append(_INT32.pack(len(body.topic_configs)))
    for config in body.topic_configs.values():
        line = (
            f"{config.topic_name} {config.read_queue_nums} {config.write_queue_nums} "
            f"{config.perm} {config.topic_filter_type}"
        )
        put(line.encode("utf-8"))
    put(jsonx.dumps(list(body.filter_server_list)))
    return zlib.compress(b"".join(parts), 9)  # Java's Deflater.BEST_COMPRESSION


def _decode_compressed(body: bytes) -> RegisterBrokerBody:
    inflater = zlib.decompressobj()
    try:
        plain = inflater.decompress(body, REGISTER_BODY_PLAINTEXT_MAX)
    except zlib.error as e:
        raise RemoteProtocolError(
            f"compressed RegisterBrokerBody is not a zlib stream: {e}"
        ) from None
    if inflater.unconsumed_tail:
        raise RemoteProtocolError(
            f"compressed RegisterBrokerBody expands beyond {REGISTER_BODY_PLAINTEXT_MAX} bytes"
        )
    reader = _Reader(plain)
    data_version = DataVersion.from_json_dict(jsonx.loads(reader.chunk("DataVersion JSON")))
    count = reader.int32("topic count")
    # Each topic takes at least its 4-byte length: a larger count is a lie, caught up front.
    if count < 0 or count * 4 > reader.remaining:
        raise RemoteProtocolError(
            f"compressed RegisterBrokerBody says {count} topics, but only "
            f"{reader.remaining} bytes remain"
        )
    configs: dict[str, RegisteredTopicConfig] = {}
    for _ in range(count):
        line = reader.chunk("topic line").decode("utf-8", errors="replace")
        config = _topic_config_from_line(line)
        configs[config.topic_name] = config
    filter_servers: list[str] = []
    if reader.remaining:
        servers = jsonx.loads(reader.chunk("filter server list"))
        if isinstance(servers, list):
            filter_servers = [str(addr) for addr in servers]
    return RegisterBrokerBody(data_version, configs, filter_servers)


def _topic_config_from_line(line: str) -> RegisteredTopicConfig:
    pieces = line.split(" ")
    if len(pieces) != 5 or not all(p.lstrip("-").isdigit() for p in pieces[1:4]):
        raise RemoteProtocolError(
            f"compressed RegisterBrokerBody topic line {line[:200]!r} is not "
            "'topicName readQueueNums writeQueueNums perm topicFilterType'"
        )
    name, read_nums, write_nums, perm, filter_type = pieces
    return RegisteredTopicConfig(
        topic_name=name,
        read_queue_nums=int(read_nums),
        write_queue_nums=int(write_nums),
        perm=int(perm),
        topic_filter_type=filter_type,
    )


class _Reader:
    __slots__ = ("data", "position")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.position = 0

    @property
    def remaining(self) -> int:
        return len(self.data) - self.position

    def int32(self, what: str) -> int:
        if self.remaining < 4:
            raise RemoteProtocolError(
                f"compressed RegisterBrokerBody ends inside the length of its {what}"
            )
        value = _INT32.unpack_from(self.data, self.position)[0]
        self.position += 4
        return value

    def chunk(self, what: str) -> bytes:
        length = self.int32(what)
        if length < 0 or length > self.remaining:
            raise RemoteProtocolError(
                f"compressed RegisterBrokerBody {what} is {length} bytes, but only "
                f"{self.remaining} remain"
            )
        start = self.position
        self.position += length
        return self.data[start : self.position]


"""The name server's route data and its JSON bodies (docs/protocol.md §5.2-5.4).

A topic's route is what a client needs to reach it: one ``QueueData`` per broker name that
serves the topic (queue counts and permission) and one ``BrokerData`` per broker name (its
cluster and the address of each broker id; id 0 is the master). Bodies are written as
fastjson writes them: keys sorted, nulls omitted::

    TopicRouteData  {"brokerDatas":[BrokerData...],"filterServerTable":{},
                     "orderTopicConf":"broker-a:4" (only when set),"queueDatas":[QueueData...]}
    BrokerData      {"brokerAddrs":{0:"10.0.0.1:10911"},"brokerName":"broker-a",
                     "cluster":"DefaultCluster"}
    QueueData       {"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,
                     "writeQueueNums":4}
    ClusterInfo     {"brokerAddrTable":{"broker-a":BrokerData},
                     "clusterAddrTable":{"DefaultCluster":["broker-a"]}}
    DataVersion     {"counter":3,"timestamp":1700000000000}
    TopicList       {"topicList":["a","b"]}
    KVTable         {"table":{"k":"v"}}

``brokerAddrs`` is a map keyed by the broker id (a Java long). fastjson writes such keys
unquoted (``{0:"..."}``), which is not standard JSON; Java clients before 4.9.4 expect that
form, newer ones ask for standard JSON (quoted ``"0"``) and 4.9.8 name servers give route data
in either form (``standard_json``) but cluster info always unquoted. The standard form also
escapes non-ASCII characters (a cluster or broker name, an address) as ``\\uXXXX``, as
fastjson's BrowserCompatible does for 4.9.4+; the legacy form writes them as raw UTF-8.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidemq.protocol import jsonx

# PermName bits (docs/protocol.md §11.2).
PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1

MASTER_ID = 0  # brokerId of a master; slaves have ids > 0

# KV namespace holding "brokerName:queueNums;..." per ordered topic (RocketMQ's
# NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG).
NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


@dataclass(frozen=True, slots=True)
class DataVersion:
    """A broker's topic-table version: equal versions mean nothing changed."""

    counter: int = 0
    timestamp: int = 0

    def to_json_dict(self) -> dict[str, int]:
        """The fastjson shape ``{"counter":...,"timestamp":...}``."""
        return {"counter": self.counter, "timestamp": self.timestamp}

    @classmethod
    def from_json_dict(cls, value: Any) -> DataVersion:
        """Read ``{"counter":...,"timestamp":...}``; unknown fields (5.x stateVersion) ignored.

        Raises:
            jsonx.JsonShapeError: not an object, or a field is not an integer.
        """
        fields = require_object(value, "DataVersion")
        return cls(
            counter=int_field(fields, "counter", "DataVersion", 0),
            timestamp=int_field(fields, "timestamp", "DataVersion", 0),
        )


@dataclass(slots=True)
class QueueData:
    """How many queues one broker name serves for a topic, and with which permission."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json_dict(self) -> dict[str, Any]:
        """The fastjson shape of QueueData (4.9 spelling ``topicSysFlag``)."""
        return {
            "brokerName": self.broker_name,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }


@dataclass(slots=True)
class BrokerData:
    """One broker name: its cluster and the address of each of its broker ids."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)

    def copy(self) -> BrokerData:
        """An independent copy (route answers must not alias the live table)."""
        return BrokerData(self.cluster, self.broker_name, dict(self.broker_addrs))

    def to_json_dict(self) -> dict[str, Any]:
        """The fastjson shape; ``brokerAddrs`` keys stay ints (the writer decides quoting)."""
        return {
            "brokerAddrs": dict(sorted(self.broker_addrs.items())),
            "brokerName": self.broker_name,
            "cluster": self.cluster,
        }


@dataclass(slots=True)
class TopicRouteData:
    """Everything a client needs to reach one topic."""

    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]
    filter_server_table: dict[str, list[str]] = field(default_factory=dict)
    order_topic_conf: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """The fastjson shape, ``orderTopicConf`` omitted when unset."""
        body: dict[str, Any] = {
            "brokerDatas": [broker.to_json_dict() for broker in self.broker_datas],
            "filterServerTable": dict(self.filter_server_table),
            "queueDatas": [queue.to_json_dict() for queue in self.queue_datas],
        }
        if self.order_topic_conf is not None:
            body["orderTopicConf"] = self.order_topic_conf
        return body

    def encode(self, *, standard_json: bool) -> bytes:
        """The body of a GET_ROUTEINFO_BY_TOPIC response.

        Args:
            standard_json: what 4.9.4+ clients ask for: quoted ``brokerAddrs`` keys and
                non-ASCII characters escaped as ``\\uXXXX`` (fastjson's BrowserCompatible);
                False writes fastjson's bare integer keys and raw UTF-8, as older clients
                expect.
        """
        if standard_json:
            return jsonx.escape_non_ascii(jsonx.dumps(self.to_json_dict()))
        return jsonx.dumps(self.to_json_dict(), unquoted_int_keys=True)


@dataclass(slots=True)
class ClusterInfo:
    """Every broker name with its addresses, and the broker names of every cluster."""

    broker_addr_table: dict[str, BrokerData]
    cluster_addr_table: dict[str, list[str]]

    def encode(self) -> bytes:
        """The body of a GET_BROKER_CLUSTER_INFO response (bare integer keys, as 4.9.8)."""
        body = {
            "brokerAddrTable": {
                name: broker.to_json_dict() for name, broker in self.broker_addr_table.items()
            },
            "clusterAddrTable": {
                cluster: sorted(names) for cluster, names in self.cluster_addr_table.items()
            },
        }
        return jsonx.dumps(body, unquoted_int_keys=True)


def encode_topic_list(topics: Iterable[str], broker_addr: str | None = None) -> bytes:
    """The TopicList body ``{"topicList":[...]}`` (``brokerAddr`` only when given)."""
    body: dict[str, Any] = {"topicList": sorted(topics)}
    if broker_addr is not None:
        body["brokerAddr"] = broker_addr
    return jsonx.dumps(body)


def encode_kv_table(table: Mapping[str, str]) -> bytes:
    """The KVTable body ``{"table":{...}}``."""
    return jsonx.dumps({"table": dict(table)})


# -- reading helpers shared by the body decoders; they raise JsonShapeError --------------------


def require_object(value: Any, what: str) -> dict[Any, Any]:
    """``value`` when it is a JSON object, else JsonShapeError naming ``what``."""
    if not isinstance(value, dict):
        raise jsonx.JsonShapeError(
            f"{what} is a {type(value).__name__}, expected a JSON object"
        )
    return value


def int_field(fields: Mapping[Any, Any], name: str, what: str, default: int | None) -> int:
    """Field ``name`` as an int (``default`` when absent; None makes it required)."""
    value = fields.get(name)
    if value is None:
        if default is None:
            raise jsonx.JsonShapeError(f"{what} has no {name!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)  # fastjson reads "4" into an int field; so do we
        raise jsonx.JsonShapeError(f"{what} field {name!r} is {value!r}, expected an integer")
    return value

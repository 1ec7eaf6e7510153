"""Topic routes from the name server and the queue lists a client derives from them.

``TopicRouteData`` is the GET_ROUTEINFO_BY_TOPIC body (docs/protocol.md §5.2)::

    {"brokerDatas":[{"brokerAddrs":{0:"ip:port",1:"ip:port"},"brokerName":"b","cluster":"c"}],
     "filterServerTable":{},"orderTopicConf":"b:4;c:4",
     "queueDatas":[{"brokerName":"b","perm":6,"readQueueNums":4,"topicSysFlag":0,
                    "writeQueueNums":4}]}

Name servers before 4.9.4 (and ours for old clients) write the ``brokerAddrs`` keys unquoted,
which is not JSON; ``tidemq.protocol.jsonx`` reads both forms. Keys arrive as ints or as
strings; both become ints here. ``topicSysFlag`` was ``topicSynFlag`` up to 4.8.

Derived lists (RocketMQ's ``MQClientInstance``):

- publish queues: for each QueueData sorted by broker name, when writable (perm & 2) and its
  broker has a master (id 0), queues 0..writeQueueNums-1. ``orderTopicConf`` ("b:n;c:m"), when
  present, replaces that list (an order topic pinned per broker).
- subscribe queues: for each readable QueueData (perm & 4), queues 0..readQueueNums-1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tidemq.client.message import MessageQueue
from tidemq.errors import RemoteProtocolError
from tidemq.protocol import jsonx

# PermName bits (docs/protocol.md §11.2).
PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1

MASTER_ID = 0


@dataclass(frozen=True, slots=True)
class QueueData:
    """How many queues a topic has on one broker, and their permissions."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)


@dataclass(frozen=True, slots=True)
class BrokerData:
    """One broker group: its cluster, name and addresses by broker id (0 = master)."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str]

    @property
    def master_address(self) -> str | None:
        """The master's "ip:port", or None when the group has no live master."""
        return self.broker_addrs.get(MASTER_ID)


@dataclass(frozen=True, slots=True)
class TopicRouteData:
    """A topic's route: per-broker queue data, broker addresses and the order-topic config."""

    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]
    order_topic_conf: str | None = None
    filter_server_table: dict[str, list[str]] = field(default_factory=dict)

    def broker(self, broker_name: str) -> BrokerData | None:
        """The BrokerData named ``broker_name``, or None."""
        for broker in self.broker_datas:
            if broker.broker_name == broker_name:
                return broker
        return None

    def master_addresses(self) -> dict[str, str]:
        """Broker name -> master address, for every broker group with a master."""
        return {
            b.broker_name: b.broker_addrs[MASTER_ID]
            for b in self.broker_datas
            if MASTER_ID in b.broker_addrs
        }

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        """The queues a producer may write, in RocketMQ's order (see the module docstring)."""
        if self.order_topic_conf:
            return _order_topic_queues(topic, self.order_topic_conf)
        masters = self.master_addresses()
        queues: list[MessageQueue] = []
        for data in sorted(self.queue_datas, key=lambda q: q.broker_name):
            if data.writable and data.broker_name in masters:
                queues.extend(
                    MessageQueue(topic, data.broker_name, i) for i in range(data.write_queue_nums)
                )
        return queues

    def subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """The queues a consumer may read, sorted."""
        queues = [
            MessageQueue(topic, data.broker_name, i)
            for data in self.queue_datas
            if data.readable
            for i in range(data.read_queue_nums)
        ]
        queues.sort()
        return queues

    def with_queue_nums_capped(self, queue_nums: int) -> TopicRouteData:
        """A copy whose queue counts are min(queue_nums, readQueueNums) for read and write.

        Used for the TBW102 route a producer borrows for a topic the name server does not know
        yet: the broker auto-creates the topic with that many queues on the first send.
        """
        capped = [
            replace(d, read_queue_nums=min(queue_nums, d.read_queue_nums),
                    write_queue_nums=min(queue_nums, d.read_queue_nums))
            for d in self.queue_datas
        ]
        return replace(self, queue_datas=capped)


def _order_topic_queues(topic: str, conf: str) -> list[MessageQueue]:
    queues: list[MessageQueue] = []
    for item in conf.split(";"):
        name, _, count = item.partition(":")
        if name and count.strip().isdigit():
            queues.extend(MessageQueue(topic, name, i) for i in range(int(count)))
    return queues


def parse_topic_route(body: bytes | str) -> TopicRouteData:
    """Parse a GET_ROUTEINFO_BY_TOPIC response body (standard or fastjson-quirk JSON).

    Raises:
        RemoteProtocolError: the body is not JSON or not shaped like TopicRouteData.
    """
    value = jsonx.loads(body)
    if not isinstance(value, Mapping):
        raise RemoteProtocolError(
            f"topic route body is a JSON {type(value).__name__}, expected an object"
        )
    try:
        return TopicRouteData(
            queue_datas=[_queue_data(q) for q in value.get("queueDatas") or ()],
            broker_datas=[parse_broker_data(b) for b in value.get("brokerDatas") or ()],
            order_topic_conf=value.get("orderTopicConf") or None,
            filter_server_table=dict(value.get("filterServerTable") or {}),
        )
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise RemoteProtocolError(
            f"topic route body is not shaped like TopicRouteData ({type(e).__name__}: {e})"
        ) from None


def _queue_data(value: Mapping[str, Any]) -> QueueData:
    sys_flag = value.get("topicSysFlag", value.get("topicSynFlag", 0))
    return QueueData(
        broker_name=str(value["brokerName"]),
        read_queue_nums=int(value.get("readQueueNums", 0)),
        write_queue_nums=int(value.get("writeQueueNums", 0)),
        perm=int(value.get("perm", 0)),
        topic_sys_flag=int(sys_flag or 0),
    )


def parse_broker_data(value: Mapping[str, Any]) -> BrokerData:
    """Build a BrokerData from its JSON object; brokerAddrs keys may be ints or strings.

    Raises:
        KeyError / ValueError: the object lacks ``brokerName`` or has a non-numeric broker id.
    """
    addrs = value.get("brokerAddrs") or {}
    return BrokerData(
        cluster=str(value.get("cluster", "")),
        broker_name=str(value["brokerName"]),
        broker_addrs={int(k): str(v) for k, v in addrs.items()},
    )


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """GET_BROKER_CLUSTER_INFO: broker groups by name, and broker names by cluster."""

    brokers: dict[str, BrokerData]
    clusters: dict[str, list[str]]

    def master_addresses(self, cluster: str | None = None) -> dict[str, str]:
        """Broker name -> master address, of one cluster or of all."""
        names = self.clusters.get(cluster, []) if cluster is not None else list(self.brokers)
        return {
            name: self.brokers[name].broker_addrs[MASTER_ID]
            for name in sorted(names)
            if name in self.brokers and MASTER_ID in self.brokers[name].broker_addrs
        }


def parse_cluster_info(body: bytes | str) -> ClusterInfo:
    """Parse a GET_BROKER_CLUSTER_INFO body (name servers write unquoted int keys).

    Raises:
        RemoteProtocolError: the body is not shaped like ClusterInfo.
    """
    value = jsonx.loads(body)
    if not isinstance(value, Mapping):
        raise RemoteProtocolError("cluster info body is not a JSON object")
    try:
        brokers = {
            str(name): parse_broker_data(data)
            for name, data in (value.get("brokerAddrTable") or {}).items()
        }
        clusters = {
            str(name): sorted(str(b) for b in members)
            for name, members in (value.get("clusterAddrTable") or {}).items()
        }
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise RemoteProtocolError(f"cluster info body is not shaped like ClusterInfo: {e}") \
            from None
    return ClusterInfo(brokers=brokers, clusters=clusters)

"""Raw requests of the differential tests, built with tidemq's protocol modules.

Each function returns a new ``RemotingCommand`` (a new opaque each call), so the same
function can be handed to ``Pair.broker_call`` for both brokers. Field names are RocketMQ's
(docs/protocol.md §3-§6); values are strings as a Java client sends them.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping

import orjson

from tidemq.protocol.codes import RequestCode, SerializeType
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.frame import FrameDecoder
from tidemq.protocol.message import decode_records, encode_properties

PERM_READ_WRITE = 6
SUBSCRIPTION_ALL = "*"


class Session:
    """One connection kept open; ``call`` returns the response whose opaque matches.

    A broker sends requests of its own on a consumer's connection (NOTIFY_CONSUMER_IDS_CHANGED
    after a heartbeat); they are oneway and skipped here.
    """

    def __init__(self, addr: str, timeout_s: float = 60.0) -> None:
        host, _, port = addr.rpartition(":")
        self.timeout_s = timeout_s
        self.socket = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.decoder = FrameDecoder()

    def call(self, request: RemotingCommand | bytes) -> RemotingCommand:
        """Send ``request`` (a command or a whole frame) and wait for its response."""
        if isinstance(request, bytes):
            opaque = RemotingCommand.decode(request[4:]).opaque
            self.socket.sendall(request)
        else:
            opaque = request.opaque
            self.socket.sendall(request.encode())
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            self.socket.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.socket.recv(1 << 20)
            if not data:
                raise ConnectionError("the server closed the connection without answering")
            for command in self.decoder.feed(data):
                if command.is_response and command.opaque == opaque:
                    return command
        raise TimeoutError(f"no response to opaque {opaque} within {self.timeout_s} s")

    def close(self) -> None:
        """Close the socket."""
        self.socket.close()


def create_topic(topic: str, queues: int = 4,
                 serialize_type: SerializeType = SerializeType.JSON) -> RemotingCommand:
    """UPDATE_AND_CREATE_TOPIC (17) on a broker."""
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(queues),
        "writeQueueNums": str(queues), "perm": str(PERM_READ_WRITE),
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false",
    }, serialize_type=serialize_type)


def send(topic: str, body: bytes, *, queue_id: int = 0, tags: str | None = "TagA",
         keys: str | None = None, properties: Mapping[str, str] | None = None,
         group: str = "diff_pg", sys_flag: int = 0, v2: bool = True,
         serialize_type: SerializeType = SerializeType.JSON) -> RemotingCommand:
    """SEND_MESSAGE_V2 (310, short field names) or SEND_MESSAGE (10, long names)."""
    props = dict(properties or {})
    if tags is not None:
        props["TAGS"] = tags
    if keys is not None:
        props["KEYS"] = keys
    props.setdefault("WAIT", "true")
    long_fields = {
        "producerGroup": group, "topic": topic, "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4", "queueId": str(queue_id), "sysFlag": str(sys_flag),
        "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
        "properties": encode_properties(props), "reconsumeTimes": "0", "unitMode": "false",
        "batch": "false",
    }
    if v2:
        short = dict(zip("abcdefghijkm", long_fields.values(), strict=True))
        return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, short, body,
                                       serialize_type=serialize_type)
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, long_fields, body,
                                   serialize_type=serialize_type)


def pull(topic: str, queue_id: int, offset: int, *, group: str = "diff_cg",
         max_msgs: int = 32, suspend_ms: int = 0, subscription: str = SUBSCRIPTION_ALL,
         expression_type: str = "TAG", sys_flag: int = 4,
         serialize_type: SerializeType = SerializeType.JSON) -> RemotingCommand:
    """PULL_MESSAGE (11). sysFlag 4 = FLAG_SUBSCRIPTION (the subscription is in the request);
    1 = commit offset, 2 = suspend (long polling); suspend_ms 0 answers at once."""
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": group, "topic": topic, "queueId": str(queue_id),
        "queueOffset": str(offset), "maxMsgNums": str(max_msgs), "sysFlag": str(sys_flag),
        "commitOffset": "0", "suspendTimeoutMillis": str(suspend_ms),
        "subscription": subscription, "subVersion": str(int(time.time() * 1000)),
        "expressionType": expression_type,
    }, serialize_type=serialize_type)


def queue_request(code: RequestCode, topic: str, queue_id: int = 0,
                  **extra: str) -> RemotingCommand:
    """GET_MAX_OFFSET / GET_MIN_OFFSET / GET_EARLIEST_MSG_STORETIME / SEARCH_OFFSET..."""
    return RemotingCommand.request(code, {"topic": topic, "queueId": str(queue_id), **extra})


def request(code: int, ext_fields: Mapping[str, str] | None = None, body: bytes | None = None,
            serialize_type: SerializeType = SerializeType.JSON) -> RemotingCommand:
    """Any request by code."""
    return RemotingCommand.request(code, ext_fields, body, serialize_type=serialize_type)


def messages(response: RemotingCommand) -> list:
    """The records of a FOUND pull's body (tidemq's record decoder)."""
    return decode_records(response.body or b"")


def heartbeat(group: str, topics: list[str], client_id: str = "127.0.0.1@differential",
              message_model: str = "CLUSTERING") -> RemotingCommand:
    """HEART_BEAT (34) registering a push consumer of ``group`` on ``topics`` (all tags)."""
    subscriptions = [{"classFilterMode": False, "codeSet": [], "expressionType": "TAG",
                      "subString": SUBSCRIPTION_ALL, "subVersion": int(time.time() * 1000),
                      "tagsSet": [], "topic": topic} for topic in topics]
    body = orjson.dumps({
        "clientID": client_id,
        "consumerDataSet": [{
            "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "consumeType": "CONSUME_PASSIVELY",
            "groupName": group, "messageModel": message_model,
            "subscriptionDataSet": subscriptions, "unitMode": False}],
        "producerDataSet": [],
    })
    return RemotingCommand.request(RequestCode.HEART_BEAT, None, body)

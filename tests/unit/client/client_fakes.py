"""A tiny in-process name server and brokers, speaking the real protocol over loopback.

Enough of RocketMQ's behaviour to drive the client's public API in fast unit tests: routes
(written with fastjson's unquoted int keys), sends and batches stored as real records, pulls
with the status codes of docs/protocol.md §4.4 and a short long-poll, consumer offsets, heart
beats. A broker's ``answer_sends_with`` / ``hold_sends`` let a test inject failures.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field

from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import (
    decode_batch_body,
    decode_properties,
    decode_record,
    encode_record,
    pack_host,
)
from tidemq.remoting.server import RemotingServer

PULL_HOLD_CAP_S = 0.3  # the fake holds a pull at most this long, whatever the client asks


@dataclass
class StoredQueue:
    records: list[bytes] = field(default_factory=list)
    store_times: list[int] = field(default_factory=list)
    min_offset: int = 0

    @property
    def max_offset(self) -> int:
        return self.min_offset + len(self.records)


class FakeBroker:
    def __init__(self, name: str, cluster: str = "c1"):
        self.name = name
        self.cluster = cluster
        self.server = RemotingServer("127.0.0.1", [0])
        self.address = ""
        self.queues: dict[tuple[str, int], StoredQueue] = defaultdict(StoredQueue)
        self.requests: list[RemotingCommand] = []
        self.heartbeats: list[dict] = []
        self.member_questions = 0  # GET_CONSUMER_LIST_BY_GROUP requests answered
        self.unregistered: list[dict[str, str]] = []
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.answer_sends_with: int | None = None  # a response code to refuse sends with
        self.hold_sends = False  # never answer sends (a hung broker)
        self.physical_offset = 0
        self.new_message = asyncio.Event()
        # Pulls: answered after this delay; a read at an offset listed here returns at most
        # that many messages (a shorter read than asked); how many pulls were inside the
        # handler at once at most.
        self.pull_delay_s = 0.0
        self.short_reads: dict[int, int] = {}
        self.pulls_now = 0
        self.pulls_max = 0
        for code, handler in (
            (RequestCode.SEND_MESSAGE_V2, self.on_send),
            (RequestCode.SEND_BATCH_MESSAGE, self.on_send),
            (RequestCode.PULL_MESSAGE, self.on_pull),
            (RequestCode.HEART_BEAT, self.on_heartbeat),
            (RequestCode.UNREGISTER_CLIENT, self.on_unregister),
            (RequestCode.QUERY_CONSUMER_OFFSET, self.on_query_offset),
            (RequestCode.UPDATE_CONSUMER_OFFSET, self.on_update_offset),
            (RequestCode.GET_MAX_OFFSET, self.on_max_offset),
            (RequestCode.GET_MIN_OFFSET, self.on_min_offset),
            (RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, self.on_search_offset),
            (RequestCode.GET_CONSUMER_LIST_BY_GROUP, self.on_consumer_list),
        ):
            self.server.register(code, handler)

    async def start(self) -> None:
        await self.server.start()
        self.address = f"127.0.0.1:{self.server.bound_ports[0]}"

    async def stop(self) -> None:
        await self.server.stop(0.5)

    @property
    def sends(self) -> list[RemotingCommand]:
        return [r for r in self.requests if r.code in (RequestCode.SEND_MESSAGE_V2,
                                                       RequestCode.SEND_BATCH_MESSAGE)]

    # -- storing ------------------------------------------------------------------------

    def store(self, topic: str, queue_id: int, body: bytes, properties: str = "",
              sysflag: int = 0, born_timestamp: int = 0, store_timestamp: int | None = None
              ) -> tuple[int, int]:
        queue = self.queues[(topic, queue_id)]
        queue_offset = queue.max_offset
        stored_at = store_timestamp if store_timestamp is not None else int(time.time() * 1000)
        host, port, _ = pack_host(self.address)
        record = encode_record(
            topic=topic.encode(), body=body, properties=properties.encode(), queue_id=queue_id,
            queue_offset=queue_offset, physical_offset=self.physical_offset, sysflag=sysflag,
            born_timestamp=born_timestamp, store_timestamp=stored_at, store_host=(host, port),
        )
        physical = self.physical_offset
        self.physical_offset += len(record)
        queue.records.append(bytes(record))
        queue.store_times.append(stored_at)
        self.new_message.set()
        self.new_message = asyncio.Event()
        return queue_offset, physical

    def offset_id(self, physical: int) -> str:
        host, port, _ = pack_host(self.address)
        return (host + port.to_bytes(4, "big") + physical.to_bytes(8, "big")).hex().upper()

    async def on_send(self, request: RemotingCommand, connection) -> RemotingCommand | None:
        self.requests.append(request)
        if self.hold_sends:
            await asyncio.sleep(3600)
        if self.answer_sends_with is not None:
            return RemotingCommand.response_to(request, self.answer_sends_with,
                                               remark=f"{self.name} refuses on purpose")
        ext = request.ext_fields or {}
        topic, queue_id = ext["b"], int(ext["e"])
        if request.code == RequestCode.SEND_BATCH_MESSAGE:
            entries = [(e.body, e.properties) for e in decode_batch_body(request.body or b"")]
        else:
            entries = [(request.body or b"", ext.get("i", ""))]
        ids, first = [], None
        for body, properties in entries:
            offset, physical = self.store(topic, queue_id, body, properties,
                                          int(ext.get("f", "0")), int(ext.get("g", "0")))
            first = offset if first is None else first
            ids.append(self.offset_id(physical))
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, ext_fields={
            "msgId": ",".join(ids), "queueId": str(queue_id), "queueOffset": str(first),
            "MSG_REGION": "DefaultRegion", "TRACE_ON": "true",
        })

    # -- pulling and offsets --------------------------------------------------------------

    def _pull_answer(self, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields or {}
        queue = self.queues[(ext["topic"], int(ext["queueId"]))]
        offset, max_nums = int(ext["queueOffset"]), int(ext["maxMsgNums"])

        def answer(code: int, next_offset: int, body: bytes | None = None) -> RemotingCommand:
            return RemotingCommand.response_to(request, code, body=body, ext_fields={
                "suggestWhichBrokerId": "0", "nextBeginOffset": str(next_offset),
                "minOffset": str(queue.min_offset), "maxOffset": str(queue.max_offset),
            })

        if offset < queue.min_offset:
            return answer(ResponseCode.PULL_OFFSET_MOVED, queue.min_offset)
        if offset > queue.max_offset:
            return answer(ResponseCode.PULL_OFFSET_MOVED, queue.max_offset)
        if offset == queue.max_offset:
            return None
        start = offset - queue.min_offset
        count = min(max_nums, 32, self.short_reads.get(offset, 32))
        chunk = queue.records[start:start + count]
        return answer(ResponseCode.SUCCESS, offset + len(chunk), b"".join(chunk))

    async def on_pull(self, request: RemotingCommand, connection) -> RemotingCommand:
        self.requests.append(request)
        if self.pull_delay_s:
            self.pulls_now += 1
            self.pulls_max = max(self.pulls_max, self.pulls_now)
            try:
                await asyncio.sleep(self.pull_delay_s)
            finally:
                self.pulls_now -= 1
        ext = request.ext_fields or {}
        answer = self._pull_answer(request)
        if answer is None and int(ext.get("sysFlag", "0")) & 0x2:
            hold = min(int(ext.get("suspendTimeoutMillis", "0")) / 1000, PULL_HOLD_CAP_S)
            try:
                async with asyncio.timeout(hold):
                    await self.new_message.wait()
            except TimeoutError:
                pass
            answer = self._pull_answer(request)
        if answer is None:
            queue = self.queues[(ext["topic"], int(ext["queueId"]))]
            answer = RemotingCommand.response_to(request, ResponseCode.PULL_NOT_FOUND,
                                                 ext_fields={
                "suggestWhichBrokerId": "0", "nextBeginOffset": ext["queueOffset"],
                "minOffset": str(queue.min_offset), "maxOffset": str(queue.max_offset)})
        return answer

    def _queue(self, request: RemotingCommand) -> StoredQueue:
        ext = request.ext_fields or {}
        return self.queues[(ext["topic"], int(ext["queueId"]))]

    async def on_query_offset(self, request, connection) -> RemotingCommand:
        ext = request.ext_fields or {}
        key = (ext["consumerGroup"], ext["topic"], int(ext["queueId"]))
        if key not in self.offsets:
            return RemotingCommand.response_to(request, ResponseCode.QUERY_NOT_FOUND,
                                               remark="no offset")
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                           ext_fields={"offset": str(self.offsets[key])})

    async def on_update_offset(self, request, connection) -> RemotingCommand:
        ext = request.ext_fields or {}
        self.offsets[(ext["consumerGroup"], ext["topic"], int(ext["queueId"]))] = int(
            ext["commitOffset"])
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def on_max_offset(self, request, connection) -> RemotingCommand:
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, ext_fields={
            "offset": str(self._queue(request).max_offset)})

    async def on_min_offset(self, request, connection) -> RemotingCommand:
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, ext_fields={
            "offset": str(self._queue(request).min_offset)})

    async def on_search_offset(self, request, connection) -> RemotingCommand:
        queue = self._queue(request)
        timestamp = int((request.ext_fields or {})["timestamp"])
        index = next((i for i, t in enumerate(queue.store_times) if t >= timestamp),
                     len(queue.store_times))
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, ext_fields={
            "offset": str(queue.min_offset + index)})

    # -- clients ------------------------------------------------------------------------

    async def on_heartbeat(self, request, connection) -> RemotingCommand:
        self.heartbeats.append(jsonx.loads(request.body or b"{}"))
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def on_unregister(self, request, connection) -> RemotingCommand:
        self.unregistered.append(dict(request.ext_fields or {}))
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def on_consumer_list(self, request, connection) -> RemotingCommand:
        group = (request.ext_fields or {})["consumerGroup"]
        self.member_questions += 1
        left = {u.get("clientID") for u in self.unregistered if u.get("consumerGroup") == group}
        members = sorted({
            beat["clientID"] for beat in self.heartbeats
            for consumer in beat.get("consumerDataSet", []) if consumer["groupName"] == group
        } - left)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                           body=jsonx.dumps({"consumerIdList": members}))

    def messages(self, topic: str, queue_id: int) -> list[tuple[bytes, dict[str, str]]]:
        """(body, properties) of what is stored in one queue, in order."""
        out = []
        for record in self.queues[(topic, queue_id)].records:
            message = decode_record(record)
            out.append((message.body, message.properties))
        return out


class FakeNameServer:
    def __init__(self) -> None:
        self.server = RemotingServer("127.0.0.1", [0])
        self.address = ""
        # topic -> [(broker, queue count, perm)]
        self.topics: dict[str, list[tuple[FakeBroker, int, int]]] = {}
        self.route_requests: list[str] = []
        self.server.register(RequestCode.GET_ROUTEINFO_BY_TOPIC, self.on_route)

    async def start(self) -> None:
        await self.server.start()
        self.address = f"127.0.0.1:{self.server.bound_ports[0]}"

    async def stop(self) -> None:
        await self.server.stop(0.5)

    def add_topic(self, topic: str, brokers: list[FakeBroker], queue_nums: int = 4,
                  perm: int = 6) -> None:
        self.topics[topic] = [(b, queue_nums, perm) for b in brokers]

    async def on_route(self, request, connection) -> RemotingCommand:
        topic = (request.ext_fields or {})["topic"]
        self.route_requests.append(topic)
        entries = self.topics.get(topic)
        if not entries:
            return RemotingCommand.response_to(request, ResponseCode.TOPIC_NOT_EXIST,
                                               remark=f"No topic route info in name server "
                                                      f"for the topic: {topic}")
        # fastjson's pre-4.9.4 form: integer keys unquoted
        broker_datas = ",".join(
            f'{{"brokerAddrs":{{0:"{b.address}"}},"brokerName":"{b.name}",'
            f'"cluster":"{b.cluster}"}}' for b, _, _ in entries
        )
        queue_datas = ",".join(
            f'{{"brokerName":"{b.name}","perm":{perm},"readQueueNums":{n},'
            f'"topicSysFlag":0,"writeQueueNums":{n}}}' for b, n, perm in entries
        )
        body = (f'{{"brokerDatas":[{broker_datas}],"filterServerTable":{{}},'
                f'"queueDatas":[{queue_datas}]}}').encode()
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body)


class FakeCluster:
    """A name server and brokers ``broker-a``, ``broker-b``, ... started on loopback."""

    def __init__(self, broker_count: int = 2):
        self.namesrv = FakeNameServer()
        self.brokers = [FakeBroker(f"broker-{chr(ord('a') + i)}") for i in range(broker_count)]

    async def __aenter__(self) -> FakeCluster:
        await self.namesrv.start()
        for broker in self.brokers:
            await broker.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for broker in self.brokers:
            await broker.stop()
        await self.namesrv.stop()

    def broker(self, name: str) -> FakeBroker:
        return next(b for b in self.brokers if b.name == name)


def properties_of(request: RemotingCommand) -> dict[str, str]:
    return decode_properties((request.ext_fields or {}).get("i", ""))

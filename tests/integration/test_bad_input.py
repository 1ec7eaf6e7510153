"""Bad input over raw sockets against a live broker process, while a well-behaved client keeps
producing and consuming through it.

Every bad request gets either a response whose code and remark say what was wrong, or (when
the bytes are not a frame at all, so there is nothing to answer) the close of that one
connection. The other client never notices, and everything it was acknowledged comes back.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tidemq.client import Admin, Message, MessageQueue, Producer, PullConsumer
from tidemq.protocol.codes import RequestCode, ResponseCode, SerializeType
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.frame import FrameDecoder

pytestmark = pytest.mark.integration

QUEUES = 4
ROUTE_WAIT_S = 20.0
EXCHANGE_WAIT_S = 10.0  # bounds each raw exchange; a healthy broker answers in milliseconds
WORKLOAD_SENDS_MAX = 3000  # the background producer stops here even if never told to
WORKLOAD_PAUSE_S = 0.005  # between its sends: steady traffic, not a flood
DRAIN_WAIT_S = 60.0  # bounds the background consumer's catch-up once producing stopped
# The broker must not allocate for a frame it refuses: its resident memory may grow by less
# than this while it turns away a frame claiming 2 GiB.
RSS_GROWTH_MAX_BYTES = 64 * 1024 * 1024
FIVE_MIB = 5 * 1024 * 1024
FRAME_SIZE_MAX = 16 * 1024 * 1024  # the broker's default frame limit
PROPERTIES_SIZE_MAX = 32767
MESSAGE_SIZE_MAX = 4 * 1024 * 1024  # the broker's default maxMessageSize


@dataclass
class Outcome:
    """What came back for some bytes: a response, a closed connection, or (None, False) silence."""

    response: RemotingCommand | None
    closed: bool


def exchange(addr: str, data: bytes, wait_s: float = EXCHANGE_WAIT_S) -> Outcome:
    """Send ``data`` on a new connection; return the first response or the close (bounded)."""
    host, _, port = addr.rpartition(":")
    decoder = FrameDecoder()
    with socket.create_connection((host, int(port)), timeout=wait_s) as connection:
        try:
            connection.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return Outcome(None, True)  # closed while we were still writing
        try:
            while True:  # ends: the socket timeout bounds every recv
                chunk = connection.recv(65536)
                if not chunk:
                    return Outcome(None, True)
                commands = decoder.feed(chunk)
                if commands:
                    return Outcome(commands[0], False)
        except ConnectionResetError:
            return Outcome(None, True)
        except TimeoutError:
            return Outcome(None, False)


def frame(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    """A frame around raw header bytes (which need not be a valid header)."""
    return struct.pack(">iI", 4 + len(header) + len(body),
                       serialize_type << 24 | len(header)) + header + body


def send_v2(topic: str, body: bytes, queue_id: int = 0, properties: str = "",
            code: int = RequestCode.SEND_MESSAGE_V2) -> RemotingCommand:
    return RemotingCommand.request(code, {
        "a": "bad_input_group", "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id),
        "f": "0", "g": "1700000000000", "h": "0", "i": properties, "j": "0", "k": "false",
        "m": str(code == RequestCode.SEND_BATCH_MESSAGE).lower()}, body)


def pull(queue_id: str | None, topic: str = "BadInputQuiet") -> RemotingCommand:
    fields = {"consumerGroup": "bad_input_group", "topic": topic, "queueId": queue_id,
              "queueOffset": "0", "maxMsgNums": "32", "sysFlag": "4", "commitOffset": "0",
              "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"}
    return RemotingCommand.request(RequestCode.PULL_MESSAGE,
                                   {k: v for k, v in fields.items() if v is not None})


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def max_offsets(addr: str, topic: str, remoting_call) -> list[int]:
    offsets = []
    for queue_id in range(QUEUES):
        response = remoting_call(addr, RemotingCommand.request(
            RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)}))
        assert response.code == ResponseCode.SUCCESS, response.remark
        offsets.append(int(response.ext_fields["offset"]))
    return offsets


@dataclass
class Workload:
    """A producer and a consumer of ``topic`` running in a background thread."""

    namesrv: str
    topic: str
    stop: threading.Event = field(default_factory=threading.Event)
    acked: list[str] = field(default_factory=list)  # UNIQ_KEYs the broker acknowledged
    received: collections.Counter[str] = field(default_factory=collections.Counter)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="bad-input-workload", daemon=True)
        self.thread.start()

    def finish(self) -> None:
        """Stop producing, let the consumer catch up (bounded), re-raise any error."""
        self.stop.set()
        self.thread.join(DRAIN_WAIT_S + 30)
        assert not self.thread.is_alive(), "the background client did not finish"
        if self.error is not None:
            raise AssertionError(f"the well-behaved client failed: {self.error!r}") from (
                self.error)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # handed to the test thread by finish()
            self.error = e

    async def _main(self) -> None:
        queues = [MessageQueue(self.topic, "broker-a", i) for i in range(QUEUES)]
        async with Producer("workload_producer", namesrv=self.namesrv) as producer, \
                PullConsumer("workload_consumer", namesrv=self.namesrv,
                             consume_from="FIRST") as consumer:
            consumer.assign(queues)
            consuming = asyncio.get_running_loop().create_task(self._consume(consumer))
            for seq in range(WORKLOAD_SENDS_MAX):
                if self.stop.is_set():
                    break
                result = await producer.send(Message(self.topic, f"steady-{seq}", tags="ok"))
                self.acked.append(result.msg_id)
                await asyncio.sleep(WORKLOAD_PAUSE_S)
            self.stop.set()
            await consuming

    async def _consume(self, consumer: PullConsumer) -> None:
        loop = asyncio.get_running_loop()
        drain_deadline = None
        while True:
            for message in await consumer.poll(timeout_ms=200):
                self.received[message.unique_key] += 1
            if self.stop.is_set():
                drain_deadline = drain_deadline or loop.time() + DRAIN_WAIT_S
                if len(self.received) >= len(self.acked) or loop.time() > drain_deadline:
                    return


# Bytes that are not a frame: there is no opaque to answer, so the connection is closed.
NOT_FRAMES: list[tuple[str, bytes]] = [
    ("a frame length of 2^31-1", struct.pack(">i", 2**31 - 1) + bytes(1024)),
    ("a frame one byte over 16 MiB", struct.pack(">i", FRAME_SIZE_MAX + 1) + bytes(1024)),
    ("an HTTP request", b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n"),
    ("a TLS client hello", bytes.fromhex("16030100a5010000a10303") + bytes(160)),
    ("garbage bytes", struct.pack(">i", 12) + b"\xfe" * 12),
    ("a negative frame length", struct.pack(">i", -16) + bytes(16)),
    ("a negative header length", struct.pack(">ii", 20, -12) + bytes(16)),
    ("a header longer than its frame", struct.pack(">iI", 20, 4096) + bytes(16)),
    ("a header that is a JSON array", frame(b"[1, 2, 3]")),
    ("a header that is a JSON string", frame(b'"code"')),
    ("a header that is cut-off JSON", frame(b'{"code":10,"opaque":')),
    ("a header that is not UTF-8", frame(b'{"code":10,"opaque":1,"remark":"\xff\xfe"}')),
    ("a header without a code", frame(b'{"opaque":7,"flag":0}')),
]


def answerable_requests() -> list[tuple[str, RemotingCommand, int, tuple[str, ...]]]:
    """Well-framed requests the broker must refuse: (name, request, code, remark parts)."""
    return [
        ("an unknown request code", RemotingCommand.request(9999),
         ResponseCode.REQUEST_CODE_NOT_SUPPORTED, ("9999", "not supported")),
        ("an unknown request code in a binary header",
         RemotingCommand.request(9998, serialize_type=SerializeType.ROCKETMQ),
         ResponseCode.REQUEST_CODE_NOT_SUPPORTED, ("9998", "not supported")),
        ("an illegal topic name", send_v2("bad topic!", b"x"),
         ResponseCode.SYSTEM_ERROR, ("bad topic!",)),
        ("a topic name of 200 characters", send_v2("T" * 200, b"x"),
         ResponseCode.SYSTEM_ERROR, ("127",)),
        ("a 5 MiB body", send_v2("BadInputQuiet", bytes(FIVE_MIB)),
         ResponseCode.MESSAGE_ILLEGAL, (str(FIVE_MIB), str(MESSAGE_SIZE_MAX))),
        ("properties over 32767 bytes",
         send_v2("BadInputQuiet", b"x", properties="K\x01" + "v" * PROPERTIES_SIZE_MAX),
         ResponseCode.MESSAGE_ILLEGAL, (str(PROPERTIES_SIZE_MAX),)),
        ("a queue id out of range", send_v2("BadInputQuiet", b"x", queue_id=99),
         ResponseCode.SYSTEM_ERROR, ("queueId 99", "BadInputQuiet")),
        ("a send to a system topic", send_v2("SCHEDULE_TOPIC_XXXX", b"x"),
         ResponseCode.SYSTEM_ERROR, ("SCHEDULE_TOPIC_XXXX",)),
        ("a malformed batch body", send_v2("BadInputQuiet", struct.pack(">i", 48) + b"cut",
                                           code=RequestCode.SEND_BATCH_MESSAGE),
         ResponseCode.MESSAGE_ILLEGAL, ("batch", "BadInputQuiet")),
        ("a heartbeat body that is not JSON",
         RemotingCommand.request(RequestCode.HEART_BEAT, None, b"not json"),
         ResponseCode.SYSTEM_ERROR, ("JSON",)),
        ("a pull without queueId", pull(None), ResponseCode.SYSTEM_ERROR, ("queueId",)),
        ("a pull of a queue out of range", pull("77"), ResponseCode.SYSTEM_ERROR, ("77",)),
    ]


def test_bad_frames_get_clear_errors_or_a_closed_connection_and_harm_no_one_else(
        tidemq_cluster, remoting_call, wait_until):
    cluster = tidemq_cluster()
    broker = cluster.broker("broker-a")

    async def create_topics() -> None:
        async with Admin(namesrv=cluster.namesrv_addr) as admin:
            for topic in ("BadInputSteady", "BadInputQuiet"):
                await admin.create_topic(topic, QUEUES)

    asyncio.run(create_topics())
    route = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                    {"topic": "BadInputSteady"})
    wait_until(lambda: remoting_call(cluster.namesrv_addr, route).code == ResponseCode.SUCCESS,
               timeout_s=ROUTE_WAIT_S, what="the route of BadInputSteady")
    workload = Workload(cluster.namesrv_addr, "BadInputSteady")
    workload.start()
    wait_until(lambda: len(workload.acked) >= 20 or workload.error is not None, timeout_s=30,
               what="the background client to get going")
    acked_before_attack = len(workload.acked)

    problems: list[str] = []  # every case runs; all that failed are reported together

    rss_before = resident_bytes(broker.pid)
    for name, data in NOT_FRAMES:
        outcome = exchange(broker.addr, data)
        if not outcome.closed or outcome.response is not None:
            problems.append(f"{name}: expected the connection to be closed, got {outcome}")
    rss_growth = resident_bytes(broker.pid) - rss_before
    if rss_growth >= RSS_GROWTH_MAX_BYTES:
        problems.append(f"broker memory grew by {rss_growth} bytes while refusing frames")

    for name, request, code, remark_parts in answerable_requests():
        outcome = exchange(broker.addr, request.encode())
        response = outcome.response
        if response is None:
            problems.append(f"{name}: no response ({outcome})")
            continue
        remark = response.remark or ""
        if (response.code, response.is_response, response.opaque) != (
                code, True, request.opaque):
            problems.append(f"{name}: expected code {code}, got {response.code} {remark!r}")
        missing = [part for part in remark_parts if part not in remark]
        if missing:
            problems.append(f"{name}: remark {remark!r} does not mention {missing}")
        if response.serialize_type != request.serialize_type:
            problems.append(f"{name}: answered in {response.serialize_type.name}, asked in "
                            f"{request.serialize_type.name}")
    assert broker.running

    acked_after_attack = len(workload.acked)
    workload.finish()
    assert acked_after_attack > acked_before_attack, "the other client kept producing"
    doubled = [key for key, count in workload.received.items() if count > 1]
    lost = set(workload.acked) - set(workload.received)
    assert not doubled and not lost, f"{len(doubled)} doubled, {len(lost)} lost"
    assert not problems, "\n".join(problems)
    # Nothing of the refused sends was stored.
    assert max_offsets(broker.addr, "BadInputQuiet", remoting_call) == [0] * QUEUES
    assert broker.running
    assert "Traceback" not in broker.stderr_path.read_text(errors="replace")


"""The options of ``format("tidemq")``, checked on the driver before any job runs.

Spark hands a data source its options as strings in a case-insensitive dict; here they
become ``SourceOptions`` (reads) or ``SinkOptions`` (writes), or an ``InvalidOption`` that
names the option, the value given and what is accepted. Option names follow Spark's Kafka
connector where one exists.

Source (``spark.read`` / ``spark.readStream``):

====================== ============================================ ==========================
option                 value                                        default
====================== ============================================ ==========================
namesrvAddr            "host:port;host:port"                        (required)
subscribe              topics, comma-separated                      exactly one of these three
subscribePattern       a regular expression over topic names
assign                 JSON {"topic": ["brokerName:queueId", ...]}
tagExpression          "*" or "TagA || TagB" (filtered by the broker) "*"
startingOffsets        earliest | latest | JSON per queue           batch: earliest,
                                                                    stream: latest
endingOffsets          latest | JSON per queue (batch only)         latest
startingTimestamp      ms since the epoch (instead of startingOffsets)
endingTimestamp        ms since the epoch (batch only, exclusive)
maxOffsetsPerTrigger   offsets per micro-batch, spread by backlog     no limit
minPartitions          at least this many read tasks                one per queue
maxRecordsPerPartition at most this many offsets per read task      no limit
failOnDataLoss         true | false                                 true
consumerGroup          commit processed offsets as this group       none (nothing committed)
includeProperties      true | false: add the properties column      false
pullBatchSize          messages per pull request (1..1024)          1024
requestTimeoutMs       timeout of one request to a broker           10000
accessKey, secretKey   ACL credentials every request is signed with none (unsigned)
====================== ============================================ ==========================

In offsets JSON, queues are keyed ``"brokerName:queueId"`` per topic; -2 means earliest and
-1 latest. Queues a JSON leaves out start at earliest and end at latest.

accessKey / secretKey go together; the secret key never appears in an error, a repr or a
plan (Spark's default ``spark.redaction.regex`` hides options named like these in ``explain``
and the UI, and ``Credentials`` hides it in its repr).

Sink (``df.write`` / ``df.writeStream``): namesrvAddr (required), topic (overrides a topic
column), producerGroup, sendBatchSize (messages per batch request, default 256),
maxInFlightRequests (default 4), sendTimeoutMs (default 10000), accessKey and secretKey (ACL
credentials, as for the source), and the guarantee:

====================== ============================================ ==========================
exactlyOnce            true | false: rows are committed once per    false
                       (query, micro-batch) (pyspark_tidemq.exactly_once)
deliveryGuarantee      atLeastOnce | exactlyOnce (the same choice)  atLeastOnce
exactlyOnce.timeoutMs  uncommitted rows are rolled back this long    300000 (5 min)
                       after they were sent (rounded up to seconds)
====================== ============================================ ==========================
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark_tidemq.errors import InvalidOption
from pyspark_tidemq.offsets import EARLIEST, LATEST, offsets_from_json, parse_queue_key
from tidemq.client.errors import InvalidSubscription
from tidemq.client.instance import parse_namesrv_addresses
from tidemq.client.message import MessageQueue
from tidemq.client.security import Credentials
from tidemq.client.subscription import parse_tag_expression
from tidemq.limits import group_name_problem, topic_name_problem

# Group used for pulls when no consumerGroup is given: brokers auto-create subscription
# groups, so every reader without a group shares this one name instead of making new ones.
DEFAULT_READER_GROUP = "tidemq_spark_reader"
DEFAULT_PRODUCER_GROUP = "tidemq_spark_writer"
# The broker answers at most 1024 messages / 1 MiB per pull (tidemq's per-pull transfer
# bound); asking for the most keeps the number of round trips, Python's main cost, low.
PULL_BATCH_SIZE_MAX = 1024
# A 1 MiB pull on a busy shared machine can take seconds; 10 s fails a stuck broker fast
# enough while never cutting a healthy but slow answer short.
REQUEST_TIMEOUT_MS = 10_000
# 256 messages of 1 KiB make a 256 KiB request: big enough that per-request costs vanish,
# small enough that several are in flight without a large buffer (the broker takes 4 MiB).
SEND_BATCH_SIZE = 256
# Requests in flight per write task: enough to keep a broker busy while the task encodes
# the next ones; each holds at most sendBatchSize messages in memory.
MAX_IN_FLIGHT_REQUESTS = 4
SEND_TIMEOUT_MS = 10_000
# Five minutes: a micro-batch's tasks and its commit must finish within it, else the brokers
# roll its rows back and the commit fails (Spark's own task and batch times are minutes).
EXACTLY_ONCE_TIMEOUT_MS = 300_000

# Options Spark itself (or users out of habit) pass to every source or sink; ignored here.
_SPARK_GENERIC_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})

SOURCE_OPTIONS = (
    "namesrvAddr", "subscribe", "subscribePattern", "assign", "tagExpression",
    "startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp",
    "maxOffsetsPerTrigger", "minPartitions", "maxRecordsPerPartition", "failOnDataLoss",
    "consumerGroup", "includeProperties", "pullBatchSize", "requestTimeoutMs",
    "accessKey", "secretKey",
)
SINK_OPTIONS = (
    "namesrvAddr", "topic", "producerGroup", "sendBatchSize", "maxInFlightRequests",
    "sendTimeoutMs", "deliveryGuarantee", "exactlyOnce", "exactlyOnce.timeoutMs",
    "accessKey", "secretKey",
)

_OFFSETS_EXAMPLE = '{"Orders": {"broker-a:0": 42, "broker-b:3": -2}}'


class OffsetKind(enum.Enum):
    """Where a read starts or ends."""

    EARLIEST = "earliest"
    LATEST = "latest"
    PER_QUEUE = "per-queue"  # JSON: some queues named, the rest at the default


@dataclass(frozen=True)
class OffsetSpec:
    """A parsed ``startingOffsets`` / ``endingOffsets``.

    Attributes:
        kind: earliest, latest, or per queue.
        queues: for PER_QUEUE, the named queues' offsets (-2 earliest, -1 latest allowed).
    """

    kind: OffsetKind
    queues: Mapping[MessageQueue, int] = field(default_factory=dict)


class DeliveryGuarantee(enum.Enum):
    """What the sink promises."""

    AT_LEAST_ONCE = "atLeastOnce"  # as Spark's Kafka sink: a retried task may store rows twice
    EXACTLY_ONCE = "exactlyOnce"  # transactional halves committed once per (query, batch)


@dataclass(frozen=True)
class SourceOptions:
    """Validated options of a tidemq read (batch or streaming); see the module docstring."""

    namesrv_addr: str
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: tuple[MessageQueue, ...] = ()
    tag_expression: str = "*"
    starting_offsets: OffsetSpec = OffsetSpec(OffsetKind.EARLIEST)
    ending_offsets: OffsetSpec = OffsetSpec(OffsetKind.LATEST)
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    consumer_group: str | None = None
    include_properties: bool = False
    pull_batch_size: int = PULL_BATCH_SIZE_MAX
    request_timeout_ms: int = REQUEST_TIMEOUT_MS
    credentials: Credentials | None = field(default=None, repr=False)

    @property
    def reader_group(self) -> str:
        """The consumer group named in pull requests."""
        return self.consumer_group or DEFAULT_READER_GROUP

    @property
    def tags(self) -> frozenset[str]:
        """The tags ``tagExpression`` accepts; empty means every message."""
        return parse_tag_expression("-", self.tag_expression).tags


@dataclass(frozen=True)
class SinkOptions:
    """Validated options of a tidemq write (batch or streaming); see the module docstring."""

    namesrv_addr: str
    topic: str | None = None
    producer_group: str = DEFAULT_PRODUCER_GROUP
    send_batch_size: int = SEND_BATCH_SIZE
    max_in_flight_requests: int = MAX_IN_FLIGHT_REQUESTS
    send_timeout_ms: int = SEND_TIMEOUT_MS
    delivery_guarantee: DeliveryGuarantee = DeliveryGuarantee.AT_LEAST_ONCE
    exactly_once_timeout_ms: int = EXACTLY_ONCE_TIMEOUT_MS
    credentials: Credentials | None = field(default=None, repr=False)


class _Reader:
    """Typed access to Spark's string options; every problem names the option."""

    def __init__(self, options: Mapping[str, str], known: tuple[str, ...], role: str):
        self.values = {str(k).lower(): v for k, v in options.items()}
        self.canonical = {name.lower(): name for name in known}
        unknown = sorted(k for k in self.values
                         if k not in self.canonical and k not in _SPARK_GENERIC_OPTIONS)
        if unknown:
            raise InvalidOption(
                f"unknown option(s) {', '.join(unknown)} for a tidemq {role}; the options are "
                f"{', '.join(known)}"
            )

    def has(self, name: str) -> bool:
        return name.lower() in self.values

    def text(self, name: str) -> str | None:
        value = self.values.get(name.lower())
        if value is None:
            return None
        value = str(value).strip()
        return value if value else None

    def required(self, name: str, example: str) -> str:
        value = self.text(name)
        if value is None:
            raise InvalidOption(f"option {name} is required (for example {example})")
        return value

    def integer(self, name: str, minimum: int, maximum: int | None = None) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < minimum or (maximum is not None and number > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else \
                f"at least {minimum}"
            raise InvalidOption(f"option {name}={value!r}: expected an integer {bound}")
        return number

    def boolean(self, name: str, default: bool) -> bool:
        value = self.text(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered not in ("true", "false"):
            raise InvalidOption(f"option {name}={value!r}: expected true or false")
        return lowered == "true"


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Check the options of a read and return them typed.

    Args:
        options: Spark's options (any key case).
        streaming: True for ``readStream`` (no ending offsets; starts at latest by default).

    Raises:
        InvalidOption: naming the option, the value and what is accepted.
    """
    role = "streaming source" if streaming else "batch source"
    reader = _Reader(options, SOURCE_OPTIONS, role)
    namesrv_addr = _namesrv(reader)
    subscribe, pattern, assign = _topics(reader)
    tag_expression = reader.text("tagExpression") or "*"
    try:
        parse_tag_expression("-", tag_expression)
    except InvalidSubscription as e:
        raise InvalidOption(f"option tagExpression: {e}") from None
    starting_timestamp = reader.integer("startingTimestamp", 0)
    ending_timestamp = reader.integer("endingTimestamp", 0)
    if starting_timestamp is not None and reader.has("startingOffsets"):
        raise InvalidOption(
            "options startingOffsets and startingTimestamp are both set; give only one"
        )
    if ending_timestamp is not None and reader.has("endingOffsets"):
        raise InvalidOption("options endingOffsets and endingTimestamp are both set; give only one")
    if streaming:
        for name in ("endingOffsets", "endingTimestamp"):
            if reader.has(name):
                raise InvalidOption(
                    f"option {name} is for batch reads only: a streaming query reads until it "
                    "is stopped (use trigger(availableNow=True) to stop at the current end)"
                )
    starting = _offset_spec(reader, "startingOffsets",
                            OffsetKind.LATEST if streaming else OffsetKind.EARLIEST,
                            forbidden=None if streaming else OffsetKind.LATEST)
    ending = _offset_spec(reader, "endingOffsets", OffsetKind.LATEST,
                          forbidden=OffsetKind.EARLIEST)
    if (starting_timestamp is not None and ending_timestamp is not None
            and ending_timestamp < starting_timestamp):
        raise InvalidOption(
            f"option endingTimestamp={ending_timestamp} is before "
            f"startingTimestamp={starting_timestamp}"
        )
    return SourceOptions(
        namesrv_addr=namesrv_addr,
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        tag_expression=tag_expression,
        starting_offsets=starting,
        ending_offsets=ending,
        starting_timestamp_ms=starting_timestamp,
        ending_timestamp_ms=ending_timestamp,
        max_offsets_per_trigger=reader.integer("maxOffsetsPerTrigger", 1),
        min_partitions=reader.integer("minPartitions", 1),
        max_records_per_partition=reader.integer("maxRecordsPerPartition", 1),
        fail_on_data_loss=reader.boolean("failOnDataLoss", True),
        consumer_group=_group(reader, "consumerGroup"),
        include_properties=reader.boolean("includeProperties", False),
        pull_batch_size=reader.integer("pullBatchSize", 1, PULL_BATCH_SIZE_MAX)
        or PULL_BATCH_SIZE_MAX,
        request_timeout_ms=reader.integer("requestTimeoutMs", 1) or REQUEST_TIMEOUT_MS,
        credentials=_credentials(reader),
    )


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Check the options of a write and return them typed.

    Raises:
        InvalidOption: naming the option, the value and what is accepted.
    """
    reader = _Reader(options, SINK_OPTIONS, "sink")
    topic = reader.text("topic")
    if topic is not None:
        problem = topic_name_problem(topic)
        if problem is not None:
            raise InvalidOption(f"option topic: {problem}")
    return SinkOptions(
        namesrv_addr=_namesrv(reader),
        topic=topic,
        producer_group=_group(reader, "producerGroup") or DEFAULT_PRODUCER_GROUP,
        send_batch_size=reader.integer("sendBatchSize", 1) or SEND_BATCH_SIZE,
        max_in_flight_requests=reader.integer("maxInFlightRequests", 1)
        or MAX_IN_FLIGHT_REQUESTS,
        send_timeout_ms=reader.integer("sendTimeoutMs", 1) or SEND_TIMEOUT_MS,
        delivery_guarantee=_guarantee(reader),
        exactly_once_timeout_ms=reader.integer("exactlyOnce.timeoutMs", 1000)
        or EXACTLY_ONCE_TIMEOUT_MS,
        credentials=_credentials(reader),
    )


def _credentials(reader: _Reader) -> Credentials | None:
    access_key, secret_key = reader.text("accessKey"), reader.text("secretKey")
    if access_key is None and secret_key is None:
        return None
    if access_key is None or secret_key is None:
        # never echo the value given: it may be the secret
        raise InvalidOption("options accessKey and secretKey go together: give both (the "
                            "ACL account's keys) or neither")
    return Credentials(access_key, secret_key)


def _guarantee(reader: _Reader) -> DeliveryGuarantee:
    by_name = {g.value.lower(): g for g in DeliveryGuarantee}
    text = reader.text("deliveryGuarantee")
    guarantee = None
    if text is not None:
        guarantee = by_name.get(text.lower())
        if guarantee is None:
            raise InvalidOption(
                f"option deliveryGuarantee={text!r}: expected atLeastOnce or exactlyOnce")
    if reader.has("exactlyOnce"):
        flag = DeliveryGuarantee.EXACTLY_ONCE if reader.boolean("exactlyOnce", False) \
            else DeliveryGuarantee.AT_LEAST_ONCE
        if guarantee is not None and guarantee is not flag:
            raise InvalidOption(
                f"options exactlyOnce={reader.text('exactlyOnce')} and deliveryGuarantee={text} "
                "contradict each other; give one of them")
        guarantee = flag
    return guarantee or DeliveryGuarantee.AT_LEAST_ONCE


def _namesrv(reader: _Reader) -> str:
    value = reader.required("namesrvAddr", "127.0.0.1:9876")
    try:
        parse_namesrv_addresses(value)
    except ValueError as e:
        raise InvalidOption(f"option namesrvAddr={value!r}: {e}") from None
    return value


def _group(reader: _Reader, name: str) -> str | None:
    value = reader.text(name)
    if value is not None:
        problem = group_name_problem(value)
        if problem is not None:
            raise InvalidOption(f"option {name}: {problem}")
    return value


def _topics(reader: _Reader) -> tuple[tuple[str, ...], str | None, tuple[MessageQueue, ...]]:
    given = [name for name in ("subscribe", "subscribePattern", "assign") if reader.has(name)]
    if len(given) != 1:
        raise InvalidOption(
            "give exactly one of the options subscribe (topics, comma-separated), "
            "subscribePattern (a regular expression) or assign (JSON "
            '{"topic": ["brokerName:queueId", ...]}); '
            + (f"got {', '.join(given)}" if given else "got none")
        )
    if reader.has("subscribe"):
        text = reader.text("subscribe") or ""
        topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
        if not topics:
            raise InvalidOption("option subscribe is empty; give topics, comma-separated")
        for topic in topics:
            problem = topic_name_problem(topic)
            if problem is not None:
                raise InvalidOption(f"option subscribe: {problem}")
        return topics, None, ()
    if reader.has("subscribePattern"):
        pattern = reader.text("subscribePattern") or ""
        try:
            re.compile(pattern)
        except re.error as e:
            raise InvalidOption(
                f"option subscribePattern={pattern!r} is not a regular expression: {e}"
            ) from None
        if not pattern:
            raise InvalidOption("option subscribePattern is empty; give a regular expression")
        return (), pattern, ()
    return (), None, _assignment(reader.text("assign") or "")


def _assignment(text: str) -> tuple[MessageQueue, ...]:
    example = '{"Orders": ["broker-a:0", "broker-a:1"]}'
    try:
        value = json.loads(text)
    except ValueError as e:
        raise InvalidOption(f"option assign={text!r} is not JSON ({e}); expected {example}") \
            from None
    if not isinstance(value, dict) or not value:
        raise InvalidOption(f"option assign={text!r}: expected a JSON object like {example}")
    queues: list[MessageQueue] = []
    for topic, keys in value.items():
        problem = topic_name_problem(str(topic))
        if problem is not None:
            raise InvalidOption(f"option assign: {problem}")
        if not isinstance(keys, list) or not keys:
            raise InvalidOption(
                f"option assign: topic {topic!r} must map to a list of \"brokerName:queueId\" "
                f"strings, like {example}"
            )
        for key in keys:
            try:
                queues.append(parse_queue_key(str(topic), str(key)))
            except ValueError as e:
                raise InvalidOption(f"option assign: {e}") from None
    return tuple(sorted(set(queues)))


def _offset_spec(reader: _Reader, name: str, default: OffsetKind,
                 forbidden: OffsetKind | None) -> OffsetSpec:
    text = reader.text(name)
    accepted = ", ".join(k.value for k in (OffsetKind.EARLIEST, OffsetKind.LATEST)
                         if k is not forbidden)
    if text is None:
        return OffsetSpec(default)
    lowered = text.lower()
    for kind in (OffsetKind.EARLIEST, OffsetKind.LATEST):
        if lowered == kind.value:
            if kind is forbidden:
                raise InvalidOption(
                    f"option {name}={text!r} is not allowed here; use {accepted} or JSON "
                    f"like {_OFFSETS_EXAMPLE}"
                )
            return OffsetSpec(kind)
    try:
        queues = offsets_from_json(json.loads(text), what=f"option {name}")
    except ValueError as e:
        raise InvalidOption(
            f"option {name}={text!r}: expected {accepted}, or JSON like {_OFFSETS_EXAMPLE} "
            f"(-2 = earliest, -1 = latest): {e}"
        ) from None
    forbidden_sentinel = {OffsetKind.EARLIEST: EARLIEST, OffsetKind.LATEST: LATEST}.get(
        forbidden) if forbidden is not None else None
    for queue, offset in queues.items():
        if offset < EARLIEST or offset == forbidden_sentinel:
            raise InvalidOption(
                f"option {name}: offset {offset} of {queue.topic} "
                f"{queue.broker_name}:{queue.queue_id} is not allowed; use an offset >= 0"
                + (", -2 (earliest)" if forbidden is not OffsetKind.EARLIEST else "")
                + (", -1 (latest)" if forbidden is not OffsetKind.LATEST else "")
            )
    return OffsetSpec(OffsetKind.PER_QUEUE, queues)

"""What a client sends and gets back: Message, MessageQueue, SendResult, PullResult.

Received messages are ``tidemq.protocol.message.MessageExt`` (the stored record decoded); this
module holds the producer-side ``Message`` and the small result types, plus the client-side
checks a message must pass before anything is sent (the same checks the Java client's
``Validators.checkMessage`` makes, so a message the broker would reject fails here with a clear
error instead).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tidemq.client.errors import InvalidMessage
from tidemq.errors import InvalidTopicName, MessageTooLarge
from tidemq.limits import MESSAGE_BODY_SIZE_MAX, PROPERTIES_SIZE_MAX, topic_name_problem
from tidemq.protocol.message import (
    KEY_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_WAIT_STORE_MSG_OK,
    MessageExt,
)

# Delay levels a RocketMQ broker knows by default ("1s 5s 10s 30s 1m ... 2h", docs/protocol.md
# §11.1); the broker caps higher levels at its maximum, so we only reject negatives.
DELAY_LEVEL_MAX_DEFAULT = 18


class Message:
    """A message to send.

    Args:
        topic: the topic name (RocketMQ rules: ``[%|a-zA-Z0-9_-]``, at most 127 characters).
        body: the payload; a ``str`` is encoded as UTF-8. Must not be empty.
        tags: one tag (the ``TAGS`` property) consumers can filter on.
        keys: one key or several (the ``KEYS`` property, space-joined); indexed by the broker
            for ``Admin.query_message_by_key``. Keys must not contain spaces.
        properties: user properties; names and values are strings.
        flag: the user flag stored with the message (an int32 the broker does not interpret).
        delay_level: 0 for immediate delivery, else a broker delay level (1 = 1 s ... 18 = 2 h).
        wait_store_msg_ok: False lets a SYNC_FLUSH broker answer before the flush.

    ``properties`` is the live dict of everything sent as properties (TAGS, KEYS, DELAY and the
    user's); the helpers below read and write it.
    """

    __slots__ = ("body", "flag", "properties", "topic")

    def __init__(
        self,
        topic: str,
        body: bytes | bytearray | memoryview | str,
        tags: str | None = None,
        keys: str | Iterable[str] | None = None,
        properties: Mapping[str, str] | None = None,
        flag: int = 0,
        delay_level: int = 0,
        *,
        wait_store_msg_ok: bool = True,
    ):
        self.topic = topic
        if type(body) is not bytes:  # bytes as they are (the common case), without a call
            body = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        self.body = body
        self.flag = flag
        self.properties: dict[str, str] = dict(properties) if properties else {}
        if tags is not None:
            self.properties[PROPERTY_TAGS] = tags
        if keys is not None:
            self.keys = keys
        if delay_level:
            self.delay_level = delay_level
        if not wait_store_msg_ok:
            # Absent means true on the broker, so only "false" travels (saves bytes per send).
            self.properties[PROPERTY_WAIT_STORE_MSG_OK] = "false"

    @property
    def tags(self) -> str | None:
        """The TAGS property, or None."""
        return self.properties.get(PROPERTY_TAGS)

    @tags.setter
    def tags(self, value: str | None) -> None:
        if value is None:
            self.properties.pop(PROPERTY_TAGS, None)
        else:
            self.properties[PROPERTY_TAGS] = value

    @property
    def keys(self) -> list[str]:
        """The KEYS property as a list (empty when absent)."""
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]

    @keys.setter
    def keys(self, value: str | Iterable[str] | None) -> None:
        if value is None:
            self.properties.pop(PROPERTY_KEYS, None)
            return
        joined = value if isinstance(value, str) else KEY_SEPARATOR.join(value)
        if joined:
            self.properties[PROPERTY_KEYS] = joined
        else:
            self.properties.pop(PROPERTY_KEYS, None)

    @property
    def delay_level(self) -> int:
        """The DELAY property as an int (0 when absent)."""
        value = self.properties.get(PROPERTY_DELAY_TIME_LEVEL)
        return int(value) if value else 0

    @delay_level.setter
    def delay_level(self, level: int) -> None:
        if level < 0:
            raise InvalidMessage(
                f"delay_level {level} is negative; use 0 (no delay) or 1..{DELAY_LEVEL_MAX_DEFAULT}"
            )
        if level == 0:
            self.properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        else:
            self.properties[PROPERTY_DELAY_TIME_LEVEL] = str(level)

    def __repr__(self) -> str:
        return (
            f"Message(topic={self.topic!r}, body=<{len(self.body)} bytes>, "
            f"properties={self.properties!r}, flag={self.flag})"
        )


def validate_message(message: Message, max_message_size: int = MESSAGE_BODY_SIZE_MAX) -> None:
    """Check a message before it is sent, as the Java client does.

    Raises:
        InvalidTopicName: the topic breaks RocketMQ's naming rules.
        InvalidMessage: the body is empty.
        MessageTooLarge: the body is over ``max_message_size``.
    """
    problem = topic_name_problem(message.topic)
    if problem is not None:
        raise InvalidTopicName(problem)
    size = len(message.body)
    if size == 0:
        raise InvalidMessage(f"message to topic {message.topic!r} has an empty body; send bytes")
    if size > max_message_size:
        raise MessageTooLarge(
            f"message body to topic {message.topic!r} is {size} bytes, larger than "
            f"max_message_size={max_message_size} (split it, or raise max_message_size on the "
            "producer and maxMessageSize on the broker)"
        )


def check_properties_size(topic: str, properties_text: bytes | str) -> None:
    """Raise MessageTooLarge when the encoded properties exceed RocketMQ's 32767 bytes."""
    size = len(properties_text.encode("utf-8") if isinstance(properties_text, str)
               else properties_text)
    if size > PROPERTIES_SIZE_MAX:
        raise MessageTooLarge(
            f"properties of a message to topic {topic!r} are {size} bytes once encoded, more "
            f"than the limit of {PROPERTIES_SIZE_MAX}; send fewer or shorter properties"
        )


@dataclass(frozen=True, order=True, slots=True)
class MessageQueue:
    """One queue of a topic on one broker; ordered by topic, broker name, queue id."""

    topic: str
    broker_name: str
    queue_id: int

    def to_json(self) -> dict[str, object]:
        """The RocketMQ JSON object form ``{"brokerName","queueId","topic"}``."""
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}

    def to_json_key(self) -> dict[str, object]:
        """Same as ``to_json``: lets ``jsonx.dumps`` write Map<MessageQueue, ...> keys."""
        return self.to_json()

    @classmethod
    def from_json(cls, value: Mapping[str, object]) -> MessageQueue:
        """Build from the JSON object form (or a ``jsonx.JsonObjectKey``)."""
        return cls(str(value.get("topic")), str(value.get("brokerName")),
                   int(value.get("queueId")))  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"


class SendStatus(enum.Enum):
    """How a stored message fared; all four mean the broker stored it."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True, slots=True)
class SendResult:
    """The broker's answer to one send request.

    Attributes:
        status: SEND_OK, or a stored-but-not-fully-durable status.
        msg_id: the client id (UNIQ_KEY) of the message; for a batch request, the UNIQ_KEYs of
            its messages joined by ``,`` (as RocketMQ does; see ``msg_ids``).
        offset_msg_id: the broker's offset message id (store host + commit-log offset); for a
            batch, the ids joined by ``,``.
        queue: the queue written.
        queue_offset: the consume-queue offset of the (first) message.
        region: the broker's region id (MSG_REGION), if sent.
        trace_on: the broker's TRACE_ON switch.
        transaction_id: set only by transactional sends.
    """

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    region: str | None = None
    trace_on: bool = True
    transaction_id: str | None = None

    @property
    def msg_ids(self) -> list[str]:
        """``msg_id`` split into the ids of the messages of a batch (one for a single send)."""
        return self.msg_id.split(",") if self.msg_id else []

    @property
    def offset_msg_ids(self) -> list[str]:
        """``offset_msg_id`` split per message."""
        return self.offset_msg_id.split(",") if self.offset_msg_id else []


# A frozen dataclass's __init__ sets each field through object.__setattr__, ~1.0-1.4 us for
# SendResult's eight (more than the rest of reading the broker's answer); the slots' own
# setters do the same in ~0.6 us. Only for the producer's answer to every send.
_SEND_RESULT_SETTERS = tuple(
    getattr(SendResult, name).__set__
    for name in ("status", "msg_id", "offset_msg_id", "queue", "queue_offset", "region",
                 "trace_on", "transaction_id")
)


def new_send_result(status: SendStatus, msg_id: str, offset_msg_id: str, queue: MessageQueue,
                    queue_offset: int, region: str | None, trace_on: bool,
                    transaction_id: str | None) -> SendResult:
    """``SendResult(...)`` with every field given, made without the frozen ``__init__``'s
    per-field ``object.__setattr__`` (equal to what the constructor makes)."""
    result = object.__new__(SendResult)
    (set_status, set_msg_id, set_offset_msg_id, set_queue, set_queue_offset, set_region,
     set_trace_on, set_transaction_id) = _SEND_RESULT_SETTERS
    set_status(result, status)
    set_msg_id(result, msg_id)
    set_offset_msg_id(result, offset_msg_id)
    set_queue(result, queue)
    set_queue_offset(result, queue_offset)
    set_region(result, region)
    set_trace_on(result, trace_on)
    set_transaction_id(result, transaction_id)
    return result


class PullStatus(enum.Enum):
    """Outcome of one PULL_MESSAGE (docs/protocol.md §4.4 code mapping)."""

    FOUND = "FOUND"  # code 0
    NO_NEW_MSG = "NO_NEW_MSG"  # code 19: offset is at the end of the queue
    NO_MATCHED_MSG = "NO_MATCHED_MSG"  # code 20: entries scanned, none matched the filter
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"  # code 21: offset outside [min, max]; use next_begin


@dataclass(slots=True)
class PullResult:
    """One pull's answer: status, where to go on, the queue's bounds and the messages.

    ``messages_filtered`` counts messages the broker sent that the client's tag filter then
    dropped: the broker filters by tag hash, so only hash collisions end up here.
    """

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)
    suggest_which_broker_id: int = 0
    messages_filtered: int = 0
    body_size: int = 0  # bytes of the records the broker sent (0 when it sent none)

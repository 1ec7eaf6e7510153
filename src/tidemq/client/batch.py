"""Turning a list of messages into SEND_BATCH_MESSAGE request bodies.

A batch travels as one request whose body is the concatenation of short entries of
docs/protocol.md §6.5 (the bytes ``tidemq.protocol.message.encode_batch_body`` writes)::

    TOTALSIZE int32 | MAGICCODE int32 (0) | BODYCRC int32 (0) | FLAG int32 | BODYLENGTH int32 |
    BODY | PROPERTIESLENGTH int16 | PROPERTIES          (TOTALSIZE = 22 + body + properties)

The broker checks a batch body against its maxMessageSize (4 MiB by default) as if it were
one message body, so a long list is split into chunks whose encoded size stays within
``max_message_size``; each chunk is one request. Order is kept: chunk k holds the messages
after those of chunk k-1.

RocketMQ's batch rules, checked before anything is sent: every message has the same topic, no
message has a delay level, and the topic is not a retry topic. Batch bodies are never
compressed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidemq.client.errors import InvalidMessage
from tidemq.client.message import Message, check_properties_size, validate_message
from tidemq.errors import MessageTooLarge
from tidemq.limits import MESSAGE_BODY_SIZE_MAX, PROPERTIES_SIZE_MAX
from tidemq.protocol.message import (
    BATCH_ENTRY_FIXED_SIZE,
    NAME_VALUE_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    encode_properties,
)
from tidemq.protocol.msgid import new_unique_key as process_unique_key
from tidemq.protocol.msgid import new_unique_keys

RETRY_TOPIC_PREFIX = "%RETRY%"

# The entry layout of the module docstring (the same as encode_batch_body writes).
_BATCH_ENTRY_HEAD = struct.Struct(">iiiii")  # TOTALSIZE MAGICCODE BODYCRC FLAG BODYLENGTH
_PROPERTIES_LENGTH = struct.Struct(">h")
_UNIQUE_KEY_PREFIX = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX + NAME_VALUE_SEPARATOR


@dataclass(slots=True)
class BatchChunk:
    """One SEND_BATCH_MESSAGE request's worth of messages.

    Attributes:
        body: the encoded batch body.
        unique_keys: the UNIQ_KEY of each message, in order.
        message_count: how many messages the body holds.
    """

    body: bytes
    unique_keys: list[str]

    @property
    def message_count(self) -> int:
        return len(self.unique_keys)


def check_batch(messages: Sequence[Message], max_message_size: int) -> str:
    """Check RocketMQ's batch rules and every message; return the common topic.

    Raises:
        InvalidMessage: empty list, mixed topics, a delay level, or a retry topic.
        InvalidTopicName / MessageTooLarge: as ``validate_message``.
    """
    if not messages:
        raise InvalidMessage("send_batch got no messages; pass at least one")
    first = messages[0]
    topic = first.topic
    if topic.startswith(RETRY_TOPIC_PREFIX):
        raise InvalidMessage(f"a batch cannot go to the retry topic {topic!r}; send one by one")
    validate_message(first, max_message_size)  # the topic name is checked once, here
    for position, message in enumerate(messages):
        if message.topic != topic:
            raise InvalidMessage(
                f"a batch must have one topic: message {position} is for {message.topic!r}, "
                f"message 0 for {topic!r}; group messages by topic first"
            )
        if PROPERTY_DELAY_TIME_LEVEL in message.properties:
            raise InvalidMessage(
                f"message {position} of a batch to {topic!r} has a delay level; RocketMQ "
                "batches cannot be delayed (send delayed messages one by one)"
            )
        if not 0 < len(message.body) <= max_message_size:
            validate_message(message, max_message_size)  # raises, naming the problem
    return topic


def split_batch(
    messages: Sequence[Message],
    new_unique_key: Callable[[], str] | None = None,
    max_message_size: int = MESSAGE_BODY_SIZE_MAX,
) -> list[BatchChunk]:
    """Encode ``messages`` (already checked) into request-sized chunks, in order.

    Each message gets a UNIQ_KEY property from ``new_unique_key()`` unless it has one (so the
    caller can read it afterwards, and a re-sent message keeps its id, as in RocketMQ).
    None, or ``tidemq.protocol.msgid.new_unique_key`` itself, means the process's own keys,
    then made for the whole batch in one run (``new_unique_keys``).

    Raises:
        MessageTooLarge: one message's entry alone is over ``max_message_size``, or its
            properties exceed 32767 bytes.
    """
    # One pass: each entry's head, body, length and properties go straight into the chunk's
    # parts (no intermediate entry objects); one join per chunk.
    chunks: list[BatchChunk] = []
    parts: list[bytes] = []
    keys: list[str] = []
    chunk_size = 0
    pack_head = _BATCH_ENTRY_HEAD.pack
    pack_int16 = _PROPERTIES_LENGTH.pack
    if new_unique_key is None or new_unique_key is process_unique_key:
        # One key per message that may need one: a re-sent message keeps its own, and the
        # counter values made for it go unused, which costs nothing but the values.
        new_unique_key = iter(new_unique_keys(len(messages))).__next__
    for message in messages:
        properties = message.properties
        if not properties:
            # The common case (no tags, keys or user properties): only the new UNIQ_KEY.
            key = new_unique_key()
            properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = key
            encoded = (_UNIQUE_KEY_PREFIX + key).encode("ascii")
        else:
            key = properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            if key is None:
                key = new_unique_key()
                properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = key
            text = encode_properties(properties)
            encoded = text.encode("utf-8")
            if len(encoded) > PROPERTIES_SIZE_MAX:
                check_properties_size(message.topic, text)
        body = message.body
        body_length = len(body)
        properties_size = len(encoded)
        entry_size = BATCH_ENTRY_FIXED_SIZE + body_length + properties_size
        if entry_size > max_message_size:
            raise MessageTooLarge(
                f"a batch message to {message.topic!r} encodes to {entry_size} bytes, over "
                f"max_message_size={max_message_size}; send it on its own or make it smaller"
            )
        if chunk_size + entry_size > max_message_size and keys:
            chunks.append(BatchChunk(b"".join(parts), keys))
            parts, keys, chunk_size = [], [], 0
        parts += (
            pack_head(entry_size, 0, 0, message.flag, body_length),
            body,
            pack_int16(properties_size),
            encoded,
        )
        keys.append(key)
        chunk_size += entry_size
    if keys:
        chunks.append(BatchChunk(b"".join(parts), keys))
    return chunks

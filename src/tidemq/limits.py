"""Limits shared by the protocol, the store, the broker and the client.

Each default carries the reason for its value. Every limit is checked before any
allocation, buffering or write, so a peer cannot make tidemq allocate without bound.
"""

from __future__ import annotations

import re

# RocketMQ's NettyDecoder default (com.rocketmq.remoting.frameMaxLength): 16 MiB. Large enough
# for a 4 MiB message plus a batch of them headers, small enough that a garbage length prefix
# cannot make a server buffer gigabytes.
FRAME_SIZE_MAX = 16 * 1024 * 1024

# RocketMQ's maxMessageSize default, enforced by both the Java client and the broker.
MESSAGE_BODY_SIZE_MAX = 4 * 1024 * 1024

# The properties length is a Java short in the stored record layout (docs/protocol.md §6.1).
PROPERTIES_SIZE_MAX = 32767

# The topic length is one byte in the v1 stored record, and Java clients reject > 127 chars.
TOPIC_NAME_LENGTH_MAX = 127

# Java clients' group-name rule (Validators.checkGroup).
GROUP_NAME_LENGTH_MAX = 255

TOPIC_NAME_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")


def topic_name_problem(topic: str) -> str | None:
    """Return why ``topic`` breaks RocketMQ's topic name rules, or None when it is valid."""
    if not topic or not topic.strip():
        return "topic name is blank; give a name of letters, digits, '%', '|', '_' or '-'"
    if len(topic) > TOPIC_NAME_LENGTH_MAX:
        return (
            f"topic name {topic[:40]!r}... is {len(topic)} characters, "
            f"longer than the limit of {TOPIC_NAME_LENGTH_MAX}"
        )
    if not TOPIC_NAME_PATTERN.fullmatch(topic):  # match() would let a trailing newline in
        return (
            f"topic name {topic!r} has characters outside [%|a-zA-Z0-9_-]; "
            "use only letters, digits, '%', '|', '_' and '-'"
        )
    return None


def group_name_problem(group: str) -> str | None:
    """Return why ``group`` breaks RocketMQ's group name rules, or None when it is valid."""
    if not group or not group.strip():
        return "group name is blank; give a name of letters, digits, '%', '|', '_' or '-'"
    if len(group) > GROUP_NAME_LENGTH_MAX:
        return f"group name is {len(group)} characters, longer than the limit of 255"
    if not TOPIC_NAME_PATTERN.fullmatch(group):
        return (
            f"group name {group!r} has characters outside [%|a-zA-Z0-9_-]; "
            "use only letters, digits, '%', '|', '_' and '-'"
        )
    return None

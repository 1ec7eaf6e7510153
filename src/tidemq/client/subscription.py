"""Subscriptions by tag (docs/protocol.md §9.2) or by SQL92 over message properties (§9.3),
and the SubscriptionData a consumer reports.

TAG (the default): ``"*"``, empty or None subscribe everything. Otherwise the expression is
split on ``||`` and each tag trimmed: ``"TagA || TagB"`` -> {TagA, TagB}. The broker filters by
tag hash codes (the Java ``String.hashCode`` of each tag); the client filters again by the tag
strings, so hash collisions never deliver a message of another tag.

SQL92 (``expression_type="SQL92"``): ``"region = 'eu' AND amount > 100"`` is checked here
(``tidemq.filter.sql92``: a typo fails at ``subscribe`` with its position) and evaluated by
the broker against each message's properties, TAGS included; the broker must run with
``enablePropertyFilter=true``. The client does not filter such messages again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tidemq.client.errors import InvalidSubscription
from tidemq.errors import SqlFilterError
from tidemq.filter.sql92 import compile_sql92
from tidemq.protocol.message import MessageExt, java_string_hash

SUBSCRIBE_ALL = "*"
EXPRESSION_TYPE_TAG = "TAG"
EXPRESSION_TYPE_SQL92 = "SQL92"
EXPRESSION_TYPES = (EXPRESSION_TYPE_TAG, EXPRESSION_TYPE_SQL92)


@dataclass(slots=True)
class Subscription:
    """One topic's subscription.

    Attributes:
        topic: the topic.
        expression: the expression as given, ``"*"`` for all.
        tags: the tags to accept; empty means all (and is empty for SQL92, which the broker
            alone filters).
        version_ms: when the subscription was made (RocketMQ ``subVersion``).
        expression_type: ``TAG`` or ``SQL92``.
    """

    topic: str
    expression: str = SUBSCRIBE_ALL
    tags: frozenset[str] = field(default_factory=frozenset)
    version_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    expression_type: str = EXPRESSION_TYPE_TAG

    @property
    def matches_all(self) -> bool:
        """True when the client keeps every message the broker sends (``*``, or SQL92)."""
        return not self.tags

    @property
    def is_sql92(self) -> bool:
        """True for a SQL92 property filter."""
        return self.expression_type == EXPRESSION_TYPE_SQL92

    def matches(self, message: MessageExt) -> bool:
        """True when ``message``'s TAGS is one of the subscribed tags (or all are)."""
        return not self.tags or message.properties.get("TAGS") in self.tags

    def to_json(self) -> dict[str, object]:
        """The SubscriptionData JSON object of a heartbeat (docs/protocol.md §5.1)."""
        tags = sorted(self.tags)
        return {
            "classFilterMode": False,
            "codeSet": [java_string_hash(t) for t in tags],
            "expressionType": self.expression_type,
            "subString": self.expression,
            "subVersion": self.version_ms,
            "tagsSet": tags,
            "topic": self.topic,
        }


def parse_tag_expression(topic: str, expression: str | None) -> Subscription:
    """Build the Subscription for a TAG expression.

    Raises:
        InvalidSubscription: the expression has no tag at all (e.g. ``"||"``).
    """
    text = (expression or "").strip()
    if not text or text == SUBSCRIBE_ALL:
        return Subscription(topic, SUBSCRIBE_ALL, frozenset())
    tags = frozenset(piece.strip() for piece in text.split("||") if piece.strip())
    if not tags:
        raise InvalidSubscription(
            f"tag expression {expression!r} for topic {topic!r} names no tag; "
            "use '*' or 'TagA || TagB'"
        )
    return Subscription(topic, text, tags)


def parse_subscription(
    topic: str, expression: str | None, expression_type: str | None = EXPRESSION_TYPE_TAG
) -> Subscription:
    """Build the Subscription for a TAG or SQL92 expression.

    Args:
        topic: the topic.
        expression: a tag expression, or for SQL92 a condition such as ``"a > 5"``.
        expression_type: ``"TAG"`` (default, also for None) or ``"SQL92"``, any case.
    Raises:
        InvalidSubscription: an unknown type, a tag expression without a tag, or SQL92 text
            that does not parse (the message names the position and what was expected).
    """
    kind = (expression_type or EXPRESSION_TYPE_TAG).strip().upper()
    if kind == EXPRESSION_TYPE_TAG:
        return parse_tag_expression(topic, expression)
    if kind != EXPRESSION_TYPE_SQL92:
        raise InvalidSubscription(
            f"expression_type={expression_type!r} for topic {topic!r} is unknown; use "
            f"{EXPRESSION_TYPE_TAG!r} or {EXPRESSION_TYPE_SQL92!r}"
        )
    text = (expression or "").strip()
    if not text:
        raise InvalidSubscription(
            f"SQL92 expression for topic {topic!r} is empty; give a condition such as "
            "\"region = 'eu' AND amount > 100\", or subscribe by TAG with '*'"
        )
    try:
        compile_sql92(text)
    except SqlFilterError as e:
        raise InvalidSubscription(f"subscription to {topic!r}: {e}") from e
    return Subscription(topic, text, frozenset(), expression_type=EXPRESSION_TYPE_SQL92)

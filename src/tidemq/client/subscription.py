"""Tag subscriptions (protocol-notes §9.2) and the SubscriptionData a consumer reports.

``"*"``, empty or None subscribe everything. Otherwise the expression is split on ``||`` and
each tag trimmed: ``"TagA || TagB"`` -> {TagA, TagB}. The broker filters by tag hash codes (the
Java ``String.hashCode`` of each tag); the client filters again by the tag strings, so hash
collisions never deliver a message of another tag.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tidemq.client.errors import InvalidSubscription
from tidemq.protocol.message import MessageExt, java_string_hash

SUBSCRIBE_ALL = "*"
EXPRESSION_TYPE_TAG = "TAG"


@dataclass(slots=True)
class Subscription:
    """One topic's tag subscription.

    Attributes:
        topic: the topic.
        expression: the expression as given, ``"*"`` for all.
        tags: the tags to accept; empty means all.
        version_ms: when the subscription was made (RocketMQ ``subVersion``).
    """

    topic: str
    expression: str = SUBSCRIBE_ALL
    tags: frozenset[str] = field(default_factory=frozenset)
    version_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def matches_all(self) -> bool:
        return not self.tags

    def matches(self, message: MessageExt) -> bool:
        """True when ``message``'s TAGS is one of the subscribed tags (or all are)."""
        return not self.tags or message.properties.get("TAGS") in self.tags

    def to_json(self) -> dict[str, object]:
        """The SubscriptionData JSON object of a heartbeat (protocol-notes §5.1)."""
        tags = sorted(self.tags)
        return {
            "classFilterMode": False,
            "codeSet": [java_string_hash(t) for t in tags],
            "expressionType": EXPRESSION_TYPE_TAG,
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

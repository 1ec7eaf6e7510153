"""Who is connected: consumer groups and producer groups, their channels and subscriptions.

Theory of operation
-------------------
Clients announce themselves with HEART_BEAT every 30 s (docs/protocol.md §4.6, §5.1). For each
consumer group the broker keeps

- its members: one ``ClientChannel`` per connection (client id, language, version, when it
  was last heard from), and
- the group's subscriptions, topic -> ``SubscriptionData``, replaced by each heartbeat as
  RocketMQ does (so every member is expected to subscribe alike; when members differ a
  WARNING names them and what differs, because their rebalances will disagree).

Membership or subscription changes are reported to a listener, which the consumption wiring
turns into NOTIFY_CONSUMER_IDS_CHANGED to every member so they rebalance at once instead of
within 20 s. A member leaves by UNREGISTER_CLIENT, when its connection closes, or when it
has not sent a heartbeat for ``channel_expired_ms`` (120 s; the broker scans every 10 s and
closes such a connection).

Producer groups are kept the same way (minus subscriptions): transaction checks go to a live
producer of the group, and admins list them.

Everything runs on the broker's event loop thread; nothing here is locked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidemq.protocol.message import java_string_hash

if TYPE_CHECKING:
    from tidemq.remoting.connection import Connection

log = logging.getLogger("tidemq.broker")

# RocketMQ's channelExpiredTimeout: four missed heartbeats (30 s each) mean the client is gone.
CLIENT_CHANNEL_EXPIRED_MS = 120_000

EXPRESSION_TYPE_TAG = "TAG"
EXPRESSION_TYPE_SQL92 = "SQL92"
SUBSCRIBE_ALL = "*"

CONSUME_ACTIVELY = "CONSUME_ACTIVELY"  # pull consumers
CONSUME_PASSIVELY = "CONSUME_PASSIVELY"  # push consumers
CLUSTERING = "CLUSTERING"
BROADCASTING = "BROADCASTING"

# Integer enum values some clients send instead of names. Java's ordinals for ConsumeType and
# MessageModel; the C++ 1.x client's own ConsumeFromWhere enum (the only senders of integers).
_CONSUME_TYPE_BY_NUMBER = {0: CONSUME_ACTIVELY, 1: CONSUME_PASSIVELY}
_MESSAGE_MODEL_BY_NUMBER = {0: BROADCASTING, 1: CLUSTERING}
_CONSUME_FROM_BY_NUMBER = {
    0: "CONSUME_FROM_LAST_OFFSET",
    1: "CONSUME_FROM_FIRST_OFFSET",
    2: "CONSUME_FROM_TIMESTAMP",
}


# -- subscriptions --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubscriptionData:
    """One topic subscription of a consumer group.

    ``code_set`` is None for "everything" (``*``) and for SQL92 expressions; otherwise the
    Java hashes of ``tags_set``, which the broker matches against consume-queue tag codes.
    The client filters again by the tag strings, so hash collisions only cost a transfer.
    """

    topic: str
    sub_string: str = SUBSCRIBE_ALL
    expression_type: str = EXPRESSION_TYPE_TAG
    tags_set: tuple[str, ...] = ()
    code_set: frozenset[int] | None = None
    sub_version: int = 0
    class_filter_mode: bool = False

    @property
    def is_tag_type(self) -> bool:
        """True for TAG expressions (the broker filters them by tag code)."""
        return self.expression_type == EXPRESSION_TYPE_TAG

    def same_expression(self, other: SubscriptionData) -> bool:
        """True when both select the same messages (version aside)."""
        return (
            self.expression_type == other.expression_type
            and self.sub_string == other.sub_string
            and self.tags_set == other.tags_set
        )

    def to_json(self) -> dict[str, Any]:
        """The SubscriptionData JSON object a Java admin tool reads."""
        return {
            "classFilterMode": self.class_filter_mode,
            "codeSet": sorted(self.code_set or ()),
            "expressionType": self.expression_type,
            "subString": self.sub_string,
            "subVersion": self.sub_version,
            "tagsSet": list(self.tags_set),
            "topic": self.topic,
        }


def parse_tags(expression: str | None) -> tuple[str, ...]:
    """The tags of a TAG expression: ``"a || b"`` -> ("a", "b"); ``*``/empty -> () (all)."""
    if expression is None:
        return ()
    expression = expression.strip()
    if not expression or expression == SUBSCRIBE_ALL:
        return ()
    tags: list[str] = []
    for piece in expression.split("||"):
        tag = piece.strip()
        if tag and tag not in tags:
            tags.append(tag)
    return tuple(tags)


def build_subscription(
    topic: str,
    expression: str | None,
    expression_type: str | None = None,
    sub_version: int = 0,
    tags: Iterable[str] | None = None,
) -> SubscriptionData:
    """A subscription from an expression, as the broker matches it.

    The tag codes are always computed here from the tags (``tags`` when given, else parsed
    from ``expression``): the C++ 1.x client sends ``codeSet:[0]`` whatever its tags are.
    """
    kind = (expression_type or EXPRESSION_TYPE_TAG).strip().upper() or EXPRESSION_TYPE_TAG
    if kind != EXPRESSION_TYPE_TAG:
        return SubscriptionData(
            topic=topic, sub_string=(expression or "").strip(), expression_type=kind,
            sub_version=sub_version,
        )
    tag_list = tuple(t.strip() for t in tags if isinstance(t, str) and t.strip()) if tags else ()
    if not tag_list:
        tag_list = parse_tags(expression)
    if not tag_list or SUBSCRIBE_ALL in tag_list:
        return SubscriptionData(topic=topic, sub_version=sub_version)
    return SubscriptionData(
        topic=topic,
        sub_string=(expression or " || ".join(tag_list)).strip(),
        expression_type=EXPRESSION_TYPE_TAG,
        tags_set=tag_list,
        code_set=frozenset(java_string_hash(tag) for tag in tag_list),
        sub_version=sub_version,
    )


def enum_name(value: Any, by_number: dict[int, str], default: str) -> str:
    """An enum field of a heartbeat as its Java name; integers map through ``by_number``."""
    if isinstance(value, str) and value:
        if value.lstrip("-").isdigit():
            return by_number.get(int(value), default)
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return by_number.get(value, default)
    return default


def consume_type_name(value: Any) -> str:
    """ConsumeType by name or number (default CONSUME_PASSIVELY)."""
    return enum_name(value, _CONSUME_TYPE_BY_NUMBER, CONSUME_PASSIVELY)


def message_model_name(value: Any) -> str:
    """MessageModel by name or number (default CLUSTERING)."""
    return enum_name(value, _MESSAGE_MODEL_BY_NUMBER, CLUSTERING)


def consume_from_where_name(value: Any) -> str:
    """ConsumeFromWhere by name or (C++ client) number (default CONSUME_FROM_LAST_OFFSET)."""
    return enum_name(value, _CONSUME_FROM_BY_NUMBER, "CONSUME_FROM_LAST_OFFSET")


# -- channels -------------------------------------------------------------------------------------


@dataclass(slots=True)
class ClientChannel:
    """One client connection as a member of a group."""

    connection: Connection
    client_id: str
    language: str
    version: int
    last_update_ms: int

    def to_json(self) -> dict[str, Any]:
        """The Connection JSON object of ConsumerConnection / ProducerConnection bodies."""
        return {
            "clientAddr": self.connection.remote_address,
            "clientId": self.client_id,
            "language": self.language,
            "version": self.version,
        }


@dataclass(slots=True)
class ConsumerGroupInfo:
    """A consumer group's members and subscriptions."""

    group: str
    consume_type: str = CONSUME_PASSIVELY
    message_model: str = CLUSTERING
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: dict[Connection, ClientChannel] = field(default_factory=dict)
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)
    # What each member subscribed in its last heartbeat, to warn when members differ.
    member_subscriptions: dict[str, dict[str, SubscriptionData]] = field(default_factory=dict)
    warned_difference: str | None = None

    def client_ids(self) -> list[str]:
        """Client ids of the live members, in join order."""
        return [channel.client_id for channel in self.channels.values()]

    def connections(self) -> list[Connection]:
        """The members' connections."""
        return list(self.channels)

    def find_subscription(self, topic: str) -> SubscriptionData | None:
        """The group's subscription of ``topic``, or None."""
        return self.subscriptions.get(topic)

    def to_connection_json(self) -> dict[str, Any]:
        """The ConsumerConnection body (GET_CONSUMER_CONNECTION_LIST)."""
        return {
            "connectionSet": [channel.to_json() for channel in self.channels.values()],
            "consumeFromWhere": self.consume_from_where,
            "consumeType": self.consume_type,
            "messageModel": self.message_model,
            "subscriptionTable": {
                topic: sub.to_json() for topic, sub in self.subscriptions.items()
            },
        }


GroupChangeListener = Callable[[str, list["Connection"]], None]


class ConsumerManager:
    """Consumer groups by name: members, subscriptions, expiry.

    Args:
        on_group_changed: called with (group, remaining members' connections) when a group's
            membership or subscriptions changed and the group wants to be told.
        clock_ms: a monotonic millisecond clock (injected by tests).
        channel_expired_ms: members not heard from for this long are dropped by
            ``scan_expired``.
    """

    def __init__(
        self,
        on_group_changed: GroupChangeListener,
        clock_ms: Callable[[], int],
        *,
        channel_expired_ms: int = CLIENT_CHANNEL_EXPIRED_MS,
    ) -> None:
        self._on_group_changed = on_group_changed
        self._clock_ms = clock_ms
        self._channel_expired_ms = channel_expired_ms
        self._groups: dict[str, ConsumerGroupInfo] = {}

    def get(self, group: str) -> ConsumerGroupInfo | None:
        """The group, or None when no member is connected."""
        return self._groups.get(group)

    def groups(self) -> list[str]:
        """Names of the groups with live members."""
        return list(self._groups)

    def groups_subscribing(self, topic: str) -> list[str]:
        """Groups whose subscriptions include ``topic``."""
        return [name for name, info in self._groups.items() if topic in info.subscriptions]

    def find_subscription(self, group: str, topic: str) -> SubscriptionData | None:
        """The subscription of ``topic`` by ``group`` from its heartbeats, or None."""
        info = self._groups.get(group)
        return None if info is None else info.subscriptions.get(topic)

    def register(
        self,
        group: str,
        channel: ClientChannel,
        *,
        consume_type: str,
        message_model: str,
        consume_from_where: str,
        subscriptions: list[SubscriptionData],
        notify: bool,
    ) -> bool:
        """Record a member's heartbeat; returns True when the group changed.

        A new member, a subscribed topic added or removed, or an expression changed count
        as changes; then ``on_group_changed`` runs when ``notify`` is true.
        """
        info = self._groups.get(group)
        if info is None:
            info = self._groups[group] = ConsumerGroupInfo(group)
        info.consume_type = consume_type
        info.message_model = message_model
        info.consume_from_where = consume_from_where
        channel_changed = self._update_channel(info, channel)
        subscriptions_changed = self._update_subscriptions(info, subscriptions)
        info.member_subscriptions[channel.client_id] = {s.topic: s for s in subscriptions}
        self._warn_if_members_differ(info)
        changed = channel_changed or subscriptions_changed
        if changed and notify:
            self._on_group_changed(group, info.connections())
        return changed

    def unregister(self, group: str, connection: Connection, *, notify: bool) -> bool:
        """Remove ``connection`` from ``group`` (UNREGISTER_CLIENT); True when it was a member."""
        info = self._groups.get(group)
        if info is None:
            return False
        removed = self._remove_channel(info, connection)
        if removed and notify:
            self._on_group_changed(group, info.connections())
        return removed

    def connection_closed(self, connection: Connection) -> list[str]:
        """Drop ``connection`` from every group; returns the groups it left (each notified)."""
        left: list[str] = []
        for group, info in list(self._groups.items()):
            if self._remove_channel(info, connection):
                left.append(group)
                self._on_group_changed(group, info.connections())
        return left

    def scan_expired(self) -> list[ClientChannel]:
        """Drop members not heard from for ``channel_expired_ms``; returns them.

        Their groups are notified; closing the stale connections is the caller's choice.
        """
        now = self._clock_ms()
        expired: list[ClientChannel] = []
        for group, info in list(self._groups.items()):
            stale = [
                channel for channel in info.channels.values()
                if now - channel.last_update_ms > self._channel_expired_ms
            ]
            for channel in stale:
                log.warning(
                    "consumer %s of group %s at %s sent no heartbeat for %d ms (limit %d ms); "
                    "dropping it", channel.client_id, group, channel.connection.remote_address,
                    now - channel.last_update_ms, self._channel_expired_ms,
                )
                self._remove_channel(info, channel.connection)
                expired.append(channel)
            if stale:
                self._on_group_changed(group, info.connections())
        return expired

    # -- internals ----------------------------------------------------------------------------

    def _update_channel(self, info: ConsumerGroupInfo, channel: ClientChannel) -> bool:
        known = info.channels.get(channel.connection)
        if known is None:
            info.channels[channel.connection] = channel
            log.info("consumer %s joined group %s from %s", channel.client_id, info.group,
                     channel.connection.remote_address)
            return True
        if known.client_id != channel.client_id:
            log.warning(
                "connection %s of group %s changed its client id from %s to %s",
                channel.connection.remote_address, info.group, known.client_id, channel.client_id,
            )
            info.member_subscriptions.pop(known.client_id, None)
            known.client_id = channel.client_id
        known.language = channel.language
        known.version = channel.version
        known.last_update_ms = channel.last_update_ms
        return False

    @staticmethod
    def _update_subscriptions(
        info: ConsumerGroupInfo, subscriptions: list[SubscriptionData]
    ) -> bool:
        changed = False
        current = info.subscriptions
        wanted = {s.topic: s for s in subscriptions}
        for topic, sub in wanted.items():
            old = current.get(topic)
            if old is None or not old.same_expression(sub):
                current[topic] = sub
                changed = True
            elif sub.sub_version > old.sub_version:
                current[topic] = sub
        for topic in [t for t in current if t not in wanted]:
            del current[topic]
            changed = True
        return changed

    def _remove_channel(self, info: ConsumerGroupInfo, connection: Connection) -> bool:
        channel = info.channels.pop(connection, None)
        if channel is None:
            return False
        log.info("consumer %s left group %s (%s)", channel.client_id, info.group,
                 connection.remote_address)
        if channel.client_id not in info.client_ids():
            info.member_subscriptions.pop(channel.client_id, None)
        if not info.channels:
            del self._groups[info.group]
        return True

    @staticmethod
    def _warn_if_members_differ(info: ConsumerGroupInfo) -> None:
        views: dict[tuple[tuple[str, str, str], ...], list[str]] = {}
        for client_id, subs in info.member_subscriptions.items():
            key = tuple(sorted((t, s.expression_type, s.sub_string) for t, s in subs.items()))
            views.setdefault(key, []).append(client_id)
        if len(views) <= 1:
            info.warned_difference = None
            return
        text = "; ".join(
            f"{', '.join(sorted(members))} subscribe "
            + (", ".join(f"{topic}={expr!r}" for topic, _kind, expr in key) or "nothing")
            for key, members in sorted(views.items(), key=lambda kv: sorted(kv[1]))
        )
        if text != info.warned_difference:
            info.warned_difference = text
            log.warning(
                "members of consumer group %s subscribe differently, so their rebalances "
                "disagree and some messages may not be consumed: %s. Give every member of a "
                "group the same subscriptions, or use different groups", info.group, text,
            )


class ProducerManager:
    """Producer groups by name: their live channels (for transaction checks and admins)."""

    def __init__(
        self, clock_ms: Callable[[], int], *, channel_expired_ms: int = CLIENT_CHANNEL_EXPIRED_MS
    ) -> None:
        self._clock_ms = clock_ms
        self._channel_expired_ms = channel_expired_ms
        self._groups: dict[str, dict[Connection, ClientChannel]] = {}

    def register(self, group: str, channel: ClientChannel) -> None:
        """Record a producer's heartbeat."""
        channels = self._groups.setdefault(group, {})
        known = channels.get(channel.connection)
        if known is None:
            channels[channel.connection] = channel
            log.info("producer %s joined group %s from %s", channel.client_id, group,
                     channel.connection.remote_address)
        else:
            known.client_id = channel.client_id
            known.last_update_ms = channel.last_update_ms
            known.language = channel.language
            known.version = channel.version

    def unregister(self, group: str, connection: Connection) -> bool:
        """Remove ``connection`` from ``group``; True when it was a member."""
        channels = self._groups.get(group)
        if channels is None or channels.pop(connection, None) is None:
            return False
        if not channels:
            del self._groups[group]
        return True

    def connection_closed(self, connection: Connection) -> list[str]:
        """Drop ``connection`` from every producer group; returns the groups it left."""
        return [group for group in list(self._groups) if self.unregister(group, connection)]

    def scan_expired(self) -> list[ClientChannel]:
        """Drop producers not heard from for ``channel_expired_ms``; returns them."""
        now = self._clock_ms()
        expired: list[ClientChannel] = []
        for group, channels in list(self._groups.items()):
            for channel in [c for c in channels.values()
                            if now - c.last_update_ms > self._channel_expired_ms]:
                log.warning(
                    "producer %s of group %s at %s sent no heartbeat for %d ms; dropping it",
                    channel.client_id, group, channel.connection.remote_address,
                    now - channel.last_update_ms,
                )
                self.unregister(group, channel.connection)
                expired.append(channel)
        return expired

    def channels(self, group: str) -> list[ClientChannel]:
        """The live channels of ``group`` (empty when none)."""
        return list(self._groups.get(group, {}).values())

    def available_connection(self, group: str) -> Connection | None:
        """A live connection of ``group`` (for broker-initiated calls), or None."""
        for channel in self._groups.get(group, {}).values():
            if not channel.connection.is_closing:
                return channel.connection
        return None

    def groups(self) -> list[str]:
        """Names of the producer groups with live members."""
        return list(self._groups)

    def find_connection(self, client_id: str) -> Connection | None:
        """The open connection of the producer whose client id is ``client_id`` (a
        requester waiting for replies), or None."""
        for channels in self._groups.values():
            for channel in channels.values():
                if channel.client_id == client_id and not channel.connection.is_closing:
                    return channel.connection
        return None

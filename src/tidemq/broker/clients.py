"""Clients: the broker's tables of connected consumers and producers, and what follows a change.

One part holding

    consumers   ConsumerManager      consumer groups from heartbeats (client_manager.py)
    producers   ProducerManager      producer groups from heartbeats
    filters     ConsumerFilterTable  compiled SQL92 filters by (group, topic)

with the clock their channel expiry reads (public ``clock_ms``: a test swaps in a fake one),
the NOTIFY_CONSUMER_IDS_CHANGED oneway requests sent when a group's membership changes
(notifyConsumerIdsChangedEnable), and the watch that drops a closed connection from every
group at once.

Ownership: the broker's event loop thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidemq.broker.client_manager import ConsumerManager, ProducerManager
from tidemq.broker.config import BrokerConfig
from tidemq.broker.lock_manager import monotonic_ms
from tidemq.filter.consumer_filters import ConsumerFilterTable
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import NotifyConsumerIdsChangedRequestHeader
from tidemq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from tidemq.broker.client_manager import ClientChannel
    from tidemq.remoting.connection import Connection

log = logging.getLogger("tidemq.broker")

_WATCHED_ATTRIBUTE = "tidemq.broker.client_watch"


class Clients:
    """The connected consumers and producers of one broker.

    Args:
        config: channelExpiredTimeout and notifyConsumerIdsChangedEnable.
        clock_ms: a monotonic millisecond clock for channel expiry (tests inject one).
    """

    def __init__(self, config: BrokerConfig, *, clock_ms: Callable[[], int] | None = None) -> None:
        self._config = config
        # Public so a test can swap in a fake clock after the controller built us; the
        # managers read it through ``now_ms`` on every use.
        self.clock_ms: Callable[[], int] = clock_ms or monotonic_ms
        self.consumers = ConsumerManager(
            self._notify_group_changed, self.now_ms,
            channel_expired_ms=config.channel_expired_timeout_ms,
        )
        self.producers = ProducerManager(
            self.now_ms, channel_expired_ms=config.channel_expired_timeout_ms
        )
        self.filters = ConsumerFilterTable()
        self._notifications: set[asyncio.Task[None]] = set()

    def now_ms(self) -> int:
        """The current reading of ``clock_ms``."""
        return self.clock_ms()

    def watch_connection(self, connection: Connection) -> None:
        """Drop the connection from every client group at once when it closes."""
        if connection.attributes.get(_WATCHED_ATTRIBUTE):
            return
        connection.attributes[_WATCHED_ATTRIBUTE] = True
        connection.on_close.append(self._connection_closed)

    def scan_expired(self) -> list[ClientChannel]:
        """Drop consumers and producers silent for channelExpiredTimeout; return their
        channels (the caller closes their connections)."""
        return self.consumers.scan_expired() + self.producers.scan_expired()

    async def shutdown(self) -> None:
        """Give the notifications still being sent a moment (1 s) to go out."""
        notifications = list(self._notifications)
        if notifications:
            await asyncio.wait(notifications, timeout=1.0)

    # -- internals ----------------------------------------------------------------------------

    def _connection_closed(self, connection: Connection) -> None:
        self.consumers.connection_closed(connection)
        self.producers.connection_closed(connection)

    def _notify_group_changed(self, group: str, connections: list[Connection]) -> None:
        """Tell every member of ``group`` to rebalance (NOTIFY_CONSUMER_IDS_CHANGED, oneway)."""
        if not self._config.notify_consumer_ids_changed_enable or not connections:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            log.debug("no event loop to notify group %s on", group)
            return
        ext_fields = NotifyConsumerIdsChangedRequestHeader(consumer_group=group).to_ext_fields()
        for connection in connections:
            if connection.is_closing:
                continue
            command = RemotingCommand.request(
                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext_fields, oneway=True
            )
            task = loop.create_task(_send_oneway(connection, command, group))
            self._notifications.add(task)
            task.add_done_callback(self._notifications.discard)


async def _send_oneway(connection: Connection, command: RemotingCommand, group: str) -> None:
    try:
        await connection.send_oneway(command)
    except RemotingError as e:
        log.info("could not tell %s that group %s changed: %s", connection.remote_address,
                 group, e)
    except Exception:
        log.exception("telling %s that group %s changed failed", connection.remote_address,
                      group)

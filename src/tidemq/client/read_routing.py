"""Reading from a broker group: its master, or a slave when the master is gone or says so.

A broker group is one master (brokerId 0) and its slaves under one broker name; every one of
them holds the same messages, a slave a little later (issue 11). Reads — pulls, offset
queries and commits, the group's member list — go to (RocketMQ's
``findBrokerAddressInSubscribe`` with ``onlyThisBroker=false``, docs/protocol.md §13.3):

1. the broker the last pull of that queue was told to use (``suggestWhichBrokerId``): the
   master unless it enables slave reads, and a slave tells its consumers to go back to 0;
2. then the master, then the slaves by id.

Unlike RocketMQ's client, which keeps pulling a master that died until the next route
refresh (30 s), a read that fails in transport (refused, reset, timed out) goes on at once
to the next address of the group, and the failed address is tried last for
``DOWN_BACKOFF_S``. So consumption goes on from the slave while the master is down and
comes back to the master by itself once it answers again.

Writes never come here: messages go to masters only.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from tidemq.client.errors import NoRouteError
from tidemq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from tidemq.client.instance import ClientInstance
    from tidemq.client.message import MessageQueue
    from tidemq.client.route import TopicRouteData

MASTER_ID = 0

# An address that failed is tried after the others for this long: long enough that a dead
# master costs one refused connect per queue per period, short enough that a master back
# from a restart gets its readers back within seconds.
DOWN_BACKOFF_S = 3.0

T = TypeVar("T")


def route_read_addresses(route: TopicRouteData) -> list[str]:
    """Every address of the route's broker groups: each group's master first, then its
    slaves by id (where a group-wide question, such as its member list, can be asked)."""
    return [
        address
        for broker in sorted(route.broker_datas, key=lambda b: b.broker_name)
        for _, address in sorted(broker.broker_addrs.items())
    ]


class ReadRouting:
    """Which address of a broker group a consumer reads a queue from (module docstring).

    Args:
        instance: the client instance whose routes name the groups' addresses.
        clock: monotonic seconds (tests inject one).
    """

    def __init__(self, instance: ClientInstance,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._instance = instance
        self._clock = clock
        self._suggested: dict[MessageQueue, int] = {}
        self._down_until: dict[str, float] = {}

    def candidates(self, queue: MessageQueue) -> list[tuple[int, str]]:
        """``(broker id, address)`` of ``queue``'s broker group in the order to try."""
        addresses = self._instance.broker_addresses.get(queue.broker_name)
        if not addresses:
            return []
        if len(addresses) == 1:
            # A master alone (the common case) has nothing to order: every pull of a consumer
            # asks this, and the ordering below cost ~6 us of its ~30 us fixed cost.
            return list(addresses.items())
        wanted = self._suggested.get(queue, MASTER_ID) if self._suggested else MASTER_ID
        ordered = sorted(addresses.items(), key=lambda item: (item[0] != wanted, item[0]))
        now = self._clock()
        up = [item for item in ordered if self._down_until.get(item[1], 0.0) <= now]
        return up + [item for item in ordered if item not in up]

    def suggest(self, queue: MessageQueue, broker_id: int) -> None:
        """Record a pull answer's suggestWhichBrokerId for the next pull of ``queue``."""
        if broker_id == MASTER_ID:
            if self._suggested:  # usually empty: no queue hash per pull
                self._suggested.pop(queue, None)
        else:
            self._suggested[queue] = broker_id

    def forget(self, queue: MessageQueue) -> None:
        """Drop what is known of ``queue`` (it left this consumer)."""
        self._suggested.pop(queue, None)

    async def call(self, queue: MessageQueue,
                   action: Callable[[int, str], Awaitable[T]]) -> T:
        """Run ``action(broker id, address)`` on the first address of ``queue``'s group that
        answers; the route is fetched once when no address is known.

        Raises:
            NoRouteError: no address is known for the queue's broker.
            RemotingError: every address failed in transport (the last error).
            Whatever ``action`` raises besides RemotingError.
        """
        candidates = self.candidates(queue)
        if not candidates:
            await self._instance.fetch_route(queue.topic)
            candidates = self.candidates(queue)
            if not candidates:
                raise NoRouteError(f"no address known for broker {queue.broker_name!r} of "
                                   f"{queue}; is it registered with the name server?")
        failure: RemotingError | None = None
        for broker_id, address in candidates:
            try:
                result = await action(broker_id, address)
            except RemotingError as e:
                self._down_until[address] = self._clock() + DOWN_BACKOFF_S
                failure = e
                continue
            if self._down_until:
                self._down_until.pop(address, None)
            return result
        assert failure is not None
        raise failure

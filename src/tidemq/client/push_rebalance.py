"""Which queues a push consumer owns: rebalancing, orderly queue locks, and the group check.

Theory of operation
-------------------
**Rebalance** (every 20 s, when a broker sends NOTIFY_CONSUMER_IDS_CHANGED, and at start).
For each subscribed topic, ``%RETRY%<group>`` included for a clustering consumer, the
consumer takes the topic's readable queues from its route and the group's member ids from a
master broker (GET_CONSUMER_LIST_BY_GROUP), and runs the allocation strategy
(``tidemq.client.rebalance``). A broadcasting consumer simply takes every queue. A topic whose
route or members cannot be fetched keeps its current queues for this round.

Queues newly ours get a ProcessQueue and a pull loop (``PushConsumer``). Queues no longer ours
are *released*: marked dropped (pulls stop, queued consumption is skipped), their offset
committed to the broker (the new owner starts there), then forgotten. Both members act on the
same notification at about the same time, so a queue taken over from another member waits
``takeover_delay_ms`` (1 s) before reading its offset: the previous owner's last commit lands
first, and a handoff between live members delivers nothing twice. (RocketMQ starts at once and
re-delivers the messages consumed since the previous owner's last periodic commit.)

**Orderly queues** (clustering) are consumed only while this client holds their broker lock
(LOCK_BATCH_MQ; the broker's lease lasts 60 s). Locks are renewed every 20 s for every owned
queue; a lock not renewed within 30 s is treated as lost locally, which stops consumption of
that queue before the broker can give it to someone else. A queue newly ours is locked before
its first pull; while another member still holds it the pull loop waits and tries again, and
its starting offset is read from the broker only once the lock is ours, so it starts exactly
where the previous owner committed. Releasing an orderly queue waits for the batch being
consumed to finish, commits the offset, and only then unlocks the queue (UNLOCK_BATCH_MQ), so
the new owner never consumes a message of it while we still do. If the same queue comes back
to us before its release finished, its new pull loop waits for that release first.

**Group check.** Members of one group that subscribe differently are a classic trap: each
allocates the queues of *its* topics among *all* members, so the shares of members that do
not subscribe a topic are never consumed. The broker keeps one subscription table per group,
replaced by each member's heartbeat; after each rebalance a clustering consumer compares it
with its own subscriptions (tags compared as sets) and logs a WARNING naming this member,
both subscriptions and the group's members when they differ (once per distinct difference).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from tidemq.client import broker_api
from tidemq.client.errors import NoRouteError
from tidemq.client.message import MessageQueue
from tidemq.client.process_queue import ProcessQueue
from tidemq.client.read_routing import route_read_addresses
from tidemq.client.subscription import SUBSCRIBE_ALL
from tidemq.errors import TidemqError
from tidemq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from tidemq.client.push_consumer import PushConsumer

log = logging.getLogger("tidemq.client")

# RocketMQ's client-side lock expiry (rocketmq.client.rebalance.lockMaxLiveTime): half the
# broker's 60 s lease, so we stop consuming well before the broker may hand the queue on.
LOCK_EXPIRY_MS = 30_000


def _normalized(expression: str) -> frozenset[str]:
    text = (expression or "").strip()
    if not text or text == SUBSCRIBE_ALL:
        return frozenset()
    return frozenset(p.strip() for p in text.split("||") if p.strip())


def _render(subscriptions: Mapping[str, str]) -> str:
    if not subscriptions:
        return "nothing"
    return ", ".join(f"{topic}={expression!r}" for topic, expression in
                     sorted(subscriptions.items()))


def subscription_difference(
    group: str,
    member: str,
    own: Mapping[str, str],
    registered: Mapping[str, str],
    members: Iterable[str],
) -> str | None:
    """Describe how this member's subscriptions differ from the group's registered ones.

    Args:
        group: the consumer group.
        member: this member's client id.
        own: this member's subscriptions, topic -> expression.
        registered: the group's subscription table at the broker (replaced by every member's
            heartbeat, so it shows some member's subscriptions), topic -> expression.
        members: the group's member ids.

    Returns:
        A warning text naming the members and the subscriptions that differ, or None when
        both select the same topics and tags (``"A||B"`` equals ``"B || A"``).
    """
    same_topics = set(own) == set(registered)
    if same_topics and all(_normalized(own[t]) == _normalized(registered[t]) for t in own):
        return None
    only_own = sorted(set(own) - set(registered))
    only_registered = sorted(set(registered) - set(own))
    differing = sorted(t for t in set(own) & set(registered)
                       if _normalized(own[t]) != _normalized(registered[t]))
    details: list[str] = []
    if only_own:
        details.append(f"only this member subscribes {', '.join(only_own)}")
    if only_registered:
        details.append(f"another member subscribes {', '.join(only_registered)}, this one "
                       "does not")
    for topic in differing:
        details.append(f"{topic}: this member {own[topic]!r}, another {registered[topic]!r}")
    others = sorted(m for m in members if m != member)
    return (
        f"members of consumer group {group} subscribe differently, so their rebalances "
        f"disagree and some messages are never consumed: this member {member} subscribes "
        f"{_render(own)}; the group's registration (the last heartbeat of another member) "
        f"says {_render(registered)} ({'; '.join(details)}); the other members are "
        f"{', '.join(others) or 'none'}. Give every member of a group the same "
        "subscriptions, or use one group per subscription"
    )


class PushRebalance:
    """Owns the assignment of a PushConsumer (see the module docstring)."""

    def __init__(self, consumer: PushConsumer) -> None:
        self._consumer = consumer
        self._releasing: dict[MessageQueue, asyncio.Task[None]] = {}
        self._warned: str | None = None
        self._members_address: str | None = None
        self._shared = False  # other members took part in the last allocation

    # -- rebalancing ---------------------------------------------------------------------------

    async def rebalance(self) -> None:
        """Recompute the owned queues now and start or release queues accordingly."""
        consumer = self._consumer
        wanted: set[MessageQueue] = set()
        self._shared = False
        for topic in consumer.topics():
            try:
                wanted.update(await self._allocate(topic))
            except asyncio.CancelledError:
                raise
            except (RemotingError, TidemqError) as e:
                log.warning("consumer %s: rebalance of topic %r failed, keeping its queues: %s",
                            consumer.group, topic, e)
                wanted.update(q for q in consumer.process_queues if q.topic == topic)
        before = set(consumer.process_queues)
        released = [consumer.process_queues[q] for q in before - wanted]
        for process_queue in released:
            self.release(process_queue)
        for queue in sorted(wanted - before):
            consumer.add_queue(queue, taken_over=self._shared)
        if wanted != before:
            log.info("consumer %s (%s) now owns %d queues: %s", consumer.group,
                     consumer.client_id, len(wanted), ", ".join(map(str, sorted(wanted))))
        if consumer.clustering:
            await self._check_group_subscriptions()

    async def _allocate(self, topic: str) -> list[MessageQueue]:
        consumer = self._consumer
        instance = consumer.instance
        route = await instance.route(topic)
        if route is None:
            if consumer.is_retry_topic(topic):
                return []  # created by the broker with our first heartbeat; comes later
            raise NoRouteError(f"no broker serves topic {topic!r}; create it first")
        queues = route.subscribe_queues(topic)
        if not consumer.clustering or not queues:
            return queues
        # Any broker of a group can name its members (consumers heartbeat to slaves too), so
        # a group whose master is down still rebalances.
        members = await self._members(route_read_addresses(route))
        self._shared = self._shared or len(members) > 1
        if not members:
            # Every broker answered, none lists a member: one that just (re)started and has
            # had no heartbeat yet. Keep what we own, as RocketMQ's client does, rather than
            # drop it and take it back at a stale committed offset a moment later.
            kept = [q for q in consumer.process_queues if q.topic == topic]
            if kept:
                log.info("consumer %s: no broker lists a member of the group yet; keeping its "
                         "%d queues of %s this round", consumer.group, len(kept), topic)
            return kept
        if consumer.client_id not in members:
            log.info("consumer %s: the brokers do not list %s among the group's members yet "
                     "(%s); no queue of %s this round", consumer.group, consumer.client_id,
                     ", ".join(members) or "none", topic)
            return []
        return consumer.allocation(queues, members, consumer.client_id)

    async def _members(self, addresses: list[str]) -> list[str]:
        consumer = self._consumer
        errors: list[str] = []
        answered = False
        for address in addresses:
            try:
                members = await broker_api.consumer_ids(consumer.instance, address,
                                                        consumer.group)
            except RemotingError as e:
                errors.append(f"{address}: {e}")
                continue
            answered = True
            if not members:
                continue  # e.g. a master back from a restart: ask the group's next broker
            self._members_address = address
            return members
        if answered:
            return []
        raise NoRouteError(f"no broker answered for the members of group {consumer.group!r} "
                           f"({'; '.join(errors) or 'no broker known'})")

    def release(self, process_queue: ProcessQueue) -> None:
        """Give a queue up: stop it now, commit its offset (and unlock it) in the background."""
        consumer = self._consumer
        queue = process_queue.queue
        process_queue.dropped = True
        consumer.stop_queue(process_queue)
        task = asyncio.get_running_loop().create_task(self._release(process_queue),
                                                      name=f"tidemq-release-{queue}")
        self._releasing[queue] = task

        def forget(finished: asyncio.Task[None]) -> None:
            if self._releasing.get(queue) is finished:
                del self._releasing[queue]

        task.add_done_callback(forget)

    async def _release(self, process_queue: ProcessQueue) -> None:
        consumer = self._consumer
        queue = process_queue.queue
        consume_task = consumer.consume_task_of(process_queue)
        if consume_task is not None:
            # the batch under way decides the offset the next owner starts at
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(consume_task)
        try:
            await consumer.offset_store.persist(queue)
        except (RemotingError, TidemqError) as e:
            log.warning("consumer %s: committing the offset of released queue %s failed: %s",
                        consumer.group, queue, e)
        consumer.offset_store.remove(queue)
        if consumer.orderly and consumer.clustering:
            await self._unlock([queue])

    async def wait_released(self, queue: MessageQueue) -> None:
        """Wait until an earlier release of ``queue`` (if any) has finished."""
        task = self._releasing.get(queue)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(task)

    async def wait_all_released(self, timeout_s: float) -> None:
        """Wait (bounded) for every release under way (at shutdown)."""
        tasks = list(self._releasing.values())
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    # -- orderly locks ---------------------------------------------------------------------------

    async def ensure_locked(self, process_queue: ProcessQueue) -> bool:
        """True while this client holds the broker lock of the queue; tries to take it when
        the lock is not held (or expired locally)."""
        now = self._consumer.clock_ms()
        if process_queue.locked and not process_queue.lock_expired(now, LOCK_EXPIRY_MS):
            return True
        queue = process_queue.queue
        granted = await self._lock(queue.broker_name, [queue])
        if process_queue.dropped:
            return False
        if queue in granted:
            if not process_queue.locked:
                log.info("consumer %s locked %s", self._consumer.group, queue)
            process_queue.locked = True
            process_queue.last_lock_ms = self._consumer.clock_ms()
            return True
        process_queue.locked = False
        return False

    async def lock_all(self) -> None:
        """Renew the locks of every owned queue (LOCK_BATCH_MQ per broker)."""
        consumer = self._consumer
        by_broker: dict[str, list[ProcessQueue]] = {}
        for process_queue in consumer.process_queues.values():
            if not process_queue.dropped:
                by_broker.setdefault(process_queue.queue.broker_name, []).append(process_queue)
        for broker_name, owned in by_broker.items():
            granted = await self._lock(broker_name, [pq.queue for pq in owned])
            now = consumer.clock_ms()
            for process_queue in owned:
                if process_queue.queue in granted:
                    process_queue.locked = True
                    process_queue.last_lock_ms = now
                elif process_queue.locked:
                    log.warning("consumer %s lost the lock of %s; its consumption pauses until "
                                "it is locked again", consumer.group, process_queue.queue)
                    process_queue.locked = False

    async def unlock_all(self) -> None:
        """Release the locks of every owned queue (at shutdown, after committing offsets)."""
        await self._unlock([q for q, pq in self._consumer.process_queues.items()
                            if pq.locked])

    async def _lock(self, broker_name: str, queues: list[MessageQueue]) -> set[MessageQueue]:
        consumer = self._consumer
        try:
            address = await consumer.instance.find_master(broker_name, queues[0].topic)
            return await broker_api.lock_batch(consumer.instance, address, consumer.group,
                                               consumer.client_id, queues)
        except asyncio.CancelledError:
            raise
        except (RemotingError, TidemqError) as e:
            log.info("consumer %s: locking %d queue(s) of %s failed: %s", consumer.group,
                     len(queues), broker_name, e)
            return set()

    async def _unlock(self, queues: list[MessageQueue]) -> None:
        consumer = self._consumer
        by_broker: dict[str, list[MessageQueue]] = {}
        for queue in queues:
            by_broker.setdefault(queue.broker_name, []).append(queue)
        for broker_name, owned in by_broker.items():
            try:
                address = await consumer.instance.find_master(broker_name, owned[0].topic)
                await broker_api.unlock_batch(consumer.instance, address, consumer.group,
                                              consumer.client_id, owned)
            except asyncio.CancelledError:
                raise
            except (RemotingError, TidemqError) as e:
                log.info("consumer %s: unlocking %s failed (the broker frees them within 60 s): "
                         "%s", consumer.group, ", ".join(map(str, owned)), e)

    # -- the group check -------------------------------------------------------------------------

    async def _check_group_subscriptions(self) -> None:
        consumer = self._consumer
        address = self._members_address
        if address is None:
            return
        try:
            connection = await broker_api.consumer_connection(consumer.instance, address,
                                                              consumer.group)
        except (RemotingError, TidemqError) as e:
            log.debug("consumer %s: group check at %s failed: %s", consumer.group, address, e)
            return
        if connection is None:
            return
        table = connection.get("subscriptionTable") or {}
        registered = {str(topic): str((data or {}).get("subString", SUBSCRIBE_ALL))
                      for topic, data in table.items() if isinstance(data, Mapping)}
        members = [str(c.get("clientId")) for c in connection.get("connectionSet") or []
                   if isinstance(c, Mapping)]
        text = subscription_difference(consumer.group, consumer.client_id,
                                       consumer.subscription_expressions(), registered, members)
        if text is not None and text != self._warned:
            log.warning("%s", text)
        self._warned = text

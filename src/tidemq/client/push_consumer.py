"""PushConsumer: the broker's messages delivered to a listener, offsets handled for you.

```python
consumer = PushConsumer("cg", namesrv="127.0.0.1:9876", consume_from="FIRST")
consumer.subscribe("Orders", "paid || refunded")

@consumer.listener
async def on_messages(messages: list[MessageExt]) -> ConsumeResult:
    ...
    return ConsumeResult.SUCCESS

async with consumer:
    await stop_event.wait()
```

Theory of operation
-------------------
RocketMQ's DefaultMQPushConsumer, on one asyncio event loop:

- **Group membership.** The consumer heartbeats its subscriptions (CONSUME_PASSIVELY) to
  every master every 30 s. A clustering consumer also subscribes ``%RETRY%<group>`` (where
  the broker puts messages to retry). ``PushRebalance`` shares the queues among the group's
  members every 20 s and when a broker announces a membership change; a broadcasting
  consumer takes every queue.
- **Pulling.** Each owned queue has a ``ProcessQueue`` and a pull loop: PULL_MESSAGE with the
  subscription, long polling (the broker holds the pull up to 15 s when the queue is drained)
  and, for a clustering group, the queue's current offset to commit on the way. The loop
  pauses while the queue holds ``pull_threshold_for_queue`` messages or
  ``pull_threshold_size_for_queue_mib`` MiB, or (concurrent listeners) while the offsets in
  flight span more than ``consume_concurrently_max_span``.
- **Where a queue starts** (docs/protocol.md §15.5): the offset stored for the group (broker,
  or the local file for broadcasting); with none, ``consume_from``: LAST -> the queue's max
  offset (a retry topic: 0), FIRST -> its min offset, TIMESTAMP -> the offset stored
  closest to ``consume_timestamp_ms`` (a retry topic: its max offset).
- **Consuming** (``consume_service``): concurrently in batches of
  ``consume_message_batch_max_size``, or orderly per queue under the queue's broker lock.
  Messages pulled from ``%RETRY%<group>`` are shown with their original topic (RETRY_TOPIC).
  A tag filter is applied by the broker (tag hash) and again here (tag string); a SQL92
  filter (``subscribe(topic, "a > 5", expression_type="SQL92")``) by the broker alone, which
  ``start`` first asks (CHECK_CLIENT_CONFIG) whether it can.
- **Failures**: a concurrent consumer sends failed messages back to the broker for a delayed
  retry (``send_back``), to the dead letters after ``max_reconsume_times``; an orderly
  consumer retries the same messages locally after ``suspend_current_queue_time_ms``, and
  sends a message to the dead letters once it failed ``max_reconsume_times`` retries.
- **Offsets.** The offset committed for a queue is the smallest one still in flight, so a
  crash never skips an unconsumed message (some may come twice). Offsets are sent every
  ``persist_consumer_offset_interval_ms`` (5 s), when a rebalance takes a queue away, and at
  shutdown.
- **Shutdown** stops pulling, waits up to ``shutdown_timeout_ms`` for messages in flight,
  commits offsets, unlocks orderly queues and leaves the group (UNREGISTER_CLIENT), so the
  others rebalance at once.

Nothing here is thread-safe: use it from its event loop (``tidemq.sync.PushConsumer`` is the
thread-friendly twin).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from tidemq.client import broker_api
from tidemq.client.consume_service import (
    ConcurrentConsumeService,
    ConsumeSettings,
    OrderlyConsumeService,
    PushStats,
)
from tidemq.client.consumer_admin import register_consumer_admin
from tidemq.client.errors import ClientStateError, InvalidSubscription
from tidemq.client.instance import (
    HEARTBEAT_BROKER_INTERVAL_MS,
    POLL_NAME_SERVER_INTERVAL_MS,
    REQUEST_TIMEOUT_MS,
    ClientInstance,
)
from tidemq.client.lifecycle import ClientLifecycle, cancel_tasks, leave_quietly
from tidemq.client.listener import Listener, ListenerInvoker, MessageModel
from tidemq.client.message import MessageQueue, PullResult, PullStatus
from tidemq.client.offset_store import (
    LocalFileOffsetStore,
    OffsetStore,
    RemoteOffsetStore,
    local_offset_file,
)
from tidemq.client.parked_pull import ParkedPull, parking_connection, send_parked_pull
from tidemq.client.process_queue import ProcessQueue
from tidemq.client.producer import Producer, default_namesrv, new_trace_dispatcher
from tidemq.client.pull_consumer import (
    CONSUME_TIMESTAMP_AGO_MS,
    ConsumeFrom,
    back_off_after_pull_error,
    check_subscriptions_at_brokers,
)
from tidemq.client.push_rebalance import PushRebalance
from tidemq.client.read_routing import MASTER_ID, ReadRouting
from tidemq.client.rebalance import AllocationStrategy, allocation_strategy
from tidemq.client.rebalance_trigger import RebalanceTrigger
from tidemq.client.security import Credentials, TlsOption
from tidemq.client.send_back import CLIENT_INNER_PRODUCER_GROUP, SendBack, retry_topic
from tidemq.client.subscription import (
    EXPRESSION_TYPE_TAG,
    Subscription,
    parse_subscription,
    parse_tag_expression,
)
from tidemq.client.tracer import Tracer, TracingInvoker
from tidemq.errors import InvalidTopicName, TidemqError
from tidemq.limits import group_name_problem, topic_name_problem
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import PROPERTY_RETRY_TOPIC, MessageExt
from tidemq.remoting.errors import RemotingError

log = logging.getLogger("tidemq.client")

# RocketMQ DefaultMQPushConsumer defaults (docs/protocol.md §11.5, §11.6).
PULL_BATCH_SIZE = 32
PULL_THRESHOLD_FOR_QUEUE = 1000
PULL_THRESHOLD_SIZE_FOR_QUEUE_MIB = 100
CONSUME_CONCURRENTLY_MAX_SPAN = 2000
CONSUME_MESSAGE_BATCH_MAX_SIZE = 1
CONSUME_CONCURRENCY = 20  # consumeThreadMax
MAX_RECONSUME_TIMES = 16
SUSPEND_CURRENT_QUEUE_TIME_MS = 1000
PERSIST_CONSUMER_OFFSET_INTERVAL_MS = 5000
REBALANCE_INTERVAL_MS = 20_000
LOCK_RENEW_INTERVAL_MS = 20_000  # orderly: relock every 20 s (broker lease 60 s)
LONG_POLLING_SUSPEND_MS = 15_000  # the push consumer asks the broker to hold a pull 15 s
# Java's socket timeout for a held pull is 30 s: the hold plus this.
PULL_RESPONSE_GRACE_MS = 15_000
# RocketMQ's awaitTerminationMillisWhenShutdown is 0 (messages in flight are simply consumed
# again by the next owner); a few seconds lets the usual short listener finish its work.
SHUTDOWN_TIMEOUT_MS = 10_000
# A queue taken over from another member starts this much later, so that the previous
# owner, told of the rebalance at the same moment, commits its last offset first. Its
# release is a few milliseconds of work; a second leaves room for a busy process.
TAKEOVER_DELAY_MS = 1000
# How long a queue over a flow-control threshold waits before looking again (RocketMQ: 50 ms).
FLOW_CONTROL_DELAY_S = 0.05
# An orderly queue whose lock another member still holds is tried again this often.
ORDERLY_LOCK_RETRY_S = 1.0
# Flow control is logged once per this many pauses of a queue, not every 50 ms.
FLOW_CONTROL_LOG_EVERY = 1000


class PushConsumer(ClientLifecycle):
    """Delivers a group's messages to a listener. Use as ``async with`` after registering
    a listener and subscribing.

    Args:
        group: the consumer group.
        namesrv: name server addresses; default $NAMESRV_ADDR or 127.0.0.1:9876.
        message_model: CLUSTERING (default: each message to one member) or BROADCASTING
            (every member gets every message; offsets kept in a local file).
        consume_from: where a queue without a stored offset starts: LAST (default), FIRST,
            TIMESTAMP (see the module docstring).
        consume_timestamp_ms: the time for TIMESTAMP; default half an hour ago.
        allocation: how the group shares queues: "AVG" (default), "AVG_BY_CIRCLE",
            "CONSISTENT_HASH", or a callable ``(queues, members, member) -> queues``.
        consume_message_batch_max_size: messages per listener call, at most.
        pull_batch_size: messages asked for per pull (the broker sends up to 1024).
        check_crcs: check each received body against its stored CRC (Kafka's
            ``check.crcs``); a damaged message is left out and logged as an ERROR naming it.
        pull_threshold_for_queue: pulling of a queue pauses while it holds this many
            messages not yet consumed.
        pull_threshold_size_for_queue_mib: ... or this many MiB of bodies.
        consume_concurrently_max_span: ... or (concurrent listeners) while the offsets in
            flight span more than this.
        consume_concurrency: listener calls at once for a coroutine listener, or threads for
            a plain one with ``listener_threads``.
        listener_threads: run a plain-function listener in a thread pool instead of on the
            event loop (then it may block).
        max_reconsume_times: retries of a failed message before it goes to ``%DLQ%<group>``.
        suspend_current_queue_time_ms: orderly: pause of a queue after a failed batch.
        persist_consumer_offset_interval_ms: how often offsets are committed.
        rebalance_interval_ms: how often queues are re-shared (also on membership changes).
        long_polling_suspend_ms: how long a broker may hold a pull on a drained queue.
        shutdown_timeout_ms: how long ``close`` waits for messages in flight.
        takeover_delay_ms: a queue taken over from another member (clustering, concurrent)
            starts this much later, after that member committed where it stopped; 0 starts
            at once, as RocketMQ does, and may deliver a few messages twice.
        offset_store_dir: broadcasting: where the offsets file goes (default
            $TIDEMQ_OFFSET_STORE_DIR or ~/.tidemq_offsets); the file is per group and
            ``instance_name`` (``DEFAULT`` when none is given), so give each broadcasting
            consumer of a host its own instance name to keep their offsets apart.
        instance_name: part of the client id (default ``<pid>#<nanoTime>``).
        request_timeout_ms, poll_name_server_interval_ms, heartbeat_broker_interval_ms: as
            for ``Producer``.
        enable_msg_trace: write SubBefore and SubAfter trace records around every listener
            call (who consumed which message, when, how long, with what outcome), in the
            background (RocketMQ's enableMsgTrace; docs/monitoring.md).
        trace_topic: the trace topic; default RMQ_SYS_TRACE_TOPIC.
        credentials, tls: as for ``Producer`` (the consumer's inner producer uses them too).

    Raises:
        ValueError: a bad group name, name server address or option.
    """

    def __init__(
        self,
        group: str,
        namesrv: str | Iterable[str] | None = None,
        *,
        message_model: MessageModel | str = MessageModel.CLUSTERING,
        consume_from: ConsumeFrom | str = ConsumeFrom.LAST,
        consume_timestamp_ms: int | None = None,
        allocation: str | AllocationStrategy = "AVG",
        consume_message_batch_max_size: int = CONSUME_MESSAGE_BATCH_MAX_SIZE,
        pull_batch_size: int = PULL_BATCH_SIZE,
        pull_threshold_for_queue: int = PULL_THRESHOLD_FOR_QUEUE,
        pull_threshold_size_for_queue_mib: int = PULL_THRESHOLD_SIZE_FOR_QUEUE_MIB,
        consume_concurrently_max_span: int = CONSUME_CONCURRENTLY_MAX_SPAN,
        consume_concurrency: int = CONSUME_CONCURRENCY,
        listener_threads: bool = False,
        max_reconsume_times: int = MAX_RECONSUME_TIMES,
        suspend_current_queue_time_ms: int = SUSPEND_CURRENT_QUEUE_TIME_MS,
        persist_consumer_offset_interval_ms: int = PERSIST_CONSUMER_OFFSET_INTERVAL_MS,
        rebalance_interval_ms: int = REBALANCE_INTERVAL_MS,
        long_polling_suspend_ms: int = LONG_POLLING_SUSPEND_MS,
        shutdown_timeout_ms: int = SHUTDOWN_TIMEOUT_MS,
        takeover_delay_ms: int = TAKEOVER_DELAY_MS,
        offset_store_dir: str | None = None,
        instance_name: str | None = None,
        request_timeout_ms: int = REQUEST_TIMEOUT_MS,
        poll_name_server_interval_ms: int = POLL_NAME_SERVER_INTERVAL_MS,
        heartbeat_broker_interval_ms: int = HEARTBEAT_BROKER_INTERVAL_MS,
        enable_msg_trace: bool = False,
        trace_topic: str | None = None,
        credentials: Credentials | None = None,
        tls: TlsOption = None,
        check_crcs: bool = True,
    ):
        problem = group_name_problem(group)
        if problem is not None:
            raise ValueError(f"consumer {problem}")
        for name, value, least in (
            ("consume_message_batch_max_size", consume_message_batch_max_size, 1),
            ("pull_batch_size", pull_batch_size, 1),
            ("pull_threshold_for_queue", pull_threshold_for_queue, 1),
            ("pull_threshold_size_for_queue_mib", pull_threshold_size_for_queue_mib, 1),
            ("consume_concurrently_max_span", consume_concurrently_max_span, 1),
            ("consume_concurrency", consume_concurrency, 1),
            ("max_reconsume_times", max_reconsume_times, 0),
            ("persist_consumer_offset_interval_ms", persist_consumer_offset_interval_ms, 1),
            ("rebalance_interval_ms", rebalance_interval_ms, 1),
            ("long_polling_suspend_ms", long_polling_suspend_ms, 0),
            ("shutdown_timeout_ms", shutdown_timeout_ms, 0),
            ("takeover_delay_ms", takeover_delay_ms, 0),
        ):
            if value < least:
                raise ValueError(f"{name}={value}: it must be at least {least}")
        self.group = group
        self.message_model = MessageModel.parse(message_model)
        self.consume_from = ConsumeFrom.parse(consume_from)
        self.consume_timestamp_ms = (
            consume_timestamp_ms if consume_timestamp_ms is not None
            else int(time.time() * 1000) - CONSUME_TIMESTAMP_AGO_MS
        )
        self.allocation = allocation_strategy(allocation)
        self.consume_message_batch_max_size = consume_message_batch_max_size
        self.pull_batch_size = pull_batch_size
        self.check_crcs = check_crcs
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_size_for_queue_bytes = pull_threshold_size_for_queue_mib * 1024 * 1024
        self.consume_concurrently_max_span = consume_concurrently_max_span
        self.consume_concurrency = consume_concurrency
        self.listener_threads = listener_threads
        self.max_reconsume_times = max_reconsume_times
        self.suspend_current_queue_time_ms = suspend_current_queue_time_ms
        self.persist_consumer_offset_interval_ms = persist_consumer_offset_interval_ms
        self.long_polling_suspend_ms = long_polling_suspend_ms
        self.shutdown_timeout_ms = shutdown_timeout_ms
        self.takeover_delay_ms = takeover_delay_ms
        self._namesrv = namesrv if namesrv is not None else default_namesrv()
        self._offset_file = local_offset_file(group, instance_name or "DEFAULT",
                                              offset_store_dir)
        self.instance = ClientInstance(
            self._namesrv,
            instance_name=instance_name,
            request_timeout_ms=request_timeout_ms,
            poll_name_server_interval_ms=poll_name_server_interval_ms,
            heartbeat_broker_interval_ms=heartbeat_broker_interval_ms,
            credentials=credentials,
            tls=tls,
        )
        self.instance.heartbeat_sources.append(self._heartbeat_data)
        self.instance.remoting.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                        self._on_consumer_ids_changed)
        register_consumer_admin(self)
        self._subscriptions: dict[str, Subscription] = {}
        self._retry_subscription = parse_tag_expression(retry_topic(group), "*")
        self._listener: Listener | None = None
        self.orderly = False
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self._pull_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._stats = PushStats()
        # Pulls go to the master, or to a slave when it is gone or suggests one.
        self._read_routing = ReadRouting(self.instance)
        self.offset_store: OffsetStore = (
            RemoteOffsetStore(self.instance, group) if self.clustering
            else LocalFileOffsetStore(self._offset_file)
        )
        self._send_back = SendBack(self.instance, group, max_reconsume_times,
                                   self._inner_producer)
        self._rebalance = PushRebalance(self)
        self._consume_service: ConcurrentConsumeService | OrderlyConsumeService | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalancer = RebalanceTrigger(group, rebalance_interval_ms,
                                            self._rebalance.rebalance)
        self._client_name = f"consumer {group!r}"
        self.start_timestamp_ms = 0  # wall-clock ms of start(), for running-info reports
        self.tracer: Tracer | None = (
            Tracer(new_trace_dispatcher(self.instance.namesrv_addresses, trace_topic,
                                        credentials=credentials,
                                        tls=self.instance.tls_context),
                   group, self.instance.client_id)
            if enable_msg_trace else None
        )

    # -- what to consume, and how ------------------------------------------------------------

    @property
    def rebalance_interval_ms(self) -> int:
        """How often the group's queues are re-shared (besides on changes)."""
        return self._rebalancer.interval_ms

    @property
    def client_id(self) -> str:
        """This consumer's client id, ``<ip>@<instance name>``."""
        return self.instance.client_id

    @property
    def clustering(self) -> bool:
        """True for CLUSTERING (the group shares queues), False for BROADCASTING."""
        return self.message_model is MessageModel.CLUSTERING

    def subscribe(self, topic: str, expression: str | None = "*", *,
                  expression_type: str = EXPRESSION_TYPE_TAG) -> None:
        """Consume ``topic``'s messages whose tag matches ``expression`` (``"*"``, or tags
        joined by ``||``), or with ``expression_type="SQL92"`` whose properties satisfy it
        (``"region = 'eu' AND amount > 100"``; the brokers need
        ``enablePropertyFilter=true``, which ``start`` checks). May be called again to change
        the expression, also after start.

        Raises:
            InvalidTopicName: a bad topic name.
            InvalidSubscription: a bad expression or expression type (for SQL92 the message
                names the position and what was expected).
        """
        problem = topic_name_problem(topic)
        if problem is not None:
            raise InvalidTopicName(problem)
        self._subscriptions[topic] = parse_subscription(topic, expression, expression_type)
        self._subscriptions_changed()

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic`` (its queues are released at the next rebalance)."""
        if self._subscriptions.pop(topic, None) is not None:
            self._subscriptions_changed()

    def subscription(self) -> dict[str, str]:
        """Topic -> tag expression of what this consumer subscribed."""
        return {topic: sub.expression for topic, sub in self._subscriptions.items()}

    def listener(self, function: Listener) -> Listener:
        """Register ``function`` as the (concurrent) listener; usable as a decorator.

        ``function(messages)`` gets a list of at most ``consume_message_batch_max_size``
        messages and returns ``ConsumeResult.SUCCESS`` (or None) or RECONSUME_LATER; an
        exception counts as RECONSUME_LATER. It may be ``async def``.

        Raises:
            ClientStateError: the consumer is already started.
        """
        self._set_listener(function, orderly=False)
        return function

    def orderly_listener(self, function: Listener) -> Listener:
        """Register ``function`` as an orderly listener: each queue's messages in queue order,
        one batch at a time; a failed batch is retried (after a pause) before anything that
        follows it. Usable as a decorator.

        Raises:
            ClientStateError: the consumer is already started.
        """
        self._set_listener(function, orderly=True)
        return function

    def _set_listener(self, function: Listener, *, orderly: bool) -> None:
        if not callable(function):
            raise TypeError(f"listener {function!r} is not callable")
        if self._state != "new":
            raise ClientStateError(
                f"consumer {self.group!r} is {self._state}; register the listener before start()"
            )
        self._listener = function
        self.orderly = orderly

    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer owns now, sorted (``%RETRY%<group>`` queues included)."""
        return sorted(q for q, pq in self.process_queues.items() if not pq.dropped)

    def stats(self) -> PushStats:
        """A snapshot of this consumer's counters."""
        snapshot = replace(self._stats)
        snapshot.sent_back = self._send_back.sent_back
        snapshot.resent = self._send_back.resent
        return snapshot

    # -- life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the group and start consuming. The first rebalance runs before this returns.

        Raises:
            ClientStateError: no listener registered, or the consumer was closed.
            InvalidSubscription: nothing subscribed, or a broker cannot serve a SQL92
                subscription (not enabled there, or it does not compile); the consumer is
                closed then: create a new one once the broker is fixed.
            RemoteProtocolError: broadcasting, and the offsets file is unreadable.
        """
        if not self._begin_start():
            return
        if self._listener is None:
            raise ClientStateError(
                f"consumer {self.group!r} has no listener; register one with "
                "@consumer.listener (or @consumer.orderly_listener) before start()"
            )
        if not self._subscriptions:
            raise InvalidSubscription(
                f"consumer {self.group!r} subscribes nothing; call subscribe(topic, expression) "
                "before start()"
            )
        await self.offset_store.load()
        self.start_timestamp_ms = int(time.time() * 1000)
        self._consume_service = self._build_consume_service(self._listener)
        self._rebalancer.arm()
        await self.instance.start()
        for topic in self.topics():
            self.instance.topics_of_interest.add(topic)
            try:
                await self.instance.route(topic)
            except (RemotingError, TidemqError) as e:
                log.warning("consumer %s: no route for topic %r yet: %s", self.group, topic, e)
        try:
            await check_subscriptions_at_brokers(self.instance, self.group,
                                                 list(self._subscriptions.values()))
        except BaseException:
            self._closed()
            if self._executor is not None:
                self._executor.shutdown(wait=False)
            await self.instance.close()
            raise
        self._state = "running"
        self._consume_service.start()
        await self.instance.send_heartbeat()
        await self._rebalancer.run_once()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._rebalancer.loop(), name="tidemq-rebalance"))
        self._tasks.append(loop.create_task(self._persist_loop(), name="tidemq-offsets"))
        if self.orderly and self.clustering:
            self._tasks.append(loop.create_task(self._lock_loop(), name="tidemq-locks"))

    def _build_consume_service(self, listener: Listener
                               ) -> ConcurrentConsumeService | OrderlyConsumeService:
        invoker: ListenerInvoker | TracingInvoker = ListenerInvoker(listener, None, self.group)
        if self.listener_threads and not invoker.coroutine:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.consume_concurrency, thread_name_prefix=f"tidemq-{self.group}")
            invoker = ListenerInvoker(listener, self._executor, self.group)
        if self.tracer is not None:
            self.tracer.dispatcher.start()
            invoker = TracingInvoker(invoker, self.tracer)
        settings = ConsumeSettings(
            group=self.group,
            batch_size=self.consume_message_batch_max_size,
            clustering=self.clustering,
            max_reconsume_times=self.max_reconsume_times,
            suspend_ms=self.suspend_current_queue_time_ms,
            concurrency=self.consume_concurrency,
            stats=self._stats,
        )
        if self.orderly:
            return OrderlyConsumeService(
                settings, invoker, self.offset_store, self._send_back,
                self._rebalance.ensure_locked if self.clustering else None,
            )
        return ConcurrentConsumeService(settings, invoker, self.offset_store, self._send_back)

    async def close(self) -> None:
        """Stop pulling, wait (up to ``shutdown_timeout_ms``) for messages in flight, commit
        offsets, unlock orderly queues and leave the group. Idempotent; failures are logged.
        """
        was_running = self._begin_close()
        if was_running is None:
            return
        try:
            if was_running:
                await self._shut_down()
        finally:
            self._closed()
            if self.tracer is not None:
                await self.tracer.dispatcher.close()
            await self._send_back.close()
            await self.instance.close()
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)

    shutdown = close

    async def _shut_down(self) -> None:
        tasks, self._tasks = self._tasks, []
        await cancel_tasks(tasks)
        pulls = list(self._pull_tasks.values())
        await cancel_tasks(pulls)
        self._pull_tasks.clear()
        service = self._consume_service
        assert service is not None
        timeout_s = self.shutdown_timeout_ms / 1000
        if not await service.drain(timeout_s):
            in_flight = sum(pq.message_count for pq in self.process_queues.values())
            log.warning("consumer %s: %d message(s) still in flight after shutdown_timeout_ms="
                        "%d; they are not committed and will be consumed again", self.group,
                        in_flight, self.shutdown_timeout_ms)
        await service.stop()
        await self._rebalance.wait_all_released(timeout_s)
        owned = [q for q, pq in self.process_queues.items() if not pq.dropped]
        await self.offset_store.persist_all(owned)
        if self.orderly and self.clustering:
            await self._rebalance.unlock_all()
        for process_queue in self.process_queues.values():
            process_queue.dropped = True
        await leave_quietly(self.instance, consumer_group=self.group)

    async def __aenter__(self) -> PushConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- rebalancing (PushRebalance calls back in here) ----------------------------------------

    def topics(self) -> list[str]:
        """Every topic consumed: the subscribed ones and, clustering, ``%RETRY%<group>``."""
        topics = list(self._subscriptions)
        if self.clustering:
            topics.append(self._retry_subscription.topic)
        return topics

    def is_retry_topic(self, topic: str) -> bool:
        """True for this group's ``%RETRY%<group>``."""
        return topic == self._retry_subscription.topic

    def subscription_expressions(self) -> dict[str, str]:
        """Topic -> expression of everything consumed (the retry topic included)."""
        expressions = self.subscription()
        if self.clustering:
            expressions[self._retry_subscription.topic] = self._retry_subscription.expression
        return expressions

    def clock_ms(self) -> int:
        """A monotonic millisecond clock (lock ages)."""
        return time.monotonic_ns() // 1_000_000

    def add_queue(self, queue: MessageQueue, *, taken_over: bool = False) -> None:
        """Start consuming ``queue``: a new ProcessQueue and its pull loop.

        Args:
            queue: the queue.
            taken_over: another member may have owned it until now: wait
                ``takeover_delay_ms`` before reading its committed offset (not for orderly
                consumption, whose broker lock already orders the handoff).
        """
        process_queue = ProcessQueue(queue)
        self.process_queues[queue] = process_queue
        delay_s = self.takeover_delay_ms / 1000 if taken_over and not self.orderly else 0.0
        if self._state == "running":
            self._pull_tasks[queue] = asyncio.get_running_loop().create_task(
                self._pull_loop(process_queue, delay_s), name=f"tidemq-pull-{queue}")

    def stop_queue(self, process_queue: ProcessQueue) -> None:
        """Stop pulling a dropped queue and forget its ProcessQueue."""
        queue = process_queue.queue
        if self.process_queues.get(queue) is process_queue:
            del self.process_queues[queue]
        task = self._pull_tasks.pop(queue, None)
        if task is not None:
            task.cancel()

    def consume_task_of(self, process_queue: ProcessQueue) -> asyncio.Task[None] | None:
        """The orderly consume task working on ``process_queue``, if any."""
        service = self._consume_service
        if isinstance(service, OrderlyConsumeService):
            return service.task_of(process_queue)
        return None

    async def rebalance(self) -> None:
        """Re-share the group's queues now (it also happens every 20 s and on changes).

        Raises:
            ClientStateError: the consumer is not running.
        """
        self._check_running()
        await self._rebalance.rebalance()

    def consumer_offsets(self, topic: str) -> dict[MessageQueue, int]:
        """This consumer's current offset of each queue of ``topic`` it owns."""
        offsets = {}
        for queue in self.assignment():
            offset = self.offset_store.read(queue) if queue.topic == topic else None
            if offset is not None:
                offsets[queue] = offset
        return offsets

    async def reset_offsets(self, offsets: Mapping[MessageQueue, int]) -> None:
        """Move to ``offsets``: each owned queue among them stops (messages in flight are
        dropped, their offsets not committed), gets the new offset committed, and is taken
        up again from there by a rebalance requested at once. Queues this consumer does not
        own are left to their owners. A broker's RESET_CONSUMER_CLIENT_OFFSET lands here.

        Raises:
            ClientStateError: the consumer is not running.
        """
        self._check_running()
        owned = [(self.process_queues[queue], offset) for queue, offset in offsets.items()
                 if queue in self.process_queues and not self.process_queues[queue].dropped]
        for process_queue, _ in owned:
            self._rebalance.release(process_queue)
        for process_queue, offset in owned:
            queue = process_queue.queue
            # The release commits where the queue stood; the new offset goes after it.
            await self._rebalance.wait_released(queue)
            self.offset_store.update(queue, offset, increase_only=False)
            try:
                await self.offset_store.persist(queue)
            except (RemotingError, TidemqError) as e:
                log.warning("consumer %s: committing the reset offset %d of %s failed: %s",
                            self.group, offset, queue, e)
            self.offset_store.remove(queue)
        self._rebalancer.request()

    def _subscriptions_changed(self) -> None:
        if self._state == "running":
            for topic in self.topics():
                self.instance.topics_of_interest.add(topic)
            self.instance.spawn(self.instance.send_heartbeat())
            self._rebalancer.request()

    async def _on_consumer_ids_changed(
        self, request: RemotingCommand, connection: object
    ) -> RemotingCommand | None:
        log.info("consumer %s: a broker says the group's members changed; rebalancing",
                 self.group)
        self._rebalancer.request()
        return None

    async def _lock_loop(self) -> None:
        while True:
            await asyncio.sleep(LOCK_RENEW_INTERVAL_MS / 1000)
            try:
                await self._rebalance.lock_all()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("consumer %s: renewing queue locks failed", self.group)

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self.persist_consumer_offset_interval_ms / 1000)
            try:
                await self.offset_store.persist_all(
                    [q for q, pq in self.process_queues.items() if not pq.dropped])
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("consumer %s: committing offsets failed", self.group)

    def subscription_data(self) -> list[dict[str, Any]]:
        """The SubscriptionData JSON objects of everything consumed (retry topic included)."""
        subscriptions = [s.to_json() for s in self._subscriptions.values()]
        if self.clustering:
            subscriptions.append(self._retry_subscription.to_json())
        return subscriptions

    def _heartbeat_data(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        consumer = {
            "consumeFromWhere": self.consume_from.value,
            "consumeType": "CONSUME_PASSIVELY",
            "groupName": self.group,
            "messageModel": self.message_model.value,
            "subscriptionDataSet": self.subscription_data(),
            "unitMode": False,
        }
        return [], [consumer]

    def _inner_producer(self) -> Producer:
        return Producer(CLIENT_INNER_PRODUCER_GROUP, self._namesrv,
                        request_timeout_ms=self.instance.request_timeout_ms,
                        credentials=self.instance.credentials, tls=self.instance.tls_context)

    # -- pulling -------------------------------------------------------------------------------

    async def _pull_loop(self, process_queue: ProcessQueue, delay_s: float = 0.0, *,
                         resume_at: int | None = None,
                         error: Exception | None = None) -> None:
        """Pull ``process_queue``'s queue until it is dropped. A loop that finds the queue
        drained parks its pull (``tidemq.client.parked_pull``) and ends; ``resume_at`` is the
        offset a parked pull's handover goes on from, after backing off from ``error``."""
        queue = process_queue.queue
        service = self._consume_service
        assert service is not None
        orderly_locks = self.orderly and self.clustering
        span_max = None if self.orderly else self.consume_concurrently_max_span
        offset: int | None = resume_at
        paused = 0
        if resume_at is None:
            # An earlier owner-ship of this queue may still be committing (and unlocking)
            # it, here or (delay_s) at the member that owned it until now.
            await self._rebalance.wait_released(queue)
            if delay_s:
                await asyncio.sleep(delay_s)
        elif error is not None:
            await back_off_after_pull_error(log, self.group, queue, error)
        while not process_queue.dropped:
            try:
                if orderly_locks and not await self._rebalance.ensure_locked(process_queue):
                    await asyncio.sleep(ORDERLY_LOCK_RETRY_S)
                    continue
                if offset is None:
                    # For an orderly queue only now, under the lock: the previous owner has
                    # committed where it stopped.
                    offset = await self._starting_offset(queue)
                    if process_queue.dropped:
                        return
                    self.offset_store.update(queue, offset, increase_only=False)
                    log.info("consumer %s starts %s at offset %d", self.group, queue, offset)
                if process_queue.over_threshold(self.pull_threshold_for_queue,
                                                self.pull_threshold_size_for_queue_bytes,
                                                span_max):
                    if paused % FLOW_CONTROL_LOG_EVERY == 0:
                        log.info("consumer %s: flow control on %s (%d messages, %d bytes in "
                                 "flight, span %d); pulling pauses", self.group, queue,
                                 process_queue.message_count, process_queue.message_bytes,
                                 process_queue.offset_span)
                    paused += 1
                    await asyncio.sleep(FLOW_CONTROL_DELAY_S)
                    continue
                if not orderly_locks and self._park(process_queue, offset):
                    return  # the read callback carries on (parked_answered)
                result = await self._pull(queue, offset)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the queue keeps being pulled whatever went wrong
                await back_off_after_pull_error(log, self.group, queue, e)
                continue
            if process_queue.dropped:
                return
            offset = self._accept(process_queue, result, service)

    async def _pull(self, queue: MessageQueue, offset: int) -> PullResult:
        instance = self.instance
        subscription = (self._retry_subscription if self.is_retry_topic(queue.topic)
                        else self._subscriptions.get(queue.topic))
        if subscription is None:  # unsubscribed; the next rebalance releases the queue
            subscription = parse_tag_expression(queue.topic, "*")

        async def pull_from(broker_id: int, address: str) -> PullResult:
            # A slave stores no offset from a pull (RocketMQ's client clears the flag too).
            commit = (self.offset_store.read(queue)
                      if self.clustering and broker_id == MASTER_ID else None)
            return await broker_api.pull_message(
                instance, address, self.group, queue, offset, self.pull_batch_size,
                subscription, suspend_timeout_ms=self.long_polling_suspend_ms,
                timeout_ms=self.long_polling_suspend_ms + PULL_RESPONSE_GRACE_MS,
                commit_offset=commit, lite=False, check_crc=self.check_crcs,
            )

        result = await self._read_routing.call(queue, pull_from)
        self._read_routing.suggest(queue, result.suggest_which_broker_id)
        return result

    # -- parked pulls: a drained queue's answers taken in the read callback --------------------

    def _park(self, process_queue: ProcessQueue, offset: int) -> bool:
        """Send the pull of ``process_queue`` at ``offset`` as a parked pull; False, with
        nothing sent, when it is not the simple case (the pull loop's path then)."""
        queue = process_queue.queue
        subscription = (self._retry_subscription if self.is_retry_topic(queue.topic)
                        else self._subscriptions.get(queue.topic))
        if subscription is None:
            return False
        target = parking_connection(self.instance, queue)
        if target is None:
            return False
        broker_id, address, connection = target
        # A slave stores no offset from a pull (RocketMQ's client clears the flag too).
        commit = (self.offset_store.read(queue)
                  if self.clustering and broker_id == MASTER_ID else None)
        made = process_queue.pull_template
        if made is None or made[0] is not subscription:
            made = process_queue.pull_template = (subscription, broker_api.pull_request_template(
                self.group, queue, self.pull_batch_size, subscription,
                suspend_timeout_ms=self.long_polling_suspend_ms, lite=False))
        template = made[1]
        pull = (template.render(offset, commit) if template is not None
                else broker_api.pull_request_fields(
                    self.group, queue, offset, self.pull_batch_size, subscription,
                    suspend_timeout_ms=self.long_polling_suspend_ms, commit_offset=commit,
                    lite=False))
        parked = ParkedPull(self, process_queue, 0, offset, address, subscription)
        return send_parked_pull(connection, pull,
                                self.long_polling_suspend_ms + PULL_RESPONSE_GRACE_MS, parked)

    def parked_answered(self, parked: ParkedPull, response: RemotingCommand) -> None:
        """Take a parked pull's answer (in the read callback: nothing may raise out of here;
        a listener called on the loop runs here), then park the next pull, or hand the queue
        back to a pull loop."""
        process_queue: ProcessQueue = parked.owner
        if not self._still_pulling(process_queue):
            return  # released or closing since: the answer is not wanted
        queue = process_queue.queue
        service = self._consume_service
        assert service is not None
        next_offset: int | None = parked.offset
        try:
            result = broker_api.decode_pull_response(
                response, queue, parked.subscription, parked.address,
                check_crc=self.check_crcs)
            self._read_routing.suggest(queue, result.suggest_which_broker_id)
            next_offset = self._accept(process_queue, result, service)
            if process_queue.dropped:
                return
            if (next_offset is not None
                    and not process_queue.over_threshold(
                        self.pull_threshold_for_queue, self.pull_threshold_size_for_queue_bytes,
                        None if self.orderly else self.consume_concurrently_max_span)
                    and self._park(process_queue, next_offset)):
                return
            self._resume_pull_loop(process_queue, next_offset)
        except Exception as e:  # the pull loop backs off and goes on, as for a pull's error
            if self._still_pulling(process_queue):
                self._resume_pull_loop(process_queue, next_offset, e)

    def parked_failed(self, parked: ParkedPull, error: BaseException) -> None:
        """A parked pull timed out or lost its connection: a pull loop backs off and goes on
        from its offset."""
        process_queue: ProcessQueue = parked.owner
        if self._still_pulling(process_queue) and isinstance(error, Exception):
            self._resume_pull_loop(process_queue, parked.offset, error)

    def _still_pulling(self, process_queue: ProcessQueue) -> bool:
        return (not process_queue.dropped and self._state == "running"
                and self.process_queues.get(process_queue.queue) is process_queue)

    def _resume_pull_loop(self, process_queue: ProcessQueue, offset: int | None,
                          error: Exception | None = None) -> None:
        queue = process_queue.queue
        loop = self.instance.loop or asyncio.get_running_loop()  # no getpid (3.11)
        self._pull_tasks[queue] = loop.create_task(
            self._pull_loop(process_queue, resume_at=offset, error=error),
            name=f"tidemq-pull-{queue}")

    def _accept(self, process_queue: ProcessQueue, result: PullResult,
                service: ConcurrentConsumeService | OrderlyConsumeService) -> int | None:
        """Take one pull's answer in; returns the next offset to pull (None: restart)."""
        stats = self._stats
        stats.pulls += 1
        status = result.status
        next_offset = result.next_begin_offset
        queue = process_queue.queue
        if status is PullStatus.FOUND:
            stats.messages_filtered += result.messages_filtered
            messages = result.messages
            if messages:
                if self.is_retry_topic(queue.topic):
                    _show_original_topics(messages)
                fresh = process_queue.put(messages)
                if fresh:
                    stats.messages_pulled += len(fresh)
                    service.submit(process_queue, fresh)
        elif status is PullStatus.OFFSET_ILLEGAL:
            log.warning("consumer %s: offset of %s is outside [%d, %d]; it continues at %d",
                        self.group, queue, result.min_offset, result.max_offset, next_offset)
            if next_offset <= process_queue.max_offset_pulled:
                # The queue went back (its broker lost data): start it over from scratch.
                self.offset_store.update(queue, next_offset, increase_only=False)
                self._rebalance.release(process_queue)
                self._rebalancer.request()
                return None
        if process_queue.message_count == 0:
            # Nothing in flight: everything up to next_offset was consumed or filtered out.
            self.offset_store.update(queue, next_offset)
        return next_offset

    async def _starting_offset(self, queue: MessageQueue) -> int:
        """Where a newly owned queue starts (docs/protocol.md §15.5).

        Raises:
            RemotingError, NoRouteError: the broker could not be asked (the pull loop tries
                again shortly).
        """
        stored = await self.offset_store.read_stored(queue)
        if stored is not None and stored >= 0:
            return stored
        retry = self.is_retry_topic(queue.topic)
        if self.consume_from is ConsumeFrom.LAST and retry:
            return 0
        instance = self.instance

        async def ask(_: int, address: str) -> int:
            if self.consume_from is ConsumeFrom.FIRST:
                return await broker_api.min_offset(instance, address, queue)
            if self.consume_from is ConsumeFrom.LAST or retry:
                return await broker_api.max_offset(instance, address, queue)
            return await broker_api.search_offset(instance, address, queue,
                                                  self.consume_timestamp_ms)

        return await self._read_routing.call(queue, ask)


def _show_original_topics(messages: list[MessageExt]) -> None:
    """Messages of ``%RETRY%<group>`` are shown with the topic they were first sent to."""
    for message in messages:
        original = message.properties.get(PROPERTY_RETRY_TOPIC)
        if original:
            message.topic = original

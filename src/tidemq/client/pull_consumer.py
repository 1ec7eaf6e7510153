"""PullConsumer: the "lite pull" consumer — poll messages, commit offsets, seek.

Theory of operation
-------------------
Queues come from one of two modes:

- ``subscribe(topic, expression, expression_type="TAG")``: the group shares the topic's
  queues (docs/protocol.md §12, the same rule Java consumers use). ``expression_type="SQL92"``
  filters by message properties at the broker (``subscription``); ``start`` then asks every
  master of the topic (CHECK_CLIENT_CONFIG) whether it can, and fails if one cannot. The
  consumer heartbeats its subscriptions to every master (CONSUME_ACTIVELY), asks a broker
  for the group's members, and takes its block of queues; it re-balances every 20 s and
  when a broker announces a membership change (NOTIFY_CONSUMER_IDS_CHANGED).
- ``assign(queues)``: exactly these queues, no group coordination.

Each assigned queue has a fetch task that pulls (PULL_MESSAGE, ``pull_batch_size`` at a time,
long polling when the queue is drained) into a shared in-memory buffer, bounded per queue
(``pull_threshold_for_queue`` messages, ``pull_threshold_size_for_queue_mib`` MiB of bodies)
and in all (``pull_threshold_for_all``). ``poll`` hands out what is buffered, in pull order per
queue.

Pipelining: while a queue has a backlog, its fetch task keeps up to
``pulls_in_flight_per_queue`` pulls in flight instead of one, so the consumer decodes one answer
while the broker reads the next. A pull's nextBeginOffset is known only when it is answered, so
the pulls after the first are sent at a predicted offset: the previous pull's offset plus the
stride of the last answer taken (how far it moved the offset); only below the queue's max offset
that answer reported (so no pull ahead waits in a long poll), only for ``*`` subscriptions
(where a read moves the offset by exactly the messages it holds) and only while the buffer has
room for their messages. Answers are taken strictly in offset order, and an answer is taken
only when it starts at the queue's fetch position; one that does not (a wrong prediction: a
shorter read at the end of a consume-queue file, a message deleted by retention, a different
size cap) is dropped together with every pull sent after it, and pulling goes on from the
fetch position. So pipelining never skips or repeats a message; a wrong prediction costs one
wasted pull.

Each queue keeps

- its *fetch position*: the next offset to pull;
- its *consumed position*: the offset after the last message ``poll`` returned (messages a tag
  filter dropped count as consumed).

Where a queue starts: its committed offset (QUERY_CONSUMER_OFFSET); with none, ``consume_from``
decides: LAST -> the queue's max offset, FIRST -> its min offset, TIMESTAMP -> the offset
stored closest to ``consume_timestamp_ms``. (As in RocketMQ, a broker answers "offset 0" for a
new group on a queue whose min offset is 0, so a new group reads an untrimmed queue from the
start whatever ``consume_from`` says.) A pull answered OFFSET_ILLEGAL (the offset fell out of
[min, max], e.g. after retention) moves the queue to the broker's next offset, with a WARNING.

Offsets: ``commit()`` stages the consumed positions (or given offsets); staged offsets are sent
(UPDATE_CONSUMER_OFFSET to the queue's master) every ``auto_commit_interval_ms`` and at
``close``. With ``auto_commit`` (the default) the consumed positions are staged automatically
each round, so what ``poll`` returned counts as consumed by the next commit. ``commit_sync``
sends at once and raises on failure.

``seek*`` moves a queue's positions: buffered messages of that queue are dropped and its fetch
task restarts from the new offset. Everything runs on one event loop; nothing is thread-safe
(``tidemq.sync.PullConsumer`` is the thread-friendly twin).
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidemq.client import broker_api
from tidemq.client.errors import BrokerRejected, InvalidSubscription, NoRouteError
from tidemq.client.instance import (
    HEARTBEAT_BROKER_INTERVAL_MS,
    POLL_NAME_SERVER_INTERVAL_MS,
    REQUEST_TIMEOUT_MS,
    ClientInstance,
)
from tidemq.client.lifecycle import ClientLifecycle, cancel_tasks, leave_quietly
from tidemq.client.message import MessageQueue, PullResult, PullStatus
from tidemq.client.parked_pull import ParkedPull, parking_connection, send_parked_pull
from tidemq.client.producer import default_namesrv
from tidemq.client.read_routing import ReadRouting, route_read_addresses
from tidemq.client.rebalance import allocate_averagely
from tidemq.client.rebalance_trigger import RebalanceTrigger
from tidemq.client.security import Credentials, TlsOption
from tidemq.client.subscription import (
    EXPRESSION_TYPE_SQL92,
    EXPRESSION_TYPE_TAG,
    Subscription,
    parse_subscription,
)
from tidemq.errors import ClientError, InvalidTopicName, TidemqError
from tidemq.limits import group_name_problem, topic_name_problem
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import MessageExt
from tidemq.remoting.errors import RemotingError

log = logging.getLogger("tidemq.client")

# pullBatchSize. A tidemq broker sends up to 1024 messages (1 MiB) per pull, a RocketMQ one 32
# from memory. In Python the fixed cost of a pull (request, response header, a wake-up, and
# the broker's side of it) is what 32 per pull spends most on: 256 x 1 KiB per pull took the
# client 2.7 us and the broker 1.0 us per message against 3.6 and 2.2 at 32; 512 and 1024
# were slower again (a ~300 KB answer still fits the CPU's cache, a 1 MiB one not).
# Kafka's consumer likewise fetches up to 1 MiB per partition. RESULTS.md, issue 18.
PULL_BATCH_SIZE = 256
LOW_LEVEL_PULL_BATCH_SIZE = 32  # pull()'s default, as RocketMQ's pull(mq, expression, offset, 32)
PULL_THRESHOLD_FOR_QUEUE = 1000  # RocketMQ pullThresholdForQueue (messages buffered per queue)
PULL_THRESHOLD_SIZE_FOR_QUEUE_MIB = 100  # RocketMQ pullThresholdSizeForQueue (MiB of bodies)
# Pulls of one queue in flight while it has a backlog (module docstring). Two hide the round
# trip behind decoding; RocketMQ and Kafka consumers keep one per queue (partition).
PULLS_IN_FLIGHT_PER_QUEUE = 2
PULL_THRESHOLD_FOR_ALL = 10_000  # RocketMQ lite pull pullThresholdForAll
MAX_POLL_RECORDS = 1024  # messages one poll() returns at most
AUTO_COMMIT_INTERVAL_MS = 5000  # persistConsumerOffsetInterval
REBALANCE_INTERVAL_MS = 20_000  # rocketmq.client.rebalance.waitInterval
_MIB = 1024 * 1024
# The poll timer may fire this much before a deadline (uvloop keeps timers in whole
# milliseconds): a poll due then is woken, or the timer would be set again for the same instant.
_POLL_TIMER_SLACK_S = 0.001
CONSUME_TIMESTAMP_AGO_MS = 30 * 60 * 1000  # consumeTimestamp default: half an hour ago
# Back-off after a failed pull: RocketMQ waits 3 s after a broker error; a transport error
# (broker restarting) is retried a little sooner.
PULL_DELAY_AFTER_BROKER_ERROR_S = 3.0
PULL_DELAY_AFTER_TRANSPORT_ERROR_S = 1.0


async def back_off_after_pull_error(
    logger: logging.Logger, group: str, queue: object, error: Exception
) -> None:
    """Log a failed pull and wait before the queue's next one (shorter after a network error).

    Expected failures (a TidemqError) are logged in one line; anything else with its traceback.
    """
    if isinstance(error, TidemqError):
        logger.warning("consumer %s: pull of %s failed: %s", group, queue, error)
    else:
        logger.exception("consumer %s: pull of %s failed", group, queue)
    transport = isinstance(error, RemotingError)
    await asyncio.sleep(
        PULL_DELAY_AFTER_TRANSPORT_ERROR_S if transport else PULL_DELAY_AFTER_BROKER_ERROR_S
    )


def _drop_pulls(in_flight: collections.deque[tuple[int, asyncio.Task[PullResult]]]) -> None:
    """Cancel pulls whose answers will not be taken (their failures are not logged)."""
    while in_flight:
        _, pull = in_flight.popleft()
        pull.cancel()
        pull.add_done_callback(_forget)


def _forget(pull: asyncio.Task[PullResult]) -> None:
    if not pull.cancelled():
        pull.exception()  # retrieved, so asyncio does not report it as never retrieved


async def check_subscriptions_at_brokers(
    instance: ClientInstance, group: str, subscriptions: Iterable[Subscription]
) -> None:
    """CHECK_CLIENT_CONFIG for each SQL92 subscription at every master of its topic, as Java
    consumers do at start (docs/protocol.md §4.17). TAG subscriptions need no check.

    Raises:
        InvalidSubscription: a broker refused one (SQL92 not enabled there, or the
            expression does not compile); the message carries the broker's remark and the fix.
        RemotingError: a broker could not be asked.
    """
    for subscription in subscriptions:
        if not subscription.is_sql92:
            continue
        route = await instance.route(subscription.topic)
        if route is None:
            log.warning("consumer %s: no route for topic %r yet; its SQL92 subscription is not "
                        "checked at the brokers", group, subscription.topic)
            continue
        body = jsonx.dumps({"clientId": instance.client_id, "group": group,
                            "subscriptionData": subscription.to_json()})
        for broker_name, address in sorted(route.master_addresses().items()):
            response = await instance.invoke(address, RequestCode.CHECK_CLIENT_CONFIG,
                                             body=body)
            if response.code == ResponseCode.SUCCESS:
                continue
            refusal = BrokerRejected("CHECK_CLIENT_CONFIG", response.code, response.remark,
                                     address, retriable=False)
            fix = ("set enablePropertyFilter=true in that broker's config and restart it, or "
                   "subscribe with a TAG expression"
                   if response.code == ResponseCode.SYSTEM_ERROR
                   else "correct the expression")
            raise InvalidSubscription(
                f"consumer group {group} cannot subscribe {subscription.topic!r} with SQL92 "
                f"{subscription.expression!r}: broker {broker_name} refused it ({refusal}); "
                f"{fix}",
                code=response.code,
            )


class ConsumeFrom(enum.Enum):
    """Where a queue without a committed offset starts (RocketMQ ConsumeFromWhere)."""

    LAST = "CONSUME_FROM_LAST_OFFSET"
    FIRST = "CONSUME_FROM_FIRST_OFFSET"
    TIMESTAMP = "CONSUME_FROM_TIMESTAMP"

    @classmethod
    def parse(cls, value: ConsumeFrom | str) -> ConsumeFrom:
        """Accept a member, its name (``"LAST"``) or RocketMQ's name (``CONSUME_FROM_...``).

        Raises:
            ValueError: anything else, naming the accepted values.
        """
        if isinstance(value, ConsumeFrom):
            return value
        text = str(value).strip().upper()
        for member in cls:
            if text in (member.name, member.value):
                return member
        raise ValueError(
            f"consume_from={value!r}: expected one of LAST, FIRST, TIMESTAMP "
            "(or CONSUME_FROM_LAST_OFFSET, CONSUME_FROM_FIRST_OFFSET, CONSUME_FROM_TIMESTAMP)"
        )


@dataclass(eq=False)
class _QueueState:
    queue: MessageQueue
    subscription: Subscription
    fetch_offset: int | None = None
    consumed_offset: int | None = None
    buffered: int = 0
    buffered_bytes: int = 0
    epoch: int = 0
    task: asyncio.Task[None] | None = None
    # From the last answer taken: how far a full read moved the offset (0: do not pull
    # ahead) and the queue's max offset then; where pulls ahead may go (module docstring).
    stride: int = 0
    max_offset: int = 0
    # The parked pull whose answer the read callback takes (module docstring), and the
    # template its pulls are rendered from (for ``pull_template_of``, the subscription they
    # carry; None made: its extFields need escaping, built as a dict each time).
    parked: ParkedPull | None = None
    pull_template: broker_api.PullRequestTemplate | None = None
    pull_template_of: Subscription | None = None
    pull_timeout_ms: int = 0


@dataclass(slots=True)
class _Batch:
    state: _QueueState
    epoch: int
    messages: list[MessageExt]
    next_offset: int
    size: int = 0  # bytes of the pull body (counted against the byte threshold until drained)
    start: int = 0


@dataclass
class _Commits:
    staged: dict[MessageQueue, int] = field(default_factory=dict)
    sent: dict[MessageQueue, int] = field(default_factory=dict)


class PullConsumer(ClientLifecycle):
    """Polls messages from subscribed or assigned queues. Use as ``async with``.

    Args:
        group: the consumer group (offsets are stored per group).
        namesrv: name server addresses; default $NAMESRV_ADDR or 127.0.0.1:9876.
        consume_from: where queues without a committed offset start (``ConsumeFrom`` or
            "LAST" / "FIRST" / "TIMESTAMP").
        consume_timestamp_ms: the time for TIMESTAMP; default half an hour ago.
        auto_commit: stage consumed positions automatically (see the module docstring).
        auto_commit_interval_ms: how often staged offsets are sent to the brokers.
        pull_batch_size: messages asked for per pull.
        check_crcs: check each received body against its stored CRC (Kafka's
            ``check.crcs``); a damaged message is left out and logged as an ERROR naming it.
        max_poll_records: messages one ``poll`` returns at most.
        pull_threshold_for_queue / pull_threshold_for_all: buffering bounds (messages).
        pull_threshold_size_for_queue_mib: buffering bound per queue (MiB of pull bodies).
        pulls_in_flight_per_queue: pulls of a queue in flight while it has a backlog (1 turns
            pipelining off; module docstring).
        long_polling_suspend_ms: how long a broker may hold a pull on a drained queue.
        rebalance_interval_ms: how often the group's queues are re-shared (subscribe mode).
        instance_name: part of the client id.
        request_timeout_ms: timeout of non-pull requests.
        poll_name_server_interval_ms / heartbeat_broker_interval_ms: as for ``Producer``.
        credentials, tls: as for ``Producer``.

    Raises:
        ValueError: a bad group name, name server address or option.
    """

    def __init__(
        self,
        group: str,
        namesrv: str | Iterable[str] | None = None,
        *,
        consume_from: ConsumeFrom | str = ConsumeFrom.LAST,
        consume_timestamp_ms: int | None = None,
        auto_commit: bool = True,
        auto_commit_interval_ms: int = AUTO_COMMIT_INTERVAL_MS,
        pull_batch_size: int = PULL_BATCH_SIZE,
        max_poll_records: int = MAX_POLL_RECORDS,
        pull_threshold_for_queue: int = PULL_THRESHOLD_FOR_QUEUE,
        pull_threshold_for_all: int = PULL_THRESHOLD_FOR_ALL,
        pull_threshold_size_for_queue_mib: int = PULL_THRESHOLD_SIZE_FOR_QUEUE_MIB,
        pulls_in_flight_per_queue: int = PULLS_IN_FLIGHT_PER_QUEUE,
        long_polling_suspend_ms: int = broker_api.BROKER_SUSPEND_MAX_MS,
        rebalance_interval_ms: int = REBALANCE_INTERVAL_MS,
        instance_name: str | None = None,
        request_timeout_ms: int = REQUEST_TIMEOUT_MS,
        poll_name_server_interval_ms: int = POLL_NAME_SERVER_INTERVAL_MS,
        heartbeat_broker_interval_ms: int = HEARTBEAT_BROKER_INTERVAL_MS,
        credentials: Credentials | None = None,
        tls: TlsOption = None,
        check_crcs: bool = True,
    ):
        problem = group_name_problem(group)
        if problem is not None:
            raise ValueError(f"consumer {problem}")
        for name, value in (("pull_batch_size", pull_batch_size),
                            ("max_poll_records", max_poll_records),
                            ("pull_threshold_for_queue", pull_threshold_for_queue),
                            ("pull_threshold_for_all", pull_threshold_for_all),
                            ("pull_threshold_size_for_queue_mib",
                             pull_threshold_size_for_queue_mib),
                            ("pulls_in_flight_per_queue", pulls_in_flight_per_queue)):
            if value < 1:
                raise ValueError(f"{name}={value}: it must be at least 1")
        self.group = group
        self.consume_from = ConsumeFrom.parse(consume_from)
        self.consume_timestamp_ms = (
            consume_timestamp_ms
            if consume_timestamp_ms is not None
            else int(time.time() * 1000) - CONSUME_TIMESTAMP_AGO_MS
        )
        self.auto_commit = auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.pull_batch_size = pull_batch_size
        self.check_crcs = check_crcs
        self.max_poll_records = max_poll_records
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_for_all = pull_threshold_for_all
        self.pull_threshold_size_for_queue_mib = pull_threshold_size_for_queue_mib
        self.pulls_in_flight_per_queue = pulls_in_flight_per_queue
        self.long_polling_suspend_ms = long_polling_suspend_ms
        self._instance = ClientInstance(
            namesrv if namesrv is not None else default_namesrv(),
            instance_name=instance_name,
            request_timeout_ms=request_timeout_ms,
            poll_name_server_interval_ms=poll_name_server_interval_ms,
            heartbeat_broker_interval_ms=heartbeat_broker_interval_ms,
            credentials=credentials,
            tls=tls,
        )
        self._instance.heartbeat_sources.append(self._heartbeat_data)
        self._instance.remoting.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                         self._on_consumer_ids_changed)
        # Reads go to the master, or to a slave when it is gone or suggests one.
        self._read_routing = ReadRouting(self._instance)
        self._mode: str | None = None  # "subscribe" or "assign"
        self._subscriptions: dict[str, Subscription] = {}
        self._states: dict[MessageQueue, _QueueState] = {}
        self._buffer: collections.deque[_Batch] = collections.deque()
        self._buffered = 0
        # poll() calls waiting for the first buffered message, each a future and its
        # deadline (an Event under asyncio.timeout cost twice as much, and a consumer
        # keeping up waits once per pull answer), woken by _take_result or by the one poll
        # timer, due at the earliest deadline it knows of: a uvloop timer started and
        # cancelled per poll cost ~2.4 us hot, and polls that keep getting messages never
        # reach their deadline, so the timer fires about once per poll timeout.
        self._poll_waiters: dict[asyncio.Future[None], float] = {}
        self._poll_timer: asyncio.TimerHandle | None = None
        self._poll_timer_at = math.inf
        self._space_freed: asyncio.Event | None = None
        self._commits = _Commits()
        self._tasks: list[asyncio.Task[None]] = []
        # rebalance() itself does nothing unless in subscribe mode.
        self._rebalancer = RebalanceTrigger(group, rebalance_interval_ms, self.rebalance)
        self._client_name = f"consumer {group!r}"

    # -- life cycle ------------------------------------------------------------------------

    @property
    def rebalance_interval_ms(self) -> int:
        """How often the group's queues are re-shared (besides on changes)."""
        return self._rebalancer.interval_ms

    @property
    def client_id(self) -> str:
        """This consumer's client id, ``<ip>@<instance name>``."""
        return self._instance.client_id

    async def start(self) -> None:
        """Start fetching: resolve assignments, begin pulls, heartbeats and auto commit.

        Raises:
            ClientStateError: the consumer was closed.
            InvalidSubscription: a broker cannot serve a SQL92 subscription (the consumer is
                closed then; create a new one once the broker is fixed).
        """
        if not self._begin_start():
            return
        self._space_freed = asyncio.Event()
        self._rebalancer.arm()
        await self._instance.start()
        try:
            await check_subscriptions_at_brokers(self._instance, self.group,
                                                 list(self._subscriptions.values()))
        except BaseException:
            self._closed()
            await self._instance.close()
            raise
        self._state = "running"
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._commit_loop()))
        self._tasks.append(loop.create_task(self._rebalancer.loop()))
        for state in self._states.values():
            self._start_fetch(state)
        if self._mode == "subscribe":
            await self._rebalancer.run_once()

    async def close(self) -> None:
        """Commit what is staged (and consumed, with auto commit), leave the group, close.

        Idempotent; commit failures at close are logged, not raised.
        """
        was_running = self._begin_close()
        if was_running is None:
            return
        try:
            fetches = [s.task for s in self._states.values() if s.task]
            for state in self._states.values():
                self._stop_fetch(state)
            await cancel_tasks(self._tasks + fetches)
            if was_running:
                if self.auto_commit:
                    self._stage_consumed()
                try:
                    await self._send_commits()
                except Exception as e:
                    log.warning("consumer %s: committing offsets at close failed: %s",
                                self.group, e)
                if self._mode == "subscribe":
                    await leave_quietly(self._instance, consumer_group=self.group)
        finally:
            self._closed()
            await self._instance.close()

    async def __aenter__(self) -> PullConsumer:
        await self.start()
        return self

    # -- what to consume -------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str | None = "*", *,
                  expression_type: str = EXPRESSION_TYPE_TAG) -> None:
        """Consume ``topic`` sharing its queues with the group: messages whose tag matches
        ``expression`` (``"*"``, or tags joined by ``||``), or with
        ``expression_type="SQL92"`` messages whose properties satisfy it (``"a > 5"``; the
        broker needs ``enablePropertyFilter=true``).

        May be called before or after ``start``; a running consumer re-balances at once.

        Raises:
            InvalidSubscription: the consumer already uses ``assign``, or a bad expression
                or expression type.
            InvalidTopicName: a bad topic name.
        """
        self._check_topic(topic)
        if self._mode == "assign":
            raise InvalidSubscription(
                "this consumer uses assign(); subscribe() and assign() cannot be mixed"
            )
        subscription = parse_subscription(topic, expression, expression_type)
        self._mode = "subscribe"
        self._subscriptions[topic] = subscription
        if self._state == "running":
            self._rebalancer.request()

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic`` (its queues are released at the next re-balance)."""
        self._subscriptions.pop(topic, None)
        if self._state == "running":
            self._rebalancer.request()

    def assign(self, queues: Iterable[MessageQueue], expression: str | None = "*", *,
               expression_type: str = EXPRESSION_TYPE_TAG) -> None:
        """Consume exactly ``queues`` (no group coordination), filtered by ``expression``
        (a TAG expression, or SQL92 with ``expression_type="SQL92"``).

        Replaces any previous assignment; queues kept keep their positions.

        Raises:
            InvalidSubscription: the consumer already uses ``subscribe``, or a bad expression.
        """
        if self._mode == "subscribe":
            raise InvalidSubscription(
                "this consumer uses subscribe(); subscribe() and assign() cannot be mixed"
            )
        self._mode = "assign"
        wanted = list(dict.fromkeys(queues))
        subscriptions: dict[str, Subscription] = {}
        for queue in wanted:
            if queue.topic not in subscriptions:
                self._check_topic(queue.topic)
                subscriptions[queue.topic] = parse_subscription(queue.topic, expression,
                                                                expression_type)
        self._subscriptions = subscriptions
        self._set_assignment(wanted)

    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer currently reads, sorted."""
        return sorted(self._states)

    def subscription(self) -> dict[str, str]:
        """Topic -> tag expression of what this consumer consumes."""
        return {topic: sub.expression for topic, sub in self._subscriptions.items()}

    async def queues(self, topic: str) -> list[MessageQueue]:
        """All readable queues of ``topic`` (from the name servers), sorted.

        Raises:
            NoRouteError: no broker serves the topic.
        """
        self._check_running()
        route = await self._instance.route(topic, refresh=True)
        if route is None:
            raise NoRouteError(f"no broker serves topic {topic!r}; create it first")
        return route.subscribe_queues(topic)

    @staticmethod
    def _check_topic(topic: str) -> None:
        problem = topic_name_problem(topic)
        if problem is not None:
            raise InvalidTopicName(problem)

    # -- polling ---------------------------------------------------------------------------

    async def poll(self, timeout_ms: int = 1000) -> list[MessageExt]:
        """Return buffered messages, waiting up to ``timeout_ms`` for the first one.

        Returns:
            Up to ``max_poll_records`` messages (queue order kept per queue; each message's
            ``broker_name`` and ``queue_id`` name its queue), or an empty list on timeout.

        Raises:
            ClientStateError: not started.
            InvalidSubscription: nothing subscribed or assigned.
        """
        self._check_running()
        if self._mode is None:
            raise InvalidSubscription("nothing to poll: call subscribe() or assign() first")
        loop = self._instance.loop or asyncio.get_running_loop()  # no getpid (3.11)
        deadline = loop.time() + max(0, timeout_ms) / 1000
        while True:
            messages = self._drain(self.max_poll_records)
            if messages:
                return messages
            if deadline <= loop.time():
                return []
            waiter = loop.create_future()
            self._poll_waiters[waiter] = deadline
            if deadline < self._poll_timer_at:
                self._schedule_poll_timer(loop, deadline)
            try:
                await waiter
            finally:
                # Still there when cancelled; the timer finds nothing of it when it fires.
                self._poll_waiters.pop(waiter, None)

    def _schedule_poll_timer(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._poll_timer is not None:
            self._poll_timer.cancel()
        self._poll_timer_at = at
        self._poll_timer = loop.call_at(at, self._poll_timer_fired, loop)

    def _poll_timer_fired(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake the polls past their deadline; wait again for the earliest one left."""
        self._poll_timer = None
        self._poll_timer_at = math.inf
        due_by = loop.time() + _POLL_TIMER_SLACK_S
        next_at = math.inf
        for waiter, deadline in list(self._poll_waiters.items()):
            if deadline <= due_by:
                del self._poll_waiters[waiter]
                _wake_waiter(waiter)
            elif deadline < next_at:
                next_at = deadline
        if next_at != math.inf:
            self._schedule_poll_timer(loop, next_at)

    def _drain(self, limit: int) -> list[MessageExt]:
        out: list[MessageExt] = []
        buffer = self._buffer
        while buffer and len(out) < limit:
            batch = buffer[0]
            state = batch.state
            if batch.epoch != state.epoch:
                buffer.popleft()  # the queue was sought or released since this was fetched
                continue
            messages = batch.messages
            if not batch.start and len(messages) <= limit - len(out):
                # The usual case (a keeping-up consumer's few messages an answer): the whole
                # batch, in fewer steps than the general case below.
                out += messages
                buffer.popleft()
                taken = len(messages)
                state.buffered -= taken
                self._buffered -= taken
                state.consumed_offset = batch.next_offset
                state.buffered_bytes -= batch.size
                continue
            available = len(batch.messages) - batch.start
            take = min(available, limit - len(out))
            if take:
                end = batch.start + take
                out.extend(batch.messages[batch.start:end])
                batch.start = end
                state.buffered -= take
                self._buffered -= take
            if batch.start >= len(batch.messages):
                buffer.popleft()
                state.consumed_offset = batch.next_offset
                state.buffered_bytes -= batch.size
            else:
                state.consumed_offset = batch.messages[batch.start - 1].queue_offset + 1
        if out and self._space_freed is not None:
            self._space_freed.set()
        return out

    # -- fetching --------------------------------------------------------------------------

    def _start_fetch(self, state: _QueueState) -> None:
        if self._state != "running" or state.task is not None or state.parked is not None:
            return
        self._run_fetch_task(state, state.epoch)

    def _run_fetch_task(self, state: _QueueState, epoch: int,
                        error: Exception | None = None) -> None:
        loop = self._instance.loop or asyncio.get_running_loop()  # no getpid (3.11)
        state.task = loop.create_task(self._fetch_loop(state, epoch, error),
                                      name=f"tidemq-fetch-{state.queue}")

    def _stop_fetch(self, state: _QueueState) -> None:
        state.epoch += 1  # a parked pull's answer is dropped by its epoch when it comes
        state.parked = None
        if state.task is not None:
            state.task.cancel()
            state.task = None
        self._purge(state)

    def _purge(self, state: _QueueState) -> None:
        state.stride = 0
        if state.buffered or state.buffered_bytes:
            self._buffered -= state.buffered
            state.buffered = 0
            state.buffered_bytes = 0
            self._buffer = collections.deque(b for b in self._buffer if b.state is not state)

    async def _fetch_loop(self, state: _QueueState, epoch: int,
                          error: Exception | None = None) -> None:
        queue = state.queue
        assert self._space_freed is not None
        # Pulls sent and not yet taken, in offset order: (offset, pull).
        in_flight: collections.deque[tuple[int, asyncio.Task[PullResult]]] = (
            collections.deque())
        try:
            if error is not None:  # a parked pull failed (_parked_failed)
                await back_off_after_pull_error(log, self.group, queue, error)
            while state.epoch == epoch:
                try:
                    if state.fetch_offset is None:
                        offset = await self._starting_offset(queue)
                        if state.epoch != epoch:
                            return
                        state.fetch_offset = offset
                        if state.consumed_offset is None:
                            state.consumed_offset = offset
                    if not in_flight:
                        while self._buffer_full(state):
                            self._space_freed.clear()
                            await self._space_freed.wait()
                            if state.epoch != epoch:
                                return
                    if not in_flight and not self._may_pull_ahead(state):
                        # One pull and none to send beside it (a drained queue: the usual
                        # case of a consumer keeping up): parked, its answer taken in the
                        # read callback, and this task ends; else awaited in this task. A
                        # task per pull and its wake-up cost more than decoding a few
                        # messages.
                        if self._park(state, epoch):
                            state.task = None
                            return
                        offset = state.fetch_offset
                        result = await self._pull_for(state, offset, True)
                    else:
                        if not in_flight:
                            in_flight.append(self._send_pull(state, state.fetch_offset, True))
                        self._pull_ahead(state, in_flight)
                        offset, pull = in_flight[0]
                        result = await pull
                        in_flight.popleft()
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # the queue keeps being fetched whatever went wrong
                    _drop_pulls(in_flight)
                    state.stride = 0
                    await back_off_after_pull_error(log, self.group, queue, e)
                    continue
                if state.epoch != epoch:
                    return
                if offset != state.fetch_offset:
                    # A pull ahead whose predicted offset turned out wrong, and so are those
                    # sent after it: drop them all and go on from the fetch position.
                    _drop_pulls(in_flight)
                    state.stride = 0
                    continue
                self._take_result(state, epoch, result)
                self._note_stride(state, offset, result)
        finally:
            _drop_pulls(in_flight)

    def _note_stride(self, state: _QueueState, offset: int, result: PullResult) -> None:
        """After taking ``result`` (a pull at ``offset``): where pulls ahead may go."""
        state.max_offset = result.max_offset
        subscription = state.subscription
        # ``matches_all and not is_sql92`` read from the fields: two property calls fewer an
        # answer.
        state.stride = (
            result.next_begin_offset - offset
            if result.status is PullStatus.FOUND and not subscription.tags
            and subscription.expression_type != EXPRESSION_TYPE_SQL92
            else 0
        )

    # -- parked pulls: a drained queue's answers taken in the read callback ----------------

    def _park(self, state: _QueueState, epoch: int) -> bool:
        """Send the long-polling pull of a drained ``state`` at its fetch position as a
        parked pull (``tidemq.client.parked_pull``); False, with nothing sent, when it is
        not the simple case (the fetch task's path then)."""
        queue = state.queue
        target = parking_connection(self._instance, queue)
        if target is None:
            return False
        _, address, connection = target
        subscription = state.subscription
        if state.pull_template_of is not subscription:
            state.pull_template = broker_api.pull_request_template(
                self.group, queue, self.pull_batch_size, subscription,
                suspend_timeout_ms=self.long_polling_suspend_ms)
            state.pull_template_of = subscription
            state.pull_timeout_ms = broker_api.pull_timeout_ms(
                self._instance, self.long_polling_suspend_ms)
        offset = state.fetch_offset
        assert offset is not None
        template = state.pull_template
        parked = ParkedPull(self, state, epoch, offset, address, subscription)
        if template is not None:  # send_parked_pull's common case, without its call
            sent = connection.request_nowait(template.render(offset), state.pull_timeout_ms,
                                             parked)
        else:
            sent = send_parked_pull(connection, broker_api.pull_request_fields(
                self.group, queue, offset, self.pull_batch_size, subscription,
                suspend_timeout_ms=self.long_polling_suspend_ms), state.pull_timeout_ms, parked)
        if not sent:
            return False
        state.parked = parked
        return True

    def parked_answered(self, parked: ParkedPull, response: RemotingCommand) -> None:
        """Take a parked pull's answer (in the read callback: nothing may raise out of
        here), then park the next pull, or hand the queue back to a fetch task."""
        state: _QueueState = parked.owner
        epoch = parked.epoch
        if state.parked is parked:
            state.parked = None
        if state.epoch != epoch or self._state != "running":
            return  # sought, released or closing since: the answer is not wanted
        try:
            queue = state.queue
            result = broker_api.decode_pull_response(
                response, queue, parked.subscription, parked.address,
                check_crc=self.check_crcs)
            self._read_routing.suggest(queue, result.suggest_which_broker_id)
            self._take_result(state, epoch, result, wake=False)
            self._note_stride(state, parked.offset, result)
            # The next pull first, then the polls: its write (the cork's flush) is queued
            # before the poll's task, so it leaves before the application's code runs and
            # its round trip overlaps the application's work on these messages.
            if (not self._buffer_full(state) and not self._may_pull_ahead(state)
                    and self._park(state, epoch)):
                return
            self._run_fetch_task(state, epoch)
        except Exception as e:  # the fetch task backs off and goes on, as for a pull's error
            if state.epoch == epoch and state.task is None:
                self._run_fetch_task(state, epoch, e)
        finally:
            self._wake_polls()

    def parked_failed(self, parked: ParkedPull, error: BaseException) -> None:
        """A parked pull timed out or lost its connection: a fetch task backs off and goes
        on from the fetch position."""
        state: _QueueState = parked.owner
        if state.parked is parked:
            state.parked = None
        if (state.epoch == parked.epoch and self._state == "running" and state.task is None
                and isinstance(error, Exception)):
            self._run_fetch_task(state, parked.epoch, error)

    def _buffer_full(self, state: _QueueState) -> bool:
        return (state.buffered >= self.pull_threshold_for_queue
                or self._buffered >= self.pull_threshold_for_all
                or state.buffered_bytes >= self.pull_threshold_size_for_queue_mib * _MIB)

    def _may_pull_ahead(self, state: _QueueState) -> bool:
        """Whether ``_pull_ahead`` could send a pull beside one at the fetch position."""
        return (state.stride > 0 and self.pulls_in_flight_per_queue > 1
                and state.fetch_offset + state.stride < state.max_offset)

    def _pull_ahead(
        self, state: _QueueState,
        in_flight: collections.deque[tuple[int, asyncio.Task[PullResult]]],
    ) -> None:
        """Send pulls ahead of the first, at predicted offsets, while the queue has a backlog
        and the buffer has room for their messages (module docstring)."""
        stride = state.stride
        if stride <= 0:
            return
        batch = self.pull_batch_size
        while len(in_flight) < self.pulls_in_flight_per_queue:
            offset = in_flight[-1][0] + stride
            room = (len(in_flight) + 1) * batch
            if (offset >= state.max_offset
                    or state.buffered + room > self.pull_threshold_for_queue
                    or self._buffered + room > self.pull_threshold_for_all
                    or state.buffered_bytes >= self.pull_threshold_size_for_queue_mib * _MIB):
                return
            in_flight.append(self._send_pull(state, offset, False))

    def _send_pull(self, state: _QueueState, offset: int,
                   long_poll: bool) -> tuple[int, asyncio.Task[PullResult]]:
        """Start a pull of ``state``'s queue at ``offset`` (long polling only for the pull
        at the fetch position: a pull ahead goes below the known max offset)."""
        loop = self._instance.loop or asyncio.get_running_loop()  # no getpid (3.11)
        pull = loop.create_task(self._pull_for(state, offset, long_poll))
        return offset, pull

    async def _pull_for(self, state: _QueueState, offset: int, long_poll: bool) -> PullResult:
        queue = state.queue
        suspend_ms = self.long_polling_suspend_ms if long_poll else 0
        result = await self._read_routing.call(
            queue, lambda _, address: broker_api.pull_message(
                self._instance, address, self.group, queue, offset, self.pull_batch_size,
                state.subscription, suspend_timeout_ms=suspend_ms,
                check_crc=self.check_crcs,
            ))
        self._read_routing.suggest(queue, result.suggest_which_broker_id)
        return result

    def _take_result(self, state: _QueueState, epoch: int, result: PullResult, *,
                     wake: bool = True) -> None:
        """Buffer ``result``'s messages for ``poll`` and move the fetch position; with
        ``wake`` the waiting polls are woken (else the caller calls ``_wake_polls``)."""
        status = result.status
        if status is PullStatus.NO_NEW_MSG:
            state.fetch_offset = result.next_begin_offset
            return
        if status is PullStatus.OFFSET_ILLEGAL:
            log.warning(
                "consumer %s: offset %s of %s is outside [%d, %d]; moving to %d",
                self.group, state.fetch_offset, state.queue, result.min_offset,
                result.max_offset, result.next_begin_offset,
            )
        state.fetch_offset = result.next_begin_offset
        messages = result.messages
        # Even with nothing to hand out (filtered, moved), the batch moves the consumed
        # position in queue order once poll() reaches it.
        self._buffer.append(_Batch(state, epoch, messages, result.next_begin_offset,
                                   result.body_size))
        state.buffered_bytes += result.body_size
        if messages:
            state.buffered += len(messages)
            self._buffered += len(messages)
        if wake:
            self._wake_polls()

    def _wake_polls(self) -> None:
        """Wake every waiting poll (their tasks run in the loop's next round)."""
        if self._poll_waiters:
            waiters, self._poll_waiters = self._poll_waiters, {}
            for waiter in waiters:
                _wake_waiter(waiter)

    async def _starting_offset(self, queue: MessageQueue) -> int:
        routing = self._read_routing
        try:
            committed = await routing.call(queue, lambda _, address: (
                broker_api.query_consumer_offset(self._instance, address, self.group, queue)))
        except RemotingError:
            raise
        except ClientError as e:  # RocketMQ treats any broker error as "no offset"
            log.info("consumer %s: no committed offset for %s (%s)", self.group, queue, e)
            committed = None
        if committed is not None and committed >= 0:
            return committed
        instance = self._instance

        async def ask(_: int, address: str) -> int:
            if self.consume_from is ConsumeFrom.FIRST:
                return await broker_api.min_offset(instance, address, queue)
            if self.consume_from is ConsumeFrom.LAST:
                return await broker_api.max_offset(instance, address, queue)
            return await broker_api.search_offset(instance, address, queue,
                                                  self.consume_timestamp_ms)

        return await routing.call(queue, ask)

    # -- low-level pull --------------------------------------------------------------------

    async def pull(
        self,
        queue: MessageQueue,
        offset: int,
        max_nums: int = LOW_LEVEL_PULL_BATCH_SIZE,
        *,
        expression: str | None = "*",
        expression_type: str = EXPRESSION_TYPE_TAG,
        suspend_timeout_ms: int = 0,
        timeout_ms: int | None = None,
    ) -> PullResult:
        """Pull once from ``queue`` at ``offset``, outside polling and offset bookkeeping.

        Args:
            queue: the queue.
            offset: the queue offset to read from.
            max_nums: messages at most (a tidemq broker sends up to 1024 and 1 MiB, a
                RocketMQ one 32 from memory).
            expression: tag expression (or SQL92 text with ``expression_type="SQL92"``);
                non-matching messages are left out (the result's ``next_begin_offset`` still
                moves past them).
            expression_type: ``"TAG"`` or ``"SQL92"``.
            suspend_timeout_ms: > 0 lets the broker hold the pull that long when the queue
                has nothing new (long polling).
            timeout_ms: request timeout (default: request timeout, or the hold plus 10 s).

        Returns:
            The PullResult (status, next_begin_offset, min/max offset, messages).

        Raises:
            BrokerRejected, RemotingError, NoRouteError, ClientStateError.
            InvalidSubscription: a bad expression or expression type.
        """
        self._check_running()
        subscription = parse_subscription(queue.topic, expression, expression_type)
        result = await self._read_routing.call(
            queue, lambda _, address: broker_api.pull_message(
                self._instance, address, self.group, queue, offset, max_nums, subscription,
                suspend_timeout_ms=suspend_timeout_ms, timeout_ms=timeout_ms,
                check_crc=self.check_crcs,
            ))
        self._read_routing.suggest(queue, result.suggest_which_broker_id)
        return result

    # -- positions and commits -------------------------------------------------------------

    def position(self, queue: MessageQueue) -> int | None:
        """The offset after the last message ``poll`` returned from ``queue`` (None: unknown).

        Raises:
            InvalidSubscription: ``queue`` is not assigned to this consumer.
        """
        return self._state_of(queue).consumed_offset

    def commit(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        """Stage offsets to commit: the consumed positions, or ``offsets`` (queue -> the next
        offset to consume). They are sent with the next periodic commit or at ``close``."""
        if offsets is None:
            self._stage_consumed()
        else:
            self._commits.staged.update(offsets)

    async def commit_sync(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        """Stage like ``commit`` and send every staged offset now.

        Raises:
            BrokerRejected / RemotingError / NoRouteError: a commit failed (it stays staged and
                is retried by the next periodic commit).
        """
        self._check_running()
        self.commit(offsets)
        await self._send_commits()

    async def committed(self, queue: MessageQueue) -> int | None:
        """The group's offset for ``queue`` as stored on the broker; None when none is.

        Raises:
            BrokerRejected / RemotingError / NoRouteError.
        """
        self._check_running()
        address = await self._instance.find_master(queue.broker_name, queue.topic)
        return await broker_api.query_consumer_offset(self._instance, address, self.group,
                                                      queue)

    def _stage_consumed(self) -> None:
        for queue, state in self._states.items():
            if state.consumed_offset is not None:
                self._commits.staged[queue] = state.consumed_offset

    async def _send_commits(self) -> None:
        commits = self._commits
        todo = {q: o for q, o in commits.staged.items() if commits.sent.get(q) != o}
        if not todo:
            return

        async def send_one(queue: MessageQueue, offset: int) -> None:
            # The master, else a slave of its group (it hands them back; read_routing.py).
            await self._read_routing.call(queue, lambda _, address: (
                broker_api.update_consumer_offset(self._instance, address, self.group, queue,
                                                  offset)))
            commits.sent[queue] = offset

        results = await asyncio.gather(*(send_one(q, o) for q, o in todo.items()),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.auto_commit_interval_ms / 1000)
            if self.auto_commit:
                self._stage_consumed()
            try:
                await self._send_commits()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("consumer %s: periodic offset commit failed: %s", self.group, e)

    # -- seeking ---------------------------------------------------------------------------

    async def seek(self, queue: MessageQueue, offset: int) -> None:
        """Make ``queue`` continue at ``offset`` (buffered messages of it are dropped).

        Raises:
            InvalidSubscription: ``queue`` is not assigned.
            ValueError: a negative offset.
        """
        if offset < 0:
            raise ValueError(f"offset {offset} is negative")
        state = self._state_of(queue)
        self._stop_fetch(state)
        state.fetch_offset = offset
        state.consumed_offset = offset
        self._start_fetch(state)

    async def seek_to_beginning(self, queue: MessageQueue | None = None) -> None:
        """Seek ``queue`` (or every assigned queue) to its min offset."""
        for target in self._targets(queue):
            address = await self._instance.find_master(target.broker_name, target.topic)
            await self.seek(target, await broker_api.min_offset(self._instance, address, target))

    async def seek_to_end(self, queue: MessageQueue | None = None) -> None:
        """Seek ``queue`` (or every assigned queue) to its max offset (only new messages)."""
        for target in self._targets(queue):
            address = await self._instance.find_master(target.broker_name, target.topic)
            await self.seek(target, await broker_api.max_offset(self._instance, address, target))

    async def seek_to_timestamp(self, queue: MessageQueue | None, timestamp_ms: int) -> None:
        """Seek ``queue`` (or every assigned queue, for None) to the offset stored closest to
        ``timestamp_ms`` (SEARCH_OFFSET_BY_TIMESTAMP)."""
        for target in self._targets(queue):
            address = await self._instance.find_master(target.broker_name, target.topic)
            offset = await broker_api.search_offset(self._instance, address, target,
                                                    timestamp_ms)
            await self.seek(target, offset)

    def _targets(self, queue: MessageQueue | None) -> list[MessageQueue]:
        self._check_running()
        if queue is None:
            return self.assignment()
        self._state_of(queue)
        return [queue]

    def _state_of(self, queue: MessageQueue) -> _QueueState:
        state = self._states.get(queue)
        if state is None:
            raise InvalidSubscription(
                f"queue {queue} is not assigned to consumer {self.group!r}; assigned: "
                f"{', '.join(map(str, self.assignment())) or 'none'}"
            )
        return state

    # -- assignment and re-balancing ---------------------------------------------------------

    def _set_assignment(self, queues: Iterable[MessageQueue]) -> None:
        wanted = set(queues)
        for queue in [q for q in self._states if q not in wanted]:
            state = self._states.pop(queue)
            if state.consumed_offset is not None and self.auto_commit:
                self._commits.staged[queue] = state.consumed_offset
            self._stop_fetch(state)
        for queue in sorted(wanted - set(self._states)):
            subscription = self._subscriptions[queue.topic]
            state = _QueueState(queue, subscription)
            self._states[queue] = state
            self._start_fetch(state)
        for state in self._states.values():
            # a changed expression applies from the next pull on
            state.subscription = self._subscriptions[state.queue.topic]

    async def rebalance(self) -> None:
        """Re-compute this member's queues now (subscribe mode; also runs every 20 s).

        A topic whose route or member list cannot be fetched keeps its current queues.
        """
        if self._mode != "subscribe":
            return
        for topic in self._subscriptions:
            await self._instance.route(topic)
        await self._instance.send_heartbeat()
        mine: list[MessageQueue] = []
        for topic in list(self._subscriptions):
            try:
                mine.extend(await self._allocate(topic))
            except (RemotingError, ClientError) as e:
                log.warning("consumer %s: re-balance of topic %r failed, keeping its queues: %s",
                            self.group, topic, e)
                mine.extend(q for q in self._states if q.topic == topic)
        before = set(self._states)
        self._set_assignment(mine)
        if set(self._states) != before:
            log.info("consumer %s (%s) now reads %d queues: %s", self.group, self.client_id,
                     len(self._states), ", ".join(map(str, self.assignment())))

    async def _allocate(self, topic: str) -> list[MessageQueue]:
        route = await self._instance.route(topic, refresh=True)
        if route is None:
            raise NoRouteError(f"no broker serves topic {topic!r}")
        queues = route.subscribe_queues(topic)
        # Any broker of a group can name its members (consumers heartbeat to slaves too), so
        # the queues stay shared while a master is down.
        addresses = route_read_addresses(route)
        if not queues or not addresses:
            return []
        members = await self._group_members(addresses)
        if self.client_id not in members:
            members.append(self.client_id)  # our heartbeat may not have landed yet
        return allocate_averagely(queues, members, self.client_id)

    async def _group_members(self, addresses: list[str]) -> list[str]:
        """The group's members as the first broker that lists any names them (brokers are
        asked starting at one picked by client id, to spread the questions).

        Raises:
            RemotingError: no broker could be reached (the last error).
        """
        start = hash(self.client_id) % len(addresses)
        failure: RemotingError | None = None
        answered = False
        for address in addresses[start:] + addresses[:start]:
            try:
                response = await self._instance.invoke(
                    address, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": self.group})
            except RemotingError as e:
                failure = e
                continue
            answered = True
            if response.code != ResponseCode.SUCCESS:
                continue  # knows no member (e.g. a master back from a restart)
            body = jsonx.loads(response.body or b"{}")
            members = [str(m) for m in (body.get("consumerIdList") or [])]
            if members:
                return members
        if failure is not None and not answered:
            raise failure
        return []

    async def _on_consumer_ids_changed(
        self, request: RemotingCommand, connection: object
    ) -> RemotingCommand | None:
        log.info("consumer %s: broker says the group's members changed; re-balancing",
                 self.group)
        self._rebalancer.request()
        return None

    def _heartbeat_data(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if self._mode != "subscribe":
            return [], []
        consumer = {
            "consumeFromWhere": self.consume_from.value,
            "consumeType": "CONSUME_ACTIVELY",
            "groupName": self.group,
            "messageModel": "CLUSTERING",
            "subscriptionDataSet": [s.to_json() for s in self._subscriptions.values()],
            "unitMode": False,
        }
        return [], [consumer]


def _wake_waiter(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)

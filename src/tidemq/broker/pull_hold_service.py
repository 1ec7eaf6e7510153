"""Long polling: pull requests parked until a message arrives for their queue or time runs out.

Theory of operation
-------------------
A consumer pulls with the SUSPEND flag (docs/protocol.md §4.4). When its queue has nothing new
(PULL_NOT_FOUND), the pull processor parks the request here under the key ``topic@queueId``
instead of answering, for ``suspendTimeoutMillis`` (long polling) or ``shortPollingTimeMills``
(short polling). A parked request is answered

- soon after a message for its queue is dispatched: the store calls
  ``on_message_dispatched`` (on whatever thread appended), which records the queue's new max
  offset and schedules one pass over the woken keys on the event loop, so a burst of
  appends costs one pass. The pass re-runs each parked pull whose offset is below the new
  max; if the re-run found messages (or anything else worth saying) it is answered, and if
  nothing matched its filter yet it stays parked. The answers leave at the pass's end, one
  write per connection for all the queues woken (not at the end of the loop iteration), and
  a send runs the pending pass (``wake_now``) before it is answered: the consumer is woken
  before the producer's acknowledgement goes out, so a message's end-to-end path waits
  neither for that write nor, when cores are scarce, for the producer handling it (a
  single send announces its put with ``wake_after_put``, so its dispatch schedules no
  pass that ``wake_now`` would leave with nothing to do);
- at its deadline, with whatever a final re-run says, usually PULL_NOT_FOUND. Deadlines
  are kept in slots of ``DEADLINE_SLOT_MS``, one loop timer per slot at its end (a timer
  per request cost ~2.4 us to start and cancel, for every pull a consumer keeping up
  parks), so a pull times out up to that much late. A slot's timer stays armed when its
  pulls are all answered, for the pulls that park into the same slot next: a consumer
  keeping up parks again a moment later with the same timeout, so one slot sees several
  cycles of park and wake, and ``call_at`` + ``cancel`` cost 2.8-3.6 us each cycle; the
  price is one firing that finds nothing at the slot's end (for 20 s pulls, 20 s after
  the broker fell idle, at most one per slot);
- never, when its connection closed meanwhile: it is dropped.

A periodic re-check (every 5 s under long polling) re-runs parked pulls whose queue has grown
without a notification reaching us, the same safety net RocketMQ's hold service has.

The pulls answered after being parked are counted by what answered them (``answered_by_cause``:
a message, the re-check, the timeout; the broker's metrics export them), added once per pass
or deadline slot rather than per pull.

The number of parked requests is bounded (``PULL_REQUESTS_PARKED_MAX``): past it the
processor answers SYSTEM_BUSY rather than holding more.

Everything but ``on_message_dispatched`` runs on the broker's event loop thread.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting.dispatch import describe_exception

if TYPE_CHECKING:
    from tidemq.remoting.connection import Connection
    from tidemq.store.interface import MessageStore

log = logging.getLogger("tidemq.broker")

# RocketMQ bounds pending pulls by its pull thread pool queue (pullThreadPoolQueueCapacity,
# 100,000); a parked request costs about a kilobyte here, so this caps them near 100 MiB.
PULL_REQUESTS_PARKED_MAX = 100_000

# RocketMQ's PullRequestHoldService waits 5 s between checks under long polling.
LONG_POLLING_RECHECK_INTERVAL_MS = 5_000

# Parked pulls whose deadlines fall in one slot this long share one timer at the slot's end
# (module docstring). RocketMQ answers expired pulls only at its 1-5 s checks; 10 ms late is
# nothing to a consumer whose poll lasts seconds, and at 2,000 parks a second it is ~100
# timers a second instead of 2,000.
DEADLINE_SLOT_MS = 10
_SLOTS_PER_S = 1000 / DEADLINE_SLOT_MS

_CONNECTION_ATTRIBUTE = "tidemq.broker.parked_pulls"


class PullMode(enum.Enum):
    """Why the pull processor runs a request."""

    FIRST = "first"  # as it arrived: may park it, commits the offset
    WAKE = "wake"  # re-run after an arrival: answer only if there is something to say
    FINAL = "final"  # the deadline passed: answer whatever the queue says now


_WAKE = PullMode.WAKE  # bound once: a member looked up on its class is a step per re-run

# The causes ``PullRequestHoldService.answered_by_cause`` counts answers by (metric labels).
ANSWERED_ON_MESSAGE = "message"  # a message for its queue was dispatched (or found on park)
ANSWERED_ON_RECHECK = "recheck"  # the periodic re-check found its queue grown, unannounced
ANSWERED_ON_TIMEOUT = "timeout"  # its suspend time was up


# (request, connection, mode, parsed, shared) -> the response, or None: parked (FIRST) / keep
# waiting (WAKE). ``parsed`` is what the executor gave ``park`` (its parsed request header), so
# a re-run does not parse the request again; ``shared`` is a dict made afresh for each pass
# (a wake pass, a deadline slot's expiry) and handed to every re-run of that pass: nothing
# else runs on the loop meanwhile, so the executor may keep there what holds for all of them
# (the pull processor: the pre-checks that passed, by group, topic and subscription).
PullExecutor = Callable[
    ["RemotingCommand", "Connection", PullMode, Any, dict[Any, Any]], "RemotingCommand | None"
]


@dataclass(slots=True, eq=False)
class ParkedPull:
    """One suspended pull request."""

    request: RemotingCommand
    connection: Connection
    topic: str
    queue_id: int
    queue_offset: int
    deadline: float  # event-loop time
    executor: PullExecutor  # re-runs the request (the pull processor that parked it)
    key: str  # ``topic@queueId``, RocketMQ's key for the queue's waiters
    parsed: Any = field(default=None, repr=False)  # handed back to ``executor``
    slot: int = field(default=0, repr=False)  # its deadline slot (``_deadline_slots``)


class PullRequestHoldService:
    """Parks pull requests and answers them on message arrival or at their deadline.

    Args:
        store: read for the queues' max offsets on park and on the periodic re-check.
        recheck_interval_ms: period of the safety-net re-check.
        parked_max: most requests parked at once.
    """

    def __init__(
        self,
        store: MessageStore,
        *,
        recheck_interval_ms: int = LONG_POLLING_RECHECK_INTERVAL_MS,
        parked_max: int = PULL_REQUESTS_PARKED_MAX,
    ) -> None:
        self._store = store
        self._recheck_interval_ms = recheck_interval_ms
        self.parked_max = parked_max  # public: an operator or a test may lower it live
        self._parked: dict[str, list[ParkedPull]] = {}
        self._parked_count = 0
        self._arrivals: dict[str, int] = {}
        self._pass_scheduled = False
        self._wake_follows = False  # a put is running whose ``wake_now`` runs the pass
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._recheck_task: asyncio.Task[None] | None = None
        self._running = False
        # slot number -> the parked pulls whose deadline falls in it, and the slot's timer
        self._deadline_slots: dict[int, set[ParkedPull]] = {}
        self._slot_timers: dict[int, asyncio.TimerHandle] = {}
        self._answered_on_message = 0
        self._answered_on_recheck = 0
        self._answered_on_timeout = 0

    @property
    def parked_count(self) -> int:
        """Requests parked now."""
        return self._parked_count

    @property
    def answered_by_cause(self) -> dict[str, int]:
        """Parked pulls answered so far, by what answered them (``ANSWERED_ON_*``): a message
        for the queue, the periodic re-check (a message whose arrival was not announced), or
        the pull's own timeout. Pulls dropped with their connection or answered by ``stop``
        are not counted."""
        return {ANSWERED_ON_MESSAGE: self._answered_on_message,
                ANSWERED_ON_RECHECK: self._answered_on_recheck,
                ANSWERED_ON_TIMEOUT: self._answered_on_timeout}

    async def start(self) -> None:
        """Bind to the running loop and start the periodic re-check."""
        self._bind_loop()
        self._running = True
        self._recheck_task = asyncio.get_running_loop().create_task(self._recheck_forever())

    async def stop(self) -> None:
        """Stop re-checking and answer every parked request with a final pull."""
        self._running = False
        if self._recheck_task is not None:
            self._recheck_task.cancel()
            await asyncio.gather(self._recheck_task, return_exceptions=True)
            self._recheck_task = None
        shared: dict[Any, Any] = {}
        for waiters in list(self._parked.values()):
            for parked in list(waiters):
                self._finish(parked, PullMode.FINAL, shared)
        for timer in self._slot_timers.values():
            timer.cancel()
        self._slot_timers.clear()
        self._deadline_slots.clear()

    def park(
        self,
        request: RemotingCommand,
        connection: Connection,
        topic: str,
        queue_id: int,
        queue_offset: int,
        timeout_ms: int,
        executor: PullExecutor,
        parsed: Any = None,
    ) -> bool:
        """Hold ``request`` until a message arrives after ``queue_offset`` or ``timeout_ms``;
        then ``executor`` re-runs it (WAKE or FINAL, with ``parsed`` and the pass's shared
        dict as its last arguments, ``PullExecutor``) and its answer is sent.

        Returns:
            False when ``parked_max`` requests are already parked (the caller answers
            SYSTEM_BUSY); True when parked.
        """
        if connection.is_closing:
            return True  # nobody to answer: drop it, as a close would have
        if self._parked_count >= self.parked_max:
            return False
        loop = self._loop
        if loop is None:
            loop = self._bind_loop()
        key = f"{topic}@{queue_id}"
        parked = ParkedPull(
            request, connection, topic, queue_id, queue_offset,
            loop.time() + max(timeout_ms, 0) / 1000, executor, key, parsed,
        )
        slot = parked.slot = int(parked.deadline * _SLOTS_PER_S) + 1
        due = self._deadline_slots.get(slot)
        if due is None:
            self._deadline_slots[slot] = {parked}
            if slot not in self._slot_timers:  # else kept from pulls of the slot answered before
                self._slot_timers[slot] = loop.call_at(slot / _SLOTS_PER_S, self._expire_slot,
                                                       slot)
        else:
            due.add(parked)
        waiters = self._parked.get(key)
        if waiters is None:
            self._parked[key] = [parked]
        else:
            waiters.append(parked)
        self._parked_count += 1
        # The connection's parked pulls, dropped when it closes (_connection_closed).
        connection_pulls = connection.attributes.get(_CONNECTION_ATTRIBUTE)
        if connection_pulls is None:
            connection_pulls = connection.attributes[_CONNECTION_ATTRIBUTE] = set()
            connection.on_close.append(self._connection_closed)
        connection_pulls.add(parked)
        # A message appended by another thread between the pull's read and now would have
        # found no waiter to wake; look once more so it is not missed until the re-check.
        max_offset = self._store.max_offset(topic, queue_id)
        if max_offset > queue_offset:
            self._note_arrival(key, max_offset)
        return True

    def on_message_dispatched(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Store dispatch listener: a message for ``topic@queue_id`` was dispatched.

        Safe to call from any thread; costs a dict lookup when nobody waits for the queue.
        """
        if not self._parked:
            return
        key = f"{topic}@{queue_id}"
        if key not in self._parked:
            return
        if threading.get_ident() == self._loop_thread:
            self._note_arrival(key, max_offset)
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._note_arrival, key, max_offset)

    def wake_after_put(self) -> None:
        """Say that a put on the loop thread is about to start and that ``wake_now`` follows
        it (in a ``finally``): the arrivals its dispatch notes schedule no pass of their own.
        A pass scheduled per send, run by ``wake_now`` and then called again for nothing,
        kept the loop from sleeping for one more iteration (an ``epoll_wait``) per send."""
        self._wake_follows = True

    def wake_now(self) -> None:
        """Run the pass scheduled by the dispatches so far now rather than later in this loop
        iteration (loop thread only): a send calls it after storing, before it is answered;
        it also ends a ``wake_after_put``."""
        self._wake_follows = False
        if self._arrivals:
            self._wake_pass()

    def recheck(self) -> None:
        """Re-run every parked pull whose queue has grown past its offset with no arrival
        noted for it (safety net); the answers are counted as the re-check's."""
        answered: dict[Connection, None] = {}
        shared: dict[Any, Any] = {}
        woken = 0
        for key, waiters in list(self._parked.items()):
            if not waiters:
                continue
            first = waiters[0]
            max_offset = self._store.max_offset(first.topic, first.queue_id)
            if key in self._arrivals:  # announced: the pass already due answers them
                self._note_arrival(key, max_offset)
                continue
            woken += self._wake(key, max_offset, answered, shared)
        self._answered_on_recheck += woken
        for connection in answered:
            connection.flush()

    # -- internals ----------------------------------------------------------------------------

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
        return self._loop

    def _note_arrival(self, key: str, max_offset: int) -> None:
        if max_offset > self._arrivals.get(key, -1):
            self._arrivals[key] = max_offset
        if not self._pass_scheduled and not self._wake_follows and self._loop is not None:
            self._pass_scheduled = True
            self._loop.call_soon(self._wake_pass)

    def _wake_pass(self) -> None:
        """Re-run the pulls parked on every queue that grew since the last pass; what they
        answer is sent at the pass's end (one write per connection), not at the end of the
        loop iteration.

        One write for the whole pass, not one per queue: a consumer owning several queues
        is usually woken for two or more of them by one read's sends (a producer's sends of
        one loop iteration arrive together), and a write per queue cost the broker a
        ``writev`` and the consumer a wake-up each (RESULTS.md, owner tail).
        """
        # Also the scheduled callback after wake_now ran the pass: then there is nothing left.
        self._pass_scheduled = False
        arrivals, self._arrivals = self._arrivals, {}
        answered: dict[Connection, None] = {}  # in the order first answered
        shared: dict[Any, Any] = {}  # the pass's, for every re-run (PullExecutor)
        woken = 0
        for key, max_offset in arrivals.items():
            woken += self._wake(key, max_offset, answered, shared)
        self._answered_on_message += woken
        for connection in answered:
            connection.flush()

    def _wake(self, key: str, max_offset: int, answered: dict[Connection, None],
              shared: dict[Any, Any]) -> int:
        """Re-run the pulls parked on ``key`` below ``max_offset``; the connections that got
        an answer are added to ``answered`` (the caller flushes them). Returns how many pulls
        were answered."""
        woken = 0
        for parked in list(self._parked.get(key, ())):
            if parked.queue_offset < max_offset and self._finish(parked, _WAKE, shared):
                answered[parked.connection] = None
                woken += 1
        return woken

    def _finish(self, parked: ParkedPull, mode: PullMode, shared: dict[Any, Any]) -> bool:
        """Re-run ``parked`` (``shared``: its pass's dict, ``PullExecutor``); answer and
        unpark it unless a WAKE run says keep waiting. True when an answer was written."""
        if parked.connection.is_closing:
            self._unpark(parked)
            return False
        try:
            response = parked.executor(parked.request, parked.connection, mode, parked.parsed,
                                       shared)
        except Exception as exc:
            log.exception("re-running parked %s from %s failed", parked.request.describe(),
                          parked.connection.remote_address)
            response = RemotingCommand.response_to(
                parked.request, ResponseCode.SYSTEM_ERROR, remark=describe_exception(exc)
            )
        if response is None and mode is _WAKE:
            return False
        self._unpark(parked)
        return response is not None and parked.connection.send_response(response)

    def _unpark(self, parked: ParkedPull) -> None:
        waiters = self._parked.get(parked.key)
        if waiters is None:
            return
        try:
            waiters.remove(parked)
        except ValueError:
            return  # already answered
        self._parked_count -= 1
        if not waiters:
            del self._parked[parked.key]
        due = self._deadline_slots.get(parked.slot)
        if due is not None:
            due.discard(parked)
            if not due:  # its timer is kept for the slot's next pulls (module docstring)
                del self._deadline_slots[parked.slot]
        connection_pulls = parked.connection.attributes.get(_CONNECTION_ATTRIBUTE)
        if connection_pulls is not None:
            connection_pulls.discard(parked)

    def _expire_slot(self, slot: int) -> None:
        """Answer the pulls of deadline slot ``slot`` (its end has come) with a final run."""
        self._slot_timers.pop(slot, None)
        due = self._deadline_slots.pop(slot, None)
        shared: dict[Any, Any] = {}
        timed_out = 0
        for parked in due or ():
            if self._finish(parked, PullMode.FINAL, shared):
                timed_out += 1
        self._answered_on_timeout += timed_out

    def _connection_closed(self, connection: Connection) -> None:
        pulls = connection.attributes.pop(_CONNECTION_ATTRIBUTE, set())
        for parked in list(pulls):
            self._unpark(parked)
        if pulls:
            log.debug("dropped %d parked pulls of closed connection %s", len(pulls),
                      connection.remote_address)

    async def _recheck_forever(self) -> None:
        interval_s = self._recheck_interval_ms / 1000
        while self._running:
            await asyncio.sleep(interval_s)
            try:
                self.recheck()
            except Exception:
                log.exception("long-polling re-check failed; retrying in %g s", interval_s)

"""Sends waiting for the disk (SYNC_FLUSH), on the event loop: one handoff per sync.

The store's group commit gives every append that arrived before its next sync the same
``concurrent.futures.Future`` (store/flush.py). Waiting on it with ``asyncio.wrap_future``
once per send would cost, per send, a thread-to-loop call from the flush thread (each a
write to the loop's wake-up socket, with the GIL taken again after it) and a timer. Here the
sends waiting on one store future form a group: one done-callback on the future, one
``call_soon_threadsafe`` for the group, one timer for the group.

A waiter is either an asyncio future (``durable_status``, for callers that await) or an
*answer*: a plain callable called with the status the moment the group settles
(``answer_when_durable``; the send processor writes its response there). Answers are what
keep a durable send's response from waiting behind the loop's other work: an awaiting task
is only woken by the settle (its next step queued behind every callback already ready, on a
busy broker the rest of a read's batch puts, ~0.4 ms each), and its response then waits for
the connection's cork; an answer writes at once, and the settle flushes each connection it
wrote to once, so the responses of one sync leave in one write per connection.

A group settles at the first of: the loop's turn for the flush thread's handoff, a
``settle_ready`` call that finds its store future done (the send processor calls it before
each put, so a sync that completed while the loop was storing is answered after at most one
more put rather than after every callback already queued; the broker calls it right after
the loop read the sync worker's answers, ``MessageStore.answer_syncs_on_loop``), or its
timer. Groups of one loop
settle in the order they were made, which is the order the group commit completes them.

The group's timer starts with its first waiter, so a later waiter of the same group may be
answered FLUSH_DISK_TIMEOUT up to one sync earlier than its own ``timeout_s`` (the group
lives for one sync, milliseconds, against syncFlushTimeout's seconds).

Owner: the event loop; the done-callback runs on the flush thread and only schedules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

from tidemq.store.interface import PutStatus

log = logging.getLogger("tidemq.broker")


class Flushable(Protocol):
    """What an answer wrote to: flushed once per settle (a remoting connection)."""

    def flush(self) -> None: ...


# Called with the final status when the group settles; returns what it wrote to (flushed
# once the whole group is answered) or None.
Answer = Callable[[PutStatus], "Flushable | None"]


class _Group:
    """The sends waiting on one store future."""

    __slots__ = ("_timer", "_waits", "durable", "settled", "waiters")

    def __init__(self, waits: _LoopWaits, durable: Future[PutStatus], timeout_s: float) -> None:
        self._waits = waits
        self.durable = durable
        self.waiters: list[asyncio.Future[PutStatus] | Answer] = []
        self.settled = False
        self._timer = waits.loop.call_later(timeout_s, self.settle,
                                            PutStatus.FLUSH_DISK_TIMEOUT)
        durable.add_done_callback(waits.done_in_thread)

    def settle(self, status: PutStatus) -> None:
        if self.settled:
            return
        self.settled = True
        self._timer.cancel()
        waiters, self.waiters = self.waiters, []
        written: list[Flushable] = []
        for waiter in waiters:
            if isinstance(waiter, asyncio.Future):
                if not waiter.done():  # a cancelled send
                    waiter.set_result(status)
                continue
            try:
                target = waiter(status)
            except Exception:  # one send's answer must not keep the others from theirs
                log.exception("answering a send after its sync failed")
                continue
            if target is not None and not any(target is seen for seen in written):
                written.append(target)
        for target in written:
            target.flush()


class _LoopWaits:
    """One event loop's groups, oldest first, and its handoff from the flush thread."""

    __slots__ = ("__weakref__", "by_future", "loop", "loop_thread", "order", "scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Made on the loop's thread (by a waiter's registration).
        self.loop = loop
        self.loop_thread = threading.get_ident()
        self.by_future: dict[Future[PutStatus], _Group] = {}
        self.order: deque[_Group] = deque()
        self.scheduled = False  # a handoff from the flush thread is queued on the loop

    def group(self, durable: Future[PutStatus], timeout_s: float) -> _Group:
        group = self.by_future.get(durable)
        if group is None or group.settled:
            # settled with the future still pending: the group timed out; start a new one
            # so this send gets a timer of its own.
            group = self.by_future[durable] = _Group(self, durable, timeout_s)
            self.order.append(group)
        return group

    def done_in_thread(self, durable: Future[PutStatus]) -> None:
        # On the flush thread: hand the answers to the loop, once per sync however many
        # groups (one per store future) it completed. A plain flag read and set under the
        # GIL: at worst a second, harmless handoff.
        if self.scheduled:
            return
        self.scheduled = True
        # RuntimeError: the loop is closed (the broker stopped); nobody waits any more.
        with contextlib.suppress(RuntimeError):
            if threading.get_ident() == self.loop_thread:
                # Completed on the loop (the sync worker's answers read there): no wake-up
                # of the loop needed (its reader usually settles at once, settle_ready).
                self.loop.call_soon(self.settle_ready)
            else:
                self.loop.call_soon_threadsafe(self.settle_ready)

    def settle_ready(self) -> None:
        self.scheduled = False
        order = self.order
        while order:
            group = order[0]
            if not group.settled:
                durable = group.durable
                if not durable.done():
                    return
                group.settle(_status_of(durable))
            order.popleft()
            if self.by_future.get(group.durable) is group:
                del self.by_future[group.durable]


# One registry per event loop (a process may run several brokers, each on its own loop).
_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaits] = (
    weakref.WeakKeyDictionary()
)


def _waits_of(loop: asyncio.AbstractEventLoop) -> _LoopWaits:
    waits = _loops.get(loop)
    if waits is None:
        waits = _loops[loop] = _LoopWaits(loop)
    return waits


def _status_of(durable: Future[PutStatus]) -> PutStatus:
    try:
        return durable.result(0)
    except Exception:  # a cancelled or failed future: stored, not known durable
        return PutStatus.FLUSH_DISK_TIMEOUT


def settle_ready(loop: asyncio.AbstractEventLoop) -> None:
    """Answer now every group of ``loop`` whose sync has completed (module docstring).
    Cheap when none has: one look at the oldest group."""
    waits = _loops.get(loop)
    if waits is not None and waits.order:
        waits.settle_ready()


def answer_when_durable(durable: Future[PutStatus], timeout_s: float, answer: Answer,
                        loop: asyncio.AbstractEventLoop) -> None:
    """Call ``answer(status)`` on ``loop`` with the store's answer for ``durable`` (PUT_OK
    or FLUSH_DISK_TIMEOUT), or FLUSH_DISK_TIMEOUT when it did not come within
    ``timeout_s``; at once when ``durable`` is done already. Never called twice."""
    if durable.done():
        target = answer(_status_of(durable))
        if target is not None:
            target.flush()
        return
    _waits_of(loop).group(durable, timeout_s).waiters.append(answer)


async def durable_status(durable: Future[PutStatus], timeout_s: float) -> PutStatus:
    """The store's answer for ``durable`` (PUT_OK or FLUSH_DISK_TIMEOUT), or
    FLUSH_DISK_TIMEOUT when it did not come within ``timeout_s``. Cancelling the caller
    leaves the store's future and the other waiters alone."""
    if durable.done():
        return _status_of(durable)
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[PutStatus] = loop.create_future()
    _waits_of(loop).group(durable, timeout_s).waiters.append(waiter)
    return await waiter

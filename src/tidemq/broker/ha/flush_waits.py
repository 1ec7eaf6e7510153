"""Sends waiting for the disk (SYNC_FLUSH), on the event loop: one handoff per sync.

The store's group commit gives every append that arrived before its next sync the same
``concurrent.futures.Future`` (store/flush.py). Waiting on it with ``asyncio.wrap_future``
once per send would cost, per send, a thread-to-loop call from the flush thread (each a
write to the loop's wake-up socket, with the GIL taken again after it) and a timer. Here the
sends waiting on one store future form a group: one done-callback on the future, one
``call_soon_threadsafe`` that answers every send of the group, one timer for the group.

The group's timer starts with its first waiter, so a later waiter of the same group may be
answered FLUSH_DISK_TIMEOUT up to one sync earlier than its own ``timeout_s`` (the group
lives for one sync, milliseconds, against syncFlushTimeout's seconds).

Owner: the event loop (``durable_status``); the done-callback runs on the flush thread and
only schedules.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from concurrent.futures import Future

from tidemq.store.interface import PutStatus


class _Group:
    """The sends waiting on one store future."""

    __slots__ = ("_loop", "_timer", "settled", "waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop, durable: Future[PutStatus],
                 timeout_s: float) -> None:
        self._loop = loop
        self.waiters: list[asyncio.Future[PutStatus]] = []
        self.settled = False
        self._timer = loop.call_later(timeout_s, self._settle, PutStatus.FLUSH_DISK_TIMEOUT)
        durable.add_done_callback(self._done_in_thread)

    def _done_in_thread(self, durable: Future[PutStatus]) -> None:
        # On the flush thread: hand the answer to the loop, once for the whole group.
        # RuntimeError: the loop is closed (the broker stopped); nobody waits any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._settle, _status_of(durable))

    def _settle(self, status: PutStatus) -> None:
        if self.settled:
            return
        self.settled = True
        self._timer.cancel()
        for waiter in self.waiters:
            if not waiter.done():  # a cancelled send
                waiter.set_result(status)
        self.waiters.clear()


# One group per store future still pending; the entry goes with the future.
_groups: weakref.WeakKeyDictionary[Future[PutStatus], _Group] = weakref.WeakKeyDictionary()


def _status_of(durable: Future[PutStatus]) -> PutStatus:
    try:
        return durable.result(0)
    except Exception:  # a cancelled or failed future: stored, not known durable
        return PutStatus.FLUSH_DISK_TIMEOUT


async def durable_status(durable: Future[PutStatus], timeout_s: float) -> PutStatus:
    """The store's answer for ``durable`` (PUT_OK or FLUSH_DISK_TIMEOUT), or
    FLUSH_DISK_TIMEOUT when it did not come within ``timeout_s``. Cancelling the caller
    leaves the store's future and the other waiters alone."""
    if durable.done():
        return _status_of(durable)
    loop = asyncio.get_running_loop()
    group = _groups.get(durable)
    if group is None or group.settled:
        # settled with the future still pending: the group timed out; start a new one so
        # this send gets a timer of its own.
        group = _groups[durable] = _Group(loop, durable, timeout_s)
    waiter: asyncio.Future[PutStatus] = loop.create_future()
    group.waiters.append(waiter)
    return await waiter

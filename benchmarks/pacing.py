"""The offered schedule of a fixed-rate load: message i is due at ``start + i / rate``.

A load generator offering ``rate`` messages a second from ``N`` sending coroutines has each
coroutine take the next due time, wait for it, send, and go on; a slow reply does not lower
the offered load, because the due times do not move: a coroutine that comes back late finds
its next message already due and sends it at once.

How a coroutine waits for a due time is the generator's own cost, not the measured system's,
and at 20,000 msg/s it is a large one: ``asyncio.sleep`` per message makes a future, a timer
handle and a uvloop timer (``latency_bench.py --pacing sleep``). ``Schedule`` keeps the same
due times with one timer for all the coroutines: when it fires it hands every due time to an
idle coroutine (a future each), or queues it for the next one that comes back. In process, 64
coroutines at 20,000 msg/s with a stand-in send: 14.7 -> 11.4 µs of CPU per message, the send
calls as late against their due times (RESULTS.md, client, 2026-11-27).

"Due" includes the next half millisecond: uvloop's timers round a delay to whole milliseconds,
so ``asyncio.sleep(delay)`` of less than 0.5 ms already returned in the next loop iteration and
one of 0.5-1.5 ms after one millisecond; releasing what is due within half a millisecond gives
the same send times, without spinning on timers of zero delay (``EARLY_S``).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Iterator

# A due time this close is released now (the module docstring: uvloop's timer resolution is
# 1 ms, delays rounded, so a per-message sleep of < 0.5 ms returned at once).
EARLY_S = 0.0005


def due_offsets(rate: float, seconds: float) -> Iterator[float]:
    """The schedule's due times as offsets from its start, ``i / rate`` for every i with
    ``i / rate < seconds``, in order (``ceil(rate * seconds)`` of them): for senders that
    each sleep until their own next due time (``latency_bench.py --pacing sleep``), sharing
    one iterator (``next(offsets, None)``, None once it is exhausted).

    Each offset is computed from its index, not by adding ``1 / rate`` to the one before:
    the sum's rounding error piles up over a run and let one due time more slip in before
    ``seconds``.

    Raises:
        ValueError: ``rate`` is not above 0.
    """
    if rate <= 0:
        raise ValueError(f"rate is {rate} messages a second; it must be above 0")
    # float(): an int's __gt__ against a float offset is NotImplemented (truthy), not False.
    return itertools.takewhile(float(seconds).__gt__,
                               map(float(rate).__rtruediv__, itertools.count()))


class Schedule:
    """Due times ``start + i / rate`` for every i with ``i / rate < seconds``,
    each handed to exactly one caller of ``take``/``wait``, in order, never more than
    ``EARLY_S`` before it is due (by ``time.perf_counter``).

    The sending coroutine's loop::

        slot = schedule.take()          # a due time already released, or None
        if slot is None:
            if schedule.finished:
                return
            slot = await schedule.wait()   # None: the schedule ended while waiting
            if slot is None:
                return
        ...send, stamped at the send call...
    """

    def __init__(self, rate: float, seconds: float,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        if rate <= 0:
            raise ValueError(f"rate is {rate} messages a second; it must be above 0")
        self._loop = loop or asyncio.get_running_loop()
        self._rate = rate
        self._seconds = seconds
        self._index = 0  # of the next due time to release
        self._due: collections.deque[float] = collections.deque()  # released, not yet taken
        self._idle: collections.deque[asyncio.Future[float | None]] = collections.deque()
        self.finished = False  # every due time released (some may still wait in take())
        self.started_s = 0.0

    def start(self) -> float:
        """Start the schedule now; returns its start (``perf_counter`` seconds)."""
        self.started_s = time.perf_counter()
        self._release()
        return self.started_s

    def take(self) -> float | None:
        """The oldest released due time nobody has taken yet, or None."""
        return self._due.popleft() if self._due else None

    def wait(self) -> asyncio.Future[float | None]:
        """A future of the caller's next due time (None once the schedule has ended)."""
        waiter: asyncio.Future[float | None] = self._loop.create_future()
        if self.finished:
            waiter.set_result(None)
        else:
            self._idle.append(waiter)
        return waiter

    def _release(self) -> None:
        # Due times as offsets from the start, i / rate: no error piles up over a long run,
        # and the last one is the last i with i / rate < seconds.
        started_s, rate, seconds = self.started_s, self._rate, self._seconds
        elapsed_s = time.perf_counter() - started_s
        due_by = elapsed_s + EARLY_S
        index = self._index
        offset = index / rate
        idle, due = self._idle, self._due
        while offset <= due_by and offset < seconds:
            while idle and idle[0].done():  # a waiter cancelled (its sender stopped)
                idle.popleft()
            if idle:
                idle.popleft().set_result(started_s + offset)
            else:
                due.append(started_s + offset)
            index += 1
            offset = index / rate
        self._index = index
        if offset < seconds:
            self._loop.call_later(offset - elapsed_s, self._release)
            return
        self.finished = True
        while idle:
            waiter = idle.popleft()
            if not waiter.done():
                waiter.set_result(None)

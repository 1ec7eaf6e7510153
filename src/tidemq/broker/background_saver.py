"""Saving a config table off the request path: group commit, one save at a time.

Writing topics.json on every change costs the whole table and three fsyncs (``.tmp``,
``.bak``, the directory) on the event loop: at thousands of topics every create paid tens
of milliseconds, and creating the 10,000th topic cost a hundred times the 100th. A
``BackgroundSaver`` saves the table in a worker thread, one save at a time; every change made
while a save runs goes into the next one.

Two kinds of change:

- acknowledged ones (an admin's UPDATE_AND_CREATE_TOPIC, a subscription group's update or
  delete) ``await saved()``: it returns once a save that began after the call -- so one
  holding the change -- is durable (written, fsync'd, renamed, directory fsync'd), or raises
  that save's error. Waiters start the next save at once, and every waiter that arrived
  while a save was running shares the next one: like the commit log's SYNC_FLUSH group
  commit, a burst of N concurrent creates costs a few saves, not N (RocketMQ saves on each
  update and answers after it; a crash loses no acknowledged change);
- internal ones (a retry topic or a group auto-created by a heartbeat) only ``schedule()``:
  they ride the next save, at most ``interval_s`` later when nobody waits. A crash within that
  time can lose them from the file (the client's next heartbeat creates them again); ``stop``
  saves them, so a clean stop loses nothing.

Owner: the event loop. ``snapshot`` runs on the loop (it must be cheap: take the bytes or a
copy), ``write`` in a worker thread; the config file serializes writers and skips a save
older than the one written (``store.config_file``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger("tidemq.broker")

S = TypeVar("S")

# Saves at most this often while changes keep coming (a burst of creates costs a few saves).
SAVE_INTERVAL_S = 0.1


@dataclass(frozen=True, slots=True)
class TableSnapshot:
    """A table file's bytes and the number of changes they hold (it only counts up, so the
    config file can skip a save older than the one it wrote)."""

    version: int
    data: bytes


class BackgroundSaver(Generic[S]):
    """Saves a table in the background whenever ``schedule`` was called since the last save.

    Args:
        snapshot: on the loop, the state to write, or None when nothing changed.
        write: in a worker thread, writes a snapshot (raises on failure: it is logged and
            retried with the next save).
        what: how log lines name the table.
        interval_s: the shortest time between two saves.
    """

    def __init__(self, snapshot: Callable[[], S | None], write: Callable[[S], object],
                 what: str, interval_s: float = SAVE_INTERVAL_S) -> None:
        self._snapshot = snapshot
        self._write = write
        self._what = what
        self._interval_s = interval_s
        self._changed = asyncio.Event()
        # Set when someone awaits ``saved``: the pause between saves ends at once.
        self._urgent = asyncio.Event()
        # Futures of ``saved`` callers whose change no save has taken a snapshot of yet.
        self._waiters: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._task is not None

    def start(self) -> None:
        """Start the saving task on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"tidemq-save-{self._what}")

    def schedule(self) -> None:
        """Note a change; the next save writes it. Never blocks."""
        self._changed.set()

    async def saved(self) -> None:
        """Return when a save holding every change made before this call is durable.

        Waiters that arrive while a save runs share the next save (group commit). When the
        saver is not running (before ``start``, after ``stop``), the save runs now.

        Raises:
            StoreFull, StoreError (or whatever ``write`` raised): that save failed; every
            waiter of it gets the same error, and the table stays dirty for the next save.
        """
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if self._task is None:
            await self._save_once()
        else:
            self._changed.set()
            self._urgent.set()
        await waiter

    async def stop(self) -> None:
        """Stop the task and save what changed since the last save (errors are logged and
        given to any waiter)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._save_once()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._changed.wait()
            started = loop.time()
            await self._save_once()
            pause = self._interval_s - (loop.time() - started)
            if pause > 0 and not self._waiters:
                # Unacknowledged changes wait out the interval; a ``saved`` caller ends it.
                self._urgent.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), pause)

    async def _save_once(self) -> None:
        self._changed.clear()  # changes from here on go into the next save
        # The snapshot below holds every change made before these waiters arrived.
        waiters, self._waiters = self._waiters, []
        try:
            snapshot = self._snapshot()
            if snapshot is not None:
                await asyncio.to_thread(self._write, snapshot)
        except asyncio.CancelledError:
            # ``stop`` cancelled us mid-save: its final save answers these waiters.
            self._waiters[:0] = waiters
            raise
        except Exception as exc:  # the table stays dirty: the next change or stop retries
            log.error("saving %s failed: %s; retrying with the next change", self._what, exc)
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(exc)
            return
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

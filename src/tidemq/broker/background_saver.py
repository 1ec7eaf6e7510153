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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from tidemq.store.config_file import ConfigFile

log = logging.getLogger("tidemq.broker")

S = TypeVar("S")

# Saves at most this often while changes keep coming (a burst of creates costs a few saves).
SAVE_INTERVAL_S = 0.1


@dataclass(frozen=True, slots=True)
class TableSnapshot:
    """A table file's bytes (as pieces written one after another) and the number of changes
    they hold (it only counts up, so the config file can skip a save older than the one it
    wrote)."""

    version: int
    data: Sequence[bytes | memoryview]


class _JsonTable(Protocol):
    def file_parts(self) -> list[bytes | memoryview]: ...


class SavedConfigTable:
    """The saving half of a config table manager (topics.json, subscriptionGroup.json):
    each change is written at once on the caller's thread, or, after ``defer_persistence``,
    left to a ``BackgroundSaver`` that writes through ``snapshot_if_dirty`` and
    ``write_snapshot``.

    A subclass sets ``_file`` and ``_table`` and calls ``_init_saves`` before its first
    change, then ``_count_change`` on every change.
    """

    _file: ConfigFile
    _table: _JsonTable

    def _init_saves(self) -> None:
        self._persist_soon: Callable[[], None] | None = None
        self._wait_saved: Callable[[], Awaitable[None]] | None = None
        # Changes counted here, not by the table's DataVersion: a slave takes its master's
        # version, which may be lower, and the file skips saves older than what it holds.
        self._changes = 0
        self._changes_persisted = -1

    def defer_persistence(
        self,
        persist_soon: Callable[[], None] | None,
        wait_saved: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """From now on a change calls ``persist_soon`` (a background saver's ``schedule``)
        instead of writing the file on the caller's thread, and ``saved`` awaits
        ``wait_saved`` (the saver's ``saved``); None writes at once again. The saver writes
        through ``snapshot_if_dirty`` and ``write_snapshot``."""
        self._persist_soon = persist_soon
        self._wait_saved = wait_saved if persist_soon is not None else None

    async def saved(self) -> None:
        """Return when the file durably holds every change made so far (group commit with
        the other callers when a background saver writes the file).

        Raises:
            StoreFull, StoreError: the save failed; the message names the file. The change
                stays in memory and is saved again with the next save.
        """
        if self._wait_saved is not None:
            await self._wait_saved()
        else:
            self._write_if_dirty()  # written at the change already, unless that write failed

    def snapshot_if_dirty(self) -> TableSnapshot | None:
        """The file's bytes to write now, or None when the file holds the table already."""
        if self._changes == self._changes_persisted:
            return None
        return TableSnapshot(self._changes, self._table.file_parts())

    def write_snapshot(self, snapshot: TableSnapshot) -> None:
        """Write a snapshot atomically (may run in a worker thread; an older one than the
        file holds is skipped).

        Raises:
            StoreFull, StoreError: the write failed; the table stays dirty.
        """
        if self._file.save(snapshot.data, version=snapshot.version):
            self._changes_persisted = snapshot.version

    def _count_change(self) -> None:
        """Record a change: write the file now, or have the background saver write it soon.

        Raises:
            StoreFull, StoreError: the write failed (the change stays in memory).
        """
        self._changes += 1
        if self._persist_soon is None:
            self._write_if_dirty()
        else:
            self._persist_soon()

    def _write_if_dirty(self) -> None:
        snapshot = self.snapshot_if_dirty()
        if snapshot is not None:
            self.write_snapshot(snapshot)


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

"""Saving a config table off the request path: changes coalesce into one save at a time.

Writing topics.json on every change costs the whole table and three fsyncs (``.tmp``,
``.bak``, the directory) on the event loop: at thousands of topics every create paid tens
of milliseconds, and creating the 10,000th topic cost a hundred times the 100th. A
``BackgroundSaver`` is told "changed" (``schedule``, a flag: never blocks), and its task
saves the table in a worker thread, one save at a time, at most every ``interval_s``: all
changes made meanwhile go into the next save. ``stop`` waits for a final save, so a clean
shutdown writes every change.

What this gives up: a crash (not a clean stop) within ``interval_s`` plus one save's time of
a change loses that change from the file. For topics, RocketMQ writes topics.json without
syncing it at all, so a power loss can lose more there.

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

    async def stop(self) -> None:
        """Stop the task and save what changed since the last save (errors are logged)."""
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
            await asyncio.sleep(max(0.0, self._interval_s - (loop.time() - started)))

    async def _save_once(self) -> None:
        self._changed.clear()  # changes from here on go into the next save
        snapshot = self._snapshot()
        if snapshot is None:
            return
        try:
            await asyncio.to_thread(self._write, snapshot)
        except Exception as exc:  # the table stays dirty: the next change or stop retries
            log.error("saving %s failed: %s; retrying with the next change", self._what, exc)

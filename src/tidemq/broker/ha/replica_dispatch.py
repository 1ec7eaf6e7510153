"""The slave's dispatch of replicated bytes, behind the copy (RocketMQ's ReputMessageService).

The HA client (slave.py) writes the master's bytes into the commit log and reports its new
write end at once: that is what a SYNC_MASTER waits for, the bytes are on the slave. This
task makes them readable: it verifies and dispatches the whole records (consume queues,
index; store/replication.py) in slices of ``DISPATCH_SLICE_BYTES``, yielding to the event
loop between slices. So a slave far behind (one started from an empty disk) copies at the
speed of the network and its disk, not of the Python dispatch (each turn of the loop reads
more than one slice), and no slice holds the loop for long.

Readers see records once dispatched; ``behind_bytes`` (brokerStatus' dispatchBehindBytes)
says how far the dispatch is behind the copy. ``stop`` dispatches everything left first (a
slave promoted to master appends after the last dispatched record).

Bytes that are no record (``ReplicaCorrupt``) stop the dispatch; ``failure`` holds the
error for the HA client, which then stops copying (slave.py, step 4).

Owner: the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Protocol

from tidemq.errors import StoreError
from tidemq.store.replication import ReplicaCorrupt

log = logging.getLogger("tidemq.broker.ha")

# A slice is ~2.5 ms of CPU for 1 KiB records (smaller slices cost more: 64 KiB ones 15 %
# more CPU per byte, measured); between two slices the loop turns TURNS_BETWEEN_SLICES
# times, and each turn the HA client reads what arrived (its reader holds up to ~256 KiB),
# so a slave behind copies several times faster than it dispatches: the copy is what a
# SYNC_MASTER waits for and what survives the master's disk.
DISPATCH_SLICE_BYTES = 256 * 1024
TURNS_BETWEEN_SLICES = 4


class DispatchedStore(Protocol):
    """What the dispatch needs of the slave's store (a ``StoreCore`` has it)."""

    def commit_log_max_offset(self) -> int: ...

    def dispatch_replicated(self, max_bytes: int | None = None) -> int: ...

    def replicated_confirmed_offset(self) -> int: ...

    def replicated_oldest_timestamp(self) -> int: ...


class ReplicaDispatcher:
    """Dispatches what the HA client copied, in slices, on the event loop.

    Args:
        store: the slave's store.
        lag_samples_ms: where each slice that made records readable adds "now" minus the
            store time of its oldest record (the HA client's brokerStatus samples).
    """

    def __init__(self, store: DispatchedStore, lag_samples_ms: deque[int]) -> None:
        self._store = store
        self._lag_samples_ms = lag_samples_ms
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failure: ReplicaCorrupt | None = None

    @property
    def behind_bytes(self) -> int:
        """Copied bytes not dispatched yet (a record cut by the end of what arrived too)."""
        store = self._store
        return max(0, store.commit_log_max_offset() - store.replicated_confirmed_offset())

    def start(self) -> None:
        """Start the task (returns at once)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="tidemq-ha-dispatch")

    def wake(self) -> None:
        """New bytes were copied: dispatch them soon."""
        self._wanted.set()

    async def stop(self) -> None:
        """Stop the task, then dispatch every whole record copied so far (still in slices,
        the loop running between them); nothing more once the dispatch has failed."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._dispatch_all()

    async def settle(self) -> None:
        """Return once every whole record copied so far is dispatched (or the dispatch has
        failed): before the log is truncated, which expects a dispatched log."""
        await self._dispatch_all()

    async def _run(self) -> None:
        while self.failure is None:
            await self._wanted.wait()
            self._wanted.clear()
            if not await self._dispatch_all():
                return

    async def _dispatch_all(self) -> bool:
        """Dispatch slice after slice until nothing is left; False once it cannot go on."""
        if self.failure is not None:
            return False
        try:
            while True:
                before = self._store.replicated_confirmed_offset()
                confirmed = self._dispatch(DISPATCH_SLICE_BYTES)
                if confirmed == before or confirmed >= self._store.commit_log_max_offset():
                    return True  # all done, or a record waits for the rest of its bytes
                for _ in range(TURNS_BETWEEN_SLICES):  # the copy goes on between slices
                    await asyncio.sleep(0)
        except ReplicaCorrupt as e:
            self.failure = e
        except StoreError as e:  # the store is closing: recovery dispatches at the next start
            log.warning("slave dispatch stopped: %s", e)
        return False

    def _dispatch(self, max_bytes: int | None) -> int:
        store = self._store
        confirmed = store.dispatch_replicated(max_bytes)
        oldest = store.replicated_oldest_timestamp()
        if oldest:
            self._lag_samples_ms.append(max(0, int(time.time() * 1000) - oldest))
        return confirmed

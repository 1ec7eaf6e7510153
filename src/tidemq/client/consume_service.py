"""Handing pulled messages to the listener: concurrently, or in queue order.

Theory of operation
-------------------
The pull loop of each queue puts what it pulled into the queue's ``ProcessQueue`` and calls
``submit``. From there:

**Concurrent** (``ConcurrentConsumeService``, RocketMQ's ConsumeMessageConcurrentlyService).
Messages are cut into batches of ``batch_size`` and consumed in any order, several at once:

- a plain-function listener on the event loop (the fast path) is called right where the
  pulled chunk is handed over, batch after batch, without a task, a thread hop or a queue in
  between (a task per chunk cost a loop iteration's wait and as much CPU as the listener
  call of a small chunk); only what must be awaited (a listener that returned an awaitable,
  a failed batch to send back) goes on in a task of its own;
- a coroutine listener, or a plain one in a thread pool, is fed through a queue served by
  ``concurrency`` workers: at most that many listener calls run at once.

A batch that succeeds leaves the ProcessQueue and the queue's offset (the smallest still in
flight) is remembered for the next commit. A batch that fails is sent back to the broker for
a later retry (clustering, ``send_back``) and then leaves too; what cannot be sent back stays
in flight and is consumed again locally after ``local_retry_delay_ms``. A broadcasting
consumer has no retry topic: it logs and drops failures, as RocketMQ does.

**Orderly** (``OrderlyConsumeService``, ConsumeMessageOrderlyService). One task per queue
consumes from the front of the ProcessQueue, one batch at a time, and only while the broker
lock of the queue is held (clustering). A failed batch is not skipped: the task waits
``suspend_ms`` and gives the same messages (their ``reconsume_times`` counted up) to the
listener again. A message that failed ``max_reconsume_times`` times goes to the dead letters
(``%DLQ%<group>``) and the queue moves on; if even that fails, the queue keeps retrying.

A queue taken away by a rebalance is marked dropped: queued batches of it are skipped (the
new owner consumes them), running ones finish, and no offset is remembered for it any more.
Everything runs on the consumer's event loop; nothing is locked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tidemq.client.listener import ConsumeResult, ListenerInvoker
from tidemq.client.offset_store import OffsetStore
from tidemq.client.process_queue import ProcessQueue
from tidemq.client.send_back import SendBack
from tidemq.protocol.message import MessageExt

log = logging.getLogger("tidemq.client")

# RocketMQ re-submits messages it could not send back after 5 s.
LOCAL_RETRY_DELAY_MS = 5000
# An orderly queue whose lock is not held yet is looked at again this often.
LOCK_RETRY_INTERVAL_S = 0.5
_SUCCESS = ConsumeResult.SUCCESS


@dataclass(slots=True)
class PushStats:
    """Counters of one push consumer (cumulative since start).

    Attributes:
        pulls: pull requests answered.
        messages_pulled: messages pulled and handed to consumption.
        messages_filtered: messages the broker sent that the client's tag filter dropped
            (the broker filters by tag hash, so only hash collisions count here).
        consumed: messages whose listener call succeeded.
        failed: messages whose listener call failed (each failure counts).
        sent_back: failed messages the broker took back for a retry (or the dead letters).
        resent: failed messages re-sent to the retry topic because the send-back failed.
        dead_lettered: messages an orderly consumer sent to the dead letters.
        local_retries: failed messages kept in flight to be consumed again locally.
    """

    pulls: int = 0
    messages_pulled: int = 0
    messages_filtered: int = 0
    consumed: int = 0
    failed: int = 0
    sent_back: int = 0
    resent: int = 0
    dead_lettered: int = 0
    local_retries: int = 0


@dataclass(slots=True)
class ConsumeSettings:
    """What the consume services need to know of their consumer."""

    group: str
    batch_size: int
    clustering: bool
    max_reconsume_times: int
    suspend_ms: int = 1000
    local_retry_delay_ms: int = LOCAL_RETRY_DELAY_MS
    concurrency: int = 20
    stats: PushStats = field(default_factory=PushStats)


class ConcurrentConsumeService:
    """Consumes batches in any order, several at once (see the module docstring).

    Args:
        settings: group, batch size, model and limits.
        invoker: calls the listener.
        offset_store: where consumed offsets are remembered.
        send_back: hands failed messages back (clustering).
    """

    def __init__(self, settings: ConsumeSettings, invoker: ListenerInvoker,
                 offset_store: OffsetStore, send_back: SendBack) -> None:
        self._settings = settings
        self._stats = settings.stats
        self._invoker = invoker
        self._offset_store = offset_store
        self._send_back = send_back
        self._tasks: set[asyncio.Task[None]] = set()
        self._retries: set[asyncio.Task[None]] = set()
        self._queue: asyncio.Queue[tuple[ProcessQueue, list[MessageExt]]] | None = None
        self._queued = 0  # batches put in the queue and not finished yet
        self._workers: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the workers (not needed for a listener called on the loop)."""
        if self._invoker.inline or self._queue is not None:
            return
        # No maxsize: what it holds is already bounded by the pull loops' flow control
        # (pull_threshold_for_queue messages per owned queue), and submit must not block.
        self._queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self._workers = [loop.create_task(self._work(), name=f"tidemq-consume-{i}")
                         for i in range(self._settings.concurrency)]

    def submit(self, process_queue: ProcessQueue, messages: list[MessageExt]) -> None:
        """Consume ``messages`` (already put in ``process_queue``) now (a listener called on
        the loop) or soon."""
        if self._queue is None:
            self._consume_now(process_queue, messages)
            return
        size = self._settings.batch_size
        put = self._queue.put_nowait
        if size == 1:
            for message in messages:
                put((process_queue, [message]))
            self._queued += len(messages)
        else:
            for start in range(0, len(messages), size):
                put((process_queue, messages[start:start + size]))
                self._queued += 1

    def _consume_now(self, process_queue: ProcessQueue, messages: list[MessageExt]) -> None:
        """Call the on-loop listener batch after batch here; from the first batch whose
        outcome must be awaited (or sent back) on, the rest goes on in a task."""
        call = self._invoker.call_inline
        size = self._settings.batch_size
        batches = ([[message] for message in messages] if size == 1 else
                   [messages[start:start + size] for start in range(0, len(messages), size)])
        done: list[MessageExt] = []
        for index, batch in enumerate(batches):
            if process_queue.dropped:
                break  # not ours any more; the new owner consumes the rest
            outcome = call(batch)
            if outcome is _SUCCESS:
                done.extend(batch)
                continue
            task = asyncio.get_running_loop().create_task(
                self._consume_inline(process_queue, batches[index:], outcome))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            break
        if done:
            self._completed(process_queue, done)

    async def _consume_inline(self, process_queue: ProcessQueue,
                              batches: list[list[MessageExt]],
                              first_outcome: ConsumeResult | Awaitable[Any]) -> None:
        """Finish ``batches`` whose first was called already and answered ``first_outcome``
        (not a plain SUCCESS), calling the listener for the others."""
        invoker = self._invoker
        call = invoker.call_inline
        done: list[MessageExt] = []
        try:
            for index, batch in enumerate(batches):
                if process_queue.dropped:
                    return  # not ours any more; the new owner consumes the rest
                outcome = call(batch) if index else first_outcome
                if outcome is _SUCCESS:
                    done.extend(batch)
                    continue
                if not isinstance(outcome, ConsumeResult):
                    outcome = await invoker.finish(outcome, batch)
                if outcome is _SUCCESS:
                    done.extend(batch)
                else:
                    await self._failed(process_queue, batch)
        finally:
            if done:
                self._completed(process_queue, done)

    async def _work(self) -> None:
        assert self._queue is not None
        queue = self._queue
        invoker = self._invoker
        while True:
            process_queue, batch = await queue.get()
            try:
                if process_queue.dropped:
                    continue
                outcome = await invoker.call(batch)
                if outcome is _SUCCESS:
                    self._completed(process_queue, batch)
                else:
                    await self._failed(process_queue, batch)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not stop the worker
                log.exception("consumer %s: consuming a batch of %s failed",
                              self._settings.group, process_queue.queue)
            finally:
                self._queued -= 1

    def _completed(self, process_queue: ProcessQueue, messages: list[MessageExt]) -> None:
        offset = process_queue.remove(messages)
        self._stats.consumed += len(messages)
        if not process_queue.dropped and offset >= 0:
            self._offset_store.update(process_queue.queue, offset)

    async def _failed(self, process_queue: ProcessQueue, batch: list[MessageExt]) -> None:
        settings = self._settings
        self._stats.failed += len(batch)
        if not settings.clustering:
            log.warning("consumer %s (broadcasting): %d message(s) of %s failed and are "
                        "dropped (a broadcasting consumer does not retry)", settings.group,
                        len(batch), process_queue.queue)
            self._forget(process_queue, batch)
            return
        if process_queue.dropped:
            return  # the queue's new owner consumes them again from the committed offset
        handed_back, kept = await self._send_back.send_all(batch)
        if handed_back:
            self._forget(process_queue, handed_back)
        if kept:
            self._stats.local_retries += len(kept)
            for message in kept:
                message.reconsume_times += 1
            task = asyncio.get_running_loop().create_task(
                self._retry_locally(process_queue, kept))
            self._retries.add(task)
            task.add_done_callback(self._retries.discard)

    def _forget(self, process_queue: ProcessQueue, messages: list[MessageExt]) -> None:
        offset = process_queue.remove(messages)
        if not process_queue.dropped and offset >= 0:
            self._offset_store.update(process_queue.queue, offset)

    async def _retry_locally(self, process_queue: ProcessQueue,
                             messages: list[MessageExt]) -> None:
        await asyncio.sleep(self._settings.local_retry_delay_ms / 1000)
        if not process_queue.dropped:
            self.submit(process_queue, messages)

    def busy(self) -> bool:
        """True while a listener call is queued or running (local retries waiting for their
        time do not count: their messages stay uncommitted and come again)."""
        return bool(self._tasks) or self._queued > 0

    async def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for queued and running listener calls; True if none left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.busy():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=remaining)
            else:
                await asyncio.sleep(min(0.05, remaining))
        return True

    async def stop(self) -> None:
        """Cancel workers, running calls and pending local retries."""
        tasks = list(self._tasks) + list(self._retries) + self._workers
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._workers = []


EnsureLocked = Callable[[ProcessQueue], Awaitable[bool]]


class OrderlyConsumeService:
    """Consumes each queue in order, one batch at a time (see the module docstring).

    Args:
        settings: group, batch size, model and limits.
        invoker: calls the listener.
        offset_store: where consumed offsets are remembered.
        send_back: sends messages that used up their retries to the dead letters.
        ensure_locked: True when the queue's broker lock is held (tries to take it when
            not); None for broadcasting, which needs no lock.
    """

    def __init__(self, settings: ConsumeSettings, invoker: ListenerInvoker,
                 offset_store: OffsetStore, send_back: SendBack,
                 ensure_locked: EnsureLocked | None) -> None:
        self._settings = settings
        self._stats = settings.stats
        self._invoker = invoker
        self._offset_store = offset_store
        self._send_back = send_back
        self._ensure_locked = ensure_locked
        self._tasks: dict[ProcessQueue, asyncio.Task[None]] = {}

    def start(self) -> None:
        """Nothing to start: consume tasks start with the first messages of each queue."""

    def submit(self, process_queue: ProcessQueue, messages: list[MessageExt]) -> None:
        """Make sure the queue's consume task runs (it takes messages from the queue)."""
        del messages  # the task takes them from the ProcessQueue, in order
        if process_queue.consuming or process_queue.dropped:
            return
        process_queue.consuming = True
        task = asyncio.get_running_loop().create_task(
            self._run(process_queue), name=f"tidemq-orderly-{process_queue.queue}")
        self._tasks[process_queue] = task

    def task_of(self, process_queue: ProcessQueue) -> asyncio.Task[None] | None:
        """The running consume task of ``process_queue``, or None."""
        return self._tasks.get(process_queue)

    async def _run(self, process_queue: ProcessQueue) -> None:
        settings = self._settings
        try:
            while not process_queue.dropped:
                if self._ensure_locked is not None and not await self._ensure_locked(
                        process_queue):
                    await asyncio.sleep(LOCK_RETRY_INTERVAL_S)
                    continue
                batch = process_queue.take(settings.batch_size)
                if not batch:
                    return
                outcome = await self._invoker.call(batch)
                if outcome is _SUCCESS:
                    self._commit(process_queue, batch)
                    self._stats.consumed += len(batch)
                    continue
                self._stats.failed += len(batch)
                if process_queue.dropped:
                    return
                if not await self._after_failure(process_queue, batch):
                    await asyncio.sleep(settings.suspend_ms / 1000)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("consumer %s: orderly consumption of %s stopped by a bug",
                          settings.group, process_queue.queue)
        finally:
            process_queue.consuming = False
            self._tasks.pop(process_queue, None)

    async def _after_failure(self, process_queue: ProcessQueue,
                             batch: list[MessageExt]) -> bool:
        """Handle a failed batch; True when the queue may go on at once (nothing to retry)."""
        settings = self._settings
        exhausted = [m for m in batch if m.reconsume_times >= settings.max_reconsume_times]
        gone: list[MessageExt] = []
        if exhausted:
            if settings.clustering:
                gone, _ = await self._send_back.send_all(exhausted, dead_letter=True)
                self._stats.dead_lettered += len(gone)
            else:
                log.warning("consumer %s (broadcasting): %d message(s) of %s failed %d times "
                            "and are dropped", settings.group, len(exhausted),
                            process_queue.queue, settings.max_reconsume_times + 1)
                gone = exhausted
            if gone:
                self._commit(process_queue, gone)
        gone_ids = {id(m) for m in gone}
        retried = [m for m in batch if id(m) not in gone_ids]
        for message in retried:
            message.reconsume_times += 1
        return not retried

    def _commit(self, process_queue: ProcessQueue, messages: list[MessageExt]) -> None:
        # Also for a queue being dropped: its release waits for this task and commits after.
        offset = process_queue.remove(messages)
        if offset >= 0:
            self._offset_store.update(process_queue.queue, offset)

    def busy(self) -> bool:
        """True while a consume task runs."""
        return bool(self._tasks)

    async def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the consume tasks; True if none is left."""
        if not self._tasks:
            return True
        _, pending = await asyncio.wait(set(self._tasks.values()), timeout=timeout_s)
        return not pending

    async def stop(self) -> None:
        """Cancel the consume tasks."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

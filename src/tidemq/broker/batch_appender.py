"""The batch sends of one event-loop iteration, appended to the store together.

A producer with many batch requests in flight has several in each read (16 in flight, 64 x
1 KiB each: three or four per 256 KiB read), and each read's requests are served by tasks
that all run in the same loop iteration. Each batch used to be its own store append: its
own lock, commit-log write, consume-queue put, index put (its keys hashed apart from the
others'), group-commit request and result. Here ``put`` only queues the checked and shaped
batch and returns a future; at the end of the iteration, once every task of the reads has
queued its batches, ``flush`` appends them all with one ``MessageStore.put_batches`` (one
write, one index put; each batch keeps its own queue offsets, msg ids and result) and
answers each future. The sends are answered one iteration later, which costs a loop wake-up
at most; a lone batch costs the future and that hop (a few microseconds against the
hundreds its append takes).

Order: batches are appended in the order ``put`` took them, which is the order their
requests were served. Whoever writes to the store for a send directly (single sends, the
exactly-once and dict paths) calls ``flush`` first, so the sends of one iteration reach the
store in the order they were served whatever their kind.

Under SYNC_FLUSH (``chunk_messages``) the iteration's batches are appended a chunk at a
time, the loop turning between chunks: each chunk's append asks for its own sync, so the
disk syncs the first chunk while the loop appends the next, and the sends of a synced chunk
are answered between two chunks (the sync worker's answer is read in that turn). Appended
all at once, a producer's whole window (16 requests of 64 x 1 KiB: ~4 ms of appending) went
to the disk as one sync after the last batch, the disk idle while the loop appended and the
loop idle while the disk synced and the producer answered: a convoy that kept going round.

Everything runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidemq.store.interface import PutResult, PutStatus

if TYPE_CHECKING:
    from tidemq.broker.runtime_info import BrokerStats
    from tidemq.store.interface import MessageBatch, MessageStore

# SYNC_FLUSH: messages appended per chunk (module docstring): four of a producer's 64-message
# batches, ~1 ms of appending, about one fdatasync on the volume measured (RESULTS.md).
SYNC_CHUNK_MESSAGES = 256


class BatchAppender:
    """Queues batches for one ``put_batches`` at the end of the loop iteration.

    Args:
        store: where the batches are appended.
        stats: a put latency per append, the messages and bytes per batch.
        refusal: why writes are not taken now (a role switch since the batches' requests
            were checked), or None; asked at each append. A refusal answers every queued
            batch SERVICE_NOT_AVAILABLE with it, and nothing is written.
        appended: called after each append, before any of its sends is answered (the
            broker answers the long polls the append woke first).
        chunk_messages: at the end of an iteration, append batches a chunk of about this
            many messages at a time, the loop turning between chunks (module docstring;
            SYNC_FLUSH); None: all of them at once.
    """

    def __init__(self, store: MessageStore, stats: BrokerStats,
                 refusal: Callable[[], str | None] = lambda: None,
                 appended: Callable[[], None] = lambda: None,
                 chunk_messages: int | None = None) -> None:
        self._store = store
        self._stats = stats
        self._refusal = refusal
        self._appended = appended
        self._chunk_messages = chunk_messages
        self._pending: list[tuple[MessageBatch, asyncio.Future[PutResult]]] = []

    def put(self, batch: MessageBatch, loop: asyncio.AbstractEventLoop
            ) -> asyncio.Future[PutResult]:
        """Queue ``batch``; the future resolves to its ``PutResult`` once appended (or to
        the exception the store raised). Called on ``loop``, the running loop (given: on
        Python 3.11 asking asyncio for it is a system call)."""
        if not self._pending:
            if self._chunk_messages is None:
                loop.call_soon(self.flush)
            else:
                loop.call_soon(self._flush_chunk, loop)
        future: asyncio.Future[PutResult] = loop.create_future()
        self._pending.append((batch, future))
        return future

    def _flush_chunk(self, loop: asyncio.AbstractEventLoop) -> None:
        # The queued batches up to chunk_messages (at least one), then the loop's turn
        # before the next chunk (module docstring). Batches queued meanwhile join the queue.
        pending = self._pending
        if not pending:
            return
        limit = self._chunk_messages or 0
        taken = messages = 0
        while taken < len(pending) and (taken == 0 or messages < limit):
            messages += len(pending[taken][0].bodies)
            taken += 1
        self._pending = pending[taken:]
        self._append(pending[:taken])
        if self._pending:
            loop.call_soon(self._flush_chunk, loop)

    def flush(self) -> None:
        """Append every queued batch now, in order, and answer their futures."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        self._append(pending)

    def _append(self, pending: list[tuple[MessageBatch, asyncio.Future[PutResult]]]) -> None:
        refusal = self._refusal()
        if refusal is not None:
            for _, future in pending:
                self._stats.record_put_failure()
                if not future.done():
                    future.set_result(PutResult(PutStatus.SERVICE_NOT_AVAILABLE, refusal))
            return
        started = time.monotonic()
        try:
            results = self._store.put_batches([batch for batch, _ in pending])
        except Exception as exc:  # answered as the handler's failure (SYSTEM_ERROR)
            for _, future in pending:
                if not future.done():
                    future.set_exception(exc)
            return
        self._appended()
        elapsed_s = time.monotonic() - started
        elapsed_ms = int(elapsed_s * 1000)
        stats = self._stats
        stats.record_put_latency(elapsed_s)
        for (batch, future), result in zip(pending, results, strict=True):
            stats.record_put_result(result, result.message_count, elapsed_ms, batch.topic)
            if not future.done():  # a cancelled handler (shutdown) is not answered
                future.set_result(result)

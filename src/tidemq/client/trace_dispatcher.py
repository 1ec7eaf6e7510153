"""Writing trace records to the trace topic: batched, in the background, never in the way.

Theory of operation. A traced client hands its records to ``TraceDispatcher.append`` as
already encoded text (``trace_data``) with the keys they should be found by. ``append``
only puts them in a bounded buffer and wakes the writer task; it never waits and never
raises, and when the buffer is full it drops the records and counts them (``dropped``), as
RocketMQ's AsyncTraceDispatcher does: a send must not slow down or fail because its trace
cannot be written.

The writer task waits a short linger for more records, then cuts the buffer into trace
messages of at most ``body_bytes_max`` bytes of text and ``keys_bytes_max`` bytes of keys
(the KEYS property must stay well inside the 32767-byte properties limit) and sends them
with the given sender (a producer of group ``_INNER_TRACE_PRODUCER``), at most
``sends_in_flight_max`` at once. A send that fails (a timeout under load, a broker
restarting, a route not there yet) is tried again up to ``send_retries`` times, after a
pause that starts at ``retry_backoff_ms`` and doubles, as RocketMQ's trace producer retries
a failed asynchronous send twice. The retrying send keeps its slot, so a trace topic that
cannot be written slows the writer down and the bounded buffer fills and drops (counted,
logged at most once per ``DROP_LOG_INTERVAL_S``), instead of a backlog that grows. A trace
message whose every attempt failed is logged (once per ``FAILURE_LOG_EVERY`` lost records)
and its records counted in ``failed``. A retry after a timeout may store a trace message
twice (the first attempt may have been stored after all); readers drop the duplicate
records (trace_query).

``close`` gives the records still buffered one last chance (bounded by a timeout), then
closes the sender. Everything runs on the client's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger("tidemq.client.trace")

# RocketMQ's trace producer caps a trace message at 128000 - 10000 bytes.
TRACE_BODY_BYTES_MAX = 118_000
# KEYS of one trace message; half the 32767-byte properties limit leaves room for the rest.
TRACE_KEYS_BYTES_MAX = 16_384
# Pieces buffered before new ones are dropped (RocketMQ buffers 1024 contexts; ours are
# pieces of up to TRACE_PIECE_RECORDS_MAX records, so this is the same order of bytes).
TRACE_BUFFER_PIECES_MAX = 8192
# How long the writer waits for more records before sending a partly filled trace message.
TRACE_LINGER_MS = 20
SENDS_IN_FLIGHT_MAX = 4
# A failed trace send is tried again this often (RocketMQ's trace producer: its async send's
# retryTimesWhenSendAsyncFailed, 2), the first retry after this pause, each next after twice
# the previous one.
TRACE_SEND_RETRIES = 2
TRACE_RETRY_BACKOFF_MS = 200
FAILURE_LOG_EVERY = 100
DROP_LOG_INTERVAL_S = 10.0
CLOSE_TIMEOUT_MS = 3000


@dataclass(slots=True)
class TracePiece:
    """Encoded trace records that travel together, and the keys to find them by."""

    text: str
    keys: list[str]
    records: int


# send(topic, body, keys) -> awaitable; raises when the trace message was not stored.
TraceSend = Callable[[str, bytes, list[str]], Awaitable[object]]


class TraceDispatcher:
    """Buffers trace records and writes them to ``topic`` in the background.

    Args:
        topic: the trace topic.
        send: writes one trace message (see ``TraceSend``).
        close_sender: closes whatever ``send`` uses, at ``close``.
        buffer_pieces_max, body_bytes_max, keys_bytes_max, linger_ms,
            sends_in_flight_max, send_retries, retry_backoff_ms: limits and pacing (module
            docstring).

    Attributes:
        appended, sent, failed, dropped: records handed in, stored in the trace topic,
            lost to a send that failed every attempt, dropped because the buffer was full
            (or the dispatcher closed).
        retried: records whose trace message was sent again after a failed attempt (once
            per retry).
    """

    def __init__(
        self,
        topic: str,
        send: TraceSend,
        close_sender: Callable[[], Awaitable[None]],
        *,
        buffer_pieces_max: int = TRACE_BUFFER_PIECES_MAX,
        body_bytes_max: int = TRACE_BODY_BYTES_MAX,
        keys_bytes_max: int = TRACE_KEYS_BYTES_MAX,
        linger_ms: int = TRACE_LINGER_MS,
        sends_in_flight_max: int = SENDS_IN_FLIGHT_MAX,
        send_retries: int = TRACE_SEND_RETRIES,
        retry_backoff_ms: int = TRACE_RETRY_BACKOFF_MS,
    ) -> None:
        self.topic = topic
        self._send = send
        self._close_sender = close_sender
        self._buffer: deque[TracePiece] = deque()
        self._buffer_pieces_max = buffer_pieces_max
        self._body_bytes_max = body_bytes_max
        self._keys_bytes_max = keys_bytes_max
        self._linger_s = linger_ms / 1000
        self._slots = asyncio.Semaphore(sends_in_flight_max)
        self._send_retries = max(0, send_retries)
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._wakeup = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._sends: set[asyncio.Task[None]] = set()
        self._closing = False
        self.appended = 0
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self.retried = 0
        self._drops_unlogged = 0
        self._drop_logged_at: float | None = None

    def start(self) -> None:
        """Start the writer task (on the running loop). Idempotent."""
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(
                self._write_loop(), name=f"tidemq-trace-{self.topic}")

    def append(self, piece: TracePiece) -> bool:
        """Buffer ``piece`` for writing; False (and counted as dropped) when the buffer is
        full or the dispatcher is closing. Never blocks, never raises."""
        if self._closing or len(self._buffer) >= self._buffer_pieces_max:
            self.dropped += piece.records
            self._log_drop(piece.records)
            return False
        self._buffer.append(piece)
        self.appended += piece.records
        if not self._wakeup.is_set():
            self._wakeup.set()
        return True

    async def close(self, timeout_ms: int = CLOSE_TIMEOUT_MS) -> None:
        """Write what is buffered (waiting at most ``timeout_ms``), then stop and close the
        sender. Records still unwritten after the timeout are counted as dropped."""
        if self._closing:
            return
        self._closing = True
        self._wakeup.set()
        writer = self._writer
        if writer is not None:
            try:
                await asyncio.wait_for(asyncio.shield(writer), timeout_ms / 1000)
            except TimeoutError:
                writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer
        if self._sends:
            await asyncio.wait(set(self._sends), timeout=timeout_ms / 1000)
        for task in list(self._sends):
            task.cancel()
        self.dropped += sum(piece.records for piece in self._buffer)
        self._buffer.clear()
        with contextlib.suppress(Exception):
            await self._close_sender()

    async def _write_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._closing and self._linger_s > 0:
                await asyncio.sleep(self._linger_s)  # let a burst fill the trace message
            while self._buffer:
                await self._slots.acquire()
                body, keys, records = self._take()
                task = asyncio.get_running_loop().create_task(self._write(body, keys, records))
                self._sends.add(task)
                task.add_done_callback(self._sends.discard)
            if self._closing:
                if self._sends:
                    await asyncio.wait(set(self._sends))
                return

    def _take(self) -> tuple[bytes, list[str], int]:
        """Pieces from the front of the buffer for one trace message (at least one)."""
        buffer = self._buffer
        texts: list[str] = []
        keys: list[str] = []
        body_bytes = keys_bytes = records = 0
        while buffer:
            piece = buffer[0]
            piece_keys = piece.keys
            # Counted before duplicates are dropped (below): a bound, never an overrun.
            piece_keys_bytes = sum(map(len, piece_keys)) + len(piece_keys)
            if texts and (body_bytes + len(piece.text) > self._body_bytes_max
                          or keys_bytes + piece_keys_bytes > self._keys_bytes_max):
                break
            buffer.popleft()
            texts.append(piece.text)
            body_bytes += len(piece.text)
            keys_bytes += piece_keys_bytes
            keys += piece_keys
            records += piece.records
        # A key twice in KEYS would cost the broker two index entries for one lookup.
        return "".join(texts).encode(), list(dict.fromkeys(keys)), records

    async def _write(self, body: bytes, keys: list[str], records: int) -> None:
        try:
            retries_left = self._send_retries
            pause_s = self._retry_backoff_s
            while True:
                try:
                    await self._send(self.topic, body, keys)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    if retries_left <= 0:
                        self._lost(records, e)
                        return
                    retries_left -= 1
                    self.retried += records
                    log.debug("trace send to topic %r failed (%s); trying again in %.0f ms",
                              self.topic, e, pause_s * 1000)
                    await asyncio.sleep(pause_s)
                    pause_s *= 2
                else:
                    self.sent += records
                    return
        except asyncio.CancelledError:
            self.failed += records
            raise
        finally:
            self._slots.release()

    def _lost(self, records: int, error: Exception) -> None:
        self.failed += records
        failures = self.failed
        if failures <= records or failures // FAILURE_LOG_EVERY != (
                failures - records) // FAILURE_LOG_EVERY:
            log.warning("could not write %d trace record(s) to topic %r after %d attempt(s) "
                        "(%d lost so far; sends are not affected): %s. Create the topic or let "
                        "the broker create it (traceTopicEnable=true or "
                        "autoCreateTopicEnable=true)", records, self.topic,
                        1 + self._send_retries, failures, error)

    def _log_drop(self, records: int) -> None:
        # Rate-limited: under a burst every append may drop, and a log line each would cost
        # the traced client more than the trace itself.
        self._drops_unlogged += records
        now = time.monotonic()
        if self._drop_logged_at is not None and now - self._drop_logged_at < DROP_LOG_INTERVAL_S:
            return
        self._drop_logged_at = now
        log.warning("trace buffer full (%d pieces) or closing: dropped %d trace record(s) "
                    "(%d in all; sends are not affected). The trace topic %r is written "
                    "slower than records come, or not at all", self._buffer_pieces_max,
                    self._drops_unlogged, self.dropped, self.topic)
        self._drops_unlogged = 0

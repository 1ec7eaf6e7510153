"""One remoting connection over an asyncio transport, used by the server and the client alike.

Theory of operation
-------------------
``Connection`` is an ``asyncio.Protocol`` (callbacks, not streams: no reader task and no
per-frame awaits, which matters at 100k+ frames/s). Bytes read go into a sans-IO
``FrameDecoder``; each command that comes out is either

- a response (flag bit 0): matched by ``opaque`` to the future of a request this side sent
  with ``request``; a response nobody waits for any more (timed out) is dropped, or
- a request: counted in flight and handed to the ``RequestDispatcher`` the owner gave, which
  runs the handler and answers with ``send_response``.

Flow control, both ways, so that no peer can make us buffer without bound:

- Reading. At most ``max_in_flight`` of the peer's requests are handled at once; at the limit
  the transport stops reading until half of them are done (requests of the last read beyond
  the limit wait in a backlog, dispatched in order as handlers finish). In the responder role (the
  server), reading also stops while our write buffer is above its high-water mark: a peer
  that does not read its responses gets no new requests served. The client role must not do
  that, or two sides each waiting for the other to read would deadlock.
- Writing. Above the high-water mark the transport calls ``pause_writing``; ``request`` and
  ``send_oneway`` then wait for ``resume_writing`` (within their timeout). ``send_response``
  never waits, so a slow peer cannot stall a handler; instead, responses piling up beyond
  ``write_buffer_max_bytes`` mean the peer has stopped reading, and the connection is aborted.
- Idle. With nothing in flight either way, no bytes read and no write progress for
  ``idle_timeout_s``, the connection is closed (RocketMQ closes idle channels after 120 s).

A malformed frame kills the decoder: one WARNING naming the peer and the reason, and only
this connection is aborted. Everything here runs on the event loop's thread; nothing is
locked.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from tidemq.errors import LocalProtocolError, ProtocolError
from tidemq.limits import FRAME_SIZE_MAX
from tidemq.protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.frame import FrameDecoder
from tidemq.protocol.send_run import SendRun
from tidemq.remoting.errors import RemotingClosed, RemotingTimeout

if TYPE_CHECKING:
    from tidemq.remoting.dispatch import RequestDispatcher

log = logging.getLogger("tidemq.remoting")

# RocketMQ's serverChannelMaxIdleTimeSeconds and the client's maxIdleTimeSeconds are both 120.
IDLE_TIMEOUT_S = 120.0

# Requests of one peer handled at once. A Java client keeps a few hundred pulls and async
# sends in flight per connection at most; 1024 leaves them room while one greedy connection
# cannot take a whole handler's queue (10,000) alone.
MAX_IN_FLIGHT_PER_CONNECTION = 1024

# The transport pauses our writers above this many buffered bytes and resumes them below
# the low mark. 1 MiB holds a typical pull response (32 messages of a few KiB) without
# pausing; asyncio's default of 64 KiB would pause on nearly every large response.
WRITE_BUFFER_HIGH_BYTES = 1024 * 1024
WRITE_BUFFER_LOW_BYTES = 256 * 1024

# A request whose frame fills the cork to this many bytes leaves at once instead of at the
# end of the loop iteration: a producer's 64 x 1 KiB batch request is ~66 KiB, and held in
# the cork, a window of 16 left in one burst after the last was encoded (~2.7 ms later),
# while the broker, having answered them all, sat idle. Sent one by one, the broker works
# on the first while the next is encoded. Small requests (single sends, pulls) still share
# one writev per iteration; responses keep the cork (one write per read, dispatch.py).
REQUEST_SEND_NOW_BYTES = 64 * 1024
assert REQUEST_SEND_NOW_BYTES <= WRITE_BUFFER_HIGH_BYTES  # _send_request's flush covers both

# Responses buffered beyond this mean the peer is not reading. Four maximum frames: a peer
# that is merely slow has its reading paused long before (we stop reading its requests at
# the high-water mark), so only responses already being computed can add to the buffer.
WRITE_BUFFER_MAX_FRAMES = 4

# How long ``close`` waits for buffered bytes to reach a peer before aborting: a peer that
# reads at all takes a few MiB well within this; one that does not must not keep the socket.
CLOSE_LINGER_S = 5.0

CloseCallback = Callable[["Connection"], None]


class ResponseReceiver(Protocol):
    """Where a request's answer goes: an ``asyncio.Future`` (``request``), or any object
    with these three methods (``request_nowait``), called on the connection's loop."""

    def done(self) -> bool: ...

    def set_result(self, response: RemotingCommand, /) -> None: ...

    def set_exception(self, error: BaseException, /) -> None: ...


# A request waiting for its response: (receiver, deadline in loop time, the request, its
# whole timeout in ms for the message).
_Waiting = tuple[ResponseReceiver, float, RemotingCommand, int]

# A request's timer may fire this much before its deadline (uvloop keeps timers in whole
# milliseconds); it is due then, or the sweep would be rescheduled for the same instant.
_EXPIRY_SLACK_S = 0.001

# Called with every request this side sends, just before it is encoded (RocketMQ's
# ``RPCHook.doBeforeRequest``): the client's ACL signing adds its extFields here, so retries,
# oneways and every code path that sends are signed alike.
RequestHook = Callable[[RemotingCommand], None]


class ConnectionEvent(StrEnum):
    """What happened to a connection, as told to a server's or client's listeners."""

    OPEN = "open"
    CLOSE = "close"


ConnectionListener = Callable[[ConnectionEvent, "Connection"], None]


class Connection(asyncio.Protocol):
    """A remoting connection: request/response by opaque, oneway, serving the peer's requests.

    Created by ``RemotingServer`` (one per accepted socket) and ``RemotingClient`` (one per
    address); owners use ``request``, ``send_oneway``, ``send_response`` and ``close``.

    Attributes:
        remote_address: the peer as ``"ip:port"`` (IPv6 without brackets), set on connect.
        local_address: our end as ``"ip:port"``.
        attributes: free for the owner's bookkeeping (e.g. the client id seen in a heartbeat).
        on_close: callables run once, with this connection, after it has closed.
        closed: set once the connection has closed; ``close_reason`` says why.
    """

    def __init__(
        self,
        dispatcher: RequestDispatcher,
        *,
        frame_size_max: int = FRAME_SIZE_MAX,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_in_flight: int = MAX_IN_FLIGHT_PER_CONNECTION,
        write_buffer_max_bytes: int | None = None,
        pause_reading_on_write_backlog: bool = False,
        on_open: Callable[[Connection], None] | None = None,
        request_hook: RequestHook | None = None,
    ) -> None:
        check_limits(idle_timeout_s=idle_timeout_s, max_in_flight_per_connection=max_in_flight)
        self._loop = asyncio.get_running_loop()
        self._dispatcher = dispatcher
        self._decoder = FrameDecoder(frame_size_max)
        self._idle_timeout_s = idle_timeout_s
        self._max_in_flight = max_in_flight
        self._resume_in_flight = max_in_flight // 2
        self._write_buffer_max_bytes = (
            write_buffer_max_bytes
            if write_buffer_max_bytes is not None
            else WRITE_BUFFER_MAX_FRAMES * frame_size_max
        )
        self._pause_reading_on_write_backlog = pause_reading_on_write_backlog
        self._on_open = on_open
        self._request_hook = request_hook
        self._transport: asyncio.Transport | None = None
        self._corked: list[bytes | memoryview] | None = None  # frames written this iteration
        self._corked_bytes = 0
        self._pending: dict[int, _Waiting] = {}
        # One timer for all of ``_pending``, due at the earliest deadline it knows of (a
        # timer per request cost ~2.4 us to start and cancel, a tenth of a single send).
        self._expiry_handle: asyncio.TimerHandle | None = None
        self._expiry_at = math.inf
        self._in_flight = 0
        self._backlog: deque[RemotingCommand] = deque()  # read, waiting for an in-flight slot
        self._dispatching_backlog = False
        self._peer_done_sending = False  # EOF seen while requests were in flight
        self._reading_paused = False
        self._reading_held = False  # the owner stopped reading (server shutting down)
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._last_activity = self._loop.time()
        self._idle_handle: asyncio.TimerHandle | None = None
        self._linger_handle: asyncio.TimerHandle | None = None
        self._closing = False
        self.remote_address = "?"
        self.local_address = "?"
        self.attributes: dict[str, Any] = {}
        self.on_close: list[CloseCallback] = []
        self.closed = asyncio.Event()
        self.close_reason: str | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this connection runs on."""
        return self._loop

    def __repr__(self) -> str:
        state = "closed" if self.closed.is_set() else "closing" if self._closing else "open"
        return f"<Connection {self.local_address} -> {self.remote_address} {state}>"

    # -- public API ----------------------------------------------------------------------------

    @property
    def is_closing(self) -> bool:
        """True once ``close`` was called or the connection was lost; nothing more is sent."""
        return self._closing

    @property
    def in_flight(self) -> int:
        """The peer's requests being handled now."""
        return self._in_flight

    @property
    def pending_requests(self) -> int:
        """Our requests on this connection still waiting for a response."""
        return len(self._pending)

    async def request(self, command: RemotingCommand, timeout_ms: int = 3000) -> RemotingCommand:
        """Send a request and wait for the response with the same opaque.

        Waits first, within the same timeout, while the write buffer is above its high-water
        mark, so a peer that does not read cannot make us buffer without bound.

        Args:
            command: a request (no response or oneway flag), typically from
                ``RemotingCommand.request`` so its opaque is unique in this process.
            timeout_ms: how long to wait for the response, writing included.

        Returns:
            The peer's response; its ``code`` may be any response code, this does not judge it.

        Raises:
            RemotingTimeout: no response within ``timeout_ms``; the connection stays open and
                a late response is dropped.
            RemotingClosed: the connection was closed before or while waiting.
            LocalProtocolError: ``command`` is not a request, its opaque is already waiting on
                this connection, or it cannot be encoded.
        """
        return await self._request(command, self._loop.time() + timeout_ms / 1000, timeout_ms)

    async def _request(
        self, command: RemotingCommand, deadline: float, timeout_ms: int
    ) -> RemotingCommand:
        """``request`` with the response due at loop time ``deadline``; ``timeout_ms`` is the
        caller's whole timeout, for messages (the client spends part of it connecting)."""
        if command.flag & (FLAG_RESPONSE | FLAG_ONEWAY):
            raise LocalProtocolError(
                f"{command.describe()} is not a two-way request; use send_oneway or "
                "send_response for it"
            )
        loop = self._loop
        if self._write_paused and not self._closing:
            await self._wait_writable(deadline, command, timeout_ms)
        if self._closing:
            raise self._closed_error(command)
        if loop.time() >= deadline:
            raise RemotingTimeout(
                f"{command.describe()} not sent to {self.remote_address}: its {timeout_ms} ms "
                "timeout passed before it could be written (connecting took that long)"
            )
        future: asyncio.Future[RemotingCommand] = loop.create_future()
        opaque = self._send_request(command, deadline, timeout_ms, future)
        try:
            return await future
        finally:
            waiting = self._pending.get(opaque)
            if waiting is not None and waiting[0] is future:
                del self._pending[opaque]

    def request_nowait(
        self, command: RemotingCommand, timeout_ms: int, receiver: ResponseReceiver
    ) -> bool:
        """Send a request whose answer goes to ``receiver``, called from the read callback.

        For a client's steady loop of one request after another (a consumer's parked pull):
        no task resumes to take the answer, so it is handled in the loop iteration that
        read it. ``receiver.set_result(response)`` is called with the response,
        ``receiver.set_exception(error)`` with ``RemotingTimeout`` when ``timeout_ms``
        passes and with ``RemotingClosed`` when the connection goes first; either is called
        at most once, and ``receiver.done()`` must say True from then on. Both run inside
        this connection's callbacks: they must not raise.

        Returns:
            False, with nothing sent, when the request could not leave without waiting (the
            write buffer is full, or the connection is closing): use ``request`` then.

        Raises:
            LocalProtocolError: as ``request``; nothing was sent.
        """
        if command.flag & (FLAG_RESPONSE | FLAG_ONEWAY):
            raise LocalProtocolError(
                f"{command.describe()} is not a two-way request; use send_oneway or "
                "send_response for it"
            )
        if self._write_paused or self._closing:
            return False
        now = self._loop.time()
        self._send_request(command, now + timeout_ms / 1000, timeout_ms, receiver, now)
        return True

    def _send_request(
        self, command: RemotingCommand, deadline: float, timeout_ms: int,
        receiver: ResponseReceiver, now: float | None = None,
    ) -> int:
        """Write a two-way request (its flags checked by the caller) and wait for its answer
        in ``receiver``; returns its opaque. ``now``: the loop time, when the caller has just
        read it."""
        opaque = command.opaque
        if opaque in self._pending:
            raise LocalProtocolError(
                f"{command.describe()}: opaque {opaque} already waits for a response on "
                f"{self.remote_address}; create requests with RemotingCommand.request"
            )
        if self._request_hook is not None:
            self._request_hook(command)
        parts = command.encode_parts()  # raises before anything is written (``_write``'s)
        size = len(parts[0]) if len(parts) == 1 else len(parts[0]) + len(parts[1])
        # ``_cork``'s work, inline (a call less per request, and the caller's clock reading
        # for the activity): a request that fills the cork to REQUEST_SEND_NOW_BYTES leaves
        # now, which covers ``_cork``'s flush at WRITE_BUFFER_HIGH_BYTES.
        corked = self._corked
        if corked is None:
            self._corked = parts
            self._loop.call_soon(self._flush)
        else:
            corked += parts
            size += self._corked_bytes
        self._corked_bytes = size
        if size >= REQUEST_SEND_NOW_BYTES:
            self._flush()
        if not self._write_paused:
            self._last_activity = self._loop.time() if now is None else now
        self._pending[opaque] = (receiver, deadline, command, timeout_ms)
        if deadline < self._expiry_at:
            self._schedule_expiry(deadline)
        return opaque

    async def send_oneway(self, command: RemotingCommand, timeout_ms: int = 3000) -> None:
        """Send a request that gets no response (the oneway flag is set on ``command``).

        Returns once the frame is handed to the transport; delivery is not confirmed.

        Raises:
            RemotingTimeout: the write buffer stayed full for ``timeout_ms``.
            RemotingClosed: the connection is closed.
            LocalProtocolError: ``command`` is a response or cannot be encoded.
        """
        if command.flag & FLAG_RESPONSE:
            raise LocalProtocolError(f"{command.describe()} is a response; use send_response")
        command.flag |= FLAG_ONEWAY
        if self._write_paused and not self._closing:
            deadline = self._loop.time() + timeout_ms / 1000
            await self._wait_writable(deadline, command, timeout_ms)
        if self._closing:
            raise self._closed_error(command)
        if self._request_hook is not None:
            self._request_hook(command)
        self._write(command)

    def send_response(self, response: RemotingCommand) -> bool:
        """Write a response now, without waiting for the peer to read.

        A handler that returned None answers later through this (RocketMQ's suspended long
        poll). If the bytes buffered for the peer then exceed ``write_buffer_max_bytes``, the
        peer is not reading: the connection is aborted with a WARNING.

        Returns:
            True when written, False when the connection was already closing (dropped).

        Raises:
            LocalProtocolError: ``response`` cannot be encoded; nothing was written.
        """
        if self._closing:
            log.debug(
                "dropped %s: connection to %s is closed", response.describe(), self.remote_address
            )
            return False
        self._write(response)
        return True

    def send_encoded(self, parts: list[bytes | memoryview]) -> bool:
        """Write frames already encoded (each one's ``encode_parts``, in one list), as
        ``send_response`` writes one: the responses of requests served together go into the
        cork in one step rather than one call chain each.

        Returns:
            True when written, False when the connection was already closing (dropped).
        """
        if self._closing:
            log.debug("dropped %d encoded frame parts: connection to %s is closed",
                      len(parts), self.remote_address)
            return False
        self._cork(parts, sum(map(len, parts)))
        return True

    def flush(self) -> None:
        """Send the frames written so far in this loop iteration now rather than at its end
        (they are corked until then): for a response whose peer is waiting on the critical
        path, such as a long poll woken by a new message, so that it leaves before whatever
        else this iteration still writes."""
        self._flush()

    def close(self, reason: str = "closed by this side") -> None:
        """Close once the buffered bytes are written, or abort after ``CLOSE_LINGER_S``.

        Nothing more is read or sent. Waiting requests fail with ``RemotingClosed`` once the
        connection is gone; ``closed`` is set and the ``on_close`` callbacks run then.
        """
        if self._closing:
            return
        self._begin_close(reason)
        if self._transport is not None:
            self._flush()
            self._transport.close()
            # A peer that does not read would keep the socket open for ever.
            self._linger_handle = self._loop.call_later(CLOSE_LINGER_S, self._transport.abort)

    def abort(self, reason: str = "aborted by this side") -> None:
        """Close at once, dropping whatever is still buffered for the peer."""
        if self.close_reason is None:
            self.close_reason = reason
        self._closing = True
        self._corked = None
        if self._transport is not None:
            self._transport.abort()

    async def wait_closed(self) -> None:
        """Wait until the connection has closed (``closed`` is set)."""
        await self.closed.wait()

    def hold_reading(self) -> None:
        """Stop reading the peer's requests until ``release_reading`` (server shutdown)."""
        self._reading_held = True
        self._update_reading()

    def release_reading(self) -> None:
        """Undo ``hold_reading``."""
        self._reading_held = False
        if self._backlog:
            self._dispatch_backlog()
        self._update_reading()

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self.remote_address = _format_address(transport.get_extra_info("peername"))
        self.local_address = _format_address(transport.get_extra_info("sockname"))
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES, low=WRITE_BUFFER_LOW_BYTES)
        self._last_activity = self._loop.time()
        self._idle_handle = self._loop.call_at(
            self._last_activity + self._idle_timeout_s, self._check_idle
        )
        if self._on_open is not None:
            self._on_open(self)

    def data_received(self, data: bytes) -> None:
        self._last_activity = self._loop.time()
        try:
            if self._dispatcher.takes_send_runs:
                commands = self._decoder.feed_requests(data)
            else:
                commands = self._decoder.feed(data)
        except ProtocolError as exc:
            if not self._closing:  # one warning per connection, however much more arrives
                log.warning(
                    "closing connection from %s: malformed frame: %s", self.remote_address, exc
                )
                self.abort(f"malformed frame: {exc}")
            return
        if type(commands) is SendRun:
            # A run of sends (protocol/send_run.py) served without a command each when all
            # of it may be taken now; else its commands, as any read's.
            count = len(commands)
            if (not self._closing and not self._backlog
                    and self._in_flight + count <= self._max_in_flight):
                self._in_flight += count
                self._dispatcher.dispatch_send_run(commands, self)
                if self._in_flight >= self._max_in_flight:
                    self._update_reading()
                return
            commands = commands.commands()
        ready: list[RemotingCommand] | None = None  # requests to serve, handed over together
        for command in commands:
            if command.flag & FLAG_RESPONSE:
                waiting = self._pending.pop(command.opaque, None)
                if waiting is None or waiting[0].done():
                    log.debug(
                        "no request waits for %s from %s (timed out?); dropped",
                        command.describe(),
                        self.remote_address,
                    )
                else:
                    waiting[0].set_result(command)
            elif self._closing:
                pass
            elif self._in_flight < self._max_in_flight and not self._backlog:
                self._in_flight += 1
                if ready is None:
                    ready = [command]
                else:
                    ready.append(command)
            else:
                # Over the limit: keep what this read brought (bounded by one read) and stop
                # reading until handlers finish.
                self._backlog.append(command)
        if ready is not None:
            # Together, so that a code with a group handler serves them in one call.
            self._dispatcher.dispatch_many(ready, self)
        if self._backlog or self._in_flight >= self._max_in_flight:
            self._update_reading()

    def eof_received(self) -> bool:
        # The peer finished sending (half-close). Answer what it already asked, then close;
        # with nothing in flight, returning False lets the transport close at once.
        if self._in_flight or self._backlog:
            self._peer_done_sending = True
            return True
        self._flush()  # responses still in the cork go out before the transport closes
        return False

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._pause_reading_on_write_backlog:
            self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._last_activity = self._loop.time()
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        if self._pause_reading_on_write_backlog:
            self._update_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self.close_reason is None:
            self.close_reason = f"connection lost: {exc}"
        self._begin_close(self.close_reason or "closed by the peer")
        if self._idle_handle is not None:
            self._idle_handle.cancel()
        if self._linger_handle is not None:
            self._linger_handle.cancel()
        if self._expiry_handle is not None:
            self._expiry_handle.cancel()
            self._expiry_handle = None
        self._fail_waiters()
        self.closed.set()
        callbacks, self.on_close = self.on_close, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception(
                    "close callback %r of connection to %s failed", callback, self.remote_address
                )

    # -- internals -----------------------------------------------------------------------------

    def _write(self, command: RemotingCommand) -> None:
        parts = command.encode_parts()  # raises before anything is written
        self._cork(parts, len(parts[0]) if len(parts) == 1 else len(parts[0]) + len(parts[1]))

    def _cork(self, parts: list[bytes | memoryview], size: int) -> None:
        """Write ``parts`` (whole frames, ``size`` bytes) through the cork, which we own now.

        Frames written during one loop iteration leave in one writev at its end: with many
        requests in flight a send syscall per frame was most of the cost."""
        if self._corked is None:
            self._corked = parts
            self._corked_bytes = size
            self._loop.call_soon(self._flush)
        else:
            self._corked += parts
            self._corked_bytes += size
        if self._corked_bytes >= WRITE_BUFFER_HIGH_BYTES:
            # Large writes leave at once, so the transport can pause the writers that follow
            # in this same iteration instead of all of them piling up in the cork.
            self._flush()
        if not self._write_paused:
            self._last_activity = self._loop.time()

    def _flush(self) -> None:
        parts = self._corked
        if parts is None:
            return
        self._corked = None
        if self._transport.is_closing():
            return
        self._transport.writelines(parts)
        if self._write_paused:
            buffered = self._transport.get_write_buffer_size()
            if buffered > self._write_buffer_max_bytes:
                reason = (
                    f"{buffered} bytes wait to be sent, more than write_buffer_max_bytes="
                    f"{self._write_buffer_max_bytes}; the peer is not reading (raise "
                    "write_buffer_max_bytes if it is just slow)"
                )
                log.warning("aborting connection to %s: %s", self.remote_address, reason)
                self.abort(reason)

    def _request_done(self, count: int = 1) -> None:
        """Called by the dispatcher exactly once per request handed to it (``count``
        requests finished together count as many calls)."""
        self._in_flight -= count
        if self._backlog and not self._dispatching_backlog:
            self._dispatch_backlog()
        if self._reading_paused:
            self._update_reading()
        if self._peer_done_sending and not self._in_flight and not self._backlog:
            self.close("the peer closed its side and every request was answered")

    def _dispatch_backlog(self) -> None:
        # A refused request finishes inside dispatch and calls _request_done again; the flag
        # turns that recursion into this loop.
        self._dispatching_backlog = True
        try:
            while (
                self._backlog
                and self._in_flight < self._max_in_flight
                and not self._reading_held
                and not self._closing
            ):
                self._in_flight += 1
                self._dispatcher.dispatch(self._backlog.popleft(), self)
        finally:
            self._dispatching_backlog = False

    def _update_reading(self) -> None:
        if self._closing or self._transport is None or self._peer_done_sending:
            return
        if self._reading_paused:
            limit = self._resume_in_flight + 1  # resume at half: no flapping at the limit
        else:
            limit = self._max_in_flight
        should_read = (
            not self._reading_held
            and self._in_flight < limit
            and not self._backlog
            and not (self._pause_reading_on_write_backlog and self._write_paused)
        )
        if should_read == self._reading_paused:
            self._reading_paused = not should_read
            if should_read:
                self._transport.resume_reading()
            else:
                self._transport.pause_reading()

    async def _wait_writable(
        self, deadline: float, command: RemotingCommand, timeout_ms: int
    ) -> None:
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._drain_waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
        except TimeoutError:
            raise RemotingTimeout(
                f"{command.describe()} not sent to {self.remote_address} within {timeout_ms} ms: "
                "the peer is not reading (its write buffer stayed full)"
            ) from None

    def _schedule_expiry(self, at: float) -> None:
        if self._expiry_handle is not None:
            self._expiry_handle.cancel()
        self._expiry_at = at
        self._expiry_handle = self._loop.call_at(at, self._expire_due)

    def _expire_due(self) -> None:
        """Fail the requests past their deadline with RemotingTimeout; wait again for the
        earliest deadline left. Answered requests are gone from ``_pending`` already, so
        with steady traffic this runs about once per timeout, over the requests in flight."""
        self._expiry_handle = None
        self._expiry_at = math.inf
        due_by = self._loop.time() + _EXPIRY_SLACK_S
        next_at = math.inf
        expired: list[_Waiting] = []
        for opaque, waiting in list(self._pending.items()):
            deadline = waiting[1]
            if deadline <= due_by:
                del self._pending[opaque]
                expired.append(waiting)
            elif deadline < next_at:
                next_at = deadline
        if next_at != math.inf:
            self._schedule_expiry(next_at)
        for future, _, command, timeout_ms in expired:
            _expire_request(future, self, command, timeout_ms)

    def _check_idle(self) -> None:
        self._idle_handle = None
        if self._closing:
            return
        now = self._loop.time()
        idle_until = self._last_activity + self._idle_timeout_s
        busy = self._in_flight or self._pending
        if now < idle_until or busy:
            next_check = idle_until if now < idle_until else now + self._idle_timeout_s
            self._idle_handle = self._loop.call_at(next_check, self._check_idle)
            return
        reason = f"idle for {self._idle_timeout_s:g} s (idle_timeout_s)"
        log.info("closing connection to %s: %s", self.remote_address, reason)
        self.close(reason)

    def _begin_close(self, reason: str) -> None:
        if self.close_reason is None:
            self.close_reason = reason
        self._closing = True

    def _closed_error(self, command: RemotingCommand) -> RemotingClosed:
        return RemotingClosed(
            f"connection to {self.remote_address} is closed ({self.close_reason}); "
            f"{command.describe()} was not sent"
        )

    def _fail_waiters(self) -> None:
        pending, self._pending = self._pending, {}
        for opaque, (future, _, _, _) in pending.items():
            if not future.done():
                future.set_exception(
                    RemotingClosed(
                        f"connection to {self.remote_address} closed ({self.close_reason}) before "
                        f"the response to request opaque={opaque} arrived"
                    )
                )
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(
                    RemotingClosed(
                        f"connection to {self.remote_address} closed ({self.close_reason}) while "
                        "a request waited to be written"
                    )
                )


def check_limits(*, idle_timeout_s: float, max_in_flight_per_connection: int) -> None:
    """Raise ValueError naming the setting when a connection limit makes no sense."""
    if idle_timeout_s <= 0:
        raise ValueError(f"idle_timeout_s is {idle_timeout_s}; it must be positive")
    if max_in_flight_per_connection < 1:
        raise ValueError(
            f"max_in_flight_per_connection is {max_in_flight_per_connection}; it must be at least 1"
        )


def _expire_request(
    future: ResponseReceiver,
    connection: Connection,
    command: RemotingCommand,
    timeout_ms: int,
) -> None:
    if not future.done():
        future.set_exception(
            RemotingTimeout(
                f"no response to {command.describe()} from {connection.remote_address} within "
                f"{timeout_ms} ms (raise the timeout if the peer is just slow)"
            )
        )


def _format_address(address: Any) -> str:
    """``"ip:port"`` from a socket address tuple (IPv4 or IPv6); anything else as text."""
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)

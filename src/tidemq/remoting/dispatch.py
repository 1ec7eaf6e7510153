"""Request dispatch: which handler serves a request code, bounded per handler.

A handler is ``async def handler(request, connection) -> RemotingCommand | None``. Each
request runs as its own task, so a handler that awaits (a disk flush, a long poll) does not
hold up the others. What the handler returns is written back as the response, with the
request's opaque, the response flag and the request's serialize type filled in (RocketMQ's
processor contract), so handlers may build responses either with
``RemotingCommand.response_to`` or plainly. Returning None means "no response now": the
handler has answered, or will answer later, with ``connection.send_response`` (RocketMQ's
suspended pull); for a oneway request nothing is ever sent. Returning a ``LaterResponse``
means "the response comes later, without this task": the request stays counted as running
until it is resolved.

A code may also have a *group handler*, ``async def group_handler(requests, connection) ->
list[RemotingCommand | None]``: the requests of that code one read brought (``dispatch_many``)
are served by one call, in their order, one response per request (oneway requests among
them too: their responses are dropped). A broker appends single sends that arrived together
in one pass this way (one task, one store append), where a task per request cost more than
the send itself; producers' oneway END_TRANSACTIONs share one end-writer flush. A lone
request still goes to ``handler``.

A connection whose dispatcher ``takes_send_runs`` (SEND_MESSAGE_V2 has an immediate group
handler, no guard is set) hands a read made only of SEND_MESSAGE_V2 requests over as one
``SendRun`` (protocol/send_run.py: their columns, no command each) to
``dispatch_send_run``, which cuts it into the groups ``dispatch_many`` would make and gives
each to the group handler as its part of the run: a sequence of the same commands, made only
if something reads them (the broker's plain sends read the columns instead).

A group handler may also answer a whole group at once with ``EncodedAnswers``: the frames
of every response, encoded already, in the requests' order (the broker's plain single sends,
broker/plain_sends.py: no response object per send). It is only for a group of two-way
requests that all got the same response code.

A code may instead have an *immediate* handler, a plain ``def handler(request, connection)
-> RemotingCommand | None`` that never waits (the broker's PULL_MESSAGE: a read of the store,
or parking the request): it runs as the request is dispatched, with no task of its own, and
its response joins the connection's writes at once. A task per request cost about as much as
a long poll's whole re-run, and its answer waited for the next loop iteration. An immediate
handler that finds it must wait after all returns a ``LaterResponse`` or an awaitable (a
coroutine) of the response: the awaitable is then run as the request's task, exactly as an
ordinary handler's would be (the broker's sends: stored and answered in place, a task only
for a batch's append at the iteration's end or a slave's wait). An immediate handler may
have a group handler too: it serves a lone request, the group handler several of one read,
likewise called in place, returning the list of responses or an awaitable of it.

Outcomes the peer sees (docs/protocol.md §1.5):

- no handler for the code and no default: REQUEST_CODE_NOT_SUPPORTED (3), remark
  ``" request type <code> not supported"``;
- the handler already has ``max_pending`` requests running: SYSTEM_BUSY (2), remark
  ``"[REJECTREQUEST]system busy, ..."`` naming the code and the limit;
- the handler raised: SYSTEM_ERROR (1), remark a short description of the exception (the
  traceback goes to the log).

An *observer* (``set_observer``), when set, is told of every request answered or refused:
``observer(request code, response code, seconds, count)``, once per request or once per
group served together (``count`` requests, one duration); -1 as the response code means no
response now (a held pull, a oneway request). It is how the metrics count requests.

- a *request guard* is set and refuses the request (the broker's ACL check): the code and
  remark the guard gave; no handler runs. The guard sees every request before any routing,
  in the order they arrived, so nothing reaches a handler without passing it. A guard may
  answer "later" with a ``DeferredCheck`` for work that hashes many bytes (the signature
  over a body of a MiB or more; below that the hop to the thread costs more CPU than the
  hashing it moves): the deferred checks of one read run together in one worker
  thread (hashlib releases the GIL, so the event loop goes on meanwhile), and the requests
  are routed, in their order, once all are decided.

Oneway requests never get any of these; a refusal is only logged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial
from itertools import pairwise
from typing import TYPE_CHECKING, Protocol

from tidemq.protocol.codes import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    RequestCode,
    ResponseCode,
    request_code_name,
)
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.send_run import SendRun

if TYPE_CHECKING:
    from tidemq.remoting.connection import Connection

log = logging.getLogger("tidemq.remoting")


class LaterResponse:
    """A response its handler gives after it returned, with no task waiting for it.

    A handler (or group handler) returns one in place of a ``RemotingCommand`` and calls
    ``resolve(response)`` once the response is known, from a callback on the loop (the
    broker's SYNC_FLUSH sends: the moment the disk sync is known). The dispatcher writes the
    response then, into the connection's cork (the resolver flushes the connection once it
    has answered what it had), and only then finishes the request's bookkeeping: the
    handler's pending count, the connection's in-flight count and the observer. Why not a
    task awaiting a future: the task's next step is queued behind every callback already
    ready, on a busy server a whole read's worth of requests.
    """

    __slots__ = ("_finish", "_response")

    def __init__(self) -> None:
        self._finish: Callable[[RemotingCommand], None] | None = None
        self._response: RemotingCommand | None = None

    def resolve(self, response: RemotingCommand) -> None:
        """Answer with ``response`` now; a second call is ignored."""
        finish, self._finish = self._finish, None
        if finish is not None:
            finish(response)
        elif self._response is None:
            self._response = response  # resolved before the dispatcher took it over

    def on_resolved(self, finish: Callable[[RemotingCommand], None]) -> None:
        """Call ``finish(response)`` once resolved (at once if it is already): how the
        dispatcher, or a caller of a handler outside a server, takes the response. One
        taker only."""
        response, self._response = self._response, None
        if response is not None:
            finish(response)
        else:
            self._finish = finish


class EncodedAnswers:
    """What a group handler may return in place of its list: the responses to every request
    of the group, already encoded (each frame with its request's opaque, the response flag
    and the request's serialize type), back to back in the requests' order, all with
    response code ``code``. The requests must all be two-way (a oneway one gets no
    response). The dispatcher writes ``frames`` as they are and counts the group as
    ``len(requests)`` responses of ``code``."""

    __slots__ = ("code", "frames")

    def __init__(self, frames: bytes, code: int) -> None:
        self.frames = frames
        self.code = code


Handler = Callable[
    [RemotingCommand, "Connection"], Awaitable["RemotingCommand | LaterResponse | None"]
]
ImmediateHandler = Callable[
    [RemotingCommand, "Connection"],
    "RemotingCommand | LaterResponse | Awaitable[RemotingCommand | LaterResponse | None] | None",
]
# An immediate route's group handler may also return the list itself (module docstring).
GroupHandler = Callable[
    [list[RemotingCommand], "Connection"],
    "Awaitable[list[RemotingCommand | LaterResponse | None]] | "
    "list[RemotingCommand | LaterResponse | None]",
]
Refusal = tuple[int, str]


class DeferredCheck(Protocol):
    """The part of a guard's check left for a worker thread: ``decide()`` returns None (let
    the request through) or the refusal. It must be thread-safe and must not touch the loop."""

    def decide(self) -> Refusal | None: ...


# ``guard(request, connection)`` returns None to let the request through, the
# ``(response code, remark)`` to refuse it with, or a ``DeferredCheck``. It runs on the loop
# for every request, so it must be quick and must not await.
RequestGuard = Callable[[RemotingCommand, "Connection"], "Refusal | DeferredCheck | None"]

# Deferred checks run here, one read's checks per call. One thread: the loop is the other
# core's work on the 2-core machines this is sized for, and checks of one read are ordered.
_guard_executor: concurrent.futures.ThreadPoolExecutor | None = None


def _guard_worker() -> concurrent.futures.ThreadPoolExecutor:
    global _guard_executor
    if _guard_executor is None:
        _guard_executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="tidemq-request-guard")
    return _guard_executor


def _decide_all(checks: list[DeferredCheck]) -> list[Refusal | None]:
    return [check.decide() for check in checks]


_REFUSED = object()  # a guard verdict: refused and answered already
# ``observer(request code, response code, seconds, count)``: see the module docstring.
RequestObserver = Callable[[int, int, float, int], None]
NO_RESPONSE = -1

# RocketMQ's broker queues at most 10,000 sends (sendThreadPoolQueueCapacity) before it
# answers SYSTEM_BUSY; the same bound suits any one handler here.
MAX_PENDING_PER_HANDLER = 10_000

# Requests one group handler call serves at most (and body bytes, past which a group takes
# no more requests); a read holding more is served in several calls, each answered and its
# responses written before the next starts. Without the split a producer's whole window went
# back and forth as one block, and broker and producer took turns instead of working at the
# same time: single sends of 1 KiB with 64 in flight ran at 23k msg/s as one group, 45-49k in
# groups of 32, 38-40k in groups of 16-24 (2 cores, both on one host). 32 requests still
# amortize the store append (about 6 us per message against 18 for one at a time).
GROUP_REQUESTS_MAX = 32
GROUP_BODY_BYTES_MAX = 32 * 1024

_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)  # the code of a ``SendRun``'s requests

# A SYSTEM_ERROR remark is for a human reading a client log, not a traceback dump.
ERROR_REMARK_LENGTH_MAX = 512


class _Route:
    __slots__ = ("code", "group_handler", "handler", "immediate", "max_pending", "pending")

    def __init__(
        self,
        code: int | None,
        handler: Handler | ImmediateHandler,
        max_pending: int,
        group_handler: GroupHandler | None = None,
        immediate: bool = False,
    ) -> None:
        self.code = code
        self.handler = handler
        self.group_handler = group_handler
        self.immediate = immediate  # ``handler`` is an ImmediateHandler
        self.max_pending = max_pending
        self.pending = 0


class _Group:
    """Requests of one code from one read, served by one group handler call."""

    __slots__ = ("body_bytes", "requests", "route")

    def __init__(self, route: _Route) -> None:
        self.route = route
        self.requests: list[RemotingCommand] = []
        self.body_bytes = 0

    @property
    def full(self) -> bool:
        return (
            len(self.requests) >= GROUP_REQUESTS_MAX or self.body_bytes >= GROUP_BODY_BYTES_MAX
        )

    def add(self, request: RemotingCommand) -> None:
        self.requests.append(request)
        if request.body:
            self.body_bytes += len(request.body)


class RequestDispatcher:
    """Runs the handler registered for each incoming request and writes its response.

    Shared by every connection of one server (or one client); the pending counts are per
    handler across all of them.
    """

    def __init__(self) -> None:
        self._routes: dict[int, _Route] = {}
        self._default: _Route | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._guard: RequestGuard | None = None
        self._observer: RequestObserver | None = None
        # True when a read's run of SEND_MESSAGE_V2 requests may come as a ``SendRun``
        # (``dispatch_send_run``): the code has an immediate group handler and no guard is
        # set (a guard checks commands one by one).
        self.takes_send_runs = False

    def set_observer(self, observer: RequestObserver | None) -> None:
        """Tell ``observer`` of every request answered or refused (module docstring);
        None removes it. An observer must be quick and must not raise."""
        self._observer = observer

    def set_guard(self, guard: RequestGuard | None) -> None:
        """Check every request with ``guard`` before it is routed (module docstring);
        None removes the guard. A guard that raises refuses the request with SYSTEM_ERROR
        (never lets it through)."""
        self._guard = guard
        self._update_takes_send_runs()

    def register(
        self,
        code: int,
        handler: Handler | ImmediateHandler,
        *,
        max_pending: int = MAX_PENDING_PER_HANDLER,
        group_handler: GroupHandler | None = None,
        immediate: bool = False,
    ) -> None:
        """Serve requests with ``code`` by ``handler``, at most ``max_pending`` at once.

        Registering a code again replaces its handler (and resets its pending count for new
        requests; those already running finish under the old route).

        Args:
            group_handler: serves several requests of ``code`` from one read in one call
                (module docstring); it must answer exactly as ``handler`` would, request by
                request, and return one response (or None) per request, in order.
            immediate: ``handler`` is a plain function, called as each request is
                dispatched, that answers in place or returns what to wait for (module
                docstring); with ``group_handler`` it serves the requests that came alone,
                and ``group_handler`` is called in place too (a list of responses, or an
                awaitable of it).

        Raises:
            ValueError: ``max_pending`` is below 1.
        """
        self._routes[int(code)] = _Route(
            int(code), handler, _checked_max_pending(max_pending), group_handler, immediate
        )
        self._update_takes_send_runs()

    def register_default(
        self, handler: Handler, *, max_pending: int = MAX_PENDING_PER_HANDLER
    ) -> None:
        """Serve every code without its own handler by ``handler``."""
        self._default = _Route(None, handler, _checked_max_pending(max_pending))

    @property
    def running(self) -> int:
        """Handler tasks not finished yet, over all connections."""
        return len(self._tasks)

    def dispatch(self, request: RemotingCommand, connection: Connection) -> None:
        """Serve ``request`` from ``connection``; calls ``connection._request_done`` once."""
        if self._guard is not None:
            verdict = self._ask_guard(request, connection)
            if verdict is _REFUSED:
                return
            if verdict is not None:
                self._spawn(self._dispatch_when_decided([request], [verdict], connection),
                            connection)
                return
        self._dispatch_checked(request, connection)

    def _dispatch_checked(self, request: RemotingCommand, connection: Connection) -> None:
        """``dispatch`` for a request the guard (if any) already let through."""
        route = self._routes.get(request.code, self._default)
        if route is None:
            self._refuse(
                request,
                connection,
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f" request type {request.code} not supported",
            )
            return
        if route.pending >= route.max_pending:
            self._refuse(request, connection, ResponseCode.SYSTEM_BUSY,
                         _busy_remark(request, route))
            return
        route.pending += 1
        if route.immediate:
            self._serve_now(route, request, connection)
            return
        task = connection._loop.create_task(_serve(route, request, connection, self._observer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _serve_now(self, route: _Route, request: RemotingCommand, connection: Connection
                   ) -> None:
        """``_serve`` for an immediate handler, called in place; what it returns to wait
        for (a ``LaterResponse``, an awaitable) is waited for as ``_serve`` would."""
        observer = self._observer
        started = time.perf_counter() if observer is not None else 0.0
        done = True  # False: the request's bookkeeping is left to what it waits for
        try:
            try:
                response = route.handler(request, connection)
            except Exception as exc:
                response = _handler_failed(request, connection, exc)
            if response is not None and type(response) is not RemotingCommand:
                done = False
                if isinstance(response, LaterResponse):
                    response.on_resolved(partial(_finish_later, route, request, connection,
                                                 observer, started))
                else:  # the rest of the handler, as the request's task
                    self._spawn(_serve(route, request, connection, observer, response,
                                       started), connection)
                return
            _answer_observed(request, response, connection, observer, started)
        finally:
            if done:
                route.pending -= 1
                connection._request_done()

    def dispatch_many(self, requests: list[RemotingCommand], connection: Connection) -> None:
        """Serve requests that arrived together from ``connection``, in order; calls
        ``connection._request_done`` once per request.

        Requests of a code with a group handler are served by one call of it (past the
        route's ``max_pending``, the rest are refused SYSTEM_BUSY as ``dispatch`` does);
        every other request as by ``dispatch``.
        """
        if len(requests) == 1:
            self.dispatch(requests[0], connection)
            return
        if self._guard is not None:
            passed: list[RemotingCommand] = []
            verdicts: list[DeferredCheck | None] = []
            for request in requests:
                verdict = self._ask_guard(request, connection)
                if verdict is not _REFUSED:
                    passed.append(request)
                    verdicts.append(verdict)  # type: ignore[arg-type]
            if any(verdict is not None for verdict in verdicts):
                self._spawn(self._dispatch_when_decided(passed, verdicts, connection),
                            connection)
                return
            requests = passed
        self._dispatch_grouped(requests, connection)

    def _update_takes_send_runs(self) -> None:
        # Kept as a plain attribute: a connection reads it once a read.
        route = self._routes.get(_SEND_V2)
        self.takes_send_runs = (self._guard is None and route is not None and route.immediate
                                and route.group_handler is not None)

    def dispatch_send_run(self, run: SendRun, connection: Connection) -> None:
        """``dispatch_many`` for the requests of ``run`` (a read's SEND_MESSAGE_V2 requests,
        protocol/send_run.py): the same groups, each served by the group handler with its
        part of the run in place of a list of commands, which are made only if something
        reads them. Anything unusual (a guard, no immediate group handler, one request, a
        route near its ``max_pending``) goes through ``dispatch_many`` with the commands."""
        count = len(run)
        route = self._routes.get(_SEND_V2)
        if (
            count == 1
            or self._guard is not None
            or route is None
            or not route.immediate
            or route.group_handler is None
            or route.pending + count > route.max_pending
        ):
            self.dispatch_many(run.commands(), connection)
            return
        route.pending += count
        # The groups _dispatch_grouped makes: a new one once the last holds
        # GROUP_REQUESTS_MAX requests or GROUP_BODY_BYTES_MAX body bytes.
        bounds = [0]
        group_bytes = 0
        for index, body_length in enumerate(map(len, run.bodies)):
            if group_bytes >= GROUP_BODY_BYTES_MAX or index - bounds[-1] >= GROUP_REQUESTS_MAX:
                bounds.append(index)
                group_bytes = 0
            group_bytes += body_length
        bounds.append(count)
        for start, stop in pairwise(bounds):
            after = count - stop
            # When the cork leaves: as in _dispatch_grouped.
            flush = after == 0 or after >= GROUP_REQUESTS_MAX
            group = run if stop - start == count else run.part(start, stop)
            self._serve_group_now(route, group, connection, flush)  # type: ignore[arg-type]

    def _dispatch_grouped(self, requests: list[RemotingCommand], connection: Connection) -> None:
        """``dispatch_many`` for requests the guard (if any) already let through."""
        groups: list[_Group] = []
        open_groups: dict[int, _Group] = {}  # by request code: the group taking requests
        routes = self._routes
        for request in requests:
            route = routes.get(request.code)
            if route is None or route.group_handler is None:
                self._dispatch_checked(request, connection)
                continue
            if route.pending >= route.max_pending:
                self._refuse(request, connection, ResponseCode.SYSTEM_BUSY,
                             _busy_remark(request, route))
                continue
            route.pending += 1
            group = open_groups.get(request.code)
            if group is None or group.full:
                group = open_groups[request.code] = _Group(route)
                groups.append(group)
            group.add(request)
        loop = connection._loop
        # Grouped requests of the read still to serve after each group.
        after = sum(len(group.requests) for group in groups)
        for group in groups:  # in order: tasks start as created
            after -= len(group.requests)
            # What is corked leaves at once after the read's last group, and after a group
            # followed by at least a full group's worth of requests (a window of 64 single
            # sends): the peer works on those responses while the rest is served. Otherwise
            # a group's responses wait for the next flush, one write (and one wake-up of the
            # peer) for several groups: batch requests, a group each, measured 7.67 -> 6.97
            # us/msg of broker loop CPU that way, while a 64-send window answered in one
            # block ran 19-21k msg/s against 32-36k answered a group at a time. A response
            # still waiting on its group (a SYNC_FLUSH wait) leaves with the cork at the end
            # of its loop iteration.
            flush = after == 0 or after >= GROUP_REQUESTS_MAX
            if group.route.immediate:
                self._serve_group_now(group.route, group.requests, connection, flush)
                continue
            task = loop.create_task(_serve_group(
                group.route, group.requests, connection, self._observer, flush))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _serve_group_now(self, route: _Route, requests: list[RemotingCommand],
                         connection: Connection, flush: bool) -> None:
        """``_serve_group`` for an immediate route's group handler, called in place; what it
        returns to wait for (an awaitable of the responses) runs as the group's task."""
        observer = self._observer
        started = time.perf_counter() if observer is not None else 0.0
        try:
            answered = route.group_handler(requests, connection)  # type: ignore[misc]
            if type(answered) is not EncodedAnswers and not isinstance(answered, list):
                self._spawn(_serve_group(route, requests, connection, observer, flush,
                                         answered, started), connection)
                return
            answered = _counted(answered, requests)
        except Exception as exc:
            answered = _group_failed(requests, connection, exc)
        _answer_group(route, requests, answered, connection, observer, flush, started)

    def _ask_guard(self, request: RemotingCommand, connection: Connection) -> object:
        """The guard's verdict: None (through), a ``DeferredCheck``, or ``_REFUSED`` after
        answering the refusal (``_request_done`` called)."""
        try:
            verdict = self._guard(request, connection)  # type: ignore[misc]
        except Exception as exc:
            log.exception(
                "request guard failed on %s from %s; refusing it",
                request.describe(),
                connection.remote_address,
            )
            verdict = (
                ResponseCode.SYSTEM_ERROR,
                f"the request could not be checked: {describe_exception(exc)}",
            )
        if verdict is None or not isinstance(verdict, tuple):
            return verdict
        code, remark = verdict
        self._refuse(request, connection, code, remark)
        return _REFUSED

    def _spawn(self, coroutine: Awaitable[None], connection: Connection) -> None:
        task = connection._loop.create_task(coroutine)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dispatch_when_decided(
        self,
        requests: list[RemotingCommand],
        verdicts: list[DeferredCheck | None],
        connection: Connection,
    ) -> None:
        """Run the deferred checks of one read in the worker thread, then answer the
        refused requests and route the others, in their order."""
        checks = [verdict for verdict in verdicts if verdict is not None]
        decided = False
        try:
            try:
                results = await connection._loop.run_in_executor(
                    _guard_worker(), _decide_all, checks)
            except Exception as exc:
                log.exception("deferred request check from %s failed; refusing",
                              connection.remote_address)
                failure = (ResponseCode.SYSTEM_ERROR,
                           f"the request could not be checked: {describe_exception(exc)}")
                results = [failure] * len(checks)
            decided = True
            outcome = iter(results)
            passed = []
            for request, verdict in zip(requests, verdicts, strict=True):
                refusal = next(outcome) if verdict is not None else None
                if refusal is None:
                    passed.append(request)
                else:
                    self._refuse(request, connection, *refusal)
            if len(passed) == 1:
                self._dispatch_checked(passed[0], connection)
            elif passed:
                self._dispatch_grouped(passed, connection)
        finally:
            if not decided:  # cancelled while waiting (shutdown): nothing will answer them
                for _ in requests:
                    connection._request_done()

    def _refuse(self, request: RemotingCommand, connection: Connection, code: int,
                remark: str) -> None:
        _refuse(request, connection, code, remark)
        if self._observer is not None:
            self._observer(request.code, code, 0.0, 1)

    async def wait_idle(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every running handler to finish.

        Returns:
            How many are still running at the end (0 when all finished).
        """
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        return len(self._tasks)

    async def cancel_all(self) -> None:
        """Cancel every running handler and wait for them to end."""
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


async def _serve(route: _Route, request: RemotingCommand, connection: Connection,
                 observer: RequestObserver | None = None,
                 awaitable: Awaitable[RemotingCommand | LaterResponse | None] | None = None,
                 started: float | None = None) -> None:
    """Run ``route``'s handler for ``request`` (or finish ``awaitable``, what an immediate
    handler left to wait for, started at ``started``) and write its response."""
    if started is None:
        started = time.perf_counter() if observer is not None else 0.0
    later = False
    try:
        try:
            if awaitable is None:
                awaitable = route.handler(request, connection)  # type: ignore[assignment]
            response = await awaitable  # type: ignore[misc]
        except Exception as exc:
            response = _handler_failed(request, connection, exc)
        if isinstance(response, LaterResponse):
            later = True
            response.on_resolved(partial(_finish_later, route, request, connection, observer,
                                     started))
            return
        _answer_observed(request, response, connection, observer, started)
    finally:
        if not later:
            route.pending -= 1
            connection._request_done()


def _answer_observed(request: RemotingCommand, response: RemotingCommand | None,
                     connection: Connection, observer: RequestObserver | None,
                     started: float) -> None:
    """Write ``response`` (None: nothing to write) and tell the observer how it went."""
    if response is not None:
        _answer(request, response, connection)
    if observer is not None:
        observer(request.code, NO_RESPONSE if response is None else response.code,
                 time.perf_counter() - started, 1)


def _finish_later(route: _Route, request: RemotingCommand, connection: Connection,
                  observer: RequestObserver | None, started: float,
                  response: RemotingCommand) -> None:
    """What ``_serve`` does after its handler, for a ``LaterResponse`` resolved."""
    try:
        _answer_observed(request, response, connection, observer, started)
    finally:
        route.pending -= 1
        connection._request_done()


async def _serve_group(
    route: _Route, requests: list[RemotingCommand], connection: Connection,
    observer: RequestObserver | None = None, flush: bool = True,
    awaitable: Awaitable[list[RemotingCommand | LaterResponse | None]] | None = None,
    started: float | None = None,
) -> None:
    """Run ``route``'s group handler for ``requests`` (or finish ``awaitable``, what an
    immediate group handler left to wait for, started at ``started``); answer them."""
    if started is None:
        started = time.perf_counter() if observer is not None else 0.0
    try:
        if awaitable is None:
            awaitable = route.group_handler(requests, connection)  # type: ignore[misc]
        answered = _counted(await awaitable, requests)  # type: ignore[misc]
    except Exception as exc:
        answered = _group_failed(requests, connection, exc)
    except BaseException:  # cancelled (shutdown): nothing will answer them
        _group_done(route, connection, len(requests))
        raise
    _answer_group(route, requests, answered, connection, observer, flush, started)


def _handler_failed(request: RemotingCommand, connection: Connection,
                    exc: Exception) -> RemotingCommand:
    """Log a handler's unexpected exception; the SYSTEM_ERROR answer naming it."""
    log.exception("handler for %s from %s failed", request.describe(), connection.remote_address)
    return RemotingCommand(ResponseCode.SYSTEM_ERROR, remark=describe_exception(exc))


def _counted(responses: list[RemotingCommand | LaterResponse | None] | EncodedAnswers,
             requests: list[RemotingCommand]
             ) -> list[RemotingCommand | LaterResponse | None] | EncodedAnswers:
    """``responses`` once checked to answer each request (``EncodedAnswers`` answer all)."""
    if type(responses) is EncodedAnswers:
        return responses
    if len(responses) != len(requests):
        raise RuntimeError(
            f"group handler answered {len(responses)} responses to {len(requests)} requests"
        )
    return responses


def _group_failed(requests: list[RemotingCommand], connection: Connection,
                  exc: Exception) -> list[RemotingCommand | LaterResponse | None]:
    log.exception(
        "group handler for %d requests (first %s) from %s failed",
        len(requests),
        requests[0].describe(),
        connection.remote_address,
    )
    remark = describe_exception(exc)
    return [RemotingCommand(ResponseCode.SYSTEM_ERROR, remark=remark) for _ in requests]


def _answer_group(
    route: _Route, requests: list[RemotingCommand],
    responses: list[RemotingCommand | LaterResponse | None] | EncodedAnswers,
    connection: Connection, observer: RequestObserver | None, flush: bool, started: float,
) -> None:
    """Write a group's responses, then its requests' bookkeeping (a ``LaterResponse``'s when
    it is resolved)."""
    if type(responses) is EncodedAnswers:
        _answer_encoded(route, requests, responses, connection, observer, flush, started)
        return
    later = 0  # requests answered by a LaterResponse: their bookkeeping is _finish_later's
    try:
        parts: list[bytes | memoryview] = []  # the responses' frames, written in one step
        for request, response in zip(requests, responses, strict=True):
            if isinstance(response, LaterResponse):
                later += 1
                if parts:  # what came before it is written first, in order
                    connection.send_encoded(parts)
                    parts = []
                response.on_resolved(partial(_finish_later, route, request, connection, observer,
                                         started))
            elif response is not None:
                parts += _encoded_answer(request, response, connection)
        if parts:
            connection.send_encoded(parts)
        if observer is not None:
            _observe_group(observer, requests, responses, time.perf_counter() - started)
        # Out now, not at the end of the loop iteration: the peer works on these responses
        # while the next read's groups are served (GROUP_REQUESTS_MAX).
        if flush:
            connection._flush()
    finally:
        _group_done(route, connection, len(requests) - later)


def _answer_encoded(
    route: _Route, requests: list[RemotingCommand], answers: EncodedAnswers,
    connection: Connection, observer: RequestObserver | None, flush: bool, started: float,
) -> None:
    """``_answer_group`` for a group answered with ``EncodedAnswers``."""
    try:
        connection.send_encoded([answers.frames])
        if observer is not None:
            observer(requests[0].code, answers.code, time.perf_counter() - started,
                     len(requests))
        if flush:
            connection._flush()
    finally:
        _group_done(route, connection, len(requests))


def _group_done(route: _Route, connection: Connection, served: int) -> None:
    route.pending -= served
    if served:
        connection._request_done(served)


def _observe_group(observer: RequestObserver, requests: list[RemotingCommand],
                   responses: list[RemotingCommand | LaterResponse | None],
                   seconds: float) -> None:
    """One observation per response code of the group (usually one: all succeeded);
    a ``LaterResponse`` is observed when resolved."""
    codes: dict[int, int] = {}
    for response in responses:
        if isinstance(response, LaterResponse):
            continue
        code = NO_RESPONSE if response is None else response.code
        codes[code] = codes.get(code, 0) + 1
    for code, count in codes.items():
        observer(requests[0].code, code, seconds, count)


def _answer(request: RemotingCommand, response: RemotingCommand, connection: Connection) -> None:
    """Write ``response`` to ``request`` (RocketMQ's processor contract, module docstring)."""
    parts = _encoded_answer(request, response, connection)
    if parts:
        connection.send_encoded(parts)


def _encoded_answer(request: RemotingCommand, response: RemotingCommand,
                    connection: Connection) -> list[bytes | memoryview]:
    """The frame parts answering ``request`` with ``response`` (opaque, response flag and
    serialize type set from the request; a SYSTEM_ERROR naming the problem when it cannot
    be encoded), none for a oneway request: written alone (``_answer``) or with the other
    answers of its group, in one ``Connection.send_encoded``."""
    if request.flag & FLAG_ONEWAY:
        log.debug(
            "handler answered oneway %s from %s; response dropped",
            request.describe(),
            connection.remote_address,
        )
        return []
    response.opaque = request.opaque
    response.flag |= FLAG_RESPONSE
    response.serialize_type = request.serialize_type
    try:
        return response.encode_parts()
    except Exception as exc:  # the response cannot be encoded: say so instead
        log.exception(
            "response to %s for %s cannot be sent",
            request.describe(),
            connection.remote_address,
        )
        return RemotingCommand.response_to(
            request,
            ResponseCode.SYSTEM_ERROR,
            remark=f"response cannot be encoded: {describe_exception(exc)}",
        ).encode_parts()


def _refuse(request: RemotingCommand, connection: Connection, code: int, remark: str) -> None:
    try:
        if request.flag & FLAG_ONEWAY:
            log.debug(
                "oneway %s from %s refused: %s",
                request.describe(),
                connection.remote_address,
                remark,
            )
        else:
            connection.send_response(RemotingCommand.response_to(request, code, remark=remark))
    finally:
        connection._request_done()


def _busy_remark(request: RemotingCommand, route: _Route) -> str:
    name = request_code_name(request.code)
    label = name if name.startswith("code ") else f"{name} (code {request.code})"
    return (
        f"[REJECTREQUEST]system busy, {route.pending} requests of {label} are already being "
        f"handled, the limit (max_pending) is {route.max_pending}; try again later"
    )


def describe_exception(exc: BaseException) -> str:
    """``"<Type>: <message> (at <file>:<line> in <function>)"`` for a SYSTEM_ERROR remark.

    The place is the innermost frame of the traceback, which is usually what a maintainer
    reading the client's log needs first.
    """
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    traceback = exc.__traceback__
    if traceback is not None:
        while traceback.tb_next is not None:
            traceback = traceback.tb_next
        code = traceback.tb_frame.f_code
        where = f"{os.path.basename(code.co_filename)}:{traceback.tb_lineno}"
        text += f" (at {where} in {code.co_name})"
    if len(text) > ERROR_REMARK_LENGTH_MAX:
        text = text[: ERROR_REMARK_LENGTH_MAX - 3] + "..."
    return text


def _checked_max_pending(max_pending: int) -> int:
    if max_pending < 1:
        raise ValueError(f"max_pending is {max_pending}; it must be at least 1")
    return max_pending

"""Fixtures for broker tests: a BrokerController on a store in a tmp dir, and ways to talk to it.

- ``make_broker(**broker_config_overrides, store_kind="memory"|"file", store_overrides=...)``
  builds a ``BrokerController`` (not started) on a ``MemoryMessageStore`` (default) or a
  ``FileMessageStore`` with small segments, in its own tmp dir, listening on port 0 once
  started; ``wrap_store=f`` hands the broker ``f(store)`` instead (a test double around it).
  A broker started but not shut down by the test is shut down on its own loop when
  ``asyncio.run`` ends that loop (so one ``asyncio.run`` per broker's life); one never
  started is shut down at teardown.
- ``broker``: ``make_broker()``.
- ``handlers``: ``handlers(broker)`` -> a ``HandlerTable`` holding exactly the handlers the
  controller registers on its server; ``await table.ask(request, peer)`` calls the handler
  of ``request.code`` in-process (the admin processor answers codes nobody serves).
- ``FakePeer``: stands in for a ``Connection`` when a handler is called directly (a remote
  address, ``attributes``, ``on_close``); use the loopback link for anything more.
- ``serve``: ``async with serve(broker) as link`` starts the broker on a real loopback
  RemotingServer, yields a ``BrokerLink`` whose ``invoke(request)`` goes over TCP through a
  RemotingClient, and shuts the broker down at the end.
- ``fake_namesrv``: ``async with fake_namesrv() as ns`` runs a real RemotingServer on
  127.0.0.1 port 0 that records REGISTER_BROKER / UNREGISTER_BROKER requests and answers
  SUCCESS (or ``ns.answer_code``); ``await ns.wait_registrations(n)`` waits (bounded) until n
  registrations arrived.

Tests run coroutines with ``asyncio.run`` inside plain test functions (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tidemq.broker.config import BrokerConfig
from tidemq.broker.controller import BrokerController
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.dispatch import LaterResponse
from tidemq.remoting.server import RemotingServer
from tidemq.store.config import StoreConfig

# Small files so a FileMessageStore in a test creates kilobytes, not gigabytes: 8 MiB commit
# log segments hold the largest message a test sends (4 MiB + headers).
TEST_STORE_SETTINGS: dict[str, Any] = {
    "mapped_file_size_commit_log": 8 * 1024 * 1024,
    "mapped_file_size_consume_queue": 20 * 1024,
    "max_hash_slot_num": 1024,
    "max_index_num": 4096,
}

# Bound on any wait for something a test expects to happen (never a timing assertion).
WAIT_BOUND_S = 10.0


class FakePeer:
    """The parts of a Connection a handler reads when called directly."""

    def __init__(self, remote_address: str = "127.0.0.1:40001") -> None:
        self.remote_address = remote_address
        self.attributes: dict[str, Any] = {}
        self.on_close: list[Callable[[Any], None]] = []
        self.is_closing = False
        self.loop = asyncio.get_running_loop()

    def flush(self) -> None:
        """Nothing is corked here: a handler's responses are returned to the caller."""


async def resolved(response: Any) -> Any:
    """``response`` as the peer gets it: a ``LaterResponse`` (a SYNC_FLUSH send's) once
    resolved, anything else as it is."""
    if isinstance(response, LaterResponse):
        answer: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        response.on_resolved(answer.set_result)
        return await answer
    return response


class HandlerTable:
    """Collects ``register``/``register_default`` calls, as a RemotingServer would."""

    def __init__(self) -> None:
        self.handlers: dict[int, Any] = {}
        self.immediate: set[int] = set()  # codes whose handler is a plain function
        self.default: Any = None

    def register(self, code: int, handler: Any, *, immediate: bool = False, **_: Any) -> None:
        self.handlers[int(code)] = handler
        if immediate:
            self.immediate.add(int(code))

    def register_default(self, handler: Any, **_: Any) -> None:
        self.default = handler

    async def ask(
        self, request: RemotingCommand, peer: Any = None, *, peer_address: str | None = None
    ) -> RemotingCommand:
        """Call the handler of ``request.code`` and return its response.

        ``peer`` is the connection the handler sees; by default a ``FakePeer`` (at
        ``peer_address`` when given).
        """
        handler = self.handlers.get(request.code, self.default)
        assert handler is not None, f"no handler for code {request.code}"
        if peer is None:
            peer = FakePeer(peer_address) if peer_address else FakePeer()
        if request.code in self.immediate and request.code in self.handlers:
            response = handler(request, peer)  # answered in place, or what to wait for
            if inspect.isawaitable(response):
                response = await response
            response = await resolved(response)
        else:
            response = await resolved(await handler(request, peer))
        assert response is not None, f"handler of code {request.code} answered nothing"
        return response


class BrokerLink:
    """A started broker and a RemotingClient connected to it over loopback."""

    def __init__(self, broker: BrokerController, client: RemotingClient) -> None:
        self.broker = broker
        self.client = client

    @property
    def address(self) -> str:
        return self.broker.broker_address

    async def invoke(self, request: RemotingCommand, timeout_ms: int = 5000) -> RemotingCommand:
        return await self.client.invoke(self.address, request, timeout_ms)


class FakeNameServer:
    """A real RemotingServer recording what brokers register."""

    def __init__(self) -> None:
        self.server = RemotingServer("127.0.0.1", [0])
        self.registrations: list[RemotingCommand] = []
        self.unregistrations: list[RemotingCommand] = []
        self.answer_code = ResponseCode.SUCCESS
        self._arrived = asyncio.Condition()
        self.server.register(RequestCode.REGISTER_BROKER, self._register)
        self.server.register(RequestCode.UNREGISTER_BROKER, self._unregister)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.bound_ports[0]}"

    async def _register(self, request: RemotingCommand, connection: Any) -> RemotingCommand:
        self.registrations.append(request)
        async with self._arrived:
            self._arrived.notify_all()
        return RemotingCommand.response_to(request, self.answer_code, "fake name server")

    async def _unregister(self, request: RemotingCommand, connection: Any) -> RemotingCommand:
        self.unregistrations.append(request)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def wait_registrations(self, count: int) -> list[RemotingCommand]:
        """Wait (at most WAIT_BOUND_S) until ``count`` registrations arrived."""
        async with asyncio.timeout(WAIT_BOUND_S), self._arrived:
            await self._arrived.wait_for(lambda: len(self.registrations) >= count)
        return self.registrations


def make_store(kind: str, store_config: StoreConfig) -> Any:
    """A MemoryMessageStore or FileMessageStore for ``store_config``."""
    if kind == "memory":
        from tidemq.store.memory_store import MemoryMessageStore

        return MemoryMessageStore(store_config)
    if kind == "file":
        from tidemq.store.file_store import FileMessageStore

        return FileMessageStore(store_config)
    raise ValueError(f"store kind {kind!r}: expected 'memory' or 'file'")


def _shut_down_with_its_loop(broker: BrokerController,
                             guards: list[AsyncGenerator[None, None]]) -> None:
    """Make ``broker`` shut down on the loop it was started on, when that loop ends.

    A test that fails between ``await broker.start()`` and its own shutdown (a port taken
    under load, an assertion) leaves the broker running when ``asyncio.run`` returns; its
    tasks, futures and sockets belong to that loop, which is closed by then, so a shutdown
    at fixture teardown on a new loop failed with "Event loop is closed" and reported an
    ERROR besides the test's failure. Instead, starting the broker also starts an async
    generator on its loop; ``asyncio.run`` (and ``asyncio.Runner``) finalizes the async
    generators still suspended before it closes the loop, and this one's ``finally`` shuts
    the broker down there, cleanly, after the loop's other tasks were cancelled.
    """
    start = broker.start

    async def until_the_loop_ends() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            if not broker.stopped:
                await broker.shutdown(grace_s=1.0)

    async def start_guarded() -> None:
        guard = until_the_loop_ends()
        await anext(guard)  # suspended at its yield: the running loop now finalizes it
        guards.append(guard)  # the loop holds it weakly; the test keeps it alive
        await start()

    broker.start = start_guarded  # type: ignore[method-assign]


@pytest.fixture
def make_broker(tmp_path: Path):
    """Factory of BrokerControllers (not started), each with its own store directory."""
    made: list[BrokerController] = []

    def make(
        *,
        store_kind: str = "memory",
        store_overrides: dict[str, Any] | None = None,
        root: Path | None = None,
        wrap_store: Callable[[Any], Any] | None = None,
        **overrides: Any,
    ) -> BrokerController:
        overrides.setdefault("listen_port", 0)
        config = BrokerConfig(**overrides)
        store_root = root or tmp_path / f"broker-{len(made)}"
        settings = {**TEST_STORE_SETTINGS, **(store_overrides or {})}
        store_config = StoreConfig(
            store_path_root_dir=str(store_root), store_host=config.broker_address, **settings
        )
        store = make_store(store_kind, store_config)
        if wrap_store is not None:
            store = wrap_store(store)
        broker = BrokerController(config, store_config, store=store)
        _shut_down_with_its_loop(broker, guards)
        made.append(broker)
        return broker

    guards: list[AsyncGenerator[None, None]] = []
    yield make
    for broker in made:
        if broker.stopped:
            continue
        if not broker.started:
            asyncio.run(broker.shutdown(grace_s=1.0))  # nothing of it is bound to a loop yet
        else:
            # Started on a loop that ended without asyncio.run's finalization (the guard
            # below never ran): its tasks and sockets belong to that closed loop, and
            # shutting it down on another would only raise "Event loop is closed". Closing
            # the store releases its files and lock; the test's own failure says the rest.
            broker.store.close()


@pytest.fixture
def broker(make_broker) -> BrokerController:
    """A broker on a MemoryMessageStore with default settings (not started)."""
    return make_broker()


@pytest.fixture
def handlers() -> Callable[[BrokerController], HandlerTable]:
    """``handlers(broker)``: the broker's request handlers, callable in-process."""

    def table_of(broker: BrokerController) -> HandlerTable:
        table = HandlerTable()
        broker.register_processors(table)
        return table

    return table_of


@pytest.fixture
def serve():
    """``async with serve(broker) as link``: the broker started on loopback, then shut down."""

    @contextlib.asynccontextmanager
    async def serving(broker: BrokerController) -> AsyncIterator[BrokerLink]:
        await broker.start()
        client = RemotingClient()
        try:
            yield BrokerLink(broker, client)
        finally:
            await client.close()
            await broker.shutdown(grace_s=1.0)

    return serving


@pytest.fixture
def fake_namesrv():
    """``async with fake_namesrv() as ns``: a recording name server on 127.0.0.1."""

    @contextlib.asynccontextmanager
    async def running() -> AsyncIterator[FakeNameServer]:
        namesrv = FakeNameServer()
        await namesrv.server.start()
        try:
            yield namesrv
        finally:
            await namesrv.server.stop(grace_s=1.0)

    return running

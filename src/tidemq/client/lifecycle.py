"""The life cycle every client object shares: new -> running -> (closing ->) closed.

``ClientLifecycle`` is the base of PullConsumer, PushConsumer and Admin (the producers adopt
it later). It holds the state, makes ``async with`` start and close the client, and gives the
checks and messages that go with the states:

- ``_begin_start()`` at the top of ``start()``: False when already running (start is
  idempotent); ClientStateError when the client was closed (or is closing), since a closed
  client cannot be started again.
- ``_begin_close()`` at the top of ``close()``: None when already closing or closed (close is
  idempotent); otherwise the state becomes ``closing`` and the answer says whether the client
  was running, i.e. whether there is work to undo. ``_closed()`` ends it.
- ``_check_running()`` in every call that needs a started client.

``cancel_tasks`` and ``leave_quietly`` are the two steps of closing that several clients
share: stop background tasks, and unregister from the brokers without letting a dead broker
hold the close up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tidemq.client.errors import ClientStateError
from tidemq.errors import TidemqError
from tidemq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from tidemq.client.instance import ClientInstance


class ClientLifecycle:
    """State and state checks of a client; subclasses define ``start`` and ``close`` and
    set ``_client_name`` (how messages name the client, e.g. ``consumer 'cg'``)."""

    _client_name = "client"
    _state = "new"

    @property
    def state(self) -> str:
        """``new``, ``running``, ``closing`` or ``closed``."""
        return self._state

    async def start(self) -> None:
        """Start the client (defined by each client)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close the client (defined by each client)."""
        raise NotImplementedError

    async def __aenter__(self) -> Any:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _begin_start(self) -> bool:
        """True when ``start`` has work to do; False when the client already runs.

        Raises:
            ClientStateError: the client is closing or closed.
        """
        if self._state == "running":
            return False
        if self._state in ("closing", "closed"):
            raise ClientStateError(
                f"{self._client_name} is {self._state}; create a new one")
        return True

    def _begin_close(self) -> bool | None:
        """Enter ``closing``; returns whether the client was running, or None when it is
        closing or closed already (nothing to do)."""
        if self._state in ("closing", "closed"):
            return None
        was_running = self._state == "running"
        self._state = "closing"
        return was_running

    def _closed(self) -> None:
        self._state = "closed"

    def _check_running(self) -> None:
        """Raises ClientStateError unless the client is running."""
        if self._state != "running":
            raise ClientStateError(
                f"{self._client_name} is {self._state}; call start() (or use "
                f"'async with {type(self).__name__}(...)') first")


async def cancel_tasks(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait for each to end; whatever they raise is dropped (they are
    background loops whose errors were logged where they happened)."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def leave_quietly(instance: ClientInstance, *, producer_group: str | None = None,
                        consumer_group: str | None = None) -> None:
    """UNREGISTER_CLIENT at every broker, bounded by the instance's request timeout; a broker
    that is down or slow only makes the others notice later (the broker drops silent clients
    after 120 s), so failures are not raised."""
    with contextlib.suppress(TimeoutError, RemotingError, TidemqError):
        await asyncio.wait_for(
            instance.unregister(producer_group=producer_group, consumer_group=consumer_group),
            instance.request_timeout_ms / 1000)

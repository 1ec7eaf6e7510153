"""Fixtures for the client unit tests: ``run(coro)`` runs a coroutine on a fresh loop,
once on asyncio's own loop and once on uvloop (what ``tidemq.sync`` and the CLI use).

pytest-asyncio is not used: each test is a plain function that calls ``run(main())``. The
whole coroutine is bounded in time (a hang fails the test instead of stalling the suite), and
anything the loop's exception handler sees (an exception in a callback, a task never awaited)
fails the test too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from tidemq.remoting.loop import new_event_loop

# Far above what any test needs: only a hang trips it.
TEST_TIMEOUT_S = 30.0


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """``run(coro)``: run ``coro`` to completion on a new event loop, bounded in time."""
    factory = asyncio.new_event_loop if request.param == "asyncio" else new_event_loop

    def _run(coro: Coroutine[Any, Any, Any]) -> Any:
        problems: list[dict[str, Any]] = []

        async def main() -> Any:
            asyncio.get_running_loop().set_exception_handler(
                lambda loop, context: problems.append(context)
            )
            async with asyncio.timeout(TEST_TIMEOUT_S):
                return await coro

        with asyncio.Runner(loop_factory=factory) as runner:
            result = runner.run(main())
        assert not problems, f"the event loop reported: {problems}"
        return result

    return _run

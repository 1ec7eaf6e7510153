"""Fixtures for the remoting tests: run a coroutine on asyncio's loop and on uvloop.

pytest-asyncio is not used: each test is a plain function that calls ``run(main())``, which
runs ``main`` on a fresh loop with an overall time bound (a hung test fails, it never hangs
the suite) and fails the test if the loop's exception handler saw anything (an exception in
a callback or a task nobody awaited).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from tidemq.remoting.loop import new_event_loop

# Bounds a whole test's coroutine: far above what any of them needs, so only a hang trips it.
TEST_TIMEOUT_S = 30.0


def _loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    return asyncio.new_event_loop if kind == "asyncio" else new_event_loop


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """``run(coro)``: run ``coro`` on a new loop of the parametrized kind, bounded in time."""
    factory = _loop_factory(request.param)

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

"""The event loop tidemq runs on: uvloop where it is importable, asyncio's own otherwise.

uvloop roughly halves the per-request cost of the transport (protocol callbacks, timers and
socket writes are in C), so servers and clients should use it; it is optional so that tidemq
still runs where no wheel exists (Windows, exotic platforms).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

try:  # optional dependency: a missing or broken uvloop falls back to asyncio's loop
    import uvloop
except ImportError:  # pragma: no cover - uvloop is installed wherever tests run
    uvloop = None

T = TypeVar("T")


def uvloop_available() -> bool:
    """Return True when uvloop can be imported here."""
    return uvloop is not None


def new_event_loop() -> asyncio.AbstractEventLoop:
    """Create a new event loop: a uvloop loop when available, asyncio's default otherwise.

    The caller owns the loop (set it current, run it, close it).
    """
    if uvloop is not None:
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def install_event_loop_policy() -> bool:
    """Make ``asyncio.new_event_loop`` / ``asyncio.run`` create uvloop loops in this process.

    Returns:
        True when uvloop's policy was installed, False when uvloop is not available (the
        default policy stays).
    """
    if uvloop is None:
        return False
    # uvloop.install() warns from Python 3.12 on; setting the policy directly does not.
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run ``main`` to completion on a fresh loop from ``new_event_loop`` (like ``asyncio.run``).

    Returns:
        What ``main`` returned.
    """
    with asyncio.Runner(debug=debug, loop_factory=new_event_loop) as runner:
        return runner.run(main)

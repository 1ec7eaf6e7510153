"""The event loop helpers pick uvloop when it is installed (it is, wherever tests run)."""

from __future__ import annotations

import asyncio

import uvloop

from tidemq.remoting import install_event_loop_policy, new_event_loop
from tidemq.remoting.loop import run, uvloop_available


def test_new_event_loop_is_a_uvloop_loop():
    loop = new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_install_event_loop_policy_makes_asyncio_create_uvloop_loops():
    try:
        assert install_event_loop_policy() is True
        loop = asyncio.new_event_loop()
        try:
            assert isinstance(loop, uvloop.Loop)
        finally:
            loop.close()
    finally:
        asyncio.set_event_loop_policy(None)


def test_run_returns_the_result_of_main_run_on_uvloop():
    async def main() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert uvloop_available()
    assert run(main()).startswith("uvloop")

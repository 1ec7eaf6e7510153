"""Helpers shared by the remoting tests (imported by module name; pytest puts this folder on
sys.path)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.command import RemotingCommand, decode_command


async def echo(request: RemotingCommand, connection: Any) -> RemotingCommand:
    """A handler answering SUCCESS with the request's body and ext fields."""
    return RemotingCommand.response_to(
        request, ResponseCode.SUCCESS, ext_fields=request.ext_fields, body=request.body
    )


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """One whole frame (length prefix included) from a raw stream; None at EOF or reset."""
    try:
        head = await reader.readexactly(4)
        rest = await reader.readexactly(struct.unpack(">i", head)[0])
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return head + rest


async def read_command(reader: asyncio.StreamReader) -> RemotingCommand | None:
    """The next command from a raw stream; None at EOF."""
    frame = await read_frame(reader)
    return None if frame is None else decode_command(frame[4:])


async def wait_until(condition: Any, timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll ``condition()`` every 10 ms until true; fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)

"""A broker connection's peer with no socket, for the in-process cost harnesses.

A helper of send_cost_bench.py, batch_cost_bench.py and pull_cost_bench.py, not a benchmark:
it has no ``main``. One class (and one socket stand-in) for all, so that when the send
processor, the dispatcher or a connection starts using another attribute of its peer, one
place learns it (a stale copy once made a harness crash).
"""

from __future__ import annotations

import asyncio
from typing import Any


class AnsweringPeer:
    """What the broker's send processor and request dispatcher use of a connection: answers
    are encoded as a real connection encodes them, counted in ``answered[0]`` (a list, so a
    socket stand-in can share the count), and dropped."""

    remote_address = "127.0.0.1:45678"
    is_closing = False

    def __init__(self, answered: list[int] | None = None) -> None:
        self.answered = answered if answered is not None else [0]
        self.attributes: dict[str, Any] = {}
        self.on_close: list[Any] = []

    def send_response(self, response: Any) -> bool:
        """Encode one answer (a ``RemotingCommand``) and count it."""
        response.encode_parts()
        self.answered[0] += 1
        return True

    def send_encoded(self, parts: list[Any]) -> bool:
        """Count answers already encoded (one frame per answer, however they are split
        into parts: a group's answers may come as one part)."""
        self.answered[0] += count_frames(parts)
        return True

    def _flush(self) -> None:  # the cork's write: no socket here
        pass

    flush = _flush

    def _request_done(self, count: int = 1) -> None:
        pass


def count_frames(parts: list[Any]) -> int:
    """How many frames start in ``parts`` (whole frames, back to back, each part holding
    the starts of one or more frames or the rest of one, such as a body left uncopied)."""
    count = 0
    left = 0  # bytes of the current frame still to come in the next parts
    for part in parts:
        size = len(part)
        position = left
        while position < size:
            count += 1
            position += 4 + int.from_bytes(part[position:position + 4], "big")
        left = position - size
    return count


class CountingTransport(asyncio.Transport):
    """What a real remoting connection uses of its socket: writes count the frames (into
    ``answered[0]``, shared with the harness) and are dropped; nothing is read from it."""

    def __init__(self, answered: list[int]) -> None:
        super().__init__()
        self._answered = answered
        self._closing = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 45678) if name in ("peername", "sockname") else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self._closing

    def writelines(self, parts) -> None:  # type: ignore[no-untyped-def]
        self._answered[0] += count_frames(parts)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self._closing = True

    def abort(self) -> None:
        self._closing = True

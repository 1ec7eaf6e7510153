"""SYNC_MASTER's waits: sends answered once a slave has acknowledged their bytes.

RocketMQ's GroupTransferService, on the event loop. A send that must wait registers the end
offset of its bytes in the commit log and gets a future; every acknowledgement a slave
reports completes *all* waits at or below it at once, so many waiting sends share one round
trip (a group commit, like SYNC_FLUSH's). Appends happen in commit-log order, so waits are
registered with growing end offsets and a deque keeps them sorted: an acknowledgement pops
from the left.

A wait that nobody acknowledges within ``syncFlushTimeout`` is answered FLUSH_SLAVE_TIMEOUT by
its sender (``wait``); when the last slave connection closes, every wait still queued is
answered at once with False (the slave is gone; the send is stored on the master only).

Owner: the event loop; nothing here is touched from another thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class TransferWaits:
    """End offsets waiting for a slave's acknowledgement."""

    def __init__(self) -> None:
        self._waits: deque[tuple[int, asyncio.Future[bool]]] = deque()
        self.acked_offset = 0  # the highest offset any slave acknowledged

    def register(self, end_offset: int) -> asyncio.Future[bool]:
        """A future that becomes True once a slave acknowledged ``end_offset``."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if end_offset <= self.acked_offset:
            future.set_result(True)
            return future
        waits = self._waits
        if waits and waits[-1][0] > end_offset:
            # Not in order (a put finished out of order): keep the deque sorted.
            index = len(waits)
            while index > 0 and waits[index - 1][0] > end_offset:
                index -= 1
            waits.insert(index, (end_offset, future))
        else:
            waits.append((end_offset, future))
        return future

    def acknowledge(self, offset: int) -> None:
        """A slave has every byte below ``offset``: complete the waits it covers."""
        if offset <= self.acked_offset:
            return
        self.acked_offset = offset
        waits = self._waits
        while waits and waits[0][0] <= offset:
            _, future = waits.popleft()
            if not future.done():
                future.set_result(True)

    def fail_all(self) -> None:
        """No slave is left: answer every wait with False."""
        waits, self._waits = self._waits, deque()
        for _, future in waits:
            if not future.done():
                future.set_result(False)

    def reset_acked(self, offset: int) -> None:
        """Forget acknowledgements above ``offset`` (the slaves that gave them are gone)."""
        self.acked_offset = min(self.acked_offset, offset)

    async def wait(self, end_offset: int, timeout_s: float) -> bool:
        """True once a slave acknowledged ``end_offset``; False on timeout or when the last
        slave went away first."""
        future = self.register(end_offset)
        if future.done():
            return future.result()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(future)
        return False

    def __len__(self) -> int:
        return len(self._waits)

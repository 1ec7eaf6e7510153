"""When a consumer re-shares its group's queues: every interval, and at once when asked.

Both consumers (pull_consumer.py in subscribe mode, push_consumer.py) re-balance on a timer
(RocketMQ's 20 s) and whenever something changes the answer: a broker's
NOTIFY_CONSUMER_IDS_CHANGED, a new subscription, an offset reset. Requests that arrive while
one runs fold into the next run; a failed run is logged and the next one tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("tidemq.client")


class RebalanceTrigger:
    """Runs ``rebalance`` every ``interval_ms`` and soon after each ``request()``, one run at
    a time; ``run_once`` and the loop never raise for a failed run (it is logged).

    Args:
        group: the consumer group, for the log.
        interval_ms: the timer's period.
        rebalance: one re-balance (a consumer that has nothing to re-balance, such as a pull
            consumer given its queues by ``assign``, returns at once).
    """

    def __init__(self, group: str, interval_ms: int,
                 rebalance: Callable[[], Awaitable[None]]) -> None:
        self.group = group
        self.interval_ms = interval_ms
        self._rebalance = rebalance
        self._requested: asyncio.Event | None = None

    def arm(self) -> None:
        """Take requests from now on (the consumer is starting); earlier ones are dropped."""
        self._requested = asyncio.Event()

    def request(self) -> None:
        """Re-balance soon (a no-op before ``arm``)."""
        if self._requested is not None:
            self._requested.set()

    async def loop(self) -> None:
        """The timer: runs until cancelled (``arm`` first)."""
        requested = self._requested
        assert requested is not None, "arm() the trigger before its loop"
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_ms / 1000):
                    await requested.wait()
            requested.clear()
            await self.run_once()

    async def run_once(self) -> None:
        """One re-balance now; a failure is logged, not raised."""
        try:
            await self._rebalance()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("consumer %s: re-balance failed", self.group)

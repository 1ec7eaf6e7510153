"""Live metrics for the console's charts: every few seconds, each broker's runtime info
(the same GET_BROKER_RUNTIME_INFO table ``tidemq admin brokerStatus`` shows) is read and
its put and get rates kept in a short ring per broker.

Owner: one asyncio task on the console's loop; pages only read the rings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from tidemq.client.admin import Admin

log = logging.getLogger("tidemq.console")

SAMPLE_INTERVAL_S = 5.0
SAMPLES_KEPT = 60  # five minutes at one sample every five seconds
# Groups whose lag is charted: the ones opened in the console lately, at most this many (each
# costs a GET_CONSUME_STATS per broker per sample).
WATCHED_GROUPS_MAX = 20


@dataclass(slots=True)
class BrokerSeries:
    """One broker's recent samples (oldest first) and its last runtime info."""

    put_tps: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES_KEPT))
    get_tps: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES_KEPT))
    sampled_at_ms: deque[int] = field(default_factory=lambda: deque(maxlen=SAMPLES_KEPT))
    runtime_info: dict[str, str] = field(default_factory=dict)


def first_rate(text: str | None) -> float:
    """The 10-second rate of a ``"<10s> <1min> <10min>"`` tps value (0 when unreadable)."""
    if not text:
        return 0.0
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return 0.0


class MetricsSampler:
    """Samples every broker's rates into ``series`` (broker address -> BrokerSeries)."""

    def __init__(self, admin: Admin, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self._admin = admin
        self._interval_s = interval_s
        self.series: dict[str, BrokerSeries] = {}
        self.group_lag: dict[str, deque[float]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="tidemq-console-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def watch_group(self, group: str) -> None:
        """Chart ``group``'s total lag from now on (the least recently watched group is
        forgotten beyond WATCHED_GROUPS_MAX)."""
        series = self.group_lag.pop(group, None)
        self.group_lag[group] = series if series is not None else deque(maxlen=SAMPLES_KEPT)
        while len(self.group_lag) > WATCHED_GROUPS_MAX:
            del self.group_lag[next(iter(self.group_lag))]

    async def sample_once(self) -> None:
        """Read every broker's runtime info once (failures are logged and skipped)."""
        cluster = await self._admin.cluster_list()
        addresses = sorted({address for broker in cluster.brokers.values()
                            for address in broker.broker_addrs.values()})
        infos = await asyncio.gather(
            *(self._admin.broker_runtime_info(address) for address in addresses),
            return_exceptions=True)
        now_ms = int(time.time() * 1000)
        for address, info in zip(addresses, infos, strict=True):
            if isinstance(info, BaseException):
                log.info("console: runtime info of broker %s unavailable: %s", address, info)
                continue
            series = self.series.setdefault(address, BrokerSeries())
            series.runtime_info = info
            series.put_tps.append(first_rate(info.get("putTps")))
            series.get_tps.append(first_rate(info.get("getTransferedTps")))
            series.sampled_at_ms.append(now_ms)
        for group, lags in list(self.group_lag.items()):
            try:
                stats = await self._admin.consume_stats(group)
            except Exception as e:
                log.info("console: lag of group %s unavailable: %s", group, e)
                continue
            lags.append(float(stats.total_lag))

    async def _run(self) -> None:
        while True:
            try:
                await self.sample_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a name server restart must not end the sampling
                log.info("console: sampling the brokers failed: %s", e)
            await asyncio.sleep(self._interval_s)

"""Broker statistics and the GET_BROKER_RUNTIME_INFO table (docs/protocol.md §5.5).

``BrokerStats`` counts what passes through the broker: messages put (by the send processor)
and messages got (by the pull processor, ``record_get``). It samples its totals once a second
(the controller calls ``sample``) so rates over 10 s, 1 min and 10 min windows can be given
the way RocketMQ's StoreStatsService gives them: ``"<10s> <1min> <10min>"``, two decimals.
It also keeps the totals at the last two local midnights, which mqadmin's ``clusterList``
subtracts to show "today" and "yesterday".

``runtime_info`` renders the KVTable. Only keys tidemq can fill truthfully are present (no
thread-pool queue sizes: tidemq has no thread pools); every value is a string, as in Java.

Owner: the event-loop thread. Everything here is touched only from it (counters are plain
ints; there is no lock).
"""

from __future__ import annotations

import datetime
import shutil
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from tidemq.protocol.codes import TIDEMQ_VERSION
from tidemq.protocol.message import POSITION_SYSFLAG, store_timestamp_position
from tidemq.store.interface import PutStatus
from tidemq.timings import LatencyTally

if TYPE_CHECKING:
    from tidemq.store.interface import MessageStore, PutResult

# The version we speak (V4_9_8), so admin tools show what they would for that broker.
BROKER_VERSION_DESC = "V4_9_8"

# RocketMQ keeps a little over 10 minutes of one-second samples: enough for its widest
# window (600 s); older samples are dropped.
SAMPLE_INTERVAL_MS = 1000
TPS_WINDOWS_S = (10, 60, 600)
_SAMPLES_MAX = TPS_WINDOWS_S[-1] + 2

_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


# A sample is (at_ms, put, get_found, get_miss, get_transferred); counters index into it.
_COUNTER_FIELDS = {
    "put": (1,),
    "get_found": (2,),
    "get_miss": (3,),
    "get_transferred": (4,),
    "get_total": (2, 3),
}


class BrokerStats:
    """Counters of one broker's puts and gets, with rate windows and midnight snapshots.

    Args:
        clock_ms: wall clock in ms (injectable for tests).
    """

    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self.boot_timestamp_ms = self._clock_ms()
        self.put_message_times_total = 0  # messages stored
        self.put_message_size_total = 0  # stored record bytes (RocketMQ counts whole records)
        self.put_message_failed_times = 0  # sends refused by the store
        self.put_message_entire_time_max_ms = 0  # slowest store put (incl. a SYNC_FLUSH wait)
        self.get_found_times = 0  # pulls that returned messages
        self.get_miss_times = 0  # pulls that returned none
        self.get_transferred_total = 0  # messages returned by pulls
        # For the metrics (tidemq/broker/metrics.py): per topic [messages, body bytes] stored,
        # per (topic, group) [messages, record bytes] pulled, and the store put latency.
        self.topic_puts: dict[str, list[int]] = {}
        self.topic_gets: dict[tuple[str, str], list[int]] = {}
        self.put_latency = LatencyTally()
        self._samples: deque[tuple[int, int, int, int, int]] = deque(maxlen=_SAMPLES_MAX)
        # Totals at the last two local midnights (RocketMQ's BrokerStats "morning" values);
        # before the first midnight both are the totals at boot, i.e. 0.
        self.put_total_today_morning = 0
        self.put_total_yesterday_morning = 0
        self.get_total_today_morning = 0
        self.get_total_yesterday_morning = 0
        self._day = self._local_day(self.boot_timestamp_ms)
        self.sample()

    # -- recording -------------------------------------------------------------------------

    def record_put(self, message_count: int, stored_bytes: int, elapsed_ms: int,
                   topic: str | None = None) -> None:
        """Count ``message_count`` messages stored (one send or one batch) of ``topic``,
        taking ``stored_bytes`` of commit log: whole records, as RocketMQ's
        putMessageSizeTotal, putMessageAverageSize and per-topic sizes count them."""
        self.put_message_times_total += message_count
        self.put_message_size_total += stored_bytes
        if elapsed_ms > self.put_message_entire_time_max_ms:
            self.put_message_entire_time_max_ms = elapsed_ms
        if topic is not None:
            totals = self.topic_puts.get(topic)
            if totals is None:
                self.topic_puts[topic] = [message_count, stored_bytes]
            else:
                totals[0] += message_count
                totals[1] += stored_bytes

    def record_put_result(self, result: PutResult, message_count: int, elapsed_ms: int,
                          topic: str) -> None:
        """Count one send or batch the store answered: ``record_put`` when it stored it,
        ``record_put_failure`` when it refused it."""
        if result.status is PutStatus.PUT_OK:
            self.record_put(message_count, result.wrote_bytes, elapsed_ms, topic)
        else:
            self.record_put_failure()

    def record_put_latency(self, seconds: float) -> None:
        """One store put (a send, a batch, or a group of sends stored together) took
        ``seconds``, a SYNC_FLUSH wait included."""
        self.put_latency.observe(seconds)

    def record_put_failure(self) -> None:
        """Count one send the store refused."""
        self.put_message_failed_times += 1

    def record_get(self, message_count: int, topic: str | None = None,
                   group: str | None = None, body_bytes: int = 0) -> None:
        """Count one pull that returned ``message_count`` messages (0 = a miss) of
        ``topic`` to ``group`` (``body_bytes``: the stored records sent)."""
        if message_count > 0:
            self.get_found_times += 1
            self.get_transferred_total += message_count
            if topic is not None:
                key = (topic, group or "")
                totals = self.topic_gets.get(key)
                if totals is None:
                    self.topic_gets[key] = [message_count, body_bytes]
                else:
                    totals[0] += message_count
                    totals[1] += body_bytes
        else:
            self.get_miss_times += 1

    def sample(self) -> None:
        """Take a sample of the totals (call about once a second) and roll at midnight."""
        now_ms = self._clock_ms()
        day = self._local_day(now_ms)
        if day != self._day:
            self._day = day
            self.put_total_yesterday_morning = self.put_total_today_morning
            self.put_total_today_morning = self.put_message_times_total
            self.get_total_yesterday_morning = self.get_total_today_morning
            self.get_total_today_morning = self.get_transferred_total
        self._samples.append(self._snapshot(now_ms))

    # -- reading ---------------------------------------------------------------------------

    def tps(self, counter: str) -> str:
        """Rates of one counter over 10 s, 1 min and 10 min: ``"1.00 2.00 3.00"``.

        Args:
            counter: ``put``, ``get_found``, ``get_miss``, ``get_transferred`` or
                ``get_total`` (found + miss).
        """
        fields = _COUNTER_FIELDS[counter]
        now = self._snapshot(self._clock_ms())
        rates = []
        for window_s in TPS_WINDOWS_S:
            oldest = self._sample_at_or_before(now[0] - window_s * 1000)
            elapsed_ms = now[0] - oldest[0]
            delta = sum(now[i] - oldest[i] for i in fields)
            rates.append(delta * 1000 / elapsed_ms if elapsed_ms > 0 else 0.0)
        return " ".join(f"{rate:.2f}" for rate in rates)

    def _snapshot(self, now_ms: int) -> tuple[int, int, int, int, int]:
        return (
            now_ms,
            self.put_message_times_total,
            self.get_found_times,
            self.get_miss_times,
            self.get_transferred_total,
        )

    def _sample_at_or_before(self, at_ms: int) -> tuple[int, int, int, int, int]:
        # The newest sample no later than at_ms, or the oldest we have when the broker is
        # younger than the window (the rate is then over its whole life).
        chosen = self._samples[0]
        for sample in self._samples:
            if sample[0] > at_ms:
                break
            chosen = sample
        return chosen

    @staticmethod
    def _local_day(at_ms: int) -> datetime.date:
        return datetime.datetime.fromtimestamp(at_ms / 1000).date()

    def runtime_text(self) -> str:
        """Uptime as RocketMQ prints it: ``[ 0 days, 1 hours, 2 minutes, 3 seconds ]``."""
        seconds = max(0, (self._clock_ms() - self.boot_timestamp_ms) // 1000)
        days, seconds = divmod(seconds, 86400)
        hours, seconds = divmod(seconds, 3600)
        minutes, seconds = divmod(seconds, 60)
        return f"[ {days} days, {hours} hours, {minutes} minutes, {seconds} seconds ]"


def human_bytes(count: int) -> str:
    """Bytes the way RocketMQ's humanReadableByteCount (binary units) prints them."""
    if count < 1024:
        return f"{count} B"
    value = float(count)
    units = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    index = 0
    while True:
        value /= 1024
        if value < 1024 or index == len(units) - 1:
            return f"{value:.2f} {units[index]}"
        index += 1


def runtime_info(stats: BrokerStats, store: MessageStore, store_root_dir: str) -> dict[str, str]:
    """The GET_BROKER_RUNTIME_INFO table of a broker with these counters and this store
    (under ``store_root_dir``): RocketMQ's keys, string values."""
    table = {
        "brokerVersionDesc": BROKER_VERSION_DESC,
        "brokerVersion": str(TIDEMQ_VERSION),
        "bootTimestamp": str(stats.boot_timestamp_ms),
        "runtime": stats.runtime_text(),
        "msgPutTotalYesterdayMorning": str(stats.put_total_yesterday_morning),
        "msgPutTotalTodayMorning": str(stats.put_total_today_morning),
        "msgPutTotalTodayNow": str(stats.put_message_times_total),
        "msgGetTotalYesterdayMorning": str(stats.get_total_yesterday_morning),
        "msgGetTotalTodayMorning": str(stats.get_total_today_morning),
        "msgGetTotalTodayNow": str(stats.get_transferred_total),
        "putMessageTimesTotal": str(stats.put_message_times_total),
        "putMessageSizeTotal": str(stats.put_message_size_total),
        "putMessageAverageSize": (
            f"{stats.put_message_size_total / stats.put_message_times_total:.2f}"
            if stats.put_message_times_total
            else "0.00"
        ),
        "putMessageFailedTimes": str(stats.put_message_failed_times),
        "putMessageEntireTimeMax": str(stats.put_message_entire_time_max_ms),
        "putTps": stats.tps("put"),
        "getFoundTps": stats.tps("get_found"),
        "getMissTps": stats.tps("get_miss"),
        "getTotalTps": stats.tps("get_total"),
        "getTransferedTps": stats.tps("get_transferred"),  # sic: RocketMQ's spelling
        "commitLogMinOffset": str(store.commit_log_min_offset()),
        "commitLogMaxOffset": str(store.commit_log_max_offset()),
        "earliestMessageTimeStamp": str(earliest_commit_log_time_ms(store)),
        # Appends dispatch at once; a slave's HA keys override it (broker/ha/replication.py).
        "dispatchBehindBytes": "0",
        "startAcceptSendRequestTimeStamp": "0",
    }
    capacity = _disk_capacity(store_root_dir)
    if capacity is not None:
        table["commitLogDirCapacity"] = capacity
    return table


def earliest_commit_log_time_ms(store: MessageStore) -> int:
    """Store time of the oldest record still in the commit log; 0 when it is empty."""
    record = store.read_message(store.commit_log_min_offset())
    if record is None or len(record) < 64:
        return 0
    sysflag = _INT32.unpack_from(record, POSITION_SYSFLAG)[0]
    return _INT64.unpack_from(record, store_timestamp_position(sysflag))[0]


def _disk_capacity(path: str) -> str | None:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    return f"Total : {human_bytes(usage.total)}, Free : {human_bytes(usage.free)}."

"""StoreConfig: the message store's settings, RocketMQ's MessageStoreConfig keys in snake_case.

Every value is checked when the config is built, so a bad value fails at start naming the
key, the value and what is allowed (``ConfigError``), never later on a write.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass, field

from tidemq.errors import ConfigError
from tidemq.limits import MESSAGE_BODY_SIZE_MAX
from tidemq.protocol.message import pack_host

# The topic delayed messages wait in (docs/protocol.md §11.1); its consume-queue tag code is the
# delivery time, which the store derives from the DELAY level and the store time.
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"

# RocketMQ's default messageDelayLevel: 18 levels, level N waits the Nth duration.
DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

CONSUME_QUEUE_ENTRY_SIZE = 20  # see consume_queue.py for the layout

_DELAY_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DELAY_PATTERN = re.compile(r"^(\d+)([smhd])$")


class FlushDiskType(enum.StrEnum):
    """When an append counts as durable (RocketMQ's flushDiskType)."""

    ASYNC_FLUSH = "ASYNC_FLUSH"  # a background thread flushes every flush_interval_commit_log_ms
    SYNC_FLUSH = "SYNC_FLUSH"  # a put completes its durable future after its bytes are synced


@dataclass(slots=True)
class StoreConfig:
    """Settings of a message store; names follow RocketMQ's MessageStoreConfig (the server
    config loader derives each key: snake_case to camelCase, unit suffix dropped).

    Raises:
        ConfigError: a value is out of range; the message names the key and the allowed range.
    """

    store_path_root_dir: str = "./tidemq-data"
    # RocketMQ's default: 1 GiB segments keep the file count small on large disks.
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    # 300,000 entries of 20 bytes, RocketMQ's default.
    mapped_file_size_consume_queue: int = 300_000 * CONSUME_QUEUE_ENTRY_SIZE
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    # RocketMQ's defaults: a crash of the machine (not the process) loses at most ~0.5 s of
    # acknowledged messages under ASYNC_FLUSH.
    flush_interval_commit_log_ms: int = 500
    flush_interval_consume_queue_ms: int = 1000
    # RocketMQ's syncFlushTimeout: past it the broker answers FLUSH_DISK_TIMEOUT.
    sync_flush_timeout_ms: int = 5000
    # RocketMQ's code default (its shipped broker.conf says 48).
    file_reserved_time_hours: int = 72
    # Hours of the day ("04" or "04;16") when expired segments are deleted; 04 is a quiet hour.
    delete_when: str = "04"
    # Percent of the store's volume in use above which expired segments go at once.
    disk_max_used_space_ratio: int = 75
    # Percent above which the oldest segments go even before they expire (RocketMQ's
    # diskSpaceCleanForciblyRatio): a full disk would stop every write.
    disk_space_clean_forcibly_ratio: int = 85
    # RocketMQ's cleanFileForciblyEnable: false keeps unexpired segments even on a full disk
    # (writes then stop at disk_space_warning_level_ratio instead of losing old messages).
    clean_file_forcibly_enable: bool = True
    # Percent of the volume in use above which every write is refused with
    # SERVICE_NOT_AVAILABLE (RocketMQ's diskSpaceWarningLevelRatio, 90): the rest is the
    # reserve that keeps the store's own files (and the system) from running out of room.
    disk_space_warning_level_ratio: int = 90
    max_message_size: int = MESSAGE_BODY_SIZE_MAX
    message_index_enable: bool = True
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    check_crc_on_recover: bool = True
    # Write zeros over the next commit-log segment on a background thread (see
    # segment_allocator.py). Off by default, as in RocketMQ: appends are pwrites, which fill
    # new page-cache pages cheaply, while the zeros cost a second write of every segment
    # (1.2-2 us of broker CPU per 1 KiB message under ASYNC_FLUSH, up to 3.9 under
    # SYNC_FLUSH, on the core the producers need, to save the appender ~0.15; batch produce
    # ran faster without it under both flush types, benchmarks/RESULTS.md).
    warm_mapped_file_enable: bool = field(
        default=False,
        metadata={"key": "warmMapedFileEnable", "aliases": ("warmMappedFileEnable",)},
    )
    # brokerIP1:listenPort; written into every record's STOREHOST and every offset msg id.
    # The broker sets it from its own address, so it is no configuration key.
    store_host: str = field(default="127.0.0.1:10911", metadata={"config": False})
    message_delay_level: str = DEFAULT_MESSAGE_DELAY_LEVEL
    # -- replication (RocketMQ's MessageStoreConfig HA keys; used by tidemq.broker.ha) -------
    # A slave reports its offset at least this often, so the master's housekeeping (and a
    # SYNC_MASTER wait) hears from it while nothing is written.
    ha_send_heartbeat_interval_ms: int = 5000
    # A connection silent this long is dead: the master drops the slave, the slave reconnects.
    ha_housekeeping_interval_ms: int = 20_000
    # Bytes per chunk of the stream: RocketMQ's 32 KiB.
    ha_transfer_batch_size: int = 32 * 1024
    # The master's HA address (host:haListenPort) for a slave; None = learn it from the name
    # server's REGISTER_BROKER answer.
    ha_master_address: str | None = None
    # A slave further behind than this is not "in sync": a SYNC_MASTER send then answers
    # SLAVE_NOT_AVAILABLE at once instead of waiting (RocketMQ 4.x calls it
    # haSlaveFallbehindMax; 256 MiB in both).
    ha_max_gap_not_in_sync: int = field(
        default=256 * 1024 * 1024,
        metadata={"key": "haMaxGapNotInSync", "aliases": ("haSlaveFallbehindMax",)},
    )

    def __post_init__(self) -> None:
        self.store_path_root_dir = os.fspath(self.store_path_root_dir)
        try:
            self.flush_disk_type = FlushDiskType(str(self.flush_disk_type).upper())
        except ValueError:
            raise ConfigError(
                f"flush_disk_type={self.flush_disk_type!r} is not ASYNC_FLUSH or SYNC_FLUSH"
            ) from None
        _require_range("mapped_file_size_commit_log", self.mapped_file_size_commit_log,
                       4096, 1 << 40)
        _require_range("mapped_file_size_consume_queue", self.mapped_file_size_consume_queue,
                       CONSUME_QUEUE_ENTRY_SIZE, 1 << 32)
        if self.mapped_file_size_consume_queue % CONSUME_QUEUE_ENTRY_SIZE:
            raise ConfigError(
                f"mapped_file_size_consume_queue={self.mapped_file_size_consume_queue} is not a "
                f"multiple of the {CONSUME_QUEUE_ENTRY_SIZE}-byte entry size"
            )
        _require_range("flush_interval_commit_log_ms", self.flush_interval_commit_log_ms,
                       1, 3_600_000)
        _require_range("flush_interval_consume_queue_ms", self.flush_interval_consume_queue_ms,
                       1, 3_600_000)
        _require_range("sync_flush_timeout_ms", self.sync_flush_timeout_ms, 1, 3_600_000)
        _require_range("file_reserved_time_hours", self.file_reserved_time_hours, 0, 1_000_000)
        # RocketMQ clamps the ratio into [10, 95]; a value outside is a typo, say so.
        _require_range("disk_max_used_space_ratio", self.disk_max_used_space_ratio, 10, 95)
        _require_range("disk_space_clean_forcibly_ratio", self.disk_space_clean_forcibly_ratio,
                       10, 99)
        _require_range("disk_space_warning_level_ratio", self.disk_space_warning_level_ratio,
                       10, 99)
        _require_range("max_message_size", self.max_message_size, 1, 1 << 30)
        _require_range("max_hash_slot_num", self.max_hash_slot_num, 1, 1 << 30)
        _require_range("max_index_num", self.max_index_num, 1, 1 << 30)
        _require_range("ha_send_heartbeat_interval_ms", self.ha_send_heartbeat_interval_ms,
                       10, 3_600_000)
        _require_range("ha_housekeeping_interval_ms", self.ha_housekeeping_interval_ms,
                       10, 3_600_000)
        # A chunk must fit the slave's 4 MiB read buffer (broker/ha/wire.py).
        _require_range("ha_transfer_batch_size", self.ha_transfer_batch_size, 1, 4 * 1024 * 1024)
        _require_range("ha_max_gap_not_in_sync", self.ha_max_gap_not_in_sync, 0, 1 << 50)
        if self.ha_master_address is not None:
            host, sep, port = self.ha_master_address.rpartition(":")
            if not self.ha_master_address.strip():
                self.ha_master_address = None
            elif not sep or not host or not port.isdigit():
                raise ConfigError(
                    f"ha_master_address={self.ha_master_address!r} is not host:port; give the "
                    "master's HA address, e.g. 10.0.0.5:10912 (its listenPort + 1)"
                )
        self.delete_hours()  # validates delete_when
        self.delay_level_ms()  # validates message_delay_level
        try:
            pack_host(self.store_host)
        except Exception as e:
            raise ConfigError(f"store_host={self.store_host!r} is not ip:port ({e})") from None

    def delete_hours(self) -> frozenset[int]:
        """The hours of the day named by ``delete_when`` ("04" or "04;16").

        Raises:
            ConfigError: a piece is not an hour 0..23.
        """
        hours: set[int] = set()
        for piece in self.delete_when.split(";"):
            piece = piece.strip()
            if not piece.isdigit() or not 0 <= int(piece) <= 23:
                raise ConfigError(
                    f"delete_when={self.delete_when!r}: {piece!r} is not an hour 00..23; "
                    "give hours separated by ';', e.g. '04' or '04;16'"
                )
            hours.add(int(piece))
        return frozenset(hours)

    def delay_level_ms(self) -> tuple[int, ...]:
        """The delay of each level (level 1 first) in ms, parsed from ``message_delay_level``.

        Raises:
            ConfigError: a level is not a number with one of the units s, m, h, d.
        """
        delays = []
        for piece in self.message_delay_level.split():
            match = _DELAY_PATTERN.match(piece)
            if match is None:
                raise ConfigError(
                    f"message_delay_level={self.message_delay_level!r}: {piece!r} is not a "
                    "number followed by s, m, h or d"
                )
            delays.append(int(match.group(1)) * _DELAY_UNIT_MS[match.group(2)])
        if not delays:
            raise ConfigError("message_delay_level is empty; give at least one level like '1s'")
        return tuple(delays)


def _require_range(key: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"{key}={value!r} is outside the allowed range [{low}, {high}]")

"""FileMessageStore: the message store on disk, in RocketMQ's layout byte for byte.

    <store_path_root_dir>/
      commitlog/<20-digit offset>                    commit_log.py
      consumequeue/<topic>/<queueId>/<20-digit>      consume_queue.py
      index/<yyyyMMddHHmmssSSS>                      index_file.py
      checkpoint                                     checkpoint.py
      abort, lock                                    store_lock.py

Opening: take the lock (a second opener fails with StoreLocked), map every file, recover
(recovery.py: a normal recovery after a clean close, an abnormal one when ``abort`` is
there), create ``abort``, start the flush threads. Closing: stop taking writes, flush
everything, record the checkpoint, remove ``abort``, release the lock.

Threads and the state they own (see store_core.py for appends and reads):
- "tidemq-flush-commit-log" (ASYNC_FLUSH) or "tidemq-group-commit" (SYNC_FLUSH): syncs the
  commit log and sets the checkpoint's physicMsgTimestamp;
- "tidemq-flush-consume-queue": syncs the consume queues (and the index once a minute,
  INDEX_SYNC_INTERVAL_S), sets the checkpoint's logics and index times and syncs the
  checkpoint;
- "tidemq-segment-allocator": creates and warms the next commit-log segment
  (segment_allocator.py); it never touches a segment in the log's list;
- "tidemq-queue-file-preparer": makes the first files of a written topic's queues ahead of
  their first messages (queue_file_preparer.py); it never touches a queue the store holds;
- retention runs on whichever thread calls ``run_retention`` (the broker's timer).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from tidemq.errors import StoreError
from tidemq.store import rebuild, recovery
from tidemq.store.checkpoint import StoreCheckpoint
from tidemq.store.commit_log import CommitLog
from tidemq.store.config import FlushDiskType, StoreConfig
from tidemq.store.consume_queue_table import ConsumeQueueTable
from tidemq.store.disk_space import DiskSpaceGuard
from tidemq.store.epochs import EpochFile
from tidemq.store.flush import PeriodicFlusher
from tidemq.store.index_file import IndexService
from tidemq.store.queue_file_preparer import QueueFilePreparer
from tidemq.store.retention import disk_used_ratio
from tidemq.store.segment_allocator import SegmentAllocator
from tidemq.store.store_core import StoreCore
from tidemq.store.store_lock import (
    StoreLock,
    crashed_last_time,
    create_abort_file,
    remove_abort_file,
)
from tidemq.store.truncation import TruncateIntent
from tidemq.store.worker_group_commit import WorkerGroupCommitService

logger = logging.getLogger(__name__)

COMMIT_LOG_DIR = "commitlog"
CONSUME_QUEUE_DIR = "consumequeue"
INDEX_DIR = "index"
CHECKPOINT_FILE = "checkpoint"

# The periodic flush (every flushIntervalConsumeQueue ms) syncs the index only this often;
# ``flush`` and ``close`` always do. Each message's keys dirty a random hash-slot page, so a
# sync writes about a page per key stored since the last: every second that was a burst of
# several ms of kernel CPU on the flush thread, and at 2,000 msg/s a consumer sharing the
# two cores stalled 5-10 ms once a second (its p999). RocketMQ syncs an index file only
# when it is full. After a crash the entries newer than the checkpoint's indexMsgTimestamp
# are rebuilt from the commit log either way; a rarer sync only moves that point back.
INDEX_SYNC_INTERVAL_S = 60.0


class FileMessageStore(StoreCore):
    """The message store under ``config.store_path_root_dir``.

    Raises:
        StoreLocked: another process has the directory open.
        StoreError: a file is unreadable or has the wrong size (the message names it).
    """

    def __init__(self, config: StoreConfig) -> None:
        root = os.path.abspath(os.path.expanduser(config.store_path_root_dir))
        os.makedirs(root, exist_ok=True)
        self.root_dir = root
        self._lock_file = StoreLock(root)
        self._lock_file.acquire()
        self._flushers: list[PeriodicFlusher] = []
        self._allocator: SegmentAllocator | None = None
        self._queue_files: QueueFilePreparer | None = None
        self._flush_lock = threading.Lock()
        self._index_synced_at = time.monotonic()
        self.checkpoint: StoreCheckpoint | None = None
        self._opened: list[CommitLog | ConsumeQueueTable | IndexService] = []
        try:
            self._open(config, root)
        except BaseException:
            for part in self._opened:
                part.close()
            self._release_files()
            raise

    def _open(self, config: StoreConfig, root: str) -> None:
        clean_exit = not crashed_last_time(root)
        self.checkpoint = StoreCheckpoint(os.path.join(root, CHECKPOINT_FILE))
        commit_log = CommitLog(
            os.path.join(root, COMMIT_LOG_DIR), config.mapped_file_size_commit_log
        )
        self._opened.append(commit_log)
        commit_log.queue.load(extend_short=True)
        queues = ConsumeQueueTable(
            os.path.join(root, CONSUME_QUEUE_DIR), config.mapped_file_size_consume_queue
        )
        self._opened.append(queues)
        queues.load()
        index = None
        if config.message_index_enable:
            index = IndexService(
                os.path.join(root, INDEX_DIR),
                max_hash_slot_num=config.max_hash_slot_num,
                max_index_num=config.max_index_num,
            )
            self._opened.append(index)
            index.load(clean_exit, self.checkpoint.index_msg_timestamp)
        super().__init__(config, commit_log, queues, index)
        self.recovery_report = recovery.recover(
            commit_log,
            queues,
            index,
            self._dispatchers,
            clean_exit=clean_exit,
            checkpoint_min_timestamp=self.checkpoint.min_timestamp(index is not None),
            check_crc=config.check_crc_on_recover,
            delay_level_ms=self._delay_level_ms,
            checkpoint_index_timestamp=self.checkpoint.index_msg_timestamp,
        )
        self.last_dispatched_timestamp = commit_log.last_store_timestamp
        self.epochs = EpochFile(root)
        self.truncate_intent = TruncateIntent(root)
        pending = self.truncate_intent.pending()
        if pending is not None:
            # A truncation was cut short (a crash or SIGKILL): finish it before serving.
            done = self.truncate_to(min(pending, commit_log.max_offset()), finish=True)
            logger.warning("finished a truncation interrupted by the last stop: %s",
                           done.describe())
        self.disk_guard = DiskSpaceGuard(root, config.disk_space_warning_level_ratio)
        create_abort_file(root)
        if config.warm_mapped_file_enable:
            self._allocator = SegmentAllocator(
                os.path.join(root, COMMIT_LOG_DIR), config.mapped_file_size_commit_log
            )
            commit_log.allocator = self._allocator
            self._allocator.start()
            commit_log.request_next_segment()
        self._queue_files = QueueFilePreparer(
            os.path.join(root, CONSUME_QUEUE_DIR), config.mapped_file_size_consume_queue,
            lambda topic, queue_id: queues.get(topic, queue_id) is not None,
        )
        queues.take_prepared = self._queue_files.take
        self._start_flush_services()
        self._opened = []

    # -- queues ---------------------------------------------------------------------------------

    def prepare_for_writes(self) -> None:
        """See ``MessageStore.prepare_for_writes``."""
        if self._queue_files is not None:
            self._queue_files.start()
        if isinstance(self.index, IndexService):
            self.index.prepare()

    def prepare_queue_files(self, topic: str, queue_count: int) -> None:
        """See ``MessageStore.prepare_queue_files``."""
        if self._queue_files is not None:
            self._queue_files.request(topic, queue_count)

    def delete_topic(self, topic: str) -> None:
        """See ``MessageStore.delete_topic``; files being made ahead for it are dropped first."""
        if self._queue_files is not None:
            self._queue_files.forget(topic)
        super().delete_topic(topic)

    # -- flushing -------------------------------------------------------------------------------

    def _start_flush_services(self) -> None:
        config = self.config
        if config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            # The syncs run in a worker process, started by the appender without waiting
            # for the GIL (worker_group_commit.py); it falls back to GroupCommitService.
            self._group_commit = WorkerGroupCommitService(
                self.commit_log.queue, self._sync_commit_log,
                lambda: self.commit_log.last_store_timestamp, self._commit_log_synced,
                self.flush_latency.observe,
            )
            self._group_commit.start()
        else:
            self._flushers.append(
                PeriodicFlusher(
                    "tidemq-flush-commit-log",
                    config.flush_interval_commit_log_ms,
                    self._sync_commit_log,
                )
            )
        self._flushers.append(
            PeriodicFlusher(
                "tidemq-flush-consume-queue",
                config.flush_interval_consume_queue_ms,
                self._sync_logics,
            )
        )
        for flusher in self._flushers:
            flusher.start()

    def _sync_commit_log(self) -> int:
        # The time and end are read before the sync: everything up to them is then on disk.
        timestamp = self.commit_log.last_store_timestamp
        end = self.commit_log.max_offset()
        started = time.perf_counter()
        flushed = self.commit_log.flush()
        self.flush_latency.observe(time.perf_counter() - started)
        if flushed >= end and self.checkpoint is not None:
            self.checkpoint.physic_msg_timestamp = timestamp
        return flushed

    def answer_syncs_on_loop(self, add_reader: Callable[[int, Callable[[], None]], None],
                             remove_reader: Callable[[int], bool],
                             answered: Callable[[], None] | None = None) -> bool:
        """See ``MessageStore.answer_syncs_on_loop``: the sync worker's answers are read on
        the loop (worker_group_commit.py)."""
        service = self._group_commit
        if isinstance(service, WorkerGroupCommitService):
            return service.answer_on_loop(add_reader, remove_reader, answered)
        return False

    def _commit_log_synced(self, timestamp: int) -> None:
        # The sync worker made the log durable up to records stored at ``timestamp``.
        if self.checkpoint is not None:
            self.checkpoint.physic_msg_timestamp = timestamp

    def _sync_logics(self, *, index_now: bool = False, every_queue: bool = False) -> None:
        with self._flush_lock:
            # Read first: every entry stored up to it was written, so its queue was put in
            # ``written``, before this (consume_queue_table.py).
            timestamp = self.last_dispatched_timestamp
            if every_queue:
                for queue in self.queues.all():
                    queue.flush()
            else:
                self.queues.flush_written()
            checkpoint = self.checkpoint
            if checkpoint is None:
                return
            checkpoint.logics_msg_timestamp = timestamp
            if isinstance(self.index, IndexService):
                now = time.monotonic()
                if index_now or now - self._index_synced_at >= INDEX_SYNC_INTERVAL_S:
                    self.index.flush()
                    self._index_synced_at = now
                checkpoint.index_msg_timestamp = self.index.last_flushed_timestamp_ms
            checkpoint.flush()

    def flush(self) -> None:
        """Sync the commit log, the consume queues, the index and the checkpoint."""
        self._sync_commit_log()
        self._sync_logics(index_now=True, every_queue=True)

    def _disk_used_ratio(self) -> float:
        return disk_used_ratio(self.root_dir)

    # -- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush everything, record the checkpoint, remove ``abort`` and release the lock."""
        with self._append_lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self._group_commit is not None:
                self._group_commit.stop()
            for flusher in self._flushers:
                flusher.stop()
            if self._allocator is not None:
                self._allocator.close()
            if self._queue_files is not None:
                self._queue_files.close()
            self.flush()
            clean = True
        except StoreError as e:
            logger.error("closing %s without a final sync: %s", self.root_dir, e)
            clean = False
        if clean:
            rebuild.write_manifest(self.queues)
        self.queues.close()
        self.commit_log.close()
        if self.index is not None:
            self.index.close()
        if clean:
            remove_abort_file(self.root_dir)
        self._release_files()

    def _release_files(self) -> None:
        if self.checkpoint is not None:
            self.checkpoint.close()
            self.checkpoint = None
        self._lock_file.release()

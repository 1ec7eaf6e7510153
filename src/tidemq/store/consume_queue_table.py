"""The consume queues of a store, by (topic, queue id), found on disk or made on first use.

Layout: ``<root>/consumequeue/<topic>/<queueId>/`` holds one queue's segments (see
consume_queue.py). Topic names are checked against RocketMQ's topic rules before a message
is stored, so a topic is always a safe directory name.

Threads: queues are added and removed under the store's append lock. Readers look queues up
without it (a dict read is atomic in CPython) and the flush thread iterates a snapshot, or
takes the queues written since its last pass from ``written`` (``flush_written``).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable

from tidemq.errors import StoreError
from tidemq.store.consume_queue import ConsumeQueue
from tidemq.store.mapped_file import MappedFile, parse_file_name

logger = logging.getLogger(__name__)


class ConsumeQueueTable:
    """All consume queues of a store.

    Args:
        directory: ``<root>/consumequeue``, or None for in-memory queues.
        file_size: ``mapped_file_size_consume_queue``.
    """

    def __init__(self, directory: str | None, file_size: int) -> None:
        self.directory = directory
        self.file_size = file_size
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        # Queues found wrong at load or by recovery, to rebuild from the commit log.
        self.broken: set[tuple[str, int]] = set()
        # ``take_prepared(topic, queue_id)``: a new queue's first segment made and mapped
        # ahead (queue_file_preparer.py), or None; set by the file store.
        self.take_prepared: Callable[[str, int], MappedFile | None] | None = None
        # Queues that wrote entries since the flush thread last took them: a queue adds
        # itself on every write (set.add, atomic in CPython), the flush thread pops.
        self.written: set[ConsumeQueue] = set()

    def load(self) -> None:
        """Map every queue found under the directory (write positions are set by recovery).

        A queue with a segment of the wrong size (cut short, or grown) is derived data gone
        wrong: its files are deleted and it is listed in ``broken``, for recovery to rebuild
        from the commit log.
        """
        if self.directory is None or not os.path.isdir(self.directory):
            return
        for topic in sorted(os.listdir(self.directory)):
            topic_dir = os.path.join(self.directory, topic)
            if not os.path.isdir(topic_dir):
                continue
            for name in sorted(os.listdir(topic_dir)):
                if not name.isdigit() or not os.path.isdir(os.path.join(topic_dir, name)):
                    continue
                queue_dir = os.path.join(topic_dir, name)
                queue = ConsumeQueue(topic, int(name), queue_dir, self.file_size,
                                     self.written)
                problem = self._segment_size_problem(queue_dir)
                if problem is not None:
                    logger.warning(
                        "consume queue %s/%s: %s; deleted its files, rebuilding it from the "
                        "commit log", topic, name, problem,
                    )
                    queue.destroy()
                    self.broken.add((topic, int(name)))
                else:
                    queue.queue.load()
                self._queues[(topic, int(name))] = queue

    def _segment_size_problem(self, queue_dir: str) -> str | None:
        for name in sorted(os.listdir(queue_dir)):
            if parse_file_name(name) is None:
                continue
            size = os.path.getsize(os.path.join(queue_dir, name))
            if size != self.file_size:
                return (
                    f"segment {name} is {size} bytes, not the segment size {self.file_size} "
                    "(cut short, or written with another mappedFileSizeConsumeQueue)"
                )
        return None

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue, or None if it was never written."""
        return self._queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, made empty if new (no file is created before its first entry; a first
        segment made ahead is adopted)."""
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            directory = (
                None
                if self.directory is None
                else os.path.join(self.directory, topic, str(queue_id))
            )
            queue = ConsumeQueue(topic, queue_id, directory, self.file_size, self.written)
            if self.take_prepared is not None:
                prepared = self.take_prepared(topic, queue_id)
                if prepared is not None:
                    queue.adopt_first_segment(prepared)
            self._queues[(topic, queue_id)] = queue
        return queue

    def reset(self, topic: str, queue_id: int) -> ConsumeQueue:
        """Delete the queue's files (if any) and start it empty (a rebuild follows)."""
        queue = self._queues.pop((topic, queue_id), None)
        if queue is not None:
            queue.destroy()
        self.broken.discard((topic, queue_id))
        return self.get_or_create(topic, queue_id)

    def flush_written(self) -> int:
        """Sync the queues written since the last call (each taken out of ``written`` before
        its sync, so a write during it puts the queue back for the next call); return how
        many were synced. Why not every queue: a pass over clean queues held the GIL, and so
        stopped the event loop, ~1.3 ms a second with 1,030 queues and ~10 ms with 10,000
        (benchmarks/RESULTS.md, owner queues).

        Raises:
            StoreError: a sync failed; that queue stays in ``written`` for the next call.
        """
        written = self.written
        # Only as many as are there now: a queue written all the time comes back at once,
        # and its next entries are the next pass's.
        count = len(written)
        for _ in range(count):
            try:
                queue = written.pop()
            except KeyError:
                return count
            try:
                queue.flush()
            except StoreError:
                written.add(queue)
                raise
        return count

    def all(self) -> list[ConsumeQueue]:
        """A snapshot of every queue."""
        return list(self._queues.values())

    def remove_topic(self, topic: str) -> int:
        """Delete every queue of ``topic`` with its files; return how many there were."""
        doomed = [key for key in list(self._queues) if key[0] == topic]
        for key in doomed:
            self._queues.pop(key).destroy()
        if self.directory is not None:
            topic_dir = os.path.join(self.directory, topic)
            # Also when no queue was written: files made ahead (queue_file_preparer.py).
            if os.path.isdir(topic_dir):
                shutil.rmtree(topic_dir, ignore_errors=True)
        logger.info("deleted %d consume queues of topic %s", len(doomed), topic)
        return len(doomed)

    def close(self) -> None:
        """Unmap every queue."""
        for queue in self.all():
            queue.close()

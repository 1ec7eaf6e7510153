"""Making the first consume-queue file of a topic's queues ahead of their first message.

A queue's first message needs its first file (``consumequeue/<topic>/<queueId>/0000...``):
two directory entries and a file creation, each a journal operation on ext4. Measured on a
busy machine, 0.6 ms at the median and up to 20 ms per queue, all of it on the event loop,
and a producer that sends round-robin to a new topic of 1,024 queues meets a new queue with
every batch: batch produce to 1,024 new queues ran at half the rate of one queue.

So, when a topic is first sent to, the broker asks for the files of all its write queues
(``request``), and for a topic of 16 write queues or more already when an admin creates it:
a producer starting on a new wide topic sends to every queue at once, and the loop,
outrunning this thread, made each file the thread had not reached yet (1,024 queues: 6-13 µs
of system time per message on the loop against about 1 for one queue, measured on a busy
ext4, inode allocation the bulk). This service's thread makes them, each exactly as a new
queue's first segment starts (sized sparse, its first page reserved and warmed:
mapped_file.py), and also maps it and touches its first page for writing, so the queue's
first put finds a ready segment (``take``, from ``ConsumeQueueTable.get_or_create``): no
open, no map and no page fault on the loop. Why the map too: with the files made ahead, a
new queue still cost the loop ~40 µs (open, fstat, mmap and its descriptor copy, two faults
on the first page, close), which at 10,000 new queues fed in batches of 64 was a third of the
loop's extra time per message over one queue (benchmarks/RESULTS.md, owner queues).

Safety of the hand-over: a file is made under a ``.tmp`` name and hard-linked to its segment
name, which fails when the name exists, so a file the loop created meanwhile (and may be
writing through its mapping) is never replaced; the loop's own creation truncates any file
that appears at that name, which is a prepared file nobody else uses. A mapped segment is
handed over only while its queue does not exist in the store: ``take`` and the thread's
publishing of a segment are under one lock, and a queue the loop made meanwhile (``take``
found nothing ready) is marked claimed, so the thread then unmaps its segment instead (the
file stays: the loop maps the same zeros). A ``.tmp`` left by a crash is deleted when the
queue is loaded. A prepared file holds zeros: after a restart it loads as an empty queue.
``forget`` (deleting a topic) drops the topic's pending files and ready segments and waits
for the one being made, so none appears after its directory is removed.

Costs: 4 KiB of disk per queue of a topic that is written to (or created with 16 queues or
more), whether or not every queue is, and a descriptor and a 4 KiB page of memory per such
queue from then on (what a restart costs anyway: it maps every queue file it finds; near
the open-file soft limit a file is made but not mapped, leaving the descriptors to
connections); nothing for narrower topics never written. Queues that already have a file
are skipped.

Threads: ``request``, ``take`` and ``forget`` from any thread; the files are made by the
thread "tidemq-queue-file-preparer", started on the first request or by ``start``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import mmap
import os
import resource
import threading
from collections.abc import Callable

from tidemq.errors import StoreError
from tidemq.store.mapped_file import (
    TEMPORARY_SUFFIX,
    MappedFile,
    file_name,
    first_page_size,
    populate_writable,
    start_sparse_segment,
)
from tidemq.store.open_files import DESCRIPTORS_FOR_CONNECTIONS

logger = logging.getLogger(__name__)


class QueueFilePreparer:
    """Makes first consume-queue files in a thread, ahead of the queues' first messages.

    Args:
        directory: ``<root>/consumequeue``.
        file_size: ``mapped_file_size_consume_queue``.
        has_queue: ``has_queue(topic, queue_id)`` is True when the store already holds that
            queue (its files are its own business then).
    """

    def __init__(self, directory: str, file_size: int,
                 has_queue: Callable[[str, int], bool]) -> None:
        self.directory = directory
        self.file_size = file_size
        self._has_queue = has_queue
        self._pending: collections.deque[tuple[str, int]] = collections.deque()
        self._requested: set[tuple[str, int]] = set()  # (topic, queue count) asked for
        # Under ``_wake``: first segments made and mapped, waiting for their queue's first
        # put; and queues the store made itself while their file was pending or being made
        # here (``take`` found nothing ready), whose segment is then not handed over.
        self._ready: dict[tuple[str, int], MappedFile] = {}
        self._claimed: set[tuple[str, int]] = set()
        self._requested_topics: set[str] = set()
        # Held while a file is made; ``forget`` takes it so no file of a deleted topic is
        # half made when its directory goes.
        self._busy = threading.Lock()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.prepared = 0  # files made (for tests and logs)

    def request(self, topic: str, queue_count: int) -> None:
        """Make the first files of ``topic``'s queues 0 .. queue_count-1 that have none.

        Cheap when asked again for the same topic and count (a set lookup): the send path
        calls it for every send.
        """
        key = (topic, queue_count)
        if key in self._requested:
            return
        with self._wake:
            if self._closed or key in self._requested:
                return
            self._requested.add(key)
            self._requested_topics.add(topic)
            self._pending.extend((topic, queue_id) for queue_id in range(queue_count)
                                 if not self._has_queue(topic, queue_id))
            self._start_locked()
            self._wake.notify()

    @property
    def ready_count(self) -> int:
        """How many mapped first segments wait for their queue's first put."""
        with self._wake:
            return len(self._ready)

    def take(self, topic: str, queue_id: int) -> MappedFile | None:
        """The first segment made and mapped ahead for a new queue, now the caller's, or None
        (the caller then makes or opens the file itself, and this service hands none over
        for that queue any more). A dictionary lookup under a lock: the store calls it for
        every queue it creates."""
        key = (topic, queue_id)
        with self._wake:
            mapped = self._ready.pop(key, None)
            if mapped is None and topic in self._requested_topics:
                self._claimed.add(key)
            return mapped

    def start(self) -> None:
        """Start the thread now rather than at the first ``request``: starting a thread waits
        until it runs, 2 ms measured on a busy machine, which the first send to a new topic
        paid on the event loop (the broker starts it when it starts)."""
        with self._wake:
            if not self._closed:
                self._start_locked()

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="tidemq-queue-file-preparer")
            self._thread.start()

    def forget(self, topic: str) -> None:
        """Drop ``topic``'s pending files and wait for the one being made (a topic is being
        deleted); a later ``request`` for it prepares again."""
        with self._busy, self._wake:
            self._pending = collections.deque(item for item in self._pending
                                              if item[0] != topic)
            self._requested = {key for key in self._requested if key[0] != topic}
            self._requested_topics.discard(topic)
            self._claimed = {key for key in self._claimed if key[0] != topic}
            dropped = [key for key in self._ready if key[0] == topic]
            for key in dropped:
                self._ready.pop(key).close()

    def close(self) -> None:
        """Stop the thread; pending files are not made, ready segments are unmapped (their
        files stay: empty queues)."""
        with self._wake:
            self._closed = True
            self._pending.clear()
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        with self._wake:
            ready, self._ready = self._ready, {}
        for mapped in ready.values():
            mapped.close()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
            with self._busy:
                with self._wake:
                    if not self._pending:
                        continue
                    topic, queue_id = self._pending.popleft()
                    if (topic, queue_id) in self._claimed:
                        self._claimed.discard((topic, queue_id))
                        continue
                if self._has_queue(topic, queue_id):
                    with self._wake:
                        self._claimed.discard((topic, queue_id))
                    continue
                try:
                    made = self._make(topic, queue_id)
                    if made:
                        self.prepared += 1
                        self._hand_over(topic, queue_id)
                except (OSError, StoreError) as exc:
                    # Nothing lost: the queue's first put creates the file itself (and
                    # reports a full disk or a descriptor shortage to the sender). The rest
                    # of the topic is left to its puts too: one warning, not one a queue.
                    logger.warning("could not prepare the first file of consume queue %s/%d "
                                   "ahead (its first put makes it instead): %s", topic,
                                   queue_id, exc)
                    with self._wake:
                        self._pending = collections.deque(
                            item for item in self._pending if item[0] != topic)

    def _hand_over(self, topic: str, queue_id: int) -> None:
        # Map the file just made and offer it to ``take``, unless the queue was made
        # meanwhile (its put may be writing the same file through a mapping of its own).
        # A failure to map (out of descriptors) only leaves the file for the first put to
        # open, as before.
        path = os.path.join(self.directory, topic, str(queue_id), file_name(0))
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            return
        if not _room_for_a_mapping(fd):
            os.close(fd)
            return
        try:
            mapping = mmap.mmap(fd, self.file_size, access=mmap.ACCESS_WRITE)
        except OSError:
            return
        finally:
            os.close(fd)
        # Fault the first page in writable without the GIL (threads share the page tables:
        # the loop's first entry then takes no fault); it changes no byte, so it is safe
        # even if the loop is writing the same file meanwhile.
        populate_writable(mapping, first_page_size(self.file_size))
        mapped = MappedFile(path, 0, self.file_size, mapping)
        mapped.reserved_position = first_page_size(self.file_size)
        key = (topic, queue_id)
        with self._wake:
            if not (self._closed or key in self._claimed or self._has_queue(topic, queue_id)):
                self._ready[key] = mapped
                return
            self._claimed.discard(key)
        mapped.close()

    def _make(self, topic: str, queue_id: int) -> bool:
        queue_dir = os.path.join(self.directory, topic, str(queue_id))
        path = os.path.join(queue_dir, file_name(0))
        if os.path.exists(path):
            return False
        os.makedirs(queue_dir, exist_ok=True)
        temporary = f"{path}.prepared{TEMPORARY_SUFFIX}"
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            start_sparse_segment(fd, temporary, self.file_size)
            try:
                os.link(temporary, path)  # never replaces a file the store made meanwhile
            except FileExistsError:
                return False
            return True
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _room_for_a_mapping(fd: int) -> bool:
    """True while mapping one more segment ahead leaves the broker its descriptors for
    connections (open_files.py). A mapping holds a descriptor; ``fd``, the lowest free
    number, is about how many are open. Near the soft limit a segment is not mapped ahead:
    the queue's first put maps it, as it maps a queue written only then (wide topics created
    but not written would otherwise take the descriptors connections need)."""
    soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft_limit == resource.RLIM_INFINITY or fd + DESCRIPTORS_FOR_CONNECTIONS < soft_limit

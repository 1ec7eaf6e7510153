"""SYNC_FLUSH group commit through a sync worker process (sync_worker.py).

``GroupCommitService`` (flush.py) wakes a thread of the broker's process for each sync; that
thread must take the GIL from the busy event loop before it can even start the fdatasync
(up to the 5 ms switch interval), while every send of the group waits. Here the appender
itself, right after its bytes are written (on the loop, inside ``request``), writes one
short command to a worker process, which has its own interpreter and GIL and starts the
fdatasync at once:

- a command names the segments with unsynced bytes (normally only the one being written);
  their write positions, the log's end offset and store time at that moment stay here,
  with the command's token and Future. A request covers only what was written before its
  command went out: the contract is PUT_OK only after an fdatasync that started after the
  bytes were written returned;
- the worker syncs once for every command waiting in its pipe and answers with the last
  token; a reader thread here (blocked in ``os.read`` without the GIL) completes those
  commands' Futures in order and moves the flushed positions (segment ``flushed_position``,
  the log's ``flushed_where``, the checkpoint's store time through ``synced``) as
  ``sync_mapped_files`` does;
- a failed sync of a file answers the commands naming it FLUSH_DISK_TIMEOUT (unless the
  segment was closed meanwhile: deleted or cut, its bytes are not the log's any more);
- the worker dies or its pipe breaks: an error is logged naming the worker, and this and
  every later request goes to the in-process ``GroupCommitService`` (the commands in flight
  are re-requested there, so none is left hanging).

Threads: ``request`` runs on the appender's thread (the loop), the reader on its own daemon
thread; the in-flight commands and the failover flag are guarded by ``_lock``.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from tidemq.store import sync_worker
from tidemq.store.flush import GroupCommitService, contiguous_synced_offset
from tidemq.store.interface import PutStatus
from tidemq.store.mapped_file import MappedFile
from tidemq.store.mapped_file_queue import MappedFileQueue

logger = logging.getLogger(__name__)


class _Command:
    __slots__ = ("end_offset", "future", "segments", "timestamp", "token")

    def __init__(self, token: int, segments: list[tuple[MappedFile, int]], end_offset: int,
                 timestamp: int) -> None:
        self.token = token
        self.segments = segments
        self.end_offset = end_offset
        self.timestamp = timestamp
        self.future: Future[PutStatus] = Future()


def _done(status: PutStatus) -> Future[PutStatus]:
    future: Future[PutStatus] = Future()
    future.set_result(status)
    return future


def advance_flushed_where(queue: MappedFileQueue) -> int:
    """Move ``queue.flushed_where`` over the contiguous synced bytes (``sync_mapped_files``'s
    rule: it stops in the first segment not wholly synced) and return it."""
    files = queue.files
    if not files:
        return queue.flushed_where
    first = len(files) - 1  # the segment holding the flushed offset, found from the end
    while first > 0 and files[first].file_from_offset > queue.flushed_where:
        first -= 1
    queue.flushed_where = max(queue.flushed_where, contiguous_synced_offset(files, first))
    return queue.flushed_where


class WorkerGroupCommitService:
    """SYNC_FLUSH requests answered by a sync worker process (module docstring); the same
    ``start``/``request``/``stop`` as ``GroupCommitService``, which it falls back to."""

    def __init__(self, queue: MappedFileQueue, flush: Callable[[], int],
                 store_timestamp: Callable[[], int], synced: Callable[[int], None],
                 observe: Callable[[float], None] | None = None) -> None:
        """``queue``: the commit log's segments; ``flush``: the in-process sync for the
        fallback; ``store_timestamp``: the newest record's store time; ``synced(time)``:
        called when the log is durable up to a command's end (records it in the checkpoint);
        ``observe(seconds)``: each worker sync's duration (the flush-latency metric)."""
        self._observe = observe
        self._queue = queue
        self._store_timestamp = store_timestamp
        self._synced = synced
        self._fallback = GroupCommitService(flush)
        self._fallback_started = False
        self._lock = threading.Lock()
        self._inflight: deque[_Command] = deque()
        self._next_token = 1
        self._stopping = False
        self._failed_over = False
        self._process: subprocess.Popen[bytes] | None = None
        self._commands_fd = -1
        self.answers = 0  # answer lines read: one per worker sync (tests, metrics)
        # The answers' pipe, read by the reader thread or (answer_on_loop) the event loop;
        # _read_lock keeps one reader at a time and guards _buffered (a partial line).
        self._answers_fd = -1
        self._buffered = b""
        self._read_lock = threading.Lock()
        self._wake_r, self._wake_w = -1, -1
        # (remove_reader, the loop's thread id) once the loop reads the answers.
        self._on_loop: tuple[Callable[[int], bool], int] | None = None
        self._answered: Callable[[], None] | None = None  # answer_on_loop's hook
        self._reader = threading.Thread(target=self._read_answers, name="tidemq-sync-worker-reader",
                                        daemon=True)

    @property
    def worker_pid(self) -> int | None:
        """The worker's process id (None before ``start`` or after a failover)."""
        process = self._process
        return None if process is None or self._failed_over else process.pid

    def start(self) -> None:
        """Start the worker process and the reader thread; without a worker (the program
        cannot start) requests go to the in-process service."""
        env = dict(os.environ)
        try:
            # Popen spawns a new interpreter (fork + exec at once): nothing of this threaded
            # process runs in the child.
            self._process = subprocess.Popen(
                [sys.executable, "-I", sync_worker.__file__],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True,
            )
        except OSError as e:
            logger.error("cannot start the sync worker %s (%s): SYNC_FLUSH syncs in process",
                         sync_worker.__file__, e)
            self._start_fallback()
            self._failed_over = True
            return
        assert self._process.stdin is not None and self._process.stdout is not None
        self._commands_fd = self._process.stdin.fileno()
        self._answers_fd = self._process.stdout.fileno()
        self._wake_r, self._wake_w = os.pipe()
        self._reader.start()

    def request(self, end_offset: int) -> Future[PutStatus]:
        """A Future that resolves to PUT_OK once the log is synced to ``end_offset`` (written
        before this call), FLUSH_DISK_TIMEOUT when the sync failed or the service stopped."""
        with self._lock:
            if self._stopping:
                return _done(PutStatus.FLUSH_DISK_TIMEOUT)
            if self._failed_over:
                return self._fallback.request(end_offset)
            queue = self._queue
            flushed_where = queue.flushed_where
            segments = []
            # From the newest segment back to the one holding the flushed offset (normally
            # the newest itself): no work per segment of a long log.
            for mapped in reversed(queue.files):
                write_position = mapped.write_position
                if write_position > mapped.flushed_position and mapped.path is not None:
                    segments.append((mapped, write_position))
                if mapped.file_from_offset <= flushed_where:
                    break
            segments.reverse()
            if not segments:
                if end_offset <= queue.flushed_where:
                    return _done(PutStatus.PUT_OK)
                return self._fallback_request(end_offset)
            command = _Command(self._next_token, segments, end_offset, self._store_timestamp())
            self._next_token += 1
            self._inflight.append(command)
            line = f"{command.token} {chr(9).join(m.path for m, _ in segments)}\n"  # type: ignore[misc]
            try:
                os.write(self._commands_fd, line.encode())
            except OSError as e:
                self._fail_over_locked(f"writing to it failed: {e}")
            return command.future

    def _fallback_request(self, end_offset: int) -> Future[PutStatus]:
        self._start_fallback()
        return self._fallback.request(end_offset)

    def _start_fallback(self) -> None:
        if not self._fallback_started:
            self._fallback_started = True
            self._fallback.start()

    def _fail_over_locked(self, reason: str) -> None:
        # Under _lock: every command in flight and every later request to the in-process
        # service.
        if self._failed_over:
            return
        self._failed_over = True
        pid = self._process.pid if self._process is not None else None
        logger.error("the sync worker (pid %s) is gone: %s; SYNC_FLUSH syncs in process from "
                     "now on (%d requests in flight re-requested)", pid, reason,
                     len(self._inflight))
        self._start_fallback()
        while self._inflight:
            command = self._inflight.popleft()
            again = self._fallback.request(command.end_offset)
            again.add_done_callback(lambda done, target=command.future: target.set_result(
                done.result()))

    def answer_on_loop(self, add_reader: Callable[[int, Callable[[], None]], None],
                       remove_reader: Callable[[int], bool],
                       answered: Callable[[], None] | None = None) -> bool:
        """Read the worker's answers on the caller's event loop instead of the reader thread
        (call on the loop's thread, with its ``add_reader``/``remove_reader``): a completed
        sync then answers at the loop's next turn, without a thread taking the GIL from it.
        ``answered()`` is called on the loop right after each read that completed requests'
        Futures (the broker writes their sends' responses there, before the callbacks
        already queued on the loop run). Returns whether it switched (False: no worker, or
        already switched)."""
        with self._lock:
            if self._failed_over or self._stopping or self._on_loop is not None \
                    or not self._reader.is_alive():
                return False
            self._on_loop = (remove_reader, threading.get_ident())
            self._answered = answered
        os.write(self._wake_w, b"x")
        self._reader.join()
        with self._read_lock:
            if self._answers_fd < 0:  # the reader met the worker's end meanwhile
                self._on_loop = None
                return False
            os.set_blocking(self._answers_fd, False)
            add_reader(self._answers_fd, self._read_on_loop)
        return True

    def _read_answers(self) -> None:
        # The reader thread: until the worker's end, or until answer_on_loop wakes it.
        while True:
            readable, _, _ = select.select([self._answers_fd, self._wake_r], [], [])
            if self._answers_fd not in readable:
                return  # woken: the loop reads from now on
            with self._read_lock:
                if not self._read_some():
                    return

    def _read_on_loop(self) -> None:
        answers = self.answers
        with self._read_lock:
            fd = self._answers_fd
            if fd >= 0 and not self._read_some():
                assert self._on_loop is not None
                self._on_loop[0](fd)
        # Outside _read_lock: the hook answers sends, which may append and request again.
        if self.answers != answers and self._answered is not None:
            self._answered()

    def _read_some(self) -> bool:
        # Under _read_lock: one read of answers, answered; False at the worker's end (the
        # requests in flight then went to the fallback service).
        try:
            chunk = os.read(self._answers_fd, 1 << 16)
        except BlockingIOError:
            return True
        except OSError as e:
            chunk, error = b"", f"reading its answers failed: {e}"
        else:
            error = "it ended"
        if not chunk:
            self._answers_fd = -1
            with self._lock:
                if self._inflight or not self._stopping:
                    self._fail_over_locked(error)
            return False
        buffered = self._buffered + chunk
        end = buffered.rfind(b"\n")
        if end < 0:
            self._buffered = buffered
            return True
        lines, self._buffered = buffered[:end].split(b"\n"), buffered[end + 1:]
        for line in lines:
            self._answer(line)
        return True

    def _answer(self, line: bytes) -> None:
        self.answers += 1
        status, _, rest = line.partition(b" ")
        token_text, _, rest = rest.partition(b" ")
        seconds_text, _, failures_text = rest.partition(b" ")
        token = int(token_text)
        if self._observe is not None:
            self._observe(float(seconds_text))
        failed: set[str] = set()
        if status == b"ERR":
            fields = failures_text.decode(errors="replace").split("\t")
            for path, error in zip(fields[::2], fields[1::2], strict=False):
                failed.add(path)
                logger.error("group commit sync failed, answering FLUSH_DISK_TIMEOUT: cannot "
                             "sync %s: %s", path, error)
        with self._lock:
            done = []
            while self._inflight and self._inflight[0].token <= token:
                done.append(self._inflight.popleft())
        queue = self._queue
        for command in done:
            ok = True
            for mapped, write_position in command.segments:
                if mapped.closed:  # deleted or cut meanwhile: its bytes are not the log's
                    continue
                if mapped.path in failed:
                    ok = False
                elif write_position > mapped.flushed_position:
                    mapped.flushed_position = write_position
            flushed = advance_flushed_where(queue)
            if ok and flushed >= command.end_offset:
                self._synced(command.timestamp)
                command.future.set_result(PutStatus.PUT_OK)
            else:
                command.future.set_result(PutStatus.FLUSH_DISK_TIMEOUT)

    def stop(self) -> None:
        """Answer the requests in flight, stop the worker, then the fallback service."""
        with self._lock:
            self._stopping = True
        process = self._process
        if process is not None:
            if process.stdin is not None:
                process.stdin.close()  # EOF: the worker answers what it read and ends
            if self._reader.is_alive():
                self._reader.join()
            on_loop = self._on_loop
            with self._read_lock:
                if on_loop is not None and self._answers_fd >= 0:
                    # The loop cannot run while its thread is here: read the last answers
                    # on this thread (off the loop's thread, its reader stays registered
                    # and stops at the end).
                    if on_loop[1] == threading.get_ident():
                        on_loop[0](self._answers_fd)
                    os.set_blocking(self._answers_fd, True)
                    while self._read_some():
                        pass
            process.wait()
            if process.stdout is not None and (on_loop is None or
                                               on_loop[1] == threading.get_ident()):
                process.stdout.close()
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1
        if self._fallback_started:
            self._fallback.stop()

"""MappedFile: one fixed-size, preallocated, memory-mapped segment of a log.

A segment is named by the 20-digit zero-padded offset of its first byte in the log's byte
space (``00000000001073741824`` is the second 1 GiB commit-log file). It is created at its
full size up front and mapped whole. Its disk space is *reserved* before a byte of it is
touched: a page written through a mapping over a hole in the file needs a block at fault
time, and on a full disk that fault kills the process with SIGBUS. So:

- a commit-log segment is reserved whole at creation (``posix_fallocate``): a full disk fails
  the roll with ``StoreFull``;
- a consume-queue segment (``reserve_chunk`` given) is sized sparse and reserved in chunks as
  it fills (``reserve``): a new queue costs microseconds and a page of disk, not 5.7 MiB, and
  its owner reserves the next chunk *before* the append that needs it (``StoreFull`` then
  refuses that append; nothing was written). A chunk is also *warmed*: zeros are written
  over it with ``os.pwrite``. Why: on ext4 the first write through a mapping to a page never
  written before (a hole, or an fallocated "unwritten" extent) takes a fault that waits for
  the journal; measured here on a busy machine, 20 to 45 ms per page, against 8 to 14 us for
  a pwrite of the same bytes and 7 to 45 us for the mapped write once the page was warmed.

``reserved_position`` says how far the file is known to be reserved; a segment opened from
disk starts at 0 (unknown) and reserving an already allocated range again is a cheap no-op.

Positions inside a segment:
- ``write_position``: bytes appended so far; everything after it is zero (or a torn tail that
  recovery zeroes);
- ``flushed_position``: bytes known to be on disk (``msync``); always <= write_position.

The in-memory twin is the same class over an anonymous mapping (``path`` is None): the
memory store reuses every line of the log logic, and ``flush`` is a no-op there.

Threads: appends (one at a time, under the store's append lock) move ``write_position``; the
flush thread moves ``flushed_position``; readers only read bytes below a position they got
from a consume queue or the write position. ``destroy`` may run while a reader still holds a
slice: the file is unlinked at once and the mapping is closed when the last slice is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable

from tidemq.errors import StoreError, StoreFull
from tidemq.store.open_files import describe_open_file_error, is_open_file_shortage

logger = logging.getLogger(__name__)

FILE_NAME_DIGITS = 20
TEMPORARY_SUFFIX = ".tmp"  # a segment being created; see MappedFile.create

# mmap.flush (msync) needs a page-aligned start offset.
PAGE_SIZE = mmap.ALLOCATIONGRANULARITY

_ZERO_CHUNK = bytes(1 << 20)


def file_name(file_from_offset: int) -> str:
    """The 20-digit zero-padded name of the segment that starts at ``file_from_offset``."""
    return str(file_from_offset).zfill(FILE_NAME_DIGITS)


def parse_file_name(name: str) -> int | None:
    """The start offset a segment name stands for, or None for a name that is not one."""
    if len(name) == FILE_NAME_DIGITS and name.isdigit():
        return int(name)
    return None


class MappedFile:
    """A fixed-size segment of a log, mapped in memory.

    Use ``create`` (new file), ``open`` (existing file) or ``anonymous`` (memory only).
    """

    __slots__ = (
        "_closed",
        "_mmap",
        "buffer",
        "file_from_offset",
        "file_size",
        "flushed_position",
        "last_modified_ms",
        "path",
        "readonly",
        "reserve_chunk",
        "reserved_position",
        "write_position",
    )

    def __init__(
        self,
        path: str | None,
        file_from_offset: int,
        file_size: int,
        mapping: mmap.mmap,
        *,
        readonly: bool = False,
    ) -> None:
        self.path = path
        self.file_from_offset = file_from_offset
        self.file_size = file_size
        self._mmap = mapping
        self.buffer = memoryview(mapping)
        self.write_position = 0
        self.flushed_position = 0
        self.readonly = readonly
        self.last_modified_ms = int(time.time() * 1000)
        self._closed = False
        # See the module docstring; the in-memory twin needs no disk.
        self.reserved_position = file_size if path is None else 0
        self.reserve_chunk = file_size

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        directory: str,
        file_from_offset: int,
        file_size: int,
        *,
        exclusive: bool = False,
        reserve_chunk: int | None = None,
    ) -> MappedFile:
        """Create the segment file at its full size and map it.

        The file is made and sized under a temporary name and then renamed, so a crash in
        between leaves a ``*.tmp`` file (deleted at the next load), never a segment of the
        wrong size.

        Args:
            exclusive: fail if the segment exists (the background allocator must never map
                a segment someone else is writing).
            reserve_chunk: reserve only this many bytes now (and later ones with
                ``reserve``, in steps of it); None reserves the whole file.

        The directory is made when missing.

        Raises:
            StoreFull: the volume has no room for ``file_size`` bytes.
            StoreError: the file cannot be created or mapped (it names the path and errno).
        """
        path = os.path.join(directory, file_name(file_from_offset))
        if reserve_chunk is not None and reserve_chunk < file_size and not exclusive:
            return cls._create_chunked(path, file_from_offset, file_size, reserve_chunk)
        _make_directory(directory)
        temporary = f"{path}.{os.getpid()}.{threading.get_ident()}{TEMPORARY_SUFFIX}"
        try:
            fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            raise _file_error(f"cannot create segment {path}", e) from e
        try:
            _preallocate(fd, path, 0, file_size)
            mapping = _map(fd, file_size, mmap.ACCESS_WRITE, path)
            try:
                if exclusive:
                    os.link(temporary, path)  # fails if the segment exists: never clobbers
                    os.unlink(temporary)
                else:
                    os.replace(temporary, path)
            except OSError as e:
                mapping.close()
                raise StoreError(f"cannot create segment {path}: {e.strerror}") from e
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        os.close(fd)
        mapped = cls(path, file_from_offset, file_size, mapping)
        mapped.reserved_position = file_size
        return mapped

    @classmethod
    def _create_chunked(
        cls, path: str, file_from_offset: int, file_size: int, reserve_chunk: int
    ) -> MappedFile:
        # Made in place, sized sparse with one page reserved and warmed: a new consume queue
        # costs one file creation and a few system calls. A crash before the ftruncate leaves
        # a short file, which loading extends (the queue is then rebuilt from the log).
        reserved = first_page_size(file_size)
        prepared = _open_prepared(path, file_size, file_from_offset, reserved, reserve_chunk)
        if prepared is not None:
            return prepared
        try:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            except FileNotFoundError:  # a new queue: its directory first (only then: a
                _make_directory(os.path.dirname(path))  # stat and a mkdir saved per file)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            raise _file_error(f"cannot create segment {path}", e) from e
        try:
            start_sparse_segment(fd, path, file_size)
            mapping = _map(fd, file_size, mmap.ACCESS_WRITE, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        finally:
            os.close(fd)
        mapped = cls(path, file_from_offset, file_size, mapping)
        mapped.reserved_position = reserved
        mapped.reserve_chunk = reserve_chunk
        return mapped

    @classmethod
    def open(cls, path: str, file_size: int, *, readonly: bool = False) -> MappedFile:
        """Map an existing segment; its write position starts at 0 until recovery sets it.

        Raises:
            StoreError: the name is not a 20-digit offset, the size is not ``file_size``, or
                the file cannot be mapped.
        """
        file_from_offset = parse_file_name(os.path.basename(path))
        if file_from_offset is None:
            raise StoreError(f"{path} is not named by a 20-digit start offset")
        try:
            fd = os.open(path, os.O_RDONLY if readonly else os.O_RDWR)
        except OSError as e:
            raise _file_error(f"cannot open segment {path}", e) from e
        try:
            actual = os.fstat(fd).st_size
            if actual != file_size:
                raise StoreError(
                    f"segment {path} is {actual} bytes but the configured segment size is "
                    f"{file_size}; start with the size the store was written with "
                    "(mapped_file_size_commit_log / mapped_file_size_consume_queue)"
                )
            access = mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE
            mapping = _map(fd, file_size, access, path)
        finally:
            os.close(fd)
        mapped = cls(path, file_from_offset, file_size, mapping, readonly=readonly)
        mapped.last_modified_ms = int(os.stat(path).st_mtime * 1000)
        return mapped

    @classmethod
    def anonymous(cls, file_from_offset: int, file_size: int) -> MappedFile:
        """A segment held only in memory (the memory store's twin of ``create``)."""
        return cls(None, file_from_offset, file_size, mmap.mmap(-1, file_size))

    # -- state ----------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The segment's file name (its 20-digit start offset)."""
        return file_name(self.file_from_offset)

    @property
    def free_bytes(self) -> int:
        """Bytes left after the write position."""
        return self.file_size - self.write_position

    @property
    def end_offset(self) -> int:
        """The log offset right after the last written byte."""
        return self.file_from_offset + self.write_position

    @property
    def closed(self) -> bool:
        """True once the segment was destroyed or closed."""
        return self._closed

    def describe(self) -> str:
        """A name for messages: the path, or ``memory:<name>``."""
        return self.path if self.path is not None else f"memory:{self.name}"

    # -- writes ---------------------------------------------------------------------------------

    def reserve(self, end: int) -> None:
        """Make sure the disk holds blocks for [0, end) before anything there is written:
        reserve up to ``end`` rounded up to the reserve chunk (at most the file size).

        Raises:
            StoreFull: the volume has no room (nothing was written; the file is as it was).
            StoreError: the file cannot be opened to reserve it.
        """
        if end <= self.reserved_position or self.path is None:
            return
        chunk = self.reserve_chunk
        target = min(self.file_size, -(-end // chunk) * chunk)
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError as e:
            raise StoreError(f"cannot open {self.path} to reserve space: {e.strerror}") from e
        try:
            _preallocate(fd, self.path, self.reserved_position, target - self.reserved_position)
            if chunk < self.file_size:
                # Never over written bytes: only past the write position (module docstring).
                _warm(fd, self.path, max(self.reserved_position, self.write_position), target)
        finally:
            os.close(fd)
        self.reserved_position = target

    def write(self, position: int, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` to ``position`` and move the write position past it.

        The caller (the log owning the segment) has checked that it fits.
        """
        end = position + len(data)
        self.buffer[position:end] = data
        self.write_position = end
        if self.path is None:
            self.last_modified_ms = int(time.time() * 1000)

    def zero(self, start: int, end: int) -> None:
        """Write zeros over [start, end), in 1 MiB chunks."""
        while start < end:
            step = min(end - start, len(_ZERO_CHUNK))
            self.buffer[start : start + step] = _ZERO_CHUNK[:step]
            start += step

    def data_ranges(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) that may hold a non-zero byte, in order.

        The file system's data extents (``SEEK_DATA``/``SEEK_HOLE``): a range it reports as
        a hole (never written: a sparse hole, or an fallocated "unwritten" extent with no
        page in memory) reads as zeros, so the unwritten rest of a reserved 1 GiB segment is
        skipped without faulting it in. Every byte written, through the mapping or by
        ``pwrite``, is in a data range (the kernel counts pages in memory as data). Where it
        cannot tell (an in-memory segment, a file system without the two seeks) the answer
        is ``[(start, end)]``: every byte may hold data.
        """
        if start >= end:
            return []
        if self.path is None:
            return [(start, end)]
        ranges: list[tuple[int, int]] = []
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return [(start, end)]
        try:
            position = start
            while position < end:
                try:
                    data = os.lseek(fd, position, os.SEEK_DATA)
                except OSError as e:
                    if e.errno == errno.ENXIO:  # holes from here to the file's end
                        break
                    raise
                if data >= end:
                    break
                hole = os.lseek(fd, data, os.SEEK_HOLE)
                ranges.append((data, min(hole, end)))
                position = hole
        except OSError:  # EINVAL: the file system cannot tell
            return [(start, end)]
        finally:
            os.close(fd)
        return ranges

    def data_end(self, start: int = 0, limit: int | None = None) -> int:
        """One past the last non-zero byte in [start, limit) (``start`` if all zero);
        ``limit`` defaults to the file's end.

        Recovery uses it to find how far a torn tail reaches. It reads only the file
        system's data ranges (``data_ranges``), each in 1 MiB chunks from its end: the
        never-written rest of a segment costs no read at all.
        """
        end = self.file_size if limit is None else min(limit, self.file_size)
        for range_start, range_end in reversed(self.data_ranges(start, end)):
            lower = max(start, range_start)
            found = self._data_end_in(lower, range_end)
            if found > lower:
                return found
        return start

    def _data_end_in(self, start: int, end: int) -> int:
        # One past the last non-zero byte in [start, end), start if all zero.
        while end > start:
            chunk_start = max(start, end - len(_ZERO_CHUNK))
            chunk = self._mmap[chunk_start:end]
            if chunk != _ZERO_CHUNK[: end - chunk_start]:
                return chunk_start + len(chunk.rstrip(b"\x00"))
            end = chunk_start
        return start

    def flush(self) -> int:
        """Sync [flushed_position, write_position) to disk; return the new flushed position.

        Raises:
            StoreError: msync failed (the disk or the volume is gone); names the file.
        """
        write_position = self.write_position
        flushed = self.flushed_position
        if write_position <= flushed or self._closed:
            return flushed
        if self.path is not None:
            start = flushed - flushed % PAGE_SIZE
            try:
                self._mmap.flush(start, write_position - start)
            except (OSError, ValueError) as e:
                if self._closed:  # destroyed by retention while we flushed
                    return flushed
                raise StoreError(f"cannot sync {self.path}: {e}") from e
        self.flushed_position = write_position
        return write_position

    # -- reads ----------------------------------------------------------------------------------

    def find(self, data: bytes, start: int, end: int) -> int:
        """The lowest position in [start, end) where ``data`` starts, or -1 (a C scan)."""
        return self._mmap.find(data, start, end)

    def read(self, position: int, size: int) -> bytes:
        """A copy of [position, position + size)."""
        return self._mmap[position : position + size]

    # -- end of life ----------------------------------------------------------------------------

    def close(self) -> bool:
        """Unmap the segment; keep the file. Returns False while a reader still holds a slice
        (the mapping is then freed with the last slice)."""
        if self._closed:
            return True
        self._closed = True
        try:
            self.buffer.release()
            self._mmap.close()
        except BufferError:
            return False
        return True

    def destroy(self) -> bool:
        """Unmap the segment and delete its file (see ``close`` for the return value)."""
        closed = self.close()
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            except OSError as e:
                # A volume remounted read-only, or a file made immutable: the segment is
                # already out of use, so the caller goes on; the file stays, and is loaded
                # again at the next start (its bytes are still valid records).
                logger.warning(
                    "cannot delete segment file %s: %s; it stays on disk and is loaded again "
                    "at the next start (make the volume writable, then delete it or let "
                    "retention do so)", self.path, e,
                )
        return closed

    def __repr__(self) -> str:
        return (
            f"MappedFile({self.describe()}, write={self.write_position}, "
            f"flushed={self.flushed_position})"
        )


# madvise(2) advice: fault the range in writable, as a write would, bytes unchanged (5.14+).
MADV_POPULATE_WRITE = 23

_libc_madvise: Callable[..., int] | None = None


def madvise(address: int, length: int, advice: int) -> bool:
    """madvise(2) through ctypes, which releases the GIL for the call (``mmap.madvise`` holds
    it: measured, a 200 MiB populate stopped every other thread for 1.2 s). True on success."""
    global _libc_madvise
    if _libc_madvise is None:
        try:
            function = ctypes.CDLL(None, use_errno=True).madvise
        except (OSError, AttributeError):
            return False
        function.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        function.restype = ctypes.c_int
        _libc_madvise = function
    return _libc_madvise(address, length, advice) == 0


def populate_writable(mapping: mmap.mmap, length: int) -> bool:
    """Fault the first ``length`` bytes of ``mapping`` in writable without holding the GIL
    and without changing a byte (safe beside writers of the same pages); False where the
    kernel cannot (then the first write faults instead)."""
    exported = ctypes.c_char.from_buffer(mapping)
    address = ctypes.addressof(exported)
    del exported  # no export left: the mapping can still be closed
    return madvise(address, length, MADV_POPULATE_WRITE)


def first_page_size(file_size: int) -> int:
    """How much of a new sparse segment of ``file_size`` bytes is reserved at once."""
    return min(PAGE_SIZE, file_size)


def start_sparse_segment(fd: int, path: str, file_size: int) -> None:
    """Make the open, empty file ``fd`` (at ``path``) what a new consume-queue segment starts
    as: sized sparse to ``file_size``, its first page reserved and written with zeros.

    Raises:
        StoreFull: no room for the first page.
        StoreError: the file cannot be sized or written (it names the path).
    """
    reserved = first_page_size(file_size)
    _size_sparse(fd, path, file_size)
    _preallocate(fd, path, 0, reserved)
    _warm(fd, path, 0, reserved)


def _make_directory(directory: str) -> None:
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise _file_error(f"cannot create directory {directory}", e) from e


def _open_prepared(path: str, file_size: int, file_from_offset: int, reserved: int,
                   reserve_chunk: int) -> MappedFile | None:
    """Map a segment made ahead by queue_file_preparer.py (sized, its first page reserved
    and warmed, holding zeros), or None when there is none at ``path``: only an open and a
    map on this thread instead of a file creation.

    Only a file that is all zeros is taken (its size, one page of blocks, that page zero),
    so it is the same as the file the caller would make; anything else there is made anew.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _file_error(f"cannot open segment {path}", e) from e
    try:
        status = os.fstat(fd)
        if status.st_size != file_size or status.st_blocks * 512 > reserved:
            return None
        mapping = _map(fd, file_size, mmap.ACCESS_WRITE, path)
    finally:
        os.close(fd)
    if mapping[:reserved] != _ZERO_CHUNK[:reserved]:
        mapping.close()
        return None
    mapped = MappedFile(path, file_from_offset, file_size, mapping)
    mapped.reserved_position = reserved
    mapped.reserve_chunk = reserve_chunk
    return mapped


def _size_sparse(fd: int, path: str, file_size: int) -> None:
    try:
        os.ftruncate(fd, file_size)
    except OSError as e:
        raise StoreError(f"cannot size segment {path} to {file_size}: {e.strerror}") from e


def _warm(fd: int, path: str, start: int, end: int) -> None:
    """Write zeros over [start, end) of the file (see the module docstring)."""
    with memoryview(_ZERO_CHUNK) as zeros:
        while start < end:
            step = min(end - start, len(zeros))
            try:
                os.pwrite(fd, zeros[:step], start)
            except OSError as e:
                raise StoreError(f"cannot write zeros to {path} at {start}: {e}") from e
            start += step


def _file_error(what: str, error: OSError) -> StoreError:
    # Out of descriptors is the operator's to fix (the limit), so it says how.
    if is_open_file_shortage(error):
        return StoreError(describe_open_file_error(what, error))
    return StoreError(f"{what}: {error.strerror}")


def _map(fd: int, size: int, access: int, path: str) -> mmap.mmap:
    """Map ``fd``; CPython's mmap keeps a duplicate of the descriptor, so a process out of
    descriptors fails here (EMFILE) even though ``fd`` itself was opened."""
    try:
        return mmap.mmap(fd, size, access=access)
    except OSError as e:
        raise _file_error(f"cannot map segment {path}", e) from e


def _preallocate(fd: int, path: str, start: int, length: int) -> None:
    """Reserve [start, start + length) of the file (and size it to at least its end)."""
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, start, length)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StoreFull(
                f"no room to reserve {length} bytes for {path}: the volume is full; free disk "
                "space (or lower fileReservedTime so retention deletes more); writes resume "
                "by themselves once there is room"
            ) from e
        # Some file systems (some FUSE mounts) lack fallocate: fall back to a sparse file of
        # the right size (a full disk may then fault a write through the mapping).
        try:
            if os.fstat(fd).st_size < start + length:
                os.ftruncate(fd, start + length)
        except OSError as e2:
            raise StoreError(
                f"cannot size segment {path} to {start + length}: {e2.strerror}"
            ) from e2

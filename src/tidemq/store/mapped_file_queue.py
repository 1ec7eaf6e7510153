"""MappedFileQueue: a log made of equal-size segments, in offset order.

The log's byte space is continuous: segment ``k`` covers [start_k, start_k + file_size).
The commit log and every consume queue are such a queue; they differ only in what they
write into it. The first segments may have been deleted by retention, so the first start
offset is not always 0.

Threads: the segment list is copy-on-write. Writers (appends and rolls under the store's
append lock; retention) build a new tuple and swap it in; readers and the flush thread take
the current tuple and search it without a lock, so a read never sees a half-changed list.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import os

from tidemq.errors import StoreError
from tidemq.store.mapped_file import TEMPORARY_SUFFIX, MappedFile, parse_file_name

logger = logging.getLogger(__name__)


class MappedFileQueue:
    """Ordered segments of one log under ``directory`` (None: in memory only)."""

    def __init__(
        self,
        directory: str | None,
        file_size: int,
        *,
        readonly: bool = False,
        reserve_chunk: int | None = None,
    ) -> None:
        self.directory = directory
        self.file_size = file_size
        self.readonly = readonly
        # Disk is reserved for new segments whole (None) or in chunks of this many bytes
        # (see MappedFile.reserve).
        self.reserve_chunk = reserve_chunk
        # (segments, their start offsets), swapped as one object so readers see a whole list.
        self._segments: tuple[tuple[MappedFile, ...], tuple[int, ...]] = ((), ())
        # Where the flush thread got to, as a log offset.
        self.flushed_where = 0
        # Segments ``load`` extended because their end was lost.
        self.extended: list[str] = []

    # -- loading --------------------------------------------------------------------------------

    def load(self, *, skip_wrong_size: bool = False, extend_short: bool = False) -> None:
        """Map every segment in the directory, in offset order (write positions stay 0 until
        recovery sets them). Files whose name is not a 20-digit offset are ignored.

        Args:
            skip_wrong_size: leave out segments of another size instead of raising (the
                offline checker reports them itself).
            extend_short: a segment shorter than the segment size lost its end (a file
                system that lost its tail, a copy cut short): extend it with zeros, with a
                WARNING, and list it in ``extended``, so recovery keeps its records up to the
                cut and the segments after it. Unless every segment has the same smaller,
                page-aligned size: that is a store written with another segment size.

        Raises:
            StoreError: a segment is longer than the segment size, or all have another size
                (the message says which setting to give), or a segment cannot be mapped.
        """
        self.extended = []
        if self.directory is None or not os.path.isdir(self.directory):
            return
        listing = os.listdir(self.directory)
        if not self.readonly:
            for name in listing:
                if name.endswith(TEMPORARY_SUFFIX):  # a creation cut short by a crash
                    logger.info("deleting unfinished segment %s", name)
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.directory, name))
        names = sorted(name for name in listing if parse_file_name(name) is not None)
        sizes = {name: os.path.getsize(os.path.join(self.directory, name)) for name in names}
        other_sizes = {size for size in sizes.values() if size != self.file_size}
        written_with_other_size = (
            len(other_sizes) == 1 and len(set(sizes.values())) == 1
            and next(iter(other_sizes)) % 4096 == 0
        )
        files = []
        for name in names:
            path = os.path.join(self.directory, name)
            size = sizes[name]
            if size != self.file_size:
                if skip_wrong_size:
                    continue
                if extend_short and size < self.file_size and not written_with_other_size:
                    self._extend_short_segment(path, size)
                    self.extended.append(path)
            mapped = MappedFile.open(path, self.file_size, readonly=self.readonly)
            if self.reserve_chunk is not None:
                mapped.reserve_chunk = min(self.reserve_chunk, self.file_size)
            files.append(mapped)
        self._set(tuple(files))
        if files:
            self.flushed_where = files[0].file_from_offset

    def _extend_short_segment(self, path: str, size: int) -> None:
        logger.warning(
            "segment %s is %d bytes, shorter than the segment size %d: its end was lost (the "
            "file was cut short); extended it with zeros so recovery keeps its records up to "
            "the cut and every segment after it", path, size, self.file_size,
        )
        try:
            os.truncate(path, self.file_size)
        except OSError as e:
            raise StoreError(f"cannot extend short segment {path}: {e.strerror}") from e

    def _set(self, files: tuple[MappedFile, ...]) -> None:
        # One assignment: a concurrent reader sees the old or the new list, never a mix.
        self._segments = (files, tuple(f.file_from_offset for f in files))

    # -- lookups --------------------------------------------------------------------------------

    @property
    def files(self) -> tuple[MappedFile, ...]:
        """The segments, first to last (a snapshot)."""
        return self._segments[0]

    def first_file(self) -> MappedFile | None:
        """The oldest segment, or None when the log is empty."""
        files = self._segments[0]
        return files[0] if files else None

    def last_file(self) -> MappedFile | None:
        """The segment being written, or None when the log has no segment yet."""
        files = self._segments[0]
        return files[-1] if files else None

    def find_file(self, offset: int) -> MappedFile | None:
        """The segment holding log offset ``offset`` (binary search), or None if none does."""
        files, starts = self._segments
        index = bisect.bisect_right(starts, offset) - 1
        if index < 0:
            return None
        found = files[index]
        if offset >= found.file_from_offset + self.file_size:
            return None
        return found

    def file_after(self, mapped: MappedFile) -> MappedFile | None:
        """The segment right after ``mapped`` (by offset), or None."""
        return self.find_file(mapped.file_from_offset + self.file_size)

    def min_offset(self) -> int:
        """The first offset of the oldest segment (0 for an empty log)."""
        files = self._segments[0]
        return files[0].file_from_offset if files else 0

    def max_offset(self) -> int:
        """One past the last written byte (0 for an empty log)."""
        files = self._segments[0]
        return files[-1].end_offset if files else 0

    # -- growth ---------------------------------------------------------------------------------

    def create_file(self, file_from_offset: int, *, register: bool = True) -> MappedFile:
        """Create a segment starting at ``file_from_offset`` (a multiple of the file size).

        Args:
            register: add it at the end of the queue now; False makes a spare that
                ``register`` adds later (so a multi-segment write can create every segment
                it needs before writing a byte, without readers seeing empty segments).

        Raises:
            StoreFull / StoreError: the file cannot be created (see MappedFile.create).
        """
        assert file_from_offset % self.file_size == 0, file_from_offset
        if self.directory is None:
            mapped = MappedFile.anonymous(file_from_offset, self.file_size)
        else:
            mapped = MappedFile.create(
                self.directory, file_from_offset, self.file_size, reserve_chunk=self.reserve_chunk
            )
        if register:
            self.register(mapped)
        return mapped

    def register(self, mapped: MappedFile) -> None:
        """Add a segment made by ``create_file(register=False)`` at the end of the queue."""
        files = self._segments[0]
        assert not files or mapped.file_from_offset > files[-1].file_from_offset, mapped
        self._set((*files, mapped))
        if not files:
            self.flushed_where = mapped.file_from_offset

    # -- shrinking ------------------------------------------------------------------------------

    def truncate_dirty(self, offset: int) -> None:
        """Make ``offset`` the end of the log: zero what the segment holding it has after it
        and delete every segment that starts after it."""
        keep: list[MappedFile] = []
        for mapped in self._segments[0]:
            if mapped.file_from_offset + self.file_size <= offset:
                keep.append(mapped)
                continue
            if mapped.file_from_offset <= offset:
                position = offset - mapped.file_from_offset
                end = max(mapped.write_position, mapped.data_end(position))
                mapped.zero(position, end)
                mapped.write_position = position
                mapped.flushed_position = min(mapped.flushed_position, position)
                keep.append(mapped)
            else:
                logger.info("deleting segment %s past the end offset %d", mapped.describe(),
                            offset)
                mapped.destroy()
        self._set(tuple(keep))
        self.flushed_where = min(self.flushed_where, offset)

    def delete_first_files(self, count: int) -> list[MappedFile]:
        """Destroy the ``count`` oldest segments, never the last one; return them."""
        files = self._segments[0]
        count = min(count, len(files) - 1)
        if count <= 0:
            return []
        doomed = files[:count]
        self._set(files[count:])
        for mapped in doomed:
            mapped.destroy()
        return list(doomed)

    def destroy(self) -> None:
        """Delete every segment and the directory if it is then empty."""
        files = self._segments[0]
        self._set(())
        for mapped in files:
            mapped.destroy()
        if self.directory is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.directory)

    def close(self) -> None:
        """Unmap every segment (files stay)."""
        for mapped in self._segments[0]:
            mapped.close()

    # -- flushing -------------------------------------------------------------------------------

    def flush(self) -> int:
        """Sync every segment from the flushed point to the write end; return the new
        flushed log offset.

        The flushed offset only moves over contiguous synced bytes: it stops in the first
        segment that is not wholly written, even if later ones were synced too.

        Raises:
            StoreError: a sync failed.
        """
        files, starts = self._segments
        if not files:
            return self.flushed_where
        index = max(0, bisect.bisect_right(starts, self.flushed_where) - 1)
        flushed_where = None
        for mapped in files[index:]:
            mapped.flush()
            if flushed_where is None:
                end = mapped.file_from_offset + mapped.flushed_position
                if mapped.flushed_position < self.file_size:
                    flushed_where = end
        if flushed_where is None:
            flushed_where = files[-1].file_from_offset + files[-1].flushed_position
        self.flushed_where = flushed_where
        return flushed_where

    def check_contiguous(self) -> None:
        """Raise when a segment is missing in the middle of the log.

        Raises:
            StoreError: names the two segments around the hole.
        """
        files = self._segments[0]
        for before, after in itertools.pairwise(files):
            if after.file_from_offset != before.file_from_offset + self.file_size:
                raise StoreError(
                    f"segment after {before.describe()} is missing: next is {after.describe()}; "
                    "restore the missing file or delete everything from it on"
                )

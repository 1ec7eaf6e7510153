"""MemoryIndex: the memory store's key index, the in-memory twin of ``IndexService``.

Same contract as ``tidemq.store.index_file.IndexService`` for what the store uses: ``put``
skips offsets at or below ``last_update_physical_offset``; ``query`` returns distinct offsets
newest first within the time window. It keeps exact keys (no hash collisions to filter).

Threads: one lock around every method, like IndexService.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable


class MemoryIndex:
    """Key -> [(physical offset, store time)], oldest first."""

    def __init__(self) -> None:
        self._entries: dict[str, list[tuple[int, int]]] = {}
        self._lock = threading.Lock()
        self._last_physical_offset = -1
        self._last_timestamp_ms = 0

    @property
    def last_update_physical_offset(self) -> int:
        """Offset of the newest indexed message; -1 when nothing is indexed."""
        return self._last_physical_offset

    @property
    def last_update_timestamp_ms(self) -> int:
        """Store time of the newest indexed message; 0 when nothing is indexed."""
        return self._last_timestamp_ms

    def ensure_room(self, key_count: int) -> None:
        """Nothing to reserve in memory (IndexService reserves disk here)."""

    def put(
        self, topic: str, keys: Iterable[str], physical_offset: int, store_timestamp_ms: int
    ) -> None:
        """Index one message under ``topic#key`` for each non-empty key."""
        with self._lock:
            if physical_offset <= self._last_physical_offset:
                return
            entry = (physical_offset, store_timestamp_ms)
            for key in keys:
                if key:
                    self._entries.setdefault(f"{topic}#{key}", []).append(entry)
            self._last_physical_offset = physical_offset
            self._last_timestamp_ms = store_timestamp_ms

    def query(self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int) -> list[int]:
        """Offsets indexed under ``topic#key`` with store time in [begin_ms, end_ms], newest
        first, at most ``max_count``."""
        found: list[int] = []
        with self._lock:
            for physical_offset, timestamp in reversed(self._entries.get(f"{topic}#{key}", ())):
                if len(found) >= max_count:
                    break
                if begin_ms <= timestamp <= end_ms and physical_offset not in found:
                    found.append(physical_offset)
        return found

    def flush(self) -> None:
        """Nothing to sync in memory."""

    def delete_files_below(self, min_physical_offset: int) -> int:
        """Forget entries below ``min_physical_offset``; returns 0 (there are no files)."""
        with self._lock:
            for key in list(self._entries):
                kept = [entry for entry in self._entries[key] if entry[0] >= min_physical_offset]
                if kept:
                    self._entries[key] = kept
                else:
                    del self._entries[key]
        return 0

    def drop_from(self, physical_offset: int,
                  timestamp_at: Callable[[int], int | None] = lambda _offset: None) -> int:
        """Forget entries at or after ``physical_offset`` (a truncation); returns 0."""
        with self._lock:
            for key in list(self._entries):
                kept = [entry for entry in self._entries[key] if entry[0] < physical_offset]
                if kept:
                    self._entries[key] = kept
                else:
                    del self._entries[key]
            remaining = [entry for entries in self._entries.values() for entry in entries]
            newest = max(remaining, default=(-1, 0))
            self._last_physical_offset, self._last_timestamp_ms = newest
        return 0

    def close(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()

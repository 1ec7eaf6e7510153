"""KeyColumns: a batch's index keys kept as columns, one list per key position.

A batch's keys are, per message, its UNIQ_KEY and then each KEYS token. The batch path
makes them as columns (the UNIQ_KEYs of all messages, their KEYS values) and the index hashes
them as columns (``IndexService.put_columns``). Held in between as one tuple per message, a
batch of 1,024 keys was zipped into tuples, chained with the other batches of the same write,
and zipped back into columns: ~6 % of the event loop's time under batch produce (py-spy,
``zip(*key_lists)`` alone). ``KeyColumns`` keeps the columns and still reads as the list of
per-message key tuples it stands for, so every other reader of a batch's keys is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import overload


class KeyColumns(Sequence[tuple[str, ...]]):
    """Message ``i``'s keys are ``tuple(column[i] for column in columns)``.

    Every column has one entry per message, so every message has ``len(columns)`` keys
    (an empty text included: readers treat it as they treat it in a list of tuples).
    """

    __slots__ = ("columns",)

    def __init__(self, columns: tuple[list[str], ...]) -> None:
        if not columns or any(len(column) != len(columns[0]) for column in columns[1:]):
            raise ValueError(f"key columns must be one or more of equal length, got "
                             f"{[len(column) for column in columns]}")
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns[0])

    @overload
    def __getitem__(self, index: int) -> tuple[str, ...]: ...

    @overload
    def __getitem__(self, index: slice) -> KeyColumns: ...

    def __getitem__(self, index: int | slice) -> tuple[str, ...] | KeyColumns:
        if isinstance(index, slice):
            # Still columns (a transaction's end writes a batch's keys in slices).
            return KeyColumns(tuple(column[index] for column in self.columns))
        return tuple(column[index] for column in self.columns)

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        return zip(*self.columns, strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeyColumns):
            return self.columns == other.columns
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(
                tuple(mine) == tuple(theirs) for mine, theirs in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable columns, like the list it stands for

    def __repr__(self) -> str:
        return f"KeyColumns({self.columns!r})"

    @property
    def key_count(self) -> int:
        """How many keys the messages have together (``sum(map(len, self))``)."""
        return len(self.columns[0]) * len(self.columns)


def key_count(keys: Sequence[Sequence[str]]) -> int:
    """How many keys the messages of ``keys`` have together."""
    if type(keys) is KeyColumns:  # not isinstance: a Sequence ABC's check is a Python call
        return keys.key_count
    return sum(map(len, keys))


def concatenated_keys(parts: Sequence[Sequence[Sequence[str]]]) -> Sequence[Sequence[str]]:
    """The keys of several batches' messages, in order: columns joined when every part is
    ``KeyColumns`` of one width, else a list of each message's keys."""
    first = parts[0]
    if isinstance(first, KeyColumns):
        width = len(first.columns)
        if all(isinstance(part, KeyColumns) and len(part.columns) == width for part in parts):
            columns: tuple[list[str], ...] = tuple([] for _ in range(width))
            for part in parts:
                for column, more in zip(columns, part.columns, strict=True):  # type: ignore[attr-defined]
                    column += more
            return KeyColumns(columns)
    return list(chain.from_iterable(parts))

"""The SQL92 filters of consumer groups, compiled once (RocketMQ's ConsumerFilterManager).

A broker learns a group's SQL92 subscription from its heartbeats (or from a pull that carries
the expression). Compiling it on every pull would cost more than the pull; this table keeps
one ``FilterData`` per (group, topic) and compiles again only when the expression text
changes. A newer ``subVersion`` with the same text keeps the compiled expression and takes the
new version. Compiled expressions are also shared across groups by text
(``compile_sql92``'s own cache).

An expression that does not compile is kept too, with its error: the pulls of that group then
answer FILTER_DATA_NOT_EXIST naming the problem, as RocketMQ does, instead of compiling the
same bad text again and again.

Owned by the broker's event loop; nothing here is locked.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidemq.errors import SqlFilterError
from tidemq.filter.sql92 import SqlExpression, compile_sql92

# (group, topic) pairs kept. A broker serves a few hundred groups of a few topics each; when
# a churn of short-lived groups fills the table it is cleared and refilled on demand.
CONSUMER_FILTERS_MAX = 16_384


@dataclass(frozen=True, slots=True)
class FilterData:
    """A group's compiled SQL92 filter of one topic.

    Exactly one of ``expression`` (compiled) and ``problem`` (why it does not compile) is set.
    """

    group: str
    topic: str
    text: str
    sub_version: int
    expression: SqlExpression | None
    problem: SqlFilterError | None


class ConsumerFilterTable:
    """Compiled SQL92 filters by (group, topic)."""

    def __init__(self, entries_max: int = CONSUMER_FILTERS_MAX) -> None:
        self._entries: dict[tuple[str, str], FilterData] = {}
        self._entries_max = entries_max

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, group: str, topic: str) -> FilterData | None:
        """The filter registered for ``group`` on ``topic``, or None."""
        return self._entries.get((group, topic))

    def register(self, group: str, topic: str, text: str, sub_version: int) -> FilterData:
        """Compile (or reuse) the group's expression for ``topic`` and keep it.

        Returns:
            The FilterData; its ``problem`` is set when the text does not compile (nothing
            is raised for that).
        """
        key = (group, topic)
        current = self._entries.get(key)
        if current is not None and current.text == text:
            if current.sub_version >= sub_version:
                return current
            updated = FilterData(group, topic, text, sub_version, current.expression,
                                 current.problem)
            self._entries[key] = updated
            return updated
        try:
            data = FilterData(group, topic, text, sub_version, compile_sql92(text), None)
        except SqlFilterError as e:
            data = FilterData(group, topic, text, sub_version, None, e)
        if current is None and len(self._entries) >= self._entries_max:
            self._entries.clear()
        self._entries[key] = data
        return data

    def unregister_group(self, group: str) -> None:
        """Forget every filter of ``group``."""
        for key in [key for key in self._entries if key[0] == group]:
            del self._entries[key]

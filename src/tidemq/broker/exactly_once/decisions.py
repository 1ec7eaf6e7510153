"""Which exactly-once batches this broker decided to commit, kept in a small durable table.

A *decision* says: batch ``batchId`` of Spark query ``queryId`` commits, with exactly the half
messages of the listed writers (one writer = one execution of one Spark task). It is written
to disk before any of those halves is committed (exactly_once.py), so after a crash in the
middle of committing, the broker knows what to finish, and a replayed commit of the same
batch (a driver restarted after the broker committed but before Spark recorded it) is
recognised and commits nothing twice.

File ``<storePathRootDir>/config/eosCommits.json`` (tidemq's own), saved atomically with a
``.bak`` copy by ``ConfigFile``::

    {"queries": {
      "<queryId>": {"producerGroup": "tidemq_spark_writer",
                    "batches": {"7": {"count": 1200, "decidedMs": 1764000000000,
                                      "applied": false,
                                      "writers": {"<writerId>": [[1042, 256], [1300, 44]]}}}}}}

- ``count``: half messages the decision commits (the sum over its writers);
- ``writers``: writer id -> ranges ``[first half-queue offset, count]`` of its halves. Once
  every half is committed (``applied``) the ranges are emptied: nothing needs them again,
  and the file stays small;
- ``applied``: false while some half of the decision may still wait for its commit. It is
  set in memory when the commit finished and written with the next save (lazily: a crash
  before that only makes the restart look at ranges whose halves all ended already).

Bounds: the last DECIDED_BATCHES_PER_QUERY_MAX applied batches of a query and
QUERIES_MAX queries (the least recently decided go first) are kept. A decision not yet
applied is never dropped. Spark replays only the last planned batch of a query, so a short
memory per query is enough.

Ownership: the broker's event loop; ``snapshot`` is taken there, ``write`` may run in a
worker thread with its bytes (one at a time: exactly_once.py holds a lock around it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tidemq.protocol import jsonx
from tidemq.protocol.jsonx import JsonShapeError
from tidemq.store.config_file import ConfigFile

EOS_COMMITS_FILE_NAME = "eosCommits.json"

# Applied decisions kept per query. Spark re-runs only the last planned batch after a
# restart; 32 leaves room for several sinks of one query sharing a checkpoint's batch ids.
DECIDED_BATCHES_PER_QUERY_MAX = 32
# Queries remembered (the least recently decided are forgotten first): a broker serving
# more exactly-once streaming queries than this at once would forget a live query's last
# batch. Each costs about a kilobyte of file.
QUERIES_MAX = 1024

Range = tuple[int, int]  # (first half-queue offset, count)


@dataclass(slots=True)
class BatchDecision:
    """One decided batch (module docstring)."""

    query_id: str
    batch_id: int
    producer_group: str
    count: int
    decided_ms: int
    writers: dict[str, list[Range]] = field(default_factory=dict)
    applied: bool = False


@dataclass(frozen=True, slots=True)
class DecisionSnapshot:
    """File bytes to write, and the table version they hold."""

    version: int
    data: bytes


class EosDecisions:
    """The decisions in memory and their file (module docstring).

    Args:
        path: the table file (need not exist yet).

    Raises:
        ConfigFileCorrupt: the file and its .bak are both unreadable.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file = ConfigFile(path)
        self._queries: dict[str, dict[int, BatchDecision]] = {}
        self._groups: dict[str, str] = {}
        loaded = self._file.load_parsed(_parse)
        for decision in loaded or ():
            self._put(decision)
        self.version = 0  # bumped by every change
        self.written_version = 0  # the version the file holds

    # -- queries ---------------------------------------------------------------------------

    def get(self, query_id: str, batch_id: int) -> BatchDecision | None:
        """The decision of batch ``batch_id`` of ``query_id``, or None."""
        batches = self._queries.get(query_id)
        return None if batches is None else batches.get(batch_id)

    def unapplied(self) -> list[BatchDecision]:
        """Decisions whose halves may not all be committed yet, oldest first."""
        found = [d for d in self._all() if not d.applied]
        return sorted(found, key=lambda d: d.decided_ms)

    def __len__(self) -> int:
        return sum(len(batches) for batches in self._queries.values())

    def _all(self) -> Iterator[BatchDecision]:
        for batches in self._queries.values():
            yield from batches.values()

    # -- changes ---------------------------------------------------------------------------

    def record(self, decision: BatchDecision) -> None:
        """Add a new decision (in memory; ``snapshot`` + ``write`` make it durable)."""
        self._put(decision)
        self._forget_old(decision.query_id)
        self.version += 1

    def forget(self, query_id: str, batch_id: int) -> None:
        """Remove a decision whose write failed (it was never durable)."""
        batches = self._queries.get(query_id)
        if batches is not None and batches.pop(batch_id, None) is not None:
            if not batches:
                del self._queries[query_id]
            self.version += 1

    def mark_applied(self, decision: BatchDecision) -> None:
        """Every half of ``decision`` is committed: drop its ranges (written lazily)."""
        if not decision.applied:
            decision.applied = True
            decision.writers = {writer: [] for writer in decision.writers}
            self.version += 1

    def _put(self, decision: BatchDecision) -> None:
        batches = self._queries.pop(decision.query_id, None) or {}
        batches[decision.batch_id] = decision
        # Re-inserted last: the dict's order is "least recently decided first".
        self._queries[decision.query_id] = batches
        self._groups[decision.query_id] = decision.producer_group

    def _forget_old(self, query_id: str) -> None:
        batches = self._queries[query_id]
        applied = sorted(b for b, d in batches.items() if d.applied)
        for batch_id in applied[: max(0, len(batches) - DECIDED_BATCHES_PER_QUERY_MAX)]:
            del batches[batch_id]
        excess = len(self._queries) - QUERIES_MAX
        for old_query in list(self._queries)[: max(0, excess)]:
            if all(d.applied for d in self._queries[old_query].values()):
                del self._queries[old_query]
                self._groups.pop(old_query, None)

    # -- file ------------------------------------------------------------------------------

    def snapshot(self) -> DecisionSnapshot | None:
        """The bytes to write now, or None when the file already holds this version."""
        if self.version == self.written_version:
            return None
        queries: dict[str, Any] = {}
        for query_id, batches in self._queries.items():
            queries[query_id] = {
                "producerGroup": self._groups.get(query_id, ""),
                "batches": {
                    str(batch_id): {
                        "count": d.count,
                        "decidedMs": d.decided_ms,
                        "applied": d.applied,
                        "writers": {w: [list(r) for r in ranges]
                                    for w, ranges in d.writers.items()},
                    }
                    for batch_id, d in batches.items()
                },
            }
        return DecisionSnapshot(self.version, jsonx.dumps({"queries": queries}))

    def write(self, snapshot: DecisionSnapshot) -> None:
        """Write ``snapshot`` atomically (may run in a worker thread).

        Raises:
            StoreFull, StoreError: the write failed; the file holds the previous version.
        """
        self._file.save(snapshot.data, version=snapshot.version)  # skips an older one
        self.written_version = max(self.written_version, snapshot.version)


def _parse(data: bytes) -> list[BatchDecision]:
    document = jsonx.loads(data)
    queries = document.get("queries") if isinstance(document, dict) else None
    if not isinstance(queries, dict):
        raise JsonShapeError("expected {\"queries\": {queryId: {...}}}")
    decisions = []
    for query_id, query in queries.items():
        if not isinstance(query, dict) or not isinstance(query.get("batches"), dict):
            raise JsonShapeError(f"query {query_id!r}: expected an object with 'batches'")
        group = str(query.get("producerGroup", ""))
        for batch_text, batch in query["batches"].items():
            where = f"query {query_id!r} batch {batch_text!r}"
            if not str(batch_text).lstrip("-").isdigit() or not isinstance(batch, dict):
                raise JsonShapeError(f"{where}: expected a batch id and an object")
            writers = batch.get("writers", {})
            if not isinstance(writers, dict):
                raise JsonShapeError(f"{where}: 'writers' is not an object")
            decisions.append(BatchDecision(
                query_id=str(query_id),
                batch_id=int(batch_text),
                producer_group=group,
                count=_integer(batch.get("count"), where, "count"),
                decided_ms=_integer(batch.get("decidedMs", 0), where, "decidedMs"),
                writers={str(w): _ranges(r, where) for w, r in writers.items()},
                applied=batch.get("applied") is True,
            ))
    return decisions


def _integer(value: Any, where: str, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise JsonShapeError(f"{where}: {name} is {value!r}, expected an integer >= 0")
    return value


def _ranges(value: Any, where: str) -> list[Range]:
    if not isinstance(value, list):
        raise JsonShapeError(f"{where}: writer ranges are not a list")
    ranges = []
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            raise JsonShapeError(f"{where}: range {item!r} is not [first offset, count]")
        ranges.append((_integer(item[0], where, "offset"), _integer(item[1], where, "count")))
    return ranges

"""Consumer groups' committed offsets, kept in memory and persisted to consumerOffset.json.

A consumer commits "the next offset to consume" per (group, topic, queue) with
UPDATE_CONSUMER_OFFSET, or in a pull with the COMMIT_OFFSET flag; a consumer that starts, or
takes a queue over in a rebalance, asks QUERY_CONSUMER_OFFSET where to begin. Commits only
change memory (they arrive thousands of times a second); the broker writes the table to
``<storePathRootDir>/config/consumerOffset.json`` every flushConsumerOffsetInterval (5 s)
when it changed, and at shutdown. A crash therefore loses at most the last few seconds of
commits, and consumers re-read those messages: at-least-once, as in RocketMQ.

File shape (docs/protocol.md §10.6, via ``ConsumerOffsetTable``):
``{"offsetTable":{"<topic>@<group>":{"<queueId>":<offset>,...},...}}``.

Ownership: mutated on the event-loop thread only. ``snapshot_if_dirty`` is taken there;
``write_snapshot`` may run in a worker thread with those bytes.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from tidemq.protocol import jsonx
from tidemq.store.config_file import ConfigFile
from tidemq.store.config_tables import TOPIC_GROUP_SEPARATOR, ConsumerOffsetTable

log = logging.getLogger("tidemq.broker")

# A slave's own consumer commits not yet seen in its master's table, saved beside RocketMQ's
# offsetTable in consumerOffset.json ({"topic@group": {"queueId": offset}}); RocketMQ's
# readers ignore the field.
LOCAL_COMMITS_FIELD = "tidemqLocalCommits"

# An UPDATE_CONSUMER_OFFSET carrying this ext field set to "true" comes from a slave handing
# back what consumers committed to it while its master was away: the master keeps the larger
# of its offset and this one (a tidemq extension; RocketMQ brokers ignore unknown fields).
KEEP_LARGER_EXT_FIELD = "tidemqKeepLarger"


@dataclass(frozen=True, slots=True)
class OffsetSnapshot:
    """The offsets table as file bytes, and the table version they hold."""

    version: int
    data: bytes


class ConsumerOffsetManager:
    """Committed offsets by (group, topic, queue id), persisted on demand.

    Args:
        path: the consumerOffset.json file (need not exist yet).

    Raises:
        ConfigFileCorrupt: the file and its .bak are both unreadable.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, remember_local_commits: bool = False
    ) -> None:
        self._file = ConfigFile(path)
        loaded = self._file.load_parsed(_parse_with_local_commits)
        self._table, local_commits = loaded if loaded is not None else (ConsumerOffsetTable(),
                                                                         {})
        self._persisted_version = self._table.data_version.counter
        # On a slave: offsets committed to this broker itself (consumers whose master was
        # gone), kept until the master's table has them (``merge_from_master``). Saved in
        # the same file under LOCAL_COMMITS_FIELD, so a slave restarted while its master is
        # away still hands them back.
        self._remember_local_commits = remember_local_commits
        self._local_commits: dict[tuple[str, str, int], int] = (
            local_commits if remember_local_commits else {})

    def set_remember_local_commits(self, remember: bool) -> None:
        """Start (a broker that became slave) or stop (one that became master: its own table
        is the one that counts, and already holds every commit) remembering local commits."""
        self._remember_local_commits = remember
        if not remember and self._local_commits:
            self._local_commits = {}
            self._table.data_version.bump()  # saved again without them

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record ``group``'s next offset to consume in ``topic`` queue ``queue_id``.

        Negative offsets are ignored: clients send -1 for "nothing consumed yet", and storing
        it would only hide the queue's real start from the next QUERY_CONSUMER_OFFSET.
        """
        if offset < 0:
            return
        self._table.commit(group, topic, queue_id, offset)
        if self._remember_local_commits:
            self._local_commits[(group, topic, queue_id)] = offset

    def commit_offset_max(self, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """Record ``offset`` unless the committed one is already at or past it (a slave
        handing back what consumers committed to it while this master was away).

        Returns:
            True when the offset moved forward.
        """
        current = self._table.query(group, topic, queue_id)
        if offset < 0 or (current is not None and current >= offset):
            return False
        self._table.commit(group, topic, queue_id, offset)
        return True

    def merge_from_master(self, master: ConsumerOffsetTable) -> list[tuple[str, str, int, int]]:
        """Take the master's offsets (a slave's periodic sync), keeping the local commits the
        master does not have yet.

        The table becomes the master's, except that a queue committed here to an offset
        beyond the master's keeps it. Local commits the master has reached are forgotten.

        Returns:
            ``(group, topic, queue id, offset)`` of the local commits still ahead of the
            master: the slave hands these to the master (``commit_offset_max`` there).
        """
        ahead: list[tuple[str, str, int, int]] = []
        forgotten = False
        for (group, topic, queue_id), offset in list(self._local_commits.items()):
            mastered = master.query(group, topic, queue_id)
            if mastered is not None and mastered >= offset:
                del self._local_commits[(group, topic, queue_id)]
                forgotten = True
                continue
            ahead.append((group, topic, queue_id, offset))
        merged = ConsumerOffsetTable.from_json(master.to_json())
        for group, topic, queue_id, offset in ahead:
            merged.commit(group, topic, queue_id, offset)
        if merged.to_json() != self._table.to_json():
            merged.data_version.counter = self._table.data_version.counter + 1
            self._table = merged
        elif forgotten:
            # Written again without the forgotten ones: a restart must not hand back an
            # offset the master has since moved past (or been reset from).
            self._table.data_version.bump()
        return ahead

    @property
    def local_commits(self) -> dict[tuple[str, str, int], int]:
        """The offsets committed to this slave and not yet seen in its master's table."""
        return dict(self._local_commits)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """The committed offset, or None when ``group`` never committed one for the queue."""
        return self._table.query(group, topic, queue_id)

    def all_offsets(self) -> list[tuple[tuple[str, str], dict[int, int]]]:
        """Every ((topic, group), queue id -> offset) committed (the metrics' lag)."""
        return self._table.items()

    def offsets_of_group(self, group: str) -> dict[str, dict[int, int]]:
        """topic -> queue id -> offset for every topic ``group`` committed in."""
        return self._table.offsets_of_group(group)

    def offsets_of(self, group: str, topic: str) -> dict[int, int]:
        """queue id -> offset of ``group`` in ``topic`` (empty when none)."""
        return self._table.offsets_of(group, topic)

    def topics_of_group(self, group: str) -> set[str]:
        """Topics ``group`` committed offsets in (GET_CONSUME_STATS without a topic)."""
        return self._table.topics_of_group(group)

    def groups_of_topic(self, topic: str) -> set[str]:
        """Groups with committed offsets in ``topic`` (QUERY_TOPIC_CONSUME_BY_WHO)."""
        return self._table.groups_of_topic(topic)

    def remove_topic(self, topic: str) -> int:
        """Forget every group's offsets in a deleted topic; returns the entries removed."""
        removed = self._table.remove_topic(topic)
        if removed:
            log.info("removed the consumer offsets of %d groups in deleted topic %s",
                     removed, topic)
        return removed

    def remove_group(self, group: str) -> int:
        """Forget every offset of a deleted group; returns the topic entries removed."""
        return self._table.remove_group(group)

    def to_json(self) -> bytes:
        """The table as compact JSON: the GET_ALL_CONSUMER_OFFSET body."""
        return self._table.to_json()

    @property
    def dirty(self) -> bool:
        """True when offsets changed since the last successful write."""
        return self._table.data_version.counter != self._persisted_version

    def snapshot_if_dirty(self) -> OffsetSnapshot | None:
        """The file bytes to write now, or None when nothing changed since the last write."""
        if not self.dirty:
            return None
        if not self._local_commits:
            return OffsetSnapshot(self._table.data_version.counter,
                                  self._table.to_json(pretty=True))
        document = self._table.to_json_object()
        local: dict[str, dict[str, int]] = {}
        for (group, topic, queue_id), offset in sorted(self._local_commits.items()):
            local.setdefault(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {})[str(queue_id)] = offset
        document[LOCAL_COMMITS_FIELD] = local
        return OffsetSnapshot(self._table.data_version.counter,
                              jsonx.dumps(document, pretty=True))

    def write_snapshot(self, snapshot: OffsetSnapshot) -> None:
        """Write a snapshot atomically (may run in a worker thread).

        Raises:
            StoreFull, StoreError: the write failed; the table stays dirty for the next try.
        """
        # A periodic save still running when shutdown saves a newer snapshot must not put
        # older offsets back: the file skips a save older than what it holds.
        if self._file.save(snapshot.data, version=snapshot.version):
            self._persisted_version = snapshot.version

    def persist(self) -> None:
        """Write the table now if it changed (on the calling thread)."""
        snapshot = self.snapshot_if_dirty()
        if snapshot is not None:
            self.write_snapshot(snapshot)


def _parse_with_local_commits(
    data: bytes,
) -> tuple[ConsumerOffsetTable, dict[tuple[str, str, int], int]]:
    """consumerOffset.json: RocketMQ's table and a slave's local commits (when present).

    Raises:
        JsonShapeError / JsonDecodeError: the bytes are not such a file.
    """
    document = jsonx.loads(data)
    table = ConsumerOffsetTable.from_json_object(document)
    local: dict[tuple[str, str, int], int] = {}
    extra = document.get(LOCAL_COMMITS_FIELD) if isinstance(document, dict) else None
    if extra is not None:
        checked = ConsumerOffsetTable.from_json_object({"offsetTable": extra})  # validates
        for key, queues in checked.to_json_object()["offsetTable"].items():
            topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
            for queue_id, offset in queues.items():
                local[(group, topic, int(queue_id))] = offset
    return table, local

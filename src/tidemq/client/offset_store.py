"""Where a push consumer keeps its consumed offsets: on the brokers, or in a local file.

A clustering group shares its queues, so their offsets live on the brokers
(``RemoteOffsetStore``: QUERY_CONSUMER_OFFSET to read, UPDATE_CONSUMER_OFFSET to write); any
member that takes a queue over continues where the last one stopped. A broadcasting consumer
reads every queue on its own, so its offsets are its own business and live in a local file
(``LocalFileOffsetStore``), as RocketMQ's LocalFileOffsetStore does.

Both keep the offsets in memory (``update``/``read``, cheap, called per consumed batch) and
write them out in bulk (``persist_all``: every 5 s, at shutdown, and ``persist`` for one
queue when a rebalance takes it away).

The local file, ``<dir>/<group>/<instance>/offsets.json``, is RocketMQ's OffsetSerializeWrapper
JSON: ``{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:42, ...}}`` (queue objects
as keys, fastjson's form). It is replaced atomically (write a temporary file, fsync, rename),
so a crash leaves the old or the new table, never a torn one; the previous table is kept as
``offsets.json.bak`` and read when the main file is unreadable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from tidemq.client import broker_api
from tidemq.client.admin import message_queue_from_key
from tidemq.client.instance import ClientInstance
from tidemq.client.message import MessageQueue
from tidemq.client.read_routing import ReadRouting
from tidemq.errors import ClientError, RemoteProtocolError
from tidemq.protocol import jsonx
from tidemq.remoting.errors import RemotingError

log = logging.getLogger("tidemq.client")

# RocketMQ keeps broadcasting offsets under ~/.rocketmq_offsets; ours go next to it.
LOCAL_OFFSET_STORE_DIR_DEFAULT = "~/.tidemq_offsets"
LOCAL_OFFSET_STORE_DIR_ENV = "TIDEMQ_OFFSET_STORE_DIR"
LOCAL_OFFSET_FILE_NAME = "offsets.json"


class OffsetStore(Protocol):
    """What the push consumer needs of an offset store."""

    async def load(self) -> None:
        """Read what is stored up front (the local file); nothing for the broker store."""

    def update(self, queue: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        """Remember ``offset`` (the next offset to consume) for ``queue`` in memory."""

    def read(self, queue: MessageQueue) -> int | None:
        """The offset remembered in memory for ``queue``, or None."""

    async def read_stored(self, queue: MessageQueue) -> int | None:
        """The offset stored (broker or file) for ``queue``; None when none is.

        Raises:
            RemotingError / ClientError: the store could not be asked (try again later).
        """

    async def persist(self, queue: MessageQueue) -> None:
        """Write ``queue``'s remembered offset out now."""

    async def persist_all(self, queues: Iterable[MessageQueue]) -> None:
        """Write the remembered offsets of ``queues`` out; failures are logged."""

    def remove(self, queue: MessageQueue) -> None:
        """Forget ``queue`` (it is no longer ours)."""


class RemoteOffsetStore:
    """Offsets of a clustering group, kept by the brokers.

    Offsets are read from and committed to the queue's master; while the master does not
    answer, to a slave of its group (read_routing.py), which keeps them and hands them back
    to the master when it returns (the broker's slave_sync.py).

    Args:
        instance: the consumer's client instance (routes, connections).
        group: the consumer group.
    """

    def __init__(self, instance: ClientInstance, group: str) -> None:
        self._instance = instance
        self._group = group
        self._routing = ReadRouting(instance)
        self._offsets: dict[MessageQueue, int] = {}
        self._sent: dict[MessageQueue, int] = {}

    async def load(self) -> None:
        """Nothing to load: offsets are read per queue when it is assigned."""

    def update(self, queue: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        """Remember ``offset`` for ``queue``; with ``increase_only`` never move it back."""
        current = self._offsets.get(queue)
        if current is None or not increase_only or offset > current:
            self._offsets[queue] = offset

    def read(self, queue: MessageQueue) -> int | None:
        """The offset remembered for ``queue``, or None."""
        return self._offsets.get(queue)

    async def read_stored(self, queue: MessageQueue) -> int | None:
        """QUERY_CONSUMER_OFFSET at the queue's master; None when the broker has none.

        Any broker error counts as "none", as in RocketMQ; transport errors raise.

        Raises:
            RemotingError, NoRouteError: the broker could not be asked.
        """
        try:
            offset = await self._routing.call(
                queue, lambda _, address: broker_api.query_consumer_offset(
                    self._instance, address, self._group, queue))
        except RemotingError:
            raise
        except ClientError as e:
            log.info("consumer %s: no committed offset for %s (%s)", self._group, queue, e)
            return None
        if offset is not None:
            self._sent[queue] = offset
        return offset

    async def persist(self, queue: MessageQueue) -> None:
        """UPDATE_CONSUMER_OFFSET for ``queue`` now (if its offset changed since last sent).

        Raises:
            RemotingError, ClientError: the broker could not be told.
        """
        offset = self._offsets.get(queue)
        if offset is None or offset < 0 or self._sent.get(queue) == offset:
            return
        await self._routing.call(queue, lambda _, address: broker_api.update_consumer_offset(
            self._instance, address, self._group, queue, offset))
        self._sent[queue] = offset

    async def persist_all(self, queues: Iterable[MessageQueue]) -> None:
        """Send every changed offset of ``queues`` (concurrently); failures are logged."""
        todo = list(queues)
        results = await asyncio.gather(*(self.persist(q) for q in todo), return_exceptions=True)
        for queue, result in zip(todo, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                log.warning("consumer %s: offset commit of %s failed: %s", self._group, queue,
                            result)

    def remove(self, queue: MessageQueue) -> None:
        """Forget ``queue``."""
        self._offsets.pop(queue, None)
        self._sent.pop(queue, None)


def local_offset_file(group: str, instance_key: str, directory: str | None = None) -> Path:
    """Where a broadcasting consumer's offsets live: ``<dir>/<group>/<instance>/offsets.json``.

    ``directory`` defaults to $TIDEMQ_OFFSET_STORE_DIR, else ``~/.tidemq_offsets``.
    """
    root = directory or os.environ.get(LOCAL_OFFSET_STORE_DIR_ENV) or \
        LOCAL_OFFSET_STORE_DIR_DEFAULT
    safe_instance = "".join(c if c.isalnum() or c in "-_.#@" else "_" for c in instance_key)
    return Path(root).expanduser() / group / safe_instance / LOCAL_OFFSET_FILE_NAME


class LocalFileOffsetStore:
    """Offsets of a broadcasting consumer, kept in a local JSON file (module docstring).

    Args:
        path: the offsets file (``local_offset_file``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offsets: dict[MessageQueue, int] = {}
        self._stored: dict[MessageQueue, int] = {}

    async def load(self) -> None:
        """Read the file (or its ``.bak`` when the file is unreadable); none is fine.

        Raises:
            RemoteProtocolError: both the file and its backup exist and are unreadable.
        """
        self._stored = await asyncio.to_thread(self._read_file)
        self._offsets = dict(self._stored)

    def _read_file(self) -> dict[MessageQueue, int]:
        problems: list[str] = []
        for candidate in (self.path, self.path.with_name(self.path.name + ".bak")):
            try:
                text = candidate.read_bytes()
            except FileNotFoundError:
                continue
            try:
                return _parse_offset_table(text)
            except (RemoteProtocolError, jsonx.JsonDecodeError, TypeError, ValueError) as e:
                problems.append(f"{candidate}: {e}")
                log.warning("offsets file %s is unreadable (%s); trying its backup", candidate,
                            e)
        if problems:
            raise RemoteProtocolError(
                "no readable offsets file: " + "; ".join(problems) + "; delete them to start "
                "over (the consumer then starts where consume_from says)"
            )
        return {}

    def update(self, queue: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        """Remember ``offset`` for ``queue``; with ``increase_only`` never move it back."""
        current = self._offsets.get(queue)
        if current is None or not increase_only or offset > current:
            self._offsets[queue] = offset

    def read(self, queue: MessageQueue) -> int | None:
        """The offset remembered for ``queue``, or None."""
        return self._offsets.get(queue)

    async def read_stored(self, queue: MessageQueue) -> int | None:
        """The offset the file held for ``queue`` when loaded (or last written); None if none."""
        return self._stored.get(queue)

    async def persist(self, queue: MessageQueue) -> None:
        """Write the whole table (one file holds every queue)."""
        await self.persist_all([queue])

    async def persist_all(self, queues: Iterable[MessageQueue]) -> None:
        """Write the table when anything changed; failures are logged."""
        del queues  # the file holds every queue's offset, assigned or not
        table = {q: o for q, o in self._offsets.items() if o >= 0}
        if table == self._stored:
            return
        try:
            await asyncio.to_thread(self._write_file, table)
        except OSError as e:
            log.warning("writing offsets file %s failed: %s (check the directory's space and "
                        "permissions, or set offset_store_dir)", self.path, e)
            return
        self._stored = table

    def _write_file(self, table: dict[MessageQueue, int]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = jsonx.dumps({"offsetTable": {queue: offset for queue, offset in
                                            sorted(table.items())}})
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if self.path.exists():
            with contextlib.suppress(OSError):
                os.replace(self.path, self.path.with_name(self.path.name + ".bak"))
        os.replace(temporary, self.path)

    def remove(self, queue: MessageQueue) -> None:
        """Keep the offset: a broadcasting consumer that gets the queue back resumes there."""


def _parse_offset_table(text: bytes) -> dict[MessageQueue, int]:
    document = jsonx.loads(text)
    if not isinstance(document, dict):
        raise RemoteProtocolError("offsets file is not a JSON object")
    table = document.get("offsetTable") or {}
    if not isinstance(table, dict):
        raise RemoteProtocolError("offsetTable is not an object")
    return {message_queue_from_key(key): int(value) for key, value in table.items()}

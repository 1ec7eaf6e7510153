"""Rows to SEND_BATCH_MESSAGE bodies and the queue each batch goes to, without a Message per row.

Batch body (docs/protocol.md §6.5; ``tidemq.protocol.message.encode_batch_body`` is the general
encoder), per message, big-endian::

    int32 TOTALSIZE   22 + body length + properties length
    int32 MAGICCODE   0
    int32 BODYCRC     0 (the broker computes it)
    int32 FLAG        0
    int32 BODY LENGTH
    bytes BODY
    int16 PROPERTIES LENGTH
    bytes PROPERTIES  KEYS / TAGS / user properties (UTF-8), often empty

No UNIQ_KEY is written: the broker gives every message one (as it does for any client that
leaves it out), which saves the task a 42-byte string per row.

Which queue a row goes to:

- a row with a ``queueId`` or ``shardingKey`` column: that queue (``sink_rows``);
- otherwise, *at least once*: consecutive rows in chunks, the chunks round robin over the
  topic's queues;
- otherwise, *exactly once*: block ``row_index // ROUTING_BLOCK_ROWS`` of the task's rows goes
  to ``queues[hash(partition, block) % len(queues)]`` over the topic's queues sorted by
  (broker name, queue id). A replay of the task sends the same rows to the same queues,
  which the exactly-once commit relies on across brokers (pyspark_tidemq.exactly_once).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from pyspark_tidemq.sink_rows import Route, SinkColumns
from tidemq.client.message import MessageQueue

ENTRY_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODY LENGTH
ENTRY_FIXED_SIZE = ENTRY_HEAD.size + 2  # = 22, with the properties length
_NO_PROPERTIES = b"\x00\x00"
_PROPERTIES_LENGTH = struct.Struct(">h")

# Rows routed together by exactly-once routing: a fixed number (not sendBatchSize, which a
# user may change between a run and its replay) so that a replay routes rows the same way.
ROUTING_BLOCK_ROWS = 256
# Request body bytes at most: under the broker's 4 MiB maxMessageSize, with room for the
# request's headers.
REQUEST_BYTES_MAX = 4 * 1024 * 1024 - 64 * 1024


@dataclass(frozen=True, slots=True)
class Chunk:
    """One batch request: ``count`` messages of ``topic`` encoded in ``body``, for ``queue``
    (or any queue when None); ``ordered``: a later chunk for the same queue must wait for it
    (rows routed by sharding key or queue id keep their order)."""

    topic: str
    queue: MessageQueue | None
    body: bytes
    count: int
    ordered: bool


def encode_entries(bodies: Sequence[bytes], properties: Sequence[bytes] | None,
                   rows: Sequence[int]) -> bytes:
    """The batch body of ``rows`` (indices into ``bodies`` / ``properties``)."""
    parts: list[bytes] = []
    extend = parts.extend
    pack = ENTRY_HEAD.pack
    if properties is None:
        no_properties = _NO_PROPERTIES
        for row in rows:
            body = bodies[row]
            length = len(body)
            extend((pack(22 + length, 0, 0, 0, length), body, no_properties))
    else:
        pack_length = _PROPERTIES_LENGTH.pack
        for row in rows:
            body = bodies[row]
            text = properties[row]
            length = len(body)
            extend((pack(22 + length + len(text), 0, 0, 0, length), body,
                    pack_length(len(text)), text))
    return b"".join(parts)


def _bounded(bodies: Sequence[bytes], properties: Sequence[bytes] | None,
             rows: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    """``rows`` cut into runs of at most ``size`` rows and REQUEST_BYTES_MAX bytes."""
    start = 0
    total = len(rows)
    while start < total:
        end = min(start + size, total)
        run = rows[start:end]
        length = sum(len(bodies[r]) for r in run) + ENTRY_FIXED_SIZE * len(run)
        if properties is not None:
            length += sum(len(properties[r]) for r in run)
        while length > REQUEST_BYTES_MAX and len(run) > 1:
            run = run[: max(1, len(run) // 2)]
            length = sum(len(bodies[r]) + ENTRY_FIXED_SIZE for r in run) + (
                sum(len(properties[r]) for r in run) if properties is not None else 0)
        yield run
        start += len(run)


def exactly_once_queue(queues: Sequence[MessageQueue], partition: int,
                       row_index: int) -> MessageQueue:
    """The queue exactly-once routing gives row ``row_index`` of task ``partition``."""
    block = row_index // ROUTING_BLOCK_ROWS
    key = zlib.crc32(f"{partition}:{block}".encode("ascii"))
    return queues[key % len(queues)]


def chunks(columns: SinkColumns, first_row_index: int, topic_option: str | None,
           send_batch_size: int, queue_for_route: Callable[[str, Route], MessageQueue],
           queue_for_block: Callable[[str, int], MessageQueue | None]) -> Iterator[Chunk]:
    """The batch requests for one Arrow batch of rows.

    Args:
        columns: the rows (``sink_rows.batch_columns``).
        first_row_index: the task's row index of the batch's first row.
        topic_option: the ``topic`` option, or None (each row names its topic).
        send_batch_size: messages per request at most.
        queue_for_route: the queue of a routed row (sharding key or queue id).
        queue_for_block: ``(topic, row index)`` -> the queue of an unrouted row, or None for
            "any queue" (at least once: the sender goes round robin per chunk).
    """
    bodies, properties = columns.bodies, columns.properties
    if columns.topics is None and columns.routes is None:
        groups = _group_blocks(len(bodies), first_row_index, topic_option, queue_for_block)
    else:
        groups = _group_rows(columns, first_row_index, topic_option, queue_for_route,
                             queue_for_block)
    for (topic, queue, ordered), rows in groups.items():
        for run in _bounded(bodies, properties, rows, send_batch_size):
            yield Chunk(topic, queue, encode_entries(bodies, properties, run), len(run),
                        ordered)


_Groups = dict[tuple[str, MessageQueue | None, bool], list[int]]


def _group_blocks(count: int, first_row_index: int, topic: str | None,
                  queue_for_block: Callable[[str, int], MessageQueue | None]) -> _Groups:
    # The common case (one topic, no routing column): a routing block at a time.
    assert topic is not None
    groups: _Groups = {}
    start = 0
    while start < count:
        absolute = first_row_index + start
        end = min(count, start + ROUTING_BLOCK_ROWS - absolute % ROUTING_BLOCK_ROWS)
        groups.setdefault((topic, queue_for_block(topic, absolute), False), []).extend(
            range(start, end))
        start = end
    return groups


def _group_rows(columns: SinkColumns, first_row_index: int, topic_option: str | None,
                queue_for_route: Callable[[str, Route], MessageQueue],
                queue_for_block: Callable[[str, int], MessageQueue | None]) -> _Groups:
    topics, routes = columns.topics, columns.routes
    groups: _Groups = {}
    for row in range(len(columns.bodies)):
        topic = topic_option if topics is None else topics[row]
        route = routes[row] if routes is not None else None
        if route is not None:
            key = (topic, queue_for_route(topic, route), True)
        else:
            key = (topic, queue_for_block(topic, first_row_index + row), False)
        group = groups.get(key)
        if group is None:
            groups[key] = [row]
        else:
            group.append(row)
    return groups

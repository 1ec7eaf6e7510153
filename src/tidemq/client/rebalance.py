"""Sharing a topic's queues among the members of a consumer group (docs/protocol.md §12).

Every member computes the same answer on its own from the same inputs: all queues sorted
(topic, broker name, queue id) and all member client ids sorted. Java consumers in the same
group use the same rules, so a mixed group of Java and Python members shares the queues
without overlap as long as every member uses the same strategy. Three strategies, by their
RocketMQ names:

- ``AVG`` (AllocateMessageQueueAveragely, the default): each member gets one contiguous
  block; the first ``len(queues) % len(members)`` members get one queue more. With more
  members than queues the last members get nothing.
- ``AVG_BY_CIRCLE`` (AllocateMessageQueueAveragelyByCircle): queue ``j`` goes to member
  ``j % len(members)``, dealing the queues out like cards, so one broker's queues spread over
  all members.
- ``CONSISTENT_HASH`` (AllocateMessageQueueConsistentHash): members are put on a hash ring
  with 10 virtual nodes each; a queue goes to the first node at or after its own hash. A
  member joining or leaving moves only the queues next to its nodes, not everyone's. The
  hash is the first 4 bytes of the MD5 of a key, big-endian and unsigned; a virtual node's
  key is ``<client id>-<index>`` and a queue's key is Java's ``MessageQueue.toString()``
  (``MessageQueue [topic=T, brokerName=b, queueId=0]``), so Java members agree with ours.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Sequence
from typing import TypeVar

from tidemq.client.message import MessageQueue

Q = TypeVar("Q")

AllocationStrategy = Callable[[Sequence[MessageQueue], Sequence[str], str], list[MessageQueue]]

# RocketMQ's default virtualNodeCnt: enough points per member that shares come out roughly
# even for a handful of members, few enough that building the ring costs nothing.
CONSISTENT_HASH_VIRTUAL_NODES = 10


def allocate_averagely(queues: Sequence[Q], members: Sequence[str], member: str) -> list[Q]:
    """The queues ``member`` should consume under ``AVG``.

    Args:
        queues: every queue of the topic (sorted here; any order may be given).
        members: every member client id of the group (sorted here).
        member: this member's client id.

    Returns:
        The member's block of queues, possibly empty (also when ``member`` is not listed).
    """
    all_queues = sorted(queues)  # type: ignore[type-var]
    all_members = sorted(members)
    if not all_queues or member not in all_members:
        return []
    count, member_count = len(all_queues), len(all_members)
    index = all_members.index(member)
    remainder = count % member_count
    if count <= member_count:
        size = 1
    elif remainder > 0 and index < remainder:
        size = count // member_count + 1
    else:
        size = count // member_count
    start = index * size if remainder > 0 and index < remainder else index * size + remainder
    take = min(size, count - start)
    return [all_queues[(start + k) % count] for k in range(max(0, take))]


def allocate_averagely_by_circle(
    queues: Sequence[Q], members: Sequence[str], member: str
) -> list[Q]:
    """The queues ``member`` should consume under ``AVG_BY_CIRCLE``: every ``len(members)``-th
    queue of the sorted list, starting at the member's position.

    Returns:
        The member's queues, possibly empty (also when ``member`` is not listed).
    """
    all_members = sorted(members)
    if member not in all_members:
        return []
    all_queues = sorted(queues)  # type: ignore[type-var]
    return all_queues[all_members.index(member)::len(all_members)]


def java_queue_key(queue: MessageQueue) -> str:
    """Java's ``MessageQueue.toString()``, the key a queue is hashed by on the ring."""
    return f"MessageQueue [topic={queue.topic}, brokerName={queue.broker_name}, " \
           f"queueId={queue.queue_id}]"


def ring_hash(key: str) -> int:
    """The ring position of ``key``: the first 4 bytes of its MD5 as an unsigned int."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")


def allocate_consistent_hash(
    queues: Sequence[MessageQueue],
    members: Sequence[str],
    member: str,
    virtual_nodes: int = CONSISTENT_HASH_VIRTUAL_NODES,
) -> list[MessageQueue]:
    """The queues ``member`` should consume under ``CONSISTENT_HASH`` (see the module docs).

    Two virtual nodes on the same ring position keep the later one, members taken in sorted
    order, as Java's TreeMap-based ring does.

    Returns:
        The member's queues in sorted order, possibly empty.

    Raises:
        ValueError: ``virtual_nodes`` < 1.
    """
    if virtual_nodes < 1:
        raise ValueError(f"virtual_nodes={virtual_nodes}: a member needs at least one node")
    all_members = sorted(members)
    if member not in all_members:
        return []
    ring: dict[int, str] = {}
    for client_id in all_members:
        for index in range(virtual_nodes):
            ring[ring_hash(f"{client_id}-{index}")] = client_id
    positions = sorted(ring)
    mine: list[MessageQueue] = []
    for queue in sorted(queues):
        at = bisect.bisect_left(positions, ring_hash(java_queue_key(queue)))
        owner = ring[positions[at if at < len(positions) else 0]]
        if owner == member:
            mine.append(queue)
    return mine


ALLOCATION_STRATEGIES: dict[str, AllocationStrategy] = {
    "AVG": allocate_averagely,
    "AVG_BY_CIRCLE": allocate_averagely_by_circle,
    "CONSISTENT_HASH": allocate_consistent_hash,
}
_ALIASES = {
    "AVERAGELY": "AVG",
    "AVERAGELY_BY_CIRCLE": "AVG_BY_CIRCLE",
    "BY_CIRCLE": "AVG_BY_CIRCLE",
    "CIRCLE": "AVG_BY_CIRCLE",
    "HASH": "CONSISTENT_HASH",
}


def allocation_strategy(strategy: str | AllocationStrategy) -> AllocationStrategy:
    """A strategy by name (``AVG``, ``AVG_BY_CIRCLE``, ``CONSISTENT_HASH``; also
    ``averagely``, ``averagely-by-circle``, ``consistent-hash``) or a callable
    ``(queues, members, member) -> queues`` given as is.

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if callable(strategy):
        return strategy
    name = str(strategy).strip().upper().replace("-", "_")
    name = _ALIASES.get(name, name)
    found = ALLOCATION_STRATEGIES.get(name)
    if found is None:
        raise ValueError(
            f"allocation strategy {strategy!r} is unknown; use one of "
            f"{', '.join(ALLOCATION_STRATEGIES)} (or a callable (queues, members, member))"
        )
    return found

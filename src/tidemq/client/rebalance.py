"""Sharing a topic's queues among the members of a consumer group (protocol-notes §12).

Every member computes the same answer on its own from the same inputs: all queues sorted
(topic, broker name, queue id) and all member client ids sorted. RocketMQ's default strategy,
AllocateMessageQueueAveragely, gives each member one contiguous block; the first
``len(queues) % len(members)`` members get one queue more. With more members than queues the
last members get nothing. Java consumers in the same group use the same rule, so a mixed group
of Java and Python members shares the queues without overlap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

Q = TypeVar("Q")


def allocate_averagely(queues: Sequence[Q], members: Sequence[str], member: str) -> list[Q]:
    """The queues ``member`` should consume.

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

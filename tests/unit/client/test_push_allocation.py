"""Queue allocation strategies: averagely, averagely by circle, consistent hash."""

from __future__ import annotations

import hashlib

import pytest

from tidemq.client.message import MessageQueue
from tidemq.client.rebalance import (
    allocate_averagely,
    allocate_averagely_by_circle,
    allocate_consistent_hash,
    allocation_strategy,
    java_queue_key,
    ring_hash,
)

STRATEGIES = [allocate_averagely, allocate_averagely_by_circle, allocate_consistent_hash]


def queues(count: int, brokers: tuple[str, ...] = ("broker-a", "broker-b")) -> list[MessageQueue]:
    return [MessageQueue("T", b, i) for b in brokers for i in range(count // len(brokers))]


def members(count: int) -> list[str]:
    return [f"10.0.0.{i}@{1000 + i}#{i * 7919}" for i in range(count)]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("queue_count", "member_count"), [(8, 3), (8, 8), (4, 6), (16, 5)])
def test_every_queue_goes_to_exactly_one_member(strategy, queue_count, member_count):
    all_queues, all_members = queues(queue_count), members(member_count)
    shares = [strategy(all_queues, all_members, m) for m in all_members]
    owned = [q for share in shares for q in share]
    assert sorted(owned) == sorted(all_queues)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_members_agree_whatever_order_they_list_queues_and_members_in(strategy):
    all_queues, all_members = queues(8), members(3)
    forward = [strategy(all_queues, all_members, m) for m in all_members]
    backward = [strategy(list(reversed(all_queues)), list(reversed(all_members)), m)
                for m in all_members]
    assert forward == backward


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_member_not_in_the_group_gets_nothing(strategy):
    assert strategy(queues(8), members(3), "someone-else") == []


def test_averagely_gives_contiguous_blocks_first_members_one_more():
    all_queues, all_members = queues(8), sorted(members(3))
    shares = [[(q.broker_name, q.queue_id) for q in allocate_averagely(all_queues, all_members,
                                                                          m)]
              for m in all_members]
    assert shares == [
        [("broker-a", 0), ("broker-a", 1), ("broker-a", 2)],
        [("broker-a", 3), ("broker-b", 0), ("broker-b", 1)],
        [("broker-b", 2), ("broker-b", 3)],
    ]


def test_by_circle_deals_queues_like_cards():
    all_queues, all_members = queues(8), sorted(members(3))
    shares = [[(q.broker_name, q.queue_id) for q in
               allocate_averagely_by_circle(all_queues, all_members, m)] for m in all_members]
    assert shares == [
        [("broker-a", 0), ("broker-a", 3), ("broker-b", 2)],
        [("broker-a", 1), ("broker-b", 0), ("broker-b", 3)],
        [("broker-a", 2), ("broker-b", 1)],
    ]


def test_consistent_hash_keys_and_hash_are_javas():
    queue = MessageQueue("Orders", "broker-a", 3)
    assert java_queue_key(queue) == "MessageQueue [topic=Orders, brokerName=broker-a, queueId=3]"
    digest = hashlib.md5(b"10.0.0.1@42-7").digest()
    assert ring_hash("10.0.0.1@42-7") == (digest[0] << 24 | digest[1] << 16 | digest[2] << 8
                                          | digest[3])


def test_consistent_hash_gives_a_queue_to_the_next_node_on_the_ring():
    all_queues, all_members = queues(16), members(4)
    nodes = {ring_hash(f"{m}-{i}"): m for m in sorted(all_members) for i in range(10)}

    def owner(queue: MessageQueue) -> str:
        point = ring_hash(java_queue_key(queue))
        # the node with the smallest clockwise distance from the queue's point
        return nodes[min(nodes, key=lambda node: (node - point) % 2**32)]

    for member in all_members:
        expected = [q for q in sorted(all_queues) if owner(q) == member]
        assert allocate_consistent_hash(all_queues, all_members, member) == expected


def test_consistent_hash_moves_only_the_queues_of_a_member_that_left():
    all_queues, before = queues(64), members(5)
    leaving, after = before[2], before[:2] + before[3:]
    old = {m: set(allocate_consistent_hash(all_queues, before, m)) for m in before}
    new = {m: set(allocate_consistent_hash(all_queues, after, m)) for m in after}
    for member in after:
        assert old[member] <= new[member]  # nobody loses a queue it had
    moved = set().union(*new.values()) - set().union(*(old[m] for m in after))
    assert moved == old[leaving]


def test_strategies_are_found_by_rocketmq_and_plain_names():
    assert allocation_strategy("AVG") is allocate_averagely
    assert allocation_strategy("averagely-by-circle") is allocate_averagely_by_circle
    assert allocation_strategy("consistent_hash") is allocate_consistent_hash

    def mine(q, m, c):
        return []

    assert allocation_strategy(mine) is mine
    with pytest.raises(ValueError, match="AVG, AVG_BY_CIRCLE, CONSISTENT_HASH"):
        allocation_strategy("random")

"""ProcessQueue: offsets in flight, the offset that may be committed, flow-control bounds."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.client.message import MessageQueue
from tidemq.client.process_queue import ProcessQueue
from tidemq.protocol.message import MessageExt

QUEUE = MessageQueue("T", "broker-a", 0)


def messages(first: int, count: int, size: int = 10) -> list[MessageExt]:
    return [MessageExt(topic="T", body=b"x" * size, queue_offset=offset)
            for offset in range(first, first + count)]


def test_nothing_pulled_has_no_offset_to_commit():
    assert ProcessQueue(QUEUE).commit_offset == -1


def test_commit_offset_is_the_smallest_offset_in_flight_whatever_order_consumption_ends():
    process_queue = ProcessQueue(QUEUE)
    pulled = messages(100, 5)
    process_queue.put(pulled)
    assert process_queue.commit_offset == 100
    # later messages finish first: the offset stays at the one still in flight
    assert process_queue.remove([pulled[4], pulled[2]]) == 100
    assert process_queue.remove([pulled[1]]) == 100
    assert process_queue.remove([pulled[0]]) == 103
    assert process_queue.remove([pulled[3]]) == 105  # all done: one past the last pulled
    assert process_queue.message_count == 0


def test_removing_a_message_twice_or_one_never_pulled_changes_nothing():
    process_queue = ProcessQueue(QUEUE)
    pulled = messages(0, 3)
    process_queue.put(pulled)
    process_queue.remove([pulled[1]])
    assert process_queue.remove([pulled[1]]) == 0
    assert process_queue.remove(messages(50, 1)) == 0
    assert process_queue.message_count == 2
    assert process_queue.message_bytes == 20


def test_a_message_pulled_again_is_not_put_twice():
    process_queue = ProcessQueue(QUEUE)
    assert len(process_queue.put(messages(0, 4))) == 4
    fresh = process_queue.put(messages(2, 4))  # offsets 2, 3 again, 4 and 5 new
    assert [m.queue_offset for m in fresh] == [4, 5]
    assert process_queue.message_count == 6


@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, 60), seed=st.integers(0, 2**32 - 1))
def test_commit_offset_never_passes_a_message_still_in_flight(count, seed):
    rng = random.Random(seed)
    process_queue = ProcessQueue(QUEUE)
    pulled = messages(7, count)
    process_queue.put(pulled)
    pending = list(pulled)
    rng.shuffle(pending)
    while pending:
        done = [pending.pop() for _ in range(rng.randint(1, len(pending)))]
        offset = process_queue.remove(done)
        smallest_pending = min((m.queue_offset for m in pending), default=7 + count)
        assert offset == smallest_pending


def test_flow_control_counts_messages_bytes_and_span():
    process_queue = ProcessQueue(QUEUE)
    pulled = messages(0, 10, size=100)
    process_queue.put(pulled)
    assert process_queue.over_threshold(10, 10_000, None)  # 10 messages, limit 10
    assert not process_queue.over_threshold(11, 10_000, None)
    assert process_queue.over_threshold(11, 1000, None)  # 1000 body bytes, limit 1000
    process_queue.remove(pulled[1:9])
    assert process_queue.offset_span == 9  # offsets 0 and 9 still in flight
    assert process_queue.over_threshold(100, 10_000, 8)
    assert not process_queue.over_threshold(100, 10_000, 9)
    process_queue.remove([pulled[0], pulled[9]])
    assert not process_queue.over_threshold(1, 1, 0)
    assert process_queue.message_bytes == 0


def test_take_returns_the_front_in_order_and_leaves_it_in_flight():
    process_queue = ProcessQueue(QUEUE)
    pulled = messages(0, 6)
    process_queue.put(pulled)
    assert [m.queue_offset for m in process_queue.take(4)] == [0, 1, 2, 3]
    assert [m.queue_offset for m in process_queue.take(4)] == [0, 1, 2, 3]
    process_queue.remove(pulled[:2])
    assert [m.queue_offset for m in process_queue.take(10)] == [2, 3, 4, 5]
    process_queue.remove([pulled[3]])  # e.g. sent to the dead letters
    assert [m.queue_offset for m in process_queue.take(2)] == [2, 4]
    assert process_queue.commit_offset == 2


def test_lock_expires_after_its_expiry_without_renewal():
    process_queue = ProcessQueue(QUEUE)
    process_queue.last_lock_ms = 1_000
    assert not process_queue.lock_expired(31_000, 30_000)
    assert process_queue.lock_expired(31_001, 30_000)

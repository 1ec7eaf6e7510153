"""The store's maintenance reads and cleaning: raw consume-queue entries (queryCq), the topics
with queues (cleanUnusedTopic) and expired consume-queue segments (cleanExpiredCQ)."""

from __future__ import annotations

from store_helpers import message


def test_consume_queue_entries_are_the_stored_positions(store):
    results = [store.put_message(message(queue_id=0, body=b"x" * (10 + i))) for i in range(5)]
    entries = store.consume_queue_entries("Orders", 0, 1, 3)
    assert [(e[0], e[1]) for e in entries] == [
        (r.physical_offset, r.wrote_bytes) for r in results[1:4]]
    # past the end: only what is stored; an unknown queue: nothing
    assert len(store.consume_queue_entries("Orders", 0, 3, 100)) == 2
    assert store.consume_queue_entries("Orders", 7, 0, 10) == []
    assert store.consume_queue_entries("Nope", 0, 0, 10) == []


def test_queue_topics_lists_topics_with_queues_until_deleted(store):
    store.put_message(message(queue_id=0))
    store.put_message(message(topic="Other", queue_id=1))
    assert store.queue_topics() >= {"Orders", "Other"}
    store.delete_topic("Other")
    assert "Other" not in store.queue_topics()


def test_clean_expired_consume_queues_keeps_live_entries(store):
    for _ in range(3):
        store.put_message(message(queue_id=0))
    assert store.clean_expired_consume_queues() == 0
    assert len(store.consume_queue_entries("Orders", 0, 0, 10)) == 3

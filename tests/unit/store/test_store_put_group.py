"""put_message_group: single sends appended together, each answered as put_message would."""

from __future__ import annotations

import pytest
from store_helpers import message

from tidemq.protocol.message import TRANSACTION_COMMIT_TYPE, decode_records
from tidemq.protocol.msgid import decode_offset_msg_id
from tidemq.store.config import SCHEDULE_TOPIC
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import PutStatus

ALL_BYTES = 64 * 1024 * 1024


def read_queue(store, topic: str, queue_id: int):
    result = store.get_messages(topic, queue_id, 0, 1000, ALL_BYTES)
    return decode_records(result.body)


def interleaved(count: int, body_size: int = 100):
    """``count`` messages over two topics and three queues, each with tags, keys and a
    unique key naming its place in the list."""
    return [
        message(
            "Orders" if n % 5 else "Payments",
            n % 3,
            f"body-{n}-".encode() + b"x" * body_size,
            tags=f"tag{n % 2}",
            keys=f"key-{n}",
            unique_key=f"{n:032X}",
        )
        for n in range(count)
    ]


@pytest.mark.parametrize("count", [2, 7, 40])  # one by one below 12 messages, columns from 12
def test_group_stores_each_message_with_the_next_offset_of_its_own_queue(store, count):
    messages = interleaved(count)
    results = store.put_message_group(messages)

    assert len(results) == count
    assert all(result.status is PutStatus.PUT_OK for result in results)
    expected_next: dict[tuple[str, int], int] = {}
    for sent, result in zip(messages, results, strict=True):
        destination = (sent.topic, sent.queue_id)
        assert result.queue_offset == expected_next.get(destination, 0)
        expected_next[destination] = result.queue_offset + 1
        assert result.message_count == 1
        assert len(result.msg_ids) == 1
        assert decode_offset_msg_id(result.msg_ids[0])[1] == result.physical_offset
    for (topic, queue_id), next_offset in expected_next.items():
        assert store.max_offset(topic, queue_id) == next_offset
        stored = read_queue(store, topic, queue_id)
        sent_here = [m for m in messages if (m.topic, m.queue_id) == (topic, queue_id)]
        assert [record.body for record in stored] == [m.body for m in sent_here]
        assert [record.queue_offset for record in stored] == list(range(next_offset))
        assert all(record.queue_id == queue_id and record.topic == topic for record in stored)
        assert [record.properties["KEYS"] for record in stored] == [
            m.properties["KEYS"] for m in sent_here
        ]
    for sent, result in zip(messages, results, strict=True):
        found = store.query_messages(sent.topic, sent.properties["KEYS"], 10, 0, 2**62)
        assert [decode_records(record)[0].physical_offset for record in found.records] == [
            result.physical_offset
        ]


def test_group_records_read_the_same_as_records_put_one_by_one(tmp_path):
    from store_helpers import small_config

    grouped = FileMessageStore(small_config(tmp_path / "grouped"))
    single = FileMessageStore(small_config(tmp_path / "single"))
    try:
        messages = interleaved(20)
        grouped.put_message_group(messages)
        for sent in messages:
            single.put_message(sent)
        for topic, queue_id in {(m.topic, m.queue_id) for m in messages}:
            ignore = {"physical_offset", "store_timestamp"}
            a = [vars_of(r, ignore) for r in read_queue(grouped, topic, queue_id)]
            b = [vars_of(r, ignore) for r in read_queue(single, topic, queue_id)]
            assert a == b
    finally:
        grouped.close()
        single.close()


def vars_of(record, ignore: set[str]) -> dict:
    return {
        name: getattr(record, name)
        for name in record.__dataclass_fields__
        if name not in ignore
    }


def test_a_bad_message_is_refused_alone_and_the_others_are_stored(store):
    messages = interleaved(14)
    messages[5].body = b"x" * (store.config.max_message_size + 1)
    results = store.put_message_group(messages)

    assert results[5].status is PutStatus.MESSAGE_ILLEGAL
    assert "max_message_size" in results[5].remark
    stored = [r for n, r in enumerate(results) if n != 5]
    assert all(result.status is PutStatus.PUT_OK for result in stored)
    bodies = {(m.topic, m.queue_id): [] for m in messages}
    for n, sent in enumerate(messages):
        if n != 5:
            bodies[(sent.topic, sent.queue_id)].append(sent.body)
    for (topic, queue_id), expected in bodies.items():
        assert [r.body for r in read_queue(store, topic, queue_id)] == expected


def test_transactional_and_delayed_messages_keep_their_place_in_the_queue_order(store):
    messages = [message("Orders", 0, f"m{n}".encode(), unique_key=f"{n:032X}") for n in range(6)]
    messages[2].sysflag = TRANSACTION_COMMIT_TYPE  # a committed transactional message
    delayed = message(SCHEDULE_TOPIC, 2, b"later", unique_key="D" * 32)
    delayed.properties["DELAY"] = "3"
    messages.insert(4, delayed)

    results = store.put_message_group(messages)

    assert all(result.status is PutStatus.PUT_OK for result in results)
    assert [r.body for r in read_queue(store, "Orders", 0)] == [
        b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"
    ]
    assert [r.body for r in read_queue(store, SCHEDULE_TOPIC, 2)] == [b"later"]


def test_a_group_larger_than_the_segment_space_left_rolls_to_the_next_segment(store):
    # 64 KiB segments: 90 records of about 1 KiB cross at least one segment boundary.
    messages = interleaved(90, body_size=1000)
    results = store.put_message_group(messages)

    assert all(result.status is PutStatus.PUT_OK for result in results)
    assert len({result.physical_offset // (64 * 1024) for result in results}) >= 2
    for queue_id in range(3):
        stored = read_queue(store, "Orders", queue_id)
        expected = [m.body for m in messages if (m.topic, m.queue_id) == ("Orders", queue_id)]
        assert [record.body for record in stored] == expected
        for record in stored:
            assert record.physical_offset == results[
                int(record.body.split(b"-")[1])
            ].physical_offset


def test_dispatch_listeners_hear_each_queue_of_the_group_once_with_its_max_offset(store):
    heard: list[tuple[str, int, int]] = []
    store.add_dispatch_listener(lambda topic, queue_id, max_offset: heard.append(
        (topic, queue_id, max_offset)
    ))
    store.put_message_group(interleaved(15))

    assert sorted(heard) == sorted(
        (topic, queue_id, store.max_offset(topic, queue_id))
        for topic, queue_id in {("Orders", 0), ("Orders", 1), ("Orders", 2),
                                ("Payments", 0), ("Payments", 1), ("Payments", 2)}
    )


def test_append_listeners_hear_a_queue_group_once_and_other_appends_per_queue(store):
    appended: list[int] = []
    dispatched: list[int] = []

    def broken() -> None:
        raise RuntimeError("a listener's bug")

    store.add_append_listener(broken)  # logged, and the others still hear
    store.add_append_listener(lambda: appended.append(store.commit_log_max_offset()))
    store.add_dispatch_listener(lambda topic, queue_id, max_offset: dispatched.append(
        max_offset))
    # 15 messages over two topics: a queue group per topic, three queues each.
    results = store.put_message_group(interleaved(15))
    assert all(result.ok for result in results)
    assert len(dispatched) == 6 and len(appended) == 2
    assert appended[-1] == store.commit_log_max_offset()
    store.put_message(message("Orders", 1, b"alone"))  # one queue: as a dispatch listener
    assert len(dispatched) == 7 and len(appended) == 3


def test_grouped_appends_survive_a_restart_with_their_queues(tmp_path):
    from store_helpers import small_config

    config = small_config(tmp_path / "store")
    store = FileMessageStore(config)
    messages = interleaved(30)
    results = store.put_message_group(messages)
    store.close()

    reopened = FileMessageStore(config)
    try:
        for sent, result in zip(messages, results, strict=True):
            stored = read_queue(reopened, sent.topic, sent.queue_id)
            assert stored[result.queue_offset].body == sent.body
    finally:
        reopened.close()


def test_a_closed_store_refuses_every_message_of_the_group(store):
    store.close()
    results = store.put_message_group(interleaved(4))
    assert [result.status for result in results] == [PutStatus.SERVICE_NOT_AVAILABLE] * 4


def test_a_group_of_sends_with_unique_keys_only_is_indexed_and_queued_per_queue(store):
    # The commonest group at 20,000 msg/s: a client's sends over 8 queues, each with a
    # UNIQ_KEY and no KEYS (columns from 12 messages on).
    messages = [message("Orders", n % 8, b"u%d" % n, unique_key=f"{n:032X}") for n in range(20)]
    results = store.put_message_group(messages)

    assert [result.status for result in results] == [PutStatus.PUT_OK] * 20
    for sent, result in zip(messages, results, strict=True):
        found = store.query_messages("Orders", sent.properties["UNIQ_KEY"], 10, 0, 2**62)
        assert [decode_records(r)[0].physical_offset for r in found.records] == [
            result.physical_offset]
    for queue_id in range(8):
        stored = read_queue(store, "Orders", queue_id)
        assert [record.body for record in stored] == [
            m.body for m in messages if m.queue_id == queue_id]
        assert [record.queue_offset for record in stored] == list(range(len(stored)))
    entries = {queue_id: store.consume_queue_entries("Orders", queue_id, 0, 10)
               for queue_id in range(8)}
    for sent, result in zip(messages, results, strict=True):
        assert entries[sent.queue_id][result.queue_offset][:2] == (
            result.physical_offset, result.wrote_bytes)


def test_a_plain_group_of_one_topic_goes_to_one_queue_group_without_sorting(store, monkeypatch):
    # A producer's read of plain sends to one topic: one queue group, no per-message sort
    # by topic and kind (_put_pending is that sort's step).
    def refuse(*args, **kwargs):
        raise AssertionError("a one-topic plain group was sorted message by message")

    monkeypatch.setattr(store, "_put_pending", refuse)
    messages = [message("Orders", n % 3, b"p%d" % n, unique_key=f"{n:032X}") for n in range(5)]
    results = store.put_message_group(messages)
    assert [result.queue_offset for result in results] == [0, 0, 0, 1, 1]
    assert [r.physical_offset for r in results] == sorted(r.physical_offset for r in results)

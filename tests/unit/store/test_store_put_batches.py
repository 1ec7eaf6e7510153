"""Batches appended together (``put_batches``) are stored and answered exactly as the same
batches put one by one (``put_batch``), on both stores: the same commit-log bytes, queue
offsets, msg ids, consume-queue entries and index entries (the files byte for byte), whether
they fit the current segment (one write) or not."""

from __future__ import annotations

import pytest
from store_helpers import small_config

from tidemq.protocol.message import decode_records
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import MessageBatch, PutStatus
from tidemq.store.key_columns import KeyColumns
from tidemq.store.memory_store import MemoryMessageStore

NOW_S = 1_700_000_000.0  # every append of a test at one store time, so bytes compare


def batch(topic: str, queue_id: int, name: str, count: int, body_size: int = 100,
          keys: bool = True, key_columns: bool = False) -> MessageBatch:
    """``key_columns``: the keys as the batch path makes them (KeyColumns), not tuples."""
    unique_keys = [f"{name}-U{n:03d}" for n in range(count)]
    user_keys = [f"{name}-k{n}" for n in range(count)]
    properties = [
        f"KEYS\x01{user}\x02UNIQ_KEY\x01{unique}\x02CLUSTER\x01C".encode()
        if keys else f"UNIQ_KEY\x01{unique}".encode()
        for unique, user in zip(unique_keys, user_keys, strict=True)
    ]
    return MessageBatch(
        topic, queue_id, [name.encode() * (body_size // len(name)) for _ in range(count)],
        properties, list(range(count)), None,
        (KeyColumns((unique_keys, user_keys) if keys else (unique_keys,)) if key_columns
         else [(unique, user) if keys else (unique,)
               for unique, user in zip(unique_keys, user_keys, strict=True)]),
        born_timestamp=1_699_999_999_000, born_host="10.0.0.7:4242",
    )


def open_store(kind: str, root):
    config = small_config(root)
    return FileMessageStore(config) if kind == "file" else MemoryMessageStore(config)


def answers(results):
    return [(r.status, r.physical_offset, r.queue_offset, r.msg_ids, r.message_count,
             r.wrote_bytes) for r in results]


def log_bytes(store) -> bytes:
    return store.read_commit_log(store.commit_log_min_offset(), store.commit_log_max_offset())


@pytest.mark.parametrize("key_form", ["tuples", "columns"])
@pytest.mark.parametrize("kind", ["file", "memory"])
@pytest.mark.parametrize(
    ("batches", "fill"),
    [
        # queue 0 twice: the second batch's queue offsets follow the first's
        ([("Orders", 0, "a", 5), ("Orders", 1, "b", 3), ("Orders", 0, "c", 4)], 0),
        # the three do not fit what is left of the 64 KiB segment: written one by one
        ([("Orders", 0, "a", 4, 5000), ("Orders", 1, "b", 4, 5000),
          ("Orders", 0, "c", 4, 5000)], 5),
        # two topics: appended one by one
        ([("Orders", 0, "a", 5), ("Refunds", 0, "b", 5), ("Orders", 0, "c", 5)], 0),
    ],
    ids=["one-write", "across-segments", "two-topics"],
)
def test_batches_appended_together_are_stored_as_one_by_one(tmp_path, monkeypatch, kind,
                                                              batches, fill, key_form):
    # key_form "columns": the batches appended together carry their keys as the batch path
    # makes them (KeyColumns, joined column by column when the batches are written together);
    # the ones put one by one as tuples: the same index entries either way.
    monkeypatch.setattr("tidemq.store.store_core.time.time", lambda: NOW_S)
    together = open_store(kind, tmp_path / "together")
    one_by_one = open_store(kind, tmp_path / "one-by-one")
    try:
        made = [batch(*shape) for shape in batches]
        made_as = [batch(*shape, key_columns=key_form == "columns") for shape in batches]
        for store in (together, one_by_one):
            for n in range(fill):  # earlier records, so the batches start mid-segment
                assert store.put_batch(batch("Orders", 2, f"f{n}", 1, 8000)).status \
                    is PutStatus.PUT_OK
        writes = count_writes(monkeypatch)
        stored = together.put_batches(made_as)
        if kind == "file" and not fill and len({b.topic for b in made}) == 1:
            assert writes == {"pwritev": 1}  # all batches in one system call
        expected = [one_by_one.put_batch(each) for each in made]

        assert [r.status for r in stored] == [PutStatus.PUT_OK] * len(made)
        assert answers(stored) == answers(expected)
        assert log_bytes(together) == log_bytes(one_by_one)
        for topic, queue_id in {(b.topic, b.queue_id) for b in made}:
            read = together.get_messages(topic, queue_id, 0, 100, 1 << 30)
            assert read.body == one_by_one.get_messages(topic, queue_id, 0, 100, 1 << 30).body
            assert read.max_offset == sum(len(b.bodies) for b in made
                                          if (b.topic, b.queue_id) == (topic, queue_id))
        for each, result in zip(made, stored, strict=True):
            for n, (unique, user) in enumerate(each.keys):
                for key in (unique, user):
                    found = together.query_messages(each.topic, key, 10, 0, 2**62)
                    assert [r.physical_offset for r in decode_records(b"".join(
                        found.records))] == [result.physical_offset
                                             + sum(map(len_of_record(each), range(n)))]
        if kind == "file":
            for store in (together, one_by_one):
                store.flush()
            assert index_bytes(tmp_path / "together") == index_bytes(tmp_path / "one-by-one")
            queue_files = consume_queue_bytes(tmp_path / "together")
            assert len(queue_files) == len({(b.topic, b.queue_id) for b in made} | (
                {("Orders", 2)} if fill else set()))
            assert queue_files == consume_queue_bytes(tmp_path / "one-by-one")
    finally:
        together.close()
        one_by_one.close()


def index_bytes(root) -> list[bytes]:
    """The bytes of the store's index files, in name (creation) order."""
    return [path.read_bytes() for path in sorted((root / "index").iterdir())]


def consume_queue_bytes(root) -> dict[str, bytes]:
    """Each consume-queue file's bytes by its path under the store (topic/queue/offset)."""
    queues = root / "consumequeue"
    return {str(path.relative_to(queues)): path.read_bytes()
            for path in sorted(queues.rglob("*")) if path.is_file()}


def count_writes(monkeypatch) -> dict[str, int]:
    """Counts the commit log's write system calls from now on, by name."""
    import os

    counts: dict[str, int] = {}
    for name in ("pwrite", "pwritev"):
        real = getattr(os, name)

        def counted(*args, _real=real, _name=name):
            counts[_name] = counts.get(_name, 0) + 1
            return _real(*args)

        monkeypatch.setattr(f"tidemq.store.commit_log.os.{name}", counted)
    return counts


def len_of_record(each: MessageBatch):
    # A record: the 88-byte IPv4 prefix, body, topic length and topic, properties length
    # and properties.
    def size(n: int) -> int:
        return 88 + len(each.bodies[n]) + 1 + len(each.topic) + 2 + len(each.properties[n])
    return size


def test_a_refused_batch_gets_its_own_status_and_the_others_are_stored(store):
    good = batch("Orders", 0, "a", 3)
    bad = MessageBatch("Orders", -1, [b"x"], [b"UNIQ_KEY\x01K"], [0], None, [("K",)])
    after = batch("Orders", 0, "b", 2)

    results = store.put_batches([good, bad, after])

    assert [r.status for r in results] == [PutStatus.PUT_OK, PutStatus.MESSAGE_ILLEGAL,
                                           PutStatus.PUT_OK]
    assert "queue" in results[1].remark
    assert [results[0].queue_offset, results[2].queue_offset] == [0, 3]
    bodies = [r.body for r in decode_records(store.get_messages("Orders", 0, 0, 10, 1 << 30).body)]
    assert bodies == good.bodies + after.bodies


def test_a_closed_store_refuses_every_batch(store):
    store.close()
    results = store.put_batches([batch("Orders", 0, "a", 2), batch("Orders", 1, "b", 2)])
    assert [r.status for r in results] == [PutStatus.SERVICE_NOT_AVAILABLE] * 2

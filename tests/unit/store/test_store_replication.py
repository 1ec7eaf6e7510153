"""A slave's store written from its master's commit-log bytes (store/replication.py).

The master is a real store filled through the normal append paths; the slave gets the
master's bytes in chunks cut at random places (inside records, at segment ends) and must end
with the same commit-log bytes and answer the same reads.
"""

from __future__ import annotations

import random

import pytest
from store_helpers import SEGMENT_SIZE, message, small_config

from tidemq.protocol.message import SYSFLAG_COMPRESSED, TRANSACTION_PREPARED_TYPE
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import MessageStore
from tidemq.store.memory_store import MemoryMessageStore
from tidemq.store.replication import ReplicaCorrupt, ReplicaMismatch

TOPICS = ("Orders", "Payments")


def fill(store: MessageStore, rng: random.Random, count: int) -> None:
    """Single, batch, compressed-flagged and prepared messages of mixed sizes."""
    sent = 0
    while sent < count:
        kind = rng.randrange(4)
        topic = rng.choice(TOPICS)
        queue_id = rng.randrange(3)
        body = rng.randbytes(rng.randrange(1, 3000))
        if kind == 0:
            result = store.put_messages([
                message(topic, queue_id, rng.randbytes(rng.randrange(1, 800)),
                        tags="batch", keys=f"k{sent + i}")
                for i in range(rng.randrange(2, 20))
            ])
        elif kind == 1:
            result = store.put_message(message(topic, queue_id, body, sysflag=SYSFLAG_COMPRESSED,
                                               tags="zip", keys=f"k{sent}"))
        elif kind == 2:
            result = store.put_message(message(topic, queue_id, body,
                                               sysflag=TRANSACTION_PREPARED_TYPE,
                                               keys=f"k{sent}"))
        else:
            result = store.put_message(message(topic, queue_id, body, tags="one",
                                               keys=f"k{sent}", unique_key=f"u{sent}"))
        assert result.ok, result.remark
        sent += max(1, result.message_count)


def replicate(master: MessageStore, slave: MessageStore, rng: random.Random,
              start: int | None = None) -> None:
    """Copy the master's log to the slave in chunks of random size, as the HA stream does."""
    offset = slave.commit_log_max_offset() if start is None else start
    end = master.commit_log_max_offset()
    while offset < end:
        chunk = master.read_commit_log(offset, rng.choice((1, 7, 100, 4096, 32 * 1024)))
        assert chunk is not None, offset
        if not chunk:
            break
        assert slave.append_replicated(offset, chunk) == offset + len(chunk)
        offset += len(chunk)
        if rng.random() < 0.5:
            slave.dispatch_replicated()
    assert slave.dispatch_replicated() == end


def commit_log_bytes(store: MessageStore, start: int, end: int) -> bytes:
    out = bytearray()
    offset = start
    while offset < end:
        chunk = store.read_commit_log(offset, 1 << 20)
        assert chunk, offset
        out += chunk
        offset += len(chunk)
    return bytes(out[: end - start])


def assert_same_reads(master: MessageStore, slave: MessageStore) -> None:
    for topic in TOPICS:
        for queue_id in range(3):
            assert slave.min_offset(topic, queue_id) == master.min_offset(topic, queue_id)
            assert slave.max_offset(topic, queue_id) == master.max_offset(topic, queue_id)
            low = master.min_offset(topic, queue_id)
            ours = slave.get_messages(topic, queue_id, low, 10_000, 1 << 30)
            theirs = master.get_messages(topic, queue_id, low, 10_000, 1 << 30)
            assert (ours.status, ours.body, ours.next_begin_offset) == (
                theirs.status, theirs.body, theirs.next_begin_offset)
    for key in ("k0", "k5", "k17", "u3", "k40"):
        for topic in TOPICS:
            ours = slave.query_messages(topic, key, 32, 0, 1 << 62)
            theirs = master.query_messages(topic, key, 32, 0, 1 << 62)
            assert sorted(ours.records) == sorted(theirs.records)


@pytest.fixture(params=["file", "memory"])
def pair(request, tmp_path):
    def open_store(name: str) -> MessageStore:
        config = small_config(tmp_path / name)
        return FileMessageStore(config) if request.param == "file" else MemoryMessageStore(config)

    master, slave = open_store("master"), open_store("slave")
    yield master, slave
    master.close()
    slave.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_slave_log_is_byte_identical_and_answers_the_same_reads(pair, seed):
    master, slave = pair
    rng = random.Random(seed)
    fill(master, rng, 300)
    assert master.commit_log_max_offset() > 3 * SEGMENT_SIZE  # several segment rolls
    replicate(master, slave, rng)
    end = master.commit_log_max_offset()
    assert slave.commit_log_max_offset() == end
    assert commit_log_bytes(slave, 0, end) == commit_log_bytes(master, 0, end)
    assert_same_reads(master, slave)
    # It goes on from where it stopped.
    fill(master, rng, 50)
    replicate(master, slave, rng)
    assert commit_log_bytes(slave, 0, master.commit_log_max_offset()) == commit_log_bytes(
        master, 0, master.commit_log_max_offset())
    assert_same_reads(master, slave)


def test_records_cut_by_a_chunk_are_not_readable_until_their_rest_arrives(pair):
    master, slave = pair
    first = master.put_message(message("Orders", 0, b"a" * 500))
    master.put_message(message("Orders", 0, b"b" * 500))
    end = master.commit_log_max_offset()
    half = first.wrote_bytes + 100  # the first record and a part of the second
    slave.append_replicated(0, master.read_commit_log(0, half))
    assert slave.dispatch_replicated() == first.wrote_bytes
    assert slave.max_offset("Orders", 0) == 1
    slave.append_replicated(half, master.read_commit_log(half, end))
    assert slave.dispatch_replicated() == end
    assert slave.max_offset("Orders", 0) == 2


def test_an_empty_slave_starts_at_the_masters_first_segment(pair):
    master, slave = pair
    rng = random.Random(7)
    fill(master, rng, 300)
    # Retention took the master's first segments: the slave copies from what is left.
    assert master.run_retention(now_ms=1 << 62, disk_used_ratio=99.0) > 0
    start = master.commit_log_min_offset()
    assert start > 0 and start % SEGMENT_SIZE == 0
    replicate(master, slave, rng, start=start)
    end = master.commit_log_max_offset()
    assert slave.commit_log_min_offset() == start
    assert commit_log_bytes(slave, start, end) == commit_log_bytes(master, start, end)
    for topic in TOPICS:
        for queue_id in range(3):
            low = master.min_offset(topic, queue_id)
            ours = slave.get_messages(topic, queue_id, low, 10_000, 1 << 30)
            theirs = master.get_messages(topic, queue_id, low, 10_000, 1 << 30)
            assert ours.body == theirs.body


def test_bytes_that_do_not_continue_the_log_are_refused_and_nothing_is_written(pair):
    master, slave = pair
    master.put_message(message("Orders", 0, b"x" * 100))
    chunk = master.read_commit_log(0, 1 << 20)
    with pytest.raises(ReplicaMismatch, match="segment start"):
        slave.append_replicated(8, chunk)
    slave.append_replicated(0, chunk)
    ends = f"start at offset 0 but this commit log ends at {len(chunk)}"
    with pytest.raises(ReplicaMismatch, match=ends):
        slave.append_replicated(0, chunk)
    with pytest.raises(ReplicaMismatch, match="cross the end of segment"):
        slave.append_replicated(len(chunk), bytes(SEGMENT_SIZE))
    assert slave.commit_log_max_offset() == len(chunk)


def test_bytes_that_are_no_record_stop_the_dispatch_naming_the_offset(pair):
    master, slave = pair
    good = master.put_message(message("Orders", 0, b"x" * 100))
    slave.append_replicated(0, master.read_commit_log(0, 1 << 20))
    slave.append_replicated(good.wrote_bytes, b"\x00\x00\x01\x00garbage!" + bytes(300))
    with pytest.raises(ReplicaCorrupt, match=f"offset {good.wrote_bytes}"):
        slave.dispatch_replicated()
    assert slave.max_offset("Orders", 0) == 1  # the good record before it was dispatched


def test_a_slave_restarted_after_a_cut_record_recovers_to_a_boundary_and_goes_on(tmp_path):
    master = FileMessageStore(small_config(tmp_path / "master"))
    rng = random.Random(11)
    fill(master, rng, 100)
    slave_config = small_config(tmp_path / "slave")
    slave = FileMessageStore(slave_config)
    first = master.commit_log_max_offset() // 2
    offset = 0
    while offset < first:
        chunk = master.read_commit_log(offset, 777)
        slave.append_replicated(offset, chunk)
        offset += len(chunk)
    confirmed = slave.dispatch_replicated()
    assert confirmed < offset  # a record was cut
    slave.close()
    slave = FileMessageStore(slave_config)
    try:
        assert slave.commit_log_max_offset() == confirmed
        assert slave.last_record_offset() >= 0
        replicate(master, slave, rng)
        end = master.commit_log_max_offset()
        assert commit_log_bytes(slave, 0, end) == commit_log_bytes(master, 0, end)
        assert_same_reads(master, slave)
    finally:
        slave.close()
        master.close()


def test_read_chunk_stays_in_one_segment_and_says_what_is_not_there(store):
    rng = random.Random(5)
    fill(store, rng, 200)
    end = store.commit_log_max_offset()
    chunk = store.read_commit_log(SEGMENT_SIZE - 10, 1 << 20)
    assert len(chunk) == 10
    assert store.read_commit_log(end, 100) == b""
    assert store.read_commit_log(end + 5, 100) is None
    store.run_retention(now_ms=1 << 62, disk_used_ratio=99.0)
    assert store.read_commit_log(0, 100) is None



def test_dispatch_in_slices_stops_at_record_boundaries_and_ends_with_the_same_reads(pair):
    master, slave = pair
    rng = random.Random(21)
    fill(master, rng, 300)
    end = master.commit_log_max_offset()
    offset = 0
    while offset < end:  # copied, nothing dispatched yet
        chunk = master.read_commit_log(offset, 32 * 1024)
        slave.append_replicated(offset, chunk)
        offset += len(chunk)
    starts = {segment.file_from_offset + position  # every record's offset in the master
              for segment, position in master.commit_log.iter_positions(0)}
    confirmed, slices = 0, 0
    while confirmed < end:
        before = confirmed
        confirmed = slave.dispatch_replicated(max_bytes=5_000)
        slices += 1
        assert confirmed > before
        # At most one record (< 5 KiB here) or a segment's blank tail past the slice.
        assert confirmed - before < 5_000 + SEGMENT_SIZE
        assert confirmed in starts or confirmed % SEGMENT_SIZE == 0 or confirmed == end
    assert slices > 10
    assert_same_reads(master, slave)

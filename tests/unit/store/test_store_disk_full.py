"""A full disk refuses writes (SERVICE_NOT_AVAILABLE) and never kills the store.

Two layers are tested: the guard (the volume above diskSpaceWarningLevelRatio refuses writes,
with a remark naming the store and its usage, and writes resume once it drops), and the
reservations (every file's space is allocated before a byte of it is written through a
mapping, so a reservation that fails refuses the append and leaves the store as it was).
The disk is faked at the two points the store asks it: the usage measure and posix_fallocate.
"""

from __future__ import annotations

import errno
import os

import pytest
from store_helpers import message, small_config

from tidemq.protocol.message import decode_record
from tidemq.store import disk_space
from tidemq.store.consume_queue import RESERVE_CHUNK_BYTES
from tidemq.store.disk_space import DiskSpaceGuard, DiskUsage
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import MessageBatch, PutStatus

TOPIC = "Orders"


class FakeVolume:
    """A volume whose usage the test sets, and a clock the test moves."""

    def __init__(self) -> None:
        self.total = 1000 * 1024 * 1024
        self.free = self.total // 2
        self.now = 0.0

    def usage(self, path: str) -> DiskUsage:
        return DiskUsage(self.total, self.total - self.free, self.free)

    def clock(self) -> float:
        return self.now


@pytest.fixture
def volume_store(tmp_path):
    volume = FakeVolume()
    store = FileMessageStore(small_config(tmp_path / "store"))
    store.disk_guard = DiskSpaceGuard(
        store.root_dir, 90, usage=volume.usage, clock=volume.clock
    )
    yield volume, store
    store.close()


def test_a_full_volume_refuses_writes_naming_the_store_and_its_usage(volume_store):
    volume, store = volume_store
    first = store.put_message(message(body=b"before"))
    assert first.ok
    volume.free = volume.total // 20  # 95 % used
    volume.now += 1
    refused = store.put_message(message(body=b"during"))
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert store.root_dir in refused.remark
    assert "95.0% used" in refused.remark and "diskSpaceWarningLevelRatio=90" in refused.remark
    assert store.max_offset(TOPIC, 0) == 1
    # The batch paths refuse as well, and reads go on.
    assert store.put_messages([message(), message()]).status is PutStatus.SERVICE_NOT_AVAILABLE
    group = store.put_message_group([message(queue_id=1), message(queue_id=2)])
    assert {result.status for result in group} == {PutStatus.SERVICE_NOT_AVAILABLE}
    got = store.get_messages(TOPIC, 0, 0, 10, 1 << 20)
    assert [decode_record(got.body).body] == [b"before"]
    # Space comes back: writes resume by themselves once the guard looks again.
    volume.free = volume.total // 2
    assert store.put_message(message(body=b"still")).status is PutStatus.SERVICE_NOT_AVAILABLE
    volume.now += disk_space.CHECK_INTERVAL_S
    assert store.put_message(message(body=b"after")).ok
    assert store.max_offset(TOPIC, 0) == 2


def test_the_guard_measures_the_volume_at_most_once_per_interval():
    volume = FakeVolume()
    calls = []

    def usage(path):
        calls.append(path)
        return volume.usage(path)

    guard = DiskSpaceGuard("/store", 90, usage=usage, clock=volume.clock)
    for _ in range(1000):
        assert guard.refusal() is None
    assert len(calls) == 1
    volume.now += disk_space.CHECK_INTERVAL_S
    guard.refusal()
    assert len(calls) == 2


def fallocate_fails(monkeypatch, only_under: str = ""):
    real = os.posix_fallocate

    def no_room(fd, offset, length):
        if only_under not in os.readlink(f"/proc/self/fd/{fd}"):
            return real(fd, offset, length)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_room)


def test_a_new_queue_that_cannot_reserve_its_file_refuses_the_send_and_writes_nothing(
    volume_store, monkeypatch
):
    volume, store = volume_store
    assert store.put_message(message(queue_id=0)).ok
    end = store.commit_log_max_offset()
    fallocate_fails(monkeypatch)
    refused = store.put_message(message(queue_id=3, body=b"new queue"))
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert "disk full" in refused.remark and "consumequeue" in refused.remark
    assert store.commit_log_max_offset() == end
    assert store.max_offset(TOPIC, 3) == 0
    # The guard holds the verdict: the next write is refused without trying the disk.
    assert store.put_message(message(queue_id=0)).status is PutStatus.SERVICE_NOT_AVAILABLE
    monkeypatch.undo()
    volume.now += disk_space.CHECK_INTERVAL_S
    written = store.put_message(message(queue_id=3, body=b"new queue"))
    assert written.ok and written.queue_offset == 0
    got = store.get_messages(TOPIC, 3, 0, 10, 1 << 20)
    assert decode_record(got.body).body == b"new queue"


def test_consume_queue_files_take_disk_as_they_fill(tmp_path):
    config = small_config(tmp_path / "store", mapped_file_size_consume_queue=300_000 * 20)
    with FileMessageStore(config) as store:
        for queue_id in range(8):
            assert store.put_message(message(queue_id=queue_id)).ok
        for queue_id in range(8):
            (segment,) = store.queues.get(TOPIC, queue_id).segments()
            assert os.path.getsize(segment.path) == 6_000_000
            # One page reserved (and written) at first, not the segment's 5.7 MiB.
            held = os.stat(segment.path).st_blocks * 512
            assert 4096 <= held <= 8192
        # Past the first chunk, the next is reserved before the entries are written.
        batch = [message(body=b"x") for _ in range(RESERVE_CHUNK_BYTES // 20 + 10)]
        for start in range(0, len(batch), 500):
            assert store.put_messages(batch[start : start + 500]).ok
        (segment,) = store.queues.get(TOPIC, 0).segments()
        assert segment.reserved_position == 2 * RESERVE_CHUNK_BYTES
        assert os.stat(segment.path).st_blocks * 512 >= 2 * RESERVE_CHUNK_BYTES


def test_a_queue_past_its_reserved_chunk_refuses_the_send_when_the_disk_is_full(
    tmp_path, monkeypatch
):
    config = small_config(tmp_path / "store", mapped_file_size_consume_queue=300_000 * 20)
    with FileMessageStore(config) as store:
        store.disk_guard = None
        per_chunk = RESERVE_CHUNK_BYTES // 20
        body = [message(body=b"x") for _ in range(500)]
        while store.max_offset(TOPIC, 0) + 500 <= per_chunk:
            assert store.put_messages(body).ok
        end = store.commit_log_max_offset()
        count = store.max_offset(TOPIC, 0)
        fallocate_fails(monkeypatch)
        refused = store.put_messages(body)
        assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert store.commit_log_max_offset() == end and store.max_offset(TOPIC, 0) == count
        monkeypatch.undo()
        assert store.put_messages(body).ok
        assert store.max_offset(TOPIC, 0) == count + 500


def test_an_index_that_cannot_reserve_room_for_the_keys_refuses_the_send(
    tmp_path, monkeypatch
):
    config = small_config(tmp_path / "store", max_hash_slot_num=64, max_index_num=100_000)
    with FileMessageStore(config) as store:
        store.disk_guard = None
        keyed = [message(keys=f"k{i}") for i in range(1000)]
        while True:
            index_file = store.index._files[-1] if store.index._files else None
            if index_file is not None and index_file.room() < 1000:
                break
            if index_file is not None and (
                index_file.reserved_end - index_file._entries_base
                < (index_file.index_count + 1000) * 20
            ):
                break
            assert store.put_messages(keyed[:500]).ok
        end = store.commit_log_max_offset()
        fallocate_fails(monkeypatch, only_under=os.sep + "index" + os.sep)
        refused = store.put_messages(keyed)
        assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert "index file" in refused.remark
        assert store.commit_log_max_offset() == end
        monkeypatch.undo()
        assert store.put_messages(keyed).ok
        assert store.query_messages(TOPIC, "k999", 10, 0, 2**62).records


def test_a_commit_log_segment_that_cannot_be_created_refuses_the_send(
    tmp_path, monkeypatch
):
    with FileMessageStore(small_config(tmp_path / "store", warm_mapped_file_enable=False)) as store:
        store.disk_guard = None
        body = b"y" * 8000
        record_size = store.put_message(message(body=body)).wrote_bytes
        while store.commit_log_max_offset() + record_size + 8 <= 64 * 1024:
            assert store.put_message(message(body=body)).ok
        end = store.commit_log_max_offset()
        fallocate_fails(monkeypatch)
        refused = store.put_message(message(body=body))
        assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert "commitlog" in refused.remark
        assert store.commit_log_max_offset() == end
        monkeypatch.undo()
        assert store.put_message(message(body=body)).ok


def test_batches_appended_together_across_a_segment_that_cannot_be_created(
    tmp_path, monkeypatch
):
    # put_batches with batches that do not all fit the current segment: the ones that fit
    # are stored and dispatched, the one that needs the new segment is refused, and the
    # store keeps taking writes (a refused segment must not make it stop until a restart).
    with FileMessageStore(small_config(tmp_path / "store", warm_mapped_file_enable=False)) as store:
        store.disk_guard = None
        body = b"y" * 8000
        record_size = store.put_message(message(body=body)).wrote_bytes
        # Room left for three records and not four: the first batch of two fits, both do not.
        while store.commit_log_max_offset() + 4 * record_size <= 64 * 1024:
            assert store.put_message(message(body=body)).ok
        end = store.commit_log_max_offset()
        queued = store.max_offset(TOPIC, 0)
        fallocate_fails(monkeypatch, only_under="commitlog")
        fits, needs_new_segment = store.put_batches(
            [one_batch(queue_id=0, count=2, body=body), one_batch(queue_id=1, count=2, body=body)]
        )
        assert fits.status is PutStatus.PUT_OK and fits.message_count == 2
        assert needs_new_segment.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert "commitlog" in needs_new_segment.remark
        assert store.commit_log_max_offset() == end + fits.wrote_bytes
        assert store.max_offset(TOPIC, 0) == queued + 2
        assert store.max_offset(TOPIC, 1) == 0
        monkeypatch.undo()
        again = store.put_batches([one_batch(queue_id=1, count=2, body=body)])
        assert [result.status for result in again] == [PutStatus.PUT_OK]
        assert store.max_offset(TOPIC, 1) == 2


def one_batch(queue_id: int, count: int, body: bytes) -> MessageBatch:
    unique_keys = [f"U{queue_id}-{n}" for n in range(count)]
    return MessageBatch(
        TOPIC, queue_id, [body] * count,
        [f"UNIQ_KEY\x01{unique}".encode() for unique in unique_keys], [0] * count, None,
        [(unique,) for unique in unique_keys],
        born_timestamp=1_699_999_999_000, born_host="10.0.0.7:4242",
    )


def test_the_volume_is_as_full_as_df_says_blocks_kept_back_by_the_file_system_are_not_used():
    # 1000 bytes, 300 used, 50 available to us, 650 kept back (root's reserve, a quota):
    # df and RocketMQ say 86 % (used / (used + available), rounded up), not 95 %.
    kept_back = DiskUsage(total=1000, used=300, free=50)
    assert disk_space.used_percent(kept_back) == 86.0
    assert disk_space.used_percent(DiskUsage(total=1000, used=950, free=50)) == 95.0
    assert disk_space.used_percent(DiskUsage(total=0, used=0, free=0)) == 0.0
    guard = DiskSpaceGuard("/store", 90, usage=lambda path: kept_back, clock=lambda: 0.0)
    assert guard.refusal() is None

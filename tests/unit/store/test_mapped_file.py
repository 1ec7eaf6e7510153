"""MappedFile and MappedFileQueue: segments named by offset, lookups, flushes, cuts."""

from __future__ import annotations

import os

import pytest

from tidemq.errors import StoreError
from tidemq.store.mapped_file import MappedFile, file_name, parse_file_name
from tidemq.store.mapped_file_queue import MappedFileQueue

SIZE = 8192


def test_segments_are_named_by_their_20_digit_start_offset(tmp_path):
    assert file_name(1073741824) == "00000000001073741824"
    assert parse_file_name("00000000001073741824") == 1073741824
    assert parse_file_name("checkpoint") is None
    queue = MappedFileQueue(str(tmp_path), SIZE)
    queue.create_file(0)
    queue.create_file(SIZE)
    assert sorted(os.listdir(tmp_path)) == [file_name(0), file_name(SIZE)]
    assert all(os.path.getsize(tmp_path / name) == SIZE for name in os.listdir(tmp_path))
    queue.close()


def test_find_file_locates_every_offset_among_many_segments():
    queue = MappedFileQueue(None, 4096)
    for k in range(500):
        queue.create_file(k * 4096)
    queue.delete_first_files(100)
    assert queue.find_file(100 * 4096).file_from_offset == 100 * 4096
    assert queue.find_file(321 * 4096 + 4095).file_from_offset == 321 * 4096
    assert queue.find_file(99 * 4096) is None  # deleted
    assert queue.find_file(500 * 4096) is None  # past the end
    assert queue.min_offset() == 100 * 4096
    queue.close()


def test_flush_syncs_from_an_unaligned_point_and_stops_at_incomplete_segments(tmp_path):
    queue = MappedFileQueue(str(tmp_path), SIZE)
    first = queue.create_file(0)
    first.write(0, b"a" * 100)
    assert queue.flush() == 100
    first.write(100, b"b" * 5000)  # flushed position 100 is not page aligned
    second = queue.create_file(SIZE)
    second.write(0, b"c" * 10)
    # The first segment is not full: the flushed offset may not jump into the second.
    assert queue.flush() == 5100
    first.write(5100, b"d" * (SIZE - 5100))
    assert queue.flush() == SIZE + 10
    with open(tmp_path / file_name(0), "rb") as f:
        assert f.read(5100) == b"a" * 100 + b"b" * 5000
    queue.close()


def test_truncate_dirty_zeroes_the_rest_and_deletes_later_segments(tmp_path):
    queue = MappedFileQueue(str(tmp_path), SIZE)
    first = queue.create_file(0)
    first.write(0, b"x" * SIZE)
    second = queue.create_file(SIZE)
    second.write(0, b"y" * 300)
    second.buffer[4000:4010] = b"garbage!!!"  # beyond the write position
    queue.create_file(2 * SIZE)
    queue.truncate_dirty(SIZE + 100)
    assert [f.file_from_offset for f in queue.files] == [0, SIZE]
    assert second.write_position == 100
    assert second.data_end(0) == 100
    assert queue.max_offset() == SIZE + 100
    assert not os.path.exists(tmp_path / file_name(2 * SIZE))
    queue.close()


def test_delete_first_files_never_deletes_the_segment_being_written():
    queue = MappedFileQueue(None, 4096)
    for k in range(3):
        queue.create_file(k * 4096)
    assert len(queue.delete_first_files(10)) == 2
    assert [f.file_from_offset for f in queue.files] == [2 * 4096]
    queue.close()


def test_destroy_while_a_reader_holds_a_slice_frees_the_mapping_later(tmp_path):
    mapped = MappedFile.create(str(tmp_path), 0, SIZE)
    mapped.write(0, b"still readable")
    held = mapped.buffer[0:14]
    assert mapped.destroy() is False  # the slice keeps the mapping alive
    assert not os.path.exists(tmp_path / file_name(0))
    assert bytes(held) == b"still readable"
    held.release()


def test_open_refuses_a_segment_of_the_wrong_size(tmp_path):
    path = tmp_path / file_name(0)
    path.write_bytes(b"\0" * 100)
    with pytest.raises(StoreError) as raised:
        MappedFile.open(str(path), SIZE)
    assert "100 bytes" in str(raised.value) and str(SIZE) in str(raised.value)


def test_a_hole_in_the_segment_list_is_reported(tmp_path):
    queue = MappedFileQueue(str(tmp_path), SIZE)
    queue.create_file(0)
    queue.create_file(2 * SIZE)
    with pytest.raises(StoreError) as raised:
        queue.check_contiguous()
    assert file_name(2 * SIZE) in str(raised.value)
    queue.close()


def test_data_ranges_hold_every_written_byte_and_data_end_finds_the_last(tmp_path):
    # Written through the mapping at both ends of a 4 MiB segment, the middle never written:
    # whatever the file system reports as data, every written byte is inside a range, and
    # data_end and a record search over the ranges see what a whole scan would.
    size = 4 << 20
    mapped = MappedFile.create(str(tmp_path), 0, size)
    mapped.buffer[10:13] = b"abc"
    mapped.buffer[size - 5000 : size - 4990] = b"z" * 10
    ranges = mapped.data_ranges(0, size)
    assert ranges == sorted(ranges)
    for position in (10, 12, size - 5000, size - 4991):
        assert any(start <= position < end for start, end in ranges), (position, ranges)
    assert all(0 <= start < end <= size for start, end in ranges)
    assert mapped.data_end(0) == size - 4990
    assert mapped.data_end(0, size - 6000) == 13
    assert mapped.data_end(13, size - 6000) == 13  # all zero there
    assert mapped.data_end(11) == size - 4990
    assert mapped.data_ranges(5, 5) == []
    mapped.close()


def test_data_ranges_of_an_in_memory_segment_are_the_whole_span():
    mapped = MappedFileQueue(None, SIZE)
    segment = mapped.create_file(0)
    assert segment.data_ranges(100, SIZE) == [(100, SIZE)]
    segment.buffer[4000:4002] = b"hi"
    assert segment.data_end(0) == 4002
    mapped.close()

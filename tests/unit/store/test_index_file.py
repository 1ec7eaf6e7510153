"""The hash index: put keys, query by key and time, roll, reload, retention, on-disk bytes."""

import logging
import os
import struct
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import StoreError
from tidemq.protocol.message import java_string_hash
from tidemq.store.index_file import (
    ENTRY_RESERVE_CHUNK_BYTES,
    IndexService,
    index_file_size,
    index_key_hash,
)

SLOTS = 64
ENTRIES = 100  # entry 0 is never used: 99 keys per file
T0 = 1_700_000_000_000  # ms
FOREVER = (0, 2**62)


def reopen(tmp_path, *, clean_exit=True, checkpoint_ms=0):
    service = IndexService(tmp_path / "index", max_hash_slot_num=SLOTS, max_index_num=ENTRIES)
    service.load(clean_exit, checkpoint_ms)
    return service


new_service = reopen


def index_files(tmp_path):
    return sorted(p for p in (tmp_path / "index").iterdir())


# -- an independent reader, written from docs/protocol.md §10.3, not from the module --------------


def read_index_file(path, slots=SLOTS, entries=ENTRIES):
    data = path.read_bytes()
    assert len(data) == 40 + slots * 4 + entries * 20
    begin_ts, end_ts, begin_off, end_off, slot_count, index_count = struct.unpack(
        ">qqqqii", data[:40]
    )
    slot_values = struct.unpack(f">{slots}i", data[40 : 40 + slots * 4])
    base = 40 + slots * 4
    decoded = [
        struct.unpack(">iqii", data[base + n * 20 : base + n * 20 + 20]) for n in range(index_count)
    ]
    return {
        "begin_ts": begin_ts,
        "end_ts": end_ts,
        "begin_offset": begin_off,
        "end_offset": end_off,
        "slot_count": slot_count,
        "index_count": index_count,
        "slots": slot_values,
        "entries": decoded,  # (keyHash, phyOffset, timeDiff, prevIndex); entry 0 unused
    }


def java_key_hash(key):
    value = java_string_hash(key)
    return 0 if value == -(2**31) else abs(value)


# -- put and query ------------------------------------------------------------------------------


def test_put_then_query_finds_each_key(tmp_path):
    index = new_service(tmp_path)
    index.put("Orders", ["uniq-1", "o-42"], 0, T0)
    index.put("Orders", ["uniq-2", "o-43"], 250, T0 + 10)
    index.put("Refunds", ["uniq-3", "o-42"], 500, T0 + 20)

    assert index.query("Orders", "o-42", 32, *FOREVER) == [0]
    assert index.query("Orders", "uniq-2", 32, *FOREVER) == [250]
    assert index.query("Refunds", "o-42", 32, *FOREVER) == [500]
    assert index.query("Orders", "o-44", 32, *FOREVER) == []
    assert index.query("Payments", "o-42", 32, *FOREVER) == []
    assert index.last_update_physical_offset == 500
    assert index.last_update_timestamp_ms == T0 + 20


def test_same_key_on_many_messages_newest_first_up_to_max_count(tmp_path):
    index = new_service(tmp_path)
    for n in range(10):
        index.put("Orders", ["customer-7"], n * 100, T0 + n * 1000)
    assert index.query("Orders", "customer-7", 32, *FOREVER) == [n * 100 for n in range(9, -1, -1)]
    assert index.query("Orders", "customer-7", 3, *FOREVER) == [900, 800, 700]
    assert index.query("Orders", "customer-7", 0, *FOREVER) == []


def test_keys_sharing_a_slot_are_told_apart_by_hash(tmp_path):
    index = new_service(tmp_path)
    # 60 keys over 64 slots: many chains hold several keys.
    keys = [f"key-{n}" for n in range(60)]
    slots = {index_key_hash(f"Orders#{k}") % SLOTS for k in keys}
    assert len(slots) < len(keys)  # collisions in slots happened
    for n, key in enumerate(keys):
        index.put("Orders", [key], n * 10, T0 + n)
    for n, key in enumerate(keys):
        assert index.query("Orders", key, 32, *FOREVER) == [n * 10]


def test_true_hash_collisions_are_returned_for_the_caller_to_filter(tmp_path):
    # "Aa" and "BB" have the same Java hashCode, so "T#Aa" and "T#BB" share a keyHash.
    assert index_key_hash("T#Aa") == index_key_hash("T#BB")
    index = new_service(tmp_path)
    index.put("T", ["Aa"], 0, T0)
    index.put("T", ["BB"], 100, T0)
    assert index.query("T", "Aa", 32, *FOREVER) == [100, 0]


def test_duplicate_keys_of_one_message_give_one_offset(tmp_path):
    index = new_service(tmp_path)
    index.put("T", ["k", "k", "", "k"], 40, T0)
    assert index.query("T", "k", 32, *FOREVER) == [40]


def test_a_message_with_many_keys_stores_each_key_s_java_hash(tmp_path):
    # A trace message is indexed by every msg id it holds (dozens to hundreds): its keys are
    # hashed together, and each entry must hold what one-at-a-time hashing gives, odd keys
    # (non-ASCII, a shared head, other lengths) among them.
    keys = [f"7F00000100002A9F0000{n:012X}" for n in range(40)] + ["bestellung-ä", "k", "x y"]
    index = reopen(tmp_path)
    index.put("RMQ_SYS_TRACE_TOPIC", keys, 5000, T0)
    index.flush()
    (path,) = index_files(tmp_path)
    entries = read_index_file(path)["entries"][1:]
    assert [entry[0] for entry in entries] == [
        java_key_hash(f"RMQ_SYS_TRACE_TOPIC#{key}") for key in keys]
    assert {entry[1] for entry in entries} == {5000}
    assert index.query("RMQ_SYS_TRACE_TOPIC", "bestellung-ä", 4, *FOREVER) == [5000]


def test_time_window_filters_entries(tmp_path):
    index = new_service(tmp_path)
    for n in range(5):  # one message every 10 s
        index.put("T", ["k"], n * 100, T0 + n * 10_000)
    assert index.query("T", "k", 32, T0 + 10_000, T0 + 30_000) == [300, 200, 100]
    assert index.query("T", "k", 32, T0 + 41_000, T0 + 90_000) == []
    assert index.query("T", "k", 32, T0 - 5000, T0 + 5000) == [0]
    assert index.query("T", "k", 32, T0 + 30_000, T0 + 10_000) == []  # end before begin


def test_entry_time_is_stored_in_whole_seconds(tmp_path):
    index = new_service(tmp_path)
    index.put("T", ["first"], 0, T0)
    index.put("T", ["k"], 100, T0 + 2500)  # stored as 2 s after the file's begin
    assert index.query("T", "k", 32, T0 + 2000, T0 + 2000) == [100]
    assert index.query("T", "k", 32, T0 + 2500, T0 + 3000) == []


def test_redispatch_of_indexed_messages_is_ignored(tmp_path):
    index = new_service(tmp_path)
    index.put("T", ["k"], 0, T0)  # offset 0 is a real message, the first of the commit log
    index.put("T", ["k"], 100, T0)
    index.put("T", ["k"], 100, T0)  # re-dispatch of the same message
    index.put("T", ["k"], 50, T0)  # anything at or below the last indexed offset
    assert index.query("T", "k", 32, *FOREVER) == [100, 0]
    (path,) = index_files(tmp_path)
    assert read_index_file(path)["index_count"] == 3


def test_messages_without_keys_create_no_file(tmp_path):
    index = new_service(tmp_path)
    index.put("T", [], 0, T0)
    index.put("T", ["", ""], 10, T0)
    assert index_files(tmp_path) == []
    assert index.last_update_physical_offset == -1
    assert index.last_update_timestamp_ms == 0
    index.put("T", ["k"], 10, T0)  # the keyless messages did not advance the offset
    assert index.query("T", "k", 32, *FOREVER) == [10]


# -- the bytes on disk --------------------------------------------------------------------------


def test_file_layout_matches_rocketmq(tmp_path):
    index = new_service(tmp_path)
    index.put("T", ["a"], 1000, T0 + 500)
    index.put("T", ["b"], 2000, T0 + 3700)
    index.put("T", ["a"], 3000, T0 + 9999)
    index.flush()
    (path,) = index_files(tmp_path)
    assert len(path.name) == 17 and path.name.isdigit()  # yyyyMMddHHmmssSSS
    assert path.stat().st_size == index_file_size(SLOTS, ENTRIES) == 40 + 64 * 4 + 100 * 20

    f = read_index_file(path)
    assert f["begin_ts"] == T0 + 500
    assert f["end_ts"] == T0 + 9999
    assert f["begin_offset"] == 1000
    assert f["end_offset"] == 3000
    assert f["index_count"] == 4  # starts at 1
    hash_a, hash_b = java_key_hash("T#a"), java_key_hash("T#b")
    assert f["slot_count"] == len({hash_a % SLOTS, hash_b % SLOTS})
    assert f["entries"][0] == (0, 0, 0, 0)
    assert f["entries"][1] == (hash_a, 1000, 0, 0)
    assert f["entries"][2][:3] == (hash_b, 2000, 3)  # (3700 - 500) // 1000 s
    assert f["entries"][3] == (hash_a, 3000, 9, 1)  # chained to the older "a"
    assert f["slots"][hash_a % SLOTS] == 3
    assert f["slots"][hash_b % SLOTS] == 2
    used = {hash_a % SLOTS, hash_b % SLOTS}
    assert all(value == 0 for slot, value in enumerate(f["slots"]) if slot not in used)


def test_default_sized_file_reserves_its_slots_and_first_entries_not_all_of_it(tmp_path):
    index = IndexService(tmp_path / "index")
    index.load(True, 0)
    index.put("T", ["k"], 0, T0)
    index.flush()
    (path,) = index_files(tmp_path)
    assert path.stat().st_size == 420_000_040
    # Header and slots (written at random) are reserved whole, entries a chunk at a time,
    # so a full disk cannot fault a write through the mapping; the rest stays sparse.
    held = path.stat().st_blocks * 512
    assert 20_000_040 <= held <= 20_000_040 + ENTRY_RESERVE_CHUNK_BYTES + 8192
    assert index.query("T", "k", 1, *FOREVER) == [0]
    index.close()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_key_hash_is_abs_of_java_hash_code(key):
    assert index_key_hash(key) == java_key_hash(key)


def test_key_hash_of_min_value_is_zero():
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert index_key_hash("polygenelubricants") == 0
    assert index_key_hash("TagA") == 2598919


# -- rolling, reopening, crashes ----------------------------------------------------------------


def test_full_file_rolls_to_a_new_one(tmp_path):
    index = new_service(tmp_path)
    for n in range(250):  # 99 keys per file: three files
        index.put("T", [f"k{n}"], n * 10, T0 + n * 1000)
    files = index_files(tmp_path)
    assert len(files) == 3
    assert index.file_paths == files
    headers = [read_index_file(p) for p in files]
    assert [h["index_count"] for h in headers] == [100, 100, 53]
    assert [h["begin_offset"] for h in headers] == [0, 990, 1980]
    assert [h["end_offset"] for h in headers] == [980, 1970, 2490]
    for n in (0, 98, 99, 150, 249):
        assert index.query("T", f"k{n}", 32, *FOREVER) == [n * 10]


def test_one_key_spanning_files_is_found_in_all_of_them(tmp_path):
    index = new_service(tmp_path)
    for n in range(120):
        index.put("T", ["hot", f"k{n}"], n * 10, T0 + n * 1000)
    assert len(index_files(tmp_path)) == 3
    assert index.query("T", "hot", 200, *FOREVER) == [n * 10 for n in range(119, -1, -1)]
    assert index.query("T", "hot", 5, *FOREVER) == [1190, 1180, 1170, 1160, 1150]
    # Only the files overlapping the window are read; old entries outside it stay out.
    assert index.query("T", "hot", 200, T0 + 100_000, T0 + 105_000) == [
        1050,
        1040,
        1030,
        1020,
        1010,
        1000,
    ]


def test_message_whose_keys_straddle_a_full_file(tmp_path):
    index = new_service(tmp_path)
    for n in range(49):  # 98 keys: one entry left
        index.put("T", [f"a{n}", f"b{n}"], n * 10, T0)
    index.put("T", ["x", "y", "z"], 1000, T0 + 1000)
    assert len(index_files(tmp_path)) == 2
    for key in "xyz":
        assert index.query("T", key, 32, *FOREVER) == [1000]
    assert index.last_update_physical_offset == 1000


def test_clean_reopen_keeps_everything(tmp_path):
    index = new_service(tmp_path)
    for n in range(150):
        index.put("T", [f"k{n}"], n * 10, T0 + n * 1000)
    index.close()

    index = reopen(tmp_path)
    assert index.last_update_physical_offset == 1490
    assert index.last_update_timestamp_ms == T0 + 149_000
    assert index.query("T", "k3", 32, *FOREVER) == [30]
    assert index.query("T", "k140", 32, *FOREVER) == [1400]
    index.put("T", ["k3"], 1490, T0 + 150_000)  # already indexed: ignored
    index.put("T", ["k3"], 1500, T0 + 150_000)
    assert index.query("T", "k3", 32, *FOREVER) == [1500, 30]
    assert len(index_files(tmp_path)) == 2  # appended to the existing second file
    index.close()


def test_reopen_with_only_the_newest_file_keeps_its_end_offset(tmp_path):
    index = new_service(tmp_path)
    for n in range(99):
        index.put("T", [f"k{n}"], n * 10, T0 + n)
    index.put("T", ["last"], 990, T0 + 5000)  # rolls, then fills one entry of file 2
    files = index_files(tmp_path)
    index.close()
    os.unlink(files[0])  # leave only the newer file
    index = reopen(tmp_path)
    assert index.last_update_physical_offset == 990
    assert index.query("T", "last", 32, *FOREVER) == [990]


def test_unclean_load_deletes_files_newer_than_the_checkpoint(tmp_path, caplog):
    index = new_service(tmp_path)
    for n in range(250):
        index.put("T", [f"k{n}"], n * 10, T0 + n * 1000)
    index.close()
    first, second, third = index_files(tmp_path)
    checkpoint_ms = read_index_file(first)["end_ts"]  # the first file was flushed, others not

    with caplog.at_level(logging.WARNING, logger="tidemq.store.index_file"):
        index = reopen(tmp_path, clean_exit=False, checkpoint_ms=checkpoint_ms)
    assert index_files(tmp_path) == [first]
    assert second.name in caplog.text and third.name in caplog.text
    assert index.last_update_physical_offset == 980
    assert index.query("T", "k5", 32, *FOREVER) == [50]
    assert index.query("T", "k120", 32, *FOREVER) == []
    # Re-dispatch from the recovery point indexes the lost messages again.
    for n in range(95, 250):
        index.put("T", [f"k{n}"], n * 10, T0 + n * 1000)
    assert index.query("T", "k120", 32, *FOREVER) == [1200]
    assert index.query("T", "k97", 32, *FOREVER) == [970]  # indexed once, not twice
    index.close()


def test_clean_load_ignores_the_checkpoint(tmp_path):
    index = new_service(tmp_path)
    index.put("T", ["k"], 0, T0)
    index.close()
    index = reopen(tmp_path, clean_exit=True, checkpoint_ms=0)
    assert index.query("T", "k", 32, *FOREVER) == [0]


def test_zeroed_index_file_loads_as_empty(tmp_path):
    index = new_service(tmp_path)
    index.put("T", ["k"], 0, T0)
    index.close()
    (path,) = index_files(tmp_path)
    path.write_bytes(bytes(path.stat().st_size))
    index = reopen(tmp_path)
    assert index.query("T", "k", 32, *FOREVER) == []
    index.put("T", ["k"], 10, T0)
    assert index.query("T", "k", 32, *FOREVER) == [10]


def test_damaged_header_drops_the_file_with_a_warning(tmp_path, caplog):
    index = new_service(tmp_path)
    index.put("T", ["k"], 0, T0)
    index.close()
    (path,) = index_files(tmp_path)
    with open(path, "r+b") as f:
        f.seek(36)
        f.write(struct.pack(">i", 10_000_000))  # indexCount far past max_index_num
    with caplog.at_level(logging.WARNING, logger="tidemq.store.index_file"):
        index = reopen(tmp_path)
    assert "damaged header" in caplog.text and path.name in caplog.text
    assert index_files(tmp_path) == []
    index.put("T", ["k"], 10, T0)
    assert index.query("T", "k", 32, *FOREVER) == [10]


def test_garbage_entries_never_break_a_query(tmp_path):
    index = new_service(tmp_path)
    for n in range(50):
        index.put("T", [f"k{n}"], n * 10, T0 + n * 1000)
    index.close()
    (path,) = index_files(tmp_path)
    data = bytearray(path.read_bytes())
    data[40:] = os.urandom(len(data) - 40)  # slots and entries overwritten, header intact
    path.write_bytes(bytes(data))
    index = reopen(tmp_path)
    for n in range(50):
        assert len(index.query("T", f"k{n}", 32, *FOREVER)) <= 32


def test_file_size_that_disagrees_with_settings_is_dropped_for_a_rebuild(tmp_path, caplog):
    index = new_service(tmp_path)
    index.put("T", ["k"], 0, T0)
    index.close()
    other = IndexService(tmp_path / "index", max_hash_slot_num=128, max_index_num=ENTRIES)
    other.load(True, 0)
    # Derived data: the file goes (named, with the settings), and the store rebuilds the
    # index from the commit log (recovery.py); no query finds the old key meanwhile.
    (problem,) = other.load_problems
    assert "maxHashSlotNum=128" in problem and "cut short, or written with other" in problem
    assert index_files(tmp_path) == []
    assert other.query("T", "k", 10, *FOREVER) == []
    other.close()


# -- retention and lifecycle --------------------------------------------------------------------


def test_delete_files_below_removes_old_whole_files_only(tmp_path):
    index = new_service(tmp_path)
    for n in range(250):
        index.put("T", [f"k{n}"], n * 10, T0 + n * 1000)
    _, second, third = index_files(tmp_path)

    assert index.delete_files_below(980) == 0  # the first file ends at 980
    assert index.delete_files_below(981) == 1
    assert index_files(tmp_path) == [second, third]
    assert index.query("T", "k5", 32, *FOREVER) == []
    assert index.query("T", "k150", 32, *FOREVER) == [1500]
    # The file being written survives even when all of it is below the minimum.
    assert index.delete_files_below(10**9) == 1
    assert index_files(tmp_path) == [third]
    assert index.query("T", "k249", 32, *FOREVER) == [2490]
    index.put("T", ["after"], 2500, T0 + 250_000)
    assert index.query("T", "after", 32, *FOREVER) == [2500]


def test_destroy_removes_every_file_and_starts_over(tmp_path):
    index = new_service(tmp_path)
    for n in range(150):
        index.put("T", [f"k{n}"], n * 10, T0)
    index.destroy()
    assert index_files(tmp_path) == []
    assert index.last_update_physical_offset == -1
    assert index.query("T", "k1", 32, *FOREVER) == []
    index.put("T", ["k1"], 0, T0)
    assert index.query("T", "k1", 32, *FOREVER) == [0]


def test_flush_reports_the_flushed_time_for_the_checkpoint(tmp_path):
    index = new_service(tmp_path)
    index.put("T", ["k"], 0, T0)
    assert index.last_flushed_timestamp_ms == 0
    index.flush()
    assert index.last_flushed_timestamp_ms == T0
    index.put("T", ["k"], 10, T0 + 5)
    assert index.last_flushed_timestamp_ms == T0
    assert index.last_update_timestamp_ms == T0 + 5


def test_closed_service_refuses_work(tmp_path):
    index = new_service(tmp_path)
    index.put("T", ["k"], 0, T0)
    index.close()
    index.close()  # twice is fine
    with pytest.raises(StoreError, match="closed"):
        index.put("T", ["k"], 10, T0)
    with pytest.raises(StoreError, match="closed"):
        index.query("T", "k", 32, *FOREVER)


def test_failed_flush_raises_and_is_retried(tmp_path, monkeypatch):
    index = new_service(tmp_path)
    index.put("T", ["k"], 0, T0)

    def broken_disk(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_disk)
    with pytest.raises(StoreError, match="cannot flush index files"):
        index.flush()
    assert index.last_flushed_timestamp_ms == 0  # nothing may be checkpointed yet
    monkeypatch.undo()
    index.flush()
    assert index.last_flushed_timestamp_ms == T0


def test_puts_queries_and_flushes_from_different_threads(tmp_path):
    index = new_service(tmp_path)
    errors = []

    def dispatch():
        for n in range(600):
            index.put("T", [f"k{n}", "hot"], n * 10, T0 + n * 100)

    def read_and_flush():
        try:
            for _ in range(200):
                for offset in index.query("T", "hot", 5, *FOREVER):
                    assert offset % 10 == 0
                index.flush()
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=dispatch), threading.Thread(target=read_and_flush)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(index_files(tmp_path)) == 13  # 1200 keys, 99 per file
    assert all(index.query("T", f"k{n}", 32, *FOREVER) == [n * 10] for n in range(600))
    index.close()

"""A prepared index: its first file made ahead, every new file's slot table faulted in by a
thread, so a new file's first keys take no page fault on the appending thread."""

import random
import resource
import sys

import pytest

from tidemq.store.config import StoreConfig
from tidemq.store.file_store import FileMessageStore
from tidemq.store.index_file import IndexService
from tidemq.store.interface import StoreMessage

# A slot table of ~980 pages: enough for a few hundred new keys to land on pages of their own.
SLOTS = 1_000_000
ENTRIES = 50_000
T0 = 1_700_000_000_000
FOREVER = (0, 2**62)
WAIT_BOUND_S = 30.0

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="counts this thread's page faults (Linux RUSAGE_THREAD)")


def service(path, *, prepared):
    index = IndexService(path, max_hash_slot_num=SLOTS, max_index_num=ENTRIES)
    index.load(True, 0)
    if prepared:
        index.prepare()
        assert index.wait_prepared(WAIT_BOUND_S)
    return index


def faults_putting(index, first, count):
    """This thread's minor page faults while ``count`` new keys are put (one message each).

    The keys are random, as users' KEYS (order ids) are, so their slots spread over the
    table; a producer's UNIQ_KEYs differ in their last digits only and land near each other.
    """
    keys = [f"{random.Random(n).getrandbits(64):016x}" for n in range(first, first + count)]
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for n, key in enumerate(keys, first):
        index.put("T", [key], 1000 + n * 100, T0 + n)
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def test_prepare_makes_the_first_file_before_any_key_and_it_serves_as_one(tmp_path):
    index = service(tmp_path / "index", prepared=True)
    assert len(index.file_paths) == 1
    assert index.last_update_physical_offset == -1
    index.put("T", ["a"], 1000, T0)
    assert len(index.file_paths) == 1
    assert index.query("T", "a", 10, *FOREVER) == [1000]
    index.close()
    again = service(tmp_path / "index", prepared=False)
    assert again.query("T", "a", 10, *FOREVER) == [1000]
    assert again.last_update_physical_offset == 1000
    again.close()


def test_an_unwritten_prepared_file_reloads_as_an_empty_index(tmp_path):
    service(tmp_path / "index", prepared=True).close()
    index = service(tmp_path / "index", prepared=True)
    assert len(index.file_paths) == 1  # the same file, no second one
    assert index.last_update_physical_offset == -1
    assert index.query("T", "a", 10, *FOREVER) == []
    index.close()


@linux_only
def test_a_prepared_file_takes_no_page_fault_for_a_new_hash_slot(tmp_path):
    lazy = service(tmp_path / "lazy", prepared=False)
    prepared = service(tmp_path / "prepared", prepared=True)
    try:
        if not prepared.populated_files:
            pytest.skip("the kernel cannot fault a range in ahead (MADV_POPULATE_WRITE needs "
                        "Linux 5.14+)")
        # The same code paths warmed in both (and the lazy one's file made) before counting.
        faults_putting(lazy, 0, 20)
        faults_putting(prepared, 0, 20)
        lazy_faults = faults_putting(lazy, 20, 400)
        prepared_faults = faults_putting(prepared, 20, 400)
    finally:
        lazy.close()
        prepared.close()
    # ~400 keys on ~980 slot pages: the lazy file faults on most new pages (~330).
    assert lazy_faults >= 200, lazy_faults
    assert prepared_faults <= 40, (prepared_faults, lazy_faults)


def test_a_rolled_file_of_a_prepared_index_is_faulted_in_too(tmp_path):
    index = IndexService(tmp_path / "index", max_hash_slot_num=64, max_index_num=3)
    index.load(True, 0)
    index.prepare()
    for n in range(5):  # two keys a file: three files
        index.put("T", [f"k{n}"], 1000 + n, T0 + n)
    assert index.wait_prepared(WAIT_BOUND_S)
    assert len(index.file_paths) == 3
    assert index.populated_files in (0, 3)  # all of them, or none where the kernel cannot
    assert index.query("T", "k4", 10, *FOREVER) == [1004]
    index.close()


def test_closing_while_a_file_is_faulted_in_waits_for_it(tmp_path):
    index = IndexService(tmp_path / "index", max_hash_slot_num=SLOTS, max_index_num=ENTRIES)
    index.load(True, 0)
    index.prepare()
    index.close()  # at once: close takes the file's populate lock before unmapping
    assert index.wait_prepared(WAIT_BOUND_S)


def test_a_file_store_prepared_for_writes_has_its_index_file_before_the_first_message(tmp_path):
    config = StoreConfig(store_path_root_dir=str(tmp_path / "store"),
                         mapped_file_size_commit_log=1 << 20,
                         mapped_file_size_consume_queue=20 * 1024,
                         max_hash_slot_num=1024, max_index_num=4096)
    store = FileMessageStore(config)
    try:
        assert list((tmp_path / "store" / "index").iterdir()) == []  # lazy unless asked
        store.prepare_for_writes()
        assert len(list((tmp_path / "store" / "index").iterdir())) == 1
        store.put_message(StoreMessage("T", 0, b"x", {"KEYS": "k1"}, born_timestamp=T0,
                                       born_host="127.0.0.1:50000"))
        assert len(list((tmp_path / "store" / "index").iterdir())) == 1
        assert store.query_messages("T", "k1", 10, *FOREVER).records
    finally:
        store.close()

"""The broker's open-file budget: the soft limit raised at start, numbers when it is low."""

import errno
import logging
import resource

import pytest

from tidemq.store import open_files


@pytest.fixture
def limits(monkeypatch):
    """Stands in for the process's RLIMIT_NOFILE: ``limits["now"] = (soft, hard)``."""
    state = {"now": (1024, 4096), "refuse": False}

    def getrlimit(which):
        assert which == resource.RLIMIT_NOFILE
        return state["now"]

    def setrlimit(which, value):
        assert which == resource.RLIMIT_NOFILE
        if state["refuse"]:
            raise ValueError("not allowed to raise maximum limit")
        state["now"] = value

    monkeypatch.setattr(resource, "getrlimit", getrlimit)
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    return state


def test_soft_limit_is_raised_to_the_hard_limit(limits, caplog):
    with caplog.at_level(logging.INFO, "tidemq.store"):
        limit = open_files.raise_open_file_limit()
    assert limit == open_files.OpenFileLimit(1024, 4096, 4096)
    assert limit.raised
    assert limits["now"] == (4096, 4096)
    assert "from 1024 to the hard limit 4096" in caplog.text


def test_a_refused_raise_keeps_the_soft_limit_and_warns(limits, caplog):
    limits["refuse"] = True
    limit = open_files.raise_open_file_limit()
    assert limit == open_files.OpenFileLimit(1024, 1024, 4096)
    assert not limit.raised
    assert "ulimit -n 4096" in caplog.text


def test_a_low_limit_is_reported_with_the_numbers():
    low = open_files.OpenFileLimit(1024, 1024, 1024)
    warning = open_files.open_file_shortage(low, 900)
    assert warning is not None
    assert "open-file limit is 1024 (hard limit 1024)" in warning
    assert "holds 900 descriptors" in warning
    assert "at least 3848" in warning  # (900 + 1024 for connections) * 2
    assert open_files.open_file_shortage(open_files.OpenFileLimit(1024, 65536, 65536),
                                         900) is None
    unlimited = resource.RLIM_INFINITY
    assert open_files.open_file_shortage(
        open_files.OpenFileLimit(unlimited, unlimited, unlimited), 10**6) is None


def test_a_descriptor_shortage_is_described_with_the_limit_and_the_fix(limits):
    limits["now"] = (1024, 1024)
    error = OSError(errno.EMFILE, "Too many open files")
    assert open_files.is_open_file_shortage(error)
    assert not open_files.is_open_file_shortage(OSError(errno.ENOSPC, "No space left"))
    text = open_files.describe_open_file_error("cannot create consume queue T/7", error)
    assert text.startswith("cannot create consume queue T/7: too many open files")
    assert "all 1024 file descriptors" in text
    assert "ulimit -n" in text


_PUT_TO_MANY_QUEUES = """
import resource, sys
from tidemq.store.config import StoreConfig
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import StoreMessage
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (150, hard))
store = FileMessageStore(StoreConfig(
    store_path_root_dir=sys.argv[1], mapped_file_size_commit_log=8 << 20,
    mapped_file_size_consume_queue=20 * 1024, max_hash_slot_num=1024, max_index_num=4096))
def put(queue_id):
    return store.put_message(StoreMessage("Wide", queue_id, b"x", {}, born_timestamp=1,
                                          born_host="127.0.0.1:1"))
for queue_id in range(1024):
    result = put(queue_id)
    if result.status.name != "PUT_OK":
        print("REFUSED", queue_id, result.status.name, result.remark)
        break
print("OLD_QUEUE", put(0).status.name)
store.close()
"""


def test_a_store_out_of_descriptors_refuses_new_queues_with_the_limit_and_the_fix(tmp_path):
    """Each mapped queue file holds a descriptor: past the limit a put to a new queue is
    refused with a remark naming the limit and how to raise it (no OSError escapes), and
    queues that exist keep working."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _PUT_TO_MANY_QUEUES, str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    refused = next(line for line in done.stdout.splitlines() if line.startswith("REFUSED"))
    assert "too many open files" in refused
    assert "open-file limit allows" in refused
    assert "ulimit -n" in refused
    assert "OLD_QUEUE PUT_OK" in done.stdout
    assert "Traceback" not in done.stderr

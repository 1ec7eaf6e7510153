"""``tidemq dev`` on an empty folder is light: well under 200 MB on disk by its first message
(the store's reserved segments, the index) and no gigabyte of zeros written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from server_processes import DevBrokerPorts
from tidemq.sync import Message, Producer

pytestmark = pytest.mark.integration

FIRST_START_BYTES_MAX = 200 * 1000 * 1000


def allocated_bytes(folder: Path) -> int:
    """Disk blocks held by every file under ``folder`` (reserved or written, not holes)."""
    return sum(os.stat(os.path.join(root, name)).st_blocks * 512
               for root, _, names in os.walk(folder) for name in names)


def written_bytes(pid: int) -> int | None:
    """Bytes the process sent to storage (/proc/<pid>/io), None where the kernel hides it."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def start_dev(tidemq_server, name: str, store: Path, *extra: str):
    broker_port = DevBrokerPorts()

    def make_args(port: int) -> list[str]:
        return ["--namesrvPort", str(port), "--listenPort", str(broker_port(port)),
                "--storePathRootDir", str(store), "--consolePort", "0", *extra]

    dev = tidemq_server("dev", name, make_args)
    dev.start()
    return dev


def test_dev_writes_less_than_200_mb_before_its_first_message(tidemq_server, tmp_path):
    store = tmp_path / "data"
    dev = start_dev(tidemq_server, "dev", store)
    with Producer("first-start", dev.addr) as producer:
        assert producer.send(Message("FirstTopic", b"hello")).msg_id
    assert allocated_bytes(store) < FIRST_START_BYTES_MAX, sorted(
        (str(path), path.stat().st_blocks * 512) for path in store.rglob("*") if path.is_file())
    written = written_bytes(dev.pid)
    assert written is None or written < FIRST_START_BYTES_MAX
    segments = sorted((store / "commitlog").iterdir())
    assert {segment.stat().st_size for segment in segments} == {64 * 1024 * 1024}


def test_dev_keeps_the_segment_size_of_an_existing_store(tidemq_server, tmp_path):
    store = tmp_path / "data"
    small = str(16 * 1024 * 1024)
    first = start_dev(tidemq_server, "first", store, "--mappedFileSizeCommitLog",
                      small)
    with Producer("existing-store", first.addr) as producer:
        producer.send(Message("Existing", b"before"))
    assert first.stop() == 0
    again = start_dev(tidemq_server, "again", store)  # no size given: the store's own
    with Producer("existing-store", again.addr) as producer:
        producer.send(Message("Existing", b"after"))
    sizes = {segment.stat().st_size for segment in (store / "commitlog").iterdir()}
    assert sizes == {int(small)}

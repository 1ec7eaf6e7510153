"""Deleted, truncated and zeroed consume-queue and index files under a real broker's store,
after a clean stop and after SIGKILL: ``tidemq store check`` finds each damage first (exit 1,
naming it), then a broker started on the damaged store serves every acknowledged message and
finds them by key (the derived files are rebuilt from the commit log).

The store is written once by a real broker and copied per case (small segments, small
messages).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import written_store

from server_processes import ServerProcess, option_args
from tidemq.sync import Admin, Message, PullConsumer

pytestmark = pytest.mark.reliability

TOPIC = "Derived"
QUEUES = 2
MESSAGES = 300
SETTINGS = {
    "mappedFileSizeCommitLog": str(32 * 1024),
    "mappedFileSizeConsumeQueue": str(50 * 20),  # several queue segments per queue
    "maxHashSlotNum": "500",
    "maxIndexNum": "2000",
}
WAIT_S = written_store.WAIT_S


def body(index: int) -> bytes:
    return f"derived-{index:05d}".encode().ljust(60, b"-")


def wait_for_route(namesrv: str, create: bool) -> list:
    return written_store.wait_for_route(namesrv, TOPIC, QUEUES, create)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(namesrv process, {"sigkill": store copy, "clean": store copy}, acked bodies)."""
    yield from written_store.written_store_copies(
        tmp_path_factory.mktemp("derived"), SETTINGS, TOPIC, QUEUES, "derived_producer",
        [Message(TOPIC, body(i), keys=[f"key-{i}"]) for i in range(MESSAGES)])


def damage(store: Path, part: str, how: str) -> str:
    """Damage one file of ``part`` (queue 1's middle segment, or the index); return its path."""
    if part == "consume queue":
        files = sorted((store / "consumequeue" / TOPIC / "1").iterdir())
        target = files[len(files) // 2]
    else:
        (target,) = sorted((store / "index").iterdir())
    if how == "deleted":
        target.unlink()
    elif how == "truncated":
        os.truncate(target, target.stat().st_size // 2 + 7)
    else:
        with open(target, "r+b") as f:
            f.write(bytes(target.stat().st_size))
    return str(target)


def store_check(store: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq", "store", "check", str(store),
         "--max-hash-slot-num", SETTINGS["maxHashSlotNum"],
         "--max-index-num", SETTINGS["maxIndexNum"]],
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("stop", ["clean", "sigkill"])
@pytest.mark.parametrize("how", ["deleted", "truncated", "zeroed"])
@pytest.mark.parametrize("part", ["consume queue", "index"])
def test_damaged_derived_files_are_found_by_check_and_rebuilt_by_the_broker(
    written, tmp_path, part, how, stop
):
    namesrv, bases, acked = written
    store = tmp_path / "store"
    shutil.copytree(bases[stop], store)
    assert store_check(store).returncode == 0, store_check(store).stdout
    target = damage(store, part, how)
    checked = store_check(store)
    assert checked.returncode == 1, checked.stdout
    assert (part == "index" and "index" in checked.stdout) or (
        (part == "consume queue" and "consume queue" in checked.stdout)
        or os.path.basename(target) in checked.stdout
    ), checked.stdout
    broker = ServerProcess(
        "broker", "broker-case", tmp_path / "broker-case",
        lambda port: [
            *option_args({**SETTINGS, "brokerName": "broker-a", "listenPort": port,
                          "storePathRootDir": store}),
            "-n", namesrv.addr,
        ],
        port_neighbours=(-2, 1),
    )
    try:
        broker.start()
        queues = wait_for_route(namesrv.addr, create=False)
        got: set[bytes] = set()
        with PullConsumer(f"derived_{part.replace(' ', '_')}_{how}_{stop}", namesrv.addr,
                          consume_from="FIRST") as consumer:
            consumer.assign(queues)
            deadline = time.monotonic() + WAIT_S
            while not acked <= got and time.monotonic() < deadline:
                got.update(m.body for m in consumer.poll(300))
        missing = acked - got
        assert not missing, f"{len(missing)} not served\n{broker.log_tail(40)}"
        with Admin(namesrv.addr) as admin:
            for index in (3, MESSAGES - 1):
                found = admin.query_message_by_key(TOPIC, f"key-{index}")
                assert [m.body for m in found] == [body(index)], broker.log_tail(40)
    finally:
        broker.stop()

"""A full disk under a running broker: it answers SERVICE_NOT_AVAILABLE (14), stays up, keeps
serving reads, takes writes again once space is freed, and loses no acknowledged message.

The store lives on a small tmpfs this test mounts (we run as root; without permission to
mount, the test is skipped and says why). A filler file written from outside the broker fills
the volume while a producer sends; removing it frees the space. The volume is unmounted at
the end even when the test fails (after the broker is stopped: fixtures tear down in reverse).
"""

from __future__ import annotations

import errno
import os
import subprocess
import threading
import time

import pytest

from tidemq.client import BrokerRejected, NoRouteError
from tidemq.protocol.codes import ResponseCode
from tidemq.sync import Admin, Message, Producer, PullConsumer, SendStatus

pytestmark = pytest.mark.reliability

TOPIC = "FullDisk"
VOLUME_MIB = 48
BODY_SIZE = 700
WAIT_S = 60.0  # bounds on waits for a busy machine; never asserted as durations


@pytest.fixture
def small_volume(tmp_path):
    mount_point = tmp_path / "volume"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={VOLUME_MIB}m", "tmpfs", str(mount_point)],
        capture_output=True, text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(
            "the full-disk test mounts a small tmpfs and needs root with mount permission: "
            f"mount said {mounted.stderr.strip() or mounted.returncode!r}"
        )
    try:
        yield mount_point
    finally:
        # Lazy: the broker is stopped by now, but a late file handle must not keep it mounted.
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def fill(path: str) -> int:
    """Write a file until the volume says ENOSPC; return its size."""
    written = 0
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 64 << 10, 4 << 10):
            block = b"\xff" * chunk
            while True:
                try:
                    written += f.write(block)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    return written


def wait_for_route(namesrv: str) -> list:
    with Admin(namesrv) as admin:
        admin.create_topic(TOPIC, 2)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                return admin.topic_route(TOPIC).subscribe_queues(TOPIC)
            except NoRouteError:
                assert time.monotonic() < deadline, "the topic was never routed"
                threading.Event().wait(0.05)


def read_all(namesrv: str, queues: list, group: str, want: set[bytes]) -> set[bytes]:
    got: set[bytes] = set()
    with PullConsumer(group, namesrv, consume_from="FIRST") as consumer:
        consumer.assign(queues)
        deadline = time.monotonic() + WAIT_S
        while not want <= got and time.monotonic() < deadline:
            got.update(m.body for m in consumer.poll(500))
    return got


def body(index: int) -> bytes:
    return f"m{index:07d}".encode().ljust(BODY_SIZE, b".")


def test_a_full_disk_refuses_sends_with_14_keeps_reads_and_loses_nothing(
    small_volume, tidemq_cluster
):
    store_dir = small_volume / "store"
    cluster = tidemq_cluster(broker_overrides={
        "storePathRootDir": str(store_dir),
        "mappedFileSizeCommitLog": str(1 << 20),
        "mappedFileSizeConsumeQueue": str(5000 * 20),
        "maxHashSlotNum": "1000",
        "maxIndexNum": "10000",
        # Keep every message: forced deletion would free space by dropping unread ones.
        "cleanFileForciblyEnable": "false",
    })
    broker = cluster.brokers[0]
    namesrv = cluster.namesrv_addr
    queues = wait_for_route(namesrv)
    acked: set[bytes] = set()
    codes: list[int] = []
    index = 0
    with Producer("full_disk_producer", namesrv, retry_times_when_send_failed=0) as producer:

        def send_one() -> bool:
            nonlocal index
            index += 1
            message = body(index)
            try:
                result = producer.send(Message(TOPIC, message))
            except BrokerRejected as e:
                codes.append(e.code)
                assert e.code == ResponseCode.SERVICE_NOT_AVAILABLE, e
                assert str(store_dir) in str(e) or "disk full" in str(e), e
                return False
            assert result.status is SendStatus.SEND_OK
            acked.add(message)
            return True

        for _ in range(300):
            assert send_one()
        before_fill = set(acked)

        filler = str(small_volume / "filler")
        fill(filler)
        deadline = time.monotonic() + WAIT_S
        while not codes:
            assert time.monotonic() < deadline, "sends were never refused on a full volume"
            send_one()
        for _ in range(20):  # refused again and again, and the broker stays up
            send_one()
        assert broker.running, broker.log_tail()
        assert ResponseCode.SERVICE_NOT_AVAILABLE in codes
        # Reads go on while writes are refused.
        assert before_fill <= read_all(namesrv, queues, "full_disk_reader", before_fill)

        os.unlink(filler)
        refused = len(codes)
        deadline = time.monotonic() + WAIT_S
        while not send_one():
            assert time.monotonic() < deadline, "writes did not resume after space was freed"
        for _ in range(200):
            assert send_one()
        print(f"acked {len(acked)} messages, {refused} sends refused with code 14")

    broker.restart()
    got = read_all(namesrv, queues, "full_disk_after_restart", acked)
    missing = acked - got
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:3]}"
    assert "Traceback" not in broker.log_tail(400)

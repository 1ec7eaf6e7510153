"""A store written once by a real broker and copied after SIGKILL and after a clean stop,
for the reliability tests that damage copies of it (test_store_bit_flips.py,
test_store_derived_files.py). Imported by name: pytest puts this folder on sys.path.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from server_processes import ServerProcess, start_cluster
from tidemq.client import NoRouteError
from tidemq.sync import Admin, Message, Producer, SendStatus

WAIT_S = 60.0


def wait_for_route(namesrv: str, topic: str, queues: int, create: bool) -> list:
    """The queues of ``topic`` once routed (created first with ``queues`` queues when
    ``create``); fails the test after WAIT_S."""
    with Admin(namesrv) as admin:
        if create:
            admin.create_topic(topic, queues)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                return admin.topic_route(topic).subscribe_queues(topic)
            except NoRouteError:
                assert time.monotonic() < deadline, "the topic was never routed"
                threading.Event().wait(0.05)


def written_store_copies(
    workdir: Path, settings: dict[str, str], topic: str, queues: int, producer_group: str,
    messages: list[Message],
) -> Iterator[tuple[ServerProcess, dict[str, Path], set[bytes]]]:
    """For a module fixture: yield (namesrv process, {"sigkill": store copy, "clean": store
    copy}, acked bodies) after a real broker with ``settings`` stored ``messages``; stop the
    servers afterwards."""
    processes: list[ServerProcess] = []
    try:
        cluster = start_cluster(workdir, processes, broker_overrides=settings)
        broker = cluster.brokers[0]
        wait_for_route(cluster.namesrv_addr, topic, queues, create=True)
        acked = set()
        with Producer(producer_group, cluster.namesrv_addr) as producer:
            futures = [producer.send_async(message) for message in messages]
            for message, future in zip(messages, futures, strict=True):
                assert future.result(timeout=WAIT_S).status is SendStatus.SEND_OK
                acked.add(message.body)
        store = workdir / "broker-a" / "store"
        bases = {}
        broker.kill(signal.SIGKILL)
        bases["sigkill"] = workdir / "base-sigkill"
        shutil.copytree(store, bases["sigkill"])
        assert (bases["sigkill"] / "abort").exists()
        broker.start()
        broker.stop()
        bases["clean"] = workdir / "base-clean"
        shutil.copytree(store, bases["clean"])
        assert not (bases["clean"] / "abort").exists()
        yield cluster.namesrvs[0], bases, acked
    finally:
        for process in reversed(processes):
            process.stop()

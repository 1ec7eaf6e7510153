"""Fixtures for the Spark connector tests: one local SparkSession and one tidemq cluster.

Both are session-scoped because they are expensive (a SparkSession takes 10-20 s to start
and its first Python data-source query as long again; a cluster a second or two): every test
uses its own topics, checkpoints and output folders instead.

The cluster is a name server and two brokers (``broker-a``, ``broker-b``) run as real
``python -m tidemq`` processes on loopback by tests/integration/conftest.py's
``ServerProcess`` (loaded here under its own module name, so there is one implementation of
"start a real server"); they are stopped at the end by the PIDs started.

The SparkSession uses settings that keep tests small and fast: local[2], two shuffle
partitions, UI and console progress off, everything on 127.0.0.1, scratch space under the
session's temporary folder, adaptive execution off.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from spark_session import build_spark_session

from tidemq import sync
from tidemq.client.message import Message

CLUSTER_NAME = "DefaultCluster"
# pytest-timeout's bound (300 s, pyproject.toml) covers a test's setup too, and the first test
# of each Spark unit (tests/suite_scheduling.py) sets up the session's SparkSession and
# cluster: 137 and 166 s at a load average of 12, after which a driver-crash test's own
# bounded waits (a child driver, then the restarted query) ran past 300 s. A timeout inside a
# py4j call also leaves the session's gateway answering the wrong calls, failing every later
# test of the unit; so Spark tests get a bound that a busy machine stays under.
SPARK_TEST_TIMEOUT_S = 600
BROKER_NAMES = ("broker-a", "broker-b")
QUEUES_PER_BROKER = 4


def _load_server_fixtures() -> Any:
    name = "tidemq_server_fixtures_for_spark"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parent.parent / "integration" / "conftest.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


servers = _load_server_fixtures()
wait_until = servers.wait_until


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Spark tests without a timeout mark of their own get SPARK_TEST_TIMEOUT_S."""
    for item in items:
        if item.get_closest_marker("spark") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SPARK_TEST_TIMEOUT_S))


@dataclass
class SparkCluster:
    """The session's name server and brokers, and helpers to fill topics."""

    namesrv: Any
    brokers: list[Any]
    admin: sync.Admin
    producer: sync.Producer

    @property
    def namesrv_addr(self) -> str:
        """``127.0.0.1:<port>`` of the name server."""
        return self.namesrv.addr

    def create_topic(self, topic: str, queues_per_broker: int = QUEUES_PER_BROKER) -> None:
        """Create ``topic`` on both brokers and wait until the name server routes it."""
        self.admin.create_topic(topic, queues_per_broker, cluster=CLUSTER_NAME)

        def routed() -> bool:
            try:
                route = self.admin.topic_route(topic)
            except Exception:
                return False
            return len(route.subscribe_queues(topic)) == queues_per_broker * len(self.brokers)

        wait_until(routed, timeout_s=30, what=f"route of topic {topic}")

    def produce(self, topic: str, messages: Sequence[Message]) -> None:
        """Send ``messages`` (round robin over the topic's queues) in batch requests."""
        for first in range(0, len(messages), 64):
            self.producer.send_batch(list(messages[first:first + 64]))

    def produce_to_queues(self, topic: str, messages: Sequence[Message]) -> None:
        """Send message i to queue i mod (queue count), so every queue of both brokers gets
        some; batch requests per queue keep each queue's messages in list order.

        A new producer each time: it sees the topic's current queues (the session producer's
        cached route may predate a topic that grew)."""
        with sync.Producer("spark_test_queue_producer", self.namesrv_addr) as producer:
            queues = sorted(producer.queues(topic))
            for index, queue in enumerate(queues):
                mine = list(messages[index::len(queues)])
                for first in range(0, len(mine), 64):
                    producer.send_batch(mine[first:first + 64], queue=queue)


@pytest.fixture(scope="session")
def tidemq_cluster_for_spark(tmp_path_factory: pytest.TempPathFactory
                             ) -> Iterator[SparkCluster]:
    """A name server and brokers broker-a and broker-b for the whole session."""
    root = tmp_path_factory.mktemp("tidemq-cluster")
    processes: list[Any] = []
    try:
        namesrv = servers.ServerProcess("namesrv", "namesrv", root / "namesrv",
                                        lambda port: ["--listenPort", str(port)])
        processes.append(namesrv)
        namesrv.start()
        brokers = []
        for name in BROKER_NAMES:
            brokers.append(_start_broker(root, name, namesrv.addr))
            processes.append(brokers[-1])
        admin = sync.Admin(namesrv.addr)
        admin.start()
        producer = sync.Producer("spark_test_producer", namesrv.addr)
        producer.start()
        wait_until(lambda: len(admin.cluster_list().master_addresses()) == len(BROKER_NAMES),
                   timeout_s=30, what="both brokers registered")
        try:
            yield SparkCluster(namesrv, brokers, admin, producer)
        finally:
            producer.close()
            admin.close()
    finally:
        for process in reversed(processes):
            process.stop()


def _start_broker(root: Path, name: str, namesrv_addr: str) -> Any:
    folder = root / name

    def make_args(port: int) -> list[str]:
        settings = {**servers.TEST_BROKER_SETTINGS, "brokerName": name,
                    "brokerClusterName": CLUSTER_NAME, "listenPort": str(port),
                    "storePathRootDir": str(folder / "store")}
        args = [word for key, value in settings.items() for word in (f"--{key}", value)]
        return [*args, "-n", namesrv_addr]

    broker = servers.ServerProcess("broker", name, folder, make_args, port_neighbours=(-2, 1))
    broker.start()
    return broker


@pytest.fixture(scope="session")
def spark_scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where Spark and its workers keep temporary files (under the session's tmp folder)."""
    return tmp_path_factory.mktemp("spark-scratch")


@pytest.fixture(scope="session")
def spark(spark_scratch: Path) -> Iterator[Any]:
    """The session's SparkSession, warmed up by one tiny query."""
    session = build_spark_session(spark_scratch)
    session.range(1).count()
    try:
        yield session
    finally:
        session.stop()


_topic_numbers = itertools.count(1)


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique in the session, derived from the test's name."""
    base = "".join(c if c.isalnum() else "_" for c in request.node.name)[:60]
    return f"{base}_{next(_topic_numbers)}_{int(time.time() * 1000) % 100000}"


@pytest.fixture
def cluster(tidemq_cluster_for_spark: SparkCluster) -> SparkCluster:
    """Short name for the session's cluster."""
    return tidemq_cluster_for_spark

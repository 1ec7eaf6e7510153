"""Fixtures of the differential tests: Apache RocketMQ's broker and tidemq side by side.

``pair`` (one per test session: a JVM broker takes seconds to start) is an Apache name server
and broker (tests/reference_cluster.py) and a tidemq name server and broker
(tests/server_processes.py), both on free loopback ports with the same settings. A test sends
the same raw request to both with tidemq's own protocol modules (``pair.broker_call`` /
``pair.namesrv_call``) and compares what a client can observe. Names are made unique per test
(``unique``), so tests share the pair without seeing each other's topics.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from wire import Session

from reference_cluster import ReferenceCluster
from server_processes import ServerProcess, TidemqCluster, start_cluster
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.command import RemotingCommand

# Both brokers get these (tidemq's TEST_BROKER_SETTINGS and the reference's small files come
# on top): SQL92 filters on, short delay levels, a 1 s transaction check.
SHARED_BROKER_SETTINGS = {
    "enablePropertyFilter": "true",
    "messageDelayLevel": "1s 2s " + " ".join(["1s"] * 16),
    "transactionTimeOut": "1000",
    "transactionCheckInterval": "1000",
    "autoCreateTopicEnable": "true",
}


@dataclass
class Answers:
    """The same request's answer from each broker."""

    apache: RemotingCommand
    tidemq: RemotingCommand

    def codes(self) -> tuple[int, int]:
        """(Apache's response code, tidemq's)."""
        return self.apache.code, self.tidemq.code


@dataclass
class Pair:
    """An Apache cluster and a tidemq cluster, each with one name server and one broker."""

    apache: ReferenceCluster
    tidemq: TidemqCluster
    sessions: dict[str, Session] = field(default_factory=dict)

    @property
    def tidemq_broker_addr(self) -> str:
        """The tidemq broker's address."""
        return self.tidemq.brokers[0].addr

    def session(self, addr: str) -> Session:
        """A connection to ``addr`` kept open for the session (reopened after a close)."""
        if addr not in self.sessions:
            self.sessions[addr] = Session(addr)
        return self.sessions[addr]

    def call(self, addr: str, request: RemotingCommand | bytes) -> RemotingCommand:
        """One request on the kept connection to ``addr``; reconnects once if it closed."""
        try:
            return self.session(addr).call(request)
        except OSError:
            self.sessions.pop(addr).close()
            raise

    def broker_call(self, make: Callable[[], RemotingCommand | bytes]) -> Answers:
        """``make()`` is called once per broker (each request gets its own opaque)."""
        return Answers(self.call(self.apache.broker_addr, make()),
                       self.call(self.tidemq_broker_addr, make()))

    def namesrv_call(self, make: Callable[[], RemotingCommand | bytes]) -> Answers:
        """``make()`` sent to each name server."""
        return Answers(self.call(self.apache.namesrv_addr, make()),
                       self.call(self.tidemq.namesrv_addr, make()))

    def wait_dispatched(self, topic: str, queue_id: int, count: int,
                        timeout_s: float = 30.0) -> None:
        """Wait (bounded) until both brokers' consume queue ``queue_id`` of ``topic`` holds
        ``count`` entries or more. Apache dispatches to consume queues in a thread after answering
        the send, so a pull right after a send may not see it yet."""
        deadline = time.monotonic() + timeout_s
        while True:
            answers = self.broker_call(lambda: RemotingCommand.request(
                RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)}))
            offsets = [int((answer.ext_fields or {}).get("offset", -1))
                       for answer in (answers.apache, answers.tidemq)]
            if min(offsets) >= count:
                return
            assert time.monotonic() < deadline, (
                f"{topic} queue {queue_id}: max offsets {offsets} (Apache, tidemq), "
                f"expected {count} after {timeout_s} s")
            time.sleep(0.05)

    def close(self) -> None:
        """Close the kept connections."""
        for session in self.sessions.values():
            session.close()
        self.sessions.clear()

    def log_tail(self) -> str:
        """Both clusters' log tails."""
        tidemq = "\n".join(server.log_tail() for server in
                           (*self.tidemq.namesrvs, *self.tidemq.brokers))
        return f"{self.apache.log_tail()}\n{tidemq}"


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Apache's and tidemq's name server and broker, started once per test session."""
    workdir = tmp_path_factory.mktemp("differential")
    apache = ReferenceCluster(workdir / "apache")
    processes: list[ServerProcess] = []
    pair = None
    try:
        apache.start(SHARED_BROKER_SETTINGS)
        tidemq = start_cluster(workdir / "tidemq", processes,
                               broker_overrides=SHARED_BROKER_SETTINGS)
        pair = Pair(apache, tidemq)
        yield pair
    finally:
        if pair is not None:
            pair.close()
        for process in reversed(processes):
            process.stop()
        apache.stop()


_names = itertools.count()


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique("Topic")`` -> ``Topic_<n>_<test>``: a name no other test of the session uses."""
    test = "".join(ch for ch in request.node.name if ch.isalnum())[:40]

    def make(prefix: str) -> str:
        return f"{prefix}_{next(_names)}_{test}"

    return make


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failed differential test's report gets both clusters' log tails."""
    outcome = yield
    report = outcome.get_result()
    pair = item.funcargs.get("pair") if hasattr(item, "funcargs") else None
    if report.failed and isinstance(pair, Pair):
        report.sections.append(("Apache and tidemq logs", pair.log_tail()))


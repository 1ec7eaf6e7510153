"""Fixtures shared by every test folder that runs real tidemq server processes.

The work is done by server_processes.py (this folder, on sys.path for every test); these
fixtures tie its processes to a test: each one is stopped at teardown by the PID started, and
a failed test's report gets the tail of every server's logs.

``tidemq_cluster(namesrv_count=1, brokers=["broker-a"], broker_overrides={...})`` returns a
``TidemqCluster``; ``tidemq_server(kind, name, make_args)`` one process not yet started;
``remoting_call(addr, command)`` one request over a plain socket; ``remoting_session(addr)`` a
connection kept open.
"""

from __future__ import annotations

import contextlib
import os
import signal
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from client_timeouts import use_generous_client_timeouts
from server_processes import (
    TEST_BROKER_SETTINGS,
    RemotingSession,
    ServerProcess,
    TidemqCluster,
    free_port,
    remoting_call,
    start_cluster,
    wait_until,
)
from tidemq.protocol.command import RemotingCommand
from tls_certs import Pki, make_test_pki

# Hypothesis fails an example that runs over 200 ms (its default deadline) and a test whose
# data generation is slow (HealthCheck.too_slow): wall-clock bounds, which a busy 2-core
# machine breaks for reasons of its own (test_offset_msg_id_round_trips failed with
# DeadlineExceeded beside four other test runs). The properties are checked the same; a test
# may still set a deadline of its own with @settings.
settings.register_profile("tidemq", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tidemq")


def _build_hypothesis_unicode_tables() -> None:
    """Have Hypothesis build its Unicode tables now, once, in the process that starts the run.

    ``st.text()``'s default alphabet is ``characters(codec="utf-8")``; the first draw from it
    in a checkout without the tables (``.hypothesis/unicode_data``, not versioned: every new
    worktree) encodes every code point to find the encodable ones, 2.6-6.2 s of CPU at load
    4-10, and the category table besides. That landed inside whichever test drew first in each
    xdist worker, both workers at once: test_codec_fast_paths' JSON header test took 17.5 s
    there against 1.4-2 s with the tables built, and at load 50-60 such first tests passed
    the 300 s per-test timeout. Built here they are read from disk by every later process.
    """
    from hypothesis import strategies as st
    from hypothesis.errors import HypothesisSideeffectWarning

    with warnings.catch_warnings():
        # Hypothesis warns of slow work while plugins initialize: here it is the point.
        warnings.simplefilter("ignore", HypothesisSideeffectWarning)
        st.characters(codec="utf-8").validate()

_config: pytest.Config | None = None
_forwarded_to: list[int] = []
_UNIT_TESTS = Path(__file__).parent / "unit"


def _interrupt_on_sigterm(signum: int, frame: object) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # A worker is interrupted once: the controller forwards the SIGTERM that a kill of the
        # whole process group also brings, and a second KeyboardInterrupt would cut the
        # teardown that stops this worker's servers. The controller kills a stuck worker.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt(f"pytest-xdist worker got signal {signum}")
    workers = _xdist_workers()
    if workers and not _forwarded_to:
        # The controller of an xdist run: each worker raises KeyboardInterrupt, tears its
        # servers down and reports "interrupted"; then the controller stops as it would on
        # Ctrl-C (exit status 2). A second SIGTERM interrupts the controller at once.
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        _forwarded_to.extend(workers)
        return
    raise KeyboardInterrupt(f"pytest got signal {signum}")


def _xdist_workers() -> list[int]:
    """The PIDs of this controller's pytest-xdist workers (its child processes), or []."""
    if _config is None or not _config.pluginmanager.has_plugin("dsession"):
        return []  # not an xdist controller: our children are servers, stopped by teardown
    me = os.getpid()
    workers = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == me:
                workers.append(int(entry.name))
    return workers


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (a CI timeout, ``kill`` of the run) ends the run as Ctrl-C does.

    Servers run in sessions of their own (a terminal's Ctrl-C is for pytest), so they outlive
    a pytest that dies by the default SIGTERM action; raised as KeyboardInterrupt instead, the
    fixtures' teardowns still stop every server by the PID they started. Under pytest-xdist
    the controller passes the signal on to its workers (which run the tests and own the
    servers) and ends when they have torn down.

    The run's first process (not an xdist worker) also has Hypothesis build its Unicode
    tables before any test runs (``_build_hypothesis_unicode_tables``).
    """
    global _config
    _config = config
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _build_hypothesis_unicode_tables()  # before xdist starts its workers


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup`` (scripts/test) groups tests as tests/suite_scheduling.py says."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from suite_scheduling import SuiteScheduling

    return SuiteScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Clients built by a test outside tests/unit (its fixtures too, a session fixture first
    set up for it included) default to the test-wide generous timeouts of
    tests/client_timeouts.py; unit tests get the client's own defaults."""
    use_generous_client_timeouts(not item.path.is_relative_to(_UNIT_TESTS))


@pytest.fixture
def tidemq_processes(request: pytest.FixtureRequest) -> Iterator[list[ServerProcess]]:
    """Every server process a test started; stopped at teardown, logs in failure reports."""
    processes: list[ServerProcess] = []
    request.node.tidemq_processes = processes
    yield processes
    for process in reversed(processes):
        process.stop()


@pytest.fixture
def tidemq_server(tmp_path: Path, tidemq_processes: list[ServerProcess]
                  ) -> Callable[..., ServerProcess]:
    """Factory: ``tidemq_server(kind, name, make_args, port_neighbours=())`` -> not started.

    ``make_args(port)`` returns the command-line words after ``python -m tidemq <kind>``;
    the process runs in ``tmp_path/<name>`` and is stopped at teardown.
    """

    def factory(kind: str, name: str, make_args: Callable[[int], list[str]],
                port_neighbours: Sequence[int] = ()) -> ServerProcess:
        server = ServerProcess(kind, name, tmp_path / name, make_args, tuple(port_neighbours))
        tidemq_processes.append(server)
        return server

    return factory


@pytest.fixture
def tidemq_cluster(tmp_path: Path, tidemq_processes: list[ServerProcess]
                   ) -> Callable[..., TidemqCluster]:
    """Factory: ``tidemq_cluster(namesrv_count=1, brokers=("broker-a",), ...)``.

    Takes the arguments of ``server_processes.start_cluster`` after ``processes``; each call
    starts a new cluster in its own folder under ``tmp_path``.
    """
    count = 0

    def factory(namesrv_count: int = 1, brokers: Sequence[str] = ("broker-a",),
                broker_overrides: Mapping[str, object] | None = None,
                namesrv_overrides: Mapping[str, str] | None = None) -> TidemqCluster:
        nonlocal count
        count += 1
        return start_cluster(tmp_path / f"cluster-{count}", tidemq_processes, namesrv_count,
                             brokers, broker_overrides, namesrv_overrides)

    return factory


@pytest.fixture(name="remoting_call")
def remoting_call_fixture() -> Callable[..., RemotingCommand]:
    """``remoting_call(addr, command_or_frame_bytes)`` -> the response (one socket per call)."""
    return remoting_call


@pytest.fixture
def remoting_session() -> Iterator[Callable[[str], RemotingSession]]:
    """``remoting_session(addr)``: a connection kept open until closed or test teardown."""
    sessions: list[RemotingSession] = []

    def factory(addr: str) -> RemotingSession:
        session = RemotingSession(addr)
        sessions.append(session)
        return session

    yield factory
    for session in sessions:
        session.close()


@pytest.fixture(name="free_port")
def free_port_fixture() -> Callable[..., int]:
    """``free_port(neighbours=(-2, 1))``: a free loopback port (and its neighbours)."""
    return free_port


@pytest.fixture(name="test_broker_settings")
def test_broker_settings_fixture() -> dict[str, str]:
    """Store settings that keep a test broker small (``--<key> value`` pairs)."""
    return dict(TEST_BROKER_SETTINGS)


@pytest.fixture(name="wait_until")
def wait_until_fixture() -> Callable[..., None]:
    """``wait_until(condition, timeout_s, what=...)``: poll until true, bounded."""
    return wait_until


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Attach the tail of every server's logs to the report of a failed test."""
    outcome = yield
    report = outcome.get_result()
    processes = getattr(item, "tidemq_processes", None)
    if report.failed and processes:
        for process in processes:
            report.sections.append((f"tidemq {process.name} logs", process.log_tail()))


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, server and client certificates made for this test session with ``openssl``
    (tests/tls_certs.py); never committed keys."""
    return make_test_pki(tmp_path_factory.mktemp("pki"))

"""Fixtures for driving third-party RocketMQ clients at tidemq, each in its own process.

The name server and broker processes come from the fixtures of tests/conftest.py
(tidemq_cluster, remoting_call, wait_until; tests/server_processes.py starts them).

- ``cpp_client(name, scenario, *args)`` runs one scenario of cpp_client_scenarios.py (PyPI
  ``rocketmq`` 0.4.4, the Apache C++ client 1.x) with HOME set to a fresh folder, where the
  C++ client writes its log;
- ``node_client(client, name, role, *args)`` runs one scenario of node/scenarios.js with
  ``client`` "ons" (ali-ons 3.12.0) or "cpp2" (rocketmq-nodejs 1.1.2, the C++ 2.x core).

Every wait on a client is bounded (client_process.py); a process still running at its
deadline or at teardown is killed by its PID; a failed test's report holds each one's output.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from client_process import ClientProcess

HERE = Path(__file__).resolve().parent
CPP_SCENARIOS = HERE / "cpp_client_scenarios.py"
NODE_SCENARIOS = HERE / "node" / "scenarios.js"
DEFAULT_TIMEOUT_S = 60.0


@pytest.fixture
def client_processes(request: pytest.FixtureRequest) -> Iterator[list[ClientProcess]]:
    """The client processes a test started; killed by PID at teardown."""
    started: list[ClientProcess] = []
    request.node.client_processes = started
    yield started
    for process in started:
        process.kill()


@pytest.fixture
def cpp_client(tmp_path: Path, client_processes: list[ClientProcess]
               ) -> Callable[..., ClientProcess]:
    """Factory: ``cpp_client(name, scenario, *args, timeout_s=60)`` -> a started process.

    ``args`` are the scenario's options (``--namesrv``, ``--topic``, ...).
    """

    def factory(name: str, scenario: str, *args: str, timeout_s: float = DEFAULT_TIMEOUT_S
                ) -> ClientProcess:
        workdir = tmp_path / f"cpp-{name}"
        process = ClientProcess(f"C++ client {name}", workdir,
                                [sys.executable, str(CPP_SCENARIOS), scenario, *args],
                                timeout_s, env={"HOME": str(workdir)})
        client_processes.append(process)
        return process.start()

    return factory


@pytest.fixture
def node_client(tmp_path: Path, client_processes: list[ClientProcess]
                ) -> Callable[..., ClientProcess]:
    """Factory: ``node_client(client, name, role, *args, timeout_s=60)`` -> a started process
    running ``node node/scenarios.js <client> <role> <args>``."""

    def factory(client: str, name: str, role: str, *args: str,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> ClientProcess:
        process = ClientProcess(f"{client} client {name}", tmp_path / f"node-{client}-{name}",
                                ["node", str(NODE_SCENARIOS), client, role, *args], timeout_s,
                                exit_hang_tolerated=True)
        client_processes.append(process)
        return process.start()

    return factory


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Attach every client process's output to a failed test's report (tests/conftest.py adds
    the servers' log tails)."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for process in getattr(item, "client_processes", None) or []:
        report.sections.append((process.label, process.report()))

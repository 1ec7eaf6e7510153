"""Fixtures for driving a third-party RocketMQ client (``rocketmq`` 0.4.4, C++ 1.x) at tidemq.

The name server and broker processes come from tests/integration/conftest.py (loaded here
under its own module name and re-exported, so there is one implementation of "start a real
server"). ``cpp_client(name, scenario, *args)`` runs one scenario of cpp_client_scenarios.py in
its own process with HOME set to a fresh folder (where the C++ client writes its log); every
wait on it is bounded and a process still running at its deadline or at teardown is killed by
its PID.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


def _load_server_fixtures() -> Any:
    name = "tidemq_server_fixtures_for_interop"
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

# Re-exported server fixtures (the failure-report hook is below: it adds C++ client output).
tidemq_processes = servers.tidemq_processes
tidemq_cluster = servers.tidemq_cluster
remoting_call = servers.remoting_call_fixture
wait_until = servers.wait_until_fixture

SCENARIOS = Path(__file__).resolve().parent / "cpp_client_scenarios.py"
# Beyond a scenario's own --timeout-s: interpreter and client start-up and shutdown. A
# healthy run needs a second or two of it; the bound only stops a hung process.
PROCESS_GRACE_S = 30.0
TAIL_CHARS = 4000


@dataclass
class CppClientProcess:
    """One scenario process of the C++ client; ``result()`` waits (bounded) for its answer."""

    name: str
    workdir: Path
    scenario: str
    args: list[str]
    timeout_s: float
    process: subprocess.Popen[bytes] | None = None

    @property
    def out_path(self) -> Path:
        """Where the scenario writes its result document."""
        return self.workdir / "result.json"

    def start(self) -> CppClientProcess:
        """Start the scenario process (in its own session, HOME = its folder); returns self."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HOME": str(self.workdir)}  # the C++ client logs under $HOME/logs
        command = [sys.executable, str(SCENARIOS), self.scenario, *self.args,
                   "--out", str(self.out_path), "--timeout-s", str(self.timeout_s)]
        with open(self.workdir / "stdout.log", "wb") as stdout, \
                open(self.workdir / "stderr.log", "wb") as stderr:
            self.process = subprocess.Popen(command, cwd=self.workdir, env=env, stdout=stdout,
                                            stderr=stderr, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        return self

    def wait_for_output(self, text: str, timeout_s: float = 30.0) -> None:
        """Wait (bounded) until the process printed ``text``; fail with its logs otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in (self.workdir / "stdout.log").read_text(errors="replace"):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"{self.name} never printed {text!r}\n{self.report()}")

    def last_output(self, prefix: str) -> str | None:
        """The rest of the last stdout line starting with ``prefix`` (None: no such line)."""
        text = (self.workdir / "stdout.log").read_text(errors="replace")
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        return lines[-1][len(prefix):].strip() if lines else None

    def result(self, *, expect_status: int = 0) -> dict[str, Any]:
        """Wait for the process to end and return its result document.

        Raises:
            AssertionError: it did not end in time (it is killed), ended with another status,
                or wrote no result; the message holds its output and C++ wire summary.
        """
        try:
            status = self.process.wait(self.timeout_s + PROCESS_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not finish in "
                                 f"{self.timeout_s + PROCESS_GRACE_S} s\n{self.report()}") from None
        if status != expect_status or not self.out_path.exists():
            raise AssertionError(f"{self.name} exited with status {status} (expected "
                                 f"{expect_status})\n{self.report()}")
        return json.loads(self.out_path.read_text())

    def kill(self) -> None:
        """SIGKILL the process (by PID, it is in its own session) if it still runs."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def report(self) -> str:
        """stdout, stderr and the result document (with the wire summary), for failures."""
        parts = [f"=== C++ client {self.name}: {self.scenario} {' '.join(self.args)}"]
        for label in ("stdout.log", "stderr.log", "result.json"):
            path = self.workdir / label
            text = path.read_text(errors="replace") if path.exists() else "(none)"
            if label == "result.json" and path.exists():
                document = json.loads(text)
                for bulky in ("received", "failed", "sends"):
                    document.pop(bulky, None)
                text = json.dumps(document, indent=1)
            parts.append(f"--- {label} ---\n{text[-TAIL_CHARS:]}")
        return "\n".join(parts)


@pytest.fixture
def cpp_client(tmp_path: Path, request: pytest.FixtureRequest
               ) -> Iterator[Callable[..., CppClientProcess]]:
    """Factory: ``cpp_client(name, scenario, *args, timeout_s=60)`` -> a started process.

    ``args`` are the scenario's options (``--namesrv``, ``--topic``, ...). Processes still
    running at teardown are killed by PID; a failed test's report gets each one's output.
    """
    started: list[CppClientProcess] = []

    def factory(name: str, scenario: str, *args: str, timeout_s: float = 60.0
                ) -> CppClientProcess:
        client = CppClientProcess(name, tmp_path / f"cpp-{name}", scenario, list(args),
                                  timeout_s)
        started.append(client)
        return client.start()

    request.node.cpp_clients = started
    yield factory
    for client in started:
        client.kill()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Attach every server's log tail and every C++ client's output to a failed test's report."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for process in getattr(item, "tidemq_processes", None) or []:
        report.sections.append((f"tidemq {process.name} logs", process.log_tail()))
    for client in getattr(item, "cpp_clients", None) or []:
        report.sections.append((f"C++ client {client.name}", client.report()))

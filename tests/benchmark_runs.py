"""Running a harness of benchmarks/ as a user does, for the tests that keep them working
(tests/unit/test_benchmark_harness.py, tests/integration/test_benchmark_harness_servers.py).

A harness runs in its own interpreter and its own process group: the servers and child
interpreters it starts share that group, so a run that outlives its bound is stopped whole,
by the group this module started, and leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
RUN_TIMEOUT_S = 300.0  # a busy 2-core machine; the runs the tests ask for take seconds


def run_harness(name: str, *args: str, expect_exit: int = 0) -> subprocess.CompletedProcess:
    """Run ``python benchmarks/<name> <args>`` from the repository's root; its result, once
    it exited ``expect_exit`` (the assertion message holds its output otherwise)."""
    return run_python(str(BENCHMARKS / name), *args, expect_exit=expect_exit)


def run_python(*args: str, expect_exit: int = 0) -> subprocess.CompletedProcess:
    """Run ``python <args>`` as :func:`run_harness` does (bounded, its group stopped whole)."""
    what = " ".join(args)[:300]
    process = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=BENCHMARKS.parent,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the harness's group: it and what it started
        stdout, stderr = process.communicate()
        raise AssertionError(f"python {what} still ran after {RUN_TIMEOUT_S:g} s:\n"
                             f"{stdout[-2000:]}\n{stderr[-4000:]}") from None
    assert process.returncode == expect_exit, (
        f"python {what} exited {process.returncode}, not {expect_exit}:\n"
        f"{stdout[-2000:]}\n{stderr[-4000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def last_json(stdout: str) -> dict:
    """The JSON document a harness printed last (``--json``): one line, or indented."""
    start = stdout.rfind("\n{") + 1
    return json.loads(stdout[start:])

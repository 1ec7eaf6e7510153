"""One third-party client scenario in its own process, with bounded waits and PID-only kills.

A scenario writes its result document (JSON) to ``<workdir>/result.json`` and its output to
``stdout.log`` / ``stderr.log`` there. ``result()`` waits for the process (bounded by the
scenario's own ``--timeout-s`` plus a grace for start-up and shutdown) and returns the
document; anything else fails the test with the process's output attached.

Some clients hang in their own exit handlers after a clean shutdown (the C++ 2.x core under
Node.js does, now and then). A process made with ``exit_hang_tolerated=True`` that wrote a
document saying ``"ok": true`` and is still running ``EXIT_GRACE_S`` later is killed by PID
and counts as having ended with status 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Beyond a scenario's own --timeout-s: interpreter and client start-up and shutdown. A
# healthy run needs a second or two of it; the bound only stops a hung process.
PROCESS_GRACE_S = 30.0
TAIL_CHARS = 4000
EXIT_GRACE_S = 5.0
POLL_S = 0.05
BULKY_RESULT_KEYS = ("received", "failed", "sends")


@dataclass
class ClientProcess:
    """A client scenario process; ``command`` gets ``--out`` and ``--timeout-s`` appended."""

    label: str
    workdir: Path
    command: Sequence[str]
    timeout_s: float
    env: Mapping[str, str] = field(default_factory=dict)
    exit_hang_tolerated: bool = False
    process: subprocess.Popen[bytes] | None = None

    @property
    def out_path(self) -> Path:
        """Where the scenario writes its result document."""
        return self.workdir / "result.json"

    def start(self) -> ClientProcess:
        """Start the process in its own session, in ``workdir``; returns self."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = [*self.command, "--out", str(self.out_path), "--timeout-s",
                   str(self.timeout_s)]
        with open(self.workdir / "stdout.log", "wb") as stdout, \
                open(self.workdir / "stderr.log", "wb") as stderr:
            self.process = subprocess.Popen(command, cwd=self.workdir,
                                            env={**os.environ, **self.env}, stdout=stdout,
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
        raise AssertionError(f"{self.label} never printed {text!r}\n{self.report()}")

    def last_output(self, prefix: str) -> str | None:
        """The rest of the last stdout line starting with ``prefix`` (None: no such line)."""
        text = (self.workdir / "stdout.log").read_text(errors="replace")
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        return lines[-1][len(prefix):].strip() if lines else None

    def result(self, *, expect_status: int = 0) -> dict[str, Any]:
        """Wait for the process to end and return its result document.

        Raises:
            AssertionError: it did not end in time (it is killed), ended with another status,
                or wrote no result; the message holds its output.
        """
        status = self._wait_for_end()
        if status is None:
            self.kill()
            raise AssertionError(f"{self.label} did not finish in "
                                 f"{self.timeout_s + PROCESS_GRACE_S} s\n{self.report()}")
        if status != expect_status or not self.out_path.exists():
            raise AssertionError(f"{self.label} exited with status {status} (expected "
                                 f"{expect_status})\n{self.report()}")
        return json.loads(self.out_path.read_text())

    def _wait_for_end(self) -> int | None:
        """The exit status (None: still running at the deadline)."""
        deadline = time.monotonic() + self.timeout_s + PROCESS_GRACE_S
        written_at: float | None = None
        while time.monotonic() < deadline:
            status = self.process.poll()
            if status is not None:
                return status
            if self.exit_hang_tolerated and written_at is None and self._says_ok():
                written_at = time.monotonic()
            if written_at is not None and time.monotonic() - written_at > EXIT_GRACE_S:
                self.kill()
                return 0
            time.sleep(POLL_S)
        return None

    def _says_ok(self) -> bool:
        return self.out_path.exists() and json.loads(self.out_path.read_text()).get("ok") is True

    def kill(self) -> None:
        """SIGKILL the process (by PID, it is in its own session) if it still runs."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def report(self) -> str:
        """stdout, stderr and the result document (without its bulky lists), for failures."""
        parts = [f"=== {self.label}: {' '.join(self.command)}"]
        for name in ("stdout.log", "stderr.log", "result.json"):
            path = self.workdir / name
            text = path.read_text(errors="replace") if path.exists() else "(none)"
            if name == "result.json" and path.exists():
                document = json.loads(text)
                for bulky in BULKY_RESULT_KEYS:
                    document.pop(bulky, None)
                text = json.dumps(document, indent=1)
            parts.append(f"--- {name} ---\n{text[-TAIL_CHARS:]}")
        return "\n".join(parts)

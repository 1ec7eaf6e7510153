"""A real etcd (Debian's etcd-server, installed by scripts/test) on free loopback ports.

``EtcdServer(workdir)`` runs one single-node etcd with its data in ``workdir`` and its client
and peer URLs on free loopback ports; ``.endpoint`` is ``127.0.0.1:<client port>`` as
controllerAddr takes it. ``.stop()`` (SIGTERM, then SIGKILL) and ``.start()`` again keep the
data, so a test can take etcd away and bring it back. Stopped by the PID started here only.

The data lives in memory (/dev/shm) where the machine has it: a broker's heartbeat round
renews its lease and writes its report, and every etcd write waits for an fsync of etcd's
log. On a disk shared with other runs' benchmarks one fsync took over a second ("wal: sync
duration of 1.02s"), a master missed its 2 s test lease and was replaced while etcd and every
broker were alive (test_failover at a load of 15-20). The folder goes when the EtcdServer
object does (or at exit); etcd's log stays in the workdir.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

from server_processes import free_port

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
PORT_ATTEMPTS = 3


def etcd_binary() -> str:
    """The etcd binary; AssertionError naming the fix when it is missing."""
    path = shutil.which("etcd")
    assert path is not None, (
        "etcd is not installed: scripts/test installs Debian's etcd-server "
        "(apt-get install etcd-server)")
    return path


def _data_dir(workdir: Path) -> Path:
    """A new folder in /dev/shm (tmpfs) when it is writable, else ``workdir/data``."""
    memory = Path("/dev/shm")
    if memory.is_dir() and os.access(memory, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="tidemq-test-etcd-", dir=memory))
    return workdir / "data"


class EtcdServer:
    """One etcd process on loopback (module docstring)."""

    def __init__(self, workdir: Path, name: str = "etcd") -> None:
        self.workdir = workdir
        self.name = name
        workdir.mkdir(parents=True, exist_ok=True)
        self.client_port = 0
        self.peer_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.data_dir = _data_dir(workdir)
        if self.data_dir.parent != workdir:
            weakref.finalize(self, shutil.rmtree, self.data_dir, True)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start (on the same ports when restarted) and wait until it answers.

        A first start whose ports were taken between the pick and etcd's bind (by another
        process on the machine) is tried again on new ports, as ServerProcess does.
        """
        first = not self.client_port
        for attempt in range(PORT_ATTEMPTS):
            if first:
                self.client_port = free_port()
                self.peer_port = free_port()
            log_offset = self._log_size()
            if self._spawn_and_wait():
                return
            taken = "address already in use" in self._log_since(log_offset)
            if not (first and taken) or attempt == PORT_ATTEMPTS - 1:
                break
            if os.path.isdir(self.data_dir):  # what the failed try wrote; a fresh start
                shutil.rmtree(self.data_dir, ignore_errors=True)
                self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        raise AssertionError(f"etcd did not start on 127.0.0.1:{self.client_port}:\n"
                             f"{self.log_tail()}")

    def _spawn_and_wait(self) -> bool:
        """Start etcd and wait until it is healthy (True) or has exited (False)."""
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = open(self.workdir / "etcd.log", "ab")  # noqa: SIM115 (closed with the process)
        self.process = subprocess.Popen(
            [etcd_binary(), "--name", self.name, "--data-dir", str(self.data_dir),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"{self.name}={peer}",
             "--heartbeat-interval", "50", "--election-timeout", "500"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self._healthy():
                return True
            time.sleep(0.05)
        self.stop()
        return False

    def _log_size(self) -> int:
        path = self.workdir / "etcd.log"
        return path.stat().st_size if path.exists() else 0

    def _log_since(self, offset: int) -> str:
        path = self.workdir / "etcd.log"
        return path.read_bytes()[offset:].decode(errors="replace") if path.exists() else ""

    def _healthy(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", self.client_port), 0.5) as connection:
            connection.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            connection.settimeout(2.0)
            return b'"health":"true"' in connection.recv(4096)
        return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if not self.running:
            return
        assert self.process is not None
        os.kill(self.process.pid, sig)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_S)

    def log_tail(self, lines: int = 30) -> str:
        path = self.workdir / "etcd.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

"""Real ``python -m tidemq namesrv|broker`` processes on loopback, for tests that need them.

One implementation of "start a real server", shared by tests/integration, tests/interop and
tests/reliability through the fixtures of tests/conftest.py (and importable as
``server_processes`` by any test folder: pytest puts tests/ on sys.path for that conftest).

Each server runs in its own folder on free loopback ports, with stdout and stderr appended to
files there, so a failing test can show the tail of every server's logs. Servers are stopped
with SIGTERM, then SIGKILL if they do not exit in time, always by the PID started here, never
by name.

``start_cluster(workdir, processes, namesrv_count=1, brokers=("broker-a",), ...)`` starts name
servers then brokers registered with them and returns a ``TidemqCluster`` whose ``namesrvs``
and ``brokers`` are ``ServerProcess`` objects with ``.addr``, ``.pid``, ``.kill(sig)``,
``.stop()``, ``.restart()`` and ``.log_tail()``. ``remoting_call(addr, command)`` sends one
request over a plain socket and returns the response; ``RemotingSession`` keeps one open.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.frame import FrameDecoder

# Start-up, shutdown and request bounds. Generous: the machine is shared and slow at times;
# a healthy server takes well under a second. They bound waits, they are not assertions.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
REQUEST_TIMEOUT_S = 10.0
PORT_ATTEMPTS = 5
LOG_TAIL_LINES = 40
READY_MARKER = "Ctrl-C to stop"  # the last part of the line each server prints once serving

# Small store files keep a test broker's disk use and start-up cost low (the files are sparse
# anyway); 16 MiB still holds a 4 MiB message.
TEST_BROKER_SETTINGS: Mapping[str, str] = {
    "mappedFileSizeCommitLog": str(16 * 1024 * 1024),
    "mappedFileSizeConsumeQueue": str(30_000 * 20),
    "maxHashSlotNum": "50000",
    "maxIndexNum": "200000",
}


def free_port(*, neighbours: Sequence[int] = ()) -> int:
    """A loopback port free right now, with ``port + n`` free too for each n in neighbours.

    Chosen below the kernel's ephemeral range (ip_local_port_range): a server the tests stop
    and start again on the same port (a SIGKILLed broker, a restarted etcd) would otherwise
    find it taken by some client's outgoing connection, which the kernel may give any free
    ephemeral port — a restarted broker failed so ("address already in use" on its HA port).

    Under pytest-xdist each worker draws from its own slice of that range (by
    ``PYTEST_XDIST_WORKER``), so two workers never pick the same port between one's pick and
    its server's bind; and a port handed out lately by this process (a server not started
    yet, a neighbour) is not handed out again. Another test run on the machine may still take
    the port before we use it, so callers retry on a "cannot listen" start failure.
    """
    low, high = worker_port_range()
    for _ in range(200):
        port = _random.randrange(low, high)
        wanted = [port + offset for offset in (0, *neighbours)]
        if all(low <= candidate < high and candidate not in _handed_out
               and _port_is_free(candidate) for candidate in wanted):
            _handed_out.extend(wanted)
            return port
    raise RuntimeError(f"no free loopback port in {low}-{high - 1} with free neighbours "
                       "after 200 tries")


def worker_port_range() -> tuple[int, int]:
    """[low, high): this process's ports — the fixed range, or its slice under pytest-xdist.

    Worker ``gwN`` of ``PYTEST_XDIST_WORKER_COUNT`` workers gets the N-th of that many equal
    slices; outside xdist (or with one worker) the whole range.
    """
    low, high = _FIXED_PORTS
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        index = int(worker.removeprefix("gw")) if worker.startswith("gw") else 0
    except ValueError:
        return low, high
    if count <= 1:
        return low, high
    size = (high - low) // count
    first = low + (index % count) * size
    return first, first + size


def _fixed_port_range() -> tuple[int, int]:
    """[low, high): the larger run of ports outside the kernel's ephemeral range (above 10000)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        ephemeral_low, ephemeral_high = (int(word) for word in text.split()[:2])
    except (OSError, ValueError):
        ephemeral_low, ephemeral_high = 32768, 60999  # Linux's defaults
    below = (10000, max(10000, ephemeral_low))
    above = (min(65536, ephemeral_high + 1), 65536)
    return max(below, above, key=lambda run: run[1] - run[0])


_FIXED_PORTS = _fixed_port_range()
_random = random.Random()
# Ports (and neighbours) handed out lately by this process: a caller may pick several before
# it starts the first server (a broker's ports, then its name server's), and a free-now port
# picked twice would make the second server fail to listen.
_handed_out: collections.deque[int] = collections.deque(maxlen=256)


def _port_is_free(port: int) -> bool:
    if not 0 < port < 65536:
        return False
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class DevBrokerPorts:
    """``ports(namesrv_port)``: the broker's listenPort for a ``tidemq dev`` run as a
    ServerProcess (whose own port is its name server's), from ``make_args``.

    One broker port per name-server port, picked with its -2 (VIP) and +1 (HA) neighbours
    free the first time that name-server port is seen: ServerProcess picks a new port after
    a "cannot listen" start, so a broker port taken meanwhile is replaced as well (a broker
    port picked once outside ``make_args`` failed the same way on every retry), and a
    restart, on the same name-server port, keeps the broker's.
    """

    def __init__(self) -> None:
        self._by_namesrv_port: dict[int, int] = {}

    def __call__(self, namesrv_port: int) -> int:
        if namesrv_port not in self._by_namesrv_port:
            self._by_namesrv_port[namesrv_port] = free_port(neighbours=(-2, 1))
        return self._by_namesrv_port[namesrv_port]


def wait_until(condition: Callable[[], bool], timeout_s: float = 20.0,
               interval_s: float = 0.05, what: str = "condition") -> None:
    """Poll ``condition`` until it is true; AssertionError naming ``what`` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def metric_value(metrics_url: str, name: str, **labels: str) -> float:
    """The value of the sample ``name`` with exactly ``labels`` (none by default) on a
    server's Prometheus endpoint (``metricsExporterType=PROM``), e.g. the broker's
    ``tidemq_broker_pulls_parked`` or ``tidemq_broker_parked_pulls_answered_total`` with
    ``cause="message"``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=REQUEST_TIMEOUT_S) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"no sample {name} with labels {labels} at {metrics_url}")


def remoting_call(addr: str, command: RemotingCommand | bytes,
                  timeout_s: float = REQUEST_TIMEOUT_S) -> RemotingCommand:
    """Send one request (a command, or a whole frame's bytes) and return the response."""
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as connection:
        connection.sendall(command if isinstance(command, bytes) else command.encode())
        return read_response(connection, timeout_s)


class RemotingSession:
    """One socket kept open for several requests (a broker's registrations must stay on an
    open connection: the name server drops a broker whose connection closes)."""

    def __init__(self, addr: str, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        host, _, port = addr.rpartition(":")
        self.timeout_s = timeout_s
        self.socket = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.decoder = FrameDecoder()
        self.pending: list[RemotingCommand] = []

    def call(self, command: RemotingCommand | bytes) -> RemotingCommand:
        """Send one request and return the next response on this connection."""
        self.socket.sendall(command if isinstance(command, bytes) else command.encode())
        deadline = time.monotonic() + self.timeout_s
        while not self.pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"no response within {self.timeout_s} s")
            self.socket.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.socket.recv(65536)
            if not data:
                raise AssertionError("server closed the connection without answering")
            self.pending += self.decoder.feed(data)
        return self.pending.pop(0)

    def close(self) -> None:
        """Close the socket."""
        self.socket.close()

    def __enter__(self) -> RemotingSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_response(connection: socket.socket, timeout_s: float = REQUEST_TIMEOUT_S
                  ) -> RemotingCommand:
    """Read frames from ``connection`` until one command arrives (bounded in time)."""
    decoder = FrameDecoder()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        connection.settimeout(max(0.01, deadline - time.monotonic()))
        data = connection.recv(65536)
        if not data:
            raise AssertionError("server closed the connection without answering")
        commands = decoder.feed(data)
        if commands:
            return commands[0]
    raise AssertionError(f"no response within {timeout_s} s")


@dataclass
class ServerProcess:
    """One ``python -m tidemq <kind>`` process, restartable on the same ports and folder."""

    kind: str
    name: str
    workdir: Path
    make_args: Callable[[int], list[str]]
    port_neighbours: tuple[int, ...] = ()
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    stdout_offset: int = 0  # where this run's output begins (logs are appended on restart)
    stderr_offset: int = 0
    stdout_path: Path = field(init=False)
    stderr_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = self.workdir / "stdout.log"
        self.stderr_path = self.workdir / "stderr.log"

    @property
    def addr(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The PID of the running process."""
        assert self.process is not None, f"{self.name} is not running"
        return self.process.pid

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start on a free port (the same port on a restart) and wait until it serves."""
        assert not self.running, f"{self.name} is already running (pid {self.pid})"
        for attempt in range(PORT_ATTEMPTS):
            if self.port == 0 or (attempt > 0 and self.starts == 0):
                self.port = free_port(neighbours=self.port_neighbours)
            self._spawn()
            if self._wait_ready():
                self.starts += 1
                return
            stderr = self.stderr_path.read_bytes()[self.stderr_offset:].decode(errors="replace")
            if "cannot listen" not in stderr or self.starts > 0:
                break  # not a port collision (or a restart must keep its port): give up
        raise AssertionError(f"{self.name} did not start:\n{self.log_tail()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the process; for SIGKILL also wait for it to be gone."""
        if not self.running:
            return
        os.kill(self.pid, sig)
        if sig == signal.SIGKILL:
            self.process.wait(STOP_TIMEOUT_S)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within STOP_TIMEOUT_S.

        Returns:
            The exit status (None when it was not running).
        """
        if self.process is None:
            return None
        if self.running:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT_S)
        return self.process.returncode

    def restart(self) -> None:
        """Stop (if running) and start again on the same port and folder."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of stdout and stderr, labelled."""
        parts = []
        for label, path in (("stdout", self.stdout_path), ("stderr", self.stderr_path)):
            text = path.read_text(errors="replace") if path.exists() else ""
            tail = "\n".join(text.splitlines()[-lines:])
            parts.append(f"--- {self.name} {label} ({path}) ---\n{tail}")
        return "\n".join(parts)

    def _spawn(self) -> None:
        # Append, so a restart keeps the earlier run's logs for the failure report.
        self.stdout_offset = self.stdout_path.stat().st_size if self.stdout_path.exists() else 0
        self.stderr_offset = self.stderr_path.stat().st_size if self.stderr_path.exists() else 0
        with open(self.stdout_path, "ab") as stdout, open(self.stderr_path, "ab") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tidemq", self.kind, *self.make_args(self.port)],
                cwd=self.workdir,
                stdout=stdout,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C in the terminal is for pytest, not for it
            )

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            output = self.stdout_path.read_bytes()[self.stdout_offset:].decode(errors="replace")
            if READY_MARKER in output and _accepts_connections(self.port):
                return True
            time.sleep(0.05)
        self.stop()
        return False


def _accepts_connections(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1.0):
        return True
    return False


@dataclass
class TidemqCluster:
    """Name servers and brokers started together for one test."""

    namesrvs: list[ServerProcess]
    brokers: list[ServerProcess]

    @property
    def namesrv_addr(self) -> str:
        """``host:port;host:port`` of every name server, as brokers and clients take it."""
        return ";".join(server.addr for server in self.namesrvs)

    def broker(self, name: str) -> ServerProcess:
        """The broker process named ``name``."""
        return next(server for server in self.brokers if server.name == name)


def _namesrv(workdir: Path, index: int, overrides: Mapping[str, str]) -> ServerProcess:
    def make_args(port: int) -> list[str]:
        return ["--listenPort", str(port), *option_args(overrides)]

    return ServerProcess("namesrv", f"namesrv-{index}", workdir / f"namesrv-{index}", make_args)


def _broker(workdir: Path, name: str, cluster: TidemqCluster,
            overrides: Mapping[str, str]) -> ServerProcess:
    folder = workdir / name

    def make_args(port: int) -> list[str]:
        settings = {**TEST_BROKER_SETTINGS, "brokerName": name, "listenPort": str(port),
                    "storePathRootDir": str(folder / "store"), **overrides}
        args = option_args(settings)
        if cluster.namesrvs and "namesrvAddr" not in overrides:
            args += ["-n", cluster.namesrv_addr]
        return args

    # The broker also listens on listenPort - 2 (the VIP port) and keeps listenPort + 1 for HA.
    return ServerProcess("broker", name, folder, make_args, port_neighbours=(-2, 1))


def option_args(settings: Mapping[str, object]) -> list[str]:
    """``{"key": value}`` -> ``["--key", "value", ...]``, the servers' command-line overrides."""
    args: list[str] = []
    for key, value in settings.items():
        args += [f"--{key}", str(value)]
    return args


def start_cluster(workdir: Path, processes: list[ServerProcess], namesrv_count: int = 1,
                  brokers: Sequence[str] = ("broker-a",),
                  broker_overrides: Mapping[str, object] | None = None,
                  namesrv_overrides: Mapping[str, str] | None = None) -> TidemqCluster:
    """Start name servers, then brokers registered with every one of them.

    Args:
        workdir: folder that gets one sub-folder per server.
        processes: each server is appended here before it starts, so the caller can stop
            every one (and show its logs) even when a later start fails.
        namesrv_count: name servers to start first.
        brokers: names of brokers to start next.
        broker_overrides: ``--<key> value`` settings for every broker, or
            ``{broker name: {...}}`` per broker when keyed by broker names.
        namesrv_overrides: ``--<key> value`` settings for every name server.

    Raises:
        AssertionError: a server did not start (the message holds its log tail).
    """
    cluster = TidemqCluster([], [])
    for index in range(namesrv_count):
        server = _namesrv(workdir, index, namesrv_overrides or {})
        processes.append(server)
        server.start()
        cluster.namesrvs.append(server)
    per_broker = bool(broker_overrides) and all(
        name in brokers and isinstance(value, Mapping)
        for name, value in (broker_overrides or {}).items()
    )
    for name in brokers:
        overrides = (broker_overrides or {}).get(name, {}) if per_broker else (
            broker_overrides or {})
        server = _broker(workdir, name, cluster, {k: str(v) for k, v in overrides.items()})
        processes.append(server)
        server.start()
        cluster.brokers.append(server)
    return cluster

"""Apache RocketMQ's own name server and broker, started from Maven's jars as a reference.

tests/differential sends the same requests to this cluster and to tidemq and compares the
answers; the store-compatibility tests start it on a store tidemq wrote (and the other way);
benchmarks/ measures it beside tidemq. The jars are Apache's 4.9.7 ``NamesrvStartup`` and
``BrokerStartup`` (tests/java_runtime.py says why that version), run with ``java -cp`` on free
loopback ports, each with a small heap, small store files and its own ROCKETMQ_HOME holding
the logback configuration written here (Apache reads ``conf/logback_namesrv.xml`` and
``conf/logback_broker.xml`` from it). Processes are stopped by the PID started here: SIGTERM
(Apache's shutdown hook then closes the store cleanly), SIGKILL if that takes too long.

``ReferenceCluster(workdir).start(broker_settings)`` -> ``.namesrv_addr``, ``.broker_addr``;
``.restart_broker()``, ``.stop_broker()``, ``.stop()``, ``.log_tail()``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from java_runtime import JAVA17_OPENS, java, reference_classpath
from server_processes import free_port

# Generous: a JVM broker starts in 2-5 s on an idle machine, much slower on a busy one.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
NAMESRV_READY = "The Name Server boot success"
BROKER_READY = "boot success"
LOG_TAIL_LINES = 40
# A port picked free may be taken by another process before the JVM binds it (other test
# runs share the machine): a first start that failed so is tried again on new ports, as
# tests/server_processes.py does for tidemq's servers. Name server and broker print this
# (the BindException's stack trace) on stdout when they exit for it.
PORT_ATTEMPTS = 5
PORT_TAKEN = "java.net.BindException: Address already in use"

# Small files, like tests/server_processes.py's TEST_BROKER_SETTINGS (16 MiB holds a 4 MiB
# message); the IP is loopback so message ids and routes say 127.0.0.1.
REFERENCE_BROKER_SETTINGS: Mapping[str, str] = {
    "brokerClusterName": "DefaultCluster",
    "brokerName": "broker-a",
    "brokerId": "0",
    "brokerIP1": "127.0.0.1",
    "mappedFileSizeCommitLog": str(16 * 1024 * 1024),
    "mappedFileSizeConsumeQueue": str(30_000 * 20),
    "maxHashSlotNum": "50000",
    "maxIndexNum": "200000",
    "flushDiskType": "ASYNC_FLUSH",
    "autoCreateTopicEnable": "true",
    # Apache's default scans for expired files at 04:00; a test must not see a deletion.
    "deleteWhen": "04",
    # Apache's flow control answers a send SYSTEM_BUSY when it waited over 200 ms in the send
    # queue or the commit log stayed locked over 1 s (its defaults); a busy test machine (load
    # average 12-20) got "[TIMEOUT_CLEAN_QUEUE]broker busy" for a test's first batch. The
    # answers the tests compare are the same with longer bounds.
    "waitTimeMillsInSendQueue": "60000",
    "osPageCacheBusyTimeOutMills": "60000",
}

LOGBACK = """<?xml version="1.0" encoding="UTF-8"?>
<!-- tidemq's tests: Apache's {kind} logs to one file in its ROCKETMQ_HOME, INFO and up. -->
<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{home}/logs/{kind}.log</file>
    <encoder><pattern>%d{{HH:mm:ss.SSS}} %-5level %logger{{20}} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""


@dataclass
class JavaServer:
    """One Apache server JVM: its command, folder and the PID started."""

    name: str
    workdir: Path
    main_class: str
    args: list[str]
    ready_text: str
    heap_mb: int = 256
    process: subprocess.Popen[bytes] | None = None
    stdout_offset: int = 0

    @property
    def stdout_path(self) -> Path:
        """Where the JVM's stdout goes (appended across restarts)."""
        return self.workdir / "stdout.log"

    def start(self) -> None:
        """Start the JVM and wait (bounded) until it printed that it serves."""
        if not self.try_start():
            raise AssertionError(f"Apache {self.name} did not start:\n{self.log_tail()}")

    def try_start(self) -> bool:
        """Start the JVM and wait (bounded) until it serves (True), or until it has exited or
        the wait ran out (False; the JVM is stopped then)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stdout_offset = self.stdout_path.stat().st_size if self.stdout_path.exists() else 0
        command = [java(), f"-Xms{self.heap_mb}m", f"-Xmx{self.heap_mb}m",
                   f"-XX:MaxDirectMemorySize={self.heap_mb}m", "-XX:+UseSerialGC",
                   *JAVA17_OPENS, f"-Duser.home={self.workdir}",
                   "-Drocketmq.client.logRoot=" + str(self.workdir / "logs"),
                   "-cp", reference_classpath(), self.main_class, *self.args]
        env = {**os.environ, "ROCKETMQ_HOME": str(self.workdir)}
        with open(self.stdout_path, "ab") as stdout:
            self.process = subprocess.Popen(command, cwd=self.workdir, env=env, stdout=stdout,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self.ready_text in self.output():
                return True
            time.sleep(0.1)
        self.stop()
        return False

    def output(self) -> str:
        """What this run (since the last start) printed to stdout and stderr."""
        if not self.stdout_path.exists():
            return ""
        return self.stdout_path.read_bytes()[self.stdout_offset:].decode(errors="replace")

    def port_taken(self) -> bool:
        """True when this run failed because a port it listens on was taken: Apache's
        startup prints the BindException's stack trace and exits."""
        return PORT_TAKEN in self.output()

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; the exit status (None: not started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT_S)
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL (a crash: the store keeps its abort file)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_S)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of its stdout and of its logback file."""
        parts = []
        for path in (self.stdout_path, *sorted((self.workdir / "logs").glob("*.log"))):
            text = path.read_text(errors="replace") if path.exists() else "(none)"
            parts.append(f"--- Apache {self.name} {path} ---\n"
                         + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts)


def _write_home(home: Path, kind: str) -> None:
    (home / "conf").mkdir(parents=True, exist_ok=True)
    (home / "logs").mkdir(parents=True, exist_ok=True)
    (home / "conf" / f"logback_{kind}.xml").write_text(LOGBACK.format(home=home, kind=kind))


def _write_properties(path: Path, settings: Mapping[str, object]) -> None:
    path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))


@dataclass
class ReferenceCluster:
    """An Apache name server and one Apache broker in ``workdir``."""

    workdir: Path
    namesrv: JavaServer | None = None
    broker: JavaServer | None = None
    settings: dict[str, str] = field(default_factory=dict)
    namesrv_port: int = 0
    broker_port: int = 0
    heap_mb: int = 256

    @property
    def namesrv_addr(self) -> str:
        """``127.0.0.1:<port>`` of the name server."""
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        """``127.0.0.1:<port>`` of the broker."""
        return f"127.0.0.1:{self.broker_port}"

    @property
    def store_dir(self) -> Path:
        """The broker's storePathRootDir."""
        return Path(self.settings["storePathRootDir"])

    def start(self, broker_settings: Mapping[str, object] | None = None,
              store_dir: Path | None = None, heap_mb: int = 256) -> ReferenceCluster:
        """Start the name server, then the broker registered with it; returns self.

        Args:
            broker_settings: broker.conf keys over REFERENCE_BROKER_SETTINGS.
            store_dir: the storePathRootDir (default: ``workdir/broker/store``), for example
                a store tidemq wrote.
            heap_mb: the broker JVM's heap (and direct memory) in MiB.
        """
        self.heap_mb = heap_mb
        self._start_namesrv()
        broker_home = self.workdir / "broker"
        store = store_dir or broker_home / "store"
        self.settings = {**REFERENCE_BROKER_SETTINGS,
                         **{key: str(value) for key, value in (broker_settings or {}).items()},
                         "namesrvAddr": self.namesrv_addr,
                         "storePathRootDir": str(store),
                         "storePathCommitLog": str(store / "commitlog")}
        self._start_broker()
        return self

    def _start_namesrv(self) -> None:
        home = self.workdir / "namesrv"
        _write_home(home, "namesrv")
        ports_tried = []
        for _ in range(PORT_ATTEMPTS):
            self.namesrv_port = free_port()
            ports_tried.append(self.namesrv_port)
            _write_properties(home / "namesrv.properties", {"listenPort": self.namesrv_port})
            self.namesrv = JavaServer("name server", home,
                                      "org.apache.rocketmq.namesrv.NamesrvStartup",
                                      ["-c", str(home / "namesrv.properties")], NAMESRV_READY,
                                      128)
            if self.namesrv.try_start():
                return
            if not self.namesrv.port_taken():
                break
        raise AssertionError(f"Apache name server did not start (ports tried: "
                             f"{ports_tried}):\n"
                             f"{self.namesrv.log_tail()}")

    def _start_broker(self) -> None:
        """Start the broker; a first start whose port was taken meanwhile is tried again on
        new ports, a restart keeps its port (clients and the name server know it)."""
        home = self.workdir / "broker"
        _write_home(home, "broker")
        first = not self.broker_port
        ports_tried = []
        for _ in range(PORT_ATTEMPTS):
            if first:
                # The broker also listens on port - 2 (its VIP channel) and port + 1 (HA).
                self.broker_port = free_port(neighbours=(-2, 1))
            ports_tried.append(self.broker_port)
            self.settings["listenPort"] = str(self.broker_port)
            _write_properties(home / "broker.conf", self.settings)
            self.broker = JavaServer("broker", home, "org.apache.rocketmq.broker.BrokerStartup",
                                     ["-c", str(home / "broker.conf")], BROKER_READY,
                                     self.heap_mb)
            if self.broker.try_start():
                return
            if not (first and self.broker.port_taken()):
                break
        raise AssertionError(f"Apache broker did not start (listenPorts tried: "
                             f"{ports_tried}):\n"
                             f"{self.broker.log_tail()}")

    def stop_broker(self) -> int | None:
        """Stop the broker only (clean shutdown); the name server stays."""
        return self.broker.stop() if self.broker else None

    def restart_broker(self) -> None:
        """Stop the broker and start it again on the same port and store."""
        self.stop_broker()
        self._start_broker()

    def stop(self) -> None:
        """Stop the broker, then the name server."""
        with contextlib.suppress(Exception):
            self.stop_broker()
        if self.namesrv is not None:
            self.namesrv.stop()

    def log_tail(self) -> str:
        """Both servers' log tails, for failure reports."""
        return "\n".join(server.log_tail() for server in (self.namesrv, self.broker) if server)

"""A master and its slave as real processes, for the replication tests (integration and
reliability), plus ways to look at them from outside: runtime tables, commit-log bytes on
disk, ``tidemq store check``.

``start_group(tidemq_cluster, role="ASYNC_MASTER", master={...}, slave={...})`` starts a name
server, a master ``broker-a`` (process name ``master``) and a slave of it (process name
``slave``, brokerId 1) and returns ``(cluster, master, slave)``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from server_processes import ServerProcess, TidemqCluster, remoting_call, wait_until
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.command import RemotingCommand

BROKER_NAME = "broker-a"
# Quick heartbeats so a test sees a slave's state change within a second or two.
HA_TEST_SETTINGS = {"haSendHeartbeatInterval": "500", "haHousekeepingInterval": "5000"}
CATCH_UP_S = 120.0


def start_group(tidemq_cluster: Callable[..., TidemqCluster], role: str = "ASYNC_MASTER",
                master: Mapping[str, object] | None = None,
                slave: Mapping[str, object] | None = None,
                with_slave: bool = True) -> tuple[TidemqCluster, ServerProcess,
                                                  ServerProcess | None]:
    """A name server, a master of ``role`` and (``with_slave``) its slave."""
    names = ("master", "slave") if with_slave else ("master",)
    overrides: dict[str, dict[str, object]] = {
        "master": {"brokerName": BROKER_NAME, "brokerRole": role, **HA_TEST_SETTINGS,
                   **(master or {})},
        "slave": {"brokerName": BROKER_NAME, "brokerId": 1, "brokerRole": "SLAVE",
                  **HA_TEST_SETTINGS, **(slave or {})},
    }
    cluster = tidemq_cluster(brokers=names,
                             broker_overrides={n: overrides[n] for n in names})
    master_process = cluster.broker("master")
    if role == "SYNC_MASTER" and with_slave:
        # A SYNC_MASTER answers SLAVE_NOT_AVAILABLE until its slave has connected and
        # acknowledged: the brokers' start says nothing of that, and a test's first sends
        # could beat the slave's connection on a busy machine.
        wait_until(lambda: runtime(master_process.addr).get("inSyncSlaveNums") == "1",
                   CATCH_UP_S, 0.05, "the slave to be in sync with its SYNC_MASTER")
    return cluster, master_process, cluster.broker("slave") if with_slave else None


def runtime(addr: str) -> dict[str, str]:
    """GET_BROKER_RUNTIME_INFO of the broker at ``addr``."""
    response = remoting_call(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO))
    return {str(k): str(v) for k, v in (jsonx.loads(response.body or b"{}")["table"]).items()}


def max_offset(server: ServerProcess) -> int:
    """The broker's commit-log end (commitLogMaxOffset)."""
    return int(runtime(server.addr)["commitLogMaxOffset"])


def wait_caught_up(master: ServerProcess, slave: ServerProcess,
                   timeout_s: float = CATCH_UP_S) -> int:
    """Wait until the slave's commit log ends where the master's does; return that end."""
    ends: dict[str, int] = {}

    def caught_up() -> bool:
        ends["master"] = max_offset(master)
        ends["slave"] = max_offset(slave)
        return ends["master"] == ends["slave"]

    try:
        wait_until(caught_up, timeout_s, 0.1, "the slave to catch up")
    except AssertionError:
        raise AssertionError(f"slave not caught up: {ends}\n{master.log_tail()}\n"
                             f"{slave.log_tail()}") from None
    return ends["master"]


def wait_quiet(master: ServerProcess, slave: ServerProcess) -> int:
    """Wait until the slave caught up and the master wrote nothing more for a second (work
    the broker finishes after answering, e.g. a transaction's committed copy, has landed)."""
    while True:
        end = wait_caught_up(master, slave)
        time.sleep(1.0)
        if max_offset(master) == end:
            return end


def store_dir(server: ServerProcess) -> Path:
    """The broker's storePathRootDir (server_processes puts it in ``<folder>/store``)."""
    return server.workdir / "store"


def commit_log_bytes(server: ServerProcess, start: int, end: int) -> bytes:
    """The bytes [start, end) of the broker's commit log, read from its segment files."""
    directory = store_dir(server) / "commitlog"
    segments = sorted((int(name), directory / name) for name in os.listdir(directory)
                      if name.isdigit())
    out = bytearray()
    for first, path in segments:
        size = path.stat().st_size
        low, high = max(start, first), min(end, first + size)
        if low < high:
            with open(path, "rb") as file:
                file.seek(low - first)
                out += file.read(high - low)
    return bytes(out)


def store_check(server: ServerProcess) -> subprocess.CompletedProcess[str]:
    """``tidemq store check`` of the broker's store (run it with the broker stopped)."""
    return subprocess.run([sys.executable, "-m", "tidemq", "store", "check",
                           str(store_dir(server))], capture_output=True, text=True, timeout=300,
                          check=False)

"""Servers log to a rotating file as well as stderr, one line per event."""

from __future__ import annotations

import pytest

from server_processes import remoting_call, wait_until
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.command import RemotingCommand

pytestmark = pytest.mark.integration


def test_broker_and_namesrv_log_files_rotate_and_keep_the_count(tidemq_cluster, tmp_path):
    log_dir = tmp_path / "broker-logs"
    cluster = tidemq_cluster(broker_overrides={
        "logDir": str(log_dir), "logMaxSize": "4096", "logFileCount": "2",
        "logLevel": "debug"})
    broker = cluster.broker("broker-a")
    # the name server's default folder is ./logs (its working folder here)
    namesrv_log = cluster.namesrvs[0].workdir / "logs" / "namesrv.log"
    assert "name server listening" in namesrv_log.read_text()

    def one_connection() -> None:  # a connection opened and closed: two DEBUG lines
        remoting_call(broker.addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO))

    def rotated_twice() -> bool:
        one_connection()
        return (log_dir / "broker.log.2").exists()

    wait_until(rotated_twice, timeout_s=120, what="broker.log rotated twice")
    for _ in range(40):
        one_connection()
    files = sorted(path.name for path in log_dir.iterdir())
    assert files == ["broker.log", "broker.log.1", "broker.log.2"]  # never a .3
    for path in log_dir.iterdir():
        lines = path.read_text().splitlines()
        assert path.stat().st_size <= 4096 + max(map(len, lines)) + 1
        # one event per line: every line starts with its date and time
        assert all(line[:4].isdigit() and line[4] == "-" for line in lines), path
    assert "logging to" in broker.stderr_path.read_text()

"""``tidemq namesrv|broker|dev`` as a user runs them: start-up lines, errors, clean stops."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

pytestmark = pytest.mark.integration

COMMAND_TIMEOUT_S = 60


def run_tidemq(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tidemq <args>`` to completion (for commands that fail at start)."""
    return subprocess.run(
        [sys.executable, "-m", "tidemq", *args], cwd=cwd, capture_output=True, text=True,
        timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL,
    )


def test_unknown_key_fails_at_start_naming_it(tmp_path):
    result = run_tidemq("namesrv", "--bogusKey", "1", cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown key bogusKey" in result.stderr
    assert "Traceback" not in result.stderr


def test_misspelled_key_gets_a_suggestion(tmp_path):
    config = tmp_path / "namesrv.properties"
    config.write_text("listenPrt=9876\n")
    result = run_tidemq("namesrv", "-c", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert f"unknown key listenPrt in {config}; did you mean listenPort?" in result.stderr


def test_bad_value_names_key_value_and_choices(tmp_path):
    result = run_tidemq("broker", "--flushDiskType", "SYNC", cwd=tmp_path)
    assert result.returncode == 2
    assert "flushDiskType=SYNC" in result.stderr
    assert "ASYNC_FLUSH, SYNC_FLUSH" in result.stderr
    assert "Traceback" not in result.stderr


def test_port_in_use_names_the_port_and_the_setting(tidemq_cluster, tmp_path):
    namesrv = tidemq_cluster(namesrv_count=1, brokers=()).namesrvs[0]
    result = run_tidemq("namesrv", "--listenPort", str(namesrv.port), cwd=tmp_path)
    assert result.returncode == 1
    assert f"127.0.0.1:{namesrv.port}" in result.stderr
    assert "listenPort" in result.stderr
    assert "Traceback" not in result.stderr


def test_dev_port_in_use_names_the_dev_option(tidemq_cluster, tmp_path):
    namesrv = tidemq_cluster(namesrv_count=1, brokers=()).namesrvs[0]
    result = run_tidemq("dev", "--namesrvPort", str(namesrv.port), cwd=tmp_path)
    assert result.returncode == 1
    assert "--namesrvPort" in result.stderr
    assert "Traceback" not in result.stderr


def test_namesrv_reads_its_port_from_the_config_file(tidemq_server, remoting_call, tmp_path):
    config = tmp_path / "namesrv.properties"

    def make_args(port: int) -> list[str]:
        config.write_text(f"# RocketMQ style\nlistenPort = {port}\nrocketmqHome=/opt/rmq\n")
        return ["-c", str(config)]

    server = tidemq_server("namesrv", "namesrv-from-file", make_args)
    server.start()
    stdout = server.stdout_path.read_text()
    assert f"tidemq namesrv: listening on 127.0.0.1:{server.port}; Ctrl-C to stop" in stdout
    response = remoting_call(server.addr, RemotingCommand.request(
        RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}))
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert "ignoring rocketmqHome" in server.stderr_path.read_text()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_namesrv_stops_cleanly_on_a_signal(tidemq_cluster, stop_signal):
    namesrv = tidemq_cluster(namesrv_count=1, brokers=()).namesrvs[0]
    namesrv.kill(stop_signal)
    namesrv.process.wait(30)
    assert namesrv.process.returncode == 0
    stderr = namesrv.stderr_path.read_text()
    assert f"{stop_signal.name} received: shutting down" in stderr
    assert "stopped" in stderr
    assert "Traceback" not in stderr

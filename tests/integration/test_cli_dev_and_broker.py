"""``tidemq dev`` and ``tidemq broker`` processes: they serve, register, and stop cleanly."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.request

import pytest

from server_processes import DevBrokerPorts, option_args
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

pytestmark = pytest.mark.integration


def route(remoting_call, namesrv_addr: str, topic: str) -> RemotingCommand:
    return remoting_call(namesrv_addr, RemotingCommand.request(
        RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))


def cluster_info(remoting_call, namesrv_addr: str) -> dict:
    response = remoting_call(namesrv_addr, RemotingCommand.request(
        RequestCode.GET_BROKER_CLUSTER_INFO))
    assert response.code == ResponseCode.SUCCESS
    return jsonx.loads(response.body)


def test_dev_runs_a_name_server_and_a_broker(tidemq_server, test_broker_settings,
                                             remoting_call, tmp_path):
    broker_ports = DevBrokerPorts()
    store = tmp_path / "dev-data"

    def make_args(port: int) -> list[str]:
        return ["--namesrvPort", str(port), "--listenPort", str(broker_ports(port)),
                "--storePathRootDir", str(store), *option_args(test_broker_settings)]

    dev = tidemq_server("dev", "dev", make_args)
    dev.start()
    broker_port = broker_ports(dev.port)
    banner = (f"tidemq dev: name server 127.0.0.1:{dev.port}, broker broker-a "
              f"127.0.0.1:{broker_port} (cluster DefaultCluster), store {store}")
    printed = re.search(re.escape(banner) + r", console (http://127\.0\.0\.1:\d+/), metrics "
                        r"(http://127\.0\.0\.1:\d+/metrics) \(broker\) "
                        r"(http://127\.0\.0\.1:\d+/metrics) \(name server\); Ctrl-C to stop",
                        dev.stdout_path.read_text())
    assert printed, dev.stdout_path.read_text()
    # The console it printed serves the cluster page (read-only unless --consoleWrite true),
    # and both metrics endpoints answer (metrics are on in dev).
    with urllib.request.urlopen(printed.group(1), timeout=30) as page:
        html = page.read().decode()
    with urllib.request.urlopen(printed.group(2), timeout=30) as page:
        assert "tidemq_broker_info{" in page.read().decode()
    with urllib.request.urlopen(printed.group(3), timeout=30) as page:
        assert "tidemq_namesrv_live_brokers{" in page.read().decode()
    assert f"127.0.0.1:{broker_port}" in html and "read-only" in html

    # The broker registered its built-in topics, TBW102 among them, with the name server.
    response = route(remoting_call, dev.addr, "TBW102")
    assert response.code == ResponseCode.SUCCESS
    assert jsonx.loads(response.body)["brokerDatas"][0]["brokerAddrs"] == {
        "0": f"127.0.0.1:{broker_port}"}
    assert cluster_info(remoting_call, dev.addr)["clusterAddrTable"] == {
        "DefaultCluster": ["broker-a"]}

    assert dev.stop() == 0
    stderr = dev.stderr_path.read_text()
    assert "Traceback" not in stderr
    assert not (store / "abort").exists(), "a clean stop leaves no abort file"

    dev.start()  # again on the same store
    assert route(remoting_call, dev.addr, "TBW102").code == ResponseCode.SUCCESS


def test_broker_registers_with_every_name_server(tidemq_cluster, remoting_call, wait_until):
    cluster = tidemq_cluster(namesrv_count=2, brokers=["broker-a"])
    broker = cluster.broker("broker-a")
    for namesrv in cluster.namesrvs:
        response = route(remoting_call, namesrv.addr, "TBW102")
        assert response.code == ResponseCode.SUCCESS
        assert jsonx.loads(response.body)["brokerDatas"][0]["brokerAddrs"] == {
            "0": broker.addr}

    broker.kill(signal.SIGKILL)
    for namesrv in cluster.namesrvs:  # its connections closed: dropped at once, not in 120 s
        wait_until(lambda addr=namesrv.addr: route(remoting_call, addr, "TBW102").code
                   == ResponseCode.TOPIC_NOT_EXIST,
                   timeout_s=20, what=f"{namesrv.name} to drop the killed broker")

    broker.restart()
    for namesrv in cluster.namesrvs:
        assert route(remoting_call, namesrv.addr, "TBW102").code == ResponseCode.SUCCESS


def test_broker_reads_a_rocketmq_broker_conf(tidemq_cluster, tidemq_server, remoting_call,
                                             test_broker_settings, tmp_path):
    namesrv = tidemq_cluster(namesrv_count=1, brokers=()).namesrvs[0]
    config = tmp_path / "broker.conf"

    def make_args(port: int) -> list[str]:
        config.write_text(
            "brokerClusterName = OrdersCluster\n"
            "brokerName = broker-x\n"
            "brokerId = 0\n"
            "deleteWhen = 04\n"
            "fileReservedTime = 48\n"
            "brokerRole = ASYNC_MASTER\n"
            "flushDiskType = ASYNC_FLUSH\n"
            f"listenPort = {port}\n"
            f"storePathRootDir = {tmp_path / 'store-x'}\n"
        )
        return ["-c", str(config), "-n", namesrv.addr, *option_args(test_broker_settings)]

    broker = tidemq_server("broker", "broker-x", make_args, port_neighbours=(-2, 1))
    broker.start()
    info = cluster_info(remoting_call, namesrv.addr)
    assert info["clusterAddrTable"] == {"OrdersCluster": ["broker-x"]}
    assert info["brokerAddrTable"]["broker-x"]["brokerAddrs"] == {0: broker.addr}


def test_second_broker_on_the_same_store_fails_clearly(tidemq_cluster, free_port,
                                                       test_broker_settings, tmp_path):
    cluster = tidemq_cluster(namesrv_count=0, brokers=["broker-a"])
    store = cluster.broker("broker-a").workdir / "store"
    result = subprocess.run(
        [sys.executable, "-m", "tidemq", "broker", "--listenPort",
         str(free_port(neighbours=(-2, 1))), "--storePathRootDir", str(store),
         *option_args(test_broker_settings)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 1
    assert str(store) in result.stderr
    assert "Traceback" not in result.stderr


def test_broker_raises_its_open_file_soft_limit_to_the_hard_limit(
        tidemq_server, test_broker_settings, tmp_path):
    """Every mapped queue file holds a descriptor: the broker starts by raising its soft
    open-file limit to the hard limit, so a low inherited soft limit does not cap its queues."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 256
    if hard != resource.RLIM_INFINITY and hard <= low:
        pytest.skip(f"the hard open-file limit here is {hard}: nothing to raise to")
    broker_port = DevBrokerPorts()

    def make_args(port: int) -> list[str]:
        return ["--namesrvPort", str(port), "--listenPort", str(broker_port(port)),
                "--storePathRootDir", str(tmp_path / "data"), *option_args(test_broker_settings)]

    dev = tidemq_server("dev", "dev", make_args)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))  # inherited by the child
    try:
        dev.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    with open(f"/proc/{dev.pid}/limits") as limits:
        line = next(line for line in limits if line.startswith("Max open files"))
    expected = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    assert line.split()[3:5] == [expected, expected]
    assert f"raised the open-file soft limit from {low} to the hard limit" in (
        dev.stderr_path.read_text())

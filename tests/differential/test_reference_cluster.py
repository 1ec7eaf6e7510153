"""The reference cluster's own start-up: a port taken between its pick and the JVM's bind.

Other test runs share the machine, so a port found free may be taken before Apache's name
server or broker binds it; the JVM then prints a BindException and exits, and
tests/reference_cluster.py starts it again on new ports (as tests/server_processes.py does
for tidemq's servers). Here the first port picked for each is taken on purpose.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import reference_cluster
from reference_cluster import PORT_TAKEN, ReferenceCluster
from server_processes import remoting_call
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

pytestmark = pytest.mark.differential


@pytest.fixture
def taken_ports(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The first two ports the cluster picks are taken before its JVMs bind them: the name
    server's listenPort, then the broker's HA port (listenPort + 1)."""
    held: list[socket.socket] = []
    taken: list[int] = []
    pick = reference_cluster.free_port
    first_pick = {"namesrv": True, "broker": True}  # the broker's is the one with neighbours

    def pick_then_take(*, neighbours: Sequence[int] = ()) -> int:
        port = pick(neighbours=neighbours)
        kind = "broker" if neighbours else "namesrv"
        if first_pick[kind]:
            first_pick[kind] = False
            busy = port + 1 if kind == "broker" else port
            holder = socket.socket()
            holder.bind(("127.0.0.1", busy))
            holder.listen()
            held.append(holder)
            taken.append(busy)
        return port

    monkeypatch.setattr(reference_cluster, "free_port", pick_then_take)
    yield taken
    for holder in held:
        holder.close()


def test_taken_ports_are_replaced_at_first_start(tmp_path: Path, taken_ports: list[int]):
    apache = ReferenceCluster(tmp_path / "apache")
    try:
        apache.start()
        assert len(taken_ports) == 2
        namesrv_taken, ha_taken = taken_ports
        assert apache.namesrv_port != namesrv_taken
        assert apache.broker_port + 1 != ha_taken
        # Each JVM failed once for the taken port, then started on the new one.
        for home in ("namesrv", "broker"):
            stdout = (tmp_path / "apache" / home / "stdout.log").read_text(errors="replace")
            assert stdout.count(PORT_TAKEN) == 1, stdout[-4000:]
        # The broker that started registered with the name server that started.
        answer = remoting_call(apache.namesrv_addr, RemotingCommand.request(
            RequestCode.GET_BROKER_CLUSTER_INFO))
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        assert apache.broker_addr.encode() in answer.body
    except AssertionError:
        print(apache.log_tail())
        raise
    finally:
        apache.stop()

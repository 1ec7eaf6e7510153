"""TLS on real ``tidemq broker`` / ``tidemq namesrv`` processes (tlsEnable=true), with
certificates made for the run by ``openssl`` (tests/tls_certs.py).

enforcing: the tidemq client over TLS produces and consumes, a plain client is refused;
permissive: both on one port; mutual TLS: a client without a trusted certificate is
refused; ``tidemq admin --tlsCaFile`` works against them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from routed_topics import create_routed_topic
from tidemq.client import Message, Producer, PullConsumer, tls_context
from tidemq.errors import TidemqError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting.loop import run

pytestmark = pytest.mark.integration

WAIT_S = 60.0


def tls_settings(pki, mode: str, client_auth: str = "none", *, broker: bool = True
                 ) -> dict[str, str]:
    settings = {"tlsEnable": "true", "tlsServerMode": mode,
                "tlsServerCertPath": str(pki.server_cert),
                "tlsServerKeyPath": str(pki.server_key)}
    if client_auth != "none":
        settings |= {"tlsServerNeedClientAuth": client_auth,
                     "tlsServerTrustCertPath": str(pki.ca_cert)}
    if broker:  # an enforcing broker registers over TLS: it verifies the name server by it
        settings |= {"tlsClientTrustCertPath": str(pki.ca_cert)}
    return settings


async def round_trip(namesrv: str, topic: str, tls, count: int = 5) -> list[bytes]:
    """Create ``topic``, send ``count`` messages and read them back, every connection with
    ``tls``."""
    await create_routed_topic(namesrv, topic, 2, tls=tls)
    async with Producer("tls-pg", namesrv, tls=tls, retry_times_when_send_failed=0) as producer:
        for n in range(count):
            await producer.send(Message(topic, f"m{n}".encode()))
    received = []
    async with PullConsumer(f"cg-{topic}", namesrv, tls=tls, consume_from="FIRST") as consumer:
        consumer.subscribe(topic)
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while len(received) < count and asyncio.get_running_loop().time() < deadline:
            received += await consumer.poll(timeout_ms=1000)
    return sorted(m.body for m in received)


def plain_call_answered(addr: str) -> bool:
    """Whether a plain-TCP request to ``addr`` gets an answer (False: closed unanswered)."""
    import socket

    from server_processes import read_response

    host, _, port = addr.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO).encode())
        try:
            return read_response(connection, 10).code == ResponseCode.SUCCESS
        except (AssertionError, OSError):
            return False


def test_enforcing_serves_tls_clients_and_refuses_plain_ones(tidemq_cluster, pki):
    cluster = tidemq_cluster(broker_overrides=tls_settings(pki, "enforcing"),
                             namesrv_overrides=tls_settings(pki, "permissive", broker=False))
    tls = tls_context(pki.ca_cert)
    assert run(round_trip(cluster.namesrv_addr, "TlsOrders", tls)) == [
        b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert not plain_call_answered(cluster.brokers[0].addr)

    async def plain_send() -> None:
        async with Producer("plain-pg", cluster.namesrv_addr,
                            retry_times_when_send_failed=0, send_timeout_ms=5000) as producer:
            await producer.send(Message("TlsOrders", b"plain"))

    with pytest.raises(TidemqError):
        run(plain_send())

    # tidemq admin over TLS, verifying the servers by the test CA
    listed = subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", "--tlsCaFile", str(pki.ca_cert),
         "topicStatus", "-n", cluster.namesrv_addr, "-t", "TlsOrders", "--json"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert listed.returncode == 0, listed.stderr
    assert sum(queue["maxOffset"] for queue in json.loads(listed.stdout)) == 5


def test_permissive_serves_tls_and_plain_clients_on_one_port(tidemq_cluster, pki):
    cluster = tidemq_cluster(broker_overrides=tls_settings(pki, "permissive"),
                             namesrv_overrides=tls_settings(pki, "permissive", broker=False))
    assert run(round_trip(cluster.namesrv_addr, "Mixed", tls_context(pki.ca_cert))) == [
        b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert run(round_trip(cluster.namesrv_addr, "MixedPlain", None)) == [
        b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert plain_call_answered(cluster.brokers[0].addr)


def test_mutual_tls_refuses_a_client_without_a_certificate(tidemq_cluster, pki):
    cluster = tidemq_cluster(broker_overrides=tls_settings(pki, "enforcing", "require"),
                             namesrv_overrides=tls_settings(pki, "permissive", broker=False))
    with_cert = tls_context(pki.ca_cert, cert_file=pki.client_cert, key_file=pki.client_key)
    assert run(round_trip(cluster.namesrv_addr, "Mutual", with_cert)) == [
        b"m0", b"m1", b"m2", b"m3", b"m4"]

    async def send_without_cert() -> None:
        async with Producer("nocert-pg", cluster.namesrv_addr, tls=tls_context(pki.ca_cert),
                            retry_times_when_send_failed=0, send_timeout_ms=5000) as producer:
            await producer.send(Message("Mutual", b"no certificate"))

    with pytest.raises(TidemqError):
        run(send_without_cert())


def test_tls_settings_are_checked_at_start(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tidemq", "broker", "--tlsEnable", "true", "--listenPort", "0",
         "--storePathRootDir", str(tmp_path / "store")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result.stderr
    assert "tlsServerCertPath" in result.stderr and "Traceback" not in result.stderr

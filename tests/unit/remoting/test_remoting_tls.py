"""TLS on the remoting port: enforcing, permissive (TLS and plain on one port), mutual TLS.

Certificates are made for the run by ``openssl`` (tests/tls_certs.py); nothing is committed.
"""

from __future__ import annotations

import asyncio
import ssl

import pytest
from remoting_helpers import echo, read_command

from tidemq.errors import ConfigError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting import RemotingClient, RemotingServer
from tidemq.remoting.errors import RemotingClosed, RemotingConnectError, RemotingTimeout
from tidemq.remoting.tls import (
    ClientAuth,
    ServerTls,
    TlsMode,
    client_context,
    server_context,
)
from tls_certs import Pki

ECHO = RequestCode.SEND_MESSAGE_V2


def _server(pki: Pki, mode: TlsMode, auth: ClientAuth = ClientAuth.NONE) -> RemotingServer:
    context = server_context(
        pki.server_cert, pki.server_key, need_client_auth=auth,
        trust_cert_path=pki.ca_cert if auth is not ClientAuth.NONE else None,
    )
    server = RemotingServer("127.0.0.1", [0], tls=ServerTls(mode, context))
    server.register(ECHO, echo)
    return server


async def _echo_over(client: RemotingClient, server: RemotingServer, body: bytes) -> bytes:
    response = await client.invoke(
        f"127.0.0.1:{server.bound_ports[0]}", RemotingCommand.request(ECHO, {"k": "v"}, body), 5000
    )
    assert response.code == ResponseCode.SUCCESS
    return response.body


async def _plain_echo(server: RemotingServer) -> RemotingCommand | None:
    """One echo request over a raw plain socket; None when the server closed it instead."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.bound_ports[0])
    try:
        writer.write(RemotingCommand.request(ECHO, {"k": "v"}, b"plain").encode())
        await writer.drain()
        async with asyncio.timeout(10):
            return await read_command(reader)
    finally:
        writer.close()


def test_enforcing_serves_a_tls_client_and_closes_a_plain_one(run, pki):
    async def main():
        async with _server(pki, TlsMode.ENFORCING) as server:
            tls = client_context(ca_file=pki.ca_cert)
            async with RemotingClient(tls=tls) as client:
                assert await _echo_over(client, server, b"x" * 100_000) == b"x" * 100_000
            assert await _plain_echo(server) is None  # the handshake fails; no handler ran
            async with RemotingClient(connect_timeout_ms=2000) as plain_client:
                with pytest.raises((RemotingClosed, RemotingTimeout, RemotingConnectError)):
                    await _echo_over(plain_client, server, b"plain")

    run(main())


def test_permissive_serves_tls_and_plain_clients_on_one_port(run, pki):
    async def main():
        async with _server(pki, TlsMode.PERMISSIVE) as server:
            tls = client_context(ca_file=pki.ca_cert)
            async with RemotingClient(tls=tls) as tls_client, RemotingClient() as plain_client:
                assert await _echo_over(tls_client, server, b"secret") == b"secret"
                assert await _echo_over(plain_client, server, b"open") == b"open"
                response = await _plain_echo(server)
                assert response is not None and response.body == b"plain"
                assert len(server.connections) >= 2

    run(main())


def test_a_client_refuses_a_server_its_ca_did_not_sign(run, pki):
    async def main():
        async with _server(pki, TlsMode.ENFORCING) as server:
            tls = client_context(ca_file=pki.rogue_ca_cert)
            async with RemotingClient(tls=tls) as client:
                with pytest.raises(RemotingConnectError, match="TLS handshake"):
                    await _echo_over(client, server, b"x")

    run(main())


@pytest.mark.parametrize("mode", [TlsMode.ENFORCING, TlsMode.PERMISSIVE])
def test_mutual_tls_refuses_a_client_without_a_trusted_certificate(run, pki, mode):
    async def main():
        async with _server(pki, mode, ClientAuth.REQUIRE) as server:
            good = client_context(ca_file=pki.ca_cert, cert_file=pki.client_cert,
                                  key_file=pki.client_key)
            async with RemotingClient(tls=good) as client:
                assert await _echo_over(client, server, b"ok") == b"ok"
            for tls in (
                client_context(ca_file=pki.ca_cert),  # no certificate at all
                client_context(ca_file=pki.ca_cert, cert_file=pki.rogue_client_cert,
                               key_file=pki.rogue_client_key),  # signed by an unknown CA
            ):
                async with RemotingClient(tls=tls, connect_timeout_ms=3000) as client:
                    # TLS 1.3 finishes the client's side of the handshake before the server
                    # checks its certificate: the refusal shows as a closed connection.
                    with pytest.raises((RemotingConnectError, RemotingClosed)):
                        await _echo_over(client, server, b"no")

    run(main())


def test_server_context_errors_name_the_setting(pki, tmp_path):
    with pytest.raises(ConfigError, match="tlsServerCertPath"):
        server_context(tmp_path / "missing.pem", pki.server_key)
    with pytest.raises(ConfigError, match="tlsServerTrustCertPath"):
        server_context(pki.server_cert, pki.server_key, need_client_auth=ClientAuth.REQUIRE)
    with pytest.raises(ConfigError, match="belong together"):
        server_context(pki.server_cert, pki.client_key)
    context = server_context(pki.server_cert, pki.server_key)
    assert context.verify_mode == ssl.CERT_NONE

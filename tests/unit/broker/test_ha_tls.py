"""The HA stream over TLS in one process (broker/ha/ with tidemq.remoting.listening): an
enforcing master streams to a TLS slave and closes a plain one, a permissive master takes
both, a slave that does not trust the master's certificate copies nothing.

Certificates are made for the run by ``openssl`` (tests/tls_certs.py).
"""

from __future__ import annotations

import asyncio
import logging
import random

from test_ha_stream import FAST, StubCheck, log_bytes, new_store, put_some, until

from tidemq.broker.ha import HAClient, HAService
from tidemq.broker.ha.wire import ChunkDecoder, encode_report
from tidemq.remoting.tls import ServerTls, TlsMode, client_context, server_context
from tls_certs import Pki

WAIT_S = 20.0


def _service(pki: Pki, mode: TlsMode, store) -> HAService:
    tls = ServerTls(mode, server_context(pki.server_cert, pki.server_key))
    return HAService(store, "127.0.0.1", 0, FAST, "broker-a", tls=tls)


async def _copied_by(service: HAService, master, tls) -> bytes:
    """Start a slave (TLS with ``tls``, else plain) until it holds the master's whole log;
    return its log."""
    slave = new_store()
    client = HAClient(slave, StubCheck(), FAST, service.address, "broker-a", tls=tls)
    client.start()
    try:
        end = master.commit_log_max_offset()
        await until(lambda: slave.commit_log_max_offset() == end, "the slave to catch up")
        await until(lambda: any(c.acked_offset == end for c in service.connections),
                    "the slave's acknowledgement")
        return log_bytes(slave, 0, end)
    finally:
        await client.stop()


async def _plain_peer_gets(service: HAService) -> bytes:
    """What a plain-TCP peer that reports offset 0 receives before the master closes it
    (or until the first chunk arrives)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
    received = b""
    try:
        writer.write(encode_report(0))
        await writer.drain()
        async with asyncio.timeout(WAIT_S):
            while True:
                data = await reader.read(65536)
                if not data:
                    return received
                received += data
                if list(ChunkDecoder().feed(received)):
                    return received
    except (ConnectionError, OSError):
        return received
    finally:
        writer.close()


def test_an_enforcing_master_streams_to_a_tls_slave_and_closes_a_plain_one(pki, caplog):
    async def main() -> None:
        master = new_store()
        put_some(master, random.Random(5), 120)
        service = _service(pki, TlsMode.ENFORCING, master)
        await service.start()
        master.add_dispatch_listener(lambda *_: service.notify_appended())
        try:
            end = master.commit_log_max_offset()
            copied = await _copied_by(service, master, client_context(ca_file=pki.ca_cert))
            assert copied == log_bytes(master, 0, end)
            assert await _plain_peer_gets(service) == b""  # closed in the handshake
            # A plain HAClient never connects; it says why it was dropped.
            slave = new_store()
            client = HAClient(slave, StubCheck(), FAST, service.address, "broker-a")
            client.start()
            try:
                await until(lambda: any("take TLS only" in r.getMessage()
                                        for r in caplog.records), "the plain slave's warning")
                assert slave.commit_log_max_offset() == 0
            finally:
                await client.stop()
        finally:
            await service.stop()

    with caplog.at_level(logging.WARNING, logger="tidemq.broker.ha"):
        asyncio.run(main())


def test_a_permissive_master_streams_to_tls_and_plain_slaves_on_one_port(pki):
    async def main() -> None:
        master = new_store()
        put_some(master, random.Random(6), 60)
        service = _service(pki, TlsMode.PERMISSIVE, master)
        await service.start()
        master.add_dispatch_listener(lambda *_: service.notify_appended())
        try:
            whole = log_bytes(master, 0, master.commit_log_max_offset())
            assert await _copied_by(service, master, client_context(ca_file=pki.ca_cert)) == whole
            assert await _copied_by(service, master, None) == whole
        finally:
            await service.stop()

    asyncio.run(main())


def test_a_slave_that_does_not_trust_the_masters_certificate_copies_nothing(pki, caplog):
    async def main() -> None:
        master = new_store()
        put_some(master, random.Random(7), 20)
        service = _service(pki, TlsMode.ENFORCING, master)
        await service.start()
        try:
            slave = new_store()
            client = HAClient(slave, StubCheck(), FAST, service.address, "broker-a",
                              tls=client_context(ca_file=pki.rogue_ca_cert))
            client.start()
            try:
                await until(lambda: any("CERTIFICATE_VERIFY_FAILED" in r.getMessage()
                                        for r in caplog.records), "the refused handshake")
                assert slave.commit_log_max_offset() == 0 and service.connections == []
            finally:
                await client.stop()
        finally:
            await service.stop()

    with caplog.at_level(logging.WARNING, logger="tidemq.broker.ha"):
        asyncio.run(main())

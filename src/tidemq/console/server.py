"""Serving the console: on its own (``tidemq console``) or inside ``tidemq dev``."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from aiohttp import web

from tidemq.client.admin import Admin
from tidemq.client.security import Credentials, TlsOption
from tidemq.client.trace_data import TRACE_TOPIC_DEFAULT
from tidemq.console.app import create_app
from tidemq.console.sampler import SAMPLE_INTERVAL_S

log = logging.getLogger("tidemq.console")


class ConsoleServer:
    """A running console: its own Admin client and an aiohttp site on ``host:port``.

    Args:
        namesrv: name server addresses the console's Admin uses.
        host, port: where to listen (port 0: any free port; ``port`` tells which after
            ``start``).
        write_enabled: allow changes (create/update/delete topics, reset offsets, redrive).
        trace_topic: where message traces are read from.
        credentials: ACL keys the console's Admin signs every request with (a cluster with
            ACL on answers only what that account may see and do).
        tls: TLS towards the servers, as for ``Admin``.
    """

    def __init__(self, namesrv: str | Iterable[str], *, host: str = "127.0.0.1",
                 port: int = 8080, write_enabled: bool = False,
                 trace_topic: str = TRACE_TOPIC_DEFAULT,
                 sample_interval_s: float = SAMPLE_INTERVAL_S,
                 credentials: Credentials | None = None, tls: TlsOption = None) -> None:
        self.host = host
        self.port = port
        self.write_enabled = write_enabled
        self._admin = Admin(namesrv, credentials=credentials, tls=tls)
        self._app = create_app(self._admin, write_enabled=write_enabled,
                               trace_topic=trace_topic, sample_interval_s=sample_interval_s)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    async def start(self) -> None:
        """Start the Admin client and listen.

        Raises:
            OSError: the port cannot be bound (in use, or not allowed).
        """
        await self._admin.start()
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError:
            await self.close()
            raise
        addresses = self._runner.addresses
        if addresses:
            self.port = addresses[0][1]
        log.info("console listening on %s (%s)", self.url,
                 "write actions enabled" if self.write_enabled else "read-only")

    async def close(self) -> None:
        """Stop listening and close the Admin client. Idempotent."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self._admin.close()

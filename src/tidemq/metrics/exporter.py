"""The /metrics endpoint: a minimal HTTP/1.1 server on the server's own event loop.

Collectors read the server's state (tables, counters) at scrape time; serving the scrape on
the loop that owns that state means no lock and no torn reads (prometheus_client's own
server runs in a thread, which would read those dicts while the loop changes them). The
text is prometheus_client's ``generate_latest``; only the HTTP framing is here: ``GET
/metrics`` (or ``/``) answers 200 with the exposition, any other path 404, any other method
405; a request line or headers over REQUEST_BYTES_MAX close the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tidemq.remoting.errors import RemotingListenError

log = logging.getLogger("tidemq.metrics")

METRICS_PORT_DEFAULT = 5557  # RocketMQ 5's metricsPromExporterPort default
REQUEST_BYTES_MAX = 8192  # a scrape's request line and headers; more is not a scraper
READ_TIMEOUT_S = 10.0


class MetricsExporter:
    """Serves ``registry`` at ``http://host:port/metrics``.

    Args:
        registry: what to expose (the caller registers its collectors).
        host, port: where to listen; port 0 picks a free port (``port`` says which after
            ``start``).
    """

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    async def start(self) -> None:
        """Listen.

        Raises:
            RemotingListenError: the port cannot be bound (naming it and the key to change).
        """
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
        except OSError as e:
            raise RemotingListenError(
                f"cannot serve metrics on {self.host}:{self.port}: {e.strerror or e} (set "
                "metricsPromExporterPort to a free port, or 0 for any)") from None
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("Prometheus metrics at %s", self.url)

    async def stop(self) -> None:
        """Stop listening and close open scrapes. Idempotent."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ConnectionError):
            writer.close()
            return
        try:
            if len(head) > REQUEST_BYTES_MAX:
                status, body, content_type = ("431 Request Header Fields Too Large", b"",
                                              "text/plain")
            else:
                status, body, content_type = self._answer(head)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _answer(self, head: bytes) -> tuple[str, bytes, str]:
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3:
            return "400 Bad Request", b"malformed request line\n", "text/plain"
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return "405 Method Not Allowed", b"only GET /metrics\n", "text/plain"
        if target not in (b"/metrics", b"/"):
            return "404 Not Found", b"metrics are at /metrics\n", "text/plain"
        try:
            body = generate_latest(self.registry)
        except Exception:
            log.exception("collecting metrics failed")
            return "500 Internal Server Error", b"collecting metrics failed\n", "text/plain"
        return "200 OK", b"" if method == b"HEAD" else body, CONTENT_TYPE_LATEST

"""NamesrvController: one name server — remoting server, route tables, KV config, expiry scan.

Lifecycle: ``await start()`` loads the KV config, binds the port and starts the scan that
drops brokers silent for ``brokerChannelExpiredTime``; ``await shutdown()`` stops the scan
and the server (requests being handled finish first). Everything runs on the caller's event
loop; the route tables have no other owner.

A broker also leaves the tables at once when the connection it registered over closes (the
server's connection listener), so clients stop getting routes to a dead broker within one
route refresh instead of two minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from tidemq.acl.acl_file import acl_file_of
from tidemq.acl.permission import NAMESRV_CHECKED_CODES
from tidemq.acl.service import AclService
from tidemq.metrics.exporter import MetricsExporter
from tidemq.metrics.requests import RequestMetrics
from tidemq.namesrv.config import NamesrvConfig
from tidemq.namesrv.kv_config import KVConfigManager
from tidemq.namesrv.metrics import namesrv_exporter
from tidemq.namesrv.processor import NamesrvProcessor
from tidemq.namesrv.route_info_manager import RouteInfoManager
from tidemq.remoting.connection import Connection
from tidemq.remoting.server import ConnectionEvent, RemotingServer

log = logging.getLogger("tidemq.namesrv")


class NamesrvController:
    """A name server.

    Args:
        config: its settings; ``listen_port`` 0 picks a free port (read ``port``).

    Attributes:
        route_info: the route tables.
        kv_config: the KV settings.
        server: the remoting server (exists from construction; listening after ``start``).
    """

    def __init__(self, config: NamesrvConfig | None = None) -> None:
        self.config = config if config is not None else NamesrvConfig()
        self.route_info = RouteInfoManager()
        self.kv_config = KVConfigManager(self.config.kv_config_path)
        self.processor = NamesrvProcessor(self.config, self.route_info, self.kv_config,
                                          clock_ms=_now_ms)
        # ACL on the write operations only (reads stay open, as in RocketMQ); a missing or
        # broken ACL file stops the start here.
        self.acl = (
            AclService(acl_file_of(self.config.acl_file_path),
                       checked_codes=NAMESRV_CHECKED_CODES)
            if self.config.acl_enable else None
        )
        self.server = RemotingServer(
            self.config.bind_address,
            [self.config.listen_port],
            idle_timeout_s=self.config.server_channel_max_idle_time_seconds,
            tls=self.config.server_tls(),
        )
        if self.acl is not None:
            self.server.set_request_guard(self.acl.guard)
        self.processor.register(self.server)
        self.server.connection_listeners.append(self._connection_event)
        self._scan_task: asyncio.Task[None] | None = None
        self._bound_port: int | None = None
        self.metrics_exporter: MetricsExporter | None = None
        if self.config.metrics_exporter_type == "PROM":
            requests = RequestMetrics("tidemq_namesrv")
            self.server.set_request_observer(requests.observe)
            self.metrics_exporter = namesrv_exporter(
                self.config, self.route_info, lambda: len(self.server.connections), requests)

    @property
    def port(self) -> int:
        """The port listened on (the configured one, or the one picked for port 0)."""
        return self._bound_port if self._bound_port is not None else self.config.listen_port

    @property
    def address(self) -> str:
        """``host:port`` clients should use."""
        return f"{self.config.bind_address}:{self.port}"

    async def start(self) -> None:
        """Load the KV config, listen, and start the expiry scan.

        Raises:
            ConfigFileCorrupt: the KV config file is unreadable.
            RemotingListenError: the port cannot be bound.
        """
        self.kv_config.load()
        await self.server.start()
        if self.acl is not None:
            self.acl.start()
        self._bound_port = self.server.bound_ports[0]
        self._scan_task = asyncio.get_running_loop().create_task(
            self._scan_not_active_brokers(), name="namesrv-broker-expiry-scan"
        )
        if self.metrics_exporter is not None:
            await self.metrics_exporter.start()
        log.info("name server listening on %s", self.address)

    async def shutdown(self, grace_s: float = 5.0) -> None:
        """Stop the scan and the server; requests being handled get ``grace_s`` to finish."""
        if self._scan_task is not None:
            self._scan_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scan_task
            self._scan_task = None
        if self.metrics_exporter is not None:
            await self.metrics_exporter.stop()
        if self.acl is not None:
            await self.acl.stop()
        await self.server.stop(grace_s)
        log.info("name server on %s stopped", self.address)

    def scan_not_active_brokers_once(self) -> int:
        """Drop brokers silent for longer than brokerChannelExpiredTime; returns how many."""
        expired = self.route_info.scan_not_active_brokers(
            _now_ms(), self.config.broker_channel_expired_time_ms
        )
        for live in expired:
            if isinstance(live.connection, Connection):
                live.connection.close("broker registration expired")
        return len(expired)

    async def _scan_not_active_brokers(self) -> None:
        interval_s = self.config.scan_not_active_broker_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.scan_not_active_brokers_once()
            except Exception:  # the scan must outlive one bad pass
                log.exception("broker expiry scan failed")

    def _connection_event(self, event: ConnectionEvent, connection: Connection) -> None:
        if event is ConnectionEvent.CLOSE:
            self.route_info.connection_closed(connection)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000

"""``tidemq controller``: run the failover controller for one cluster (docs/failover.md).

Why a command of its own and not a part of the name server (RocketMQ 5 offers both): the
name server is stateless and needs nothing but its port; a controller needs etcd and its
client library (grpc), which a cluster without failover should not carry. And since every
decision is an etcd transaction, controllers need no election among themselves: run one
next to each name server, restart any at will.

It claims the cluster's prefix in etcd (refusing one that holds another cluster), registers
itself under a lease (``tidemq admin getControllerMetaData`` lists it) and runs the election
loop (controller/service.py) until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path

import click

from tidemq.cli.log_setup import add_log_file, log_options, setup_logging
from tidemq.controller.etcd import ControllerStore, ControllerUnavailable, parse_endpoints
from tidemq.controller.service import ControllerService, ControllerSettings
from tidemq.errors import ConfigError, TidemqError

log = logging.getLogger("tidemq.controller")

EXIT_CONFIG_ERROR = 2
EXIT_START_FAILED = 1
# The registration that getControllerMetaData lists; not used for any decision.
CONTROLLER_LEASE_TTL_S = 10
READY_LINE = "tidemq controller: electing masters of cluster {cluster} in etcd {endpoints} " \
             "under {prefix}; Ctrl-C to stop"


@click.command("controller", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--controllerAddr", "controller_addr", required=True, metavar="'host:port;...'",
              help="etcd's client endpoints.")
@click.option("--brokerClusterName", "--clusterName", "cluster_name", default="DefaultCluster",
              show_default=True, help="The cluster whose groups this controller serves.")
@click.option("--controllerEtcdPrefix", "prefix", default="/tidemq", show_default=True,
              help="The cluster's key prefix in etcd (the brokers' controllerEtcdPrefix).")
@click.option("--scanIntervalMs", "scan_interval_ms", default=200, show_default=True,
              type=click.IntRange(10, 60_000), help="How often every group is read.")
@click.option("--electionReportWaitMs", "report_wait_ms", default=2000, show_default=True,
              type=click.IntRange(0, 600_000),
              help="How long an election waits for fresh offsets from the candidates.")
@log_options
def controller(controller_addr: str, cluster_name: str, prefix: str, scan_interval_ms: int,
               report_wait_ms: int, log_level: str, log_dir: Path | None,
               log_max_bytes: int, log_file_count: int) -> None:
    """Run the failover controller: tidemq controller --controllerAddr 127.0.0.1:2379"""
    setup_logging(log_level)
    from tidemq.cli.server_commands import _run_until_stopped

    try:
        endpoints = parse_endpoints(controller_addr)
    except ConfigError as e:
        click.echo(f"tidemq controller: {e}", err=True)
        raise click.exceptions.Exit(EXIT_CONFIG_ERROR) from None
    if log_dir is not None:
        add_log_file(log_dir, "controller", max_bytes=log_max_bytes, file_count=log_file_count)
    controller_id = f"{socket.gethostname()}:{os.getpid()}"

    description = (f"cluster={cluster_name} scanIntervalMs={scan_interval_ms} "
                   f"electionReportWaitMs={report_wait_ms}").encode()

    async def serve(stop: asyncio.Event) -> None:
        store = ControllerStore(endpoints, prefix)
        try:
            await store.claim_cluster(cluster_name)
            lease = await store.grant_lease(CONTROLLER_LEASE_TTL_S)
            await store.register_controller(controller_id, description, lease)
        except TidemqError as e:
            await store.close()
            click.echo(f"tidemq controller: {e}", err=True)
            raise click.exceptions.Exit(EXIT_START_FAILED) from None
        service = ControllerService(store, ControllerSettings(
            scan_interval_s=scan_interval_ms / 1000, report_wait_s=report_wait_ms / 1000))
        service.start()
        click.echo(READY_LINE.format(cluster=cluster_name, endpoints=store.endpoints_text,
                                     prefix=store.keys.prefix))
        keep = asyncio.get_running_loop().create_task(
            _keep_registered(store, controller_id, description, lease))
        try:
            await stop.wait()
        finally:
            keep.cancel()
            await service.stop()
            await store.close()

    _run_until_stopped(serve)


async def _keep_registered(store: ControllerStore, controller_id: str, description: bytes,
                           lease: int) -> None:
    """Renew the registration's lease; register again under a new one if it was lost."""
    while True:
        await asyncio.sleep(CONTROLLER_LEASE_TTL_S / 3)
        try:
            if await store.keep_alive(lease) == 0:
                lease = await store.grant_lease(CONTROLLER_LEASE_TTL_S)
                await store.register_controller(controller_id, description, lease)
        except ControllerUnavailable:
            continue  # the service loop logs the outage

"""Cluster and broker verbs: clusters, broker runtime statistics."""

from __future__ import annotations

import click
from rich.table import Table

from tidemq.cli.admin.base import admin, console, namesrv_option, print_json, with_admin
from tidemq.client.admin import Admin
from tidemq.errors import TidemqError


@admin.command("clusterList")
@namesrv_option
@click.option("--json", "as_json", is_flag=True)
@with_admin
async def cluster_list(client: Admin, as_json: bool) -> None:
    """List clusters and their broker groups: each broker's role and, for a slave, how many
    bytes of its master's commit log it does not have yet."""
    info = await client.cluster_list()
    rows = []
    for cluster, names in sorted(info.clusters.items()):
        for name in names:
            broker = info.brokers.get(name)
            for broker_id, address in sorted((broker.broker_addrs if broker else {}).items()):
                rows.append((cluster, name, broker_id, address))
    runtimes: dict[str, dict[str, str]] = {}
    for _, _, _, address in rows:
        try:
            runtimes[address] = await client.broker_runtime_info(address)
        except TidemqError:
            runtimes[address] = {}
    masters = {(cluster, name): runtimes[address]
               for cluster, name, broker_id, address in rows if broker_id == 0}
    details = []
    for cluster, name, broker_id, address in rows:
        runtime = runtimes[address]
        role = runtime.get("brokerRole") or ("MASTER" if broker_id == 0 else "SLAVE")
        details.append((cluster, name, broker_id, address, runtime, role,
                        _behind_bytes(broker_id, runtime, masters.get((cluster, name)))))
    if as_json:
        print_json([{"cluster": c, "brokerName": n, "brokerId": i, "address": a, "role": r,
                     "behindBytes": b} for c, n, i, a, _, r, b in details])
        return
    table = Table(title="clusters")
    for column in ("Cluster Name", "Broker Name", "BID", "Address", "Role", "Behind",
                   "Version", "Put TPS", "Get TPS"):
        table.add_column(column)
    for cluster, name, broker_id, address, runtime, role, behind in details:
        table.add_row(cluster, name, str(broker_id), address, role,
                      "" if behind is None else f"{behind} B",
                      runtime.get("brokerVersionDesc", "?"),
                      runtime.get("putTps", "?").split(" ")[0],
                      runtime.get("getTransferedTps", runtime.get("getTotalTps", "?"))
                      .split(" ")[0])
    console.print(table)


def _behind_bytes(broker_id: int, runtime: dict[str, str],
                  master: dict[str, str] | None) -> int | None:
    """A slave's distance from its master: the master's commit-log end minus its own (None
    for a master, or when either did not answer)."""
    if broker_id == 0 or not master:
        return None
    try:
        return max(0, int(master["commitLogMaxOffset"]) - int(runtime["commitLogMaxOffset"]))
    except (KeyError, ValueError):
        return None


@admin.command("brokerStatus")
@namesrv_option
@click.option("-b", "--brokerAddr", "broker_addr", help="One broker's address.")
@click.option("-c", "--clusterName", "cluster", help="Every master of a cluster.")
@click.option("--json", "as_json", is_flag=True)
@with_admin
async def broker_status(client: Admin, broker_addr: str | None, cluster: str | None,
                        as_json: bool) -> None:
    """Show a broker's runtime statistics."""
    if broker_addr:
        addresses = [broker_addr]
    else:
        info = await client.cluster_list()
        addresses = list(info.master_addresses(cluster).values())
        if not addresses:
            raise click.ClickException("no broker found; give -b host:port or -c cluster")
    results = {address: await client.broker_runtime_info(address) for address in addresses}
    if as_json:
        print_json(results)
        return
    for address, table_values in results.items():
        table = Table(title=f"broker {address}")
        table.add_column("Key")
        table.add_column("Value")
        for key, value in sorted(table_values.items()):
            table.add_row(key, value)
        console.print(table)

"""The cluster page: brokers, roles, disk, put/get rates, with the live charts."""

from __future__ import annotations

from aiohttp import web

from tidemq.console.charts import sparkline
from tidemq.console.context import context_of
from tidemq.console.html import escape, table

MASTER_ID = 0


async def cluster_page(request: web.Request) -> web.Response:
    context = context_of(request)
    cluster = await context.admin.cluster_list()
    sampler = context.sampler
    rows = []
    charts = []
    for name in sorted(cluster.brokers):
        broker = cluster.brokers[name]
        for broker_id, address in sorted(broker.broker_addrs.items()):
            series = sampler.series.get(address)
            info = series.runtime_info if series else {}
            role = "master" if broker_id == MASTER_ID else f"slave {broker_id}"
            rows.append((broker.cluster, name, role, address,
                         info.get("brokerVersionDesc", ""), info.get("putTps", ""),
                         info.get("getTransferedTps", ""),
                         info.get("commitLogDirCapacity", ""),
                         info.get("commitLogMaxOffset", ""), info.get("runtime", "")))
            if series is not None:
                charts.append(
                    f"<div><h3>{escape(name)} {escape(address)}</h3>"
                    + sparkline("messages put", list(series.put_tps),
                                chart_id=f"put-{address}")
                    + sparkline("messages got", list(series.get_tps),
                                chart_id=f"get-{address}")
                    + "</div>")
    body = table(("Cluster", "Broker", "Role", "Address", "Version", "Put TPS (10s 1m 10m)",
                  "Get TPS (10s 1m 10m)", "Disk", "Commit log max offset", "Up"),
                 rows, table_id="brokers")
    body += '<h2>Live</h2><div class="charts" id="charts">' + (
        "".join(charts) or "<p>no samples yet (the console samples every few seconds)</p>"
    ) + "</div>"
    return context.render("Cluster", body, request)

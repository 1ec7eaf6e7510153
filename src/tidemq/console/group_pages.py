"""Consumer group pages: the list, one group's members and per-queue lag (with its chart),
and resetting its offsets to a time."""

from __future__ import annotations

import asyncio

from aiohttp import web

from tidemq.client.errors import NoRouteError
from tidemq.console.charts import sparkline
from tidemq.console.context import context_of, require_write
from tidemq.console.html import escape, field, form, hidden, link, table, url
from tidemq.console.times import format_ms, parse_time

SYSTEM_GROUP_PREFIXES = ("TOOLS_", "CID_RMQ_SYS_", "SELF_TEST_", "FILTERSRV_", "CID_ONS",
                         "CID_ONSAPI")


async def groups_page(request: web.Request) -> web.Response:
    context = context_of(request)
    admin = context.admin
    wanted = request.query.get("q", "").strip()
    show_system = request.query.get("system") == "1"
    cluster = await admin.cluster_list()
    masters = sorted(cluster.master_addresses().values())
    tables = await asyncio.gather(*(admin.subscription_groups(address) for address in masters))
    names = sorted({group for table in tables for group in table})
    if not show_system:
        names = [g for g in names if not g.startswith(SYSTEM_GROUP_PREFIXES)]
    if wanted:
        names = [g for g in names if wanted.lower() in g.lower()]
    body = form("/groups", field("q", "Filter", wanted) + hidden("system", "1" if show_system
                                                                  else "0"),
                "Filter", method="get", form_id="group-filter")
    body += f"<p>{len(names)} group(s) · " + link(
        url("/groups", system="0" if show_system else "1", q=wanted or None),
        "hide system groups" if show_system else "show system groups") + "</p>"
    body += table(("Group",), ((link(url("/group", group=g), g),) for g in names),
                  table_id="groups", raw_columns=frozenset({0}))
    return context.render("Consumer groups", body, request)


async def group_page(request: web.Request) -> web.Response:
    context = context_of(request)
    admin = context.admin
    group = request.query.get("group", "")
    context.sampler.watch_group(group)
    stats = await admin.consume_stats(group)
    try:
        members = (await admin.consumer_connection(group)).connections
    except NoRouteError:
        members = []  # nobody online (or a group only known by its offsets)
    body = f'<p>Total lag: <strong id="total-lag">{stats.total_lag}</strong> message(s); ' \
           f"consume TPS {stats.consume_tps:.1f}</p>"
    body += sparkline("lag", list(context.sampler.group_lag.get(group, ())), unit="",
                      chart_id="lag-chart")
    body += "<h2>Members</h2>" + (table(
        ("Client id", "Address", "Language", "Version"),
        ((m.get("clientId"), m.get("clientAddr"), m.get("language"), m.get("version"))
         for m in members), table_id="members") if members else
        '<p id="members">no member online</p>')
    rows = [(queue.topic, queue.broker_name, queue.queue_id, offset.broker_offset,
             offset.consumer_offset, offset.lag, format_ms(offset.last_timestamp))
            for queue, offset in sorted(stats.offsets.items())]
    body += "<h2>Queues</h2>" + table(
        ("Topic", "Broker", "Queue", "Broker offset", "Consumer offset", "Lag",
         "Last consumed"), rows, table_id="lag", numeric=frozenset({2, 3, 4, 5}))
    topics = sorted({queue.topic for queue in stats.offsets})
    if context.write_enabled and topics:
        options = "".join(f'<option value="{escape(t)}">{escape(t)}</option>' for t in topics)
        body += "<fieldset><legend>Reset offsets to a time</legend>" + form(
            "/groups/reset",
            hidden("group", group)
            + f'<label>Topic <select name="topic" id="reset-topic">{options}</select></label> '
            + field("time", "Time (now, ms since the epoch, or 2026-11-26T12:00:00)", "now"),
            "Reset", form_id="reset-offset") + "</fieldset>"
    body += "<p>" + link(url("/dlq", group=group), "dead letters of this group") + "</p>"
    return context.render(f"Consumer group {group}", body, request)


async def reset_offset(request: web.Request) -> web.Response:
    context = context_of(request)
    require_write(context)
    data = await request.post()
    group = str(data.get("group", ""))
    topic = str(data.get("topic", ""))
    try:
        timestamp_ms = parse_time(str(data.get("time", "now")))
    except ValueError as e:
        raise web.HTTPFound(url("/group", group=group, error=str(e))) from None
    offsets = await context.admin.reset_offset_by_time(group, topic, timestamp_ms)
    raise web.HTTPFound(url("/group", group=group, flash=(
        f"offsets of {group} on {topic} reset to {format_ms(timestamp_ms)}: "
        + ", ".join(f"{q.broker_name}/{q.queue_id}={o}" for q, o in offsets.items()))))
